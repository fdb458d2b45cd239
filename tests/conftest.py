"""Shared fixtures: in-process daemons on real sockets, misbehaving servers, the test cluster."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from slurm_gpushare.core.config import parse_config
from slurm_gpushare.daemon.protocol import request as request_once
from slurm_gpushare.daemon.server import DaemonServer, open_store
from slurm_gpushare.daemon.service import Service
from slurm_gpushare.predict.datasets import default_data_dir


REPO = Path(__file__).resolve().parents[1]
# Everything a predictor's fit or evaluation can read: its code and the packaged data.
PREDICTOR_INPUTS = ("slurm_gpushare/predict", "slurm_gpushare/core", "slurm_gpushare/data")


def bench_module(name: str):
    """The benchmark script ``bench/<name>.py`` loaded as a module (to test its helpers)."""
    path = REPO / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cached_json(name: str, compute: Callable[[], Any], key: str = "") -> Any:
    """``compute()``'s JSON-able result, kept in .cache/ under a hash of ``key`` and of every
    file in ``PREDICTOR_INPUTS``: a fit or evaluation that takes seconds is done once per
    version of the code and data, and any change to those recomputes it."""
    from slurm_gpushare.core.files import replace_atomically

    digest = hashlib.sha256(f"{name}\0{key}".encode())
    for folder in PREDICTOR_INPUTS:
        for path in sorted((REPO / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    cached = REPO / ".cache" / f"{name}-{digest.hexdigest()[:16]}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    text = json.dumps(compute())
    replace_atomically(cached, text.encode(), mode=0o644)
    return json.loads(text)


def make_config(tmp_path: Path, **policy):
    return parse_config({
        "daemon": {"socket": str(tmp_path / "d.sock"), "secret_file": str(tmp_path / "secret"),
                   "query_socket": str(tmp_path / "q.sock"),
                   "state_dir": str(tmp_path / "state"), "max_request_bytes": 65536},
        "policy": {"sharing_partitions": ["gpu"], "default_share_gib": 8,
                   "first_run": "default-share", **policy},
        "gpu_types": {"v100": {"memory_gib": 16, "model": "V100-16GB"},
                      "a100": {"memory_gib": 80, "model": "A100-80GB"}},
    })


class RunningDaemon:
    """The daemon's real servers (main and query socket) in this process, with a real store."""

    def __init__(self, config):
        self.config = config
        self.store = open_store(config)
        self.reader = open_store(config)
        self.service = Service(config, store=self.store, reader=self.reader)
        self.servers = [DaemonServer(self.service), DaemonServer(self.service, public=True)]
        for server in self.servers:
            # A short poll: stop() waits up to one interval per server for serve_forever to end.
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01},
                             daemon=True).start()
        self.socket = config.daemon.socket
        self.query_socket = config.daemon.query_socket

    def stop(self):
        for server in self.servers:
            server.stopping.set()
            server.shutdown()
            server.server_close()
        self.service.records.close()
        self.store.close()
        self.reader.close()


def run_once(daemon: RunningDaemon, job: dict, gpu_model: str, mem_total_mib: float,
             peak_mib: float = 20000.0) -> dict:
    """Decide ``job`` and report one run of it (telemetry of ``peak_mib`` on ``gpu_model``)
    against that decision, as the node agent does: its next decision has history. Returns the
    first decision."""
    first = request_once(daemon.socket, {"v": 1, "op": "decide", "job": job})["decision"]
    daemon.service.records.flush()  # the decision is recorded before its job reports
    summary = {"job_id": "41", "gpu_index": 0, "cluster": "c", "samples": 3,
               "mgmap_max_mib": peak_mib, "gpu_model": gpu_model,
               "mem_total_mib": mem_total_mib, "duration_s": 600.0}
    assert request_once(daemon.socket, {"v": 1, "op": "ingest", "summary": summary,
                                        "decision_id": first["decision_id"]})["ok"]
    daemon.service.records.flush()
    return first


@pytest.fixture
def daemon(tmp_path):
    running = RunningDaemon(make_config(tmp_path))
    yield running
    running.stop()


