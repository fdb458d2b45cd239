"""The hook under Lua 5.1 with a fake slurm table; every test compares the whole job_desc."""

from __future__ import annotations

import os
import time

import pytest

from lua_harness import NO_VAL, Hook, job_fields


def hook_for(socket_path, tmp_path, **settings):
    # These tests check what a rewrite does, not the deadline (the tests that do set their
    # own): the production 50 ms would fail a job open whenever a loaded CI machine stalls
    # the in-process daemon.
    return Hook({"socket": socket_path, "timeout_ms": 1000, **settings}, tmp_path)


def test_gpu_request_becomes_a_share(daemon, tmp_path):
    hook = hook_for(daemon.socket, tmp_path)
    before = job_fields()
    rc, after = hook.submit(before)
    assert rc == 0
    tag = after.pop("admin_comment")
    assert tag.startswith("gpushare:v1:share:id=") and tag.endswith(
        ":shard=8:types=v100+a100:why=default-share")
    assert after == {**before, "tres_per_node": "gres:shard:8", "features": "v100|a100"}


def test_typed_request_keeps_its_type_as_constraint(daemon, tmp_path):
    hook = hook_for(daemon.socket, tmp_path)
    before = job_fields(tres_per_node="gres:gpu:a100:1")
    _, after = hook.submit(before)
    after.pop("admin_comment")
    assert after == {**before, "tres_per_node": "gres:shard:8", "features": "a100"}


def test_gpus_per_job_moves_to_per_node_and_clears_tres_per_job(daemon, tmp_path):
    hook = hook_for(daemon.socket, tmp_path)
    before = job_fields(tres_per_node=None, tres_per_job="gres:gpu:1")
    _, after = hook.submit(before)
    after.pop("admin_comment")
    expected = {**before, "tres_per_node": "gres:shard:8", "features": "v100|a100"}
    del expected["tres_per_job"]  # written as "" = cleared
    assert after == expected


def test_other_gres_are_kept(daemon, tmp_path):
    hook = hook_for(daemon.socket, tmp_path)
    before = job_fields(tres_per_node="gres:gpu:1,gres:nic:1")
    _, after = hook.submit(before)
    after.pop("admin_comment")
    assert after == {**before, "tres_per_node": "gres:shard:8,gres:nic:1",
                     "features": "v100|a100"}


def test_user_constraint_is_kept_and_extended(daemon, tmp_path):
    hook = hook_for(daemon.socket, tmp_path)
    before = job_fields(features="ib")
    _, after = hook.submit(before)
    after.pop("admin_comment")
    assert after == {**before, "tres_per_node": "gres:shard:8", "features": "ib&(v100|a100)"}


def test_memory_hint_sizes_the_share_and_excludes_small_gpus(daemon, tmp_path):
    hook = hook_for(daemon.socket, tmp_path)
    before = job_fields(comment="gpushare:mem=20G")
    _, after = hook.submit(before)
    assert after["tres_per_node"] == "gres:shard:22"  # 20 GiB + 10% margin, rounded up
    assert after["features"] == "a100"


def test_default_partition_comes_from_part_list(daemon, tmp_path):
    hook = hook_for(daemon.socket, tmp_path)
    before = job_fields(partition=None)
    parts = {"gpu": {"flag_default": 1}, "gpu-excl": {"flag_default": 0}}
    _, after = hook.submit(before, parts)
    assert after["tres_per_node"] == "gres:shard:8"


