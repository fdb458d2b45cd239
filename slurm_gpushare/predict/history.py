"""What a job's own history says about its next run: a ``policy.JobEstimate``.

History is the telemetry summaries of the job's earlier runs, found in the store by its keyed
fingerprint (exact script, then job name, then user). From them: the OOM-safe peak memory on
every configured GPU type (observed peaks per type, carried to other types by the cross-type
predictor, plus its calibrated margin), the run time per type, and the interference class.
Nothing here looks at the job's model, data or hyper-parameters: only NVML telemetry.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, defaultdict
from typing import Any, Mapping, Sequence

from slurm_gpushare.core.config import Config
from slurm_gpushare.core.policy import JobEstimate


def observed_peaks(history: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Peak MiB per GPU model from the runs matched by the most specific key.

    Runs that never touched the GPU (peak 0: a job that held it but ran nothing on it) say
    nothing about the job's need and are skipped.
    """
    usable = [s for s in history if (s.get("mgmap_max_mib") or 0) > 0 and s.get("gpu_model")]
    if not usable:
        return {}
    best = min(s.get("matched_key", 0) for s in usable)
    peaks: dict[str, list[float]] = defaultdict(list)
    for summary in usable:
        if summary.get("matched_key", 0) == best:
            peaks[summary["gpu_model"]].append(float(summary["mgmap_max_mib"]))
    return dict(peaks)


# A peak at this share of the GPU's memory (as NVML measured it) means the framework grabbed
# the memory up front (TensorFlow, JAX) rather than needing it.
PREALLOC_PCT = 95.0


def preallocated(history: Sequence[Mapping[str, Any]]) -> str:
    """Why the job looks like a pre-allocating framework, or "" if it does not."""
    for summary in history:
        pct = summary.get("mgmap_max_pct")
        if pct is not None and pct >= PREALLOC_PCT:
            return (f"its peak was {pct:.0f}% of a {summary.get('gpu_model') or 'GPU'}"
                    f" ({(summary.get('mgmap_max_mib') or 0) / 1024:.1f} GiB)")
    return ""


def config_type_of(gpu_model: str, config: Config) -> str | None:
    """The configured GPU type name of an NVML/catalogue model name, if any."""
    from slurm_gpushare.core.gpus import default_catalogue

    configured = default_catalogue().configured_type(gpu_model, config.gpu_types)
    return configured.name if configured is not None else None


