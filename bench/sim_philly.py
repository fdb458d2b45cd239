"""Benchmark: the Philly trace (82,248 jobs) under every policy, one run; records its figures.

    .venv/bin/python bench/sim_philly.py [--seed N] [--limit N] [--out bench/sim_philly.json]

Cluster: ``slurm_gpushare/data/clusters/philly.toml`` (heterogeneous V100/P100/K80); co-run
speeds: Gavel's measured pairs. Writes each policy's figures, the figures relative to
slurm-default, and the wall time per policy (the goal: <= 30 s each on a 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_gpushare.sim.cluster import load_cluster  # noqa: E402
from slurm_gpushare.sim.report import _records, print_tables  # noqa: E402
from slurm_gpushare.sim.run import default_data_dir, load_workload, run_policies  # noqa: E402
from slurm_gpushare.sim.policies import POLICY_NAMES  # noqa: E402
from slurm_gpushare.sim.workload import WorkloadOptions  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--load", type=float, default=1.0)
    parser.add_argument("--cluster", default="philly")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--gpu-time-budget", type=float, default=100.0,
                        help="the gpushare policy's gpu_time_budget_pct (0: memory only)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "sim_philly.json"))
    args = parser.parse_args(argv)
    data_dir = args.data_dir or default_data_dir()
    cluster = load_cluster(args.cluster)
    started = time.perf_counter()
    work = load_workload("philly", cluster, data_dir,
                         WorkloadOptions(seed=args.seed, limit=args.limit, load=args.load))
    load_s = time.perf_counter() - started
    outcome = run_policies(cluster, work, list(POLICY_NAMES), data_dir=data_dir, seed=args.seed,
                           gpu_time_budget_pct=args.gpu_time_budget)
    print_tables(outcome.summary, outcome.relative,
                 title=f"Philly on {cluster.summary()} ({len(work)} jobs, seed {args.seed})")
    doc = {
        "what": "Philly trace, every policy, Gavel measured co-run speeds",
        "gpu_time_budget_pct": args.gpu_time_budget,
        "command": "python bench/sim_philly.py " + " ".join(argv or sys.argv[1:]),
        "cluster": cluster.summary(), "jobs": len(work), "seed": args.seed, "load": args.load,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "trace_load_s": round(load_s, 2),
        "wall_s_per_policy": {r.policy: round(r.wall_s, 2) for r in outcome.results},
        "summary": _records(outcome.summary),
        "relative_to_slurm_default": _records(outcome.relative),
        "decision_codes": {r.policy: r.codes for r in outcome.results},
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
