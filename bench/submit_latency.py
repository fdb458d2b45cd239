#!/usr/bin/env python3
"""Submission-path benchmark on the local test cluster; records its figures.

One interleaved run: rounds rotate slurmctld between JobSubmitPlugins unset ("plain"), an
empty job_submit.lua ("empty-lua": the job_submit/lua plugin's own cost, which grows with the
jobs slurmctld holds) and the hook + daemon ("hook"), so drift on the machine hits all alike. Per round and mode it
measures sbatch latency (sequential submissions of held jobs) and throughput (parallel
submitters). It also measures the daemon's own round trip (persistent connection, as the hook
uses it) and the hook's submission rate with the daemon stopped and with it hung (accepts,
never answers). Jobs are submitted held and cancelled: nothing runs.

    .venv/bin/python bench/submit_latency.py [--rounds 5] [--jobs 100] [--label after]
        [--echo] [--out bench/results/submit_latency.json]

``--echo`` adds a fourth mode, "echo": the project's hook asking ``bench/echo_server.py`` in the
daemon's place (a thread per connection, one JSON line each way, every job kept and tagged):
what the hook's round trip to any out-of-process server costs, whatever that server decides.

Each run is kept under its label in the output file (earlier labels stay), with the machine's
load average at every round and the throughput ratio's mean, min and max over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import echo_server  # noqa: E402 -- beside this script
from devcluster.cluster import TestCluster  # noqa: E402

SCRIPT = "#!/bin/sh\ntrue\n"
EMPTY_HOOK = """-- job_submit.lua that does nothing: the plugin's own cost, for comparison
function slurm_job_submit(job_desc, part_list, submit_uid) return slurm.SUCCESS end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid) return slurm.SUCCESS end
"""
MODES = ("plain", "empty-lua", "hook")


class Echo:
    """The echo server (``bench/echo_server.py``) in the daemon's place on the daemon's socket:
    the project's hook asking a server that decides nothing (mode "echo")."""

    def __init__(self):
        self.proc = None

    def start(self, cluster) -> None:
        if self.proc is None:
            cluster.stop_daemon()
            self.proc = echo_server.start(cluster.daemon_socket, tag=True)

    def stop(self, cluster) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)
            self.proc = None
            Path(cluster.daemon_socket).unlink(missing_ok=True)

    def pid(self):
        return self.proc.pid if self.proc else None


def set_mode(cluster, mode: str, empty_hook: Path, echo: Echo) -> None:
    """Point slurmctld at no hook, the empty hook, or the project's hook (asking the daemon,
    or in "echo" mode the echo server)."""
    if mode == "echo":
        echo.start(cluster)
    else:
        echo.stop(cluster)
        cluster.start_daemon()
    link = cluster.etc / "job_submit.lua"
    link.unlink()
    link.symlink_to(empty_hook if mode == "empty-lua" else REPO / "slurm_gpushare" / "lua" / "job_submit.lua")
    cluster.set_job_submit(mode != "plain")
    if mode in ("hook", "echo"):
        cluster.wait_hook()


TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process (0 when it is gone): the figure a busy machine
    disturbs least, unlike wall-clock latency."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def submit(cluster, env) -> float:
    started = time.perf_counter()
    subprocess.run(["sbatch", "--parsable", "--hold", "--gres=gpu:1", "-o", "/dev/null"],
                   input=SCRIPT, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - started


def latency_block(cluster, jobs):
    env = cluster.env()
    return [submit(cluster, env) for _ in range(jobs)]


def throughput_block(cluster, jobs, workers=4):
    env = cluster.env()
    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda _: submit(cluster, env), range(jobs)))
    return jobs / (time.perf_counter() - started)


def cancel_all(cluster):
    cluster.slurm("scancel", "--state=PENDING", "--user=root", check=False)


def daemon_round_trip(cluster, requests=3000, script=SCRIPT, digest=None):
    """Round trips on one kept connection; with ``digest``, the script's digest is sent in
    its place (as the hook does for a script it sent before)."""
    job = {"uid": 0, "user": "root", "partition": "gpu", "tres_per_node": "gres:gpu:1",
           "min_nodes": 4294967294, "shared": 65534, "name": "bench",
           **({"script_digest": digest} if digest else {"script": script})}
    times = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(cluster.daemon_socket))
        reader = sock.makefile("rb")
        for rid in range(requests):
            line = json.dumps({"v": 1, "op": "decide", "rid": rid, "job": job}).encode() + b"\n"
            started = time.perf_counter()
            sock.sendall(line)
            reader.readline()
            times.append(time.perf_counter() - started)
    return times


