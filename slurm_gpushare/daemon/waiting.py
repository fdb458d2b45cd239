"""Waiting shares follow the cluster: the daemon applies ``core/waiting.py``'s rule (exclusions
whose reason has gone are lifted; a node where the share would now land next to a share it
should not join is excluded; a share whose types stay full is widened to a slower type it
suits that has room) to the jobs in Slurm's queue.

A decision places a share on the view it sees at submission, and Slurm keeps what it wrote
for the job's whole life, unless it is changed:

    scontrol update JobId=<job> [ExcNodeList=<the user's own list + nodes still blocked>] [Features=<wider>] AdminComment=<its tag>

A type is never taken back, and an exclusion is added only while another node the job could
use stays open and lasts only while its reason does. The user's own ``--exclude`` and
``--constraint`` stay as written, and a job whose tag changed
since the daemon last wrote it (a requeue re-sized it) is left alone. The tag goes with every
update (with the new types where they changed): ``job_submit.lua`` refuses updates of a
share's node lists and constraint unless they carry a gpushare tag (only operators and
SlurmUser can set AdminComment). What the daemon wrote is
kept in memory only: after a restart of the daemon, jobs decided before it keep what Slurm
has, as Slurm alone would. Slurm is asked which of those jobs are still pending (one ``squeue
-t PD`` call) only after a refresh that would change one of them: a job found not pending
then is forgotten.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any

from slurm_gpushare.core.policy import in_partitions, retype_features
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.core.waiting import (Change, WaitingShare, can_keep_off, exc_node_list,
                                        own_nodes, review_one)
from slurm_gpushare.daemon.logs import event
from slurm_gpushare.slurm import cmd


# Pending jobs with their gpushare tag (free text: last; a field size of 0 prints it uncut).
# JobArrayID names an array's pending tasks as scontrol update takes them (1234_[2-9]).
SQUEUE_PENDING = ["squeue", "-h", "-t", "PD", "-O", "JobArrayID:0|,admin_comment:0"]
# A decision younger than this is not looked for in Slurm's queue (its job may not be there yet).
SETTLE_S = 2.0
MAX_ENTRIES = 10_000  # the oldest go first: memory stays bounded whatever happens
# Waiting shares whose every usable node is judged for the first time in one pass (oldest
# first; the others at the next refresh): a burst of submissions on a large cluster does not
# hold the view's thread. After its first pass a share is judged only on nodes that changed.
SCANS_PER_PASS = 50
YIELD_EVERY = 500  # squeue lines read between handing the GIL to a waiting decision


def parse_pending(out: str) -> dict[str, list[tuple[str, str]]]:
    """decision id -> ``(job id as scontrol update takes it, its tag)`` of each pending job
    carrying a gpushare tag, from ``SQUEUE_PENDING`` output."""
    found: dict[str, list[tuple[str, str]]] = {}
    for number, line in enumerate(out.splitlines()):
        if number % YIELD_EVERY == 0:
            time.sleep(0)  # a long queue: let a waiting decision have the GIL now
        if "gpushare:" not in line:
            continue
        job_id, _, comment = line.partition("|")
        tag = Tag.decode(comment.strip())
        if tag is not None and tag.decision_id and job_id.strip():
            found.setdefault(tag.decision_id, []).append((job_id.strip(), comment.strip()))
    return found


class WaitingShares:
    """The daemon's waiting shares that may need to follow the cluster."""

    def __init__(self) -> None:
        self._entries: dict[str, WaitingShare] = {}
        self._lock = threading.Lock()
        self._last: dict[str, Any] = {}  # node name -> its view at the last pass

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, entry: WaitingShare) -> None:
        if not entry.away and not entry.later and not can_keep_off(entry):
            return  # nothing it could change
        with self._lock:
            self._entries[entry.decision_id] = entry
            while len(self._entries) > MAX_ENTRIES:
                self._entries.pop(next(iter(self._entries)))

    def review(self, view, *, now: float | None = None) -> list[dict[str, Any]]:
        """One pass (on the view's thread, after a refresh). Returns one dict per job updated
        or refused."""
        now = time.monotonic() if now is None else now
        with self._lock:
            # Shares the view shows running are done with (an array's other tasks may wait).
            for started in self._entries.keys() & getattr(view, "running_decisions", ()):
                if not self._entries[started].array:
                    del self._entries[started]
            entries = list(self._entries.values())
        nodes = view.nodes()
        by_name = {n.name: n for n in nodes}
        # Nodes whose view changed since the last pass (a refresh rebuilds only those).
        changed = [n for n in nodes if self._last.get(n.name) is not n]
        self._last = by_name
        by_type: dict[str, list] = {}
        for node in nodes:
            by_type.setdefault(node.gpu_type, []).append(node)
        changes, memo, scans, pools = [], {}, SCANS_PER_PASS, {}
        for entry in entries:
            if now - entry.decided_at < SETTLE_S:
                continue  # a decision made this instant may not be a job in the queue yet
            time.sleep(0)  # room for a type may scan its nodes: a waiting decision goes first
            if entry.blockers is None:
                entry.blockers = {n.name: frozenset(n.resident_jobs)
                                  for n in entry.seen_on or () if n.name in entry.away}
                entry.seen_on = None
            new_from, could_use = (), 0
            if can_keep_off(entry) and (entry.scanned or scans > 0):
                # The nodes of its types and partitions (one list per pass for each such set);
                # newly_blocked leaves out those on the user's own lists.
                key = (tuple(g.name for g in entry.types), entry.partitions)
                pool = pools.get(key)
                if pool is None:
                    wanted = set(entry.partitions)
                    listed = [n for g in entry.types for n in by_type.get(g.name, ())
                              if in_partitions(n, wanted)]
                    pool = pools[key] = (listed, {n.name for n in listed})
                listed, names = pool
                could_use = len(names) - len(own_nodes(entry) & names)
                if entry.scanned:
                    new_from = [n for n in changed if n.name in names]
                else:
                    new_from, entry.scanned, scans = listed, True, scans - 1
            change = review_one(entry, view, by_name.get, memo=memo, new_from=new_from,
                                could_use=could_use)
            if change is not None:
                changes.append((entry, change))
        if not changes:
            return []
        out = cmd.output(SQUEUE_PENDING, timeout=20.0)
        if out is None:
            return []  # Slurm did not answer: after the next refresh
        pending = parse_pending(out)
        done = []
        for entry, change in changes:
            # Only jobs still as the daemon last wrote them: one whose tag changed since (a
            # requeue re-sized it, narrowing its types) is not updated from what is known here.
            jobs = [job_id for job_id, tag in pending.get(entry.decision_id, ())
                    if tag == entry.tag]
            if not jobs:  # it started, ended, was cancelled or re-decided: nothing to change
                self._drop(entry.decision_id)
                continue
            done += self._apply(entry, change, jobs)
        return done

    def _apply(self, entry: WaitingShare, change: Change, jobs: list[str]) -> list[dict]:
        args, record = [], {"id": entry.decision_id}
        types, tag = entry.types, entry.tag
        if change.still != entry.away:
            args.append(f"ExcNodeList={exc_node_list(entry.user_exc_nodes, change.still)}")
            record.update(lifted=[n for n in entry.away if n not in change.still],
                          still=list(change.still))
            if change.blocked:
                record["excluded"] = list(change.blocked)
        later = entry.later
        if change.added:
            features = retype_features(entry.features, entry.types, entry.types + change.added)
            decoded = Tag.decode(entry.tag)
            if features is None or decoded is None:
                later = ()  # not in the form the decision wrote: not guessed at
            else:
                types = entry.types + change.added
                added = {g.name for g in change.added}
                later = tuple(g for g in entry.later if g.name not in added)
                tag = replace(decoded, types=tuple(g.name for g in types)).encode()
                args.append(f"Features={features}")
                record.update(added_types=sorted(added), types=[g.name for g in types])
                entry.features = features
                # The added types' nodes are judged whole at the next pass.
                entry.scanned, entry.reach = False, None
        done = []
        for job_id in jobs if args else ():
            result = cmd.run(["scontrol", "update", f"JobId={job_id}", *args,
                              f"AdminComment={tag}"])
            outcome = {**record, "job_id": job_id}
            if result.ok:
                event(logging.INFO, "waiting-share-updated", **outcome)
            else:
                outcome["error"] = result.message[:200]
                event(logging.WARNING, "waiting-share-update-failed", **outcome)
            done.append(outcome)
        # Refused or not, the job is not updated again for the same change: a refusal (the job
        # started meanwhile, an operator's hold) does not go away by retrying.
        entry.away, entry.tag, entry.types, entry.later = change.still, tag, types, later
        entry.blockers = {**{n: b for n, b in (entry.blockers or {}).items() if n in entry.away},
                          **change.blocked}
        if not entry.away and not entry.later and not can_keep_off(entry):
            self._drop(entry.decision_id)
        return done

    def _drop(self, decision_id: str) -> None:
        with self._lock:
            self._entries.pop(decision_id, None)
