"""The event-driven engine: a heap of completion/kill events, arrivals merged in time order.

State is kept in flat arrays indexed by GPU (``g_*``), node (``n_*``) and job (``j_*``) so that
a whole-GPU placement is a few vectorised numpy operations and an event a few list updates.
What every pass asks (the most free GiB per GPU, per node, per type, per class; how many nodes
of each type have n empty GPUs) is kept current by each start and end for the GPUs and nodes it
touched, not recomputed over the cluster, so a share's placement looks only at the GPUs of the
few nodes whose room reaches it (plain Python: numpy costs more than it saves on such small
sets); the heads of the queue's buckets are kept sorted; reservations per GPU type are kept
until a planned end of that type changes (bench/results/sim_speed.json: the full Philly trace
per policy). Policies (``policies.py``) decide admission (whole GPUs or a share of so many GiB
on which types), queue order and placement; the engine does the rest. (Shared memory is
counted in units of ``EngineOptions.share_unit_mib``, the site's shard size: 1 GiB by default,
which the comments below call GiB.)

- Scheduling passes at each event time: the queue in policy order, up to ``depth`` start
  attempts (Slurm's ``bf_max_job_test``). Jobs of one shape (GPU count, types, memory, and
  class for class-aware policies) wait in one bucket; when one fails, the bucket is skipped for
  the rest of the pass (resources only shrink during a pass). A bucket's head is tested for room
  of its kind only when its turn comes, and once the room is below the least need of every
  queued bucket the pass stops (every head left would fail). For backfilling policies the
  first job that cannot start gets an EASY reservation (the earliest time enough of its GPUs
  free up, from running jobs' planned ends); later jobs start only if they avoid the reserved
  nodes or are predicted to end before then.
- Speeds: a GPU's co-runners run at the speeds the interference model gives; whenever a GPU's
  co-runners change, every job on it is re-planned (progress so far is banked at the old
  speed, a new completion event is pushed, the old one is invalidated by a version number).
  Invalidated events are dropped as soon as they reach the top of the heap, without moving
  the clock (they used to stretch the timeline past the last real event, which understated
  the allocation of sharing policies).
- OOM: when a job starts, if the real peak memory of the jobs on a GPU exceeds it, the newcomer
  overflows: it is killed ``oom_delay`` s later (or at its end if sooner), counted, and requeued
  with its original priority; the policy re-admits it knowing it was killed (a whole GPU).
  A pair the interference model marks as failing to co-run is handled the same way and counted
  apart.
- Every job ends as done, killed (too many kills), rejected (can never fit the cluster),
  dropped (``drop_unplaced``: not placed on arrival), or cutoff (running at ``until``).
"""

from __future__ import annotations

import bisect
import heapq
import math
from itertools import compress
from operator import ge
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from slurm_gpushare.sim.cluster import SPEED_PROFILES, Cluster
from slurm_gpushare.sim.workload import Workload

FINISH, KILL = 0, 1
DONE, KILLED, REJECTED, DROPPED, CUTOFF, PENDING = "done", "killed", "rejected", "dropped", "cutoff", "pending"


@dataclass(frozen=True)
class Request:
    """What a job asks the scheduler for after admission."""

    whole: bool  # whole GPUs (also every multi-GPU job)
    types: np.ndarray  # (T,) bool: GPU types it may run on
    shards: np.ndarray | None = None  # (T,) int: units (share_unit_mib) per GPU type (shares)
    exclude: frozenset[int] = frozenset()  # node indices it must avoid
    est_runtime: float = 0.0  # for backfill and ordering
    code: str = ""  # why (for gpushare: the decision's code)
    nice: int = 0  # for gpushare: the decision's nice (the SJF lever)

    def __post_init__(self):
        key = (self.types.tobytes(), None if self.shards is None else self.shards.tobytes())
        object.__setattr__(self, "key", key)
        # (type, GiB) for each allowed type: quick tests run for every queued share in a pass
        # (one tuple per shape of request, made once).
        need = _NEEDS.get(key)
        if need is None:
            shards = None if self.shards is None else self.shards.tolist()
            need = _NEEDS[key] = () if shards is None else tuple(
                (t, int(shards[t])) for t in np.flatnonzero(self.types).tolist())
        object.__setattr__(self, "need", need)


_NEEDS: dict = {}  # Request.key -> Request.need


@dataclass
class EngineOptions:
    depth: int = 500  # jobs examined per scheduling pass (Slurm bf_max_job_test)
    oom_delay: float = 60.0  # s from start until an overflowing job dies
    max_kills: int = 3  # kills after which a job is given up
    drop_unplaced: bool = False  # openb inflation: a pod not placed on arrival is dropped
    max_jobs_per_gpu: int | None = None  # None: the cluster spec's cap
    # MiB in one unit of shared GPU memory: the site's shard size ([shares] shard_mib); every
    # sharing policy rounds its shares up to whole units.
    share_unit_mib: int = 1024


@dataclass
class Result:
    """Raw outcome of one run; ``metrics.summarise`` turns it into figures."""

    policy: str
    jobs: dict  # per-job arrays
    gpus: dict  # per-GPU accounting arrays
    timeline: dict  # time, queued, running, busy_gpus, allocated (request units)
    counters: dict
    wall_s: float = 0.0
    codes: dict = field(default_factory=dict)
    cpu_s: float = 0.0  # this process's CPU time: unlike wall_s, not inflated by other load


