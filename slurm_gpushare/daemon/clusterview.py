"""The daemon's view of the cluster: nodes, their GPU type, and the shares running on them.

Refreshed in the background every few seconds; decisions read the last snapshot and never wait
for Slurm, which runs the hook under its own locks. One refresh is three Slurm calls whatever the
cluster's size: ``sinfo`` for the nodes (features, state, partitions), ``squeue -t R -O ...``
for the running jobs, whose AdminComment tag gives each share's interference class and decision
id (one call, not one ``scontrol show job`` per share), and ``scontrol show reservation``. Not ``squeue --json``: in 22.05 it ignores filters and returns
every job slurmctld holds (24 MB for 7,700 jobs), and parsing that holds the GIL long enough to
make decisions miss the hook's deadline. The snapshot is built off to the side and swapped in
whole; decisions made on one snapshot keep their answers in it (node exclusions in
``Snapshot.memo``; feasibility, idle GPUs and features per partition in ``Snapshot.checks``), and
a refresh answers on the new snapshot, before swapping it in, whatever decisions asked recently:
no decision waits on a scan of every node of a large cluster.

From the running jobs it estimates each GPU's free units and shares (``gpu_occupancy``: Slurm
packs a shared gres onto the first GPU with room). Shares the daemon decided that are not
running yet are kept in a ledger (``claim_share``, ``place_pending``) and counted where Slurm
will most likely start them, so that the decisions of one burst see each other; an entry goes
when the view shows its job running, or after ``PENDING_REFRESHES`` refreshes.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from slurm_gpushare.core import tres as tresmod
from slurm_gpushare.core.config import Config
from slurm_gpushare.core import feasibility
from slurm_gpushare.core.feasibility import state_usable
from slurm_gpushare.core.hostlist import expand_hostlist
from slurm_gpushare.core.policy import (NodeView, capacity, gpus_by_type, idle_gpus_by_type,
                                         in_partitions, incompatible_nodes, landing_gpu,
                                         room_nodes, share_gpus, share_slots)
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.core.types import JobRequest
from slurm_gpushare.daemon.validity import partition_features
from slurm_gpushare.slurm import cmd

log = logging.getLogger("slurm_gpushare.daemon.clusterview")

SINFO_NODES = ["sinfo", "-h", "-N", "-o", "%N|%b|%P|%G|%t"]
# Running jobs with their AdminComment (free text: last, split off at most 3 times). A field
# size of 0 prints the value unpadded and uncut.
SQUEUE_RUNNING = ["squeue", "-h", "-t", "R", "-O",
                  "JobID:0|,NodeList:0|,tres-per-node:0|,admin_comment:0"]
_SHARED = re.compile(r"(^|[,:/])(shard|mps)[:/]")
_GPUS = re.compile(r"(?:^|,)gpu:(?:[^:,(]+:)?(\d+)")
# Decisions share the GIL with the refresh thread: it hands the GIL over after this long, and
# yields it outright every YIELD_EVERY lines it reads (the OS may run it again before a waiting
# decision otherwise, on a busy host).
GIL_SWITCH_S = 0.001
YIELD_EVERY = 500
# A refresh pre-answers the questions decisions asked within the last WARM_REFRESHES refreshes
# (at most WARM_MAX of them, the most recent first); older ones are answered when next asked.
WARM_REFRESHES = 60
WARM_MAX = 256


class Answers(dict):
    """Answers computed on one snapshot, keyed by question; remembers which were asked (read
    or stored), so that the next refresh knows what to pre-answer."""

    def __init__(self):
        super().__init__()
        self.asked: set = set()

    def __getitem__(self, key):
        self.asked.add(key)
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        self.asked.add(key)
        return dict.get(self, key, default)

    def __setitem__(self, key, value):
        self.asked.add(key)
        dict.__setitem__(self, key, value)


class Snapshot(tuple):
    """The nodes as one refresh saw them (never changed), plus answers computed from them."""

    def __new__(cls, nodes=()):
        snapshot = super().__new__(cls, nodes)
        snapshot.memo = Answers()  # policy.incompatible_nodes' answers on this snapshot
        # feasibility.check, policy.idle_gpus_by_type and validity's features per partition
        snapshot.checks = Answers()
        return snapshot


@dataclass(frozen=True)
class NodeInfo:
    gpu_type: str
    partitions: tuple[str, ...]
    gpus: int
    features: tuple[str, ...]  # active features
    state: str  # sinfo %t, e.g. "idle", "mix", "drain", "down*"


def parse_sinfo_nodes(out: str, config: Config) -> dict[str, NodeInfo]:
    """node -> NodeInfo from ``sinfo -h -N -o '%N|%b|%P|%G|%t'`` (one line per node and
    partition); the GPU type is the configured type whose feature the node has."""
    by_feature = {g.feature: g.name for g in config.gpu_types}
    nodes: dict[str, NodeInfo] = {}
    for line in out.splitlines():
        name, features, partition, gres, state = (line.split("|") + ["", "", "", ""])[:5]
        if not name:
            continue
        feature_list = tuple(f for f in features.split(",") if f and f != "(null)")
        gpu_type = next((by_feature[f] for f in feature_list if f in by_feature), "")
        gpus = sum(int(m.group(1)) for m in _GPUS.finditer(gres))
        old = nodes.get(name)
        parts = (old.partitions if old else ()) + ((partition.rstrip("*"),) if partition else ())
        nodes[name] = NodeInfo(gpu_type, tuple(sorted(set(parts))), gpus, feature_list, state)
    return nodes


def read_nodes(config: Config, timeout: float = 10.0) -> dict[str, NodeInfo]:
    """The cluster's nodes, in one sinfo call (empty when Slurm does not answer)."""
    out = cmd.output(SINFO_NODES, timeout=timeout)
    return parse_sinfo_nodes(out, config) if out is not None else {}


