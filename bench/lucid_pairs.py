"""Convert the Lucid artifact's co-location measurements into ``kb predict-pairs``'s files.

    .venv/bin/python bench/lucid_pairs.py LUCID_CHECKOUT OUT_DIR

Lucid (Hu et al., ASPLOS '23; github.com/S-Lab-System-Group/Lucid) measured 1,388 pairs of
training jobs sharing one RTX 3090 (24 GiB, time slicing): ``simulation/data/colocate_info.csv``
(each side's normalised speed) and ``simulation/analyzer/single_data.csv`` (each job alone: mean
GPU utilisation, mean memory-controller utilisation, GPU memory). A job is model, data set,
batch size and mixed precision. The set is kept for evaluation only (``bench/pairs_eval.py
--external``): the pair predictor is never fitted on it, and its licence (S-Lab License 1.0,
non-commercial) keeps it out of this repository, so the files are made from a checkout.
Writes ``OUT_DIR/profiles.csv`` and ``OUT_DIR/coruns.csv``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

RTX3090_MIB = 24576
COLOCATED = "simulation/data/colocate_info.csv"
ALONE = "simulation/analyzer/single_data.csv"


def job_name(model, data, batch, amp) -> str:
    return f"{model}-{data}-b{int(batch)}{'-amp' if int(amp) else ''}"


def convert(checkout: Path, out: Path) -> tuple[int, int]:
    alone = pd.read_csv(checkout / ALONE)
    pairs = pd.read_csv(checkout / COLOCATED, index_col=0)
    profiles = pd.DataFrame({
        "job": [job_name(*r) for r in alone[["model", "dataset", "batchsize", "amp"]].values],
        "gpu_util_pct": alone["gpu_util"], "mem_util_pct": alone["gmem_util"],
        "mem_used_mib": alone["gmem"], "mem_total_mib": RTX3090_MIB, "gpu_type": "rtx3090"})
    coruns = pd.DataFrame({
        "job_a": [job_name(*r) for r in
                  pairs[["model1", "dataset1", "batchsize1", "amp1"]].values],
        "job_b": [job_name(*r) for r in
                  pairs[["model2", "dataset2", "batchsize2", "amp2"]].values],
        "speed_a": pairs["speed1"], "speed_b": pairs["speed2"]})
    unknown = (set(coruns["job_a"]) | set(coruns["job_b"])) - set(profiles["job"])
    if unknown:
        raise ValueError(f"co-runs name jobs with no profile: {sorted(unknown)[:3]}")
    out.mkdir(parents=True, exist_ok=True)
    profiles.to_csv(out / "profiles.csv", index=False)
    coruns.to_csv(out / "coruns.csv", index=False)
    return len(profiles), len(coruns)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    try:
        jobs, pairs = convert(args.checkout, args.out)
    except (OSError, KeyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {jobs} profiles and {pairs} co-runs to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
