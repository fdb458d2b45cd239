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

The fit is ``estimators.RuntimeTransfer``; what it produces, and what the daemon loads (the
packaged fit, ``data/models/runtime.json``), is ``RuntimeModel`` here (pure Python).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Mapping

from slurm_gpushare.core.gpus import Catalogue, default_catalogue
from slurm_gpushare.predict.persist import packaged_fit

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


RUNTIME_FORMAT = "slurm-gpushare/runtime-transfer/1"


class RuntimeModel:
    """The fitted run-time transfer as plain data (pure Python): what the daemon loads
    (``estimators.RuntimeTransfer.fit`` produces it and predicts through it). ``params``: the
    estimator's; ``types``: the trained GPU models; ``pairs``: a ``SpeedTransfer`` per ordered
    pair of types."""

    def __init__(self, *, params: Mapping, types, pairs: Mapping[tuple[str, str], SpeedTransfer],
                 catalogue: Catalogue | None = None):
        self.params = dict(params)
        self.types = list(types)
        self.pairs = dict(pairs)
        self.catalogue = catalogue

    def _catalogue(self) -> Catalogue:
        return self.catalogue or default_catalogue()

    def _anchor(self, model: str) -> tuple[str, float]:
        """Trained type nearest in speed proxy, and log(speed_model / speed_anchor)."""
        if model in self.types:
            return model, 0.0
        cat = self._catalogue()
        proxy = speed_proxy(cat.lookup(model))
        anchor = min(self.types, key=lambda t: abs(math.log(proxy / speed_proxy(cat.lookup(t)))))
        return anchor, math.log(proxy / speed_proxy(cat.lookup(anchor)))

    def predict_runtime(self, observed_s: Mapping[str, float], target: str,
                        steps: float | None = None) -> float:
        """Run time (s) on catalogue model ``target`` from ``{model: observed run time (s)}``.

        With the job's step count (``steps``) its throughput on the observed type enters the
        loglinear pair model; without it the pair's median speed-up is used.
        """
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
                pair = self.pairs.get((anchor, target_anchor))
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

    def to_dict(self) -> dict:
        return {"format": RUNTIME_FORMAT, "params": dict(self.params), "types": list(self.types),
                "pairs": [{"source": a, "target": b, **asdict(t)}
                          for (a, b), t in sorted(self.pairs.items())]}

    @classmethod
    def from_dict(cls, data: Mapping, catalogue: Catalogue | None = None) -> "RuntimeModel":
        if not isinstance(data, Mapping) or data.get("format") != RUNTIME_FORMAT:
            found = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(f"not a run-time model (format {found!r})")
        return cls(params=data["params"], types=data["types"], catalogue=catalogue,
                   pairs={(p["source"], p["target"]): SpeedTransfer(
                       float(p["intercept"]), float(p["slope"]), float(p["scale"]),
                       float(p["median"])) for p in data["pairs"]})


def default_runtime() -> RuntimeModel:
    """The transfer fitted on Gavel's isolated throughputs, as stored in the package
    (``persist.packaged_fit``: read, not refitted, at each start)."""
    return RuntimeModel.from_dict(packaged_fit("runtime"))


def fit_default_runtime():
    """What ``default_runtime`` holds, fitted afresh (``persist`` stores it)."""
    from slurm_gpushare.predict.datasets import load_gavel_isolated
    from slurm_gpushare.predict.estimators import RuntimeTransfer

    return RuntimeTransfer().fit(load_gavel_isolated())