def observed_runtimes(history: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Median duration per GPU model of the runs that did not share their GPU."""
    durations: dict[str, list[float]] = defaultdict(list)
    for summary in history:
        if summary.get("gpu_model") and summary.get("duration_s") and not summary.get("coruns"):
            durations[summary["gpu_model"]].append(float(summary["duration_s"]))
    return {model: sorted(values)[len(values) // 2] for model, values in durations.items()}


class HistoryEstimator:
    """Builds estimates for the daemon; thread-safe. Estimates are cached per set of keys
    until a run under one of those keys is learned (``invalidate_keys``): a new run of one
    script leaves every other script's estimate warm."""

    CACHE_SIZE = 20_000  # entries (a few KB each); the oldest go first

    def __init__(self, store, *, predictor=None, classes=None, runtime=None):
        from slurm_gpushare.predict.classes import default_classes
        from slurm_gpushare.predict.memory import default_predictor
        from slurm_gpushare.predict.runtime import default_runtime

        self.store = store
        self.predictor = predictor or default_predictor()
        self.classes = classes or default_classes()
        self.runtime = runtime or default_runtime()
        self._cache: OrderedDict[tuple, tuple[JobEstimate | None, str]] = OrderedDict()
        # Bumped by every invalidation: an estimate computed while one happened is not cached
        # (it may have read the store before the learned run was committed).
        self._generation = 0
        self._by_key: dict[str, set[tuple]] = defaultdict(set)  # fingerprint key -> cache keys
        self._lock = threading.Lock()

    def set_classes(self, classes=None) -> None:
        """Use another fitted class model (None: the packaged default)."""
        from slurm_gpushare.predict.classes import default_classes

        self.classes = classes or default_classes()
        self.invalidate()

    def set_predictor(self, predictor=None) -> None:
        """Use another fitted memory predictor (None: the packaged default)."""
        from slurm_gpushare.predict.memory import default_predictor

        self.predictor = predictor or default_predictor()
        self.invalidate()

    def invalidate(self) -> None:
        """Forget every estimate (the predictor or the classes changed)."""
        with self._lock:
            self._cache.clear()
            self._by_key.clear()
            self._generation += 1

    def invalidate_keys(self, keys: Sequence[str]) -> None:
        """Forget the estimates that read the history of any of ``keys``."""
        with self._lock:
            self._generation += 1
            for key in keys:
                for cache_key in self._by_key.pop(key, ()):
                    self._cache.pop(cache_key, None)

    def estimate(self, keys: Sequence[str], config: Config,
                 hint_mib: int | None = None) -> tuple[JobEstimate | None, str]:
        """``(estimate, why)``; the estimate is None when the job has no usable history.

        ``keys`` are the job's exact-script and job-name keys, most specific first. Never the
        user-only key: a user's other jobs say nothing reliable about this one's memory.
        """
        cache_key = (tuple(keys), hint_mib, id(config))
        with self._lock:
            if cache_key in self._cache:
                self._cache.move_to_end(cache_key)
                return self._cache[cache_key]
            generation = self._generation
        result = self._estimate(keys, config, hint_mib)
        with self._lock:
            if generation == self._generation:
                self._cache[cache_key] = result
                for key in cache_key[0]:
                    self._by_key[key].add(cache_key)
                if len(self._cache) > self.CACHE_SIZE:
                    oldest, _ = self._cache.popitem(last=False)
                    for key in oldest[0]:
                        entries = self._by_key.get(key)
                        if entries is not None:
                            entries.discard(oldest)
                            if not entries:
                                del self._by_key[key]
        return result

    def _estimate(self, keys, config, hint_mib) -> tuple[JobEstimate | None, str]:
        from slurm_gpushare.predict.knowledge import class_of_history
        from slurm_gpushare.predict.memory import estimate_memory

        history = self.store.history(list(keys)) if any(keys) else []
        peaks = observed_peaks(history)
        if not peaks:
            return None, "no earlier run with GPU telemetry"
        job_class, class_detail = class_of_history(self.classes, history)
        grabbed = preallocated(history)
        if grabbed:
            if hint_mib:  # the user's hint is all that can size it: the policy's hint path
                return None, f"{grabbed}; sized from the memory hint"
            why = f"{grabbed}: the framework pre-allocates, so its need is unknown"
            return JobEstimate(source="history", memory_mib={}, job_class=job_class,
                               detail=why), why
        verdict = estimate_memory(peaks, config.gpu_types, self.predictor, hint_mib=hint_mib)
        if not verdict.known:
            return JobEstimate(source="history", memory_mib={}, job_class=job_class,
                               detail=verdict.reason), verdict.reason
        runtime_s = self._runtimes(history, config)
        estimate = verdict.job_estimate(runtime_s=runtime_s or None, job_class=job_class)
        # The verdict says the peaks seen, by GPU model, and the margins added to them.
        detail = f"history: {estimate.detail}"
        if job_class is not None:
            detail += f"; {class_detail.split(' (')[0]}"
        best = min(h.get("matched_key", 0) for h in history)
        utils = [s["mgup_max"] for s in history if s.get("mgup_max") is not None
                 and s.get("matched_key", 0) == best]
        estimate = JobEstimate(source="history", memory_mib=estimate.memory_mib,
                               runtime_s=estimate.runtime_s, job_class=job_class, detail=detail,
                               excluded=verdict.excluded,
                               util_pct=max(utils) if utils else None)
        return estimate, detail

    def _runtimes(self, history, config) -> dict[str, float]:
        """Predicted run time per configured type from the job's solo runs (catalogue models)."""
        from slurm_gpushare.core.gpus import default_catalogue

        catalogue = default_catalogue()
        observed = {}
        for name, seconds in observed_runtimes(history).items():
            try:
                observed[catalogue.lookup(name).model] = seconds
            except KeyError:
                continue
        out = {}
        for gpu_type in config.gpu_types if observed else ():
            try:
                target = catalogue.for_gpu_type(gpu_type).model
                out[gpu_type.name] = float(self.runtime.predict_runtime(observed, target))
            except (KeyError, ValueError):
                continue
        return out
