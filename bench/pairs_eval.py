"""Benchmark: the pair predictor, leave one data set out; records figures.

    .venv/bin/python bench/pairs_eval.py [--seeds 0 1 2 3 4] [--out bench/pairs_eval.json]

Data sets (each held out in turn, the prior fitted on the others): Gavel's measured pairs on
K80, P100 and V100 (separate GPUs) and Ray et al.'s 34 pairs on a P100 (alnair). For the
held-out set it records, over its sides (job, co-runner): Spearman's rank correlation of
predicted vs measured speed; over its unordered pairs: how many got a prediction (missing), the
share recommended and the share of recommended pairs with a side measured below 0.7x.
"cold": no co-run of the held-out set is known. "history": for each job, 3 of its co-runs
(drawn per seed) are given as measured history; figures are over the remaining pairs, with the
cold model on the same pairs beside them; mean, min and max over the seeds.
Baseline: "add the two jobs' GPU utilisations" (a side's score is -(u_a + u_b); a pair is
recommended when the sum is at most 100%).
Ryu & Chun (TITAN RTX, MPS): their two statements checked against the prior fitted on all sets.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_gpushare.predict.pairs import (DEFAULT_THRESHOLD, HISTORY_PER_JOB,  # noqa: E402
                                          PairSpeedModel, data_sets, default_model, demand_of,
                                          history_split, training_sides)
from slurm_gpushare.sim.run import default_data_dir  # noqa: E402

def figures(rows: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD) -> dict:
    """rows: one per pair with pred_a, pred_b, speed_a, speed_b, recommended, self_pair."""
    sides_pred = np.concatenate([rows["pred_a"], rows.loc[~rows["self_pair"], "pred_b"]])
    sides_true = np.concatenate([rows["speed_a"], rows.loc[~rows["self_pair"], "speed_b"]])
    worst = np.minimum(rows["speed_a"], rows["speed_b"])
    rec = rows["recommended"].astype(bool)
    missing = int(rows[["pred_a", "pred_b"]].isna().any(axis=1).sum())
    return {
        "pairs": int(len(rows)), "missing": missing,
        "spearman": round(float(spearmanr(sides_pred, sides_true).statistic), 4),
        "mae": round(float(np.abs(sides_pred - sides_true).mean()), 4),
        "recommended_share": round(float(rec.mean()), 4),
        "recommended_bad_share": round(float((worst[rec] < threshold).mean()), 4) if rec.any()
        else None,
        "all_pairs_bad_share": round(float((worst < threshold).mean()), 4),
    }


def predict_rows(model: PairSpeedModel, pairs, profiles) -> pd.DataFrame:
    out = []
    for a, b, speed_a, speed_b in pairs:
        group, keys = [profiles[a], profiles[b]], [a, b]
        pred_a, pred_b = model.predict_group(group, keys)
        out.append({"a": a, "b": b, "pred_a": pred_a, "pred_b": pred_b, "speed_a": speed_a,
                    "speed_b": speed_b, "self_pair": a == b,
                    "recommended": model.recommend(group, keys)})
    return pd.DataFrame(out)


def baseline_rows(pairs, profiles) -> pd.DataFrame:
    out = []
    for a, b, speed_a, speed_b in pairs:
        total = demand_of(profiles[a]).sm + demand_of(profiles[b]).sm
        out.append({"pred_a": -total, "pred_b": -total, "speed_a": speed_a, "speed_b": speed_b,
                    "self_pair": a == b, "recommended": total <= 1.0})
    frame = pd.DataFrame(out)
    return frame


def spread(values: list[float | None]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"mean": None, "min": None, "max": None}
    return {"mean": round(float(np.mean(values)), 4), "min": round(float(min(values)), 4),
            "max": round(float(max(values)), 4)}


def leave_one_data_set_out(seeds: list[int]) -> dict:
    sides = training_sides()
    out = {}
    for name, pairs, profiles in data_sets():
        model = PairSpeedModel().fit(sides[sides["group"] != name])
        entry = {
            "fitted_on": sorted(set(sides["group"]) - {name}),
            "parameters": dict(zip(("alpha", "alpha_own", "beta", "gamma"),
                                   np.round(model.coef_, 4).tolist())),
            "margin": model.margin_, "margin_learned": model.margin_learned_,
            "cold": figures(predict_rows(model, pairs, profiles)),
            "baseline_sum_of_utilisations": figures(baseline_rows(pairs, profiles)),
        }
        per_seed = []
        for seed in seeds:
            history, test = history_split(pairs, seed)
            cold = figures(predict_rows(model, test, profiles))
            learned = PairSpeedModel(**model.get_params())
            for attr in ("coef_", "margin_", "margin_learned_", "n_train_"):
                setattr(learned, attr, getattr(model, attr))
            learned.learn(history, profiles)
            warm = figures(predict_rows(learned, test, profiles))
            per_seed.append({"seed": seed, "history_pairs": len(history),
                             "test_pairs": len(test), "cold": cold, "history": warm})
        entry["with_history"] = {
            "co_runs_per_job": HISTORY_PER_JOB,
            "per_seed": per_seed,
            **{f"{kind}_{metric}": spread([s[kind][metric] for s in per_seed])
               for kind in ("cold", "history")
               for metric in ("spearman", "recommended_share", "recommended_bad_share")},
        }
        out[name] = entry
    return out


def ryu_chun() -> dict:
    """Their two statements, against the prior fitted on every packaged set. Profiles: SM % as
    the SM demand, the larger of DRAM read/write bandwidth % as memory-controller demand."""
    path = default_data_dir() / "ryu_chun" / "table1_profiles.csv"
    if not path.exists():
        return {"skipped": f"{path} not found"}
    table = pd.read_csv(path).set_index("model")
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", default=str(ROOT / "bench" / "pairs_eval.json"))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    model = default_model()
    result = {
        "command": "python bench/pairs_eval.py --seeds " + " ".join(map(str, args.seeds)),
        "threshold": DEFAULT_THRESHOLD,
        "prior_all_data": {"parameters": dict(zip(("alpha", "alpha_own", "beta", "gamma"),
                                                  np.round(model.coef_, 4).tolist())),
                           "margin": model.margin_, "margin_learned": model.margin_learned_,
                           "sides": model.n_train_},
        "leave_one_data_set_out": leave_one_data_set_out(args.seeds),
        "ryu_chun": ryu_chun(),
    }
    result["seconds"] = round(time.perf_counter() - started, 1)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for name, entry in result["leave_one_data_set_out"].items():
        cold, base, hist = entry["cold"], entry["baseline_sum_of_utilisations"], entry["with_history"]
        print(f"{name:12} cold rho {cold['spearman']:.3f} rec {cold['recommended_share']:.2f} "
              f"bad {cold['recommended_bad_share']} | baseline rho {base['spearman']:.3f} rec "
              f"{base['recommended_share']:.2f} bad {base['recommended_bad_share']} | history rho "
              f"{hist['history_spearman']['mean']} (cold same pairs "
              f"{hist['cold_spearman']['mean']}) rec {hist['history_recommended_share']['mean']} "
              f"bad {hist['history_recommended_bad_share']['mean']}")
    print(json.dumps(result["ryu_chun"]))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
