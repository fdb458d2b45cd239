"""Evaluation of the predictors: every held-out figure, on data the model was not fitted to.

``slurm-gpushare memory evaluate`` prints:
  1. the SchedTune replication (model statistics + GPU characteristics, the regressors the
     paper compared) with a random 80/20 split like the paper's and leave-one-model-out;
  2. the privacy-preserving table (only peaks observed on other GPU types), leave-one-model-out;
  3. OOM safety of the margin, run-time transfer error (leave one job type out).
``slurm-gpushare classes reproduce``: Ray et al.'s clustering re-done on their 175 records.
``slurm-gpushare kb evaluate``: the pair predictor leaving one data set out (cold and with co-runs
as history) and the class lookup on the alnair pairs (leave one pair out).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from sklearn.compose import TransformedTargetRegressor
from sklearn.ensemble import GradientBoostingRegressor, RandomForestRegressor
from scipy.stats import spearmanr
from sklearn.linear_model import LinearRegression
from sklearn.metrics import adjusted_rand_score
from sklearn.model_selection import train_test_split
from sklearn.neighbors import KNeighborsRegressor
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler
from sklearn.svm import SVR

from slurm_gpushare.core.gpus import default_catalogue
from slurm_gpushare.predict.classes import FEATURES
from slurm_gpushare.predict.datasets import (alnair_job_telemetry, load_alnair, load_gavel_isolated,
                                             load_schedtune, package_dir)
from slurm_gpushare.predict.knowledge import ALNAIR_GPU, KnowledgeBase, alnair_pairs, speed_of
from slurm_gpushare.predict.estimators import (CrossTypeMemoryPredictor, InterferenceClasses,
                                               PairSpeedModel, RuntimeTransfer)
from slurm_gpushare.predict.memory import MIB_PER_GIB, observations_from_schedtune
# The knowledge base's compatibility rule and the pair predictor share the threshold (0.7x).
from slurm_gpushare.predict.pairs import (DEFAULT_LATENCY, DEFAULT_THRESHOLD, HISTORY_PER_JOB,
                                          PARAMETERS, data_sets, demand_of, history_split,
                                          pair_table, training_sides)

# SchedTune paper (Albahar et al., CCGrid 2022), random forest, their own split.
PAPER = {"rmse_mib": 110.6, "avg_rel_err": 0.0150, "max_rel_err": 0.0898,
         "time_avg_rel_err": 0.0250, "oom_detection": 1.0}
SCHEDTUNE_FEATURES = ["batch_size", "activations_mb", "parameters_mb", "input_mb", "cuda_cores",
                      "memory_bandwidth_gbs", "memory_clock_mhz", "tensor_cores", "sm_count"]


def metrics(true, pred) -> dict:
    true, pred = np.asarray(true, float), np.asarray(pred, float)
    rel = np.abs(pred - true) / true
    return {"rmse_mib": float(np.sqrt(np.mean((pred - true) ** 2))),
            "rmsle": float(np.sqrt(np.mean((np.log1p(np.maximum(pred, 0)) - np.log1p(true)) ** 2))),
            "avg_rel_err": float(rel.mean()), "p95_rel_err": float(np.percentile(rel, 95)),
            "max_rel_err": float(rel.max()), "n": int(true.size)}


def _regressors(seed: int) -> dict:
    # Kernel, neighbour and neural models see log sizes and predict log peaks: the statistics
    # span three orders of magnitude.
    log_target = dict(func=np.log, inverse_func=np.exp)

    def scaled(model):
        return TransformedTargetRegressor(
            make_pipeline(FunctionTransformer(np.log1p), StandardScaler(), model), **log_target)

    return {
        "linear regression": make_pipeline(StandardScaler(), LinearRegression()),
        "SVR (RBF)": scaled(SVR(C=10.0, epsilon=0.01)),
        "k-nearest neighbours": scaled(KNeighborsRegressor(n_neighbors=3)),
        "MLP": scaled(MLPRegressor(hidden_layer_sizes=(32, 32), learning_rate_init=0.01,
                                   max_iter=400, random_state=seed)),
        "gradient boosting": GradientBoostingRegressor(random_state=seed),
        "random forest": RandomForestRegressor(n_estimators=200, random_state=seed, n_jobs=1),
    }


def schedtune_table(frame: pd.DataFrame, seeds: int = 3) -> dict:
    """SchedTune's predictor (model statistics + GPU) for each regressor, two splits."""
    fit = frame[frame.fits]
    oom = frame[~frame.fits]
    results = {}
    for name in _regressors(0):
        random_true, random_pred, detected = [], [], []
        for seed in range(seeds):
            train, test = train_test_split(fit, test_size=0.2, random_state=seed)
            model = _regressors(seed)[name].fit(train[SCHEDTUNE_FEATURES], train.peak_mib)
            random_true += list(test.peak_mib)
            random_pred += list(model.predict(test[SCHEDTUNE_FEATURES]))
            detected += list(model.predict(oom[SCHEDTUNE_FEATURES]) > oom.usable_mib)
        lomo_true, lomo_pred, lomo_detected = [], [], []
        for group in sorted(fit.model.unique()):
            train, test = fit[fit.model != group], fit[fit.model == group]
            model = _regressors(0)[name].fit(train[SCHEDTUNE_FEATURES], train.peak_mib)
            lomo_true += list(test.peak_mib)
            lomo_pred += list(model.predict(test[SCHEDTUNE_FEATURES]))
            held_oom = oom[oom.model == group]
            if len(held_oom):
                lomo_detected += list(model.predict(held_oom[SCHEDTUNE_FEATURES])
                                      > held_oom.usable_mib)
        results[name] = {
            "random_split": {**metrics(random_true, random_pred),
                             "oom_detection": float(np.mean(detected))},
            "leave_one_model_out": {**metrics(lomo_true, lomo_pred),
                                    "oom_detection": float(np.mean(lomo_detected))},
        }
    return results


