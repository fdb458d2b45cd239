"""The pair predictor: each co-runner's normalised speed (throughput shared / alone) from the
jobs' own solo telemetry, learning per-job corrections from the site's co-runs.

**Inputs per job** (a *profile*, a mapping): ``gpu_util_pct`` and ``mem_util_pct`` (means over
the run: SM busy and memory-controller busy, NVML), optional ``gpu_util_max_pct`` and
``mem_util_max_pct`` (peaks), ``mem_used_mib`` (peak GPU memory) and ``mem_total_mib`` (the
GPU's memory). Where a mean is missing it is taken as ``MEAN_PER_PEAK`` times the peak; where
memory-controller use is missing altogether, as ``MEM_PER_SM`` times the SM demand.

**The prior: a contention model with four non-negative parameters.** On a time-sliced GPU
(gres/shard: no MPS) a job waits whenever it needs the GPU while a partner holds it, and
concurrent kernels compete for memory bandwidth. Job ``a``'s slowdown (ISD = 1 / speed - 1)
next to partners ``B`` is

    ISD_a = sum over b in B of  (alpha * u_b  +  alpha_own * u_a * u_b  +  beta * m_a * m_b)
            + gamma * max(0, u_a + sum_b u_b - 1)

with ``u`` the SM demand (mean utilisation, a fraction) and ``m`` the memory-controller demand:
a partner's busy time, weighted by how exposed ``a`` is, plus a penalty once the GPU demand sums
beyond 100%. Every term is non-decreasing in every partner's demand and the parameters are
non-negative, so a busier partner never predicts a faster job (monotone by construction); it is
defined for a job next to a copy of itself and for any number of co-runners. The parameters are
fitted by non-negative least squares on ISD with each data set weighted equally (so no one GPU's
contention level dominates); the recommended margin is calibrated on the same data.

**Learning from the site's co-runs.** Each job (a key: a fingerprint in the daemon, a name in the
CLI) gets two corrections in log space: ``suffers`` (how much more than the prior it slows down)
and ``hurts`` (how much more it slows its partners). A measured pair gives residuals
``log((ISD + eps) / (ISD_prior + eps))`` for each side; corrections are the ridge solution
``r_ab ~ suffers_a + hurts_b`` with penalty ``shrinkage`` per correction (with ``n``
observations a correction moves ``n / (n + shrinkage)`` of the way to the data), so they shrink
towards the prior. A partner's term is multiplied by ``exp(suffers_a + hurts_b)``.

**Recommending a pair.** Both jobs fit in memory together, and each side's *pessimistic* speed,
``1 / (1 + margin * ISD)``, is at least the threshold (0.7). ``margin`` is the smallest factor
that keeps the share of recommended training pairs with a side measured below the threshold at or
under ``max_bad_rate``.

Data (fitted only on ``slurm_gpushare/data``, copies of the public sets in ``../shared/data``):
Gavel's measured pairs on K80, P100 and V100 (telemetry: the Amdahl utilisation proxy derived
from isolated throughputs, see ``knowledge.py``; no memory-controller figure) and Ray et al.'s 34
pairs on a P100 (peak utilisation and peak memory access per job). ``bench/pairs_eval.py``
evaluates it leaving one data set out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import nnls
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

DEFAULT_THRESHOLD = 0.7
# Mean / peak utilisation where only the peak is known (alnair's 49 runs: median mean/peak SM
# utilisation 0.17, memory 0.19; 0.5 errs towards more contention, the safe side).
MEAN_PER_PEAK = 0.5
# Memory-controller demand per unit of SM demand where it was not measured (alnair: median
# ratio of mean memory to mean SM utilisation 0.43).
MEM_PER_SM = 0.5
EPS = 0.05  # ISD offset for log residuals: a 0% slowdown is not an infinite ratio
MIN_SPEED = 0.02
PARAMETERS = ("alpha", "alpha_own", "beta", "gamma")


@dataclass(frozen=True)
class Demand:
    """A job's SM (``sm``) and memory-controller (``mem``) demand, fractions of one GPU."""

    sm: float
    mem: float