class Engine:
    def __init__(self, cluster: Cluster, work: Workload, policy, model, *,
                 options: EngineOptions | None = None, progress: Callable[[int], None] | None = None):
        self.cluster, self.work, self.policy, self.model = cluster, work, policy, model
        self.opt = options or EngineOptions()
        self.cap = self.opt.max_jobs_per_gpu or cluster.max_jobs_per_gpu
        self.progress = progress
        self.class_aware = policy.class_aware
        self.sharing = policy.shares
        G, N = cluster.n_gpus, len(cluster.nodes)
        self.G, self.N = G, N
        # GPUs
        self.g_type = cluster.gpu_type
        self.g_node = cluster.gpu_node
        self.g_node_list = self.g_node.tolist()
        self.unit_mib = self.opt.share_unit_mib
        self.g_cap = (cluster.gpu_mem_gib * 1024 // self.unit_mib).astype(np.int64)  # units
        self.g_used = np.zeros(G, np.int64)  # units reserved (a whole GPU reserves all)
        self._cap_mib = (self.g_cap * self.unit_mib).tolist()
        self.g_njobs = np.zeros(G, np.int64)
        self.g_whole = np.zeros(G, bool)
        self.g_free_at = [0.0] * G  # planned time the GPU empties (0: empty)
        self.g_jobs: list[list[int]] = [[] for _ in range(G)]
        self.g_profile = [SPEED_PROFILES.index(cluster.types[t].speed_profile) for t in self.g_type]
        self.g_last = [0.0] * G
        self.g_busy = [0.0] * G
        self.g_work = [0.0] * G
        self.g_shared = [0.0] * G
        self.g_speedsum = [0.0] * G
        self.g_profile_arr = np.array(self.g_profile)
        self.g_classmask = [0] * G  # bit c set: a class-c job shares the GPU
        self.version = 0  # bumped whenever allocations change (for cached views)
        # Nodes
        self.n_type = np.array([n.gpu_type for n in cluster.nodes])
        self.n_type_list = self.n_type.tolist()
        self.n_gpus = np.array([n.gpus for n in cluster.nodes])
        self.n_first = cluster.node_first_gpu
        self.n_free = self.n_gpus.copy()  # empty GPUs per node
        self.n_free_list = self.n_free.tolist()  # the same, read per node
        gmax = int(self.n_gpus.max())
        self.free_whole = G
        self.max_pernode = int(self.n_gpus.max())
        self.type_gpus = [np.flatnonzero(self.g_type == t).tolist()
                          for t in range(len(cluster.types))]
        self._type_lists: dict = {}  # types (bytes) -> their indices
        self.n_classes = int(work.job_class.max(initial=0)) + 1
        self._masks: dict = {}
        # Kept current by every start and end (only the nodes touched are recomputed):
        # n_room, the most free GiB on one shareable GPU of each node; type_room, the same per
        # type, and type_room_node a node that has it; n_changed, the nodes whose allocations
        # changed since the policy's view of the nodes last looked (it empties the set: at most
        # every node, however long the run).
        self.n_room = np.maximum.reduceat(self.g_cap, self.n_first)
        self._n_room = self.n_room.tolist()  # the same as a list (read per node)
        # Free GiB on each GPU a share may join (0 when held whole or at the job cap): what
        # placements test, per GPU of the few nodes whose room reaches a share.
        self.g_free = self.g_cap.tolist()
        # The node of each GPU change, in order (every start and end): a waiting share that
        # looked at every node reads only the nodes changed since (``GpuShare.place``).
        self.changes: list[int] = []
        self._n_gpu_range = [range(int(f), int(f) + int(c)) for f, c in zip(self.n_first, self.n_gpus)]
        self._node_range = range(N)
        self.n_changed: set[int] = set()
        # Class-aware policies: the same room per class, on GPUs the policy lets it join
        # (``class_node_room[c][node]``, ``class_type_room[c][t]``; set up after prepare).
        self.class_node_room = [[0] * N for _ in range(self.n_classes)]
        self.class_type_room = [[0] * len(cluster.types) for _ in range(self.n_classes)]
        self.type_nodes_list = [[int(n) for n in np.flatnonzero(self.n_type == t)]
                                for t in range(len(cluster.types))]
        # Per type, per n: how many of its nodes have at least n empty GPUs (kept by
        # _free_changed; whole requests ask whether any node outside a reservation has room).
        self.free_counts = [[sum(1 for node in nodes if self.n_free_list[node] >= n)
                             for n in range(gmax + 1)] for nodes in self.type_nodes_list]
        self.type_room = [0] * len(cluster.types)
        self.type_room_node = [-1] * len(cluster.types)
        for t in range(len(cluster.types)):
            self._type_room(t)
        self._whole_nodes: dict = {}  # (version, types, GPUs per node) -> nodes with them empty
        self._need: dict = {}  # request key -> GiB needed per node
        self._ever_fits: dict = {}  # (request key, GPUs of a whole request) -> can_ever_fit
        self._mem_true_by_type: dict = {}
        # The last reservation (holds until allocations change: ``version``). Per GPU type: a
        # version bumped when a planned end of its GPUs changes, and the soonest starts on its
        # nodes, (type, GPUs per node, nodes) -> (version, when, nodes), kept until then.
        self.type_ready_version = [0] * len(cluster.types)
        # Each node's GPUs' planned ends, soonest first (rows re-sorted only for nodes whose
        # planned ends changed since the last look: ``_ends_stale``).
        self._ends_pad = [[math.inf] * (gmax - c) for c in range(gmax + 1)]  # by GPUs per node
        self.n_ends = [[0.0] * c + self._ends_pad[c] for c in self.n_gpus.tolist()]
        self._ends_stale: set = set()
        # Per type, a heap of (planned end, GPU) over its GPUs: the GPU that empties soonest (the
        # first in node order on a tie) without a scan of the type. An entry holds while the
        # GPU's planned end is still its time; others are dropped when they reach the top.
        self.g_type_list = self.g_type.tolist()
        self._end_heaps = [[(0.0, g) for g in gpus] for gpus in self.type_gpus]
        self._type_ready: dict = {}
        self._reserved: tuple = (None, None)
        T = len(cluster.types)
        self.type_total = np.array([self.n_gpus[self.n_type == t].sum() for t in range(T)])
        self.type_pernode = np.array([self.n_gpus[self.n_type == t].max(initial=0) for t in range(T)])
        # Jobs
        J = len(work)
        self.J = J
        self.j_state = [PENDING] * J
        self.j_first = [math.nan] * J
        self.j_start = [math.nan] * J
        self.j_end = [math.nan] * J
        self.j_rem = [0.0] * J
        self.j_speed = [1.0] * J
        self.j_last = [0.0] * J
        self.j_ver = [0] * J
        self.j_finish = [0.0] * J
        self.j_gpus: list[list[int]] = [[] for _ in range(J)]
        self.j_type = [-1] * J
        self.j_kills = [0] * J
        self.j_oom = [0] * J
        self.j_maxco = [0] * J
        self.j_req: list[Request | None] = [None] * J
        self.j_shared = [False] * J
        self.j_pending_kill = [None] * J
        # Seconds each running job has shared a GPU with each partner (partner -> seconds), kept
        # only for a policy that learns from co-runs (``Policy.run_ended``), as the node agent
        # reports a job's co-runs to the daemon.
        self.learns = bool(getattr(policy, "learns_coruns", False))
        self.j_overlap: list[dict | None] = [None] * J
        self.kind = work.kind.tolist()
        self.jclass = work.job_class.tolist()
        self.submit = work.submit.tolist()
        self.ngpus = work.n_gpus.tolist()
        self.nnodes = work.n_nodes.tolist()
        self.heap: list = []
        self.seq = 0
        self.buckets: dict[tuple, list] = {}
        # (key of its head, shape, 0) for every bucket, sorted (so a valid heap as it is): a
        # full pass starts from a copy instead of gathering and heapifying every bucket's head.
        # Keys end with the job index, so entries never compare by shape.
        self.heads: list = []
        self.bucket_needs: dict[tuple, list] = {}  # shape -> its needs (``_needs``)
        self.need_count: dict = {}  # need -> queued buckets with it
        self._least = None  # _least_need() while no bucket is made or emptied
        self.queued = 0
        self.arrived_shapes: set = set()  # shapes enqueued since the last pass
        self.released = True  # resources freed since the last pass
        self.last_blocked = None
        self.now = 0.0
        self.counters = {"oom_kills": 0, "pair_failures": 0, "started": 0, "passes": 0,
                         "backfilled": 0, "shared_starts": 0}
        self.t_time: list[float] = []
        self.t_queued: list[int] = []
        self.t_running: list[int] = []
        self.t_busy: list[int] = []
        self.t_alloc: list[float] = []
        self.running = 0
        self.allocated = 0.0  # GPUs requested (trace units) by running jobs
        self.codes: dict[str, int] = {}
        policy.prepare(self)
        if self.class_aware:
            self._allocations_changed(range(G), bump=False)

    # --- queries used by policies --------------------------------------------------------

    def share_candidates(self, req: Request, exclude=None, *, cap: int | None = None,
                         rooms: list | None = None, first: bool = False) -> list[int]:
        """GPUs (ascending, i.e. Slurm's node order) where the share fits now, outside its and
        the pass's exclusions. Only nodes whose room (``rooms``: default ``node_room``; a
        class's room for class-aware policies) reaches the share are looked at: few, on a
        busy cluster. ``first``: the first such GPU only (``landing_gpus``: each node's first)."""
        need = self._node_need(req)
        skip = req.exclude | exclude if exclude else req.exclude
        tight = cap is not None and cap < self.cap  # the job cap of free GiB is not enough
        g_free, g_njobs, ranges = self.g_free, self.g_njobs, self._n_gpu_range
        out = []
        # The nodes whose room reaches the share, filtered at C speed (most have none).
        for node in compress(self._node_range, map(ge, self._n_room if rooms is None else rooms,
                                                   need)):
            if node in skip:
                continue
            gib = need[node]
            for g in ranges[node]:
                if g_free[g] >= gib and not (tight and g_njobs[g] >= cap):
                    out.append(g)
                    if first:
                        return out
        return out

    def landing_gpus(self, req: Request, exclude=None) -> Iterator[int]:
        """Each node's first GPU where the share fits now (where Slurm lands it on that node),
        in Slurm's node order, outside its and the pass's exclusions, one at a time (a waiting
        share judged by its pair predictor stops at the first it may join)."""
        need = self._node_need(req)
        skip = req.exclude | exclude if exclude else req.exclude
        g_free, ranges = self.g_free, self._n_gpu_range
        for node in compress(self._node_range, map(ge, self._n_room, need)):
            if node not in skip:
                gib = need[node]
                for g in ranges[node]:
                    if g_free[g] >= gib:
                        yield g
                        break

    def landing_gpu(self, req: Request, node: int) -> int | None:
        """``landing_gpus`` on one node, the pass's exclusions aside: its first GPU where the
        share fits now, or None."""
        gib = self._node_need(req)[node]
        if self._n_room[node] < gib or node in req.exclude:
            return None
        g_free = self.g_free
        for g in self._n_gpu_range[node]:
            if g_free[g] >= gib:
                return g
        return None

    def _node_mask(self, req: Request, exclude) -> np.ndarray:
        """Nodes of the request's types outside its and the pass's exclusions (cached)."""
        key = (req.key[0], req.exclude, exclude)
        mask = self._masks.get(key)
        if mask is None:
            mask = req.types[self.n_type].copy()
            for node in set(req.exclude) | set(exclude or ()):
                mask[node] = False
            if len(self._masks) > 4096:
                self._masks.clear()
            self._masks[key] = mask
        return mask

    def node_room(self) -> np.ndarray:
        """Most free GiB on one shareable GPU of each node (kept current for sharing policies;
        not to be changed)."""
        return self.n_room

    def _allocations_changed(self, gpus, *, bump: bool = True):
        """Update the room of the nodes these GPUs belong to, and of their types: a type's
        room is recomputed over its nodes only when the node that held it lost room."""
        cap, g_whole, g_cap, g_used = self.cap, self.g_whole, self.g_cap, self.g_used
        joinable = self.policy.joinable if self.class_aware else None
        g_free, g_node, g_jobs = self.g_free, self.g_node_list, self.g_jobs
        for g in gpus:  # only these GPUs changed (g_njobs counts g_jobs)
            g_free[g] = int(g_cap[g] - g_used[g]) if not g_whole[g] and len(g_jobs[g]) < cap else 0
        nodes = {g_node[g] for g in gpus}
        self.changes.extend(nodes)
        for node in nodes:
            gpus_of = self._n_gpu_range[node]
            first, count = gpus_of.start, len(gpus_of)
            t = self.n_type_list[node]
            free = g_free[first:first + count]
            room = max(free)  # free GiB are never negative
            self.n_room[node] = self._n_room[node] = room
            if room >= self.type_room[t]:
                self.type_room[t], self.type_room_node[t] = room, node
            elif node == self.type_room_node[t]:
                self._type_room(t)
            if joinable is not None:
                most = [0] * self.n_classes  # per class, the most free GiB it may join
                for g, f in zip(range(first, first + count), free):
                    if f > 0:
                        for c, ok in enumerate(joinable(self, g)):
                            if ok and f > most[c]:
                                most[c] = f
                for c, node_room in enumerate(self.class_node_room):
                    old = node_room[node]
                    node_room[node] = room = most[c]
                    type_room = self.class_type_room[c]
                    if room >= type_room[t]:
                        type_room[t] = room
                    elif old == type_room[t]:  # it may have held the type's most room
                        type_room[t] = max(map(node_room.__getitem__, self.type_nodes_list[t]))
            if bump:
                self.n_changed.add(node)

    def _type_room(self, t: int):
        """The most room on a node of type t, and the first node that has it (from scratch)."""
        nodes = self.type_nodes_list[t]
        if not nodes:
            return
        rooms = [self._n_room[n] for n in nodes]
        k = rooms.index(max(rooms))
        self.type_room[t], self.type_room_node[t] = rooms[k], nodes[k]

    def _node_need(self, req: Request) -> list[int]:
        """GiB the share needs on each node (more than any GPU holds on nodes of other types)."""
        need = self._need.get(req.key)
        if need is None:
            need = self._need[req.key] = np.where(req.types[self.n_type], req.shards[self.n_type],
                                                  np.iinfo(np.int64).max).tolist()
        return need

    def _share_room_outside(self, req: Request, skip: frozenset) -> bool:
        """Some node of the request's types, not in ``skip``, has room for its share now: the
        roomiest node of one of its types, else a plain loop over the nodes (cheaper than a
        cached set that each start makes stale)."""
        for t, gib in req.need:
            if gib <= self.type_room[t] and self.type_room_node[t] not in skip:
                return True
        for node in compress(self._node_range, map(ge, self._n_room, self._node_need(req))):
            if node not in skip:
                return True
        return False

    def _share_fits_outside(self, req: Request) -> bool:
        """Some node outside the request's exclusions has room for its share."""
        return self._share_room_outside(req, req.exclude)

    def _room_outside(self, j: int, req: Request, skip: frozenset) -> bool:
        """Could the job's request fit now on a node not in ``skip``?"""
        if not req.whole:
            return self._share_room_outside(req, skip)
        n = min(self.ngpus[j], self.max_pernode)
        count = 0  # nodes of its types with n GPUs empty
        for t in self._types_of(req):
            count += self.free_counts[t][n]
        if count > len(skip):  # more such nodes than skipped ones: one is outside
            return True
        if not count:
            return False
        key = (self.version, req.key[0], n)
        nodes = self._whole_nodes.get(key)
        if nodes is None:
            if len(self._whole_nodes) > 1024:
                self._whole_nodes.clear()
            ok = req.types[self.n_type] & (self.n_free >= n)
            nodes = self._whole_nodes[key] = frozenset(np.flatnonzero(ok).tolist())
        return not nodes <= skip

    def _types_of(self, req: Request) -> list[int]:
        """The request's GPU types (indices)."""
        types = self._type_lists.get(req.key[0])
        if types is None:
            types = self._type_lists[req.key[0]] = np.flatnonzero(req.types).tolist()
        return types

    def _free_changed(self, node: int, step: int):
        """Node ``node`` has ``step`` (+1 or -1) more empty GPUs: n_free and free_counts."""
        old = self.n_free_list[node]
        self.n_free_list[node] = self.n_free[node] = old + step
        counts = self.free_counts[self.n_type_list[node]]
        if step > 0:
            counts[old + 1] += 1
        else:
            counts[old] -= 1

    def whole_candidates(self, j: int, req: Request, exclude=None, *,
                         first: bool = False) -> list[tuple[int, ...]]:
        """Node groups that can take the job's whole GPUs now: [(node, ...), ...] in node order."""
        n = self.ngpus[j]
        nodes_asked = self.nnodes[j]
        type_ok = self._node_mask(req, exclude)
        if nodes_asked <= 1 and n <= self.max_pernode:
            fit = type_ok & (self.n_free >= n)
            if first:
                k = int(fit.argmax())
                return [(k,)] if fit[k] else []
            return [(int(x),) for x in np.flatnonzero(fit)]
        out = []
        for t in np.flatnonzero(req.types):
            per_max = self.type_pernode[t]
            k = nodes_asked or math.ceil(n / per_max)
            per = math.ceil(n / k)
            nodes = np.flatnonzero(type_ok & (self.n_type == t) & (self.n_free >= per))
            if len(nodes) >= k:
                out.append(tuple(int(x) for x in nodes[:k]))
                if first:
                    break
        return out

    def take_whole(self, j: int, nodes: tuple[int, ...]) -> list[int]:
        """The job's GPUs on these nodes: the first empty ones of each."""
        n, k = self.ngpus[j], len(nodes)
        per = math.ceil(n / k)
        gpus = []
        for node in nodes:
            want = min(per, n - len(gpus))
            first = int(self.n_first[node])
            for g in range(first, first + int(self.n_gpus[node])):
                if want == 0:
                    break
                if not self.g_jobs[g]:
                    gpus.append(g)
                    want -= 1
        return gpus

    def can_ever_fit(self, j: int, req: Request) -> bool:
        """The request fits the empty cluster (answered once per request shape)."""
        key = (req.key, req.whole and self.ngpus[j])
        fits = self._ever_fits.get(key)
        if fits is None:
            if not req.whole:
                fits = bool(np.any(req.types[self.g_type] & (req.shards[self.g_type] <= self.g_cap)))
            else:
                fits = bool(np.any(req.types & (self.type_total >= self.ngpus[j])))
            self._ever_fits[key] = fits
        return fits

    # --- events ---------------------------------------------------------------------------

    def _push(self, time: float, kind: int, j: int):
        self.seq += 1
        heapq.heappush(self.heap, (time, kind, self.seq, j, self.j_ver[j]))

    def _account(self, g: int):
        now = self.now
        dt = now - self.g_last[g]
        njobs = len(self.g_jobs[g])  # (g_njobs[g], read faster)
        if dt > 0 and njobs:
            self.g_busy[g] += dt
            self.g_work[g] += dt * self.g_speedsum[g]
            if njobs > 1:
                self.g_shared[g] += dt
                if self.learns:
                    jobs = self.g_jobs[g]
                    for a in jobs:
                        overlap = self.j_overlap[a]
                        if overlap is None:
                            overlap = self.j_overlap[a] = {}
                        for b in jobs:
                            if b != a:
                                overlap[b] = overlap.get(b, 0.0) + dt
        self.g_last[g] = now

    def _replan_gpu(self, g: int):
        """New speeds for the jobs sharing GPU g; re-plan their completion events."""
        jobs = self.g_jobs[g]
        now = self.now
        if not jobs:
            self.g_speedsum[g] = 0.0
            self._planned_end(g, 0.0)
            return
        if len(jobs) == 1:
            speeds = [1.0]
        else:
            speeds = self.model.speeds(self.g_profile[g], [self.kind[i] for i in jobs],
                                       [self.jclass[i] for i in jobs])
            if speeds is None:  # a failing pair: time-sliced until the newcomer dies
                speeds = [1.0 / len(jobs)] * len(jobs)
        free_at = 0.0
        for i, s in zip(jobs, speeds):
            self.j_rem[i] -= (now - self.j_last[i]) * self.j_speed[i]
            self.j_last[i] = now
            self.j_speed[i] = s
            self.j_ver[i] += 1
            finish = now + max(self.j_rem[i], 0.0) / s
            self.j_finish[i] = finish
            self._push(finish, FINISH, i)
            if self.j_pending_kill[i] is not None:
                # a pending kill keeps its time; re-push under the new version
                self._push(self.j_pending_kill[i][0], KILL, i)
            if finish > free_at:
                free_at = finish
            if len(jobs) > self.j_maxco[i]:
                self.j_maxco[i] = len(jobs)
        self.g_speedsum[g] = float(sum(speeds))
        self._planned_end(g, free_at)

    def _planned_end(self, g: int, when: float):
        """GPU g empties at ``when``: the soonest starts on its type's nodes are stale."""
        self.g_free_at[g] = when
        t = self.g_type_list[g]
        self.type_ready_version[t] += 1
        heap = self._end_heaps[t]
        heapq.heappush(heap, (when, g))
        if len(heap) > 4 * len(self.type_gpus[t]) + 64:  # mostly stale entries: rebuilt
            heap[:] = [(self.g_free_at[x], x) for x in self.type_gpus[t]]
            heapq.heapify(heap)
        self._ends_stale.add(self.g_node_list[g])

    def start(self, j: int, gpus: list[int]):
        req = self.j_req[j]
        now = self.now
        t = int(self.g_type[gpus[0]])
        self.j_type[j], self.j_gpus[j] = t, gpus
        self.j_state[j] = "running"
        if self.j_first[j] != self.j_first[j]:
            self.j_first[j] = now
        self.j_start[j] = now
        self.j_rem[j] = float(self.work.solo[j, t])
        self.j_last[j] = now
        self.j_speed[j] = 1.0
        self.j_pending_kill[j] = None
        self.running += 1
        self.version += 1
        self.allocated += float(self.work.gpu_request[j])
        self.counters["started"] += 1
        shards = 0 if req.whole else int(req.shards[t])
        overflow, failed = False, False
        mem_true = self._mem_true(t)
        for g in gpus:
            self._account(g)
            jobs = self.g_jobs[g]
            if not jobs:  # (g_njobs counts g_jobs)
                self._free_changed(self.g_node_list[g], -1)
                self.free_whole -= 1
            jobs.append(j)
            self.g_njobs[g] += 1
            if req.whole:
                self.g_whole[g] = True
                self.g_used[g] = self.g_cap[g]
            else:
                self.g_used[g] += shards
                self.g_classmask[g] |= 1 << self.jclass[j]
            if sum(map(mem_true.__getitem__, jobs)) > self._cap_mib[g]:
                overflow = True
            if len(jobs) > 1:
                self.j_shared[j] = True
                if self.model.speeds(self.g_profile[g], [self.kind[i] for i in jobs],
                                     [self.jclass[i] for i in jobs]) is None:
                    failed = True
        if self.sharing:  # rooms are read only by sharing policies
            self._allocations_changed(gpus)
        if self.j_shared[j]:
            self.counters["shared_starts"] += 1
        if overflow or failed:
            when = now + min(self.opt.oom_delay, float(self.work.solo[j, t]) * 0.999)
            self.j_pending_kill[j] = (when, "oom" if overflow else "pair")
        for g in gpus:
            self._replan_gpu(g)

    def _mem_true(self, t: int) -> list[float]:
        """Every job's real peak memory on type t (MiB), as a list (read per co-runner)."""
        column = self._mem_true_by_type.get(t)
        if column is None:
            column = self._mem_true_by_type[t] = self.work.mem_true[:, t].tolist()
        return column

    def _release(self, j: int):
        gpus = self.j_gpus[j]
        req = self.j_req[j]
        t = self.j_type[j]
        shards = 0 if req.whole else int(req.shards[t])
        for g in gpus:
            self._account(g)
            jobs = self.g_jobs[g]
            jobs.remove(j)
            self.g_njobs[g] -= 1
            if req.whole:
                self.g_whole[g] = False
                self.g_used[g] = 0
            else:
                self.g_used[g] -= shards
            if not jobs:  # (g_njobs counts g_jobs)
                self._free_changed(self.g_node_list[g], +1)
                self.free_whole += 1
            if not req.whole:
                mask = 0
                for i in jobs:
                    mask |= 1 << self.jclass[i]
                self.g_classmask[g] = mask
        if self.sharing:
            self._allocations_changed(gpus)
        self.version += 1
        self.released = True
        self.j_ver[j] += 1  # invalidates its pending events
        self.j_pending_kill[j] = None
        self.running -= 1
        self.allocated -= float(self.work.gpu_request[j])
        for g in gpus:
            self._replan_gpu(g)

    def _finish(self, j: int):
        self._release(j)
        self.j_end[j] = self.now
        self.j_state[j] = DONE
        overlap = self.j_overlap[j]
        if overlap is not None:
            # What the node agent would report at the job's end: its partners, how long each
            # overlapped its run, and the run's length against its time alone on that type.
            self.j_overlap[j] = None
            self.policy.run_ended(j, self, overlap, self.now - self.j_start[j],
                                  float(self.work.solo[j, self.j_type[j]]))

    def _kill(self, j: int, cause: str):
        self._release(j)
        self.j_overlap[j] = None  # a killed run reports no slowdown
        self.j_kills[j] += 1
        if cause == "oom":
            self.counters["oom_kills"] += 1
            self.j_oom[j] += 1
        else:
            self.counters["pair_failures"] += 1
        if self.j_kills[j] >= self.opt.max_kills:
            self.j_state[j] = KILLED
            self.j_end[j] = self.now
            return
        self._enqueue(j)

    # --- queue and scheduling --------------------------------------------------------------

    def _enqueue(self, j: int):
        req = self.policy.admit(j, self)
        self.codes[req.code] = self.codes.get(req.code, 0) + 1
        if not self.can_ever_fit(j, req):
            self.j_req[j] = req
            self.j_state[j] = REJECTED
            return
        self.j_state[j] = "queued"
        self._queue(j, req)

    def _queue(self, j: int, req: Request):
        self.j_req[j] = req
        # Jobs of one shape (same request, same memory) wait in one bucket, in policy order:
        # when one fails to start in a pass, the rest of its bucket is skipped at once.
        need = None if req.whole else tuple(req.shards.tolist())
        shape = (self.policy.memo_key(j, req), need)
        bucket = self.buckets.get(shape)
        if bucket is None:
            bucket = self.buckets[shape] = []
            self.bucket_needs[shape] = self._needs(j, req)
            self._count_needs(shape, 1)
        entry = (self.policy.key(j, self), j)
        if not bucket or entry < bucket[0]:  # a new head
            if bucket:
                self._drop_head(bucket[0][0], shape)
            bisect.insort(self.heads, (entry[0], shape, 0))
        bisect.insort(bucket, entry)
        self.queued += 1
        self.arrived_shapes.add(shape)

    def _take_out(self, shape, bucket: list, pos: int) -> bool:
        """Take the job at ``pos`` out of its bucket (the kept heads follow); True when the
        bucket is left empty (``_drop_bucket`` it)."""
        if pos == 0:
            self._drop_head(bucket[0][0], shape)
            if len(bucket) > 1:
                bisect.insort(self.heads, (bucket[1][0], shape, 0))
        del bucket[pos]
        self.queued -= 1
        return not bucket

    def _drop_bucket(self, shape):
        del self.buckets[shape]
        self._count_needs(shape, -1)
        del self.bucket_needs[shape]

    def _drop_head(self, key, shape):
        """Take a bucket's head out of ``heads``."""
        i = bisect.bisect_left(self.heads, (key, shape, 0))
        del self.heads[i]

    def _share_room(self) -> list:
        """Most free GiB on one shareable GPU, per type; per class too for class-aware policies
        (``[per type, class 0, class 1, ...]``: GPUs the policy would let that class join).
        A copy of the rooms kept current by every start and end."""
        if not self.class_aware:  # a type's roomiest GPU is its roomiest node's
            return [list(self.type_room)]
        return [list(self.type_room)] + [list(r) for r in self.class_type_room]

    def _quick_fits(self, j: int, req: Request, room) -> bool:
        """Is there room of the request's kind at all (outside the nodes it must avoid)?"""
        if not self._room_fits(j, req, room):
            return False
        return req.whole or not req.exclude or self._share_fits_outside(req)

    def _room_fits(self, j: int, req: Request, room, free_whole: int | None = None) -> bool:
        """Is there room of the request's kind at all (exclusions aside)? ``free_whole``:
        empty GPUs (default: now). Runs for bucket heads in every pass: kept to plain loops."""
        if req.whole:
            return (self.free_whole if free_whole is None else free_whole) >= self.ngpus[j]
        need = req.need
        if self.class_aware:  # room its class may join
            class_room = room[1 + self.jclass[j]]
            for t, gib in need:
                if gib <= class_room[t]:
                    break
            else:
                return False
        # Some node of its types has room iff the roomiest GPU of one of its types does.
        type_room = room[0]
        for t, gib in need:
            if gib <= type_room[t]:
                return True
        return False

    def _needs(self, j: int, req: Request) -> list:
        """What a job needs to pass its quick test, as keys of ``need_count``: ("whole", GPUs),
        or (room index, type, GiB) for each type of a share (one for all jobs of a bucket)."""
        if req.whole:
            return [("whole", self.ngpus[j])]
        index = 1 + self.jclass[j] if self.class_aware else 0  # the room its class may join
        return [(index, t, gib) for t, gib in req.need]

    def _count_needs(self, shape, step: int):
        self._least = None
        for need in self.bucket_needs[shape]:
            count = self.need_count.get(need, 0) + step
            if count:
                self.need_count[need] = count
            else:
                del self.need_count[need]

    def _least_need(self) -> list:
        """[fewest whole GPUs, {room index: fewest GiB per type}] over the queued buckets (kept
        while no bucket is made or emptied). A head passes its quick test only if the room
        reaches its need, and room only shrinks during a pass: below these, every head fails."""
        if self._least is None:
            self._least = self._compute_least_need()
        return self._least

    def _compute_least_need(self) -> list:
        least = [math.inf, {}]
        for need in self.need_count:
            if need[0] == "whole":
                least[0] = min(least[0], need[1])
                continue
            index, t, gib = need
            fewest = least[1].get(index)
            if fewest is None:
                fewest = least[1][index] = [math.inf] * len(self.type_room)
            if gib < fewest[t]:
                fewest[t] = gib
        return least

    def _may_fit(self, least: list, room) -> bool:
        """Can any job ``least`` was noted from pass its quick test in this room?"""
        if self.free_whole >= least[0]:
            return True
        for index, fewest in least[1].items():
            for have, need in zip(room[index], fewest):
                if have >= need:
                    return True
        return False

    def _first_without_room(self, heads: list, room, free_whole: int, room_before: dict):
        """(job, request) of the first bucket head (in policy order) among ``heads`` that
        failed its quick test when the pass began, or None: ``room`` and ``free_whole`` were
        the room then; ``room_before``: the room then of each node that lost room since (a
        share's exclusions are tested against nodes' room). Only heads that began the pass at
        the top of their bucket count."""
        first = None
        for key, shape, pos in heads:
            if pos or (first is not None and first[0] < key):
                continue
            j = self.buckets[shape][0][1]
            req = self.j_req[j]
            if not self._room_fits(j, req, room, free_whole):
                fits = False
            elif req.whole or not req.exclude or self._share_fits_outside(req):
                fits = True  # room outside its exclusions now: there was then
            else:
                need = self._node_need(req)
                fits = any(had >= need[node] for node, had in room_before.items()
                           if node not in req.exclude)
            if not fits:
                first = (key, j)
        return None if first is None else (first[1], self.j_req[first[1]])

    def _reservation(self, j: int, req: Request) -> tuple[float, frozenset[int]]:
        """EASY: when and where the blocked job j will start, from planned ends."""
        n = 1 if not req.whole else self.ngpus[j]
        key = (self.version, req.whole, n, self.nnodes[j], req.key[0])
        if self._reserved[0] == key:  # the same blocked shape, nothing started or ended since
            return self._reserved[1]
        self._reserved = (key, self._reserve(j, req, n))
        return self._reserved[1]

    def _reserve(self, j: int, req: Request, n: int) -> tuple[float, frozenset[int]]:
        types = self._types_of(req)
        nodes_asked = self.nnodes[j]
        if req.whole and (nodes_asked > 1 or n > self.max_pernode):
            best = (math.inf, frozenset())
            for t in types:
                k = nodes_asked or math.ceil(n / self.type_pernode[t])
                per = math.ceil(n / k)
                if per > self.max_pernode:
                    continue
                when, nodes = self._soonest(t, per, k)
                if when < best[0]:
                    best = (when, nodes)
            return best
        # One node: the soonest of all allowed nodes, the first in node order on a tie (each
        # type's answer is its soonest node, the first among its own); none at all: node 0.
        soonest = [self._soonest(t, n, 1) for t in types] if n <= self.max_pernode else []
        when = min((w for w, _ in soonest), default=math.inf)
        if when == math.inf:
            return math.inf, frozenset([0])
        node = min(min(nodes) for w, nodes in soonest if w == when)
        return float(when), frozenset([node])

    def _soonest(self, t: int, per: int, k: int) -> tuple[float, frozenset[int]]:
        """The k nodes of type t where ``per`` GPUs each empty soonest (ties in node order) and
        when the last of them does (inf if the type has fewer nodes); cached until a planned
        end of the type's GPUs changes."""
        key = (t, per, k)
        hit = self._type_ready.get(key)
        version = self.type_ready_version[t]
        if hit is not None and hit[0] == version:
            return hit[1], hit[2]
        if per == 1 and k == 1:
            # The node of the type's GPU that empties soonest (the first such GPU: node order).
            heap, ends = self._end_heaps[t], self.g_free_at
            if not heap:
                return math.inf, frozenset()
            while heap[0][0] != ends[heap[0][1]]:  # a stale entry (every GPU has a current one)
                heapq.heappop(heap)
            when, g = heap[0]
            chosen = frozenset([self.g_node_list[g]])
            self._type_ready[key] = (version, when, chosen)
            return when, chosen
        nodes = self.type_nodes_list[t]
        rows = self.n_ends
        # When each node has ``per`` GPUs empty: its GPUs' planned ends, soonest first (empty
        # GPUs read 0, padding inf), the per-th.
        if self._ends_stale:
            # Row by row in plain Python: few nodes change between looks.
            g_free_at, pad = self.g_free_at, self._ends_pad
            for node in self._ends_stale:
                gpus = self._n_gpu_range[node]
                rows[node] = sorted(g_free_at[gpus.start:gpus.stop]) + pad[len(gpus)]
            self._ends_stale.clear()
        ready = [rows[node][per - 1] for node in nodes]
        if k == 1:  # the first node in node order on a tie
            if not ready:
                return math.inf, frozenset()
            when = min(ready)
            chosen = frozenset([nodes[ready.index(when)]])
            self._type_ready[key] = (version, when, chosen)
            return when, chosen
        order = sorted(range(len(nodes)), key=ready.__getitem__)[:k]  # stable: node order on ties
        when = ready[order[-1]] if len(order) == k else math.inf
        chosen = frozenset(nodes[i] for i in order)
        self._type_ready[key] = (version, when, chosen)
        return when, chosen

    def schedule(self, only: set | None = None):
        """One pass over the queue in policy order (buckets merged by their heads).

        ``only``: the shapes of jobs that just arrived when nothing was released since the last
        pass; every other bucket failed then and would fail again.
        """
        if not self.queued:
            return
        policy = self.policy
        sharing = policy.shares
        room = self._share_room() if sharing else None
        if not (self.free_whole > 0 or (sharing and max(room[0]) > 0)):
            return
        self.counters["passes"] += 1
        # Buckets are merged in policy order by their heads. A head gets its quick test (is
        # there room of its kind at all?) when its turn comes, in the room of that moment: room
        # only shrinks during a pass, so a head fails then iff it would have failed in the room
        # the pass began with, or after a start that took that room. The first head in order
        # that fails may be the blocked job.
        if only is None:
            heads = self.heads.copy()
        else:
            heads = [(self.buckets[s][0][0], s, 0) for s in only if s in self.buckets]
            heapq.heapify(heads)
        first_room, first_free, room_before = room, self.free_whole, {}
        reservation = None
        blocked = None
        if only is not None and self.last_blocked is not None:
            if self.j_state[self.last_blocked[0]] == "queued":
                blocked = self.last_blocked
        tried = 0
        emptied = []
        backfill = policy.backfill
        quick_fits, j_req = self._quick_fits, self.j_req
        room_shrank = True  # since the last look at the least need of all buckets
        depth = self.opt.depth
        while heads and tried < depth:
            if self.free_whole == 0 and not (sharing and max(room[0]) > 0):
                break
            if room_shrank:
                room_shrank = False
                if not self._may_fit(self._least_need(), room):
                    # Below what any queued bucket needs: every head left would fail its
                    # quick test in turn, the first of them blocked if no job is yet.
                    if blocked is None:
                        key, shape, pos = heads[0]
                        j = self.buckets[shape][pos][1]
                        blocked = (j, j_req[j])
                    heads = []
                    break
            key, shape, pos = heapq.heappop(heads)
            bucket = self.buckets[shape]
            j = bucket[pos][1]
            req = j_req[j]
            if not quick_fits(j, req, room):
                if blocked is None:
                    blocked = (j, req)
                continue
            tried += 1
            if blocked is None or not backfill:
                placed = policy.place(j, req, self, None)
                if placed is None:
                    if blocked is None:
                        blocked = (j, req)
                    continue  # the whole bucket fails in this pass
            else:
                if reservation is None:
                    reservation = self._reservation(*blocked)
                shadow, reserved = reservation
                if not self._room_outside(j, req, reserved | req.exclude):
                    placed = None  # room only on the reserved nodes: no need to ask
                else:
                    placed = policy.place(j, req, self, reserved)
                if placed is None:
                    # Outside the reservation the bucket fails; its jobs short enough to end
                    # before the reserved start may still go anywhere.
                    limit = shadow - self.now
                    size = len(bucket)
                    while pos < size and j_req[bucket[pos][1]].est_runtime > limit:
                        pos += 1
                    if pos == size:
                        continue
                    j = bucket[pos][1]
                    req = j_req[j]
                    placed = policy.place(j, req, self, None)
                    if placed is None:
                        continue
                self.counters["backfilled"] += 1
            if self._take_out(shape, bucket, pos):
                emptied.append(shape)
            if sharing:
                for g in placed:
                    node = int(self.g_node[g])
                    if node not in room_before:
                        room_before[node] = self._n_room[node]
            self.start(j, placed)
            room_shrank = True
            if sharing:
                room = self._share_room()
            if pos < len(bucket):
                heapq.heappush(heads, (bucket[pos][0], shape, pos))
        if blocked is None and heads:
            # The pass stopped early: the first bucket (in order) whose head had no room when
            # the pass began may be blocked.
            blocked = self._first_without_room(heads, first_room, first_free, room_before)
        if only is None:
            self.last_blocked = blocked
        for shape in emptied:  # only a start empties a bucket
            self._drop_bucket(shape)

    # --- main loop ---------------------------------------------------------------------------

    def run(self) -> Result:
        import time as _time
        wall, cpu = _time.perf_counter(), _time.process_time()
        submit = self.submit
        heap = self.heap
        J = self.J
        until = self.work.until if self.work.until is not None else math.inf
        a = 0
        done = 0
        last_report = 0
        j_ver, j_state = self.j_ver, self.j_state
        while True:
            # Events of re-planned or finished jobs are dropped here, not at their time: a
            # stale event must not move the clock (it stretched the timeline past the last end).
            while heap and (heap[0][4] != j_ver[heap[0][3]] or j_state[heap[0][3]] != "running"):
                heapq.heappop(heap)
            t_arr = submit[a] if a < J else math.inf
            t_ev = heap[0][0] if heap else math.inf
            now = min(t_arr, t_ev)
            if now == math.inf or now > until:
                break
            self.now = now
            while heap and heap[0][0] <= now:
                _, kind, _, j, ver = heapq.heappop(heap)
                if ver != self.j_ver[j] or self.j_state[j] != "running":
                    continue
                if kind == FINISH:
                    if self.j_pending_kill[j] is not None and self.j_pending_kill[j][0] <= now:
                        self._kill(j, self.j_pending_kill[j][1])
                    else:
                        self._finish(j)
                        done += 1
                else:
                    pending = self.j_pending_kill[j]
                    if pending is not None and pending[0] <= now:
                        self._kill(j, pending[1])
            while a < J and submit[a] <= now:
                self._enqueue(a)
                a += 1
            if self.released:
                self.schedule()
            elif self.arrived_shapes:
                self.schedule(self.arrived_shapes)
            self.released = False
            self.arrived_shapes = set()
            if self.opt.drop_unplaced and self.queued:
                for bucket in self.buckets.values():
                    for _, j in bucket:
                        self.j_state[j] = DROPPED
                self.buckets.clear()
                self.heads.clear()
                self.bucket_needs.clear()
                self.need_count.clear()
                self._least = None
                self.queued = 0
            self.t_time.append(now)
            self.t_queued.append(self.queued)
            self.t_running.append(self.running)
            self.t_busy.append(self.G - self.free_whole)
            self.t_alloc.append(self.allocated)
            if self.progress is not None and a - last_report >= 1000:
                self.progress(a - last_report)
                last_report = a
        if self.progress is not None:
            self.progress(J - last_report)
        end = min(self.now, until) if until < math.inf else self.now
        self.now = end
        for g in range(self.G):
            self._account(g)
        for j in range(J):
            if self.j_state[j] == "running":
                self.j_state[j] = CUTOFF
            elif self.j_state[j] in ("queued", PENDING):
                self.j_state[j] = CUTOFF if until < math.inf else self.j_state[j]
        self.counters.update(self.policy.final_counters())
        result = self._result(_time.perf_counter() - wall)
        result.cpu_s = _time.process_time() - cpu
        return result

    def _result(self, wall: float) -> Result:
        work = self.work
        t = np.array(self.j_type)
        solo = np.where(t >= 0, work.solo[np.arange(self.J), np.maximum(t, 0)], np.nan)
        jobs = {
            "job_id": work.job_id, "submit": work.submit, "n_gpus": work.n_gpus,
            "gpu_request": work.gpu_request,
            "state": np.array(self.j_state, dtype=object), "first_start": np.array(self.j_first),
            "start": np.array(self.j_start), "end": np.array(self.j_end),
            "gpu_type": np.array([self.cluster.types[x].name if x >= 0 else "" for x in t], dtype=object),
            "solo": solo, "kills": np.array(self.j_kills), "oom_kills": np.array(self.j_oom),
            "max_corunners": np.array(self.j_maxco), "shared": np.array(self.j_maxco) > 1,
            "job_class": work.job_class,
        }
        gpus = {"type": np.array([self.cluster.types[x].name for x in self.g_type], dtype=object),
                "busy_s": np.array(self.g_busy), "work_s": np.array(self.g_work),
                "shared_s": np.array(self.g_shared),
                "used_gib": self.g_used * (self.unit_mib / 1024),
                "cap_gib": self.g_cap * (self.unit_mib / 1024), "njobs": self.g_njobs.copy(),
                "whole": self.g_whole.copy(), "node": self.g_node.copy()}
        timeline = {"time": np.array(self.t_time), "queued": np.array(self.t_queued),
                    "running": np.array(self.t_running), "busy_gpus": np.array(self.t_busy),
                    "allocated": np.array(self.t_alloc)}
        return Result(self.policy.name, jobs, gpus, timeline, dict(self.counters), wall,
                      dict(self.codes))
