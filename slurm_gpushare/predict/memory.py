"""Privacy-preserving GPU memory prediction across GPU types, with OOM-safe margins.

From a job's observed peak GPU memory on one or more GPU types (its own earlier runs, sampled
through NVML) predict its peak on another type, without looking at the model, data or
hyper-parameters. The structure that makes this work: a peak is a part fixed per GPU type
(CUDA context, cuDNN/cuBLAS handles and workspaces, allocator granularity) plus a part that
scales with the job's tensors, and that scaling part is nearly the same on every type. So for
each ordered pair of types (A, B) we fit, robustly, ``peak_B - peak_A = a_AB + b_AB * peak_A``
(an offset plus a small scale correction); a Huber fit keeps the few jobs whose cuDNN picks
a different algorithm on one type from bending the line for all others.

Several observations are combined by a weighted mean (weights from each pair's residual scale).
The margin is split-conformal: relative errors of predictions made for jobs held out of the
fit (cross-fitting by job group) give an upper quantile per (target type, observed types), so
a job observed on more types, or on the target type itself, gets a smaller margin.

A type the training data lacks is mapped to the nearest trained type (same architecture, else
nearest compute capability, then SM count) and gets an extra margin (``unseen_type_margin``).

The fit is ``estimators.CrossTypeMemoryPredictor`` (scikit-learn conventions, pandas); what it
produces, and what the daemon loads (the packaged fit or the site's ``models fit``, JSON), is
``MemoryModel`` here, numpy only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import numpy as np

from slurm_gpushare.core.gpus import Catalogue, GpuSpec, UnknownGpu, default_catalogue
from slurm_gpushare.predict.datasets import load_schedtune
from slurm_gpushare.predict.persist import packaged_fit

if TYPE_CHECKING:
    import pandas as pd

    from slurm_gpushare.predict.estimators import CrossTypeMemoryPredictor

MIB_PER_GIB = 1024
MEMORY_FORMAT = "slurm-gpushare/memory-predictor/1"

def observations_from_schedtune(frame: pd.DataFrame) -> pd.DataFrame:
    """The long table the predictor trains on: job, group, gpu, peak_mib (measured rows)."""
    import pandas as pd

    rows = frame[frame.fits]
    return pd.DataFrame({"job": rows.job, "group": rows.model, "gpu": rows.gpu,
                         "peak_mib": rows.peak_mib.astype(float)}).reset_index(drop=True)


def _huber_line(x: np.ndarray, y: np.ndarray, delta: float, iters: int = 30) -> np.ndarray:
    """Intercept and slope of y ~ x by iteratively reweighted least squares (Huber loss)."""
    weights = np.ones_like(y)
    intercept = slope = 0.0
    for _ in range(iters):
        sw = weights.sum()
        mx, my = (weights * x).sum() / sw, (weights * y).sum() / sw
        sxx = (weights * (x - mx) ** 2).sum()
        slope = (weights * (x - mx) * (y - my)).sum() / sxx if sxx > 0 else 0.0
        intercept = my - slope * mx
        resid = y - intercept - slope * x
        scale = max(1.4826 * np.median(np.abs(resid - np.median(resid))), 1e-6)
        ratio = np.abs(resid) / (delta * scale)
        new = np.where(ratio <= 1, 1.0, 1.0 / np.maximum(ratio, 1e-12))
        if np.allclose(new, weights):
            break
        weights = new
    return np.array([intercept, slope])


def conformal_upper(residuals: Sequence[float], coverage: float) -> float:
    """Split-conformal upper bound of relative under-prediction (>= 0).

    The ceil((n+1)*coverage)-th smallest residual; beyond n it is capped at the largest
    (coverage n/(n+1), the most n calibration points can promise).
    """
    values = np.sort(np.asarray(residuals, dtype=float))
    if values.size == 0:
        return math.inf
    rank = min(math.ceil((values.size + 1) * coverage), values.size)
    return max(float(values[rank - 1]), 0.0)


@dataclass(frozen=True)
class PairTransfer:
    """``peak_B = peak_A + intercept + slope * clip(peak_A, lo, hi)`` (MiB)."""

    intercept: float
    slope: float
    lo: float
    hi: float
    scale: float  # robust relative residual scale, for combining sources
    n: int

    def predict(self, peak: np.ndarray | float) -> np.ndarray | float:
        # Outside the training range keep the edge's offset: no extrapolated slope.
        return peak + self.intercept + self.slope * np.clip(peak, self.lo, self.hi)


@dataclass(frozen=True)
class PeakPrediction:
    model: str  # catalogue model of the target
    mean_mib: float
    margin: float  # relative: safe = mean * (1 + margin)
    basis: str  # e.g. "same type, 3 runs" or "from V100-16GB+RTX3090"

    @property
    def safe_mib(self) -> float:
        return self.mean_mib * (1 + self.margin)


def _pair_key(sources: Iterable[str]) -> str:
    return "+".join(sorted(sources))


class MemoryModel:
    """The fitted cross-type memory predictor as plain data, numpy only: what the daemon loads
    (``estimators.CrossTypeMemoryPredictor.fit`` produces it and predicts through it).

    ``params``: the estimator's parameters (those prediction reads: ``max_sources``,
    ``same_type_margin``, ``unseen_type_margin``); ``types``: the trained catalogue models;
    ``pairs``: a ``PairTransfer`` per ordered pair of types; ``margins``: per (target, observed
    types); ``margin_by_count``: per number of observed types (the fallback).
    """

    def __init__(self, *, params: Mapping, types: Sequence[str],
                 pairs: Mapping[tuple[str, str], PairTransfer],
                 margins: Mapping[tuple[str, str], float], margin_by_count: Mapping[int, float],
                 n_jobs: int, catalogue: Catalogue | None = None):
        self.params = dict(params)
        self.types = list(types)
        self.pairs = dict(pairs)
        self.margins = dict(margins)
        self.margin_by_count = dict(margin_by_count)
        self.n_jobs = n_jobs
        self.catalogue = catalogue

    def _catalogue(self) -> Catalogue:
        return self.catalogue or default_catalogue()

    @staticmethod
    def combine(pairs: Mapping[tuple[str, str], PairTransfer], peaks: Mapping[str, np.ndarray],
                target: str):
        """Weighted mean of the per-source predictions (vectorised over jobs); None when a
        source has no transfer towards ``target``."""
        total, weight = 0.0, 0.0
        for source, peak in peaks.items():
            transfer = pairs.get((source, target))
            if transfer is None:
                return None
            w = 1.0 / transfer.scale ** 2
            total = total + w * transfer.predict(peak)
            weight += w
        return total / weight

    # -- prediction ----------------------------------------------------------------------
    def _trained_proxy(self, model: str) -> str:
        """The trained type nearest to ``model``: same architecture, then compute capability,
        then SM count (the CUDA context and library workspaces follow the architecture)."""
        if model in self.types:
            return model
        catalogue = self._catalogue()
        spec = catalogue.lookup(model)

        def distance(name: str) -> tuple[bool, float, float]:
            other = catalogue.lookup(name)
            return (spec.architecture != other.architecture, abs(spec.cc - other.cc),
                    abs(math.log(spec.sm_count / other.sm_count)))
        return min(self.types, key=distance)

    def predict_peak(self, observed: Mapping[str, float | Sequence[float]],
                     target: str) -> PeakPrediction:
        """Predicted peak and margin on catalogue model ``target`` from ``{model: peak(s)}``."""
        runs = {model: np.atleast_1d(np.asarray(peaks, dtype=float))
                for model, peaks in observed.items()}
        runs = {m: r for m, r in runs.items() if r.size}
        if not runs:
            raise ValueError("no observed peak")
        if target in runs:
            peaks = runs[target]
            spread = float(peaks.max() / peaks.min() - 1) if peaks.size > 1 else 0.0
            return PeakPrediction(target, float(peaks.max()),
                                  max(self.params["same_type_margin"], spread),
                                  f"same type, {peaks.size} run(s)")
        proxy_target = self._trained_proxy(target)
        proxies: dict[str, float] = {}
        for model, peaks in runs.items():
            proxy = self._trained_proxy(model)
            proxies[proxy] = max(proxies.get(proxy, 0.0), float(peaks.max()))
        unseen = proxy_target != target or any(self._trained_proxy(m) != m for m in runs)
        extra = self.params["unseen_type_margin"] if unseen else 0.0
        if proxy_target in proxies:
            # A source stands for the same trained type as the target: nothing to transfer.
            return PeakPrediction(target, proxies[proxy_target],
                                  self.params["same_type_margin"] + extra,
                                  f"like {proxy_target} (nearest trained type)")
        usable = {s: p for s, p in proxies.items() if (s, proxy_target) in self.pairs}
        if not usable:
            raise ValueError(f"no transfer learned towards {proxy_target}")
        # Keep the most informative sources when more were observed than calibrated for.
        chosen = sorted(usable, key=lambda s: self.pairs[(s, proxy_target)].scale)
        chosen = chosen[: self.params["max_sources"]]
        mean = float(self.combine(self.pairs, {s: np.array([usable[s]]) for s in chosen},
                                   proxy_target)[0])
        key = (proxy_target, _pair_key(chosen))
        margin = self.margins.get(key, self.margin_by_count.get(
            len(chosen), max(self.margin_by_count.values())))
        basis = f"from {'+'.join(sorted(chosen))}"
        if unseen:
            basis += f" via {proxy_target} (nearest trained type)"
        return PeakPrediction(target, mean, margin + extra, basis)

    # -- persistence (the packaged default: persist.packaged_fit) --------------------------
    def to_dict(self) -> dict:
        """The fitted state as plain data (JSON-able)."""
        return {
            "format": MEMORY_FORMAT,
            "params": dict(self.params),
            "types": list(self.types),
            "pairs": [{"source": a, "target": b, **asdict(t)}
                      for (a, b), t in sorted(self.pairs.items())],
            "margins": [{"target": t, "sources": key, "margin": m}
                        for (t, key), m in sorted(self.margins.items())],
            "margin_by_count": {str(k): v for k, v in self.margin_by_count.items()},
            "n_jobs": self.n_jobs,
        }

    @classmethod
    def from_dict(cls, data: Mapping, catalogue: Catalogue | None = None) -> "MemoryModel":
        if not isinstance(data, Mapping) or data.get("format") != MEMORY_FORMAT:
            found = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(f"not a memory predictor (format {found!r})")
        return cls(
            params=data["params"], types=data["types"],
            pairs={(p["source"], p["target"]): PairTransfer(
                float(p["intercept"]), float(p["slope"]), float(p["lo"]), float(p["hi"]),
                float(p["scale"]), int(p["n"])) for p in data["pairs"]},
            margins={(m["target"], m["sources"]): float(m["margin"]) for m in data["margins"]},
            margin_by_count={int(k): float(v) for k, v in data["margin_by_count"].items()},
            n_jobs=int(data["n_jobs"]), catalogue=catalogue)


# -- OOM-safe estimate per configured GPU type ---------------------------------------------

@dataclass(frozen=True)
class TypeEstimate:
    gpu_type: str  # config type name
    model: str
    predicted_mib: float
    margin: float
    safe_mib: float
    shards: int  # GiB, what the share asks for
    fits: bool
    reason: str


@dataclass(frozen=True)
class MemoryVerdict:
    """What is known about a job's GPU memory, per configured GPU type."""

    known: bool
    reason: str
    source: str = "history"  # "history", "hint" or "unknown"
    per_type: Mapping[str, TypeEstimate] = field(default_factory=dict)

    @property
    def safe_mib(self) -> dict[str, float]:
        """Safe peak per type where the job fits (what ``JobEstimate.memory_mib`` holds)."""
        return {name: e.safe_mib for name, e in self.per_type.items() if e.fits}

    @property
    def excluded(self) -> dict[str, str]:
        return {name: e.reason for name, e in self.per_type.items() if not e.fits}

    def job_estimate(self, runtime_s: Mapping[str, float] | None = None,
                     job_class: int | None = None):
        """The policy's ``JobEstimate`` (None when the memory is unknown)."""
        from slurm_gpushare.core.policy import JobEstimate  # late: policy may import this module

        if not self.known:
            return None
        return JobEstimate(source=self.source, memory_mib=self.safe_mib,
                           runtime_s=dict(runtime_s or {}), job_class=job_class,
                           detail=self.reason)


