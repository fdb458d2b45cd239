#!/usr/bin/env python3
"""How much GPU memory shares over-allocate at each shard size (``[shares] shard_mib``).

A share is ``ceil(safe estimate / shard_mib)`` shards: it gives a job its predicted peak plus
the predictor's margin, rounded up to whole shards. Measured on the SchedTune memory data (240
runs, 12 CNNs x 4 batch sizes x 5 GPUs), in the two cases the daemon meets:

- ``cross-type``: the job's peak on a type predicted from its runs on other types
  (leave-one-model-out, as ``slurm-gpushare models evaluate``: margins are wide);
- ``same-type``: the job ran on this type before (safe = peak x (1 + same_type_margin)).

Over-allocation = shards x shard_mib / real peak - 1; ``rounding_median`` is the part due to
whole shards alone. ``oom_misses``: shares smaller than the real peak (must stay 0).

    .venv/bin/python bench/shard_granularity.py [--out bench/results/shard_granularity.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from slurm_gpushare.predict.datasets import load_schedtune  # noqa: E402
from slurm_gpushare.predict.evaluate import (SHARD_SIZES_MIB, privacy_table,  # noqa: E402
                                             shard_over_allocation)
from slurm_gpushare.predict.estimators import CrossTypeMemoryPredictor  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "shard_granularity.json"))
    args = parser.parse_args(argv)
    frame = load_schedtune()
    _, oom = privacy_table(frame)
    fits = frame[frame.fits]
    margin = CrossTypeMemoryPredictor().same_type_margin
    same = {str(mib): shard_over_allocation(fits.peak_mib, fits.peak_mib * (1 + margin), mib)
            for mib in SHARD_SIZES_MIB}
    result = {"benchmark": "shard_granularity", "data": "schedtune model_stats.csv",
              "cross_type": {"n": oom["all"]["n"], "by_shard_mib": oom["all"]["shard_over_allocation_by_mib"]},
              "same_type": {"n": int(len(fits)), "margin": margin, "by_shard_mib": same}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for case in ("cross_type", "same_type"):
        for mib, m in result[case]["by_shard_mib"].items():
            print(f"{case:10} {mib:>5} MiB: median {m['median']:.1%} p95 {m['p95']:.1%} "
                  f"rounding {m['rounding_median']:.1%} misses {m['oom_misses']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
