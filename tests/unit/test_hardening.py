"""Bad, hostile or late requests: each gets a reply with its request id, costs the daemon
nothing lasting, and never switches sharing off for other users."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time

import pytest

from conftest import RunningDaemon, make_config
from slurm_gpushare.core.config import ConfigError, parse_config
from slurm_gpushare.daemon.protocol import request as request_once

JOB = {"uid": 1000, "user": "alice", "partition": "gpu", "tres_per_node": "gres:gpu:1",
       "min_nodes": 4294967294, "shared": 65534, "batch": True}


def connect(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(path)
    return sock


def exchange(sock, payload: bytes) -> dict:
    sock.sendall(payload)
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return json.loads(data)


@pytest.mark.parametrize("payload", [
    b'{"v":1,"op":[],"rid":5}',
    b'{"v":1,"op":{"a":1},"rid":5}',
    b'{"v":1,"op":"decide","rid":5,"job":' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"v":1,"op":"decide","rid":5,"job":{"uid":1e400,"partition":"gpu"}}',
    b'{"v":1,"op":"decide","rid":5,"job":{"uid":NaN}}',
    b'{"v":1,"op":"decide","rid":5,"job":{"uid":Infinity}}',
    b'{"v":1,"op":"decide","rid":5,"job":{"uid":-1}}',
    b'{"v":1,"op":"decide","rid":5,"job":{"uid":1000,"time_limit":' + b"9" * 400 + b"}}",
    b'{"v":1,"op":"decide","rid":5,"job":{"uid":1000,"partition":"gpu","tres_per_node":'
    b'"gres:gpu:1","comment":"gpushare:mem=' + b"9" * 400 + b'G"}}',
    b'{"v":1,"op":"ingest","rid":5,"summary":{"job_id":"12","gpu_index":-1}}',
    b'{"v":1,"op":"ingest","rid":5,"summary":{"job_id":"12","gpu_index":0,"keys":5}}',
    b'{"v":1,"op":"ingest","rid":5,"summary":{"job_id":"x; rm","gpu_index":0}}',
    b'{"v":1,"op":"ingest","rid":5,"summary":{"job_id":"12","gpu_index":0,"coruns":[7]}}',
    b'{"v":1,"op":"overrun","rid":5,"job_id":[1]}',
])
def test_every_bad_request_is_answered_with_its_rid_and_no_traceback(daemon, payload, caplog):
    with connect(daemon.socket) as sock:
        reply = exchange(sock, payload + b"\n")
        assert reply["rid"] == 5
        if b'"decide"' in payload:
            assert reply["ok"] is True and reply["decision"]["action"] == "keep"
            assert reply["decision"]["writes"] == {}
            assert reply["decision"]["code"] == "bad-request"
        else:
            assert reply["ok"] is False
        assert exchange(sock, b'{"v":1,"op":"ping"}\n')["ok"]
    assert not [r for r in caplog.records if r.exc_info], "a client mistake left a traceback"
    daemon.service.records.flush()
    assert daemon.store.all_summaries() == []
    assert daemon.store.decisions() == []  # refused requests leave no decision rows


def test_replies_carry_rid_even_when_the_request_had_none(daemon):
    reply = request_once(daemon.socket, {"v": 1, "op": "ping"})
    assert "rid" in reply and reply["rid"] is None


def test_ingest_is_committed_before_it_is_acknowledged(daemon):
    summary = {"job_id": "77", "gpu_index": 0, "cluster": "c", "samples": 3,
               "mgmap_max_mib": 1000.0}
    reply = request_once(daemon.socket, {"v": 1, "op": "ingest", "summary": summary})
    assert reply["ok"]
    # No flush of the writer thread: the row must already be there.
    assert [s["job_id"] for s in daemon.store.all_summaries()] == ["77"]


def test_a_request_past_the_hooks_deadline_is_not_decided_or_recorded(daemon):
    reply = request_once(daemon.socket, {"v": 1, "op": "decide", "rid": 3, "job": JOB,
                                         "deadline": time.time() - 5})
    assert reply["decision"]["action"] == "keep" and reply["decision"]["code"] == "expired"
    fresh = request_once(daemon.socket, {"v": 1, "op": "decide", "rid": 4, "job": JOB,
                                         "deadline": time.time() + 5})
    assert fresh["decision"]["action"] == "share"
    daemon.service.records.flush()
    assert len(daemon.store.decisions()) == 1


def test_a_slow_sender_is_dropped_at_the_request_deadline(tmp_path):
    config = make_config(tmp_path)
    config = config.__class__(**{**config.__dict__, "daemon": config.daemon.__class__(
        **{**config.daemon.__dict__, "request_timeout_s": 0.5})})
    running = RunningDaemon(config)
    try:
        with connect(config.daemon.socket) as sock:
            started = time.monotonic()
            closed = False
            for _ in range(40):  # one byte every 0.1 s: never idle, never done
                try:
                    sock.sendall(b" ")
                    if sock.recv(1, socket.MSG_DONTWAIT) == b"":
                        closed = True
                        break
                except BlockingIOError:
                    pass
                except OSError:
                    closed = True
                    break
                time.sleep(0.1)
            assert closed and time.monotonic() - started < 1.5
    finally:
        running.stop()


def test_query_socket_caps_connections_per_user_and_rate(daemon):
    cap = daemon.config.daemon.query_connections_per_uid
    held = [connect(daemon.query_socket) for _ in range(cap)]
    try:
        time.sleep(0.2)
        extra = connect(daemon.query_socket)
        reply = json.loads(extra.makefile("rb").readline())
        assert reply["ok"] is False and "too many connections" in reply["error"]
        extra.close()
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    limited = 0
    with connect(daemon.query_socket) as sock:
        for _ in range(int(daemon.config.daemon.query_rate_per_s * 4)):
            reply = exchange(sock, b'{"v":1,"op":"ping"}\n')
            limited += "too many requests" in reply.get("error", "")
    assert limited > 0
    # The main socket (slurmctld's) is not limited by the query socket's users.
    assert request_once(daemon.socket, {"v": 1, "op": "ping"})["ok"]


def test_query_socket_refuses_admin_ops_before_decoding(daemon):
    with connect(daemon.query_socket) as sock:
        nested = b'{"v":1,"op":"ingest","rid":9,"summary":' + b"[" * 3000 + b"]" * 3000 + b"}"
        reply = exchange(sock, nested + b"\n")
        assert reply == {"v": 1, "ok": False, "error": "op 'ingest' is not available on this "
                         "socket", "rid": 9}


def test_main_socket_caps_connections(tmp_path):
    config = make_config(tmp_path)
    config = config.__class__(**{**config.__dict__, "daemon": config.daemon.__class__(
        **{**config.daemon.__dict__, "max_connections": 4})})
    running = RunningDaemon(config)
    try:
        held = [connect(config.daemon.socket) for _ in range(4)]
        time.sleep(0.2)
        with connect(config.daemon.socket) as extra:
            assert "too many connections" in json.loads(extra.makefile("rb").readline())["error"]
        for sock in held:
            sock.close()
        time.sleep(0.2)
        assert request_once(config.daemon.socket, {"v": 1, "op": "ping"})["ok"]
        assert threading.active_count() < 50
    finally:
        running.stop()


def test_log_file_is_0640_and_lines_are_bounded(tmp_path):
    from slurm_gpushare.daemon.logs import event, setup_logging

    log_file = tmp_path / "logs" / "daemon.log"
    config = parse_config({"daemon": {"log_file": str(log_file)}})
    setup_logging(config)
    import logging
    event(logging.WARNING, "bad-request", error="x" * 1_000_000, items=list(range(10_000)))
    for handler in logging.getLogger("slurm_gpushare").handlers:
        handler.flush()
    assert stat.S_IMODE(os.stat(log_file).st_mode) == 0o640
    lines = log_file.read_text().splitlines()
    assert len(lines) == 1 and len(lines[0]) <= 8192
    logging.getLogger("slurm_gpushare").handlers[:] = []


@pytest.mark.parametrize("section,key,value", [
    ("daemon", "max_request_bytes", 0),
    ("policy", "hint_margin", -2.0),
    ("hook", "breaker_failures", 0),
    ("hook", "timeout_ms", 100000),
    ("policy", "default_share_gib", -4),
    ("policy", "gpu_time_budget_pct", -1.0),
    ("daemon", "query_rate_per_s", 0.0),
    ("daemon", "log_level", "loud"),
])
def test_config_values_out_of_range_are_one_line_errors(section, key, value):
    with pytest.raises(ConfigError) as error:
        parse_config({section: {key: value}})
    assert key in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("raw, message", [
    # A quoted "false" is a string, which Python reads as true: the opposite of what was meant.
    ({"policy": {"keep_whole_when_idle": "false"}}, "keep_whole_when_idle must be true or false"),
    ({"hook": {"timeout_ms": True}}, "timeout_ms must be a number, not true or false"),
    ({"hook": {"breaker_cooldown_s": False}}, "breaker_cooldown_s must be a number"),
    ({"gpu_types": {"a100": {"memory_gib": True}}}, "memory_gib must be a positive integer"),
    ({"gpu_types": {"a100": {"memory_gib": 80, "feature": 7}}}, "feature must be a string"),
    # A comma makes two features, of which a node would need both: never satisfiable as one.
    ({"gpu_types": {"a100": {"memory_gib": 80, "feature": "a100,nvlink"}}},
     "feature must be one Slurm feature name"),
    ({"gpu_types": {"a1:00": {"memory_gib": 80}}}, "must be a Slurm gres type name"),
    ({"gpu_types": {"a100": {"memory_gib": 99999999999}}}, "memory_gib must be a positive integer"),
    ({"daemon": {"history_retention_days": float("nan")}}, "history_retention_days must be a finite number"),
    ({"policy": {"sjf_reference_s": float("inf")}}, "sjf_reference_s must be a finite number"),
    ({"daemon": {"history_retention_days": -1.0}}, "history_retention_days = -1.0 is out of range"),
    ({"policy": {"opt_out_token": ""}}, "opt_out_token must be one word"),
    ({"policy": {"mem_hint_token": "gpushare mem="}}, "mem_hint_token must be one word"),
    ({"daemon": {"socket": ""}}, "socket must be an absolute path"),
    ({"daemon": {"socket": "run/daemon.sock"}}, "socket must be an absolute path"),
    ({"daemon": {"query_socket": "q.sock"}}, "query_socket must be an absolute path"),
])
def test_config_values_of_the_wrong_kind_are_one_line_errors(raw, message):
    with pytest.raises(ConfigError) as error:
        parse_config(raw)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_an_empty_query_socket_still_turns_it_off():
    assert parse_config({"daemon": {"query_socket": ""}}).daemon.query_socket == ""


def test_a_config_file_saved_with_a_byte_order_mark_loads(tmp_path):
    from slurm_gpushare.core.config import load_config

    path = tmp_path / "gpushare.toml"
    path.write_bytes(b"\xef\xbb\xbf[policy]\r\nsharing_partitions = [\"gpu\"]\r\n")
    assert load_config(path).policy.sharing_partitions == ("gpu",)
    path.write_bytes(b"[policy]\nopt_out_token = \"\xff\"\n")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_config(path)


def test_a_first_breaker_cooldown_longer_than_the_longest_is_an_error():
    with pytest.raises(ConfigError, match="breaker_first_cooldown_s = 60.0 is longer than "
                                          "breaker_cooldown_s = 30.0"):
        parse_config({"hook": {"breaker_first_cooldown_s": 60.0}})
    assert parse_config({"hook": {"breaker_first_cooldown_s": 30.0}}).hook.breaker_cooldown_s == 30
    # A file that sets only a longest cooldown shorter than the first one's default still loads.
    hook = parse_config({"hook": {"breaker_cooldown_s": 0.5}}).hook
    assert (hook.breaker_first_cooldown_s, hook.breaker_cooldown_s) == (0.5, 0.5)


def test_the_client_reads_an_answer_sent_before_the_daemon_closed(tmp_path):
    # The daemon answers a refused peer (or an oversized request) at once and closes without
    # reading: the client's send then meets a closed socket, and the answer must still reach
    # the user, not a "Broken pipe".
    path = str(tmp_path / "refusing.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def refuse():
        conn, _ = server.accept()
        conn.sendall(b'{"v":1,"ok":false,"error":"permission denied","rid":null}\n')
        conn.close()

    thread = threading.Thread(target=refuse, daemon=True)
    thread.start()
    try:
        # Larger than the socket's buffers: the send cannot complete before the close.
        reply = request_once(path, {"v": 1, "op": "ping", "pad": "x" * 4_000_000}, timeout=10)
    finally:
        thread.join(5)
        server.close()
    assert reply == {"v": 1, "ok": False, "error": "permission denied", "rid": None}
