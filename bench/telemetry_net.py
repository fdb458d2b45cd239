#!/usr/bin/env python3
"""Telemetry over the network: delivery latency and the summaries/s the daemon accepts.

Starts a private munged (its own key) and the real ``slurm-gpushare serve`` with
``listen_tcp`` on loopback, then delivers distinct job summaries with the agent's own ``Link``
(munge seal, TCP, the daemon's unmunge, the store's commit, the ack):

- latency: one summary per delivery, one at a time; agent send -> daemon ack, p50/p99;
- munge cost: ``munge`` (seal) alone on the same machine, and ``unmunge`` alone, per call;
- throughput: ``--senders`` concurrent agents for ``--seconds``, one summary per delivery
  and ``--batch`` summaries per delivery (what a draining spool sends).

Several rounds; each figure with its spread (min/max over rounds) and the load average.

    .venv/bin/python bench/telemetry_net.py [--rounds 3] [--deliveries 200] [--seconds 10]
        [--senders 4] [--batch 32] [--out bench/results/telemetry_net.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devcluster.munge import start_munged  # noqa: E402
from slurm_gpushare.node.delivery import Link  # noqa: E402
from slurm_gpushare.slurm import munge  # noqa: E402

JOB_IDS = itertools.count(1_000_000)
LOCK = threading.Lock()


def summary() -> dict:
    with LOCK:
        job = next(JOB_IDS)
    return {"job_id": str(job), "gpu_index": 0, "cluster": "bench", "samples": 600,
            "mgmap_max_mib": 6144.0, "mgup_max": 55.0, "gpu_model": "A100-80GB"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Daemon:
    def __init__(self, tmp: Path, munge_socket: str):
        self.port = free_port()
        config = tmp / "gpushare.toml"
        config.write_text(
            f'[daemon]\nsocket = "{tmp}/d.sock"\nlog_file = "{tmp}/daemon.log"\n'
            f'secret_file = "{tmp}/secret"\nquery_socket = ""\nstate_dir = "{tmp}/state"\n'
            f'listen_tcp = "127.0.0.1:{self.port}"\nmunge_socket = "{munge_socket}"\n'
            f'tcp_allowed_uids = [{os.getuid()}]\n'
            '[policy]\nsharing_partitions = ["gpu"]\n'
            '[gpu_types.a100]\nmemory_gib = 80\nmodel = "A100-80GB"\n')
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "slurm_gpushare", "serve", "--config", str(config)],
            cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 180
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("daemon did not start") from None
                time.sleep(0.1)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def latency(link: Link, n: int) -> dict:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        result = link.send([{"op": "ingest", "summary": summary()}])
        times.append((time.perf_counter() - started) * 1000)
        assert result[0]["ok"], result
    return {"p50_ms": round(percentile(times, 0.5), 2), "p99_ms": round(percentile(times, 0.99), 2),
            "mean_ms": round(statistics.fmean(times), 2), "n": n}


def munge_cost(munge_socket: str, n: int) -> dict:
    seal, unseal = [], []
    for _ in range(n):
        started = time.perf_counter()
        credential = munge.encode("x" * 64, socket=munge_socket)
        seal.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        munge.decode(credential, socket=munge_socket)
        unseal.append((time.perf_counter() - started) * 1000)
    return {"munge_p50_ms": round(statistics.median(seal), 2),
            "unmunge_p50_ms": round(statistics.median(unseal), 2)}


def throughput(link: Link, senders: int, seconds: float, batch: int) -> dict:
    accepted = [0] * senders
    stop_at = time.monotonic() + seconds

    def send(index: int) -> None:
        while time.monotonic() < stop_at:
            results = link.send([{"op": "ingest", "summary": summary()} for _ in range(batch)])
            accepted[index] += sum(1 for r in results if r.get("ok"))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    return {"summaries_per_s": round(sum(accepted) / elapsed, 1), "accepted": sum(accepted),
            "seconds": round(elapsed, 1), "senders": senders, "batch": batch}


def spread(rounds: list[dict], key: str) -> dict:
    values = [r[key] for r in rounds]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--deliveries", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "telemetry_net.json"))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gs-bench-net-"))
    munge_socket = start_munged(tmp / "munge", threads=4)
    rounds = []
    try:
        for round_no in range(args.rounds):
            (tmp / f"round{round_no}").mkdir()
            daemon = Daemon(tmp / f"round{round_no}", munge_socket)
            try:
                link = Link("/nonexistent.sock", address=f"127.0.0.1:{daemon.port}",
                            munge_socket=munge_socket, timeout_s=30.0)
                link.send([{"op": "ingest", "summary": summary()}])  # warm-up
                result = {"load_before": os.getloadavg()[0],
                          **{f"latency_{k}": v for k, v in latency(link, args.deliveries).items()},
                          **munge_cost(munge_socket, 50)}
                single = throughput(link, args.senders, args.seconds, 1)
                batched = throughput(link, args.senders, args.seconds, args.batch)
                result |= {"single_per_s": single["summaries_per_s"],
                           "batched_per_s": batched["summaries_per_s"],
                           "load_after": os.getloadavg()[0]}
            finally:
                daemon.stop()
            rounds.append(result)
            print(f"round {round_no + 1}/{args.rounds}: {json.dumps(result)}", flush=True)
    finally:
        subprocess.run(["kill", (tmp / "munge" / "munged.pid").read_text().strip()])
    summary_figures = {key: spread(rounds, key) for key in (
        "latency_p50_ms", "latency_p99_ms", "munge_p50_ms", "unmunge_p50_ms", "single_per_s",
        "batched_per_s", "load_before")}
    out = {"benchmark": "telemetry_net", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "settings": vars(args) | {"out": None}, "summary": summary_figures, "rounds": rounds}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary_figures, indent=1))


if __name__ == "__main__":
    main()