# Shard sizes whose over-allocation is measured (``[shares] shard_mib``: docs/admin-guide.md).
SHARD_SIZES_MIB = (128, 256, 512, 1024, 2048)


def shard_over_allocation(true, safe, shard_mib: int) -> dict:
    """What shares of ``shard_mib`` shards give jobs beyond their real peak: median and p95 of
    ``shards x shard_mib / peak - 1``, and the part of it that is rounding to whole shards."""
    true, safe = np.asarray(true, float), np.asarray(safe, float)
    given = np.maximum(1, np.ceil(safe / shard_mib - 1e-9)) * shard_mib
    return {"median": float(np.median(given / true - 1)),
            "p95": float(np.percentile(given / true - 1, 95)),
            "mean": float(np.mean(given / true - 1)),
            "rounding_median": float(np.median(given / safe - 1)),
            "oom_misses": int(np.sum(given < true))}


def _spec_vector(model: str) -> list[float]:
    return default_catalogue().lookup(model).features()


def privacy_table(frame: pd.DataFrame, coverage: float = 1.0) -> tuple[dict, dict]:
    """Leave-one-model-out: peak on B from peaks on other types; and the OOM-safety figures."""
    obs = observations_from_schedtune(frame)
    wide = frame.pivot_table(index=["model", "job"], columns="gpu", values="peak_mib")
    fits = frame.pivot_table(index=["model", "job"], columns="gpu", values="fits")
    types = list(wide.columns)
    capacity = {t: default_catalogue().lookup(t).usable_mib for t in types}
    point: dict[str, tuple[list, list]] = {}
    safety: dict[str, dict[str, list]] = {}
    detection = []

    def add(table, name, true, pred):
        table.setdefault(name, ([], []))
        table[name][0].append(true)
        table[name][1].append(pred)

    for group in sorted(obs.group.unique()):
        train = obs[obs.group != group]
        ours = CrossTypeMemoryPredictor(coverage=coverage).fit(train)
        # Baselines fitted on the same rows.
        tw = train.pivot_table(index="job", columns="gpu", values="peak_mib")
        rows, median_offset = [], {}
        for a, b in itertools.permutations(types, 2):
            both = tw[[a, b]].dropna()
            median_offset[(a, b)] = float(np.median(both[b] - both[a]))
            rows += [[pa, *_spec_vector(a), *_spec_vector(b), pb]
                     for pa, pb in zip(both[a], both[b])]
        rows = np.array(rows)
        naive = RandomForestRegressor(n_estimators=100, random_state=0, n_jobs=1)
        naive.fit(rows[:, :-1], rows[:, -1])

        naive_queries = []
        for (model, job), peaks in wide.loc[[group]].iterrows():
            ok = fits.loc[(model, job)].astype(bool)
            for target in types:
                sources = [s for s in types if s != target and ok[s]]
                for k in range(1, len(sources) + 1):
                    for chosen in itertools.combinations(sources, k):
                        pred = ours.predict_peak({s: peaks[s] for s in chosen}, target)
                        if not ok[target]:
                            # A "does not fit" label: the estimate must exclude the type.
                            detection.append(pred.safe_mib > capacity[target])
                            continue
                        true = peaks[target]
                        label = f"{k} observed type{'s' if k > 1 else ''}"
                        add(point, f"ours, {label}", true, pred.mean_mib)
                        entry = safety.setdefault(label, {"true": [], "safe": [], "margin": []})
                        entry["true"].append(true)
                        entry["safe"].append(pred.safe_mib)
                        entry["margin"].append(pred.margin)
                        if k == 1:
                            src = chosen[0]
                            naive_queries.append((true, [peaks[src], *_spec_vector(src),
                                                         *_spec_vector(target)]))
                            add(point, "per-pair median offset", true,
                                peaks[src] + median_offset[(src, target)])
                            if "K80" not in (src, target):
                                add(point, "ours, 1 observed type, K80 excluded", true,
                                    pred.mean_mib)

        if naive_queries:
            for true, pred in zip([q[0] for q in naive_queries],
                                  naive.predict(np.array([q[1] for q in naive_queries]))):
                add(point, "naive RF (peak_A, specs_A, specs_B)", true, pred)

    order = ["naive RF (peak_A, specs_A, specs_B)", "per-pair median offset",
             "ours, 1 observed type", "ours, 1 observed type, K80 excluded",
             "ours, 2 observed types", "ours, 3 observed types", "ours, 4 observed types"]
    table = {name: metrics(*point[name]) for name in order if name in point}

    oom = {"coverage": coverage, "by_history": {}}
    all_true, all_safe = [], []
    for label, entry in safety.items():
        true, safe = np.array(entry["true"]), np.array(entry["safe"])
        shards = np.maximum(1, np.ceil(safe / MIB_PER_GIB))
        all_true += list(true)
        all_safe += list(safe)
        oom["by_history"][label] = {
            "n": int(true.size),
            "misses_mib": int(np.sum(safe < true)),  # safe estimate below the real peak
            "oom_misses_shards": int(np.sum(shards * MIB_PER_GIB < true)),  # share too small
            "median_margin": float(np.median(entry["margin"])),
            "median_over_allocation": float(np.median(safe / true - 1)),
            "median_shard_over_allocation": float(np.median(shards * MIB_PER_GIB / true - 1)),
        }
    true, safe = np.array(all_true), np.array(all_safe)
    shards = np.maximum(1, np.ceil(safe / MIB_PER_GIB))
    oom["all"] = {"n": int(true.size), "misses_mib": int(np.sum(safe < true)),
                  "oom_misses_shards": int(np.sum(shards * MIB_PER_GIB < true)),
                  "median_over_allocation": float(np.median(safe / true - 1)),
                  "median_shard_over_allocation": float(np.median(shards * MIB_PER_GIB / true - 1)),
                  "shard_over_allocation_by_mib": {
                      str(mib): shard_over_allocation(true, safe, mib) for mib in SHARD_SIZES_MIB}}
    oom["by_history"]["observed on the target type"] = {
        "median_margin": CrossTypeMemoryPredictor().same_type_margin,
        "note": "run-to-run spread of the job's own runs, at least same_type_margin "
                "(the SchedTune data has one run per job, so this is not measured here)"}
    oom["does_not_fit_detected"] = float(np.mean(detection)) if detection else None
    oom["does_not_fit_cases"] = len(detection)
    return table, oom