def _capacity_mib(gpu_type, spec: GpuSpec) -> float:
    return min(gpu_type.memory_gib * MIB_PER_GIB, spec.usable_mib)


def estimate_memory(observed: Mapping[str, float | Sequence[float]], gpu_types: Sequence,
                    predictor: MemoryModel | CrossTypeMemoryPredictor, *, catalogue: Catalogue | None = None,
                    hint_mib: float | None = None, hint_margin: float = 0.10,
                    prealloc_fraction: float = 0.95) -> MemoryVerdict:
    """OOM-safe peak and shard count on each configured type from a job's observed peaks.

    ``observed`` maps a config type name (or catalogue model) to the peak(s) in MiB of the
    job's earlier runs there. A peak at ``prealloc_fraction`` of the GPU or more means the
    framework grabbed the memory up front (TensorFlow, JAX): the need is unknown, and only
    the user's hint (``hint_mib``) can size the share.
    """
    catalogue = catalogue or predictor.catalogue or default_catalogue()
    by_name = {g.name: g for g in gpu_types}
    runs: dict[str, list[float]] = {}
    for name, peaks in observed.items():
        peaks = [float(p) for p in np.atleast_1d(peaks)]
        if not peaks:
            continue
        if any(p <= 0 or not math.isfinite(p) for p in peaks):
            raise ValueError(f"peak on {name} must be a positive number of MiB")
        if name in by_name:
            spec = catalogue.for_gpu_type(by_name[name])
            capacity = _capacity_mib(by_name[name], spec)
        elif name in catalogue:
            spec = catalogue.lookup(name)
            capacity = spec.usable_mib
        else:  # a GPU newer than the catalogue: the configured type it stands for, if any
            configured = catalogue.configured_type(name, gpu_types)
            if configured is None:
                continue  # a GPU neither the catalogue nor the configuration knows
            spec = catalogue.for_gpu_type(configured)
            capacity = _capacity_mib(configured, spec)
        if max(peaks) >= prealloc_fraction * capacity:
            why = (f"peak {max(peaks) / MIB_PER_GIB:.1f} GiB on {name} is "
                   f"{max(peaks) / capacity:.0%} of its memory: the framework pre-allocates")
            if hint_mib:
                return _from_hint(hint_mib, hint_margin, gpu_types, catalogue, why)
            return MemoryVerdict(False, why + "; give a memory hint", source="unknown")
        runs.setdefault(spec.model, []).extend(peaks)
    if not runs:
        if hint_mib:
            return _from_hint(hint_mib, hint_margin, gpu_types, catalogue, "no history")
        return MemoryVerdict(False, "no observed peak", source="unknown")

    per_type = {}
    for gpu_type in gpu_types:
        spec = catalogue.for_gpu_type(gpu_type)
        try:
            pred = predictor.predict_peak(runs, spec.model)
        except (ValueError, UnknownGpu) as exc:
            per_type[gpu_type.name] = TypeEstimate(gpu_type.name, spec.model, math.nan,
                                                   math.nan, math.inf, 0, False, str(exc))
            continue
        per_type[gpu_type.name] = _type_estimate(gpu_type, spec, pred.mean_mib, pred.margin,
                                                 pred.basis)
    observed_text = ", ".join(f"{max(p) / MIB_PER_GIB:.1f} GiB on {m}" for m, p in runs.items())
    fitting = [e for e in per_type.values() if e.fits]
    margins = sorted({f"{e.margin:.0%}" for e in fitting})
    reason = f"peak {observed_text}"
    if len(margins) == 1:
        reason += f" + {margins[0]} margin"
    elif margins:  # each type's margin named by its type
        reason += " + margin " + ", ".join(f"{e.gpu_type} {e.margin:.0%}" for e in fitting)
    return MemoryVerdict(True, reason, source="history", per_type=per_type)


