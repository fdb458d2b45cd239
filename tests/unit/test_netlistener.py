"""The daemon's TCP listener and the agent's network delivery: a real munged (two realms), the
real daemon service on a real TCP socket on loopback, the agent's own Link and drain loop."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import make_config, wait_for
from slurm_gpushare.daemon.netlistener import NetListener
from slurm_gpushare.daemon.server import open_store
from slurm_gpushare.daemon.service import Service
from slurm_gpushare.node import agent, delivery
from slurm_gpushare.node.delivery import DeliveryError, Link
from slurm_gpushare.slurm import munge
from devcluster.munge import start_munged

pytestmark = pytest.mark.skipif(shutil.which("munged") is None, reason="munge is not installed")


@pytest.fixture(scope="module")
def realms():
    # Outside pytest's 0700 tmp dir: `munge --uid` (a forged identity) runs as that uid and
    # must reach the socket.
    root = Path(tempfile.mkdtemp(prefix="gs-netmunge-"))
    root.chmod(0o755)
    site, foreign = start_munged(root / "site"), start_munged(root / "foreign")
    yield site, foreign
    for name in ("site", "foreign"):
        os.kill(int((root / name / "munged.pid").read_text()), 15)
    shutil.rmtree(root, ignore_errors=True)


class NetDaemon:
    """The daemon's service with its TCP listener only (what a compute node can reach)."""

    def __init__(self, tmp_path, munge_socket: str, port: int = 0, **daemon):
        config = make_config(tmp_path)
        self.config = replace(config, daemon=replace(
            config.daemon, listen_tcp=f"127.0.0.1:{port}", munge_socket=munge_socket,
            tcp_allowed_uids=(0, os.getuid()), request_timeout_s=1.0, **daemon))
        self.store, self.reader = open_store(self.config), open_store(self.config)
        self.service = Service(self.config, store=self.store, reader=self.reader)
        self.listener = NetListener(self.service, self.config.daemon.listen_tcp)
        self.address = f"127.0.0.1:{self.listener.port}"
        threading.Thread(target=self.listener.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def stop(self):
        self.listener.stopping.set()
        self.listener.shutdown()
        self.listener.server_close()
        self.service.records.close()
        self.store.close()
        self.reader.close()


@pytest.fixture
def net(tmp_path, realms):
    running = NetDaemon(tmp_path, realms[0])
    yield running
    running.stop()


def summary(job: str) -> dict:
    return {"job_id": job, "gpu_index": 0, "cluster": "c1", "samples": 10,
            "mgmap_max_mib": 4096.0, "mgup_max": 40.0}


def raw(address: str, line: bytes, timeout: float = 10.0) -> dict:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(line)
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data or b"null")


def sealed_line(message: dict, **seal) -> bytes:
    return json.dumps(munge.seal(message, **seal)).encode() + b"\n"


def deliver_message(job: str) -> dict:
    op = {"op": "ingest", "summary": summary(job)}
    return {"v": 1, "op": "deliver", "items": [{**op, "id": delivery.item_id(op)}]}


def test_a_sealed_delivery_is_learned_and_a_retry_is_not_counted_twice(net, realms):
    link = Link("/nonexistent.sock", address=net.address, munge_socket=realms[0])
    ops = [{"op": "ingest", "summary": summary(job)} for job in ("101", "102")]
    assert link.send(ops) == [{"id": delivery.item_id(op), "ok": True} for op in ops]
    assert sorted(s["job_id"] for s in net.store.all_summaries()) == ["101", "102"]
    # The ack was lost: the agent sends the same items again (a new credential, same ids).
    again = link.send(ops)
    assert all(r["ok"] and r.get("duplicate") for r in again)
    assert net.service.counters["ingest"] == 2 and net.service.counters["net-duplicates"] == 2
    assert len(net.store.all_summaries()) == 2