def parse_reservations(out: str) -> dict[str, tuple[str, ...]]:
    """reservation -> nodes, from ``scontrol -o show reservation``."""
    found = {}
    for line in out.splitlines():
        name = re.search(r"(?:^|\s)ReservationName=(\S+)", line)
        nodes = re.search(r"(?:^|\s)Nodes=(\S+)", line)
        if name:
            listed = nodes.group(1) if nodes and nodes.group(1) != "(null)" else ""
            found[name.group(1)] = tuple(expand_hostlist(listed)) if listed else ()
    return found


def read_reservations(timeout: float = 10.0) -> dict[str, tuple[str, ...]] | None:
    out = cmd.output(["scontrol", "-o", "show", "reservation"], timeout=timeout)
    if out is None:
        return None
    return parse_reservations(out)


def running_shares(squeue_out: str) -> dict[str, str]:
    """job id -> node of running shares, from ``squeue -h -t R -o '%i|%N|%b'``."""
    shares = {}
    for line in squeue_out.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) != 3:
            continue
        job_id, node, tres = parts
        # Shares are single-node jobs asking for a sharing gres.
        if re.search(r"(^|[,:/])(shard|mps)[:/]", tres) and node and "," not in node \
                and "[" not in node:
            shares[job_id] = node
    return shares


@dataclass(frozen=True)
class RunningJob:
    """What one ``SQUEUE_RUNNING`` line says: the GPUs it holds on each of its nodes and, for a
    share (one node, a sharing gres), its class and decision id from its tag."""

    nodes: tuple[str, ...]
    gpus: int  # GPUs it keeps from others on each node (a share counts as one)
    share_class: int | None = None
    decision_id: str = ""
    shared: bool = False
    job_id: str = ""
    units: int = 0  # units of its shared gres (shards or MPS percent), for a share


def parse_running(line: str) -> RunningJob | None:
    parts = line.split("|", 3)
    if len(parts) < 3 or not parts[1].strip():
        return None
    node_list, tres = parts[1].strip(), parts[2]
    try:
        tokens = tresmod.parse(tres)
    except tresmod.TresError:
        return None
    gpus = sum(t.count for t in tresmod.find(tokens, "gpu"))
    units = sum(t.count for name in ("shard", "mps") for t in tresmod.find(tokens, name))
    shared = bool(_SHARED.search(tres))
    if shared:
        gpus += 1  # it may share its GPU with another share: never over-count idle GPUs
    if not gpus:
        return None
    nodes = (node_list,) if "," not in node_list and "[" not in node_list \
        else tuple(expand_hostlist(node_list))
    if shared and len(nodes) == 1:
        tag = Tag.decode(parts[3].strip() if len(parts) == 4 else "")
        return RunningJob(nodes, gpus, tag.job_class if tag else None,
                          tag.decision_id if tag else "", True, parts[0].strip(), units)
    return RunningJob(nodes, gpus, job_id=parts[0].strip())