def evaluate(data: Path | None = None, seeds: int = 3, coverage: float = 1.0) -> dict:
    data = Path(data) if data else package_dir()
    frame = load_schedtune(data / "schedtune")
    privacy, oom = privacy_table(frame, coverage)
    return {
        "data": {"schedtune_rows": int(len(frame)), "does_not_fit_rows": int((~frame.fits).sum()),
                 "gavel_job_types": int(load_gavel_isolated(data / "gavel").job.nunique())},
        "paper_random_forest": PAPER,
        "schedtune_replication": schedtune_table(frame, seeds),
        "privacy_preserving_lomo": privacy,
        "oom_safety": oom,
        "runtime_transfer_lojo": evaluate_transfer(load_gavel_isolated(data / "gavel")),
    }


# -- rendering -----------------------------------------------------------------------------

def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def _render_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                               for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([title, line(header), "  ".join("-" * w for w in widths),
                      *[line(r) for r in rows], ""])


def render(result: dict) -> str:
    out = []
    header = ["regressor / split", "RMSE MiB", "RMSLE", "avg err", "p95 err", "max err",
              "OOM detected"]
    rows = [["SchedTune paper, random forest", f"{PAPER['rmse_mib']:.1f}", "-",
             _pct(PAPER["avg_rel_err"]), "-", _pct(PAPER["max_rel_err"]),
             _pct(PAPER["oom_detection"])]]
    for name, splits in result["schedtune_replication"].items():
        for split, m in splits.items():
            rows.append([f"{name}, {split.replace('_', ' ')}", f"{m['rmse_mib']:.1f}",
                         f"{m['rmsle']:.4f}", _pct(m["avg_rel_err"]), _pct(m["p95_rel_err"]),
                         _pct(m["max_rel_err"]), _pct(m["oom_detection"])])
    out.append(_render_table("SchedTune replication (model statistics + GPU characteristics)",
                             header, rows))
    rows = [[name, f"{m['rmse_mib']:.1f}", f"{m['rmsle']:.4f}", _pct(m["avg_rel_err"]),
             _pct(m["p95_rel_err"]), _pct(m["max_rel_err"]), str(m["n"])]
            for name, m in result["privacy_preserving_lomo"].items()]
    out.append(_render_table(
        "Privacy-preserving (peaks on other GPU types only), leave-one-model-out "
        "(target: avg <= 3%, p95 <= 8%)",
        ["predictor", "RMSE MiB", "RMSLE", "avg err", "p95 err", "max err", "pairs"], rows))
    oom = result["oom_safety"]
    rows = []
    for label, m in oom["by_history"].items():
        rows.append([label, str(m.get("n", "-")), str(m.get("misses_mib", "-")),
                     str(m.get("oom_misses_shards", "-")), _pct(m["median_margin"]),
                     _pct(m.get("median_over_allocation")),
                     _pct(m.get("median_shard_over_allocation"))])
    a = oom["all"]
    rows.append(["all held-out estimates", str(a["n"]), str(a["misses_mib"]),
                 str(a["oom_misses_shards"]), "-", _pct(a["median_over_allocation"]),
                 _pct(a["median_shard_over_allocation"])])
    out.append(_render_table(
        f"OOM safety, leave-one-model-out (conformal coverage {oom['coverage']:g}; "
        f"'does not fit' labels excluded: {_pct(oom['does_not_fit_detected'])} "
        f"of {oom['does_not_fit_cases']})",
        ["history of the job", "n", "safe<peak", "OOM (shards)", "margin",
         "over-alloc", "shard over-alloc"], rows))
    rows = [[name, _pct(m["avg_rel_err"]), _pct(m["median_rel_err"]), _pct(m["p95_rel_err"]),
             str(m["n"])] for name, m in result["runtime_transfer_lojo"].items()]
    out.append(_render_table(
        f"Run-time transfer K80/P100/V100, leave-one-job-type-out (paper's time predictor: "
        f"avg {_pct(PAPER['time_avg_rel_err'])}, with model statistics)",
        ["predictor", "avg err", "median err", "p95 err", "pairs"], rows))
    return "\n".join(out)


