"""Benchmark: do gpushare's node exclusions keep shares away from partners they should not join?
Philly in the simulator, per seed; records JSON.

    .venv/bin/python bench/sim_exclusions.py [--seeds 0-2] [--policy gpushare]
                                             [--out bench/results/sim_exclusions.json]

For every share that starts: whether it was decided with node exclusions, whether the review of
waiting shares lifted some of them (``core/waiting.py``), and whether it starts on a GPU next to
a job of a class the class knowledge says it should not join (what the exclusions are for).
Also each group's mean JCT and the run's figures, with the review switched off as well (the
same seed and jobs), so the review's effect on each seed is in the record.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from slurm_gpushare.core.hostlist import expand_ranges  # noqa: E402
from slurm_gpushare.sim import metrics  # noqa: E402
from slurm_gpushare.sim.cluster import load_cluster  # noqa: E402
from slurm_gpushare.sim.engine import Engine  # noqa: E402
from slurm_gpushare.sim.interference import make_model  # noqa: E402
from slurm_gpushare.sim.policies import make_policy  # noqa: E402
from slurm_gpushare.sim.run import default_data_dir, knowledge_table, load_workload  # noqa: E402
from slurm_gpushare.sim.workload import WorkloadOptions  # noqa: E402

GROUPS = ("no exclusions", "exclusions kept", "exclusions lifted")


class Watched(Engine):
    """Notes, for each share that starts, its group and whether it joins a bad partner."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.revised: set[int] = set()
        self.starts = {g: [0, 0] for g in GROUPS}  # group -> [shares, next to a bad class]
        self.group_of: dict[int, str] = {}

    def revise(self, j, req):
        self.revised.add(j)
        super().revise(j, req)

    def start(self, j, gpus):
        super().start(j, gpus)
        req = self.j_req[j]
        if req.whole:
            return
        gpu = gpus[0]
        gpu_type = self.cluster.type_names[self.g_type[gpu]]
        bad = any(not self.policy.compat.compatible(self.jclass[j], self.jclass[i], gpu_type)
                  for i in self.g_jobs[gpu] if i != j)
        group = (GROUPS[2] if j in self.revised else GROUPS[1] if req.exclude else GROUPS[0])
        self.group_of[j] = group
        self.starts[group][0] += 1
        self.starts[group][1] += bad


def run(cluster, work, data_dir, seed: int, policy: str, review: bool):
    chosen = make_policy(policy, knowledge_table(data_dir), seed)
    if not review:
        chosen.review = None  # the engine then reviews nothing (as before the review existed)
    engine = Watched(cluster, work, chosen, make_model("gavel", str(data_dir)))
    started = time.process_time()
    result = engine.run()
    summary = metrics.summarise(result, cap_jobs=cluster.max_jobs_per_gpu)
    jct = np.asarray(result.jobs["end"] - result.jobs["submit"], float)
    groups = {}
    for group, (shares, bad) in engine.starts.items():
        members = [j for j, g in engine.group_of.items() if g == group]
        groups[group] = {"shares": shares, "next_to_bad_class": round(bad / shares, 3)
                         if shares else None,
                         "jct_mean_s": round(float(np.nanmean(jct[members])), 1)
                         if members else None}
    return {"cpu_s": round(time.process_time() - started, 2),
            "jct_mean_s": round(float(summary["jct_mean_s"]), 1),
            "jct_p95_s": round(float(summary["jct_p95_s"]), 1),
            "shared_jobs": round(float(summary["shared_jobs"]), 4),
            "lifted": result.counters.get("waiting_lifted", 0), "starts": groups}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-2")
    parser.add_argument("--policy", default="gpushare", choices=("gpushare", "gpushare-sjf"))
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "sim_exclusions.json"))
    args = parser.parse_args(argv)
    data_dir = Path(args.data_dir or default_data_dir())
    cluster = load_cluster("philly")
    seeds = []
    for seed in expand_ranges(args.seeds):
        work = load_workload("philly", cluster, data_dir, WorkloadOptions(seed=seed))
        record = {"seed": seed,
                  "review_on": run(cluster, work, data_dir, seed, args.policy, True),
                  "review_off": run(cluster, work, data_dir, seed, args.policy, False)}
        on, off = record["review_on"], record["review_off"]
        record["review_effect_jct_mean"] = round(on["jct_mean_s"] / off["jct_mean_s"] - 1, 4)
        record["review_effect_jct_p95"] = round(on["jct_p95_s"] / off["jct_p95_s"] - 1, 4)
        print(json.dumps(record), flush=True)
        seeds.append(record)
    doc = {"benchmark": "sim_exclusions", "policy": args.policy,
           "command": "python bench/sim_exclusions.py " + " ".join(argv or sys.argv[1:]),
           "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seeds": seeds}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
