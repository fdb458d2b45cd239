"""What sharing saved and what it cost: figures per co-run group and aggregated.

Definitions (a *co-run group* is a set of jobs that shared one GPU with overlapping run times,
joined transitively):

- **Packing Saving** of a group: ``PS = 1 - makespan / sum of solo times``, where the makespan
  is first start to last end on that GPU. Aggregated over groups: ``1 - sum(makespans) /
  sum(solo times)``. Only groups whose members all completed and all have a solo time count.
- **Individual Slow Down** of a shared job: ``ISD = shared run time / solo run time - 1``.
- **Solo time** of a job: from its own history (the median duration of solo runs -- not shared,
  no co-runner -- of the same fingerprint on the same GPU type, in the store), else from a
  supplied predictor callable; each job says which (``solo_source``).
- **GPU-hours**: used is what the GPUs were busy (a co-run group's makespan counted once,
  shared among its members in proportion to their solo times, or run times where a solo time is
  missing); the exclusive counterfactual is each job on whole GPUs for its solo time (its own
  run time where unknown; a share stands for the one GPU it replaced). Saved = the difference.

Jobs still running are left out of every figure (counted as ``running``). Failed and cancelled
jobs count in GPU-hours (they held GPUs) and in the failure counts, never in ISD or PS.

Reports show users and accounts (admins see those in sacct anyway) but no job names, scripts
or models: those never enter the accounting records. ``anonymise=True`` replaces user names by
``user-1``, ``user-2``, ... (in order of GPU-hours) and drops them from job-level detail.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from collections.abc import Sequence as SequenceABC
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from slurm_gpushare.slurm.accounting import FAILURE_STATES, JobRecord, gc_paused

GROUP_BY = ("user", "account", "partition", "gpu-type", "class-pair")
SOLO = "solo"  # class-pair key of jobs that ran on whole GPUs or alone on a share
SoloPredictor = Callable[[JobRecord], "float | None"]


def store_id(job: JobRecord) -> str:
    """The id the store knows a job by: Slurm's unique numeric id (sacct ``JobIDRaw``). An array
    task ``68_3`` or a het component ``70+1`` has its own numeric id (``72``, ``71``), which is
    what ``SLURM_JOB_ID`` holds in its prolog and epilog; a plain job's is its ``JobID``."""
    return job.raw_id or job.job_id


# -- the store, read-only ----------------------------------------------------------------------
class StoreView:
    """What the report needs from the store (``store.Store``), read-only.

    Only the store's own methods, never its SQL. The store may keep ``cluster`` empty on a
    one-cluster site, so a job is looked up under its sacct cluster name and under "".
    """

    def __init__(self, store):
        self.store = store
        # Each decision is read several times per job, and the jobs of one script (an array,
        # a sweep) share their fingerprint keys: read each once.
        self._decisions: dict[str, dict[str, Any] | None] = {}
        self._history: dict[tuple[str, ...], list[dict[str, Any]]] = {}

    def decision(self, decision_id: str) -> dict[str, Any] | None:
        if not decision_id:
            return None
        if decision_id not in self._decisions:
            self._decisions[decision_id] = self.store.decision(decision_id)
        return self._decisions[decision_id]

    def job_keys(self, job: JobRecord) -> list[str]:
        """The job's fingerprint keys, most specific first (as ``JobKeys.as_list``)."""
        keys = list((self.decision(job.decision_id) or {}).get("keys") or [])
        return keys + [k for k in self.store.keys_of_job(store_id(job), job.cluster)
                       if k not in keys]

    def summaries(self, job: JobRecord) -> list[dict[str, Any]]:
        ident = store_id(job)
        return self.store.summaries(ident, job.cluster) or self.store.summaries(ident)

    def history(self, keys: list[str]) -> list[dict[str, Any]]:
        """Read-only to callers: the same list is handed to every job with these keys."""
        if not keys:
            return []
        found = self._history.get(tuple(keys))
        if found is None:
            found = self._history[tuple(keys)] = self.store.history(keys)
        return found

    def coruns(self) -> list[dict[str, Any]]:
        return self.store.corun_observations()


# -- co-run groups -----------------------------------------------------------------------------
@dataclass
class CorunGroup:
    """Jobs that shared one GPU at overlapping times."""

    gpu: str  # "node:index" or the GPU's UUID
    jobs: list[JobRecord]

    @property
    def ids(self) -> list[str]:
        return [j.job_id for j in self.jobs]

    @property
    def makespan_s(self) -> float:
        return max(j.end for j in self.jobs) - min(j.start for j in self.jobs)

    @property
    def shared(self) -> bool:
        return len(self.jobs) > 1


def _ran(job: JobRecord) -> bool:
    return job.finished and job.start is not None and job.end is not None


