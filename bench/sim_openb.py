"""Benchmark: GPU allocation on Alibaba openb as load rises (FGD's experiment); records figures.

    .venv/bin/python bench/sim_openb.py [--seeds 0 1 ... 9] [--out bench/sim_openb.json]

FGD (ATC'23) inflates the workload: pods drawn from the trace arrive one after another and
stay; a pod that cannot be placed on arrival fails (one that overflows dies before the next
arrives). The measure is the share of the cluster's GPUs requested by placed pods when the pods
that arrived so far request ``load`` x the GPUs (FGD: 95.39% at 130% for FGD, 93.08% BestFit,
87.47% Random; mean of 10 seeds, as here by default). Here each policy places pods as it
would place jobs (shares in GiB: gpu_milli x 16 GiB), on the openb
node mix (``slurm_gpushare/data/clusters/openb.toml``). A pod with gpu_milli below 1000 asks
for its fraction of a GPU itself: submitted to Slurm it is a share already (a percent of
whichever GPU, as ``--gres=mps:N``), which gpushare keeps as submitted ("already-shared"), so
its keep-whole-when-idle rule applies to whole-GPU pods only. gpushare runs twice: at its
defaults and as ``gpushare-share-always`` (``keep_whole_when_idle = false``); on openb the two
place every pod alike. Every policy runs at each shard size of ``--shard-mib`` (the site's
``[shares] shard_mib``; shares round up to whole shards): 1 GiB, the product's default, and
256 MiB (labelled ``@256MiB``), which openb's exactly known memory (no estimate error) allows.
Figures per seed, and mean/min/max over the seeds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_gpushare.sim import metrics, traces  # noqa: E402
from slurm_gpushare.sim.cluster import load_cluster  # noqa: E402
from slurm_gpushare.sim.engine import EngineOptions  # noqa: E402
from slurm_gpushare.sim.policies import POLICY_NAMES  # noqa: E402
from slurm_gpushare.sim.run import default_data_dir, run_policies  # noqa: E402
from slurm_gpushare.sim.workload import WorkloadOptions, openb_inflate  # noqa: E402

LOADS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3)


def allocation_by_load(result, work, n_gpus: int) -> dict[str, float]:
    """Allocated share of GPUs when the arrived pods request each load level."""
    arrived = np.cumsum(work.gpu_request) / n_gpus  # after pod i arrives (time i)
    times = result.timeline["time"].astype(int)
    allocated = result.timeline["allocated"] / n_gpus
    out = {}
    for load in LOADS:
        i = int(np.searchsorted(arrived, load))
        k = int(np.searchsorted(times, min(i, times[-1]), side="right")) - 1
        out[f"{load:.1f}"] = round(float(allocated[max(k, 0)]), 4)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--policies", nargs="+", default=list(POLICY_NAMES))
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--no-share-always", dest="share_always", action="store_false",
                        help="skip the gpushare run with keep_whole_when_idle = false")
    parser.add_argument("--shard-mib", type=int, nargs="+", default=[1024, 256],
                        help="shard sizes to run every policy at (MiB)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "sim_openb.json"))
    args = parser.parse_args(argv)
    data_dir = args.data_dir or default_data_dir()
    cluster = load_cluster("openb")
    trace = traces.load_openb(data_dir)
    # (label suffix, gpushare settings, policies): the defaults for every policy, then the
    # gpushare policies again sharing on idle GPUs too.
    runs = [("", None, args.policies)]
    again = [p for p in args.policies if p.startswith("gpushare")]
    if args.share_always and again:
        runs.append(("-share-always", {"keep_whole_when_idle": False}, again))
    per_seed = []
    for seed in args.seeds:
        work = openb_inflate(trace, cluster, data_dir, WorkloadOptions(seed=seed), max(LOADS))
        results = []
        for shard_mib in args.shard_mib:
            size = "" if shard_mib == 1024 else f"@{shard_mib}MiB"
            options = EngineOptions(drop_unplaced=True, oom_delay=0.5, share_unit_mib=shard_mib)
            for suffix, settings, policies in runs:
                outcome = run_policies(cluster, work, policies, data_dir=data_dir, seed=seed,
                                       options=options, task_mix=metrics.task_mix(work),
                                       gpushare_settings=settings)
                results += [(result.policy + suffix + size, result, row) for result, row in
                            zip(outcome.results, outcome.summary.to_dict(orient="records"))]
        for label, result, row in results:
            per_seed.append({"seed": seed, "policy": label,
                             "allocation": allocation_by_load(result, work, cluster.n_gpus),
                             "fragmentation_at_1.3": round(row["fragmentation"], 4),
                             "placed": int(row["cutoff"]), "dropped": int(row["dropped"]),
                             "wall_s": round(result.wall_s, 2)})
            print(f"seed {seed} {label:36s} {per_seed[-1]['allocation']} "
                  f"frag {per_seed[-1]['fragmentation_at_1.3']} ({result.wall_s:.1f}s)", flush=True)
    mean, spread = {}, {}
    for policy in dict.fromkeys(r["policy"] for r in per_seed):
        rows = [r for r in per_seed if r["policy"] == policy]
        mean[policy] = {
            "allocation": {k: round(float(np.mean([r["allocation"][k] for r in rows])), 4)
                           for k in rows[0]["allocation"]},
            "fragmentation_at_1.3": round(float(np.mean([r["fragmentation_at_1.3"] for r in rows])), 4),
        }
        at = [r["allocation"]["1.3"] for r in rows]
        spread[policy] = {"mean": round(float(np.mean(at)), 4), "min": min(at), "max": max(at),
                          "placed_mean": round(float(np.mean([r["placed"] for r in rows])), 1),
                          "dropped_mean": round(float(np.mean([r["dropped"] for r in rows])), 1)}
        print(f"{policy:36s} allocation at 1.3: mean {spread[policy]['mean']:.4f} "
              f"min {spread[policy]['min']:.4f} max {spread[policy]['max']:.4f}")
    doc = {"what": "openb workload inflation (FGD), share of GPUs allocated by arrived load",
           "command": "python bench/sim_openb.py " + " ".join(argv or sys.argv[1:]),
           "cluster": cluster.summary(), "seeds": args.seeds, "shard_mib": args.shard_mib,
           "gpushare_settings": {"gpushare": "defaults",
                                 "gpushare-share-always": {"keep_whole_when_idle": False}},
           "fgd_reference_at_1.3": {"FGD": 0.9539, "BestFit": 0.9308, "Random": 0.8747},
           "allocation_at_1.3": spread, "mean": mean, "per_seed": per_seed}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