def _number(value) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def demand_of(profile: Mapping[str, Any]) -> Demand:
    """Mean SM and memory-controller demand of a profile (see the module text)."""
    def mean_of(mean_key: str, peak_key: str) -> float | None:
        mean = _number(profile.get(mean_key))
        if mean is None:
            peak = _number(profile.get(peak_key))
            mean = None if peak is None else MEAN_PER_PEAK * peak
        return None if mean is None else min(max(mean, 0.0), 100.0) / 100.0

    sm = mean_of("gpu_util_pct", "gpu_util_max_pct")
    mem = mean_of("mem_util_pct", "mem_util_max_pct")
    if sm is None and mem is None:
        raise ValueError("a profile needs gpu_util_pct (or gpu_util_max_pct)")
    if sm is None:
        sm = min(1.0, mem / MEM_PER_SM)
    if mem is None:
        mem = MEM_PER_SM * sm
    return Demand(sm, mem)


def pair_terms(own: Demand, partner: Demand) -> np.ndarray:
    """Per-partner terms of the model (multiplied by alpha, alpha_own, beta)."""
    return np.array([partner.sm, own.sm * partner.sm, own.mem * partner.mem])


def overload(own: Demand, partners: Sequence[Demand]) -> float:
    """GPU demand beyond 100% (the gamma term)."""
    return max(0.0, own.sm + sum(p.sm for p in partners) - 1.0)


def fits_memory(profiles: Sequence[Mapping[str, Any]]) -> bool | None:
    """Whether the jobs' memory fits together on one GPU of the smallest memory among them;
    None when a figure is missing."""
    used = [_number(p.get("mem_used_mib")) for p in profiles]
    totals = [_number(p.get("mem_total_mib")) for p in profiles]
    if None in used or None in totals:
        return None
    return sum(used) <= min(totals)