def groups_from_placements(jobs: Iterable[JobRecord],
                           placements: Mapping[str, Iterable[tuple[str, int]]]
                           ) -> list[CorunGroup]:
    """Co-run groups from where jobs ran: for each (node, GPU index), the jobs whose
    [start, end) intervals overlap, joined transitively (a chain a-b, b-c is one group).

    ``placements``: job id -> {(node, GPU index)}, e.g. ``accounting.placements_from_scontrol``
    sampled while the jobs ran. Start/End come from sacct. Jobs with more than one GPU are not
    co-runners of anyone (they kept whole GPUs). Touching intervals (one ends the second the
    next starts) do not overlap.
    """
    by_id = {j.job_id: j for j in jobs if _ran(j)}
    on_gpu: dict[tuple[str, int], list[JobRecord]] = defaultdict(list)
    for job_id, places in placements.items():
        places = set(places)
        if job_id in by_id and len(places) == 1:
            on_gpu[next(iter(places))].append(by_id[job_id])
    groups = []
    for (node, index), members in sorted(on_gpu.items()):
        members.sort(key=lambda j: (j.start, j.end, j.job_id))
        current: list[JobRecord] = []
        reach = None
        for job in members:
            if current and job.start >= reach:
                groups.append(CorunGroup(f"{node}:{index}", current))
                current = []
            current.append(job)
            reach = job.end if len(current) == 1 else max(reach, job.end)
        if current:
            groups.append(CorunGroup(f"{node}:{index}", current))
    return groups


def groups_from_store(jobs: Iterable[JobRecord], observations: Iterable[Mapping[str, Any]]
                      ) -> list[CorunGroup]:
    """Co-run groups from the store's pair observations (``Store.corun_observations``):
    pairs on the same GPU joined transitively; pairs naming a job not in ``jobs`` are skipped.
    Observations name jobs by their store id (``store_id``), groups by their sacct id."""
    if not observations:  # no store (an iterator is always read)
        return []
    by_id = {store_id(j): j for j in jobs if _ran(j)}
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    gpu_of: dict[str, str] = {}
    for obs in observations:
        a, b = obs["job_a"], obs["job_b"]
        if a not in by_id or b not in by_id:
            continue
        parent[find(a)] = find(b)
        gpu_of.setdefault(a, obs.get("gpu_uuid") or "")
        gpu_of.setdefault(b, obs.get("gpu_uuid") or "")
    members: dict[str, list[JobRecord]] = defaultdict(list)
    for job_id in parent:
        members[find(job_id)].append(by_id[job_id])
    groups = [CorunGroup(gpu_of[store_id(sorted(m, key=lambda j: j.start)[0])],
                         sorted(m, key=lambda j: (j.start, j.job_id)))
              for m in members.values()]
    return sorted(groups, key=lambda g: (min(j.start for j in g.jobs), g.gpu))


def record_groups(store, groups: Iterable[CorunGroup], *, gpu_type: str | None = None) -> int:
    """Write each overlapping pair of every group to the store as a co-run observation (GPU
    named "node:index"); returns the number of pairs. For tools that derive co-runs from
    placement before the prolog/epilog telemetry reports them."""
    pairs = 0
    for group in groups:
        for i, a in enumerate(group.jobs):
            for b in group.jobs[i + 1:]:
                overlap = min(a.end, b.end) - max(a.start, b.start)
                if overlap > 0:
                    store.record_corun(store_id(a), store_id(b), gpu_uuid=group.gpu,
                                       overlap_s=overlap, gpu_type=gpu_type or a.gpu_type or None)
                    pairs += 1
    return pairs


# -- solo times --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Solo:
    seconds: float
    source: str  # "history" or "predictor"
    runs: int = 0  # solo runs behind a history figure


def _same_gpu(summary: Mapping[str, Any], gpu_type: str) -> bool:
    # Summaries carry the NVML model name ("A100-80GB"), jobs the gres type ("a100").
    model = (summary.get("gpu_model") or "").lower()
    return not gpu_type or not model or gpu_type.lower() in model


def solo_from_history(job: JobRecord, view: StoreView | None) -> Solo | None:
    """Median duration of the job's own solo runs on its GPU type, found by the most specific
    of its fingerprint keys (script, then job name) that has any."""
    if view is None:
        return None
    # ``JobKeys.as_list`` always ends with the user key (every job has a user). The user alone
    # says nothing about run time, so only the script and job-name keys are asked.
    runs = [s for s in view.history(view.job_keys(job)[:-1])
            if s.get("job_id") != store_id(job) and not s.get("shared")
            and not [c for c in s.get("coruns") or [] if c.get("job_id") != "other"]
            and (s.get("duration_s") or 0) > 0 and _same_gpu(s, job.gpu_type)]
    if not runs:
        return None
    best = min(s.get("matched_key", 0) for s in runs)
    durations = [s["duration_s"] for s in runs if s.get("matched_key", 0) == best]
    return Solo(float(statistics.median(durations)), "history", len(durations))


