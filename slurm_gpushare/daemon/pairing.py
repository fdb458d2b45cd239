"""The pair predictor as the daemon uses it: job profiles from the store's telemetry, per-job
corrections learned from the store's co-runs, and, per decision, a compatibility that tells
``policy.incompatible_nodes`` which running shares a job should not join.

A job's *profile* is read from the history of its most specific fingerprint key that has
telemetry (the runs that also size its share): mean SM and memory-controller utilisation
averaged over those runs, peaks and memory as their maxima. The same job keeps a small GPU
busier than a large one, so it also has a profile per GPU type it ran on (those runs alone).
Corrections are keyed by that fingerprint key, so what a job was seen to suffer or inflict
follows its next runs: once against its profile over all types, and once per GPU type against
its profile there (``pairs.typed_key``). A share is judged on a GPU type with the profile and
corrections of each job there where it ran there, else with its profile over all types.
Running shares are known by their decision ids (the cluster view reads them from the
AdminComment tag); a decision record holds the job's keys, so a resident's profile comes from
its own history too. A resident without a usable profile never excludes a node (nothing is
known against it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from slurm_gpushare.predict.pairs import CoRun, PairModel, default_model, typed_key

CACHE_SIZE = 4096


def _profile_of_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    def mean(name: str) -> float | None:
        values = [float(s[name]) for s in runs if s.get(name) is not None]
        return sum(values) / len(values) if values else None

    def peak(name: str) -> float | None:
        values = [float(s[name]) for s in runs if s.get(name) is not None]
        return max(values) if values else None

    return {"gpu_util_pct": mean("mgup_mean"), "mem_util_pct": mean("mgtsamp_mean"),
            "gpu_util_max_pct": peak("mgup_max"), "mem_util_max_pct": peak("mgtsamp_max"),
            "mem_used_mib": peak("mgmap_max_mib"), "mem_total_mib": peak("mem_total_mib")}


def _usable_runs(history: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The summaries of the most specific key that has utilisation telemetry, and its rank."""
    usable = [s for s in history if s.get("mgup_mean") is not None or s.get("mgup_max") is not None]
    if not usable:
        return [], -1
    rank = min(s.get("matched_key", 0) for s in usable)
    return [s for s in usable if s.get("matched_key", 0) == rank], rank


def profile_of_history(history: Sequence[dict[str, Any]]) -> tuple[dict[str, Any] | None, int]:
    """``(profile, rank)``: the pair profile from ``Store.history`` summaries of the most
    specific key that has utilisation telemetry, and that key's rank (None, -1 without any)."""
    runs, rank = _usable_runs(history)
    return (_profile_of_runs(runs), rank) if runs else (None, -1)


def profiles_by_type(history: Sequence[dict[str, Any]],
                     type_of: Callable[[str], str | None]) -> dict[str, dict[str, Any]]:
    """The pair profile per configured GPU type (``type_of`` maps a run's NVML model to it)
    from the runs ``profile_of_history`` reads, each type's runs alone."""
    runs, _ = _usable_runs(history)
    types = {model: type_of(model) for model in {str(r.get("gpu_model") or "") for r in runs}}
    by_type: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        gpu_type = types[str(run.get("gpu_model") or "")]
        if gpu_type:
            by_type.setdefault(gpu_type, []).append(run)
    return {gpu_type: _profile_of_runs(group) for gpu_type, group in by_type.items()}


class Profiles(NamedTuple):
    """A job's pair profile over all its runs, the key its corrections are learned under, and
    its profile per GPU type it ran on."""
    profile: dict[str, Any]
    key: str
    by_type: Mapping[str, dict[str, Any]]

    def on(self, gpu_type: str | None) -> tuple[dict[str, Any], str]:
        """``(profile, correction key)`` to judge the job with on ``gpu_type``: its own there
        where it ran there, else over all types."""
        typed = self.by_type.get(gpu_type) if gpu_type else None
        return (typed, typed_key(self.key, gpu_type)) if typed else (self.profile, self.key)


class PairCompatibility:
    """One job's view of the running shares (``policy.PairCompatibility``)."""

    def __init__(self, model: PairModel, own: Profiles,
                 resident: Callable[[str], Profiles | None]):
        self.model = model
        self.own = own
        self.resident = resident

    @property
    def key(self) -> str:
        return self.own.key

    def compatible_with(self, resident_id: str, gpu_type: str | None = None) -> bool:
        """Whether the job may join the running share ``resident_id`` on a GPU of
        ``gpu_type``: each side's pessimistic predicted speed is at least the threshold (memory
        is Slurm's to account, by shards)."""
        return self.compatible_with_group((resident_id,), gpu_type)

    def compatible_with_group(self, resident_ids, gpu_type: str | None = None) -> bool:
        """Whether the job may join these shares on one GPU, all together: every side's
        pessimistic predicted speed is at least the threshold (residents without a profile
        are left out: nothing is known against them)."""
        found = [r for r in (self.resident(i) for i in resident_ids) if r is not None]
        if not found:
            return True
        sides = [self.own.on(gpu_type)] + [r.on(gpu_type) for r in found]
        return self.model.fast_enough([p for p, _ in sides], [k for _, k in sides])

    def copies_allowed(self, limit: int) -> int:
        """How many copies of the job (the tasks of its array, its next submissions) may share
        one GPU, at most ``limit``; at least 1 (the job alone)."""
        return self.model.copies_allowed(self.own.profile, self.own.key, limit)