class PairSpeedModel(BaseEstimator):
    """The contention prior plus per-job corrections (scikit-learn style).

    ``fit(sides)``: a frame with one row per (job, co-runner) side: ``own_sm, own_mem,
    other_sm, other_mem, speed`` and optional ``group`` (the data set; groups weigh equally).
    ``learn(coruns, profiles)`` adds per-job corrections from measured co-runs.
    ``predict_group([profile, ...], keys)`` gives each co-runner's speed.
    """

    def __init__(self, *, threshold: float = DEFAULT_THRESHOLD, max_bad_rate: float = 0.01,
                 shrinkage: float = 2.0, random_state: int | None = 0):
        self.threshold = threshold
        self.max_bad_rate = max_bad_rate
        self.shrinkage = shrinkage
        self.random_state = random_state

    # -- the prior ------------------------------------------------------------------------
    def fit(self, sides: pd.DataFrame, y=None) -> "PairSpeedModel":
        own = [Demand(s, m) for s, m in zip(sides["own_sm"], sides["own_mem"])]
        other = [Demand(s, m) for s, m in zip(sides["other_sm"], sides["other_mem"])]
        X = np.array([[*pair_terms(o, p), overload(o, [p])] for o, p in zip(own, other)])
        isd = 1.0 / np.clip(sides["speed"].to_numpy(float), MIN_SPEED, 1.0) - 1.0
        groups = sides["group"].to_numpy() if "group" in sides else np.zeros(len(sides))
        counts = pd.Series(groups).map(pd.Series(groups).value_counts()).to_numpy(float)
        weight = np.sqrt(1.0 / counts)  # every data set weighs the same in total
        coef, _ = nnls(X * weight[:, None], isd * weight)
        self.coef_ = coef
        self.suffers_: dict[str, float] = {}
        self.hurts_: dict[str, float] = {}
        self.margin_ = self._calibrate(X @ coef, sides["speed"].to_numpy(float), sides)
        self.n_train_ = len(sides)
        return self

    def _calibrate(self, isd_pred: np.ndarray, speed: np.ndarray, sides: pd.DataFrame) -> float:
        """The smallest margin (on a grid) whose recommended training pairs have at most
        ``max_bad_rate`` with a side below the threshold; pairs are keyed by ``pair`` where
        given, else every side is its own pair."""
        pair = sides["pair"].to_numpy() if "pair" in sides else np.arange(len(sides))
        frame = pd.DataFrame({"pair": pair, "isd": isd_pred, "speed": speed})
        worst = frame.groupby("pair").agg(isd=("isd", "max"), speed=("speed", "min"))
        for margin in np.round(np.arange(1.0, 6.01, 0.05), 2):
            ok = 1.0 / (1.0 + margin * worst["isd"]) >= self.threshold
            if not ok.any() or (worst["speed"][ok] < self.threshold).mean() <= self.max_bad_rate:
                return float(margin)
        return 6.0

    # -- per-job corrections --------------------------------------------------------------
    def learn(self, coruns: Iterable[tuple[str, str, float | None, float | None]],
              profiles: Mapping[str, Mapping[str, Any]]) -> "PairSpeedModel":
        """Per-job corrections from measured co-runs ``(job_a, job_b, speed_a, speed_b)``
        (a speed may be None: that side was not measured); ``profiles`` maps job keys to
        profiles. Replaces earlier corrections (the co-runs given are the whole evidence)."""
        check_is_fitted(self, "coef_")
        obs: list[tuple[str, str, float]] = []
        for a, b, speed_a, speed_b in coruns:
            if a not in profiles or b not in profiles:
                continue
            da, db = demand_of(profiles[a]), demand_of(profiles[b])
            sides = [(a, b, da, db, speed_a)] + ([] if a == b else [(b, a, db, da, speed_b)])
            for own, other, d_own, d_other, speed in sides:
                speed = _number(speed)
                if speed is None:
                    continue
                isd = 1.0 / min(max(speed, MIN_SPEED), 1.0) - 1.0
                prior = self._term(d_own, d_other) + self.coef_[3] * overload(d_own, [d_other])
                obs.append((own, other, math.log((isd + EPS) / (prior + EPS))))
        suffers: dict[str, float] = {}
        hurts: dict[str, float] = {}
        for _ in range(10):  # alternating ridge updates; converges in a few rounds
            totals: dict[str, list[float]] = {}
            for own, other, r in obs:
                totals.setdefault(own, []).append(r - hurts.get(other, 0.0))
            suffers = {k: sum(v) / (len(v) + self.shrinkage) for k, v in totals.items()}
            totals = {}
            for own, other, r in obs:
                totals.setdefault(other, []).append(r - suffers.get(own, 0.0))
            hurts = {k: sum(v) / (len(v) + self.shrinkage) for k, v in totals.items()}
        self.suffers_, self.hurts_ = suffers, hurts
        return self

    # -- prediction -----------------------------------------------------------------------
    def _term(self, own: Demand, partner: Demand) -> float:
        return float(pair_terms(own, partner) @ self.coef_[:3])

    def predict_isd(self, profiles: Sequence[Mapping[str, Any]],
                    keys: Sequence[str | None] | None = None) -> list[float]:
        """Each co-runner's predicted slowdown (ISD) in a group of two or more."""
        check_is_fitted(self, "coef_")
        demands = [demand_of(p) for p in profiles]
        keys = list(keys) if keys is not None else [None] * len(profiles)
        out = []
        for i, own in enumerate(demands):
            partners = [d for j, d in enumerate(demands) if j != i]
            total = self.coef_[3] * overload(own, partners)
            for j, partner in enumerate(demands):
                if j == i:
                    continue
                factor = math.exp(self.suffers_.get(keys[i], 0.0) + self.hurts_.get(keys[j], 0.0))
                # Corrections scale the partner's term in log(ISD + eps) space, as learned.
                total += max(0.0, (self._term(own, partner) + EPS) * factor - EPS)
            out.append(total)
        return out

    def predict_group(self, profiles: Sequence[Mapping[str, Any]],
                      keys: Sequence[str | None] | None = None) -> list[float]:
        """Each co-runner's predicted normalised speed (1.0: no slowdown)."""
        return [1.0 / (1.0 + d) for d in self.predict_isd(profiles, keys)]

    def safe_speeds(self, profiles: Sequence[Mapping[str, Any]],
                    keys: Sequence[str | None] | None = None) -> list[float]:
        """Pessimistic speeds (ISD times the calibrated margin), for recommending."""
        return [1.0 / (1.0 + self.margin_ * d) for d in self.predict_isd(profiles, keys)]

    def recommend(self, profiles: Sequence[Mapping[str, Any]],
                  keys: Sequence[str | None] | None = None) -> bool:
        """Whether the jobs may share one GPU: memory fits (or is unknown) and every side's
        pessimistic speed is at least the threshold."""
        if fits_memory(profiles) is False:
            return False
        return bool(min(self.safe_speeds(profiles, keys)) >= self.threshold)

    def predict_pairs(self, profiles: Sequence[Mapping[str, Any]],
                      keys: Sequence[str]) -> list[dict[str, Any]]:
        """One row per unordered pair of ``profiles`` including each job with itself, in input
        order: ``job_a, job_b, pred_speed_a, pred_speed_b, fits_memory, recommended``."""
        rows = []
        indices = list(range(len(profiles)))
        pairs = [(i, i) for i in indices] + list(combinations(indices, 2))
        for i, j in sorted(pairs):
            group, names = [profiles[i], profiles[j]], [keys[i], keys[j]]
            speed_a, speed_b = self.predict_group(group, names)
            fits = fits_memory(group)
            rows.append({"job_a": keys[i], "job_b": keys[j], "pred_speed_a": round(speed_a, 4),
                         "pred_speed_b": round(speed_b, 4), "fits_memory": fits,
                         "recommended": self.recommend(group, names)})
        return rows