def idle_gpus_per_node(gpus_of: Mapping[str, int], squeue_out: str,
                       up: set[str]) -> dict[str, int]:
    """node -> GPUs holding no job, from running jobs (``SQUEUE_RUNNING`` lines, or the first
    three fields of them). Whole-GPU jobs take their count on each of their nodes; a share is
    counted as taking a GPU of its own. Nodes not in ``up`` (down, drained, reserved for
    maintenance) have none."""
    busy: dict[str, int] = {}
    for line in squeue_out.splitlines():
        job = parse_running(line.strip())
        if job:
            for node in job.nodes:
                busy[node] = busy.get(node, 0) + job.gpus
    return {name: (max(0, gpus - busy.get(name, 0)) if name in up else 0)
            for name, gpus in gpus_of.items()}


def gpu_occupancy(gpus: int, per_gpu: int, jobs: Sequence[RunningJob], *,
                  one_shared_gpu: bool = False
                  ) -> tuple[tuple[int, ...], tuple[tuple[str, ...], ...]]:
    """Each GPU's free units of the shared gres and the decision ids of its shares, estimated
    from the jobs running on one node in the order they were submitted (job id): a whole-GPU
    job takes the first GPU holding nothing, a share the first GPU with room -- Slurm packs a
    shared gres that way (``policy.landing_gpu``). squeue names a share's node, not its GPU, so
    this is an estimate; shares of other tools' jobs (no tag) take room but have no id.

    ``one_shared_gpu`` (gres/mps): Slurm uses MPS on one GPU of a node only ("only one GPU will
    be usable in MPS mode per node", gres.html of 22.05 to 24.11; on the test cluster two MPS
    jobs too large to share a GPU ran one after the other on a node with two idle GPUs). The
    node's other GPUs then have no room for a share: the GPU that holds shares keeps its room,
    else the first idle one."""
    free, held = [per_gpu] * gpus, [[] for _ in range(gpus)]
    if not gpus:
        return (), ()
    shared = [False] * gpus

    def order(job: RunningJob) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", job.job_id)) or (0,)

    for job in sorted(jobs, key=order):
        if job.shared and job.units:
            index = next((i for i in range(gpus) if free[i] >= job.units),
                         max(range(gpus), key=lambda i: free[i]))
            free[index] = max(0, free[index] - job.units)
            shared[index] = True
            if job.decision_id:
                held[index].append(job.decision_id)
        whole = job.gpus - (1 if job.shared else 0)
        for index in range(gpus):
            if whole <= 0:
                break
            if free[index] == per_gpu and not shared[index]:
                free[index], whole = 0, whole - 1
    if one_shared_gpu:
        usable = next((i for i in range(gpus) if shared[i]),
                      next((i for i in range(gpus) if free[i] == per_gpu), None))
        free = [f if i == usable else 0 for i, f in enumerate(free)]
    return tuple(free), tuple(tuple(h) for h in held)


@dataclass(frozen=True)
class PendingShare:
    """A share the daemon decided that the view does not show running yet (the ledger)."""

    decision_id: str
    types: tuple[str, ...]
    units: int
    partitions: tuple[str, ...]
    excluded: frozenset[str]
    job_class: int | None
    refresh: int  # the refresh count when it was decided


# Ledger entries are dropped when the view shows the job running, or after this many refreshes
# (the job pends in the queue, was cancelled or was rejected): the view then tells the truth.
PENDING_REFRESHES = 3
# While shares are pending the view is refreshed at least this often, so that it soon shows
# where Slurm put them.
PENDING_REFRESH_S = 1.0