def solo_from_decision(job: JobRecord, view: StoreView | None) -> float | None:
    """The run time the daemon predicted for the job on its GPU type when it decided (kept
    with the decision in the store)."""
    decision = view.decision(job.decision_id) if view else None
    return ((decision or {}).get("runtime_s") or {}).get(job.gpu_type)


def solo_time(job: JobRecord, view: StoreView | None,
              predictor: SoloPredictor | None) -> Solo | None:
    """From the job's own solo history, else ``predictor`` (if given), else the daemon's own
    run-time prediction recorded with the decision; source "history" or "predictor"."""
    if predictor is None:
        predictor = lambda j: solo_from_decision(j, view)  # noqa: E731
    found = solo_from_history(job, view)
    if found is None and predictor is not None:
        seconds = predictor(job)
        if seconds is not None and seconds > 0:
            found = Solo(float(seconds), "predictor")
    return found


# -- per-job figures ---------------------------------------------------------------------------
SACCT_RESOLUTION_S = 1.0  # sacct keeps whole seconds: each Start and End is off by up to this
SLOWED_ISD = 0.20  # a shared job "slowed" when its ISD exceeds this
NOISY_ISD = 0.05  # an ISD whose uncertainty (half-width) exceeds this is shown as noisy
SMALL_SAMPLE = 10  # fewer ISD values (or shared jobs) than this: shown as a small sample
FEW_SOLO_RUNS = 3  # a solo time from fewer runs than this is a thin history


@dataclass(slots=True)  # one per GPU job: a million at a large site's month
class JobFigures:
    job: JobRecord
    group: CorunGroup | None = None
    solo: Solo | None = None
    job_class: int | None = None
    class_pair: str = SOLO
    used_gpu_s: float = 0.0
    exclusive_gpu_s: float = 0.0
    isd: float | None = None
    isd_low: float | None = None  # the ISD's bounds from sacct's 1-second resolution
    isd_high: float | None = None
    share_gib: float | None = None
    safe_estimate_gib: float | None = None  # predicted peak + margin for the job's GPU type
    decision_source: str = ""
    peak_mem_gib: float | None = None
    peak_source: str = ""  # "agent" (the node agent's NVML summary) or "slurm" (gres/gpumem)
    earlier_runs: int = 0  # runs requeued before the final one
    earlier_gpu_s: float = 0.0
    # The job's own flags, read once (every aggregate reads them).
    on_share: bool = False
    oom: bool = False
    failed: bool = False
    queue_delay_s: float | None = None
    # Its row as JSON, kept between the two lists that show a shared job (``JobRows.encoded``).
    row_json: str | None = None

    @property
    def saved_gpu_s(self) -> float:
        return self.exclusive_gpu_s - self.used_gpu_s

    @property
    def extra_run_s(self) -> float | None:
        """How much longer the job ran than alone (negative: faster)."""
        return None if self.isd is None else (self.job.run_time_s or 0.0) - self.solo.seconds

    @property
    def overran_share(self) -> bool:
        """Its observed peak GPU memory exceeded the share it was given."""
        return bool(self.share_gib and self.peak_mem_gib and self.peak_mem_gib > self.share_gib)


def isd_bounds(run_s: float, solo: Solo) -> tuple[float | None, float | None]:
    """The ISD's range when each of sacct's times is off by up to ``SACCT_RESOLUTION_S``: the
    run time by up to two of them, a history solo time (a median of such run times) likewise.
    A predicted solo time has no such bound: (None, None)."""
    if solo.source != "history":
        return None, None
    err = 2 * SACCT_RESOLUTION_S
    low = max(0.0, run_s - err) / (solo.seconds + err) - 1.0
    high = (run_s + err) / max(solo.seconds - err, SACCT_RESOLUTION_S) - 1.0
    return low, high


def _gpu_time(job: JobRecord) -> float:
    return (job.run_time_s or 0.0) * job.exclusive_gpus


