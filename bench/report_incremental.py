#!/usr/bin/env python3
"""Nightly reports from a state directory: what a run costs once the cache holds a month.

A site runs ``report --state-dir DIR`` nightly (docs/reports.md). The first run reads the
month from sacct into the cache; each later run asks sacct only for what ended since, and
reads from the cache the jobs of its own window. This measures a later run whose sacct
answer is empty (nothing ended since), so the figure is the cost of the cache alone, for
windows of 1 and 7 days, over a cache of ``--size`` job rows (``report_scale.py``'s
synthetic month). Each round is a fresh subprocess (wall time and peak RSS); ``--code DIR``
runs another checkout of the package (the code before a change).

    .venv/bin/python bench/report_incremental.py [--size 1000000] [--rounds 3]
        [--label after] [--code DIR] [--out bench/results/report_incremental.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_scale import FIELDS, WINDOW_END, WINDOW_S, generate  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

RUN = """
import json, resource, sys, time
from slurm_gpushare.slurm.accounting import ingest
state_dir, sacct_path, since, until = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
text = open(sacct_path).read()
t = time.perf_counter()
got = ingest(since, until, state_dir=state_dir, runner=lambda *a, **k: text, node_types={})
wall = time.perf_counter() - t
print(json.dumps({"wall_s": round(wall, 3), "jobs": len(got.jobs), "new": got.new,
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
"""


def _run(code: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code.resolve())}
    out = subprocess.run([sys.executable, "-c", RUN, *args], env=env, capture_output=True,
                         text=True, check=True, cwd=tempfile.gettempdir())
    return json.loads(out.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--label", default="after")
    parser.add_argument("--code", type=Path, default=REPO)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "report_scale")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/report_incremental.json")
    args = parser.parse_args()

    args.cache.mkdir(parents=True, exist_ok=True)
    month = args.cache / f"sacct_{args.size}.psv"
    if not month.exists():
        generate(month, args.size)
    nothing_new = args.cache / "sacct_empty.psv"
    nothing_new.write_text(FIELDS + "\n")
    state_dir = Path(tempfile.mkdtemp(prefix="report_incremental_"))
    try:
        first = _run(args.code, str(state_dir), str(month), str(WINDOW_END - WINDOW_S - 86400),
                     str(WINDOW_END))
        print(f"{args.label}: first run read {first['new']} jobs in {first['wall_s']} s")
        windows = {}
        for days in (1, 7):
            samples = []
            for r in range(args.rounds):
                load = os.getloadavg()[0]
                sample = _run(args.code, str(state_dir), str(nothing_new),
                              str(WINDOW_END - days * 86400), str(WINDOW_END))
                sample["load_before"] = round(load, 2)
                samples.append(sample)
                print(f"{args.label}: {days}-day window, round {r + 1}: {sample['wall_s']} s, "
                      f"{sample['peak_rss_mib']} MiB, {sample['jobs']} jobs (load {load:.1f})",
                      flush=True)
            walls = [s["wall_s"] for s in samples]
            windows[f"{days}d"] = {"rounds": samples, "wall_s_median": statistics.median(walls),
                                   "wall_s_min": min(walls), "wall_s_max": max(walls)}
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    git = subprocess.run(["git", "-C", str(args.code), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip() or None
    results.setdefault("runs", {})[args.label] = {
        "git": git, "size": args.size, "first_run": first, "later_run_nothing_new": windows}
    results["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count()}
    results["command"] = "bench/report_incremental.py " + " ".join(sys.argv[1:])
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
