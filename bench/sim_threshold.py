#!/usr/bin/env python3
"""Benchmark: what the pair rule's 0.7x promise costs in JCT, on the Philly trace.

The daemon lets a job share only where its pair predictor, corrected by the site's co-runs,
keeps every co-runner at 0.7x its speed alone or more (``pairs.DEFAULT_THRESHOLD``, with the
calibrated margin). No setting changes that floor; this what-if lowers it in the simulator
only, for gpushare with the SJF lever off and on, against slurm-default and SJF-BSBF of the
same seeds (one run each), to show what a site that accepted slower shares would gain:

    .venv/bin/python bench/sim_threshold.py [--seeds 0-4] [--floors 0.7,0.6,0.5] [--jobs 2]
        [--data-dir ../shared/data] [--out bench/results/sim_threshold.json]

Records per floor and seed mean and p95 JCT, the mean slowdown of shared runs (ISD: 0.43 is a
job at 0.7x), the share of jobs shared and the CPU time; averages over seeds and the change
of gpushare's mean JCT against slurm-default (the issue's lever-off goal: -40%).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_gpushare.core.hostlist import expand_ranges  # noqa: E402
from slurm_gpushare.sim.cluster import load_cluster  # noqa: E402
from slurm_gpushare.sim.engine import Engine  # noqa: E402
from slurm_gpushare.sim.interference import make_model  # noqa: E402
from slurm_gpushare.sim.metrics import summarise  # noqa: E402
from slurm_gpushare.sim.policies import GpuShare, make_policy  # noqa: E402
from slurm_gpushare.sim.run import default_data_dir, knowledge_table, load_workload  # noqa: E402
from slurm_gpushare.sim.workload import WorkloadOptions  # noqa: E402

METRICS = ("jct_mean_s", "jct_p95_s", "isd_mean", "shared_jobs")


class Floor(GpuShare):
    """gpushare with the pair rule's speed floor at ``floor`` instead of 0.7x."""

    def __init__(self, knowledge, floor: float, **settings):
        super().__init__(knowledge, **settings)
        self.floor = floor

    def prepare(self, engine):
        super().prepare(engine)
        self.pairs.model.threshold = self.floor  # re-learnt copies keep it (fitted_copy)


def run(task) -> dict:
    seed, name, floor, data_dir = task
    cluster = load_cluster("philly")
    work = load_workload("philly", cluster, data_dir, WorkloadOptions(seed=seed))
    knowledge = knowledge_table(data_dir)
    if floor is None:
        policy = make_policy(name, knowledge, seed)
    else:
        policy = Floor(knowledge, floor, priority="sjf" if name == "gpushare-sjf" else "none")
    started = time.process_time()
    result = Engine(cluster, work, policy, make_model("gavel", data_dir)).run()
    summary = summarise(result, cap_jobs=cluster.max_jobs_per_gpu)
    return {"seed": seed, "policy": name, "floor": floor,
            **{k: summary[k] for k in (*METRICS, "oom_kills")},
            "cpu_s": round(time.process_time() - started, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-4")
    parser.add_argument("--floors", default="0.7,0.6,0.5")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "sim_threshold.json"))
    args = parser.parse_args(argv)
    data_dir = args.data_dir or default_data_dir()
    seeds = expand_ranges(args.seeds)
    floors = [float(f) for f in args.floors.split(",") if f.strip()]
    tasks = [(s, name, None, data_dir) for s in seeds for name in ("slurm-default", "sjf-bsbf")]
    tasks += [(s, name, f, data_dir) for s in seeds for f in floors
              for name in ("gpushare", "gpushare-sjf")]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(run, tasks))
    by = {(r["policy"], r["floor"], r["seed"]): r for r in rows}
    summary = {}
    for name, floor in [("slurm-default", None), ("sjf-bsbf", None)] + [
            (n, f) for f in floors for n in ("gpushare", "gpushare-sjf")]:
        label = name if floor is None else f"{name}@{floor:g}"
        out = {m: {"mean": float(np.mean([by[(name, floor, s)][m] for s in seeds])),
                   "per_seed": [by[(name, floor, s)][m] for s in seeds]} for m in METRICS}
        out["cpu_s_max"] = max(by[(name, floor, s)]["cpu_s"] for s in seeds)
        out["oom_kills"] = sum(by[(name, floor, s)]["oom_kills"] for s in seeds)
        if floor is not None:
            reference = "slurm-default" if name == "gpushare" else "sjf-bsbf"
            for m in ("jct_mean_s", "jct_p95_s"):
                changes = [by[(name, floor, s)][m] / by[(reference, None, s)][m] - 1
                           for s in seeds]
                out[f"{m}_vs_{reference}"] = {"mean": float(np.mean(changes)),
                                              "per_seed": changes,
                                              "seeds_lower": sum(c < 0 for c in changes)}
        summary[label] = out
        print(f"{label:20s} mean {out['jct_mean_s']['mean']:8.0f}  p95 "
              f"{out['jct_p95_s']['mean']:8.0f}  ISD {out['isd_mean']['mean']:.3f}  shared "
              f"{out['shared_jobs']['mean']:.3f}", flush=True)
    record = {"what": __doc__.splitlines()[0], "command": "python bench/sim_threshold.py "
              + " ".join(argv if argv is not None else sys.argv[1:]),
              "seeds": seeds, "floors": floors, "load_average": os.getloadavg(),
              "summary": summary, "runs": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1, default=float) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