def _figures_for(jobs: Sequence[JobRecord], groups: Sequence[CorunGroup],
                 view: StoreView | None, predictor: SoloPredictor | None,
                 classes: Mapping[str, int]) -> list[JobFigures]:
    group_of = {j.job_id: g for g in groups for j in g.jobs}
    out = []
    for job in jobs:
        if not (job.gpu_job and _ran(job)):
            continue
        on_share = job.on_share
        fig = JobFigures(job=job, group=group_of.get(job.job_id) if group_of else None,
                         on_share=on_share, queue_delay_s=job.queue_delay_s)
        fig.oom = job.oom
        fig.failed = fig.oom or job.state in FAILURE_STATES  # it ran, so it finished
        run = max(0.0, job.end - job.start)  # job.run_time_s of a job that ran (_ran)
        decision = view.decision(job.decision_id) if view else None
        if decision:
            fig.share_gib = decision.get("share_gib")
            fig.decision_source = decision.get("source", "") or (
                decision.get("details") or {}).get("source", "")
            if decision.get("job_class") is not None:
                fig.job_class = int(decision["job_class"])
            safe = (decision.get("memory_mib") or {}).get(job.gpu_type)
            fig.safe_estimate_gib = safe / 1024 if safe else None
        if fig.share_gib is None and on_share and job.shards:
            fig.share_gib = job.shards  # 1 shard = 1 GiB (the product's shard unit)
        if fig.job_class is None and classes and store_id(job) in classes:
            fig.job_class = classes[store_id(job)]
        if view:
            peaks = [s.get("mgmap_max_mib") for s in view.summaries(job)
                     if s.get("mgmap_max_mib") is not None]
            if peaks:
                fig.peak_mem_gib, fig.peak_source = max(peaks) / 1024, "agent"
        if fig.peak_mem_gib is None and job.exclusive_gpus == 1:
            # Where no agent summary is held, Slurm's own gres/gpumem (23.02+ with
            # AutoDetect=nvml). Single-GPU jobs only: for more, it is not one GPU's peak.
            slurm_peak = job.gpu_mem_peak_mib
            if slurm_peak is not None:
                fig.peak_mem_gib, fig.peak_source = slurm_peak / 1024, "slurm"
        if on_share and (view is not None or predictor is not None):
            fig.solo = solo_time(job, view, predictor)
        if not on_share:
            fig.used_gpu_s = fig.exclusive_gpu_s = job.gpus * run
        if job.earlier_runs:
            fig.earlier_runs = len(job.earlier_runs)
            fig.earlier_gpu_s = sum(_gpu_time(r) for r in job.earlier_runs
                                    if r.start is not None and r.end is not None)
        out.append(fig)
    by_id = {f.job.job_id: f for f in out} if groups else {}
    for group in groups:
        members = [by_id[j.job_id] for j in group.jobs
                   if j.job_id in by_id and by_id[j.job_id].on_share]
        if not members:
            continue
        all_solo = all(m.solo for m in members)
        weights = [m.solo.seconds if all_solo else (m.job.run_time_s or 0.0) for m in members]
        total = sum(weights) or 1.0
        for m, w in zip(members, weights):
            m.used_gpu_s = group.makespan_s * w / total
        others = {m.job.job_id: m.job_class for m in members}
        for m in members:
            if group.shared:
                pair = sorted("?" if c is None else str(c) for c in others.values())
                m.class_pair = "+".join(pair)
    for fig in out:
        if fig.on_share:
            if fig.group is None:  # a share that never met a co-runner: alone on its GPU
                fig.used_gpu_s = fig.job.run_time_s or 0.0
            elif fig.group.shared and fig.solo and fig.job.state == "COMPLETED":
                fig.isd = (fig.job.run_time_s or 0.0) / fig.solo.seconds - 1.0
                fig.isd_low, fig.isd_high = isd_bounds(fig.job.run_time_s or 0.0, fig.solo)
            fig.exclusive_gpu_s = (fig.solo.seconds if fig.solo else fig.job.run_time_s or 0.0) \
                * fig.job.exclusive_gpus
        # Earlier runs of a requeued job held their GPUs: used either way. On whole GPUs they
        # would have run too, unless the job was shared (a share outgrown is requeued).
        fig.used_gpu_s += fig.earlier_gpu_s
        if not fig.on_share:
            fig.exclusive_gpu_s += fig.earlier_gpu_s
    return out


def group_ps(group: CorunGroup, figures: Mapping[str, JobFigures]) -> float | None:
    """PS of one group, or None when a member did not complete or has no solo time from its
    own history (a predicted solo time fills GPU-hours, never PS or ISD figures)."""
    members = [figures.get(j.job_id) for j in group.jobs]
    if not group.shared or any(m is None or m.solo is None or m.solo.source != "history"
                               or m.job.state != "COMPLETED" for m in members):
        return None
    return 1.0 - group.makespan_s / sum(m.solo.seconds for m in members)