# -- run time per GPU type (runtime.py) -------------------------------------------------------
def evaluate_transfer(frame: pd.DataFrame | None = None) -> dict:
    """Leave-one-job-type-out relative error of run time from one type to another."""
    frame = load_gavel_isolated() if frame is None else frame
    wide = frame.pivot_table(index="job", columns="gpu", values="throughput")
    errors: dict[str, list[float]] = {"same time everywhere": [], "per-pair median ratio": [],
                                      "per-pair log-linear (ours)": []}
    for job in wide.index:
        train = frame[frame.job != job]
        median = RuntimeTransfer(method="median").fit(train)
        ours = RuntimeTransfer(method="loglinear").fit(train)
        for a, b in itertools.permutations(wide.columns, 2):
            # Run time of a fixed amount of work: steps / throughput; steps cancel in the error.
            steps = 1000.0
            t_a, t_b = steps / wide.loc[job, a], steps / wide.loc[job, b]
            errors["same time everywhere"].append(abs(t_a / t_b - 1))
            errors["per-pair median ratio"].append(
                abs(median.predict_runtime({a: t_a}, b, steps) / t_b - 1))
            errors["per-pair log-linear (ours)"].append(
                abs(ours.predict_runtime({a: t_a}, b, steps) / t_b - 1))
    return {name: {"avg_rel_err": float(np.mean(e)), "p95_rel_err": float(np.percentile(e, 95)),
                   "median_rel_err": float(np.median(e)), "n": len(e)}
            for name, e in errors.items()}