def place_pending(nodes: list[NodeView], entry: PendingShare,
                  per_gpu: Mapping[str, int]) -> int | None:
    """Put ``entry`` where Slurm would most likely start it now: among the nodes it may use
    with room, one whose GPUs are already shared first (Slurm fits a job tightly), then in
    order; on that node, the GPU ``policy.landing_gpu`` names. Updates ``nodes`` in place and
    returns the node's index, or None when no node has room (it waits in the queue)."""
    best, units, wanted = None, entry.units, set(entry.partitions)
    for i, node in enumerate(nodes):
        # Cheapest tests first: this runs on the decision's thread, over every node.
        if (node.gpu_type not in entry.types or not node.free_units
                or max(node.free_units) < units or node.name in entry.excluded
                or not state_usable(node.state)
                or not in_partitions(node, wanted)):
            continue
        shared = any(0 < free < per_gpu.get(node.gpu_type, 0) or jobs
                     for free, jobs in zip(node.free_units, node.gpu_jobs))
        if shared:
            best = i
            break
        if best is None:
            best = i
    if best is None:
        return None
    node = nodes[best]
    gpu = landing_gpu(node, entry.units)
    was_idle = node.free_units[gpu] == per_gpu.get(node.gpu_type, -1) and not node.gpu_jobs[gpu]
    free = list(node.free_units)
    free[gpu] -= entry.units
    held = list(node.gpu_jobs)
    held[gpu] = held[gpu] + (entry.decision_id,)
    nodes[best] = replace(
        node, free_units=tuple(free), gpu_jobs=tuple(held),
        resident_jobs=node.resident_jobs + (entry.decision_id,),
        resident_classes=node.resident_classes + (
            (entry.job_class,) if entry.job_class is not None else ()),
        idle_gpus=(max(0, node.idle_gpus - 1) if was_idle and node.idle_gpus else node.idle_gpus))
    return best


def _idle_less(key: tuple, answer: tuple, claimed: Sequence[tuple[NodeView, int]]) -> tuple:
    """An idle_gpus_by_type answer (key ("idle", types, partitions)) with the claimed GPUs
    taken off: what a fresh pass over the claimed snapshot would say."""
    wanted = set(key[2])
    counts = dict(answer)
    for node, taken in claimed:
        if node.gpu_type in counts and in_partitions(node, wanted):
            counts[node.gpu_type] -= taken
    return tuple((name, n) for name, n in counts.items() if n > 0)


class _Fixed:
    """A ClusterView of one snapshot (and the reservations read with it)."""

    def __init__(self, snapshot: Snapshot, reservations: Mapping[str, tuple[str, ...]]):
        self.snapshot = snapshot
        self._reservations = reservations

    def nodes(self) -> Snapshot:
        return self.snapshot

    def reservations(self) -> Mapping[str, tuple[str, ...]]:
        return self._reservations