# -- aggregation -------------------------------------------------------------------------------
def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    low, high = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def aggregate(figures: Sequence[JobFigures], psable: set[str],
              all_jobs: Sequence[JobRecord]) -> dict[str, Any]:
    """Figures of a set of jobs. ``psable``: ids of jobs in groups with a PS."""
    shared = [f for f in figures if f.on_share]
    exclusive = [f for f in figures if not f.on_share]
    # Slowdowns against the job's own solo runs; those against a prediction only per job.
    with_isd = [f for f in shared if f.isd is not None and f.solo.source == "history"]
    isds = [f.isd for f in with_isd]
    bounded = [f for f in with_isd if f.isd_low is not None]
    ps_members = [f for f in shared if f.job.job_id in psable]
    ps_solo = sum(f.solo.seconds for f in ps_members)
    ps_used = sum(f.used_gpu_s - f.earlier_gpu_s for f in ps_members)
    used = sum(f.used_gpu_s for f in figures)
    excl = sum(f.exclusive_gpu_s for f in figures)
    finished = running = 0  # jobs finished; GPU jobs not finished
    for j in all_jobs:
        if j.finished:
            finished += 1
        elif j.gpu_job:
            running += 1
    delays_sh = [f.queue_delay_s for f in shared if f.queue_delay_s is not None]
    delays_ex = [f.queue_delay_s for f in exclusive if f.queue_delay_s is not None]
    mean_sh, mean_ex = _mean(delays_sh), _mean(delays_ex)
    sources = defaultdict(int)
    for f in shared:
        if f.solo:
            sources[f.solo.source] += 1
    solo_runs = [f.solo.runs for f in with_isd if f.solo.source == "history"]
    return {
        "jobs": finished,
        "gpu_jobs": len(figures),
        "shared_jobs": len(shared),
        "exclusive_jobs": len(exclusive),
        "running_jobs": running,
        "gpu_hours_used": used / 3600,
        "gpu_hours_exclusive": excl / 3600,
        "gpu_hours_saved": (excl - used) / 3600,
        "saved_fraction": (excl - used) / excl if excl else None,
        "ps": 1.0 - ps_used / ps_solo if ps_solo else None,
        "ps_groups_jobs": len(ps_members),
        "isd_n": len(isds),
        "isd_mean": _mean(isds),
        "isd_median": _pct(isds, 0.5),
        "isd_median_low": _pct([f.isd_low for f in bounded], 0.5),
        "isd_median_high": _pct([f.isd_high for f in bounded], 0.5),
        "isd_p95": _pct(isds, 0.95),
        "isd_max": max(isds) if isds else None,
        "isd_against_prediction": len([f for f in shared if f.isd is not None
                                       and f.solo.source != "history"]),
        "isd_noisy": len([f for f in bounded if (f.isd_high - f.isd_low) / 2 > NOISY_ISD]),
        "isd_small_sample": len(isds) < SMALL_SAMPLE,
        "isd_solo_runs_min": min(solo_runs) if solo_runs else None,
        "isd_thin_history": len([n for n in solo_runs if n < FEW_SOLO_RUNS]),
        "slowed_jobs": len([i for i in isds if i > SLOWED_ISD]),
        "extra_run_hours": sum(f.extra_run_s for f in with_isd) / 3600,
        "solo_from_history": sources["history"],
        "solo_from_predictor": sources["predictor"],
        "solo_unknown": len([f for f in shared if f.solo is None]),
        "queue_delay_shared_mean_s": mean_sh,
        "queue_delay_shared_median_s": _pct(delays_sh, 0.5),
        "queue_delay_exclusive_mean_s": mean_ex,
        "queue_delay_exclusive_median_s": _pct(delays_ex, 0.5),
        "extra_queue_hours": (None if mean_sh is None or mean_ex is None
                              else (mean_sh - mean_ex) * len(delays_sh) / 3600),
        "oom_shared": len([f for f in shared if f.oom]),
        "oom_exclusive": len([f for f in exclusive if f.oom]),
        "failed_shared": len([f for f in shared if f.failed]),
        "failed_exclusive": len([f for f in exclusive if f.failed]),
        "cancelled_shared": len([f for f in shared if f.job.cancelled]),
        "cancelled_exclusive": len([f for f in exclusive if f.job.cancelled]),
        "overrun_shared": len([f for f in shared if f.overran_share]),
        "requeued_runs_shared": sum(f.earlier_runs for f in shared),
        "requeued_runs_exclusive": sum(f.earlier_runs for f in exclusive),
        "requeued_gpu_hours": sum(f.earlier_gpu_s for f in figures) / 3600,
    }


def verdict(totals: Mapping[str, Any]) -> str:
    """One line an admin can act on: what sharing saved, what it cost, and what to do."""
    shared = totals["shared_jobs"]
    if not shared:
        return "No job ran on a share in this window: nothing to judge."
    saved = totals["gpu_hours_saved"]
    queue = totals["extra_queue_hours"]
    costs = [_queue_phrase(queue),
             f"{totals['slowed_jobs']} of {totals['isd_n']} jobs with a known slowdown slowed "
             f"more than {SLOWED_ISD:.0%}",
             f"{totals['overrun_shared']} outgrew their share",
             f"{totals['oom_shared']} killed for memory"]
    if totals["requeued_runs_shared"]:
        costs.append(f"{totals['requeued_runs_shared']} runs requeued")
    line = (f"Sharing saved {saved:.2f} GPU-h ({_frac(totals['saved_fraction'])}) at a cost of "
            + "; ".join(costs) + ".")
    if shared < SMALL_SAMPLE or totals["isd_small_sample"]:
        advice = (f"Too few to judge ({shared} shared jobs, {totals['isd_n']} with a known "
                  f"slowdown; {SMALL_SAMPLE} of each needed): keep watching.")
    elif saved <= 0:
        advice = "Sharing did not pay off: turn it off for these jobs or review the policy."
    elif totals["oom_shared"] or totals["overrun_shared"] or (
            totals["slowed_jobs"] > 0.1 * totals["isd_n"]):
        advice = ("Sharing pays off but hurts some jobs: raise the memory margin or keep the "
                  "interfering class pairs apart.")
    else:
        advice = "Sharing pays off: keep it on."
    return f"{line} {advice}"