# -- interference classes (classes.py): Ray et al.'s clustering, re-done --------------------
def reproduce_alnair(k_max: int = 10, random_state: int = 0) -> dict[str, Any]:
    """Fit on the paper's 175 records; map the 12 jobs of Table II and compare with the paper."""
    model = InterferenceClasses(k_max=k_max, random_state=random_state).fit(load_alnair("records"))
    jobs = alnair_job_telemetry(load_alnair("single_runs"))
    jobs["class"] = model.predict(jobs)
    table = pd.crosstab(jobs["cluster_id"], jobs["class"])
    return {
        "data": "alnair clustering_record_175.csv (175 rows), features MGUP, MGMAP, MGTSAMP "
                "standardised",
        "k": model.k_,
        "k_rule": "kneedle on K-means distortion (inertia), k = 1..%d" % k_max,
        "k_second_difference": model.k_second_difference_,
        "paper_k": 3,
        "distortions": {str(k): round(v, 3) for k, v in model.distortions_.items()},
        "silhouette": None if model.silhouette_ is None else round(model.silhouette_, 4),
        "centroids": [dict(zip(FEATURES, np.round(c, 2).tolist())) for c in model.centroids_],
        "class_sizes": np.bincount(model.labels_, minlength=model.k_).tolist(),
        "jobs": [
            {"task": r.task, "batch_size": int(r.batch_size), "paper_cluster": int(r.cluster_id),
             "class": int(r[-1]),
             "MGUP": r.MGUP, "MGMAP": r.MGMAP, "MGTSAMP": r.MGTSAMP}
            for r in jobs[["task", "batch_size", "cluster_id", "MGUP", "MGMAP", "MGTSAMP",
                           "class"]].itertuples(index=False)
        ],
        "contingency": {"rows": "paper cluster id", "columns": "our class",
                        "table": {str(i): {str(c): int(v) for c, v in row.items()}
                                  for i, row in table.iterrows()}},
        "adjusted_rand": round(float(adjusted_rand_score(jobs["cluster_id"], jobs["class"])), 4),
        "matched_fraction": round(_best_match(table) / len(jobs), 4),
    }


def _best_match(table: pd.DataFrame) -> int:
    """Jobs on which the two labelings agree under the best one-to-one matching of ids."""
    from itertools import permutations

    rows, cols = list(table.index), list(table.columns)
    best = 0
    if len(cols) >= len(rows):
        for perm in permutations(cols, len(rows)):
            best = max(best, sum(int(table.loc[r, c]) for r, c in zip(rows, perm)))
    else:
        for perm in permutations(rows, len(cols)):
            best = max(best, sum(int(table.loc[r, c]) for r, c in zip(perm, cols)))
    return best


# -- the class-pair knowledge base (knowledge.py) -------------------------------------------
def _pair_figures(sides: pd.DataFrame, threshold: float) -> dict[str, Any]:
    rho = spearmanr(sides["predicted"], sides["speed"]).statistic
    per_gpu = {g: round(float(spearmanr(d["predicted"], d["speed"]).statistic), 4)
               for g, d in sides.groupby("gpu")} if "gpu" in sides else {}
    pair_key = sides.apply(lambda r: (r["gpu"],) + tuple(sorted((r["job"], r["other"]))), axis=1)
    pairs = sides.groupby(pair_key).agg(pred_min=("predicted", "min"),
                                        measured_min=("speed", "min"))
    if "recommended" in sides:  # the predictor's own rule (e.g. the pessimistic KB verdict)
        pairs["recommended"] = sides.groupby(pair_key)["recommended"].all()
    else:
        pairs["recommended"] = pairs["pred_min"] >= threshold
    recommended = pairs[pairs["recommended"]]
    return {
        "sides": int(len(sides)),
        "pairs": int(len(pairs)),
        "spearman": round(float(rho), 4),
        "spearman_per_gpu": per_gpu,
        "mae": round(float((sides["predicted"] - sides["speed"]).abs().mean()), 4),
        "recommended_pairs": int(len(recommended)),
        "recommended_below_threshold": int((recommended["measured_min"] < threshold).sum()),
        "recommended_below_threshold_rate": (
            round(float((recommended["measured_min"] < threshold).mean()), 4)
            if len(recommended) else None),
        "all_pairs_below_threshold_rate": round(float((pairs["measured_min"] < threshold).mean()),
                                                4),
        "threshold": threshold,
    }