@pytest.mark.parametrize("overrides", [
    {"tres_per_node": None},                                   # no GPU at all
    {"tres_per_node": ""},                                     # empty string
    {"tres_per_node": "gres:nic:1"},                           # another gres only
    {"tres_per_node": "gres:gpu:2"},                           # several GPUs
    {"min_nodes": 2},                                          # multi-node
    {"min_nodes": 1, "max_nodes": 2},                          # -N 1-2: may get two nodes
    {"tres_freq": "gpu:high"},                                 # --gpu-freq (Slurm refuses it)
    {"prefer": "t4"},                                          # --prefer (replaces the types)
    {"shared": 0},                                             # --exclusive
    {"shared": 2},                                             # --exclusive=user
    {"tres_per_node": "gres:shard:4"},                         # already a share
    {"tres_per_node": "gres:mps:50"},                          # already MPS
    {"partition": "gpu-excl"},                                 # sharing off there
    {"partition": "gpu,gpu-excl"},                             # one listed partition is off
    {"comment": "please gpushare=off thanks"},                 # user opt-out
    {"tres_per_task": "gres:gpu:1", "tres_per_node": None},   # --gpus-per-task
    {"cpus_per_tres": "gres:gpu:4"},                           # --cpus-per-gpu
])
def test_untouched_cases_stay_untouched(daemon, tmp_path, overrides):
    hook = hook_for(daemon.socket, tmp_path)
    before = job_fields(**overrides)
    rc, after = hook.submit(before)
    assert rc == 0
    assert after == before


@pytest.mark.parametrize("overrides,code", [
    ({"comment": "gpushare:mem=200G"}, "does-not-fit"),
    ({"tres_per_node": "gres:gpu:h100:1"}, "unknown-type"),
])
def test_eligible_jobs_that_are_kept_get_only_a_tag(daemon, tmp_path, overrides, code):
    hook = hook_for(daemon.socket, tmp_path)
    before = job_fields(**overrides)
    _, after = hook.submit(before)
    tag = after.pop("admin_comment")
    assert tag.startswith("gpushare:v1:keep:id=") and tag.endswith(f":why={code}")
    assert after == before


def test_first_run_policy_whole_gpu_tags_the_job_for_profiling(tmp_path):
    from conftest import RunningDaemon, make_config

    running = RunningDaemon(make_config(tmp_path, first_run="whole-gpu"))
    try:
        hook = hook_for(running.socket, tmp_path)
        before = job_fields()
        _, after = hook.submit(before)
        assert after.pop("admin_comment").endswith(":why=first-run")
        assert after == before
    finally:
        running.stop()


def test_keep_that_would_change_the_job_is_refused(misbehaving, tmp_path):
    server = misbehaving("keep-with-writes")
    hook = hook_for(server.path, tmp_path)
    before = job_fields()
    assert hook.submit(before) == (0, before)


def test_keeps_one_connection_across_submissions(daemon, tmp_path):
    hook = hook_for(daemon.socket, tmp_path)
    for _ in range(5):
        hook.submit(job_fields())
    assert len(hook.sockets) == 1
    assert hook.state()["connected"] is True


def test_reconnects_after_daemon_restart(tmp_path):
    from conftest import RunningDaemon, make_config

    config = make_config(tmp_path)
    first = RunningDaemon(config)
    hook = hook_for(first.socket, tmp_path)
    assert hook.submit(job_fields())[1]["tres_per_node"] == "gres:shard:8"
    first.stop()
    second = RunningDaemon(config)
    try:
        # The kept connection is dead: the hook retries once on a fresh one, same call.
        assert hook.submit(job_fields())[1]["tres_per_node"] == "gres:shard:8"
    finally:
        second.stop()


def test_daemon_absent_leaves_job_as_submitted_with_one_log_line(tmp_path):
    hook = hook_for(str(tmp_path / "nobody-listens.sock"), tmp_path)
    before = job_fields()
    rc, after = hook.submit(before)
    assert (rc, after) == (0, before)
    assert len(hook.logs) == 1 and "left as submitted" in hook.logs[0][1]


@pytest.mark.parametrize("mode", ["garbage", "wrong-version", "bad-writes", "injection",
                                  "whole-gpu", "close"])
def test_bad_replies_leave_job_as_submitted(misbehaving, tmp_path, mode):
    server = misbehaving(mode)
    hook = hook_for(server.path, tmp_path)
    before = job_fields()
    rc, after = hook.submit(before)
    assert (rc, after) == (0, before)
    assert [level for level, _ in hook.logs] == ["info"]