class HungServer:
    """Accepts connections on the daemon's socket and never answers."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(128)
        self.held = []
        self.path = path
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        self.sock.close()
        for conn in self.held:
            conn.close()
        os.unlink(self.path)


def ms(values):
    return {"p50_ms": round(percentile(values, 50) * 1000, 3),
            "p99_ms": round(percentile(values, 99) * 1000, 3),
            "mean_ms": round(statistics.mean(values) * 1000, 3), "n": len(values)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=100, help="submissions per block")
    parser.add_argument("--label", default="after")
    parser.add_argument("--echo", action="store_true",
                        help="add mode 'echo': the hook asking bench/echo_server.py, which "
                             "decides nothing (the least any out-of-process daemon costs)")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "submit_latency.json"))
    args = parser.parse_args(argv)
    load_per_round = []

    load_before = os.getloadavg()
    modes = MODES + (("echo",) if args.echo else ())
    echo = Echo()
    cluster = TestCluster()
    cluster.start()
    latency = {mode: [] for mode in modes}
    throughput = {mode: [] for mode in modes}
    per_round = {mode: [] for mode in modes}
    # CPU milliseconds per submission: slurmctld's (the Lua plugin and hook run in it) and the
    # daemon's (its decisions), over each block of sequential and parallel submissions.
    cpu_per_job = {mode: {"slurmctld": [], "daemon": []} for mode in modes}
    empty_hook = cluster.root / "empty_job_submit.lua"
    empty_hook.write_text(EMPTY_HOOK)
    jobs_held = len(cluster.slurm("squeue", "-h", "-t", "all", "-o", "%i").stdout.split())
    try:
        for round_no in range(args.rounds):
            order = modes[round_no % len(modes):] + modes[:round_no % len(modes)]
            load_per_round.append([round(v, 2) for v in os.getloadavg()])
            for mode in order:
                set_mode(cluster, mode, empty_hook, echo)
                latency_block(cluster, 10)  # warm up: connections, caches
                pids = {"slurmctld": cluster._pid("slurmctld"),
                        "daemon": echo.pid() if mode == "echo" else cluster.daemon_pid()}
                cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
                block = latency_block(cluster, args.jobs)
                latency[mode] += block
                per_round[mode].append(ms(block))
                throughput[mode].append(throughput_block(cluster, args.jobs))
                for name, pid in pids.items():
                    used = cpu_seconds(pid) - cpu_before[name]
                    cpu_per_job[mode][name].append(round(used / (2 * args.jobs) * 1000, 3))
                cancel_all(cluster)
                print(f"round {round_no + 1}/{args.rounds} {mode:9}: "
                      f"p50 {percentile(latency[mode], 50) * 1000:.2f} ms, "
                      f"{throughput[mode][-1]:.1f} jobs/s; CPU ms/job slurmctld "
                      f"{cpu_per_job[mode]['slurmctld'][-1]}, daemon "
                      f"{cpu_per_job[mode]['daemon'][-1]}", flush=True)

        # Hook on from here: the daemon's own round trip, then the failure modes.
        set_mode(cluster, "hook", empty_hook, echo)
        round_trip = daemon_round_trip(cluster)
        big_script = "#!/bin/sh\n" + "echo a line of a long job script\n" * 2000  # ~64 KiB
        big_trip = daemon_round_trip(cluster, 500, script=big_script)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:  # the digest it returns
            sock.connect(str(cluster.daemon_socket))
            sock.sendall(json.dumps({"v": 1, "op": "decide", "job": {
                "uid": 0, "user": "root", "partition": "gpu", "tres_per_node": "gres:gpu:1",
                "script": big_script, "name": "bench"}}).encode() + b"\n")
            big_digest = json.loads(sock.makefile("rb").readline()).get("script_digest")
        digest_trip = daemon_round_trip(cluster, 500, digest=big_digest) if big_digest else []
        normal_rate = throughput_block(cluster, args.jobs)
        cluster.stop_daemon()
        stopped_rate = throughput_block(cluster, args.jobs)
        hung = HungServer(str(cluster.daemon_socket))
        try:
            hung_latency = latency_block(cluster, args.jobs)
            hung_rate = throughput_block(cluster, args.jobs)
        finally:
            hung.close()
        cancel_all(cluster)
    finally:  # leave the cluster as the tests expect it: the daemon up, the project's hook on
        echo.stop(cluster)
        for attempt in range(3):  # a loaded machine may take longer than one wait to start it
            try:
                cluster.start_daemon()
                break
            except Exception as exc:  # noqa: BLE001 -- the figures are written either way
                print(f"daemon restart, attempt {attempt + 1}: {exc}", flush=True)
        set_mode(cluster, "hook", empty_hook, echo)

    plain, empty, hook = ms(latency["plain"]), ms(latency["empty-lua"]), ms(latency["hook"])
    rate = {mode: statistics.mean(values) for mode, values in throughput.items()}
    ratios = [round(h / p, 3) for h, p in zip(throughput["hook"], throughput["plain"])]
    run = {
        "command": "python bench/submit_latency.py " + " ".join(argv or sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                    "slurm": subprocess.run(["slurmctld", "-V"], capture_output=True,
                                            text=True).stdout.strip()},
        "rounds": args.rounds, "jobs_per_block": args.jobs,
        "jobs_in_slurmctld_at_start": jobs_held,
        "sbatch_latency": {"plain": plain, "empty-lua": empty, "hook": hook,
                           "added_p50_ms": round(hook["p50_ms"] - plain["p50_ms"], 3),
                           "added_p99_ms": round(hook["p99_ms"] - plain["p99_ms"], 3),
                           "hook_over_empty_lua_p50_ms": round(hook["p50_ms"] - empty["p50_ms"], 3)},
        "throughput_jobs_per_s": {
            **{mode: round(value, 2) for mode, value in rate.items()},
            "ratio": round(rate["hook"] / rate["plain"], 3),
            "ratio_empty_lua_to_plain": round(rate["empty-lua"] / rate["plain"], 3),
            "ratio_hook_to_empty_lua": round(rate["hook"] / rate["empty-lua"], 3),
        },
        "sbatch_latency_per_round": per_round,
        "added_p50_ms_per_round": [round(h["p50_ms"] - p["p50_ms"], 3)
                                   for h, p in zip(per_round["hook"], per_round["plain"])],
        "added_p99_ms_per_round": [round(h["p99_ms"] - p["p99_ms"], 3)
                                   for h, p in zip(per_round["hook"], per_round["plain"])],
        "throughput_per_round": {mode: [round(v, 2) for v in values]
                                 for mode, values in throughput.items()},
        "throughput_ratio_per_round": ratios,
        "throughput_ratio_over_rounds": {
            "mean": round(statistics.mean(ratios), 3), "min": min(ratios), "max": max(ratios),
            "stdev": round(statistics.stdev(ratios), 3) if len(ratios) > 1 else None},
        "loadavg_per_round": load_per_round,
        "cpu_ms_per_job_per_round": cpu_per_job,
        "cpu_ms_per_job": {mode: {name: round(statistics.mean(values), 3)
                                  for name, values in by_process.items()}
                           for mode, by_process in cpu_per_job.items()},
        "daemon_round_trip": ms(round_trip),
        "daemon_round_trip_64k_script": ms(big_trip),
        "daemon_round_trip_64k_as_digest": ms(digest_trip) if digest_trip else None,
        "daemon_failure_modes": {
            "normal_jobs_per_s": round(normal_rate, 2),
            "stopped_jobs_per_s": round(stopped_rate, 2),
            "hung_jobs_per_s": round(hung_rate, 2),
            "stopped_ratio": round(stopped_rate / normal_rate, 3),
            "hung_ratio": round(hung_rate / normal_rate, 3),
            "hung_sbatch_latency": ms(hung_latency),
        },
        **({"echo": {
            "what": "the hook asking bench/echo_server.py (decides nothing): the least an "
                    "out-of-process daemon costs on this path",
            "sbatch_latency": ms(latency["echo"]),
            "added_p50_ms": round(ms(latency["echo"])["p50_ms"] - plain["p50_ms"], 3),
            "throughput_ratio": round(statistics.mean(throughput["echo"]) / rate["plain"], 3),
            "throughput_ratio_per_round": [round(e / p, 3) for e, p in
                                           zip(throughput["echo"], throughput["plain"])],
            "hook_to_echo_throughput_ratio": round(rate["hook"] / rate["echo"], 3),
        }} if "echo" in latency else {}),
        "targets": {"added_p50_ms": 0.3, "added_p99_ms": 1.0, "throughput_ratio": 0.95,
                    "hung_ratio": 0.5},
    }
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    if "runs" not in results:  # a file of one run, from before runs were labelled
        results = {"benchmark": "submit_latency", "runs": {"before": results} if results else {}}
    results["runs"][args.label] = run
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(run, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