def evaluate_kb_on_alnair(classes: InterferenceClasses | None = None,
                          threshold: float = DEFAULT_THRESHOLD) -> dict[str, Any]:
    """Leave-one-pair-out for the class lookup: each of the 34 pairs is predicted from a base
    seeded with the other 33 (its class pair's mean ISD, else the prior); a pair counts as
    recommended when ``compatible`` (the pessimistic rule) says so."""
    pairs = alnair_pairs(classes)
    rows = []
    for i, r in enumerate(pairs.itertuples(index=False)):
        kb = KnowledgeBase(threshold=threshold)
        for j, o in enumerate(pairs.itertuples(index=False)):
            if j != i:
                kb.observe(o.class_a, o.class_b, o.isd_a, o.isd_b, ps=o.ps,
                           gpu_type=ALNAIR_GPU, prior=True)
        stats = kb.pair(r.class_a, r.class_b, ALNAIR_GPU)
        verdict = kb.compatible(r.class_a, r.class_b, ALNAIR_GPU)
        name_a, name_b = f"{r.task_a}/{r.bs_a}", f"{r.task_b}/{r.bs_b}"
        rows.append({"gpu": "p100", "job": name_a, "other": name_b, "predicted": stats.speed_a,
                     "speed": speed_of(r.isd_a), "recommended": verdict})
        rows.append({"gpu": "p100", "job": name_b, "other": name_a, "predicted": stats.speed_b,
                     "speed": speed_of(r.isd_b), "recommended": verdict})
    figures = _pair_figures(pd.DataFrame(rows), threshold)
    figures.pop("spearman_per_gpu", None)
    return figures | {"data": "alnair Tables III/IV (34 pairs)",
                      "held_out": "leave-one-pair-out",
                      "classes": "ours (fitted on the 175 records)" if classes is not None
                      else "the paper's cluster ids"}


# -- the pair predictor (pairs.py; bench/pairs_eval.py, kb evaluate) -------------------------
def _figures(rows: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD) -> dict:
    """The judged figures over measured pairs. ``rows``: one per measured pair with pred_a,
    pred_b (NaN where the table had no row), speed_a, speed_b, recommended. Spearman is over
    both sides of every pair (predicted vs measured speed, all pairs pooled); a recommended pair
    is bad when either side was measured below ``threshold``. ``spearman_pairs`` ranks the
    pairs themselves: predicted vs measured sum of the two speeds (the pair's throughput).
    A figure that needs more pairs than there are (none, or too few to rank) is None."""
    if rows.empty:
        return {"pairs": 0, "missing": 0, "spearman": None, "spearman_pairs": None,
                "mae": None, "recommended_share": None, "recommended_bad_share": None,
                "all_pairs_bad_share": None}
    sides_pred = np.concatenate([rows["pred_a"], rows["pred_b"]]).astype(float)
    sides_true = np.concatenate([rows["speed_a"], rows["speed_b"]]).astype(float)
    known = ~np.isnan(sides_pred)
    worst = np.minimum(rows["speed_a"], rows["speed_b"])
    rec = rows["recommended"].fillna(False).astype(bool)
    missing = int(rows[["pred_a", "pred_b"]].isna().any(axis=1).sum())
    pair_pred = (rows["pred_a"] + rows["pred_b"]).astype(float).to_numpy()
    pair_true = (rows["speed_a"] + rows["speed_b"]).astype(float).to_numpy()
    pair_known = ~np.isnan(pair_pred)
    return {
        "pairs": int(len(rows)), "missing": missing,
        "spearman": _rank(sides_pred[known], sides_true[known]),
        "spearman_pairs": _rank(pair_pred[pair_known], pair_true[pair_known]),
        "mae": round(float(np.abs(sides_pred[known] - sides_true[known]).mean()), 4),
        "recommended_share": round(float(rec.mean()), 4),
        "recommended_bad_share": round(float((worst[rec] < threshold).mean()), 4) if rec.any()
        else None,
        "all_pairs_bad_share": round(float((worst < threshold).mean()), 4),
    }