def test_hung_daemon_costs_at_most_the_timeout_then_the_breaker_opens(misbehaving, tmp_path):
    server = misbehaving("hang")
    hook = hook_for(server.path, tmp_path, timeout_ms=50, breaker_failures=3,
                    breaker_cooldown_s=60)
    before = job_fields()
    durations = []
    for _ in range(10):
        started = time.perf_counter()
        rc, after = hook.submit(before)
        durations.append(time.perf_counter() - started)
        assert (rc, after) == (0, before)
    # Three calls wait out the deadline (plus scheduling slack), then the breaker skips asking.
    assert all(d < 0.5 for d in durations[:3])
    assert all(d < 0.02 for d in durations[3:])
    assert server.accepted == 3
    state = hook.state()
    assert state["counters"]["skipped"] == 7 and state["open_until"] > 0


def test_breaker_probes_again_after_cooldown(tmp_path, misbehaving):
    from conftest import RunningDaemon, make_config

    config = make_config(tmp_path)
    hook = hook_for(config.daemon.socket, tmp_path, breaker_failures=2, breaker_cooldown_s=0.3)
    # Started first (its start may take longer than the cooldown on a loaded machine); its
    # socket is moved away so that nobody listens at the hook's path for two submissions.
    running = RunningDaemon(config)
    os.rename(config.daemon.socket, config.daemon.socket + ".away")
    for _ in range(2):
        hook.submit(job_fields())  # nobody listens: two failures open the breaker
    os.rename(config.daemon.socket + ".away", config.daemon.socket)
    try:
        assert hook.submit(job_fields())[1]["tres_per_node"] == "gres:gpu:1"  # still open
        time.sleep(0.35)
        assert hook.submit(job_fields())[1]["tres_per_node"] == "gres:shard:8"  # probe succeeds
        assert hook.state()["failures"] == 0
    finally:
        running.stop()


def test_a_daemon_restart_costs_the_first_cooldown_not_the_whole_one(tmp_path):
    from conftest import RunningDaemon, make_config

    # A restart (an upgrade, a reload that needs one) leaves no socket for a few seconds: the
    # submissions then open the breaker, which probes again after its first, short cooldown,
    # not after breaker_cooldown_s (half a minute of jobs kept whole on a busy site).
    config = make_config(tmp_path)
    hook = hook_for(config.daemon.socket, tmp_path, breaker_failures=3, breaker_cooldown_s=30,
                    breaker_first_cooldown_s=0.3)
    running = RunningDaemon(config)
    os.rename(config.daemon.socket, config.daemon.socket + ".away")
    for _ in range(3):
        hook.submit(job_fields())  # nobody listens: the breaker opens
    os.rename(config.daemon.socket + ".away", config.daemon.socket)
    try:
        assert hook.state()["cooldown_s"] == pytest.approx(0.3)
        assert hook.submit(job_fields())[1]["tres_per_node"] == "gres:gpu:1"  # still open
        time.sleep(0.35)
        assert hook.submit(job_fields())[1]["tres_per_node"] == "gres:shard:8"  # probe succeeds
    finally:
        running.stop()


def test_a_daemon_that_keeps_failing_is_probed_ever_less_often(misbehaving, tmp_path):
    server = misbehaving("hang")
    hook = hook_for(server.path, tmp_path, timeout_ms=50, breaker_failures=3,
                    breaker_cooldown_s=0.8, breaker_first_cooldown_s=0.2)
    cooldowns = []
    for _ in range(4):
        while hook.state()["open_until"] == 0 or time.time() >= hook.state()["open_until"]:
            hook.submit(job_fields())  # asks (and waits out the deadline) until it opens
        cooldowns.append(hook.state()["cooldown_s"])
        time.sleep(hook.state()["open_until"] - time.time() + 0.01)
    # 3 failures open it; each failed probe doubles the cooldown, up to breaker_cooldown_s.
    assert cooldowns == pytest.approx([0.2, 0.4, 0.8, 0.8])
    assert server.accepted == 3 + 3