# -- training data ---------------------------------------------------------------------------
def training_sides() -> pd.DataFrame:
    """One row per measured side of every usable pair in the packaged data sets, with columns
    ``group`` (data set), ``pair``, ``job``, ``other``, ``own_sm``, ``own_mem``, ``other_sm``,
    ``other_mem``, ``speed``. Gavel: failed pairs ([0, 0]) and V100 pairs filled in with the
    alone throughput are dropped; a self-pair counts once."""
    rows = []
    for name, pairs, profiles in data_sets():
        for k, (a, b, speed_a, speed_b) in enumerate(pairs):
            da, db = demand_of(profiles[a]), demand_of(profiles[b])
            sides = [(a, b, da, db, speed_a)] + ([] if a == b else [(b, a, db, da, speed_b)])
            for own, other, d_own, d_other, speed in sides:
                rows.append({"group": name, "pair": f"{name}:{k}", "job": own, "other": other,
                             "own_sm": d_own.sm, "own_mem": d_own.mem, "other_sm": d_other.sm,
                             "other_mem": d_other.mem, "speed": float(speed)})
    return pd.DataFrame(rows)


@lru_cache(maxsize=1)
def _data_sets() -> tuple:
    from slurm_gpushare.predict.knowledge import (GAVEL_MEM_MIB, alnair_pairs, gavel_pairs,
                                                  gavel_profiles, speed_of)

    out = []
    util = gavel_profiles().set_index(["gpu", "job"])["gpu_util_pct"]
    raw = gavel_pairs()
    usable = raw[~raw["infeasible_zero"] & ~raw["a_equals_alone"] & ~raw["b_equals_alone"]]
    for gpu, frame in usable.groupby("gpu"):
        profiles = {job: {"gpu_util_pct": float(util[(gpu, job)]),
                          "mem_total_mib": GAVEL_MEM_MIB[gpu]}
                    for job in set(frame["job_a"]) | set(frame["job_b"])}
        pairs = list(zip(frame["job_a"], frame["job_b"], frame["norm_a"], frame["norm_b"]))
        out.append((f"gavel-{gpu}", tuple(pairs), profiles))
    alnair = alnair_pairs()
    profiles, pairs = {}, []
    for r in alnair.itertuples(index=False):
        a, b = f"{r.task_a}/{r.bs_a}", f"{r.task_b}/{r.bs_b}"
        profiles[a] = {"gpu_util_max_pct": r.MGUP_a, "mem_util_max_pct": r.MGTSAMP_a,
                       "mem_total_mib": GAVEL_MEM_MIB["p100"]}
        profiles[b] = {"gpu_util_max_pct": r.MGUP_b, "mem_util_max_pct": r.MGTSAMP_b,
                       "mem_total_mib": GAVEL_MEM_MIB["p100"]}
        pairs.append((a, b, speed_of(r.isd_a), speed_of(r.isd_b)))
    out.append(("alnair-p100", tuple(pairs), profiles))
    return tuple(out)


def data_sets() -> list[tuple[str, list[tuple[str, str, float, float]], dict[str, dict]]]:
    """``(name, pairs, profiles)`` per packaged data set: pairs as ``(job_a, job_b, speed_a,
    speed_b)``, profiles by job name."""
    return [(name, list(pairs), {k: dict(v) for k, v in profiles.items()})
            for name, pairs, profiles in _data_sets()]


@lru_cache(maxsize=1)
def _default_model() -> PairSpeedModel:
    return PairSpeedModel().fit(training_sides())


def default_model() -> PairSpeedModel:
    """The prior fitted on every packaged data set (once per process); a fresh copy with no
    corrections each call."""
    fitted = _default_model()
    model = PairSpeedModel(**fitted.get_params())
    model.coef_, model.margin_, model.n_train_ = fitted.coef_.copy(), fitted.margin_, fitted.n_train_
    model.suffers_, model.hurts_ = {}, {}
    return model
