"""Run time per GPU type: from a job's observed run time on one type to the others.

Trained on Gavel's measured isolated throughputs (K80, P100, V100; 26 job types). For each
ordered pair of types the log speed-up ``log(tput_B / tput_A)`` is fitted robustly as a line in
``log tput_A`` (a job's own speed on A says something about how launch- or memory-bound it is);
``method="median"`` is the plain per-pair median ratio. Several observed types are combined by
a weighted geometric mean.

Types outside the training set are mapped through the catalogue: the rule is that speed scales
with ``sqrt(fp32 TFLOPS x memory bandwidth)`` (the geometric mean of the compute and memory
roofs), so a type is reached from the trained type nearest in that proxy and rescaled by the
proxy ratio. This rule is not validated by the training data beyond K80/P100/V100.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from slurm_gpushare.core.gpus import Catalogue, default_catalogue
from slurm_gpushare.predict.memory import _huber_line

def speed_proxy(spec) -> float:
    return math.sqrt(spec.fp32_tflops * spec.memory_bandwidth_gbs)


@dataclass(frozen=True)
class SpeedTransfer:
    """``log(tput_B/tput_A) = intercept + slope * log tput_A``."""

    intercept: float
    slope: float
    scale: float  # robust residual scale of the log ratio
    median: float  # median log ratio, used when the job's throughput is unknown

    def log_ratio(self, log_tput: float | None) -> float:
        if log_tput is None:
            return self.median
        return self.intercept + self.slope * log_tput


class RuntimeTransfer(BaseEstimator):
    """Run time on each GPU type from run times observed on some of them."""

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
        self.types_ = list(wide.columns)
        self.pairs_ = {}
        for a, b in itertools.permutations(self.types_, 2):
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
            self.pairs_[(a, b)] = SpeedTransfer(float(coef[0]), float(coef[1]), scale,
                                                float(np.median(d)))
        return self

    def _catalogue(self) -> Catalogue:
        return self.catalogue or default_catalogue()

    def _anchor(self, model: str) -> tuple[str, float]:
        """Trained type nearest in speed proxy, and log(speed_model / speed_anchor)."""
        if model in self.types_:
            return model, 0.0
        cat = self._catalogue()
        proxy = speed_proxy(cat.lookup(model))
        anchor = min(self.types_, key=lambda t: abs(math.log(proxy / speed_proxy(cat.lookup(t)))))
        return anchor, math.log(proxy / speed_proxy(cat.lookup(anchor)))

    def predict_runtime(self, observed_s: Mapping[str, float], target: str,
                        steps: float | None = None) -> float:
        """Run time (s) on catalogue model ``target`` from ``{model: observed run time (s)}``.

        With the job's step count (``steps``) its throughput on the observed type enters the
        loglinear pair model; without it the pair's median speed-up is used.
        """
        check_is_fitted(self, "pairs_")
        if target in observed_s:
            return float(observed_s[target])
        target_anchor, target_shift = self._anchor(target)
        total, weight = 0.0, 0.0
        for model, seconds in observed_s.items():
            if seconds <= 0:
                raise ValueError(f"run time on {model} must be positive")
            anchor, shift = self._anchor(model)
            # Throughput as if run on the anchor type.
            log_tput = math.log(steps / seconds) - shift if steps else None
            if anchor == target_anchor:
                log_speedup, scale = 0.0, 0.05
            else:
                pair = self.pairs_.get((anchor, target_anchor))
                if pair is None:
                    continue
                log_speedup, scale = pair.log_ratio(log_tput), pair.scale
            log_time = math.log(seconds) + shift - log_speedup - target_shift
            total += log_time / scale ** 2
            weight += 1 / scale ** 2
        if weight == 0:
            raise ValueError(f"no transfer learned towards {target}")
        return math.exp(total / weight)

    def predict_all(self, observed_s: Mapping[str, float], targets, steps=None) -> dict:
        return {t: self.predict_runtime(observed_s, t, steps) for t in targets}


