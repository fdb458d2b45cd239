"""Daemon start: time from spawning ``slurm-gpushare serve`` to its first ping answer.

Each round spawns a fresh daemon (its own state dir, so no fitted model file: the packaged
defaults) with stand-ins for sinfo/squeue/scontrol (no Slurm needed), polls the socket with
``ping`` until it answers, then stops it. Also recorded: which of pandas, scipy and
scikit-learn the running daemon had loaded at that moment (their compiled extensions mapped in
``/proc/PID/maps``).

    .venv/bin/python bench/daemon_start.py --rounds 5 --label after

Results are kept under ``bench/results/daemon_start.json``, one entry per label.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from slurm_gpushare.daemon.protocol import request  # noqa: E402

HEAVY = ("pandas", "scipy", "sklearn")


def heavy_loaded(pid: int) -> list[str]:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return [name for name in HEAVY if f"/site-packages/{name}/" in maps]


def one_round(tmp: Path) -> dict:
    config, sock = tmp / "gpushare.toml", tmp / "d.sock"
    config.write_text(
        f'[daemon]\nsocket = "{sock}"\nlog_file = "{tmp}/daemon.log"\n'
        f'secret_file = "{tmp}/secret"\nquery_socket = "{tmp}/q.sock"\n'
        f'state_dir = "{tmp}/state"\n[policy]\nsharing_partitions = ["gpu"]\n'
        '[gpu_types.v100]\nmemory_gib = 16\n')
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for tool, body in (("sinfo", "echo 'v100-1|v100|gpu*|gpu:v100:2|idle'"),
                       ("squeue", "exit 0"), ("scontrol", "exit 0")):
        (bin_dir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "slurm_gpushare", "serve", "--config",
                             str(config)], cwd=str(REPO), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited with {proc.returncode}")
            if time.monotonic() - started > 120:
                raise RuntimeError("no ping answer within 120 s")
            try:
                if request(str(sock), {"v": 1, "op": "ping"}, timeout=1.0).get("ok"):
                    break
            except (OSError, ValueError):
                time.sleep(0.01)
        elapsed = time.monotonic() - started
        return {"start_s": round(elapsed, 3), "heavy_modules_loaded": heavy_loaded(proc.pid)}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--label", default="current")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "daemon_start.json"))
    args = parser.parse_args(argv)
    rounds = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            rounds.append(one_round(Path(tmp)))
    times = [r["start_s"] for r in rounds]
    entry = {"rounds": rounds, "median_s": round(statistics.median(times), 3),
             "min_s": min(times), "max_s": max(times),
             "load_average": os.getloadavg(), "cpus": os.cpu_count(),
             "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    results[args.label] = entry
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({args.label: {k: v for k, v in entry.items() if k != "rounds"}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