def _rank(predicted, measured) -> float | None:
    """Spearman's rho, rounded; None where it is undefined (fewer than 3 values, or no spread)."""
    if len(predicted) < 3:
        return None
    rho = spearmanr(predicted, measured).statistic
    return None if np.isnan(rho) else round(float(rho), 4)


def _evaluate(model: PairSpeedModel, measured, profiles, history=()) -> dict:
    """The judged figures for ``measured`` pairs from the table ``kb predict-pairs`` prints
    for every job in ``profiles`` with ``history`` given as co-runs."""
    table = pair_table(model, [{"job": k, **v} for k, v in profiles.items()], history)
    by_pair = {}
    for row in table:
        by_pair[(row["job_a"], row["job_b"])] = row
        by_pair[(row["job_b"], row["job_a"])] = {
            **row, "pred_speed_a": row["pred_speed_b"], "pred_speed_b": row["pred_speed_a"]}
    out = []
    for a, b, speed_a, speed_b in measured:
        row = by_pair.get((a, b), {})
        out.append({"pred_a": row.get("pred_speed_a", np.nan),
                    "pred_b": row.get("pred_speed_b", np.nan), "speed_a": speed_a,
                    "speed_b": speed_b, "recommended": row.get("recommended", False)})
    return _figures(pd.DataFrame(out))


def _baseline_rows(pairs, profiles) -> pd.DataFrame:
    out = []
    for a, b, speed_a, speed_b in pairs:
        total = demand_of(profiles[a]).sm + demand_of(profiles[b]).sm
        out.append({"pred_a": -total, "pred_b": -total, "speed_a": speed_a, "speed_b": speed_b,
                    "recommended": total <= 1.0})
    return pd.DataFrame(out)


def _spread(values: list[float | None]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"mean": None, "min": None, "max": None}
    return {"mean": round(float(np.mean(values)), 4), "min": round(float(min(values)), 4),
            "max": round(float(max(values)), 4)}


def leave_one_data_set_out(seeds: Sequence[int] = (0, 1, 2, 3, 4)) -> dict:
    """Each packaged data set held out in turn, the margins calibrated on the others; figures
    from the table ``kb predict-pairs`` prints: cold, with ``HISTORY_PER_JOB`` co-runs per job
    given as history (per seed; figures over the other pairs; mean, min and max), with the prior's
    shape fixed at ``DEFAULT_LATENCY`` instead of chosen, and for the baseline "add the two jobs' GPU
    utilisations" (a side's score is -(u_a + u_b); a pair is recommended when the sum is at most
    100%)."""
    sides = training_sides()
    out = {}
    for name, pairs, profiles in data_sets():
        training = sides[sides["group"] != name]
        model = PairSpeedModel().fit(training)
        out[name] = {
            "fitted_on": sorted(set(training["group"])),
            **_held_out_figures(model, pairs, profiles, seeds),
            "latency_fixed_at_default": _fixed_shape_figures(training, pairs, profiles),
            "information_ceiling": information_ceiling(model, pairs, profiles, seeds),
        }
    return out


def _fixed_shape_figures(training: pd.DataFrame, pairs, profiles) -> dict:
    """Cold figures with the prior's shape fixed at ``DEFAULT_LATENCY`` (the margins
    calibrated for it): what choosing the shape changed."""
    fixed = PairSpeedModel(latency=DEFAULT_LATENCY).fit(training)
    return {"parameters": dict(zip(PARAMETERS, np.round(fixed.coef_, 4).tolist())),
            "margin": fixed.margin_, "cold": _evaluate(fixed, pairs, profiles)}


def held_out_public(external: Sequence[tuple[str, str, str]],
                    seeds: Sequence[int] = (0, 1, 2, 3, 4)) -> dict:
    """Public sets kept for evaluation, never fitted on, each ``(name, PROFILES.csv,
    CORUNS.csv)`` in ``kb predict-pairs``'s files: the packaged prior (fitted on every packaged
    set) against them, with the same figures as ``leave_one_data_set_out``."""
    from slurm_gpushare.predict.datasets import load_pair_set

    if not external:
        return {}
    sides = training_sides()
    model = PairSpeedModel().fit(sides)
    out = {}
    for name, profiles_csv, coruns_csv in external:
        pairs, profiles = load_pair_set(profiles_csv, coruns_csv, name)
        out[name] = {"fitted_on": sorted(set(sides["group"])),
                     **_held_out_figures(model, pairs, profiles, seeds),
                     "latency_fixed_at_default": _fixed_shape_figures(sides, pairs, profiles),
                     "information_ceiling": information_ceiling(model, pairs, profiles, seeds)}
    return out