def _type_estimate(gpu_type, spec: GpuSpec, mean: float, margin: float,
                   basis: str) -> TypeEstimate:
    safe = mean * (1 + margin)
    shards = max(1, math.ceil(safe / MIB_PER_GIB))
    capacity = _capacity_mib(gpu_type, spec)
    fits = shards <= gpu_type.memory_gib and safe <= capacity
    reason = (f"{safe / MIB_PER_GIB:.1f} GiB safe ({mean / MIB_PER_GIB:.1f} GiB {basis} "
              f"+ {margin:.0%})")
    if not fits:
        reason += f" exceeds {capacity / MIB_PER_GIB:.1f} GiB usable on {gpu_type.name}"
    return TypeEstimate(gpu_type.name, spec.model, mean, margin, safe, shards, fits, reason)


def _from_hint(hint_mib: float, margin: float, gpu_types, catalogue, why: str) -> MemoryVerdict:
    per_type = {g.name: _type_estimate(g, catalogue.for_gpu_type(g), hint_mib, margin,
                                       "user hint") for g in gpu_types}
    return MemoryVerdict(True, f"{why}; memory hint {hint_mib / MIB_PER_GIB:.1f} GiB "
                               f"+ {margin:.0%} margin", source="hint", per_type=per_type)




def default_predictor() -> MemoryModel:
    """The predictor fitted on the packaged SchedTune measurements (until the site has its own),
    as stored in the package (``persist.packaged_fit``: read, not refitted, at each start)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = MemoryModel.from_dict(packaged_fit("memory"))
    return _DEFAULT


def fit_default_predictor() -> CrossTypeMemoryPredictor:
    """What ``default_predictor`` holds, fitted afresh (``persist`` stores it)."""
    from slurm_gpushare.predict.estimators import CrossTypeMemoryPredictor

    return CrossTypeMemoryPredictor().fit(observations_from_schedtune(load_schedtune()))


_DEFAULT: MemoryModel | None = None