class Pairing:
    """Owns the pair model decisions read; learning swaps in an updated copy."""

    def __init__(self, store, *, model: PairModel | None = None,
                 type_of: Callable[[str], str | None] | None = None):
        self.store = store  # read-only use: history and decision records
        self.model = model or default_model()
        # A run's configured GPU type from its NVML model name (None: not one of the site's).
        self.type_of = type_of or (lambda _model: None)
        # One co-run per (cluster, jobs, GPU): a row completed later replaces it; the same
        # under typed keys where both jobs have a profile on the co-run's GPU type.
        self._observations: dict[tuple, CoRun] = {}
        self._typed_observations: dict[tuple, CoRun] = {}
        self._profiles: dict[str, dict[str, Any]] = {}  # (typed) key -> profile (learning)
        self._by_keys: OrderedDict[tuple[str, ...], Profiles | None] = OrderedDict()
        self._decision_keys: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._lock = threading.Lock()

    # -- profiles ---------------------------------------------------------------------------
    def profile(self, keys: Sequence[str]) -> Profiles | None:
        """The profiles of a job with fingerprint ``keys`` (most specific first)."""
        keys = tuple(k for k in keys if k)
        if not keys:
            return None
        with self._lock:
            if keys in self._by_keys:
                self._by_keys.move_to_end(keys)
                return self._by_keys[keys]
        history = self.store.history(list(keys))
        profile, rank = profile_of_history(history)
        found = None if profile is None else Profiles(profile, keys[rank],
                                                      profiles_by_type(history, self.type_of))
        with self._lock:
            self._by_keys[keys] = found
            while len(self._by_keys) > CACHE_SIZE:
                self._by_keys.popitem(last=False)
        return found

    def resident(self, decision_id: str) -> Profiles | None:
        """A running share's profile, through its decision record's keys (a record never
        changes its keys, so they are read once per decision)."""
        if not decision_id:
            return None
        with self._lock:
            keys = self._decision_keys.get(decision_id)
        if keys is None:
            record = self.store.decision(decision_id)
            if record is None:
                return None  # not written yet (records are written off the request path)
            keys = tuple((record.get("keys") or [])[:2])  # exact script, job name
            with self._lock:
                self._decision_keys[decision_id] = keys
                while len(self._decision_keys) > CACHE_SIZE:
                    self._decision_keys.popitem(last=False)
        return self.profile(keys)

    def remember(self, decision_id: str, keys: Sequence[str]) -> None:
        """A decision's keys, known before its record is written: a share of a burst is then
        judged as a resident by the next decisions at once."""
        with self._lock:
            self._decision_keys[decision_id] = tuple(keys[:2])
            while len(self._decision_keys) > CACHE_SIZE:
                self._decision_keys.popitem(last=False)

    def invalidate(self) -> None:
        """New telemetry arrived: profiles are read again."""
        with self._lock:
            self._by_keys.clear()

    def compatibility(self, keys: Sequence[str], margin_at_least: float = 0.0
                      ) -> PairCompatibility | None:
        """The compatibility for a job with fingerprint ``keys``; None without a profile (no
        telemetry: no class either, and no pair judgement). ``margin_at_least``
        (``policy.pair_margin``) raises both calibrated margins to at least that much
        pessimism."""
        found = self.profile(keys)
        if found is None:
            return None
        model = self.model
        if margin_at_least > min(model.margin, model.margin_learned):
            model = model.with_margin_at_least(margin_at_least)
        return PairCompatibility(model, found, self.resident)

    # -- learning ---------------------------------------------------------------------------
    def load(self) -> "Pairing":
        """Learn every co-run already in the store (at start)."""
        return self.observe(self.store.corun_observations())

    def observe(self, rows: Sequence[dict[str, Any]]) -> "Pairing":
        """Add measured co-runs (store rows: ``job_a, job_b, isd_a, isd_b, cluster``) and swap
        in a model with corrections re-learned from all of them."""
        added = 0
        for row in rows:
            if row.get("isd_a") is None and row.get("isd_b") is None:
                continue
            cluster = str(row.get("cluster") or "")
            jobs = (str(row["job_a"]), str(row["job_b"]))
            isd = (row.get("isd_a"), row.get("isd_b"))
            if jobs[1] < jobs[0]:  # one orientation per row, whichever side reported it
                jobs, isd = jobs[::-1], isd[::-1]
            sides = [self.profile(self.store.keys_of_job(job_id, cluster)[:2]) for job_id in jobs]
            if None in sides:
                continue  # the other job has not finished yet: learned when it has
            for side in sides:
                self._profiles[side.key] = side.profile
            ident = (cluster, *jobs, str(row.get("gpu_uuid") or ""))
            overlap = row.get("overlap_s")
            run = self._observations[ident] = CoRun(
                (sides[0].key, sides[1].key), isd, None if overlap is None else float(overlap),
                same_user=row.get("same_user") == 1)  # not known: another user's
            gpu_type = row.get("gpu_type")
            if gpu_type and all(gpu_type in side.by_type for side in sides):
                typed = tuple(typed_key(side.key, gpu_type) for side in sides)
                for key, side in zip(typed, sides):
                    self._profiles[key] = side.by_type[gpu_type]
                self._typed_observations[ident] = run._replace(keys=typed)
            else:
                self._typed_observations.pop(ident, None)
            added += 1
        if added:
            self.model = self.model.learned_from(self._observations, self._profiles,
                                                 self._typed_observations)
        return self

