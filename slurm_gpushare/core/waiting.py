"""What a share waiting in Slurm's queue should become as the cluster moves on: one rule, used
by the daemon (``daemon/waiting.py``, which applies it with ``scontrol update``) and by the
simulator (which applies it to the queued request).

* **Exclusions.** A share is kept off nodes where it could only land next to a running share it
  should not join (``policy.keeps_off``: the job's class or pair predictor, the judgement made
  at submission). The judgement follows the cluster while the job waits: a node comes off the
  job's list once none of the shares that kept it off is there any more and the judgement made
  now does not keep it off either; a node the job could use goes on the list once a share it
  should not join is where it would land there now. Never every node the job could use: it
  would only wait longer.
* **Types.** While none of the types a share is offered on has room for it, slower types its
  request suits (the same count means the same there) that have room are added.

A type is only added, never taken back; an exclusion lasts while its reason does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

from slurm_gpushare.core.config import GpuType
from slurm_gpushare.core.hostlist import expand_hostlist
from slurm_gpushare.core.policy import NodeView, in_partitions, keeps_off, room_types


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
    user_req_nodes: str = ""  # the job's own --nodelist, as written (never excluded)
    scanned: bool = False  # every node it could use judged once for exclusions to add
    own_nodes: frozenset[str] | None = None  # both lists of the user's expanded (read once)
    # Its types' names and its partitions as sets (made once per set of types).
    reach: tuple[frozenset[str], frozenset[str]] | None = None


def can_keep_off(entry: WaitingShare) -> bool:
    """Whether the judgement the share carries can keep it off a node at all."""
    return entry.knowledge is not None and (hasattr(entry.knowledge, "compatible_with")
                                            or entry.job_class is not None)


def usable(entry: WaitingShare, node: NodeView) -> bool:
    """Whether the job could run on ``node`` as submitted and decided and be kept off it: one
    of its types, one of its partitions, on neither of the job's own node lists (the nodes it
    excluded itself; the nodes it named: Slurm refuses a job whose --nodelist node is also
    excluded)."""
    if entry.reach is None:
        entry.reach = (frozenset(g.name for g in entry.types), frozenset(entry.partitions))
    types, partitions = entry.reach
    return (node.gpu_type in types and node.name not in own_nodes(entry)
            and in_partitions(node, partitions))


def own_nodes(entry: WaitingShare) -> frozenset[str]:
    """The nodes on the job's own lists (--exclude, --nodelist), which the daemon never adds."""
    if entry.own_nodes is None:
        entry.own_nodes = frozenset(expand_hostlist(entry.user_exc_nodes)
                                    + expand_hostlist(entry.user_req_nodes))
    return entry.own_nodes


@dataclass(frozen=True)
class Change:
    """What one review does to one waiting share."""

    still: tuple[str, ...]  # its exclusions after it (those kept, then those added)
    added: tuple[GpuType, ...]  # types added
    # The nodes newly excluded -> the shares on them now (what must go before they are lifted).
    blocked: Mapping[str, frozenset] = field(default_factory=dict)


def exc_node_list(user_exc_nodes: str, away: Sequence[str]) -> str:
    """The ExcNodeList a job gets: its own list as written, then the daemon's nodes."""
    return ",".join(([user_exc_nodes] if user_exc_nodes else []) + list(away))


def blocked_now(entry: WaitingShare, node: NodeView, caches: tuple | None = None) -> bool:
    """Whether the job should be kept off ``node`` (its view now): a share that kept it off
    there is still there, or the judgement made now keeps it off (``policy.keeps_off``).
    ``caches``: from ``judge_caches``."""
    if not (entry.blockers or {}).get(node.name, frozenset()).isdisjoint(node.resident_jobs):
        return True
    answers, verdicts, by_node = caches or (None, None, None)
    if entry.decision_id in node.resident_jobs:
        # Its own claim (the view counts a decided share where it will go until it runs):
        # a job is no partner of itself.
        node = replace(node, resident_jobs=tuple(j for j in node.resident_jobs
                                                 if j != entry.decision_id),
                       gpu_jobs=tuple(tuple(j for j in gpu if j != entry.decision_id)
                                      for gpu in node.gpu_jobs))
        by_node = None  # this node's view is the job's own
    if by_node is not None and node.name in by_node:
        return by_node[node.name]
    kept = keeps_off(node, entry.job_class, entry.knowledge, entry.units,
                     _answers=answers, _verdicts=verdicts)
    if by_node is not None:
        by_node[node.name] = kept
    return kept


def judge_caches(entry: WaitingShare, memo: dict | None, fixed_view: bool = True
                 ) -> tuple | None:
    """``(answers, verdicts, by_node)``: the judgement caches that entries judged alike (one
    class or pair predictor, one share size) share in ``memo``. ``by_node`` (verdicts per node
    name) only while the view stays fixed (one review); None otherwise (the simulator, whose
    nodes change between calls)."""
    if memo is None:
        return None
    key = (entry.job_class, id(entry.knowledge), entry.units, fixed_view)
    return memo.setdefault(key, ({}, {}, {} if fixed_view else None))


def still_blocked(entry: WaitingShare, node_of: Callable[[str], NodeView | None],
                  judged: Collection[str] | None = None, memo: dict | None = None
                  ) -> tuple[str, ...]:
    """The nodes of ``entry.away`` that the job should still keep off now (``blocked_now``),
    or that the view no longer knows. ``node_of``: a node's view now by name (None: unknown).
    ``judged``: only these nodes can have changed since the last review (the others stay;
    default: all). ``memo``: one dict for the entries of one review (entries judged alike
    share their answers)."""
    caches = judge_caches(entry, memo)

    def blocked(name: str) -> bool:
        node = node_of(name)
        return node is None or blocked_now(entry, node, caches)

    if judged is None:
        return tuple(name for name in entry.away if blocked(name))
    lifted = {name for name in judged if name in entry.away and not blocked(name)}
    return tuple(n for n in entry.away if n not in lifted) if lifted else entry.away


def newly_blocked(entry: WaitingShare, nodes: Iterable[NodeView], memo: dict | None = None
                  ) -> dict[str, frozenset]:
    """Of ``nodes`` (views now), those the job could use and is not kept off yet that it should
    be kept off now (``blocked_now``), each with the shares on it now."""
    if not can_keep_off(entry):
        return {}
    caches = judge_caches(entry, memo)
    return {node.name: frozenset(node.resident_jobs) for node in nodes
            if node.name not in entry.away and usable(entry, node)
            and blocked_now(entry, node, caches)}


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
               judged: Collection[str] | None = None, memo: dict | None = None, *,
               new_from: Iterable[NodeView] = (), could_use: int = 0) -> Change | None:
    """What to change for one waiting share on ``view`` now (``node_of``, ``judged``,
    ``memo``: as ``still_blocked`` takes them); None: nothing. ``new_from``: the nodes to
    judge for exclusions to add (``newly_blocked``); ``could_use``: how many nodes the job
    could use in all (``usable``): exclusions are added only while one of them stays open."""
    still = still_blocked(entry, node_of, judged, memo)
    blocked = newly_blocked(entry, new_from, memo)
    if blocked and len(still) + len(blocked) < could_use:
        still = still + tuple(blocked)
    else:
        blocked = {}
    added = types_to_add(entry, view, still)
    return None if still == entry.away and not added else Change(still, added, blocked)