def test_job_modify_changes_nothing(daemon, tmp_path):
    hook = hook_for(daemon.socket, tmp_path)
    before = job_fields(tres_per_node="gres:gpu:2", time_limit=120)
    assert hook.modify(before) == (0, before)


SHARE_REC = {"job_id": 42, "admin_comment": "gpushare:v1:share:id=ab:shard=8:types=v100:why=default-share"}


@pytest.mark.parametrize("update", [
    {"partition": "gpu-excl"}, {"tres_per_node": "gres/gpu:1"}, {"tres_per_node": "gres:gpu:1"},
    {"features": ""}, {"features": "a100"}, {"req_nodes": "a100-1"}, {"exc_nodes": "v100-1"},
    {"tres_per_job": "gres:gpu:1"},
])
def test_updates_a_share_rests_on_are_refused(tmp_path, update):
    hook = hook_for(str(tmp_path / "none.sock"), tmp_path)
    rc, after = hook.modify(dict(update), job_rec=SHARE_REC)
    assert rc == -1 and after == update  # refused, nothing written
    assert any("update of share job 42 refused" in line for _, line in hook.logs)


@pytest.mark.parametrize("job_rec", [
    {"job_id": 7},  # not decided by us
    {"job_id": 7, "admin_comment": "gpushare:v1:keep:id=ab:why=first-run"},  # kept whole
    {"job_id": 7, "admin_comment": "site note"},
])
def test_updates_of_other_jobs_go_through(tmp_path, job_rec):
    hook = hook_for(str(tmp_path / "none.sock"), tmp_path)
    assert hook.modify({"partition": "gpu-excl", "tres_per_node": "gres:gpu:2"},
                       job_rec=job_rec)[0] == 0


def test_the_daemons_own_resize_of_a_share_goes_through(tmp_path):
    # The requeue of a share that outgrew its memory: a new count with its new tag (only
    # operators and SlurmUser may write AdminComment).
    hook = hook_for(str(tmp_path / "none.sock"), tmp_path)
    update = {"tres_per_node": "gres:shard:12",
              "admin_comment": "gpushare:v1:share:id=ab:shard=12:why=requeue-resized"}
    assert hook.modify(dict(update), job_rec=SHARE_REC) == (0, update)


def test_other_updates_of_a_share_go_through(tmp_path):
    hook = hook_for(str(tmp_path / "none.sock"), tmp_path)
    assert hook.modify({"time_limit": 30, "name": "x"}, job_rec=SHARE_REC) == (
        0, {"time_limit": 30, "name": "x"})


def test_unset_numbers_are_not_mistaken_for_values(daemon, tmp_path):
    # min_nodes arrives as NO_VAL when the user gave no -N: that is not a multi-node job.
    hook = hook_for(daemon.socket, tmp_path)
    _, after = hook.submit(job_fields(min_nodes=NO_VAL))
    assert after["tres_per_node"] == "gres:shard:8"


# --- the SJF lever: nice ---------------------------------------------------------------------

NICE_OFFSET = 2 ** 31


def test_kept_job_gets_its_nice_and_nothing_else(misbehaving, tmp_path):
    # An unset nice arrives as NO_VAL (job_mgr.c makes it NICE_OFFSET after job_submit).
    server = misbehaving("keep-with-nice")
    hook = hook_for(server.path, tmp_path)
    before = job_fields(nice=NO_VAL)
    rc, after = hook.submit(before)
    assert rc == 0
    assert after == {**before, "nice": NICE_OFFSET - 250}


def test_nice_adds_to_the_users_own_nice(misbehaving, tmp_path):
    server = misbehaving("share-with-nice")
    hook = hook_for(server.path, tmp_path)
    before = job_fields(nice=NICE_OFFSET + 100)  # sbatch --nice=100
    _, after = hook.submit(before)
    assert after == {**before, "nice": NICE_OFFSET + 400, "tres_per_node": "gres:shard:4",
                     "admin_comment": "gpushare:v1:share:id=ab:shard=4:why=x"}


