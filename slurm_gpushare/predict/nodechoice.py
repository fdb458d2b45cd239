"""Which GPU types a job should be constrained to (SchedTune, Eq. 1-2).

Eq. 1: the queueing delay on a type is the remaining time of the jobs running there plus the
estimated time of the jobs pending for it, divided by the number of GPUs of that type.
Eq. 2: the estimated job completion time (JCT) on a type is that delay plus the job's predicted
run time there. The job may go to every type its safe memory estimate fits, best JCT first; a
type the user named is a hard constraint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence


@dataclass(frozen=True)
class TypeQueue:
    """The queue of one GPU type as the scheduler sees it."""

    gpus: int  # GPUs of this type (shares of one GPU count as that GPU)
    running_remaining_s: Sequence[float] = ()  # remaining time of each running job
    pending_estimated_s: Sequence[float] = ()  # estimated run time of each pending job

    def delay_s(self) -> float:
        """SchedTune Eq. 1."""
        if self.gpus <= 0:
            return math.inf
        work = sum(max(0.0, t) for t in self.running_remaining_s)
        work += sum(max(0.0, t) for t in self.pending_estimated_s)
        return work / self.gpus


@dataclass(frozen=True)
class RankedType:
    gpu_type: str
    jct_s: float  # delay + run time (Eq. 2); the delay alone if the run time is unknown
    delay_s: float
    runtime_s: float | None
    safe_mib: float


@dataclass(frozen=True)
class NodeChoice:
    ranked: tuple[RankedType, ...]  # types that fit, best estimated JCT first
    excluded: Mapping[str, str] = field(default_factory=dict)  # type -> why not

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(r.gpu_type for r in self.ranked)

    @property
    def best(self) -> RankedType | None:
        return self.ranked[0] if self.ranked else None


def choose_types(safe_mib: Mapping[str, float], runtime_s: Mapping[str, float],
                 queues: Mapping[str, TypeQueue], capacity_mib: Mapping[str, float], *,
                 requested_type: str | None = None,
                 max_jct_ratio: float | None = None) -> NodeChoice:
    """Rank the GPU types a job fits on by estimated JCT.

    ``safe_mib``: OOM-safe peak per type (a type missing has no estimate and is excluded);
    ``capacity_mib``: usable memory per configured type; ``runtime_s``: predicted run time per
    type (a type without one ranks after those with one, by queueing delay);
    ``requested_type``: the type the user named, the only one allowed;
    ``max_jct_ratio``: drop types whose JCT exceeds the best one's by this factor.
    """
    ranked, excluded = [], {}
    for name, capacity in capacity_mib.items():
        if requested_type and name != requested_type:
            excluded[name] = f"the job asks for {requested_type}"
            continue
        need = safe_mib.get(name)
        if need is None or not math.isfinite(need):
            excluded[name] = "no memory estimate for this type"
            continue
        if need > capacity:
            excluded[name] = (f"needs {need / 1024:.1f} GiB, has {capacity / 1024:.1f} GiB")
            continue
        queue = queues.get(name, TypeQueue(gpus=0))
        delay = queue.delay_s()
        if not math.isfinite(delay):
            excluded[name] = "no GPU of this type"
            continue
        run = runtime_s.get(name)
        ranked.append(RankedType(name, delay + (run or 0.0), delay, run, need))
    if requested_type and requested_type not in capacity_mib:
        excluded[requested_type] = "type not configured"
    # Known run times first; then by JCT; ties by smaller memory headroom left unused.
    ranked.sort(key=lambda r: (r.runtime_s is None, r.jct_s,
                               capacity_mib[r.gpu_type] - r.safe_mib, r.gpu_type))
    if max_jct_ratio and ranked and ranked[0].runtime_s is not None:
        limit = ranked[0].jct_s * max_jct_ratio
        keep = [r for r in ranked if r.runtime_s is not None and r.jct_s <= limit]
        for r in ranked:
            if r not in keep:
                excluded[r.gpu_type] = (f"estimated JCT {r.jct_s:.0f} s is over "
                                        f"{max_jct_ratio:g}x the best ({ranked[0].jct_s:.0f} s)")
        ranked = keep
    return NodeChoice(tuple(ranked), excluded)