CEILING_HELD_OUT_JOBS = 1 / 3  # of a set's jobs, held out per seed by ``information_ceiling``


def _side_features(profile: dict) -> list[float]:
    demand = demand_of(profile)
    used, total = profile.get("mem_used_mib"), profile.get("mem_total_mib")
    try:
        memory = float(used) / float(total)
    except (TypeError, ValueError, ZeroDivisionError):
        memory = np.nan
    return [demand.sm, demand.mem, memory if np.isfinite(memory) else -1.0]


def information_ceiling(model: PairSpeedModel, pairs, profiles,
                        seeds: Sequence[int] = (0, 1, 2, 3, 4)) -> dict:
    """How well *any* predictor reading only the profiles could rank pairs of jobs it has never
    seen, on this very GPU: a gradient-boosted regressor fitted on the set's own pairs (each
    side's speed from both jobs' SM and memory-controller utilisation and memory share), a
    third of the jobs held out per seed, judged on the pairs whose two jobs were both held out,
    beside ``model`` (cold) on the same pairs. Fitting on the evaluation set is what the product
    never does: this is a diagnostic of what the inputs carry, not a predictor."""
    jobs = sorted({j for a, b, *_ in pairs for j in (a, b)})
    features = {job: _side_features(profiles[job]) for job in jobs}
    per_seed = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        held = set(rng.choice(jobs, max(2, int(len(jobs) * CEILING_HELD_OUT_JOBS)),
                              replace=False).tolist())
        train = [p for p in pairs if p[0] not in held and p[1] not in held]
        test = [p for p in pairs if p[0] in held and p[1] in held]
        if len(train) < 20 or len(test) < 10:
            continue
        x, y = [], []
        for a, b, speed_a, speed_b in train:
            for own, other, speed in ((a, b, speed_a), (b, a, speed_b)):
                x.append(features[own] + features[other])
                y.append(float(speed))
        fitted = GradientBoostingRegressor(max_depth=3, n_estimators=200, random_state=seed)
        fitted.fit(np.array(x), np.array(y))
        sides = fitted.predict(np.array([features[own] + features[other] for a, b, *_ in test
                                         for own, other in ((a, b), (b, a))]))
        fitted_figures = _figures(pd.DataFrame({
            "pred_a": sides[0::2], "pred_b": sides[1::2],
            "speed_a": [p[2] for p in test], "speed_b": [p[3] for p in test],
            "recommended": False}))
        ours = _evaluate(model, test, profiles)
        per_seed.append({"seed": seed, "test_pairs": len(test), "train_pairs": len(train),
                         **{f"fitted_on_set_{k}": fitted_figures[k]
                            for k in ("spearman", "spearman_pairs")},
                         **{f"cold_{k}": ours[k] for k in ("spearman", "spearman_pairs")}})
    return {"held_out_jobs": round(CEILING_HELD_OUT_JOBS, 3), "per_seed": per_seed,
            **{key: _spread([s[key] for s in per_seed])
               for key in ("fitted_on_set_spearman", "fitted_on_set_spearman_pairs",
                           "cold_spearman", "cold_spearman_pairs")}}


def _held_out_figures(model: PairSpeedModel, pairs, profiles, seeds: Sequence[int]) -> dict:
    per_seed = []
    for seed in seeds:
        history, test = history_split(pairs, seed)
        per_seed.append({"seed": seed, "history_pairs": len(history),
                         "test_pairs": len(test), "cold": _evaluate(model, test, profiles),
                         "history": _evaluate(model, test, profiles, history)})
    return {
        "parameters": dict(zip(PARAMETERS, np.round(model.coef_, 4).tolist())),
        "shrinkage": model.shrinkage_,
        "margin": model.margin_, "margin_learned": model.margin_learned_,
        "cold": _evaluate(model, pairs, profiles),
        "baseline_sum_of_utilisations": _figures(_baseline_rows(pairs, profiles)),
        "with_history": {
            "co_runs_per_job": HISTORY_PER_JOB,
            "per_seed": per_seed,
            **{f"{kind}_{metric}": _spread([s[kind][metric] for s in per_seed])
               for kind in ("cold", "history")
               for metric in ("spearman", "recommended_share", "recommended_bad_share")},
        },
    }
