"""Lift a waiting share's node exclusions once their reason has gone.

A share is kept off nodes where it could only land next to a running share it should not join
(``policy.incompatible_nodes``, judged on the view when it was submitted). Slurm keeps a job's
ExcNodeList for its whole life: once those partners end, the job would go on waiting for other
nodes while an excluded one has room for it. So after each refresh of the cluster view the
daemon asks the same question again, with the same judgement (the job's class or pair
predictor as at submission), for its shares still pending in Slurm, and takes off the nodes no
longer blocked:

    scontrol update JobId=<job> ExcNodeList=<the user's own list + nodes still blocked> AdminComment=<its tag>

An exclusion is only ever taken off, never added: a job waits at most for the exclusions it was
submitted with. The user's own ``--exclude`` is kept as written. The tag goes with the update
unchanged: ``job_submit.lua`` refuses updates of a share's node lists unless they carry a
gpushare tag (only operators and SlurmUser can set AdminComment). Which nodes were the daemon's
is kept in memory only: after a restart of the daemon, jobs decided before it keep their
exclusions, as Slurm alone would. Slurm is asked which of those jobs are still pending (one
``squeue -t PD`` call) only after a refresh that frees a node of some job's exclusions: a job
found not pending then is forgotten.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from slurm_gpushare.core.policy import incompatible_nodes
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.core.config import GpuType
from slurm_gpushare.daemon.logs import event
from slurm_gpushare.slurm import cmd

log = logging.getLogger("slurm_gpushare.daemon.exclusions")

# Pending jobs with their gpushare tag (free text: last; a field size of 0 prints it uncut).
# JobArrayID names an array's pending tasks as scontrol update takes them (1234_[2-9]).
SQUEUE_PENDING = ["squeue", "-h", "-t", "PD", "-O", "JobArrayID:0|,admin_comment:0"]
# A decision younger than this is not looked for in Slurm's queue (its job may not be there yet).
SETTLE_S = 2.0
MAX_ENTRIES = 10_000  # the oldest go first: memory stays bounded whatever happens
YIELD_EVERY = 500  # squeue lines read between handing the GIL to a waiting decision


@dataclass
class Exclusion:
    """One share decision that kept its job off nodes (``away``)."""

    decision_id: str
    tag: str  # the job's AdminComment, re-sent with the update
    user_exc_nodes: str  # what the job excluded itself, as written
    away: tuple[str, ...]  # the nodes the daemon added, still in force
    blockers: dict[str, frozenset[str]]  # node -> decision ids of the shares on it then
    fits: tuple[GpuType, ...]
    partitions: tuple[str, ...]
    units: int
    job_class: int | None
    knowledge: Any  # the judgement made at submission (class knowledge or pair predictor)
    decided_at: float = field(default_factory=time.monotonic)


def exc_node_list(user_exc_nodes: str, away: Sequence[str]) -> str:
    """The ExcNodeList a job gets: its own list as written, then the daemon's nodes."""
    return ",".join(([user_exc_nodes] if user_exc_nodes else []) + list(away))


def still_blocked(entry: Exclusion, view) -> tuple[str, ...]:
    """The nodes of ``entry.away`` that the job should still keep off, on ``view`` now: one of
    the shares that kept it off is still there, the judgement made now keeps it off (a newer
    partner it should not join, where it could land now), or the view no longer knows it."""
    judged = set(incompatible_nodes(entry.job_class, entry.fits, entry.partitions, view,
                                    entry.knowledge, entry.units, all_of_them=True)[0])
    residents = {n.name: set(n.resident_jobs) for n in view.nodes() if n.name in entry.away}
    return tuple(n for n in entry.away
                 if n in judged or n not in residents
                 or entry.blockers.get(n, frozenset()) & residents[n])


def parse_pending(out: str) -> dict[str, list[str]]:
    """decision id -> the job ids (as scontrol update takes them) of pending jobs carrying a
    gpushare tag, from ``SQUEUE_PENDING`` output."""
    found: dict[str, list[str]] = {}
    for number, line in enumerate(out.splitlines()):
        if number % YIELD_EVERY == 0:
            time.sleep(0)  # a long queue: let a waiting decision have the GIL now
        if "gpushare:" not in line:
            continue
        job_id, _, comment = line.partition("|")
        tag = Tag.decode(comment.strip())
        if tag is not None and tag.decision_id and job_id.strip():
            found.setdefault(tag.decision_id, []).append(job_id.strip())
    return found


class ExclusionWatch:
    """The daemon's shares with exclusions of its own, lifted as their reasons go."""

    def __init__(self) -> None:
        self._entries: dict[str, Exclusion] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, entry: Exclusion) -> None:
        with self._lock:
            self._entries[entry.decision_id] = entry
            while len(self._entries) > MAX_ENTRIES:
                self._entries.pop(next(iter(self._entries)))

    def review(self, view, *, now: float | None = None) -> list[dict[str, Any]]:
        """One pass (on the view's thread, after a refresh): take off the exclusions whose
        reason has gone from the jobs still pending. Slurm is asked which jobs those are only
        when there is something to lift. Returns one dict per job updated or refused."""
        now = time.monotonic() if now is None else now
        with self._lock:
            entries = list(self._entries.values())
        # A decision made this instant may not be a job in Slurm's queue yet.
        liftable = [(e, still) for e in entries if now - e.decided_at >= SETTLE_S
                    for still in [still_blocked(e, view)] if still != e.away]
        if not liftable:
            return []
        out = cmd.output(SQUEUE_PENDING, timeout=20.0)
        if out is None:
            return []  # Slurm did not answer: after the next refresh
        pending = parse_pending(out)
        done = []
        for entry, still in liftable:
            jobs = pending.get(entry.decision_id)
            if not jobs:  # it started, ended or was cancelled: nothing to lift any more
                self._drop(entry.decision_id)
                continue
            lifted = [n for n in entry.away if n not in still]
            new_list = exc_node_list(entry.user_exc_nodes, still)
            for job_id in jobs:
                result = cmd.run(["scontrol", "update", f"JobId={job_id}",
                                  f"ExcNodeList={new_list}", f"AdminComment={entry.tag}"])
                record = {"id": entry.decision_id, "job_id": job_id, "lifted": lifted,
                          "still": list(still)}
                if result.ok:
                    event(logging.INFO, "exclusion-lifted", **record)
                else:
                    record["error"] = result.message[:200]
                    event(logging.WARNING, "exclusion-lift-failed", **record)
                done.append(record)
            # Refused or not, the job is not updated again for the same nodes: a refusal (the
            # job started meanwhile, an operator's hold) does not go away by retrying.
            entry.away = still
            if not still:
                self._drop(entry.decision_id)
        return done

    def _drop(self, decision_id: str) -> None:
        with self._lock:
            self._entries.pop(decision_id, None)
