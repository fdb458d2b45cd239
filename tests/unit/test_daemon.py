"""The predictor daemon over its real Unix socket."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slurm_gpushare.core.config import parse_config
from slurm_gpushare.daemon.protocol import request as request_once

REPO = Path(__file__).resolve().parents[2]
JOB = {"uid": 1000, "user": "alice", "partition": "gpu", "tres_per_node": "gres:gpu:1",
       "min_nodes": 4294967294, "shared": 65534, "batch": True}


def exchange(sock, payload: bytes) -> dict:
    sock.sendall(payload)
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return json.loads(data)


def connect(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(path)
    return sock


def test_socket_is_private(daemon):
    mode = os.stat(daemon.socket).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600


def test_decide_replies_with_a_share_and_echoes_request_id(daemon):
    reply = request_once(daemon.socket, {"v": 1, "op": "decide", "rid": 7, "job": JOB})
    assert reply["ok"] and reply["rid"] == 7
    decision = reply["decision"]
    assert decision["action"] == "share" and decision["share_gib"] == 8
    assert decision["writes"]["tres_per_node"] == "gres:shard:8"


@pytest.mark.parametrize("payload,error", [
    (b"not json\n", "not valid JSON"),
    (b"[1,2,3]\n", "must be a JSON object"),
    (b'{"v": 2, "op": "decide"}\n', "unsupported protocol version"),
    (b'{"v": 1, "op": "rm -rf"}\n', "unknown op"),
    (b'{"v": 1, "op": "decide", "job": {"partition": "gpu"}}\n', "uid is required"),
    (b'{"v": 1, "op": "decide", "job": {"uid": "root"}}\n', "must be a number"),
    (b'{"v": 1, "op": "decide", "job": {"uid": 1, "features": 5}}\n', "must be a string"),
    (b'\xff\xfe\n', "not valid JSON"),
])
def test_malformed_requests_get_an_error_and_the_connection_survives(daemon, payload, error):
    with connect(daemon.socket) as sock:
        reply = exchange(sock, payload)
        if b'"decide", "job"' in payload:
            # The job's own mistake: kept as submitted, with the reason; not a daemon failure.
            assert reply["ok"] is True and reply["decision"]["action"] == "keep"
            assert reply["decision"]["writes"] == {} and error in reply["decision"]["reason"]
        else:
            assert reply["ok"] is False and error in reply["error"]
        # Same connection still serves a good request afterwards.
        good = exchange(sock, json.dumps({"v": 1, "op": "ping"}).encode() + b"\n")
        assert good["ok"] is True


def test_oversized_request_gets_an_error_not_a_hang(daemon):
    limit = daemon.config.daemon.max_request_bytes
    with connect(daemon.socket) as sock:
        reply = exchange(sock, b'{"v": 1, "pad": "' + b"x" * (limit + 10) + b'"}\n')
        assert reply["ok"] is False and "larger than" in reply["error"]
    # The daemon is still fine for others.
    assert request_once(daemon.socket, {"v": 1, "op": "ping"})["ok"]


def test_peer_credentials_are_checked(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to connect as another user")
    import tempfile

    from conftest import RunningDaemon, make_config

    public = Path(tempfile.mkdtemp(prefix="gpushare-peer-"))
    os.chmod(public, 0o755)  # pytest's tmp_path is 0700: nobody could not even reach the socket
    daemon = RunningDaemon(make_config(public))
    os.chmod(daemon.socket, 0o666)  # only so that 'nobody' reaches the credential check
    # A separate process (not a fork of this threaded one) asks as nobody; whatever goes wrong
    # in it shows in its stderr. The system interpreter: nobody cannot reach one under /root.
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        daemon.stop()
        pytest.skip("no system python3 for 'nobody' to run")
    asker = ("import json, socket, sys\n"
             "sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
             "sock.settimeout(60)\n"
             "sock.connect(sys.argv[1])\n"
             # The daemon answers a refused peer at once and closes: the ask may meet a
             # closed socket, the answer is still there to read.
             "try:\n"
             "    sock.sendall(b'{\"v\":1,\"op\":\"ping\"}\\n')\n"
             "except (BrokenPipeError, ConnectionResetError):\n"
             "    pass\n"
             "data = b''\n"
             "while not data.endswith(b'\\n'):\n"
             "    chunk = sock.recv(65536)\n"
             "    if not chunk:\n"
             "        break\n"
             "    data += chunk\n"
             "sys.stdout.write(data.decode())\n")
    try:
        done = subprocess.run([python, "-I", "-c", asker, str(daemon.socket)],
                              user=65534, group=65534, extra_groups=[], capture_output=True,
                              text=True, timeout=120, cwd="/")
    finally:
        daemon.stop()
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply == {"v": 1, "ok": False, "error": "permission denied", "rid": None}


def test_concurrent_clients(daemon):
    errors = []

    def client(n):
        try:
            with connect(daemon.socket) as sock:
                for i in range(50):
                    reply = exchange(sock, json.dumps(
                        {"v": 1, "op": "decide", "rid": i, "job": JOB}).encode() + b"\n")
                    assert reply["rid"] == i and reply["decision"]["action"] == "share"
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    counters = request_once(daemon.socket, {"v": 1, "op": "ping"})["counters"]
    assert counters["decide:share"] == 400


def test_a_hung_client_does_not_block_others(daemon):
    with connect(daemon.socket) as idle:
        idle.sendall(b'{"v": 1, "op": "ping"')  # half a request, never finished
        started = time.perf_counter()
        assert request_once(daemon.socket, {"v": 1, "op": "ping"})["ok"]
        assert time.perf_counter() - started < 1


ONE_V100_NODE = "#!/bin/sh\necho 'v100-1|v100|gpu*|gpu:v100:2|idle'\n"


def serve_files(tmp_path, sinfo=ONE_V100_NODE):
    """A config for `slurm-gpushare serve`, its writer, and an environment whose Slurm
    commands are stand-ins (no Slurm here): sinfo gives the daemon's view one v100 node,
    without which it would keep every job; squeue and scontrol (reservations) answer nothing."""
    config = tmp_path / "gpushare.toml"
    sock, log = tmp_path / "d.sock", tmp_path / "daemon.log"

    def write(default_share):
        config.write_text(
            f'[daemon]\nsocket = "{sock}"\nlog_file = "{log}"\nsecret_file = "{tmp_path}/secret"\n'
            f'query_socket = "{tmp_path}/q.sock"\nstate_dir = "{tmp_path}/state"\n'
            f'[policy]\nsharing_partitions = ["gpu"]\ndefault_share_gib = {default_share}\n'
            'first_run = "default-share"\nkeep_whole_when_idle = false\n'
            '[gpu_types.v100]\nmemory_gib = 16\n')

    write(8)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text(sinfo)
    (bin_dir / "squeue").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("sinfo", "squeue", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return config, sock, log, write, env


def start_serve(config, env):
    return subprocess.Popen([sys.executable, "-m", "slurm_gpushare", "serve", "--config",
                             str(config)], cwd=str(REPO), stderr=subprocess.PIPE, text=True,
                            env=env)


@pytest.fixture
def served(tmp_path):
    """The real `slurm-gpushare serve` process."""
    config, sock, log, write, env = serve_files(tmp_path)
    proc = start_serve(config, env)
    deadline = time.monotonic() + 90  # start-up is not what these tests time
    try:
        while not sock.exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.05)
    except AssertionError:
        proc.kill()  # a daemon that did not come up must not outlive the test
        proc.wait()
        raise
    yield proc, str(sock), log, write, config
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def decide(sock, **job):
    return request_once(sock, {"v": 1, "op": "decide", "job": {**JOB, **job}})["decision"]


def test_sighup_reloads_config_and_keeps_old_one_on_error(served):
    proc, sock, log, write, config = served
    assert decide(sock)["share_gib"] == 8
    write(4)
    proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while decide(sock)["share_gib"] != 4:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    config.write_text("[policy\nbroken")
    proc.send_signal(signal.SIGHUP)

    def events():
        return [json.loads(line)["event"] for line in log.read_text().splitlines()]

    deadline = time.monotonic() + 10
    while "reload-failed" not in events():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert decide(sock)["share_gib"] == 4 and "reloaded" in events()


def test_the_running_daemon_has_not_loaded_sklearn_scipy_or_pandas(served):
    """The spawned ``serve``, after answering a decision, has none of the fitting libraries'
    compiled modules mapped (each loads some at import): they would cost seconds per start."""
    proc, sock, *_ = served
    assert decide(sock)["share_gib"] == 8
    mapped = Path(f"/proc/{proc.pid}/maps").read_text()
    assert "numpy" in mapped  # the check sees the packages' own files
    for package in ("sklearn", "scipy", "pandas"):
        assert f"/{package}/" not in mapped, package


def test_sigterm_stops_cleanly_and_removes_the_socket(served):
    proc, sock, log, *_ = served
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert not os.path.exists(sock)
    assert json.loads(log.read_text().splitlines()[-1])["event"] == "stopped"


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM])
def test_a_signal_while_the_daemon_still_reads_the_cluster_is_handled_not_fatal(tmp_path, signum):
    # Before its sockets open the daemon reads the nodes once, which waits as long as sinfo
    # does. A SIGHUP then (logrotate's) must not kill it, and a SIGTERM stops it cleanly.
    slow_sinfo = ("#!/bin/sh\n"
                  f"[ -e {tmp_path}/asked ] || {{ touch {tmp_path}/asked; sleep 2; }}\n"
                  + ONE_V100_NODE.split("\n", 1)[1])
    config, sock, log, _write, env = serve_files(tmp_path, sinfo=slow_sinfo)
    proc = start_serve(config, env)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "asked").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signum)
        if signum == signal.SIGTERM:
            assert proc.wait(30) == 0
            assert not sock.exists()
            return
        while not sock.exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert decide(str(sock))["share_gib"] == 8
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_logs_hold_no_script_name_or_comment(served):
    proc, sock, log, *_ = served
    secret_bits = ["--lr 0.3141", "resnet-secret-model", "imagenet-private", "hush-comment"]
    decide(sock, script=f"#!/bin/sh\npython train.py {secret_bits[0]} {secret_bits[1]}\n",
           name=secret_bits[2], comment=f"{secret_bits[3]} gpushare:mem=4G")
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)
    data = log.read_bytes()
    assert b'"event": "decision"' in data
    for bit in secret_bits:
        assert bit.encode() not in data


def test_refuses_to_steal_a_live_socket(served, tmp_path):
    _, sock, *_ = served
    config = tmp_path / "second.toml"
    config.write_text(f'[daemon]\nsocket = "{sock}"\nsecret_file = "{tmp_path}/secret"\n'
                      f'query_socket = ""\nstate_dir = "{tmp_path}/state2"\n')
    out = subprocess.run([sys.executable, "-m", "slurm_gpushare", "serve", "--config",
                          str(config)], cwd=str(REPO), capture_output=True, text=True, timeout=20)
    assert out.returncode == 1
    assert "another daemon is listening" in out.stderr and "Traceback" not in out.stderr


# ---- the public query socket -------------------------------------------------------------

def test_query_socket_is_public_but_admin_socket_is_not(daemon):
    assert stat.S_IMODE(os.stat(daemon.query_socket).st_mode) == 0o666
    assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == 0o600


def test_users_may_only_use_read_only_ops_for_themselves(daemon):
    from slurm_gpushare.daemon.service import Peer

    user = Peer(uid=4242, admin=False)
    for op in ("decide", "ingest"):
        reply = daemon.service.handle({"v": 1, "op": op, "job": JOB, "summary": {}}, user)
        assert reply["ok"] is False and "not available on this socket" in reply["error"]
    reply = daemon.service.handle({"v": 1, "op": "explain", "job": {**JOB, "uid": 0}}, user)
    assert reply["ok"] and reply["decision"]["action"] == "share"
    # A what-if is not a decision: nothing is recorded for it.
    daemon.service.records.flush()
    assert daemon.store.decisions() == []


def test_decisions_are_recorded_with_fingerprint_keys_but_no_texts(daemon):
    reply = request_once(daemon.socket, {"v": 1, "op": "decide", "job": {
        **JOB, "script": "#!/bin/sh\npython train.py --secret-flag\n", "name": "secret-name"}})
    daemon.service.records.flush()
    record = daemon.store.decision(reply["decision"]["decision_id"])
    assert record["action"] == "share" and len(record["keys"]) == 3
    assert "secret" not in json.dumps(record)


def test_unknown_job_lookup_is_a_clear_error(daemon):
    reply = request_once(daemon.query_socket, {"v": 1, "op": "job", "job_id": "not-a-job"})
    assert reply["ok"] is False and "not a job id" in reply["error"]


@pytest.mark.parametrize("action", ["log", "requeue"])
def test_overrun_is_logged_and_requeued_when_configured(tmp_path, action):
    from conftest import RunningDaemon, make_config

    running = RunningDaemon(make_config(tmp_path, on_share_exceeded=action))
    requeued = []
    running.service.learner.requeue = lambda job_id, peak, config: requeued.append((job_id, peak))
    try:
        reply = request_once(running.socket, {"v": 1, "op": "overrun", "job_id": "77",
                                              "peak_mib": 9000, "limit_mib": 8192})
        running.service.records.flush()
        assert reply == {"v": 1, "ok": True, "action": action, "rid": None}
        assert requeued == ([("77", 9000.0)] if action == "requeue" else [])
        bad = request_once(running.socket, {"v": 1, "op": "overrun", "job_id": "x; rm"})
        assert bad["ok"] is False and "job_id" in bad["error"]
    finally:
        running.stop()


def test_users_cannot_report_overruns(daemon):
    from slurm_gpushare.daemon.service import Peer

    reply = daemon.service.handle({"v": 1, "op": "overrun", "job_id": "1"},
                                    Peer(uid=4242, admin=False))
    assert reply["ok"] is False and "not available" in reply["error"]


def test_a_gpu_type_whose_memory_gib_is_above_what_its_gpus_report_is_warned_once(daemon, caplog):
    """A V100 16GB reports 16,160 MiB: memory_gib = 16 promises shards that do not exist."""
    def ingest(job_id, model, total):
        summary = {"job_id": job_id, "gpu_index": 0, "cluster": "c", "samples": 3,
                   "mgmap_max_mib": 1000.0, "gpu_model": model, "mem_total_mib": total}
        assert request_once(daemon.socket, {"v": 1, "op": "ingest", "summary": summary})["ok"]

    with caplog.at_level("WARNING", logger="slurm_gpushare"):
        ingest("1", "NVIDIA A100-SXM4-80GB", 81920.0)  # as configured: no warning
        ingest("2", "Tesla V100-SXM2-16GB", 16160.0)
        ingest("3", "Tesla V100-SXM2-16GB", 16160.0)  # the same again: warned once
        ingest("4", "Unknown GPU", 1.0)  # a model no type names: nothing to compare
        daemon.service.records.flush()
    counters = request_once(daemon.socket, {"v": 1, "op": "ping"})["counters"]
    assert counters.get("memory-overstated") == 1
    (warned,) = [r.fields for r in caplog.records if r.getMessage() == "memory-overstated"]
    assert warned == {"gpu_type": "v100", "gpu_model": "Tesla V100-SXM2-16GB",
                      "configured_mib": 16384, "reported_mib": 16160, "fix": "memory_gib = 15"}


def test_a_job_that_ran_on_a_gpu_the_catalogue_lacks_shares_there_next_time(tmp_path):
    # [gpu_types.b200] is newer than the GPU catalogue: the job's run there (NVML's name)
    # sizes its next share on b200, which before was an internal error on every decision.
    from conftest import RunningDaemon, run_once

    config = parse_config({
        "daemon": {"socket": str(tmp_path / "d.sock"), "secret_file": str(tmp_path / "secret"),
                   "query_socket": str(tmp_path / "q.sock"), "state_dir": str(tmp_path / "state")},
        "policy": {"sharing_partitions": ["gpu"], "first_run": "default-share"},
        "gpu_types": {"b200": {"memory_gib": 180}, "a100": {"memory_gib": 80}}})
    running = RunningDaemon(config)
    job = {"uid": 1000, "user": "alice", "partition": "gpu", "tres_per_node": "gres:gpu:1",
           "script": "#!/bin/sh\npython train.py\n", "batch": True}
    try:
        run_once(running, job, "NVIDIA B200", 184320.0)
        again = request_once(running.socket, {"v": 1, "op": "decide", "job": job})["decision"]
        assert again["code"] == "history-share", again
        assert again["gpu_types"] == ["b200"] and again["writes"]["features"] == "b200"
        # Its peak is said once ("history: peak 19.5 GiB on NVIDIA B200 + 5% margin; ..."),
        # not once per part of the estimate that saw it.
        assert again["reason"].startswith("history: peak 19.5 GiB on "), again["reason"]
        assert again["reason"].count("19.5 GiB") == 1, again["reason"]
        assert running.service.counters.get("internal-errors", 0) == 0
    finally:
        running.stop()


def test_class_pairs_taught_by_co_runs_do_not_change_any_decision(tmp_path):
    # The classes' knowledge base learns class pairs from every user's co-runs (`kb show` and
    # the reports' class-pair heat map summarise them), so one user's runs could teach
    # that a class does not stack, or that it does, for everyone's jobs of that class.
    # Decisions read the pair predictor only (a job's own profile, and corrections learned as
    # test_pairing's rules say). Before, a daemon without a cluster view judged an array's
    # copies by the classes: this array became whole GPUs per task.
    from conftest import RunningDaemon, make_config

    from slurm_gpushare.predict.knowledge import KnowledgeBase

    config = make_config(tmp_path, keep_whole_when_idle=False)
    job = {**JOB, "script": "#!/bin/sh\npython train.py\n", "array_inx": "0-3"}
    running = RunningDaemon(config)

    def decide() -> tuple[tuple, int]:
        reply = request_once(running.socket, {"v": 1, "op": "decide", "job": job})
        running.service.records.flush()
        decision = reply["decision"]
        record = running.store.decision(decision["decision_id"])
        writes = json.dumps(decision["writes"], sort_keys=True)  # less the decision's own id
        return ((decision["action"], decision["code"],
                 writes.replace(decision["decision_id"], "ID")), record["job_class"])

    try:
        first = request_once(running.socket, {"v": 1, "op": "decide", "job": job})["decision"]
        running.service.records.flush()
        summary = {"job_id": "41", "gpu_index": 0, "cluster": "c", "samples": 30,
                   "gpu_model": "Tesla V100-SXM2-16GB", "mem_total_mib": 16384.0,
                   "duration_s": 600.0, "mgmap_max_mib": 3000.0, "mgmap_max_pct": 18.0,
                   "mgup_mean": 20.0, "mgup_max": 35.0, "mgtsamp_mean": 5.0,
                   "mgtsamp_max": 9.0}
        assert request_once(running.socket, {"v": 1, "op": "ingest", "summary": summary,
                                             "decision_id": first["decision_id"]})["ok"]
        running.service.records.flush()
        before, job_class = decide()
        assert job_class is not None and before[0] == "share", before
        classes = running.service.estimator.classes
        # Other users' co-runs of that class pair: first that it stacks freely, then (60 more)
        # that it never does. The daemon reads every co-run again when it starts.
        for isd, runs, first_job in ((0.0, 20, 900), (0.9, 60, 1000)):
            for n in range(first_job, first_job + runs):
                running.store.record_corun(str(n), str(n + 5000), cluster="c", gpu_type="v100",
                                           class_a=job_class, class_b=job_class, isd_a=isd,
                                           isd_b=isd, same_user=False)
            knowledge = KnowledgeBase.from_store(running.store, classes)
            assert knowledge.compatible(job_class, job_class, "v100") is (isd == 0.0)
            running.stop()
            running = RunningDaemon(config)
            after, _ = decide()
            assert after == before, (isd, after)
    finally:
        running.stop()
