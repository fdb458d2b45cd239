"""Benchmark: the pair predictor, leave one data set out; records figures.

    .venv/bin/python bench/pairs_eval.py [--seeds 0 1 2 3 4] [--out bench/pairs_eval.json]

Data sets (each held out in turn, the prior fitted on the others): Gavel's measured pairs on
K80, P100 and V100 (separate GPUs), Ray et al.'s 34 pairs on a P100 (alnair) and the project's
own measurements on an H100 and an H200 (``data/measured/h100``, ``h200``,
``bench/gpu_measure.py``), which choose the shape and calibrate the margins where they are in the
training data (``pairs.calibration_sets``). For the held-out set
it records, over its sides (job, co-runner): Spearman's rank correlation of
predicted vs measured speed; over its unordered pairs: how many got a prediction (missing), the
share recommended and the share of recommended pairs with a side measured below 0.7x.
"cold": no co-run of the held-out set is known. "history": for each job, 3 of its co-runs
(drawn per seed) are given as measured history; figures are over the remaining pairs, with the
cold model on the same pairs beside them; mean, min and max over the seeds.
Baseline: "add the two jobs' GPU utilisations" (a side's score is -(u_a + u_b); a pair is
recommended when the sum is at most 100%).
"information_ceiling" (per set): how well any predictor reading only the profiles could rank
pairs of jobs it never saw on that GPU: a gradient-boosted regressor fitted on the set's own
pairs with a third of its jobs held out (per seed), judged on the pairs of held-out jobs, beside
the cold prior on the same pairs. On Lucid the fitted model ranks those pairs at 0.69 (pairs,
sum of speeds; 0.58 to 0.74 over the seeds) and the prior, never fitted on Lucid, at 0.70.
Ryu & Chun (TITAN RTX, MPS): their two statements checked against the prior fitted on all sets.
``--external NAME=PROFILES.csv,CORUNS.csv``: a public set kept for evaluation, never fitted on,
judged like the held-out sets (key ``held_out_public``); the recorded figures include Lucid's 1,388
pairs on an RTX 3090 (files made by ``bench/lucid_pairs.py`` from a checkout of the Lucid
artifact, which is not redistributed here):

    .venv/bin/python bench/lucid_pairs.py LUCID_CHECKOUT /tmp/lucid
    .venv/bin/python bench/pairs_eval.py --external lucid-rtx3090=/tmp/lucid/profiles.csv,/tmp/lucid/coruns.csv
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_gpushare.predict.evaluate import held_out_public, leave_one_data_set_out  # noqa: E402
from slurm_gpushare.predict.pairs import DEFAULT_THRESHOLD, PARAMETERS, default_model  # noqa: E402
from slurm_gpushare.predict.datasets import MissingDataSet, load_ryu_chun  # noqa: E402

def ryu_chun() -> dict:
    """Their two statements, against the prior fitted on every packaged set. Profiles: SM % as
    the SM demand, the larger of DRAM read/write bandwidth % as memory-controller demand."""
    try:
        table = load_ryu_chun()
    except MissingDataSet as exc:
        return {"skipped": str(exc)}
    profiles = {m: {"gpu_util_pct": r.sm_pct,
                    "mem_util_pct": max(r.dram_read_bw_pct, r.dram_write_bw_pct)}
                for m, r in table.iterrows()}
    model = default_model()
    first = model.predict_group([profiles["Data2Vec"], profiles["MobileNetV2"]])
    second = model.predict_group([profiles["DLRM"], profiles["DeepFM"]])
    return {
        "Data2Vec+MobileNetV2": {"predicted": [round(s, 3) for s in first],
                                 "paper": "about no slowdown",
                                 "agrees": bool(min(first) >= 0.8)},
        "DLRM+DeepFM": {"predicted": [round(s, 3) for s in second],
                        "paper": "DLRM more than 3x slower (speed < 0.33)",
                        "agrees": bool(second[0] < 0.33)},
    }


def shape_robustness(seeds=(0, 1, 2), jobs: int = 47) -> dict:
    """Why ``latency`` is 0.5 where no NVML-measured pairs choose it: synthetic pairs (``jobs`` jobs with occupancy drawn uniformly
    from 0.02-0.9, every ordered pair, log-normal noise of 0.3) whose true slowdown follows the
    prior's form with a true latency anywhere in [0, 1]; Spearman of each assumed latency (and of
    adding the utilisations) against that truth, mean over ``seeds``, and each choice's worst
    case over the true values."""
    from scipy.stats import spearmanr

    values = (0.0, 0.25, 0.5, 0.75, 1.0)
    table = {}
    for truth in values:
        scores = {str(v): [] for v in values} | {"sum": []}
        for seed in seeds:
            rng = np.random.default_rng(seed)
            u = rng.uniform(0.02, 0.9, jobs)
            own, other = (x.ravel() for x in np.meshgrid(u, u))
            measured = other * (truth + (1 - truth) * own) * np.exp(rng.normal(0, 0.3, own.size))
            for v in values:
                scores[str(v)].append(spearmanr(other * (v + (1 - v) * own), measured).statistic)
            scores["sum"].append(spearmanr(own + other, measured).statistic)
        table[str(truth)] = {k: round(float(np.mean(v)), 3) for k, v in scores.items()}
    worst = {k: min(row[k] for row in table.values()) for k in table["0.5"]}
    return {"spearman_by_true_latency": table, "worst_case": worst}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", default=str(ROOT / "bench" / "pairs_eval.json"))
    parser.add_argument("--external", action="append", default=[], metavar="NAME=PROFILES,CORUNS",
                        help="a public set kept for evaluation, in kb predict-pairs's files "
                             "(e.g. made by bench/lucid_pairs.py); repeatable")
    args = parser.parse_args(argv)
    external = []
    for spec in args.external:
        name, _, files = spec.partition("=")
        profiles_csv, _, coruns_csv = files.partition(",")
        if not (name and profiles_csv and coruns_csv):
            parser.error(f"--external wants NAME=PROFILES.csv,CORUNS.csv, got {spec!r}")
        external.append((name, profiles_csv, coruns_csv))
    started = time.perf_counter()
    model = default_model()
    result = {
        "command": "python bench/pairs_eval.py --seeds " + " ".join(map(str, args.seeds))
                   + "".join(f" --external {n}=..." for n, *_ in external),
        "threshold": DEFAULT_THRESHOLD,
        "prior_all_data": {"parameters": dict(zip(PARAMETERS,
                                                  np.round([model.latency], 4).tolist())),
                           "shrinkage": model.shrinkage, "margin": model.margin,
                           "margin_learned": model.margin_learned,
                           "sides": model.n_train},
        "leave_one_data_set_out": leave_one_data_set_out(args.seeds),
        "held_out_public": held_out_public(external, args.seeds),
        "ryu_chun": ryu_chun(),
        "shape_robustness": shape_robustness(),
    }
    before = ROOT / "bench" / "pairs_eval_before.json"
    if before.exists():
        result["before"] = json.loads(before.read_text())
    result["seconds"] = round(time.perf_counter() - started, 1)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for name, entry in [*result["leave_one_data_set_out"].items(),
                        *result["held_out_public"].items()]:
        cold, base, hist = entry["cold"], entry["baseline_sum_of_utilisations"], entry["with_history"]
        print(f"{name:12} cold rho {cold['spearman']} rec {cold['recommended_share']} "
              f"bad {cold['recommended_bad_share']} | baseline rho {base['spearman']} rec "
              f"{base['recommended_share']} bad {base['recommended_bad_share']} | history rho "
              f"{hist['history_spearman']['mean']} (cold same pairs "
              f"{hist['cold_spearman']['mean']}) rec {hist['history_recommended_share']['mean']} "
              f"bad {hist['history_recommended_bad_share']['mean']}")
    print(json.dumps(result["ryu_chun"]))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