def test_forged_and_foreign_deliveries_are_refused_and_logged(net, realms, caplog):
    site, foreign = realms
    replayed = sealed_line(deliver_message("201"), socket=site)
    cases = {
        "foreign key": sealed_line(deliver_message("202"), socket=foreign),
        "non-Slurm uid": sealed_line(deliver_message("203"), socket=site, uid=4242),
        "unsealed": json.dumps(deliver_message("204")).encode() + b"\n",
        "changed after sealing": json.dumps(
            {**munge.seal(deliver_message("205"), socket=site),
             "items": deliver_message("299")["items"]}).encode() + b"\n",
        "another op": sealed_line({"v": 1, "op": "decide", "job": {"uid": 0}}, socket=site),
    }
    assert raw(net.address, replayed)["ok"]  # the first use is a good delivery
    with caplog.at_level(logging.WARNING, logger="slurm_gpushare"):
        replies = {name: raw(net.address, line) for name, line in cases.items()}
        replies["replayed"] = raw(net.address, replayed)
    assert all(not r["ok"] and r["error"].startswith("delivery refused") for r in
               replies.values()), replies
    refused = [r for r in caplog.records if r.getMessage() == "delivery-refused"]
    reasons = sorted(r.fields["reason"] for r in refused)
    assert reasons == sorted(["cred-invalid", "uid-refused", "bad-cred", "digest-mismatch",
                              "op-refused", "cred-replayed"])
    assert {k: v for k, v in net.service.counters.items() if k.startswith("net-refused:")} \
        == {f"net-refused:{reason}": 1 for reason in reasons}
    for record in refused:  # the peer and the reason, never the payload
        assert record.fields["peer"] == "127.0.0.1" and "summary" not in json.dumps(record.fields)
    assert [s["job_id"] for s in net.store.all_summaries()] == ["201"]


def test_an_oversized_or_trickled_request_is_bounded(net):
    limit = net.config.daemon.max_request_bytes
    reply = raw(net.address, b'{"v":1,"op":"deliver","items":["' + b"x" * (limit + 10))
    assert not reply["ok"] and "larger than" in reply["error"]
    host, port = net.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b'{"v":1,')  # ... and nothing more: dropped at the request deadline
        started = time.monotonic()
        assert sock.recv(100) == b""
        assert time.monotonic() - started < 1.0 + 5.0


def test_connections_beyond_the_per_host_cap_are_refused(net):
    from slurm_gpushare.daemon.netlistener import CONNECTIONS_PER_HOST

    host, port = net.address.rsplit(":", 1)
    held = [socket.create_connection((host, int(port)), timeout=10)
            for _ in range(CONNECTIONS_PER_HOST)]
    try:
        assert wait_for(lambda: sum(net.listener.open.values()) == CONNECTIONS_PER_HOST)
        reply = raw(net.address, b"")
        assert not reply["ok"] and reply["error"] == "too many connections"
    finally:
        for sock in held:
            sock.close()


def test_daemon_down_spools_then_drains_with_backoff_when_it_returns(tmp_path, realms):
    with socket.socket() as probe:  # a free port the daemon will listen on later
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    spool = tmp_path / "node" / "spool"
    link = Link("/nonexistent.sock", address=f"127.0.0.1:{port}", munge_socket=realms[0],
                timeout_s=2.0)
    deliver = agent.default_deliver("/nonexistent.sock", spool, link=link)
    for job in ("301", "302", "303"):
        assert deliver(summary(job)) == "spooled"
    waits, logged = [], []

    def sleep(seconds):
        waits.append(seconds)
        time.sleep(min(seconds, 0.2))  # the schedule is checked below, the test stays short

    outcome = {}
    drainer = threading.Thread(target=lambda: outcome.update(result=delivery.drain_loop(
        spool, link, log=logged.append, sleep=sleep)), daemon=True)
    drainer.start()
    assert wait_for(lambda: len(waits) >= 4, timeout=30)
    # A second drainer on the same spool leaves at once (one per node).
    assert delivery.drain_loop(spool, link, log=logged.append) is None
    running = NetDaemon(tmp_path / "ctl", realms[0], port=port)
    try:
        drainer.join(30)
        assert outcome["result"] == (3, 0)
        assert sorted(s["job_id"] for s in running.store.all_summaries()) == ["301", "302", "303"]
        assert not list(spool.glob("*.json"))
    finally:
        running.stop()
    # Exponential, jittered within [half, all] of 1, 2, 4, 8, 15 (the cap) seconds.
    for attempt, wait in enumerate(waits):
        ceiling = min(delivery.BACKOFF_CAP_S, 2 ** attempt)
        assert ceiling / 2 <= wait <= ceiling


def test_the_backoff_is_bounded_and_jittered():
    assert delivery.backoff_s(0, rand=lambda: 0.0) == 0.5
    assert delivery.backoff_s(3, rand=lambda: 1.0) == 8.0
    assert delivery.backoff_s(1000, rand=lambda: 1.0) == delivery.BACKOFF_CAP_S