def _queue_phrase(hours: float | None) -> str:
    if hours is None:
        return "queueing not comparable (shared or whole-GPU jobs missing)"
    amount = f"{abs(hours):.2f} h" if abs(hours) >= 0.01 else f"{abs(hours) * 3600:.0f} s"
    if hours >= 0:
        return f"{amount} extra queueing on shares (vs whole-GPU jobs)"
    return f"no extra queueing (shares waited {amount} less than whole-GPU jobs)"


def _frac(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def prediction_quality(figures: Sequence[JobFigures]) -> dict[str, Any]:
    """Memory figures of shared jobs with an observed peak, per decision source, kept apart:

    - the predictor's error: the safe estimate (prediction + margin) for the job's GPU type
      vs the observed peak: ``estimate_error_mean``/``p95`` (``(estimate - peak) / peak``,
      signed: positive is an over-estimate) and ``estimate_below_peak`` (the margin was not
      enough);
    - the over-allocation the policy chose: the share given vs the peak
      (``share_over_peak_median``, share / peak) and ``share_below_peak`` (the job outgrew its
      share)."""
    out: dict[str, Any] = {}
    rows = [f for f in figures if f.job.on_share and f.peak_mem_gib]
    for source in sorted({f.decision_source or "unknown" for f in rows}):
        mine = [f for f in rows if (f.decision_source or "unknown") == source]
        estimated = [f for f in mine if f.safe_estimate_gib]
        errors = [(f.safe_estimate_gib - f.peak_mem_gib) / f.peak_mem_gib for f in estimated]
        given = [f for f in mine if f.share_gib]
        out[source] = {
            "n": len(mine),
            "estimate_n": len(estimated),
            "estimate_error_mean": _mean(errors),
            "estimate_error_p95": _pct([abs(e) for e in errors], 0.95),
            "estimate_below_peak": len([e for e in errors if e < 0]),
            "share_n": len(given),
            "share_over_peak_median": _pct([f.share_gib / f.peak_mem_gib for f in given], 0.5),
            "share_below_peak": len([f for f in given if f.overran_share]),
        }
    return out


def _key(fig_or_job, by: str) -> str:
    job = fig_or_job.job if isinstance(fig_or_job, JobFigures) else fig_or_job
    if by == "user":
        return job.user or "?"
    if by == "account":
        return job.account or "?"
    if by == "partition":
        return job.partition or "?"
    if by == "gpu-type":
        return job.gpu_type or "?"
    if by == "class-pair":
        return fig_or_job.class_pair if isinstance(fig_or_job, JobFigures) else SOLO
    raise ValueError(f"cannot group by {by!r}; choose one of {', '.join(GROUP_BY)}")


def _pseudonyms(figures: Sequence[JobFigures], jobs: Sequence[JobRecord]) -> dict[str, str]:
    hours: dict[str, float] = defaultdict(float)
    for job in jobs:
        hours[job.user or "?"] += 0.0
    for f in figures:
        hours[f.job.user or "?"] += f.used_gpu_s
    ranked = sorted(hours, key=lambda u: (-hours[u], u))
    return {user: f"user-{i + 1}" for i, user in enumerate(ranked)}


def _timeline(figures: Sequence[JobFigures], since: float, until: float) -> list[dict]:
    """Saved GPU-hours per local day (per hour for windows of two days or less), by job end."""
    step = 3600 if until - since <= 2 * 86400 else 86400
    buckets: dict[float, list[JobFigures]] = defaultdict(list)
    # The bucket's start by the local hour it names (isdst tells the repeated hour of a
    # change back from summer time apart): worked out once per hour, not once per job.
    starts: dict[tuple[int, int, int, int], float] = {}
    for f in figures:
        local = time.localtime(f.job.end)
        hour = (local.tm_year, local.tm_yday, local.tm_hour, local.tm_isdst)
        start = starts.get(hour)
        if start is None:
            end = datetime.fromtimestamp(f.job.end)
            begin = end.replace(minute=0, second=0, microsecond=0)
            if step == 86400:
                begin = begin.replace(hour=0)
            start = starts[hour] = begin.timestamp()
        buckets[start].append(f)
    out = []
    for start in sorted(buckets):
        rows = buckets[start]
        used = sum(f.used_gpu_s for f in rows)
        excl = sum(f.exclusive_gpu_s for f in rows)
        out.append({"start": start, "step_s": step,
                    "gpu_hours_used": used / 3600, "gpu_hours_exclusive": excl / 3600,
                    "gpu_hours_saved": (excl - used) / 3600})
    return out


def _class_matrix(figures: Sequence[JobFigures]) -> list[dict[str, Any]]:
    """Mean ISD of a job of class a next to a co-runner of class b (for the heat map)."""
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    class_of: dict[str, int | None] = {}
    for f in figures:
        class_of.setdefault(f.job.job_id, f.job_class)
    for f in figures:
        if f.isd is None or f.group is None or not f.group.shared:
            continue
        own = "?" if f.job_class is None else str(f.job_class)
        for other in f.group.jobs:
            if other.job_id == f.job.job_id:
                continue
            cls = class_of.get(other.job_id)
            cells[(own, "?" if cls is None else str(cls))].append(f.isd)
    return [{"class": a, "with": b, "n": len(v), "isd_mean": _mean(v)}
            for (a, b), v in sorted(cells.items())]


def job_row(f: JobFigures, *, anonymise: bool = False) -> dict[str, Any]:
    """One job's row of the report, its keys in sorted order (``JobRows.encoded``)."""
    job, solo, group = f.job, f.solo, f.group
    row = {
        "account": job.account,
        "class_pair": f.class_pair,
        "co_runners": [j for j in group.ids if j != job.job_id] if group else [],
        "gpu_s_exclusive": f.exclusive_gpu_s, "gpu_s_used": f.used_gpu_s,
        "gpu_type": job.gpu_type or "?",
        "isd": f.isd, "isd_high": f.isd_high, "isd_low": f.isd_low,
        "job_id": job.job_id,
        "on_share": f.on_share, "oom": f.oom,
        "partition": job.partition, "peak_gib": f.peak_mem_gib,
        "peak_source": f.peak_source or None, "queue_s": f.queue_delay_s,
        "requeued_runs": f.earlier_runs, "run_s": job.run_time_s,
        "safe_estimate_gib": f.safe_estimate_gib, "share_gib": f.share_gib,
        "solo_runs": solo.runs if solo else 0, "solo_s": solo.seconds if solo else None,
        "solo_source": solo.source if solo else "unknown",
        "state": job.state, "store_id": job.raw_id or job.job_id,  # store_id(job)
        "user": job.user,
    }
    if anonymise:
        del row["user"]
    return row


# Rows come with their keys sorted, and hold no container twice (no cycle to check for).
_encode_sorted_row = json.JSONEncoder(check_circular=False).encode


class JobRows(SequenceABC):
    """The report's job rows, each made when read: a million rows held as dicts would take
    more memory than the jobs themselves. Equal to the list of the same rows."""

    def __init__(self, figures: Sequence[JobFigures], *, anonymise: bool = False):
        self.figures, self.anonymise = figures, anonymise

    def __len__(self) -> int:
        return len(self.figures)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [job_row(f, anonymise=self.anonymise) for f in self.figures[index]]
        return job_row(self.figures[index], anonymise=self.anonymise)

    def __iter__(self):
        anonymise = self.anonymise
        return (job_row(f, anonymise=anonymise) for f in self.figures)

    def __eq__(self, other) -> bool:
        return isinstance(other, (list, JobRows)) and list(self) == list(other)

    def encoded(self) -> Iterator[str]:
        """Each row as ``json.dumps(row, sort_keys=True)`` gives it. A shared job's row is
        in "jobs" and again in "shared_jobs": its text is kept from the first list to the
        next (then dropped), not made twice."""
        anonymise = self.anonymise
        for f in self.figures:
            text = f.row_json
            if text is None:
                text = _encode_sorted_row(job_row(f, anonymise=anonymise))
                if f.on_share:
                    f.row_json = text
            else:
                f.row_json = None
            yield text


def build_report(jobs: Sequence[JobRecord], *, since: float, until: float,
                 by: str = "account", groups: Sequence[CorunGroup] | None = None,
                 store=None, predictor: SoloPredictor | None = None, anonymise: bool = False,
                 source: str = "", lazy_rows: bool = False) -> dict[str, Any]:
    """The whole report as plain data (what every output format renders).

    ``groups``: co-run groups if already known (e.g. ``groups_from_placements``); otherwise they
    come from the store's co-run observations (none without a store). ``lazy_rows``: "jobs"
    and "shared_jobs" are ``JobRows`` that make each row when it is read (for a writer that
    reads them once), not lists.
    """
    with gc_paused():
        return _build_report(jobs, since=since, until=until, by=by, groups=groups,
                             store=store, predictor=predictor, anonymise=anonymise,
                             source=source, lazy_rows=lazy_rows)


def _build_report(jobs: Sequence[JobRecord], *, since: float, until: float, by: str,
                  groups: Sequence[CorunGroup] | None, store, predictor: SoloPredictor | None,
                  anonymise: bool, source: str, lazy_rows: bool) -> dict[str, Any]:
    if by not in GROUP_BY:
        raise ValueError(f"cannot group by {by!r}; choose one of {', '.join(GROUP_BY)}")
    view = StoreView(store) if store is not None else None
    observations = view.coruns() if view else []
    if groups is None:
        groups = groups_from_store(jobs, observations)
    classes: dict[str, int] = {}
    for obs in observations:  # classes the co-run records know, where decisions do not
        for side in ("a", "b"):
            if obs.get(f"class_{side}") is not None:
                classes[obs[f"job_{side}"]] = int(obs[f"class_{side}"])
    figures = _figures_for(jobs, groups, view, predictor, classes)
    by_id = {f.job.job_id: f for f in figures} if groups else {}
    group_rows, psable = [], set()
    for group in groups:
        ps = group_ps(group, by_id)
        members = [by_id[j.job_id] for j in group.jobs if j.job_id in by_id]
        if ps is not None:
            psable.update(j.job_id for j in group.jobs)
        group_rows.append({
            "gpu": group.gpu, "gpu_type": group.jobs[0].gpu_type or "?",
            "jobs": group.ids, "class_pair": members[0].class_pair if members else SOLO,
            "start": min(j.start for j in group.jobs), "makespan_s": group.makespan_s,
            "solo_sum_s": sum(m.solo.seconds for m in members) if all(m.solo for m in members)
            else None,
            "ps": ps,
            "members": [{"job_id": m.job.job_id, "run_s": m.job.run_time_s,
                         "solo_s": m.solo.seconds if m.solo else None,
                         "solo_source": m.solo.source if m.solo else "unknown",
                         "isd": m.isd, "state": m.job.state} for m in members],
        })
    names = _pseudonyms(figures, jobs) if anonymise else {}

    def key(item) -> str:
        value = _key(item, by)
        return names.get(value, value) if by == "user" and anonymise else value

    rows_by: dict[str, list[JobFigures]] = defaultdict(list)
    jobs_by: dict[str, list[JobRecord]] = defaultdict(list)
    for f in figures:
        rows_by[key(f)].append(f)
    if by == "class-pair":  # a figure's key: its jobs' key
        fig_ids = {f.job.job_id: f for f in figures}
        for job in jobs:
            jobs_by[key(fig_ids.get(job.job_id, job))].append(job)
    else:
        for job in jobs:
            jobs_by[key(job)].append(job)
    rows = [{"key": k, **aggregate(rows_by.get(k, []), psable, jobs_by[k])}
            for k in sorted(set(rows_by) | set(jobs_by))]
    job_rows = JobRows(figures, anonymise=anonymise)
    shared_jobs = JobRows([f for f in figures if f.on_share], anonymise=anonymise)
    if not lazy_rows:
        job_rows, shared_jobs = list(job_rows), list(shared_jobs)
    notes = []
    if store is None and not groups:
        notes.append("No store given: co-runs and solo times are unknown, so the figures count "
                     "no saving (pass --store or set daemon.store in the config).")
    unknown = len([f for f in figures if f.on_share and f.solo is None])
    if unknown:
        notes.append(f"{unknown} shared job(s) have no solo run time (no solo history, no "
                     "prediction): they count at their own run time and are left out of ISD "
                     "and PS.")
    totals = aggregate(figures, psable, jobs)
    if totals["isd_n"] and totals["isd_small_sample"]:
        notes.append(f"Slowdown from only {totals['isd_n']} job(s): a small sample, not a "
                     "trend.")
    if totals["isd_noisy"]:
        notes.append(f"{totals['isd_noisy']} of {totals['isd_n']} slowdowns are noisy: sacct's "
                     f"1-second times leave them uncertain by more than {NOISY_ISD:.0%} "
                     "(short jobs); see isd_low/isd_high per job.")
    if totals["isd_thin_history"]:
        notes.append(f"{totals['isd_thin_history']} slowdown(s) rest on fewer than "
                     f"{FEW_SOLO_RUNS} solo runs of the job.")
    return {
        "notes": notes,
        "window": {"since": since, "until": until},
        "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": source,
        "by": by,
        "anonymised": anonymise,
        "verdict": verdict(totals),
        "totals": totals,
        "rows": rows,
        "groups": group_rows,
        "shared_jobs": shared_jobs,
        "jobs": job_rows,
        "prediction": prediction_quality(figures),
        "timeline": _timeline(figures, since, until),
        "class_matrix": _class_matrix(figures),
    }