def test_nice_without_a_nice_field_starts_from_zero(misbehaving, tmp_path):
    server = misbehaving("keep-with-nice")
    hook = hook_for(server.path, tmp_path)
    before = job_fields()
    _, after = hook.submit(before)
    assert after == {**before, "nice": NICE_OFFSET - 250}


def test_nice_out_of_range_leaves_the_job_as_submitted(misbehaving, tmp_path):
    server = misbehaving("nice-too-big")
    hook = hook_for(server.path, tmp_path)
    before = job_fields(nice=NO_VAL)
    assert hook.submit(before) == (0, before)


def test_a_resubmitted_script_travels_once_then_as_its_digest(daemon, tmp_path, monkeypatch):
    from lua_harness import FakeSocket

    sent = []
    send = FakeSocket.send

    def recording(self, data):
        sent.append(data)
        return send(self, data)

    monkeypatch.setattr(FakeSocket, "send", recording)
    hook = hook_for(daemon.socket, tmp_path)
    before = job_fields()
    first = hook.submit(before)
    second = hook.submit(before)
    # The same decision either way (same keys, so the same history and share).
    assert first[1]["tres_per_node"] == second[1]["tres_per_node"] == "gres:shard:8"
    import json

    jobs = [json.loads(line)["job"] for line in sent]
    assert "script" in jobs[0] and "script_digest" not in jobs[0]
    assert "script" not in jobs[1] and len(jobs[1]["script_digest"]) == 64
    assert hook.state()["digests_held"] == 1
    other = hook.submit(job_fields(script="#!/bin/sh\nother\n"))
    assert "script" in json.loads(sent[-1])["job"] and other[0] == 0


def test_the_hook_asks_for_the_brief_reply_and_applies_it(tmp_path):
    """The hook asks for the decision without reason and details (less to decode inside
    slurmctld) and writes a brief decision like a full one."""
    import json
    import socket
    import threading

    path = str(tmp_path / "brief.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    asked = []

    def answer():
        conn, _ = server.accept()
        with conn:
            request = json.loads(conn.makefile("rb").readline())
            asked.append(request)
            tag = "gpushare:v1:share:id=abc:shard=4:types=v100:why=default-share"
            conn.sendall(json.dumps({"v": 1, "ok": True, "rid": request["rid"], "decision": {
                "action": "share", "code": "default-share", "decision_id": "abc",
                "writes": {"tres_per_node": "gres:shard:4", "features": "v100",
                           "admin_comment": tag}}}).encode() + b"\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        hook = hook_for(path, tmp_path)
        before = job_fields()
        rc, after = hook.submit(before)
    finally:
        thread.join(5)
        server.close()
    assert rc == 0 and asked[0]["brief"] is True and asked[0]["op"] == "decide"
    assert after == {**before, "tres_per_node": "gres:shard:4", "features": "v100",
                     "admin_comment": "gpushare:v1:share:id=abc:shard=4:types=v100:"
                                      "why=default-share"}


def test_the_benchmarks_echo_server_gets_its_keep_accepted(tmp_path):
    """bench/submit_latency.py --echo measures the hook against bench/echo_server.py: its reply
    must take the hook's accepted path (tagged, nothing else changed), not a refusal's."""
    from conftest import bench_module

    sock = tmp_path / "echo.sock"
    server = bench_module("echo_server").start(sock, tag=True)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        hook = hook_for(str(sock), tmp_path)
        before = job_fields()
        for _ in range(3):  # on one kept connection
            rc, after = hook.submit(before)
            assert rc == 0
            assert after == {**before, "admin_comment": "gpushare:v1:keep:why=echo"}
        assert hook.logs == []  # no refusal, no failure
    finally:
        server.terminate()
        server.wait(10)
