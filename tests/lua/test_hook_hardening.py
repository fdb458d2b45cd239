"""The hook against a daemon that is slow, flaky, verbose or wrong, and against users who
provoke refusals: jobs always left as submitted, and only the daemon's health trips the
breaker."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from lua_harness import Hook, job_fields

SHARE = {"action": "share", "writes": {"tres_per_node": "gres:shard:4", "features": "a100",
                                       "admin_comment": "gpushare:v1:share:id=ab12:shard=4"}}


class ScriptedDaemon:
    """A real Unix-socket server that answers each request line per ``answer(n, request)``:
    a reply dict, bytes to send raw, or None to hang."""

    def __init__(self, path, answer, delay_s=0.0):
        self.path, self.answer, self.delay_s = path, answer, delay_s
        self.count = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(64)
        self.stopped = False
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        reader = conn.makefile("rb")
        try:
            for line in reader:
                self.count += 1
                request = json.loads(line)
                out = self.answer(self.count, request)
                if out is None:
                    time.sleep(5)
                    return
                time.sleep(self.delay_s)
                if isinstance(out, dict):
                    out = json.dumps({"v": 1, "ok": True, "rid": request["rid"], **out}).encode()
                conn.sendall(out + b"\n")
        except (OSError, ValueError):
            pass

    def stop(self):
        self.stopped = True
        self.sock.close()
        for conn in self.conns:
            try:
                conn.close()
            except OSError:
                pass
        os.unlink(self.path)


@pytest.fixture
def scripted(tmp_path):
    servers = []

    def start(answer, delay_s=0.0):
        server = ScriptedDaemon(str(tmp_path / f"s{len(servers)}.sock"), answer, delay_s)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def hook_for(path, tmp_path, **settings):
    return Hook({"socket": path, "timeout_ms": 50, "breaker_failures": 3,
                 "breaker_cooldown_s": 60, "breaker_window": 10, "breaker_slow_ms": 20,
                 "max_share_count": 80, **settings}, tmp_path)


@pytest.mark.parametrize("decision,why", [
    ({"action": "share", "writes": {**SHARE["writes"], "tres_per_node": "gres:shard:0"}},
     "share count out of range"),
    ({"action": "share", "writes": {**SHARE["writes"], "tres_per_node": "gres:shard:81"}},
     "share count out of range"),
    ({"action": "share", "writes": {"tres_per_node": "gres:shard:4", "features": "a100"}},
     "share without its tag"),
    ({"action": "share", "writes": {**SHARE["writes"], "admin_comment": "gpushare:v1:keep:x"}},
     "share without its tag"),
])
def test_invalid_decisions_are_refused_and_the_job_left_as_submitted(scripted, tmp_path,
                                                                    decision, why):
    server = scripted(lambda n, r: {"decision": decision})
    hook = hook_for(server.path, tmp_path)
    before = job_fields()
    assert hook.submit(before) == (0, before)
    assert why in hook.logs[-1][1]


@pytest.mark.parametrize("overrides,why", [
    ({"shared": 0}, "share for an exclusive or multi-node job"),
    ({"min_nodes": 2}, "share for an exclusive or multi-node job"),
    ({"min_nodes": 1, "max_nodes": 2}, "share for an exclusive or multi-node job"),  # -N 1-2
    # Slurm refuses a shared gres next to a GPU frequency: the job would be rejected.
    ({"tres_freq": "gpu:high"}, "share for a job with --gpu-freq"),
    ({"tres_freq": "cpu=high,gpu:medium"}, "share for a job with --gpu-freq"),
    ({"prefer": "t4"}, "share for a job with --prefer"),
])
def test_a_share_slurm_would_refuse_or_spread_is_refused_whatever_the_daemon_says(
        scripted, tmp_path, overrides, why):
    server = scripted(lambda n, r: {"decision": SHARE})
    hook = hook_for(server.path, tmp_path)
    before = job_fields(**overrides)
    assert hook.submit(before) == (0, before)
    assert why in hook.logs[-1][1]
    assert hook.submit(job_fields()) == (0, {**job_fields(), **SHARE["writes"]})  # others share


def test_refusals_never_open_the_breaker(scripted, tmp_path):
    # Every other job is one the daemon refuses (a user provoking errors on purpose); the
    # rest of the users' jobs must still be shared.
    refused = {"decision": {"action": "keep", "code": "bad-request", "writes": {},
                            "reason": "request refused"}}
    server = scripted(lambda n, r: refused if n % 2 else {"decision": SHARE})
    hook = hook_for(server.path, tmp_path)
    shared = 0
    for _ in range(40):
        _, after = hook.submit(job_fields())
        shared += after["tres_per_node"] == "gres:shard:4"
    assert shared == 20 and hook.state()["open_until"] == 0
    # Even decisions the hook itself refuses (invalid writes) are the job's, not the daemon's.
    bad = scripted(lambda n, r: {"decision": {"action": "share", "writes": {"partition": "x"}}})
    hook = hook_for(bad.path, tmp_path)
    for _ in range(10):
        hook.submit(job_fields())
    assert hook.state()["open_until"] == 0 and hook.state()["counters"]["refused"] == 10


def test_a_slow_daemon_opens_the_breaker(scripted, tmp_path):
    # 40 ms a reply is within the 50 ms deadline, but slurmctld's locks are held throughout.
    server = scripted(lambda n, r: {"decision": SHARE}, delay_s=0.04)
    hook = hook_for(server.path, tmp_path)
    for _ in range(15):
        hook.submit(job_fields())
    state = hook.state()
    assert state["open_until"] > 0 and server.count == 10  # the window of 10, then no more
    assert any("daemon slow" in message for _, message in hook.logs)


def test_a_flaky_daemon_opens_the_breaker(scripted, tmp_path):
    # Every other request hangs: never three failures in a row, but half of them fail.
    server = scripted(lambda n, r: None if n % 2 else {"decision": SHARE})
    hook = hook_for(server.path, tmp_path)
    for _ in range(15):
        hook.submit(job_fields())
    # Open after the window's ten requests (without a breaker all 15 reach the daemon); on a
    # loaded machine a healthy reply that misses the deadline counts too, and it opens sooner.
    assert hook.state()["open_until"] > 0 and server.count <= 10


def test_a_breaker_that_opens_again_soon_after_closing_does_not_start_over(scripted, tmp_path):
    # A daemon that answers one probe and fails again at once would otherwise be asked (and
    # waited for) after every first cooldown; a breaker that stayed closed for a whole
    # breaker_cooldown_s starts over from the first one.
    hanging = {"now": True}
    server = scripted(lambda n, r: None if hanging["now"] else {"decision": SHARE})
    hook = hook_for(server.path, tmp_path, breaker_cooldown_s=0.8, breaker_first_cooldown_s=0.2)

    def fail_until_open():
        hanging["now"] = True
        while hook.state()["open_until"] == 0:
            hook.submit(job_fields())
        return hook.state()["cooldown_s"]

    def close_with_a_probe():
        time.sleep(hook.state()["open_until"] - time.time() + 0.01)
        hanging["now"] = False
        assert hook.submit(job_fields())[1]["tres_per_node"] == "gres:shard:4"
        assert hook.state()["open_until"] == 0

    assert fail_until_open() == pytest.approx(0.2)
    close_with_a_probe()
    assert fail_until_open() == pytest.approx(0.4)  # reopened soon after closing
    close_with_a_probe()
    time.sleep(0.85)  # healthy for longer than breaker_cooldown_s
    assert fail_until_open() == pytest.approx(0.2)


def test_a_failed_probe_opens_the_breaker_again_at_once(scripted, tmp_path):
    # Opened by the window (half of the answers failed, never three in a row): the probe
    # after the cooldown fails, and the next submission is not asked about again.
    mode = {"flaky": True}
    server = scripted(lambda n, r: None if (n % 2 or not mode["flaky"]) else {"decision": SHARE})
    hook = hook_for(server.path, tmp_path, breaker_first_cooldown_s=0.2)
    while hook.state()["open_until"] == 0:
        hook.submit(job_fields())
    assert hook.state()["failures"] < 3
    mode["flaky"] = False  # hangs from now on
    time.sleep(hook.state()["open_until"] - time.time() + 0.01)
    asked = server.count
    for _ in range(3):
        hook.submit(job_fields())
    assert server.count == asked + 1 and hook.state()["cooldown_s"] == pytest.approx(0.4)


def test_a_healthy_daemon_keeps_the_breaker_closed(scripted, tmp_path):
    server = scripted(lambda n, r: {"decision": SHARE})
    hook = hook_for(server.path, tmp_path)
    for _ in range(30):
        assert hook.submit(job_fields())[1]["tres_per_node"] == "gres:shard:4"
    assert hook.state()["open_until"] == 0


def test_a_huge_reply_is_cut_at_the_cap_within_the_deadline(scripted, tmp_path):
    huge = b'{"v":1,"ok":true,"pad":"' + b"x" * (16 << 20) + b'"}'
    server = scripted(lambda n, r: huge)
    # A deadline long enough for the cap's 64 KiB to arrive on a loaded runner (with the 50 ms
    # of the other tests, a busy machine's server thread sent less by then: "timeout").
    hook = hook_for(server.path, tmp_path, max_reply_bytes=65536, timeout_ms=2000)
    before = job_fields()
    started = time.perf_counter()
    assert hook.submit(before) == (0, before)
    # Cut at the cap, within the deadline: read on, it would end in "timeout" after 2 s.
    assert time.perf_counter() - started < 2.0
    assert "reply too large" in hook.logs[-1][1]


def test_requests_carry_the_hooks_deadline(scripted, tmp_path):
    seen = []
    server = scripted(lambda n, r: seen.append(r) or {"decision": SHARE})
    hook = hook_for(server.path, tmp_path)
    before = time.time()
    hook.submit(job_fields())
    assert before < seen[0]["deadline"] <= time.time() + 0.06
