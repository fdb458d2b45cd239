"""The scikit-learn face of the predictors: parameters (keyword-only, ``get_params``/``clone``),
``fit`` on a table, ``check_is_fitted``, ``random_state`` (DESIGN.md, example 7).

Each ``fit`` produces the plain fitted model of its concept module -- ``memory.MemoryModel``,
``classes.ClassModel``, ``runtime.RuntimeModel``, ``pairs.PairModel`` -- held as ``model_``, and
every prediction is delegated to it: one prediction implementation, which the daemon loads from
JSON without scikit-learn, scipy or pandas (those are needed to fit, never to predict). The
fitted attributes ending in ``_`` read the model. The methods themselves are described in the
concept modules.
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClusterMixin
from scipy.stats import spearmanr
from sklearn.utils.validation import check_is_fitted

from slurm_gpushare.core.gpus import Catalogue
from slurm_gpushare.predict.classes import (FEATURES, ClassModel, feature_matrix, kneedle,
                                            max_second_difference)
from slurm_gpushare.predict.memory import (MemoryModel, PairTransfer, PeakPrediction, _huber_line,
                                           _pair_key, conformal_upper)
from slurm_gpushare.predict.pairs import (DEFAULT_LATENCY, DEFAULT_THRESHOLD, LATENCY_GRID,
                                          MAX_MARGIN, SHRINKAGE_GRID, Demand, PairModel,
                                          calibration_sets, history_split, prior_isd)
from slurm_gpushare.predict.persist import load_json
from slurm_gpushare.predict.runtime import RuntimeModel, SpeedTransfer

# History draws per training set when calibrating the learned margin: one draw left the margin
# to chance (on the H100 pairs, other draws then had 10% of recommended pairs bad).
CALIBRATION_DRAWS = 5
BOOTSTRAP_DRAWS = 200  # resamplings of the pairs for the shape's standard error


# -- memory (memory.py) ------------------------------------------------------------------------
class CrossTypeMemoryPredictor(BaseEstimator):
    """Peak GPU memory on one type from peaks observed on others (no model statistics).

    ``fit(X)`` takes a long table with columns ``job``, ``gpu`` (catalogue model), ``peak_mib``
    and optionally ``group`` (jobs of one group are held out together when calibrating, e.g.
    all batch sizes of one network). The fitted state: ``types_``, ``pairs_`` (per ordered
    pair), ``margins_`` (per target and observed-type set), ``margin_by_count_``.
    """

    def __init__(self, *, coverage: float = 1.0, huber_delta: float = 1.345,
                 min_jobs: int = 8, min_calibration: int = 12, n_folds: int = 12,
                 max_sources: int = 4, same_type_margin: float = 0.05,
                 unseen_type_margin: float = 0.10, catalogue: Catalogue | None = None,
                 random_state: int | None = 0):
        self.coverage = coverage
        self.huber_delta = huber_delta
        self.min_jobs = min_jobs
        self.min_calibration = min_calibration
        self.n_folds = n_folds
        self.max_sources = max_sources
        self.same_type_margin = same_type_margin
        self.unseen_type_margin = unseen_type_margin
        self.catalogue = catalogue
        self.random_state = random_state

    @staticmethod
    def _wide(X: pd.DataFrame) -> pd.DataFrame:
        missing = {"job", "gpu", "peak_mib"} - set(X.columns)
        if missing:
            raise ValueError(f"training table lacks column(s): {', '.join(sorted(missing))}")
        # A job's peak on a type is the largest of its runs there (what must fit).
        return X.pivot_table(index="job", columns="gpu", values="peak_mib", aggfunc="max")

    def _fit_pairs(self, wide: pd.DataFrame) -> dict[tuple[str, str], PairTransfer]:
        pairs = {}
        values = wide.to_numpy(float)
        for (i, a), (j, b) in itertools.permutations(enumerate(wide.columns), 2):
            both = ~np.isnan(values[:, i]) & ~np.isnan(values[:, j])
            if both.sum() < self.min_jobs:
                continue
            x, y = values[both, i], values[both, j]
            intercept, slope = _huber_line(x, y - x, self.huber_delta)
            transfer = PairTransfer(intercept, slope, float(x.min()), float(x.max()), 1.0,
                                    int(both.sum()))
            rel = y / transfer.predict(x) - 1
            scale = max(1.4826 * float(np.median(np.abs(rel))), 0.005)
            pairs[(a, b)] = PairTransfer(intercept, slope, transfer.lo, transfer.hi, scale,
                                         int(both.sum()))
        return pairs

    def fit(self, X: pd.DataFrame, y=None) -> "CrossTypeMemoryPredictor":
        wide = self._wide(X)
        if wide.shape[1] < 2:
            raise ValueError("need peaks on at least two GPU types to learn transfers")
        groups = (X.groupby("job")["group"].first() if "group" in X.columns
                  else pd.Series(wide.index, index=wide.index)).reindex(wide.index)
        types = list(wide.columns)
        fitted_pairs = self._fit_pairs(wide)
        if not fitted_pairs:
            raise ValueError(f"no pair of GPU types shares {self.min_jobs} jobs")

        # Cross-fitting: each group's jobs are predicted by transfers fitted without them.
        unique = np.array(sorted(groups.unique()))
        rng = np.random.default_rng(self.random_state)
        fold_of = dict(zip(rng.permutation(unique),
                           itertools.cycle(range(min(self.n_folds, len(unique))))))
        folds = groups.map(fold_of).to_numpy()
        residuals: dict[tuple[str, str], list[float]] = {}
        for fold in np.unique(folds):
            held = wide[folds == fold]
            pairs = self._fit_pairs(wide[folds != fold])
            for target in types:
                truth = held[target].to_numpy(float)
                others = [t for t in types if t != target]
                for k in range(1, min(self.max_sources, len(others)) + 1):
                    for sources in itertools.combinations(others, k):
                        pred = MemoryModel.combine(pairs, {s: held[s].to_numpy(float)
                                                     for s in sources}, target)
                        if pred is None:
                            continue
                        rel = truth / pred - 1
                        rel = rel[~np.isnan(rel)]
                        residuals.setdefault((target, _pair_key(sources)), []).extend(rel)
        self.calibration_residuals_ = {k: np.asarray(v) for k, v in residuals.items()}
        margins = {k: conformal_upper(v, self.coverage)
                         for k, v in residuals.items() if len(v) >= self.min_calibration}
        by_count: dict[int, list[float]] = {}
        for (target, key), values in residuals.items():
            by_count.setdefault(key.count("+") + 1, []).extend(values)
        self.model_ = MemoryModel(
            params={k: v for k, v in self.get_params().items() if k != "catalogue"},
            types=types, pairs=fitted_pairs, margins=margins,
            margin_by_count={k: conformal_upper(v, self.coverage)
                             for k, v in sorted(by_count.items())},
            n_jobs=len(wide), catalogue=self.catalogue)
        return self

    # -- the fitted model (prediction is ``MemoryModel``'s, the one implementation) --------
    types_ = property(lambda self: self._model().types)
    pairs_ = property(lambda self: self._model().pairs)
    margins_ = property(lambda self: self._model().margins)
    margin_by_count_ = property(lambda self: self._model().margin_by_count)
    n_jobs_ = property(lambda self: self._model().n_jobs)

    def _model(self) -> MemoryModel:
        check_is_fitted(self, "model_")
        return self.model_

    def predict_peak(self, observed: Mapping[str, float | Sequence[float]],
                     target: str) -> PeakPrediction:
        """Predicted peak and margin on catalogue model ``target`` from ``{model: peak(s)}``."""
        return self._model().predict_peak(observed, target)

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        """Mean peak for rows ``source``, ``source_peak_mib``, ``target`` (one source each)."""
        model = self._model()
        return np.array([model.predict_peak({row.source: row.source_peak_mib}, row.target).mean_mib
                         for row in X.itertuples(index=False)])

    def to_dict(self) -> dict:
        """The fitted state as plain data (``calibration_residuals_`` is not kept)."""
        return self._model().to_dict()

    @classmethod
    def from_dict(cls, data: Mapping, catalogue: Catalogue | None = None
                  ) -> "CrossTypeMemoryPredictor":
        model = MemoryModel.from_dict(data, catalogue)
        estimator = cls(**model.params, catalogue=catalogue)
        estimator.model_ = model
        return estimator


# -- interference classes (classes.py) ---------------------------------------------------------
class InterferenceClasses(ClusterMixin, BaseEstimator):
    """K-means interference classes with k chosen by the elbow (kneedle).

    Parameters: ``n_clusters`` (None: choose by the elbow), ``k_max`` (largest k tried),
    ``n_init``, ``random_state``. Fitted: ``model_`` (a ``ClassModel``), read through ``k_``,
    ``centers_`` (standardised), ``centroids_`` (original units), ``mean_``, ``scale_``,
    ``distortions_``, ``k_knee_``, ``k_second_difference_``, ``silhouette_``, ``n_samples_``;
    and ``labels_`` (the training rows' classes, not kept by ``save``), ``n_features_in_``.
    """

    def __init__(self, *, n_clusters: int | None = None, k_max: int = 10, n_init: int = 10,
                 random_state: int | None = 0):
        self.n_clusters = n_clusters
        self.k_max = k_max
        self.n_init = n_init
        self.random_state = random_state

    def fit(self, X, y=None) -> "InterferenceClasses":
        from sklearn.cluster import KMeans
        from sklearn.metrics import silhouette_score
        from threadpoolctl import threadpool_limits

        X = feature_matrix(X)
        if len(X) < 3:
            raise ValueError("need at least 3 jobs to find classes")
        mean = X.mean(axis=0)
        scale = X.std(axis=0)
        scale = np.where(scale > 0, scale, 1.0)
        Z = (X - mean) / scale
        k_max = max(1, min(self.k_max, len(np.unique(Z, axis=0))))
        ks = list(range(1, k_max + 1))
        # One thread: on a few hundred rows OpenMP start-up costs more than the work.
        with threadpool_limits(1, user_api="openmp"):
            fits = {k: KMeans(n_clusters=k, n_init=self.n_init,
                              random_state=self.random_state).fit(Z) for k in ks}
        distortions = {k: float(fits[k].inertia_) for k in ks}
        k_knee = kneedle(ks, [distortions[k] for k in ks])
        k_second_difference = max_second_difference(ks, [distortions[k] for k in ks])
        k = self.n_clusters or k_knee
        if k not in fits:
            with threadpool_limits(1, user_api="openmp"):
                fits[k] = KMeans(n_clusters=k, n_init=self.n_init,
                                 random_state=self.random_state).fit(Z)
        centers = fits[k].cluster_centers_
        order = np.lexsort((centers[:, 0], centers.sum(axis=1)))  # lightest first
        model = ClassModel(params=self.get_params(), mean=mean, scale=scale,
                           centers=centers[order], distortions=distortions, k_knee=k_knee,
                           k_second_difference=k_second_difference, silhouette=None,
                           n_samples=len(Z))
        self.labels_ = model.assign(Z)
        if 1 < k < len(Z) and len(set(self.labels_)) > 1:
            model.silhouette = float(silhouette_score(Z, self.labels_))
        self.model_ = model
        self.n_features_in_ = X.shape[1]
        return self

    # -- the fitted model (prediction is ``ClassModel``'s, the one implementation) ----------
    k_ = property(lambda self: self._model().k)
    centers_ = property(lambda self: self._model().centers)
    centroids_ = property(lambda self: self._model().centroids)
    mean_ = property(lambda self: self._model().mean)
    scale_ = property(lambda self: self._model().scale)
    distortions_ = property(lambda self: self._model().distortions)
    k_knee_ = property(lambda self: self._model().k_knee)
    k_second_difference_ = property(lambda self: self._model().k_second_difference)
    silhouette_ = property(lambda self: self._model().silhouette)
    n_samples_ = property(lambda self: self._model().n_samples)

    def _model(self) -> ClassModel:
        check_is_fitted(self, "model_")
        return self.model_

    def predict(self, X) -> np.ndarray:
        return self._model().predict(X)

    def predict_one(self, mgup: float, mgmap_pct: float, mgtsamp: float) -> int:
        return self._model().predict_one(mgup, mgmap_pct, mgtsamp)

    def transform(self, X) -> np.ndarray:
        """Distances (standardised units) to each class centre."""
        return self._model().transform(X)

    def digest(self) -> str:
        return self._model().digest()

    def to_dict(self) -> dict[str, Any]:
        return self._model().to_dict()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "InterferenceClasses":
        model = ClassModel.from_dict(data)
        estimator = cls(**model.params)
        estimator.model_ = model
        estimator.n_features_in_ = len(FEATURES)
        return estimator

    def save(self, path: str | os.PathLike) -> None:
        self._model().save(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "InterferenceClasses":
        return cls.from_dict(load_json(path))


# -- run time (runtime.py) ---------------------------------------------------------------------
class RuntimeTransfer(BaseEstimator):
    """Run time on each GPU type from run times observed on some of them. ``fit`` takes Gavel's
    isolated throughputs (``job``, ``gpu``, ``throughput``); fitted: ``model_`` (a
    ``RuntimeModel``), read through ``types_`` and ``pairs_``."""

    def __init__(self, *, method: str = "loglinear", huber_delta: float = 1.345,
                 min_jobs: int = 5, catalogue: Catalogue | None = None,
                 random_state: int | None = 0):
        self.method = method
        self.huber_delta = huber_delta
        self.min_jobs = min_jobs
        self.catalogue = catalogue
        self.random_state = random_state  # for the estimator API; the fit is deterministic

    def fit(self, X: pd.DataFrame, y=None) -> "RuntimeTransfer":
        if self.method not in ("loglinear", "median"):
            raise ValueError(f"unknown method {self.method!r}")
        wide = np.log(X.pivot_table(index="job", columns="gpu", values="throughput"))
        types = list(wide.columns)
        pairs = {}
        for a, b in itertools.permutations(types, 2):
            both = wide[[a, b]].dropna()
            if len(both) < self.min_jobs:
                continue
            x, d = both[a].to_numpy(), (both[b] - both[a]).to_numpy()
            if self.method == "median":
                coef = np.array([np.median(d), 0.0])
            else:
                coef = _huber_line(x, d, self.huber_delta)
            resid = d - (coef[0] + coef[1] * x)
            scale = max(1.4826 * float(np.median(np.abs(resid))), 0.01)
            pairs[(a, b)] = SpeedTransfer(float(coef[0]), float(coef[1]), scale,
                                          float(np.median(d)))
        self.model_ = RuntimeModel(
            params={k: v for k, v in self.get_params().items() if k != "catalogue"},
            types=types, pairs=pairs, catalogue=self.catalogue)
        return self

    # -- the fitted model (prediction is ``RuntimeModel``'s, the one implementation) --------
    types_ = property(lambda self: self._model().types)
    pairs_ = property(lambda self: self._model().pairs)

    def _model(self) -> RuntimeModel:
        check_is_fitted(self, "model_")
        return self.model_

    def predict_runtime(self, observed_s: Mapping[str, float], target: str,
                        steps: float | None = None) -> float:
        return self._model().predict_runtime(observed_s, target, steps)

    def predict_all(self, observed_s: Mapping[str, float], targets, steps=None) -> dict:
        return self._model().predict_all(observed_s, targets, steps)

    def to_dict(self) -> dict:
        return self._model().to_dict()


# -- the pair predictor (pairs.py) -------------------------------------------------------------
class PairSpeedModel(BaseEstimator):
    """The contention prior plus per-job corrections (scikit-learn style).

    ``fit(sides)``: a frame with one row per (job, co-runner) side: ``own_sm, own_mem,
    other_sm, other_mem, speed`` and optional ``group`` (the data set; groups weigh equally).
    Fitted: ``model_`` (a ``PairModel``), read through ``coef_`` (the latency), ``margin_``,
    ``margin_learned_``, ``shrinkage_``, ``n_train_``, ``suffers_``, ``hurts_``.
    ``learn(coruns, profiles)`` adds per-job corrections from measured co-runs.
    ``predict_group([profile, ...], keys)`` gives each co-runner's speed.
    """

    def __init__(self, *, latency: float | None = None,
                 threshold: float = DEFAULT_THRESHOLD, max_bad_rate: float = 0.01,
                 shrinkage: float | None = None, random_state: int | None = 0):
        self.latency = latency
        self.threshold = threshold
        self.max_bad_rate = max_bad_rate
        self.shrinkage = shrinkage
        self.random_state = random_state

    def fit(self, sides: pd.DataFrame, y=None) -> "PairSpeedModel":
        """Set the prior's shape (``latency``: fixed, or with None chosen by ``_choose_latency``)
        and calibrate both margins (cold, and with learned corrections) on the sets
        ``calibration_sets`` names, or on every set where none of them is in ``sides``."""
        own = [Demand(s, m) for s, m in zip(sides["own_sm"], sides["own_mem"])]
        other = [Demand(s, m) for s, m in zip(sides["other_sm"], sides["other_mem"])]
        speed = sides["speed"].to_numpy(float)
        groups = sides["group"].to_numpy() if "group" in sides else np.zeros(len(sides))

        def isd_for(latency: float) -> np.ndarray:
            return np.array([prior_isd([o, p], latency)[0] for o, p in zip(own, other)])

        calibrating = set(calibration_sets(map(str, groups)))
        on = np.isin(groups.astype(str), list(calibrating))
        pairs = sides["pair"].to_numpy() if "pair" in sides else np.arange(len(sides))
        latency = (float(self.latency) if self.latency is not None else
                   self._choose_latency(lambda v: isd_for(v)[on], speed[on],
                                        groups[on].astype(str), pairs[on]))
        model = PairModel(latency=latency, threshold=self.threshold, n_train=len(sides))
        calibrating = calibrating or set(map(str, groups))
        on = np.isin(groups.astype(str), list(calibrating))
        model.margin = self._calibrate(isd_for(latency)[on], speed[on],
                                       sides[on].reset_index(drop=True))
        model.shrinkage, model.margin_learned = self._calibrate_learned(model, sides, calibrating)
        self.model_ = model
        return self

    def _choose_latency(self, isd_by_latency, speed: np.ndarray, groups: np.ndarray,
                        pairs: np.ndarray) -> float:
        """The prior's shape from the sides of the sets whose telemetry is what the daemon
        reads (the margins' ``calibration_sets``; ``isd_by_latency(v)`` gives the prior's
        slowdowns of those sides): the largest grid value whose ranking of them (Spearman, each
        set weighing the same) is within one standard error of the best -- the most cautious
        shape the data cannot tell from the best (the one-standard-error rule; the error from
        ``BOOTSTRAP_DRAWS`` resamplings of the pairs). A larger latency predicts more slowdown
        for a light job next to a busy one. With no such set, ``DEFAULT_LATENCY``: the public
        sets' telemetry cannot tell (Gavel's utilisation proxy, Ray et al.'s peaks)."""
        if not len(speed):
            return DEFAULT_LATENCY

        def score(isd: np.ndarray, rows: np.ndarray) -> float:
            return float(np.mean([spearmanr(-isd[rows][groups[rows] == g],
                                            speed[rows][groups[rows] == g]).statistic
                                  for g in np.unique(groups[rows])]))

        every_side = np.arange(len(speed))
        predicted = {float(v): isd_by_latency(float(v)) for v in LATENCY_GRID}
        scores = {v: score(isd, every_side) for v, isd in predicted.items()}
        best = max(scores, key=scores.get)
        sides_of = list(pd.Series(every_side).groupby(pairs).apply(np.asarray))
        rng = np.random.default_rng(self.random_state)
        draws = [score(predicted[best], np.concatenate(
                     [sides_of[k] for k in rng.integers(len(sides_of), size=len(sides_of))]))
                 for _ in range(BOOTSTRAP_DRAWS)]
        within = scores[best] - float(np.std(draws))
        return max(v for v, value in scores.items() if value >= within)

    def _calibrate_learned(self, model: PairModel, sides: pd.DataFrame,
                           calibrating: set[str]) -> tuple[float, float]:
        """``(shrinkage, margin)`` for pairs whose jobs have corrections: each training data set
        is replayed with ``HISTORY_PER_JOB`` co-runs per job as history (``random_state`` draws
        them); the shrinkage (``self.shrinkage``, or with None the grid value) whose corrections
        rank the other pairs best on average over the sets, and the margin calibrated on those
        predictions for the sets in ``calibrating`` (``CALIBRATION_DRAWS`` draws each)."""
        if not {"group", "pair", "job", "other"} <= set(sides.columns):
            return (self.shrinkage or SHRINKAGE_GRID[-1]), model.margin
        rng = np.random.default_rng(self.random_state)
        replays = []
        for group, frame in sides.groupby("group"):
            profiles, pairs = {}, []
            for pair_id, rows in frame.groupby("pair", sort=False):
                first = rows.iloc[0]
                profiles[first["job"]] = {"gpu_util_pct": 100 * first["own_sm"],
                                          "mem_util_pct": 100 * first["own_mem"]}
                profiles[first["other"]] = {"gpu_util_pct": 100 * first["other_sm"],
                                            "mem_util_pct": 100 * first["other_mem"]}
                back = rows[rows["job"] == first["other"]]
                pairs.append((first["job"], first["other"], float(first["speed"]),
                              float(back["speed"].iloc[0]) if len(back) else float(first["speed"])))
            for draw in range(CALIBRATION_DRAWS):
                history, test = history_split(pairs, int(rng.integers(1 << 31)))
                replays.append((f"{group}:{draw}", profiles, history, test))

        def replay(shrinkage: float) -> tuple[float, float]:
            model.shrinkage = shrinkage
            isd_pred, speed, pair_ids, ranks = [], [], [], []
            for group, profiles, history, test in replays:
                model.learn(history, profiles)
                predicted, measured = [], []
                for a, b, speed_a, speed_b in test:
                    predicted += model.predict_isd([profiles[a], profiles[b]], [a, b])
                    measured += [speed_a, speed_b]
                if len(test) > 2:
                    ranks.append(spearmanr(-np.array(predicted), measured).statistic)
                if group.split(":")[0] in calibrating:
                    pair_ids += [f"{group}:{k}" for k in range(len(test)) for _ in (0, 1)]
                    isd_pred += predicted
                    speed += measured
            model.suffers, model.hurts = {}, {}
            if not pair_ids:
                return float("nan"), model.margin
            return (float(np.nanmean(ranks)) if ranks else float("nan"),
                    self._calibrate(np.array(isd_pred), np.array(speed),
                                    pd.DataFrame({"pair": pair_ids})))

        grid = SHRINKAGE_GRID if self.shrinkage is None else (self.shrinkage,)
        results = {value: replay(value) for value in grid}
        best = max(grid, key=lambda v: (np.nan_to_num(results[v][0], nan=-2.0), v))
        return best, results[best][1]

    def _calibrate(self, isd_pred: np.ndarray, speed: np.ndarray, sides: pd.DataFrame) -> float:
        """The margin: per data set (the part of ``pair`` before ":"), the smallest factor on a
        grid whose recommended pairs have at most ``max_bad_rate`` with a side measured below
        the threshold; then the largest of these over the data sets where one exists. A set
        where no factor up to ``MAX_MARGIN`` meets the target cannot calibrate it (Gavel: 84 to
        100% of its pairs are below 0.7x, and host-bound jobs with a 0% utilisation proxy are
        slowed too); with no set that can, ``MAX_MARGIN``."""
        pair = sides["pair"].astype(str).to_numpy() if "pair" in sides else np.arange(len(sides))
        frame = pd.DataFrame({"pair": pair, "isd": isd_pred, "speed": speed})
        worst = frame.groupby("pair").agg(isd=("isd", "max"), speed=("speed", "min"))
        worst["group"] = [str(p).split(":")[0] for p in worst.index]
        feasible = []
        for _, group in worst.groupby("group"):
            for margin in np.round(np.arange(1.0, MAX_MARGIN + 1e-9, 0.05), 2):
                ok = 1.0 / (1.0 + margin * group["isd"]) >= self.threshold
                if ok.any() and (group["speed"][ok] < self.threshold).mean() <= self.max_bad_rate:
                    feasible.append(float(margin))
                    break
        return max(feasible) if feasible else MAX_MARGIN

    # -- the fitted model (prediction is ``PairModel``'s, the one implementation) ----------
    coef_ = property(lambda self: np.array([self._model().latency]))
    margin_ = property(lambda self: self._model().margin)
    margin_learned_ = property(lambda self: self._model().margin_learned)
    shrinkage_ = property(lambda self: self._model().shrinkage)
    n_train_ = property(lambda self: self._model().n_train)
    suffers_ = property(lambda self: self._model().suffers)
    hurts_ = property(lambda self: self._model().hurts)

    def _model(self) -> PairModel:
        check_is_fitted(self, "model_")
        return self.model_

    def learn(self, coruns, profiles) -> "PairSpeedModel":
        """Per-job corrections from measured co-runs (``PairModel.learn``)."""
        self._model().learn(coruns, profiles)
        return self

    def predict_isd(self, profiles, keys=None) -> list[float]:
        return self._model().predict_isd(profiles, keys)

    def predict_group(self, profiles, keys=None) -> list[float]:
        return self._model().predict_group(profiles, keys)

    def safe_speeds(self, profiles, keys=None) -> list[float]:
        return self._model().safe_speeds(profiles, keys)

    def recommend(self, profiles, keys=None) -> bool:
        return self._model().recommend(profiles, keys)

    def predict_pairs(self, profiles, keys) -> list[dict[str, Any]]:
        return self._model().predict_pairs(profiles, keys)

    def fitted_copy(self) -> PairModel:
        """The same prior and margins, without corrections."""
        return self._model().fitted_copy()