class MisbehavingServer:
    """A real Unix-socket server that hangs (accepts, never answers) or answers garbage."""

    def __init__(self, path: str, mode: str):
        self.path, self.mode = path, mode
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(64)
        self.connections = []
        self.accepted = 0
        self.stopped = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.connections.append(conn)
            if self.mode != "hang":
                threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn):
        replies = {
            "garbage": b"this is not json\n",
            "wrong-version": b'{"v": 99, "ok": true}\n',
            "bad-writes": b'{"v": 1, "ok": true, "rid": RID, "decision": {"action": "share", '
                          b'"writes": {"tres_per_node": "gres:shard:4", "partition": "debug"}}}\n',
            "injection": b'{"v": 1, "ok": true, "rid": RID, "decision": {"action": "share", '
                         b'"writes": {"tres_per_node": "gres:shard:4\\nx", "features": "a100"}}}\n',
            "whole-gpu": b'{"v": 1, "ok": true, "rid": RID, "decision": {"action": "share", '
                         b'"writes": {"tres_per_node": "gres:gpu:1,gres:shard:4"}}}\n',
            "keep-with-writes": b'{"v": 1, "ok": true, "rid": RID, "decision": {"action": '
                                b'"keep", "writes": {"tres_per_node": "gres:gpu:2"}}}\n',
            "keep-with-nice": b'{"v": 1, "ok": true, "rid": RID, "decision": {"action": '
                              b'"keep", "writes": {"nice": "-250"}}}\n',
            "share-with-nice": b'{"v": 1, "ok": true, "rid": RID, "decision": {"action": "share", '
                               b'"writes": {"tres_per_node": "gres:shard:4", "nice": "300", '
                               b'"admin_comment": "gpushare:v1:share:id=ab:shard=4:why=x"}}}\n',
            "nice-too-big": b'{"v": 1, "ok": true, "rid": RID, "decision": {"action": '
                            b'"keep", "writes": {"nice": "5000000"}}}\n',
            "close": b"",
        }
        try:
            data = conn.recv(65536)
            import json
            rid = json.loads(data.splitlines()[0]).get("rid", 0)
            reply = replies[self.mode].replace(b"RID", str(rid).encode())
            if reply:
                conn.sendall(reply)
            else:
                conn.close()
        except (OSError, ValueError):
            pass

    def stop(self):
        self.stopped = True
        self.sock.close()
        for conn in self.connections:
            conn.close()
        if os.path.exists(self.path):
            os.unlink(self.path)


@pytest.fixture
def misbehaving(tmp_path):
    servers = []

    def start(mode):
        server = MisbehavingServer(str(tmp_path / f"{mode}.sock"), mode)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


# ---- the real local Slurm cluster --------------------------------------------------------------

@pytest.fixture(scope="session")
def cluster():
    """The local test cluster, started once per test session (idempotent when already up)."""
    if os.environ.get("GPUSHARE_SKIP_CLUSTER"):
        pytest.skip("GPUSHARE_SKIP_CLUSTER is set")
    from devcluster.cluster import TestCluster

    test_cluster = TestCluster()
    started = time.monotonic()
    test_cluster.start()
    test_cluster.startup_seconds = time.monotonic() - started
    yield test_cluster


@pytest.fixture(scope="session")
def multihost_cluster():
    """The multi-host test cluster (each node a network host of its own), started once per
    session beside the single-host one and stopped after."""
    if os.environ.get("GPUSHARE_SKIP_CLUSTER"):
        pytest.skip("GPUSHARE_SKIP_CLUSTER is set")
    from devcluster.multihost import MultiHostCluster

    test_cluster = MultiHostCluster()
    test_cluster.start()
    yield test_cluster
    test_cluster.stop()


def pytest_sessionstart(session):
    """CI runs with ../shared beside the clone: there the tests that read the public data sets
    (the simulator's pinned results among them) must run, not skip for want of the data."""
    data = default_data_dir()
    if os.environ.get("CI", "").lower() == "true" and not (data / "traces" / "philly").is_dir():
        pytest.exit(f"CI=true, but the public data sets are not at {data} (../shared/data beside "
                    "the repository, or GPUSHARE_DATA): the tests that read them would be "
                    "skipped, not run", returncode=4)


def pytest_report_header(config):
    return f"test cluster: Slurm {os.environ.get('GPUSHARE_SLURM') or '22.05'} (GPUSHARE_SLURM)"


def pytest_collection_modifyitems(items):
    """Everything under tests/cluster runs on the real local Slurm cluster."""
    for item in items:
        if "cluster" in Path(str(item.fspath)).parent.parts[-1:]:
            item.add_marker(pytest.mark.cluster)


def wait_for(predicate, timeout: float = 15.0) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False