class SlurmClusterView:
    """A policy.ClusterView backed by Slurm, refreshed on a background thread."""

    def __init__(self, config: Config, *, interval_s: float = 5.0):
        self.config = config
        self.interval_s = interval_s
        self._snapshot = Snapshot()
        # Every node's features and partitions (GPU nodes or not), for config checks on reload.
        self.all_features: frozenset[str] = frozenset()
        self.all_partitions: frozenset[str] = frozenset()
        self._reservations: dict[str, tuple[str, ...]] = {}
        self._sinfo_out: str | None = None  # the last sinfo output
        self._info: dict[str, NodeInfo] = {}
        # squeue line -> what it says (or None): a refresh parses only the lines that changed
        # since the last one (jobs that started, ended or were retagged).
        self._lines: dict[str, RunningJob | None] = {}
        self._busy: dict[str, int] = {}  # node -> GPUs held by running jobs
        self._residents: dict[str, list[int]] = {}  # node -> classes of its shares (known)
        self._resident_jobs: dict[str, list[str]] = {}  # node -> decision ids of its shares
        self._position: dict[str, int] = {}  # node -> its index in the snapshot
        self._node_jobs: dict[str, dict[str, RunningJob]] = {}  # node -> job id -> job
        self._base: list[NodeView] = []  # the nodes as Slurm shows them (no pending shares)
        # The ledger: shares decided that the view does not show running yet.
        self._pending: dict[str, PendingShare] = {}
        self._ledger_lock = threading.Lock()
        self._per_gpu = {g.name: capacity(g) for g in config.gpu_types}
        self._mps_types = {g.name for g in config.gpu_types if g.sharing == "mps"}
        self._refreshes = 0
        self.refreshed_at: float | None = None  # wall clock of the last good refresh
        self.running_decisions: frozenset[str] = frozenset()  # decision ids of running jobs
        # ("memo" | "checks", question) -> (the refresh it was last asked after, the knowledge
        # base it was asked with, for exclusions): what the next refresh pre-answers.
        self._recent: dict[tuple, tuple[int, object]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Called with the view after each good background refresh, on its thread (work that
        # must follow the cluster but never run on a decision's path: exclusions.py).
        self.after_refresh: list = []

    def nodes(self) -> Snapshot:
        return self._snapshot

    def reservations(self) -> Mapping[str, tuple[str, ...]]:
        """reservation name -> its nodes (feasibility.check reads it for --reservation)."""
        return self._reservations

    def claim_idle(self, gpu_types: Sequence[str], count: int = 1) -> None:
        """A job (an array: ``count`` tasks) was kept whole for idle GPUs of these types: count
        that many such GPUs as taken until the next refresh, so a burst of submissions does not
        send every job after the same idle GPUs (the rest share instead). Every answer carries
        over to the new snapshot, the idle-GPU counts with the claimed GPUs taken off (so the
        next decision makes no pass over every node)."""
        old = self._snapshot
        nodes = list(old)
        claimed = []  # (node as it was, GPUs taken on it)
        left = count
        for i, node in enumerate(nodes):
            if left <= 0:
                break
            if node.idle_gpus and node.gpu_type in gpu_types:
                taken = min(left, node.idle_gpus)
                nodes[i] = replace(node, idle_gpus=node.idle_gpus - taken)
                claimed.append((node, taken))
                left -= taken
        if not claimed:
            return
        snapshot = Snapshot(nodes)
        dict.update(snapshot.memo, list(dict.items(old.memo)))
        dict.update(snapshot.checks, [
            (key, _idle_less(key, answer, claimed) if key[0] == "idle" else answer)
            for key, answer in list(dict.items(old.checks))])
        snapshot.memo.asked, snapshot.checks.asked = old.memo.asked, old.checks.asked
        self._snapshot = snapshot

    def claim_share(self, decision_id: str, types: Sequence[str], units: int,
                    partitions: Sequence[str], excluded: Sequence[str] = (),
                    job_class: int | None = None, room_now: bool | None = None) -> None:
        """A share was decided: count it on the node where Slurm will most likely start it
        (``place_pending``) until the view shows it running, so that the next decisions of a
        burst see it as a resident (pair checks) and as taken room (type choice).
        ``room_now`` False: the decision saw no room on any of its types, so it waits in the
        queue and takes nothing now (no scan of the nodes on the decision's thread)."""
        entry = PendingShare(decision_id, tuple(types), int(units), tuple(partitions),
                             frozenset(excluded), job_class, self._refreshes)
        with self._ledger_lock:
            self._pending[decision_id] = entry
            if room_now is False:
                return
            old = self._snapshot
            nodes = list(old)
            placed = place_pending(nodes, entry, self._per_gpu)
            if placed is None:
                return  # it waits in the queue: nothing it takes now
            snapshot = Snapshot(nodes)
            # Answers about the node's GPU type (room, idle GPUs, exclusions) may change; the
            # others carry over, so the next decision does not scan every node again.
            changed = nodes[placed].gpu_type
            dict.update(snapshot.memo, [(key, answer) for key, answer in
                                        list(dict.items(old.memo)) if changed not in key[1]])
            dict.update(snapshot.checks, [(key, answer) for key, answer in
                                          list(dict.items(old.checks))
                                          if key[0] not in ("idle", "room-nodes")
                                          or changed not in key[1]])
            snapshot.memo.asked, snapshot.checks.asked = old.memo.asked, old.checks.asked
            self._snapshot = snapshot

    def pending(self) -> list[PendingShare]:
        return list(self._pending.values())

    def _account(self, job: RunningJob, sign: int, changed: set[str]) -> None:
        for node in job.nodes:
            self._busy[node] = self._busy.get(node, 0) + sign * job.gpus
            jobs = self._node_jobs.setdefault(node, {})
            if sign > 0:
                jobs[job.job_id] = job
            else:
                jobs.pop(job.job_id, None)
            changed.add(node)
        if job.shared:
            node = job.nodes[0]
            for values, value in ((self._residents, job.share_class),
                                  (self._resident_jobs, job.decision_id)):
                if value is None or value == "":
                    continue
                if sign > 0:
                    values.setdefault(node, []).append(value)
                else:
                    values[node].remove(value)

    def refresh(self) -> bool:
        """Three Slurm calls; work in proportion to what changed since the last refresh; the
        new snapshot replaces the old one in one assignment."""
        sinfo_out = cmd.output(SINFO_NODES, timeout=10.0)
        queue = cmd.output(SQUEUE_RUNNING, timeout=20.0)
        if not sinfo_out or queue is None:
            return False
        reservations = read_reservations()
        if reservations is not None:
            self._reservations = reservations
        nodes = list(self._base)
        if sinfo_out != self._sinfo_out:  # nodes rarely change: rebuild only when they do
            self._info = parse_sinfo_nodes(sinfo_out, self.config)
            self.all_features = frozenset(f for i in self._info.values() for f in i.features)
            self.all_partitions = frozenset(p for i in self._info.values() for p in i.partitions)
            self._lines, self._busy, self._residents, self._resident_jobs = {}, {}, {}, {}
            self._node_jobs = {}
            nodes = [NodeView(name=name, gpu_type=info.gpu_type, partitions=info.partitions,
                              gpus=info.gpus, features=info.features, state=info.state)
                     for name, info in sorted(self._info.items()) if info.gpu_type]
            self._position = {node.name: i for i, node in enumerate(nodes)}
            self._sinfo_out = sinfo_out
            changed = set(self._position)
        else:
            changed = set()
        old, lines = self._lines, {}
        for number, line in enumerate(queue.splitlines()):
            if number % YIELD_EVERY == 0:
                time.sleep(0)  # let a waiting decision have the GIL (and the CPU) now
            if line in old:
                lines[line] = old.pop(line)
                continue
            job = parse_running(line)
            lines[line] = job
            if job:
                self._account(job, +1, changed)
        for gone in old.values():  # lines no longer there: jobs that ended
            if gone:
                self._account(gone, -1, changed)
        self._lines = lines
        for name in changed:
            if name in self._position:
                i, info = self._position[name], self._info[name]
                idle = (max(0, info.gpus - self._busy.get(name, 0))
                        if state_usable(info.state) else 0)
                free, held = gpu_occupancy(info.gpus, self._per_gpu.get(info.gpu_type, 0),
                                           list(self._node_jobs.get(name, {}).values()),
                                           one_shared_gpu=info.gpu_type in self._mps_types)
                if not state_usable(info.state):
                    free = tuple(0 for _ in free)
                nodes[i] = replace(nodes[i], resident_classes=tuple(self._residents.get(name, ())),
                                   resident_jobs=tuple(self._resident_jobs.get(name, ())),
                                   idle_gpus=idle, free_units=free, gpu_jobs=held)
        self._base = nodes
        running = {job.decision_id for job in lines.values() if job and job.decision_id}
        self.running_decisions = frozenset(running)
        with self._ledger_lock:
            # Shares now running are in the view itself; old entries have served their purpose.
            oldest = self._refreshes + 1 - PENDING_REFRESHES
            self._pending = {k: e for k, e in self._pending.items()
                             if k not in running and e.refresh >= oldest}
            pending = dict(self._pending)
        snapshot = Snapshot(self._with_pending(nodes, pending.values()))
        self._warm(snapshot, self._snapshot)  # (off the lock: decisions claim meanwhile)
        with self._ledger_lock:
            claimed = [e for k, e in self._pending.items() if k not in pending]
            if claimed:  # decided while the new snapshot was being answered
                fresh = Snapshot(self._with_pending(list(snapshot), claimed))
                dict.update(fresh.checks, [(key, answer) for key, answer in
                                           list(dict.items(snapshot.checks))
                                           if key[0] not in ("idle", "room-nodes")])
                snapshot = fresh
            self._snapshot = snapshot
        self.refreshed_at = time.time()
        return True

    def _with_pending(self, nodes: list[NodeView], entries) -> list[NodeView]:
        placed = list(nodes)
        for entry in entries:
            place_pending(placed, entry, self._per_gpu)
        return placed

    def health(self) -> dict:
        """GPU nodes known, how many take jobs now, and when Slurm was last read (for `ping`:
        decisions see a node's new state only after the next refresh)."""
        nodes = self._snapshot
        return {"nodes": len(nodes), "usable": sum(state_usable(n.state) for n in nodes),
                "refreshed_at": self.refreshed_at}

    def _warm(self, snapshot: Snapshot, previous: Snapshot) -> None:
        """Answer on the new snapshot, here on the refresh thread, what decisions asked
        recently: a decision then never loops over the nodes itself. The answers are those the
        decision would compute (the same functions, on the same snapshot)."""
        self._refreshes += 1
        recent = self._recent
        for kind, answers in (("memo", previous.memo), ("checks", previous.checks)):
            for key in list(answers.asked):
                hit = dict.get(answers, key)
                knowledge = hit[0] if kind == "memo" and hit is not None \
                    else recent.get((kind, key), (0, None))[1]
                recent[(kind, key)] = (self._refreshes, knowledge)
        oldest = self._refreshes - WARM_REFRESHES
        keep = sorted(((seen, kind_key, knowledge) for kind_key, (seen, knowledge)
                       in recent.items() if seen > oldest), key=lambda e: -e[0])[:WARM_MAX]
        self._recent = {kind_key: (seen, knowledge) for seen, kind_key, knowledge in keep}
        by_name = {g.name: g for g in self.config.gpu_types}
        view = _Fixed(snapshot, self._reservations)
        for _seen, (kind, key), knowledge in keep:
            time.sleep(0)  # a waiting decision goes first
            try:
                _answer(kind, key, knowledge, view, by_name)
            except Exception:  # noqa: BLE001 -- the decision asks again itself
                log.exception("cluster-view-warm-failed")
        snapshot.memo.asked.clear()  # asked by the refresh, not by decisions
        snapshot.checks.asked.clear()

    def start(self) -> None:
        # Hand the GIL to a waiting decision within GIL_SWITCH_S, not Python's default 5 ms.
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
        self._thread = threading.Thread(target=self._loop, name="cluster-view", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                refreshed = self.refresh()
            except Exception:  # noqa: BLE001 -- a bad snapshot keeps the previous one
                log.exception("cluster-view-refresh-failed")
                refreshed = False
            for follow in list(self.after_refresh) if refreshed else ():
                try:
                    follow(self)
                except Exception:  # noqa: BLE001 -- the next refresh tries again
                    log.exception("cluster-view-follow-up-failed")
            # Until the nodes are known every decision keeps its job: ask again soon; while
            # shares are pending, soon too (to see where Slurm put them).
            soon = not self._snapshot or self._pending
            self._stop.wait(min(PENDING_REFRESH_S, self.interval_s) if soon else self.interval_s)


def _answer(kind: str, key: tuple, knowledge, view: _Fixed, by_name: Mapping) -> None:
    """Ask ``view`` the question behind one memo or checks key, so that its answer is kept."""
    if kind == "memo":
        job_class, types, partitions, units = key
        if knowledge is not None and all(name in by_name for name in types):
            incompatible_nodes(job_class, [by_name[n] for n in types], list(partitions), view,
                               knowledge, units)
    elif key[0] == "feasibility":
        _, partition, features, req_nodes, exc_nodes, reservation, types = key
        if all(name in by_name for name in types):
            request = JobRequest(uid=0, partition=partition, features=features,
                                 req_nodes=req_nodes, exc_nodes=exc_nodes, reservation=reservation)
            feasibility.check(request, [by_name[n] for n in types], view)
    elif key[0] == "room-nodes":
        _, types, partitions, units = key
        if all(name in by_name for name in types):
            room_nodes([by_name[n] for n in types], units, list(partitions), view)
    elif key[0] == "slots":
        _, types, partitions, units, excluded = key
        if all(name in by_name for name in types):
            share_slots([by_name[n] for n in types], units, list(partitions), view, excluded)
    elif key[0] == "idle":
        _, types, partitions = key
        if all(name in by_name for name in types):
            idle_gpus_by_type([by_name[n] for n in types], list(partitions), view)
    elif key[0] in ("share-gpus", "gpus"):
        _, types, partitions = key
        if all(name in by_name for name in types):
            ask = share_gpus if key[0] == "share-gpus" else gpus_by_type
            ask([by_name[n] for n in types], list(partitions), view)
    elif key[0] == "partition-features":
        partition_features(view.nodes(), key[1])
