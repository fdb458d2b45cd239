#!/usr/bin/env python3
"""What one decision costs the daemon: CPU time and round trip per request, old code vs new.

Starts the real ``slurm-gpushare serve`` of each checkout given (``--code``, e.g. the commit
before a change unpacked with ``git archive``, and this one), each with its own temporary
config, store and log file, and sends decide requests on one kept connection, as the hook does.
Rounds alternate between the checkouts, so drift on the machine hits all alike. The daemon's
CPU time (user + system, from /proc) per request is the figure that a busy machine disturbs
least; the round trip's wall time is recorded too. Three request shapes: a short script, a
64 KiB script, and the 64 KiB script sent as the digest the daemon returned for it (only where
the daemon returns one).

    .venv/bin/python bench/daemon_cost.py --code /tmp/before --code . [--rounds 5]
        [--requests 2000] [--nodes 4] [--out bench/results/daemon_cost.json]

``--pace-ms 6 --pace-ms 20`` also sends short-script requests one every 6 (20) ms, as
sequential submissions reach the daemon (``sbatch`` in a loop: one every ~6 ms here), and
``--echo`` measures a minimal Python server on the same socket pattern (a thread per
connection, one JSON line each way, no work) beside the daemons: the cost of being woken for
each request, which no change to the daemon's own work removes. CPU time is the scheduler's
own account (``/proc/PID/task/*/schedstat``, nanoseconds), not tick-sampled.

``--nodes N`` gives every daemon a view of N GPU nodes (sinfo/squeue/scontrol stand-ins on its
PATH, half v100, half a100, no running jobs), so that requests take the path of a real cluster:
shares placed, the ledger of pending shares claimed, refreshes every second while shares
pend. Without it the daemon sees no Slurm and keeps every job ("not-checkable").
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
import tempfile
import time
from pathlib import Path

import echo_server  # beside this script

REPO = Path(__file__).resolve().parent.parent
SHORT = "#!/bin/sh\n#SBATCH --gres=gpu:1\npython train.py\n"
LONG = "#!/bin/sh\n" + "echo a line of a long job script\n" * 2000  # ~64 KiB


IDLE_S = 3.0  # how long the background cost is measured after paced requests


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` so far, from the scheduler's own account."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended between listing and reading
    return total / 1e9


def slurm_stand_ins(directory: Path, nodes: int) -> Path:
    """sinfo/squeue/scontrol that show ``nodes`` idle GPU nodes and nothing running."""
    directory.mkdir(parents=True)
    lines = "".join(f"n{i}|{'v100' if i % 2 else 'a100'}|gpu*|"
                    f"gpu:{'v100' if i % 2 else 'a100'}:4|mix\n" for i in range(nodes))
    (directory / "nodes.txt").write_text(lines)
    (directory / "sinfo").write_text(f"#!/bin/sh\ncat {directory / 'nodes.txt'}\n")
    (directory / "squeue").write_text("#!/bin/sh\nexit 0\n")
    (directory / "scontrol").write_text("#!/bin/sh\nexit 0\n")  # no reservations
    for tool in ("sinfo", "squeue", "scontrol"):
        (directory / tool).chmod(0o755)
    return directory


class Daemon:
    def __init__(self, code: Path | None, tmp: Path, slurm_bin: Path | None = None):
        """The daemon of checkout ``code``; with ``code`` None, the echo server."""
        self.code = code
        tmp.mkdir(parents=True)
        self.sock_path = tmp / "d.sock"
        if code is None:
            self.proc = echo_server.start(self.sock_path, quiet=True)
            self._connect()
            return
        config = tmp / "gpushare.toml"
        config.write_text(
            f'[daemon]\nsocket = "{self.sock_path}"\nlog_file = "{tmp}/daemon.log"\n'
            f'secret_file = "{tmp}/secret"\nquery_socket = ""\nstate_dir = "{tmp}/state"\n'
            '[policy]\nsharing_partitions = ["gpu"]\nfirst_run = "default-share"\n'
            '[gpu_types.v100]\nmemory_gib = 16\n[gpu_types.a100]\nmemory_gib = 80\n')
        env = {**os.environ, "PYTHONPATH": str(code)}
        if slurm_bin is not None:
            env["PATH"] = f"{slurm_bin}:{env['PATH']}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "slurm_gpushare", "serve", "--config", str(config)],
            cwd=str(code), env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._connect()

    def _connect(self) -> None:
        deadline = time.monotonic() + 180
        while not self.sock_path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"daemon of {self.code or 'echo'} did not start")
            time.sleep(0.1)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(self.sock_path))
        self.reader = self.sock.makefile("rb")

    def ask(self, job: dict) -> dict:
        self.sock.sendall(json.dumps({"v": 1, "op": "decide", "job": job}).encode() + b"\n")
        return json.loads(self.reader.readline())

    def measure(self, job: dict, requests: int, pace_s: float = 0.0) -> dict:
        """Send ``requests`` decide requests back to back, or one every ``pace_s``."""
        line = json.dumps({"v": 1, "op": "decide", "job": job}).encode() + b"\n"
        times = []
        cpu_before, loop_started = cpu_seconds(self.proc.pid), time.perf_counter()
        for _ in range(requests):
            started = time.perf_counter()
            self.sock.sendall(line)
            self.reader.readline()
            times.append(time.perf_counter() - started)
            if pace_s:
                time.sleep(max(0.0, pace_s - (time.perf_counter() - started)))
        cpu = cpu_seconds(self.proc.pid) - cpu_before
        elapsed = time.perf_counter() - loop_started
        time.sleep(0.3)  # let batched writes land, then count them too
        cpu_after_writes = cpu_seconds(self.proc.pid) - cpu_before
        ordered = sorted(times)
        figures = {"cpu_us_per_request": round(cpu / requests * 1e6, 1),
                   "cpu_us_per_request_with_writes": round(cpu_after_writes / requests * 1e6, 1),
                   "p50_ms": round(ordered[len(ordered) // 2] * 1000, 4),
                   "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))] * 1000, 4)}
        if pace_s:
            # What the daemon spends while no request comes (its view's refreshes: every
            # second while shares it placed pend), over as long as the paced requests took:
            # spread over few requests it is most of their cost, though no request causes it.
            idle_before = cpu_seconds(self.proc.pid)
            time.sleep(IDLE_S)
            idle = (cpu_seconds(self.proc.pid) - idle_before) / IDLE_S
            figures["idle_cpu_ms_per_s"] = round(idle * 1000, 2)
            figures["cpu_us_per_request_less_idle"] = round(
                max(cpu - idle * elapsed, 0.0) / requests * 1e6, 1)
        return figures

    def stop(self) -> None:
        self.sock.close()
        self.proc.terminate()
        self.proc.wait(30)


def job(**fields) -> dict:
    return {"uid": 1000, "user": "alice", "partition": "gpu", "tres_per_node": "gres:gpu:1",
            "min_nodes": 4294967294, "shared": 65534, "name": "train", **fields}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", action="append", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--nodes", type=int, default=0,
                        help="GPU nodes the daemons see (Slurm stand-ins); 0: no Slurm")
    parser.add_argument("--pace-ms", type=float, action="append", default=[],
                        help="also send short-script requests one every this many ms")
    parser.add_argument("--echo", action="store_true",
                        help="measure a minimal Python server beside the daemons")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "daemon_cost.json"))
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="daemon-cost-"))
    slurm_bin = slurm_stand_ins(tmp / "bin", args.nodes) if args.nodes else None
    daemons = {code: Daemon(Path(code).resolve(), tmp / f"d{i}", slurm_bin)
               for i, code in enumerate(args.code)}
    if args.echo:
        daemons["echo"] = Daemon(None, tmp / "echo")
    results: dict[str, dict[str, list]] = {code: {} for code in daemons}
    actions: dict[str, set] = {}  # what the daemons decided (action:code), per checkout
    try:
        for daemon in daemons.values():  # warm up: imports, caches
            daemon.measure(job(script=SHORT), 200)
        for round_no in range(args.rounds):
            order = list(daemons.items())
            order = order[round_no % len(order):] + order[:round_no % len(order)]
            for code, daemon in order:
                reply = daemon.ask(job(script=LONG))
                digest = reply.get("script_digest")
                actions.setdefault(code, set()).add(
                    f"{reply['decision']['action']}:{reply['decision']['code']}")
                shapes = {"short_script": job(script=SHORT), "script_64k": job(script=LONG)}
                if digest:
                    shapes["script_64k_as_digest"] = job(script_digest=digest)
                for shape, fields in shapes.items():
                    results[code].setdefault(shape, []).append(
                        daemon.measure(fields, args.requests if shape != "script_64k"
                                       else args.requests // 4))
                for pace_ms in args.pace_ms:  # fewer requests: each takes pace_ms
                    results[code].setdefault(f"short_script_every_{pace_ms:g}ms", []).append(
                        daemon.measure(job(script=SHORT),
                                       max(50, min(args.requests, int(3000 / pace_ms))),
                                       pace_s=pace_ms / 1000))
            print(f"round {round_no + 1}/{args.rounds} done", flush=True)
    finally:
        for daemon in daemons.values():
            daemon.stop()

    def summary(rounds: list[dict]) -> dict:
        out = {}
        for key in rounds[0]:
            values = [r[key] for r in rounds]
            out[key] = {"median": round(statistics.median(values), 4),
                        "min": min(values), "max": max(values), "rounds": values}
        return out

    commits = {}
    for code in args.code:
        commits[code] = subprocess.run(["git", "-C", code, "rev-parse", "--short", "HEAD"],
                                       capture_output=True, text=True).stdout.strip() or None
    record = {
        "benchmark": "daemon_cost",
        "command": "python bench/daemon_cost.py " + " ".join(argv or sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "loadavg_before": load_before,
                    "loadavg_after": os.getloadavg()},
        "cpu_time": "schedstat (scheduler's account of every thread, ns)",
        "rounds": args.rounds, "requests_per_round": args.requests, "nodes": args.nodes,
        "pace_ms": args.pace_ms, "echo": args.echo,
        "actions": {code: sorted(seen) for code, seen in actions.items()},
        "commits": commits,
        "results": {code: {shape: summary(rounds) for shape, rounds in shapes.items()}
                    for code, shapes in results.items()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record["results"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
