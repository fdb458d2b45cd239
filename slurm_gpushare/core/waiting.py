"""What a share waiting in Slurm's queue should become as the cluster moves on: one rule, used
by the daemon (``daemon/waiting.py``, which applies it with ``scontrol update``) and by the
simulator (which applies it to the queued request).

* **Exclusions.** A share is kept off nodes where it could only land next to a running share it
  should not join (``policy.incompatible_nodes``). A node comes off the job's list once none of
  the shares that kept it off is there any more and the same judgement (the job's class or pair
  predictor, as at submission: ``policy.keeps_off``) made now does not keep it off either.
* **Types.** While none of the types a share is offered on has room for it, slower types its
  request suits (the same count means the same there) that have room are added.

Nothing is ever taken back: an exclusion is only lifted, a type only added.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Sequence

from slurm_gpushare.core.config import GpuType
from slurm_gpushare.core.policy import NodeView, keeps_off, room_types


@dataclass
class WaitingShare:
    """One share decision that may need to follow the cluster while its job waits."""

    decision_id: str
    tag: str  # the job's AdminComment, re-sent with every update
    features: str  # its constraint as the decision wrote it ("" where it wrote none)
    types: tuple[GpuType, ...]  # the types it is offered on
    later: tuple[GpuType, ...]  # slower types its request suits, not offered (yet)
    user_exc_nodes: str  # what the job excluded itself, as written
    away: tuple[str, ...]  # the nodes the daemon added, still in force
    # node -> decision ids of the shares on it when decided; None: read off ``seen_on`` at the
    # first review (not on the submit path, where it would loop over every node)
    blockers: dict[str, frozenset[str]] | None
    partitions: tuple[str, ...]
    units: int
    job_class: int | None
    knowledge: Any  # the judgement made at submission (class knowledge or pair predictor)
    array: bool = False  # one decision for many tasks: some may run while others wait
    decided_at: float = field(default_factory=time.monotonic)
    seen_on: Any = None  # the view's nodes the decision saw (until blockers are read off it)


@dataclass(frozen=True)
class Change:
    """What one review does to one waiting share."""

    still: tuple[str, ...]  # its exclusions after it
    added: tuple[GpuType, ...]  # types added


def exc_node_list(user_exc_nodes: str, away: Sequence[str]) -> str:
    """The ExcNodeList a job gets: its own list as written, then the daemon's nodes."""
    return ",".join(([user_exc_nodes] if user_exc_nodes else []) + list(away))


def still_blocked(entry: WaitingShare, node_of: Callable[[str], NodeView | None],
                  judged: Collection[str] | None = None, memo: dict | None = None
                  ) -> tuple[str, ...]:
    """The nodes of ``entry.away`` that the job should still keep off now: one of the shares
    that kept it off is still there, the judgement made now keeps it off (a newer partner it
    should not join, where it could land now), or the view no longer knows it. ``node_of``: a
    node's view now by name (None: unknown). ``judged``: only these nodes can have changed
    since the last review (the others stay; default: all). ``memo``: one dict for the entries
    of one review (entries judged alike share their answers)."""
    caches = None
    if memo is not None:
        caches = memo.setdefault((entry.job_class, id(entry.knowledge), entry.units), ({}, {}))
    answers, verdicts = caches or (None, None)

    def blocked(name: str) -> bool:
        node = node_of(name)
        return (node is None
                or not entry.blockers.get(name, frozenset()).isdisjoint(node.resident_jobs)
                or keeps_off(node, entry.job_class, entry.knowledge, entry.units,
                             _answers=answers, _verdicts=verdicts))

    if judged is None:
        return tuple(name for name in entry.away if blocked(name))
    lifted = {name for name in judged if name in entry.away and not blocked(name)}
    return tuple(n for n in entry.away if n not in lifted) if lifted else entry.away


def types_to_add(entry: WaitingShare, view, away: Sequence[str]) -> tuple[GpuType, ...]:
    """The slower types to add: none while one of its types has room for it (or the view does
    not know), else those of ``entry.later`` with room now (outside ``away``)."""
    if not entry.later:
        return ()
    room = room_types(entry.types, entry.units, entry.partitions, view, away)
    if room is None or room:
        return ()
    extra = room_types(entry.later, entry.units, entry.partitions, view, away) or set()
    return tuple(g for g in entry.later if g.name in extra)


def review_one(entry: WaitingShare, view, node_of: Callable[[str], NodeView | None],
               judged: Collection[str] | None = None, memo: dict | None = None
               ) -> Change | None:
    """What to change for one waiting share on ``view`` now (``node_of``, ``judged``,
    ``memo``: as ``still_blocked`` takes them); None: nothing."""
    still = still_blocked(entry, node_of, judged, memo)
    added = types_to_add(entry, view, still)
    return None if still == entry.away and not added else Change(still, added)