def test_a_delivery_that_cannot_be_sealed_is_not_lost(tmp_path):
    link = Link("/nonexistent.sock", address="127.0.0.1:9",
                munge_socket=str(tmp_path / "no-munged.socket"), timeout_s=1.0)
    with pytest.raises(DeliveryError, match="cannot seal"):
        link.send([{"op": "ingest", "summary": summary("401")}])
    spool = tmp_path / "spool"
    assert agent.default_deliver("/x.sock", spool, link=link)(summary("401")) == "spooled"
    assert (spool / "c1-401-0.json").exists()


def test_the_agent_starts_a_detached_drainer_that_delivers_once_the_daemon_is_up(tmp_path,
                                                                                   realms):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    state = tmp_path / "node"
    args = agent.build_parser().parse_args([
        "drain", "--state-dir", str(state), "--socket", "/nonexistent.sock",
        "--daemon-address", f"127.0.0.1:{port}", "--munge-socket", realms[0]])
    deliver = agent.default_deliver(args.socket, agent.spool_dir(state), link=agent.link_of(args),
                                    on_spooled=lambda: agent.start_drainer(args))
    assert [deliver(summary(job)) for job in ("501", "502")] == ["spooled", "spooled"]
    assert wait_for(lambda: "retry" in (state / "agent.log").read_text()
                    if (state / "agent.log").exists() else False, timeout=30)
    running = NetDaemon(tmp_path / "ctl", realms[0], port=port)
    try:
        assert wait_for(lambda: not list(agent.spool_dir(state).glob("*.json")), timeout=60)
        assert sorted(s["job_id"] for s in running.store.all_summaries()) == ["501", "502"]
        assert wait_for(lambda: "spool drained: 2 sent" in (state / "agent.log").read_text())
    finally:
        running.stop()
        _kill_processes_naming(str(tmp_path))  # a drainer still waiting must not outlive us


def test_a_bad_listen_address_is_a_configuration_error(tmp_path):
    from slurm_gpushare.core.config import ConfigError, parse_config

    for bad in ("6830", "host:port", "::1:6830", "10.0.0.1:70000"):
        with pytest.raises(ConfigError, match="listen_tcp"):
            parse_config({"daemon": {"listen_tcp": bad}})
    assert parse_config({"daemon": {"listen_tcp": "[::1]:6830"}}).daemon.listen_tcp == "[::1]:6830"


def test_a_live_overrun_report_arrives_over_the_network_once(net, realms):
    link = Link("/nonexistent.sock", address=net.address, munge_socket=realms[0])
    report = {"v": 1, "op": "overrun", "job_id": "601", "peak_mib": 9000.0, "limit_mib": 8192.0}
    assert link.send_one(report) == {"id": delivery.item_id(report), "ok": True}
    assert link.send_one(report)["duplicate"] is True
    assert net.service.counters["share-overrun"] == 1


def test_a_collector_samples_at_once_while_its_spool_waits_for_an_unreachable_daemon(
        tmp_path, realms):
    # A daemon that accepts connections and never answers (a cut link looks the same to the
    # node until the timeout): the spool's drain must not hold up the new job's sampling.
    from test_telemetry import collector_args

    from slurm_gpushare.node import agent

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)
    try:
        state, common = collector_args(tmp_path, "41")
        common += ["--daemon-address", "127.0.0.1:%d" % hung.getsockname()[1],
                   "--munge-socket", realms[0], "--delivery-timeout", "2.5"]
        agent.spool_dir(state).mkdir(parents=True)
        (agent.spool_dir(state) / "c1-1-0.json").write_text(json.dumps(summary("1")))
        assert agent.main(["start", *common]) == 0
        time.sleep(1.5)  # below the delivery timeout: the drain of c1-1 still hangs
        assert agent.main(["stop", *common, "--wait", "30"]) == 0
        assert wait_for(lambda: (agent.spool_dir(state) / "c1-41-0.json").exists(), timeout=30)
        summary_41 = json.loads((agent.spool_dir(state) / "c1-41-0.json").read_text())
        assert summary_41["samples"] >= 5  # sampled from the start, not after the drain gave up
    finally:
        hung.close()
        _kill_processes_naming(str(tmp_path))  # the detached drainer would retry for hours


def _kill_processes_naming(text: str) -> None:
    import signal

    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if text.encode() in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            pass
