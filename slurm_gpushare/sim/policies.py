"""Scheduling policies behind one interface: admission, ordering, placement.

A policy has

- ``admit(j, engine) -> Request``: whole GPUs, or a share of so many GiB per GPU type on which
  types (called at submission, and again after the job was killed);
- ``key(j, engine)``: its place in the queue (smaller first);
- ``place(j, request, engine, exclude) -> [gpu, ...] | None``: where to start it now, avoiding
  the nodes in ``exclude`` (an EASY reservation); ``None`` if it cannot start;
- ``backfill``: whether the first blocked job gets an EASY reservation (FCFS policies), and
  ``shares``: whether it ever shares a GPU.

Multi-GPU and multi-node jobs always take whole GPUs, first fit in Slurm's node order. A job
killed once (OOM or a failed co-run) is re-admitted on whole GPUs by every policy: its owner
resubmits it with sharing off.

Policies:

- ``slurm-default``: whole GPUs, FCFS with EASY backfill, nodes in weight order (as Slurm does).
- ``random-pack``: shares sized by the safe memory estimate on a GPU drawn at random among those
  where it fits; FCFS with backfill.
- ``first-fit-share``: aggressive sharing, the SJF-FFS baseline: shortest job first, share sized by
  the point prediction (no margin: it can OOM), first GPU where it fits; no reservation.
- ``schedtune``: OOM-safe shares (safe estimate), at most ``threshold`` jobs per GPU (fixed
  co-location threshold), the GPU with the smallest estimated completion time (predicted run
  time on the type / the type's mean co-run speed per co-runner); FCFS with backfill.
- ``class-pair`` (Ray et al.): safe shares next to compatible classes only (knowledge table:
  both speeds >= 0.5 and a positive packing gain), preferring to pack onto the GPU with the best
  gain, else an empty GPU; FCFS with backfill.
- ``sjf-bsbf``: shortest job first; an empty GPU when one is free, else the share with the best
  sharing benefit (sum of predicted speeds > 1), no preemption, no reservation.
- ``gpushare``: the daemon's own ``slurm_gpushare.core.policy.decide`` at submission (a
  ``JobRequest`` as the hook would send it, the job's safe memory estimate and run times, a
  view of the simulated cluster, and the judgement below); a share goes where Slurm would put
  ``gres/shard``: the first node in weight order of an allowed type, not kept off, with enough
  free shards. Queue in priority order with
  the decision's nice and Slurm's age factor; ``gpushare-sjf`` is the same with the SJF lever
  on (``policy.priority = "sjf"``). Partners are not chosen by gpushare: Slurm's packing picks
  the GPU within the decision's types and exclusions (no best-first choice, and no matching,
  which Slurm cannot be asked for). A job whose kind has a utilisation profile is judged by
  the daemon's pair predictor (``SimPairs``: the packaged prior, with corrections learned from
  the co-runs the simulation measures, as the daemon learns from the node agents' reports),
  others by the class knowledge, as the daemon judges jobs with and without a telemetry
  profile. While a
  share waits, its exclusions follow the cluster as the daemon makes them follow in Slurm's
  queue (``core/waiting.py``), here with a view that is never stale: when it could start, a
  node is skipped while the rule keeps the job off it now (``waiting.blocked_now``: where Slurm
  would land it there, a share it should not join), never every node it could use (the
  daemon does it within a refresh of its view, and adds or lifts an exclusion by ``scontrol
  update``). No type is added: the simulator's node views at submission carry no free units
  per GPU, so decisions here offer every type the request suits and have none left to add.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from slurm_gpushare.core import policy as daemon_policy
from slurm_gpushare.core.config import Config, GpuType, PolicyConfig
from slurm_gpushare.core.types import JobRequest
from slurm_gpushare.core.waiting import WaitingShare, blocked_now, can_keep_off, judge_caches

from slurm_gpushare.sim.cluster import SPEED_PROFILES
from slurm_gpushare.sim.engine import Request
from slurm_gpushare.sim.interference import N_CLASSES, ClassPairTable


class Policy:
    name = ""
    order = "fcfs"
    backfill = True
    shares = False
    class_aware = False

    def prepare(self, engine) -> None:
        self.engine = engine
        work = engine.work
        self.cap_mib = np.array([t.memory_gib * 1024 for t in engine.cluster.types], float)
        self.est = np.where(work.allowed, work.runtime_pred, 0.0).max(axis=1)
        self._share_rows: dict = {}  # memory estimate -> ``_shares``

    # admission helpers
    def whole(self, j: int, engine, code: str = "whole", nice: int = 0) -> Request:
        return Request(True, engine.work.allowed[j], None, frozenset(), float(self.est[j]), code,
                       nice)

    def share(self, j: int, engine, estimate: str, code: str = "share", nice: int = 0) -> Request:
        """A share sized by the job's memory estimate ``estimate`` (a ``Workload`` field:
        ``mem_safe`` or ``mem_pred``), on the allowed types it fits."""
        work = engine.work
        if work.n_gpus[j] > 1 or work.n_nodes[j] > 1 or engine.j_kills[j]:
            return self.whole(j, engine, "whole-multi" if engine.j_kills[j] == 0 else "whole-after-kill")
        types, fits, shards = self._shares(engine, estimate)
        if not fits[j]:
            return self.whole(j, engine, "whole-no-fit")
        return Request(False, types[j], shards[j], frozenset(), float(self.est[j]), code, nice)

    def _shares(self, engine, estimate: str) -> tuple:
        """For every job at once: the types its share fits, whether any, units per type."""
        rows = self._share_rows.get(estimate)
        if rows is None:
            memory = getattr(engine.work, estimate)
            types = engine.work.allowed & (memory <= self.cap_mib)
            shards = np.maximum(np.ceil(memory / engine.unit_mib), 1).astype(np.int64)
            rows = self._share_rows[estimate] = (types, types.any(axis=1).tolist(), shards)
        return rows

    def admit(self, j: int, engine) -> Request:
        return self.whole(j, engine)

    def key(self, j: int, engine):
        if self.order == "sjf":
            return (self.est[j], j)
        return (engine.submit[j], j)

    def joinable(self, engine, g: int) -> tuple[bool, ...]:
        """Per class, whether its shares may join GPU g (class-aware policies narrow this; it
        reads only the GPU's own state). Called per GPU on every start and end: a tuple."""
        return (True,) * engine.n_classes

    def final_counters(self) -> dict[str, int]:
        """What the policy counted itself, added to the run's counters at its end."""
        return {}

    def run_ended(self, j: int, engine, overlap: dict[int, float], duration_s: float,
                  solo_s: float) -> None:
        """Job j's run ended after ``duration_s`` (``solo_s`` alone), sharing its GPU with
        each partner for ``overlap[partner]`` seconds. Called only for a policy with
        ``learns_coruns``."""

    def memo_key(self, j: int, req: Request):
        cls = self.engine.jclass[j] if (self.class_aware and not req.whole) else -1
        return (req.whole, self.engine.ngpus[j], req.key[0], req.exclude, cls)

    # placement helpers
    def first_whole(self, j, req, engine, exclude):
        groups = engine.whole_candidates(j, req, exclude, first=True)
        return engine.take_whole(j, groups[0]) if groups else None

    def place(self, j, req, engine, exclude):
        if req.whole:
            return self.first_whole(j, req, engine, exclude)
        return engine.share_candidates(req, exclude, first=True) or None


class SlurmDefault(Policy):
    name = "slurm-default"


class RandomPack(Policy):
    name = "random-pack"
    shares = True

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def admit(self, j, engine):
        return self.share(j, engine, "mem_safe")

    def place(self, j, req, engine, exclude):
        if req.whole:
            groups = engine.whole_candidates(j, req, exclude)
            if not groups:
                return None
            return engine.take_whole(j, groups[int(self.rng.integers(len(groups)))])
        cands = engine.share_candidates(req, exclude)
        # the same draw as rng.choice(cands), without its conversion of the list to an array
        return [cands[int(self.rng.integers(len(cands)))]] if cands else None


class FirstFitShare(Policy):
    name = "first-fit-share"
    order = "sjf"
    backfill = False
    shares = True

    def admit(self, j, engine):
        return self.share(j, engine, "mem_pred", "share-unsafe")


class KnowledgePolicy(Policy):
    """A sharing policy that knows pair speeds by class (the knowledge table)."""

    shares = True

    def __init__(self, knowledge: ClassPairTable):
        self.knowledge = knowledge

    def prepare(self, engine):
        super().prepare(engine)
        k = self.knowledge
        P = k.speed.shape[0]
        masks = 1 << N_CLASSES
        # gain[p, c, mask]: predicted throughput gain of adding class c next to the classes in
        # mask (0 for an empty GPU); compat[p, c, mask]: every resident compatible with c.
        self.gain = np.zeros((P, N_CLASSES, masks))
        self.compat = np.ones((P, N_CLASSES, masks), bool)
        for p in range(P):
            for c in range(N_CLASSES):
                for mask in range(1, masks):
                    members = [b for b in range(N_CLASSES) if mask >> b & 1]
                    self.gain[p, c, mask] = sum(k.benefit(p, c, b) for b in members)
                    self.compat[p, c, mask] = all(k.compatible(p, c, b) for b in members)
        # Per (profile, resident classes): per class of the engine, may it join (compatible
        # with every resident) / does it gain -- rows for ``joinable``, read per GPU.
        C = engine.n_classes
        self.compat_rows = [[tuple(bool(x) for x in self.compat[p, :C, mask])
                             for mask in range(masks)] for p in range(P)]
        self.gain_rows = [[tuple(bool(x > 0) for x in self.gain[p, :C, mask])
                           for mask in range(masks)] for p in range(P)]
        self.gain_list = self.gain[:, :C, :].transpose(0, 2, 1).tolist()  # [p][mask][c]

    def admit(self, j, engine):
        return self.share(j, engine, "mem_safe")


class SchedTune(KnowledgePolicy):
    name = "schedtune"

    def __init__(self, knowledge: ClassPairTable, threshold: int = 2):
        super().__init__(knowledge)
        self.threshold = threshold

    def prepare(self, engine):
        super().prepare(engine)
        self.mean_speed = np.array([self.knowledge.mean_speed(p)
                                    for p in range(self.knowledge.speed.shape[0])])

    def place(self, j, req, engine, exclude):
        if req.whole:
            return self.first_whole(j, req, engine, exclude)
        cands = engine.share_candidates(req, exclude, cap=self.threshold)
        if not cands:
            return None
        cands = np.array(cands)
        t = engine.g_type[cands]
        slow = self.mean_speed[engine.g_profile_arr[cands]] ** engine.g_njobs[cands]
        jct = engine.work.runtime_pred[j, t] / slow
        return [int(cands[int(np.argmin(jct))])]


class ClassPair(KnowledgePolicy):
    name = "class-pair"
    class_aware = True

    def joinable(self, engine, g):
        return self.compat_rows[engine.g_profile[g]][engine.g_classmask[g]]

    def place(self, j, req, engine, exclude):
        """The compatible GPU with the best packing gain (the first on a tie), else the first
        empty one: among the GPUs of nodes with room the job's class may join."""
        if req.whole:
            return self.first_whole(j, req, engine, exclude)
        c = engine.jclass[j]
        profile, classmask = engine.g_profile, engine.g_classmask
        best, best_gain, empty = None, -math.inf, None
        for g in engine.share_candidates(req, exclude, rooms=engine.class_node_room[c]):
            p, mask = profile[g], classmask[g]
            if not self.compat_rows[p][mask][c]:
                continue
            if mask == 0:
                if empty is None:
                    empty = g
            elif self.gain_list[p][mask][c] > best_gain:
                best, best_gain = g, self.gain_list[p][mask][c]
        if best is not None:
            return [best]
        return None if empty is None else [empty]


class SjfBsbf(KnowledgePolicy):
    name = "sjf-bsbf"
    order = "sjf"
    backfill = False
    class_aware = True

    def joinable(self, engine, g):
        if not engine.g_jobs[g]:  # an empty GPU takes any class
            return (True,) * engine.n_classes
        return self.gain_rows[engine.g_profile[g]][engine.g_classmask[g]]

    def place(self, j, req, engine, exclude):
        """The first empty GPU, else the share with the best gain if positive: among the GPUs
        of nodes with room the job's class may join (an empty GPU, or a positive gain)."""
        if req.whole:
            return self.first_whole(j, req, engine, exclude)
        c = engine.jclass[j]
        profile, classmask, jobs = engine.g_profile, engine.g_classmask, engine.g_jobs
        best, best_gain = None, -math.inf
        for g in engine.share_candidates(req, exclude, rooms=engine.class_node_room[c]):
            if not jobs[g]:
                return [g]
            gain = self.gain_list[profile[g]][classmask[g]][c]
            if gain > best_gain:
                best, best_gain = g, gain
        return [best] if best is not None and best_gain > 0 else None


# --- gpushare: the daemon's decision code -----------------------------------------------------

class _Snapshot(tuple):
    """Node views between two changes of the simulated allocations, with the answers that
    ``decide()`` memoises on a snapshot (``memo``: node exclusions; ``checks``: feasibility
    and idle GPUs), as on the daemon's ``clusterview.Snapshot``."""

    def __new__(cls, nodes=()):
        snapshot = super().__new__(cls, nodes)
        snapshot.memo, snapshot.checks = {}, {}
        return snapshot


class SimView:
    """The simulated cluster as ``decide()`` sees it (``policy.ClusterView``).

    Kept thin: node views are rebuilt only for nodes whose resident share classes changed.
    """

    def __init__(self, engine, partition: str):
        self.engine, self.partition = engine, partition
        names = engine.cluster.type_names
        self._views = [daemon_policy.NodeView(n.name, names[n.gpu_type], (partition,), (),
                                              gpus=n.gpus, idle_gpus=n.gpus)
                       for n in engine.cluster.nodes]
        self._masks = [0] * len(self._views)  # classes resident on each node (bits)
        self._idle = engine.n_gpus.tolist()
        self._version, self._nodes = -1, _Snapshot(self._views)
        # The classes in each bit mask of classes, as the node views list them.
        self._classes_of = [tuple(c for c in range(engine.n_classes) if mask >> c & 1)
                            for mask in range(1 << engine.n_classes)]

    def nodes(self):
        engine = self.engine
        if self._version != engine.version:
            changed = []
            # Only nodes whose allocations changed since the last look can have other views.
            for i in sorted(engine.n_changed):
                first, count = int(engine.n_first[i]), int(engine.n_gpus[i])
                gpu_masks = engine.g_classmask[first:first + count]
                mask = 0
                for m in gpu_masks:
                    mask |= m
                idle = int(engine.n_free[i])
                if mask != self._masks[i] or idle != self._idle[i]:
                    changed.append((i, mask, idle, gpu_masks))
            engine.n_changed.clear()
            self._version = engine.version
            if not changed:  # no node view changed: the snapshot and its answers hold
                return self._nodes
            classes_changed, idle_changed = set(), set()  # GPU types of the nodes changed
            for i, mask, idle, gpu_masks in changed:
                classes = self._classes_of[mask]
                per_gpu = tuple(self._classes_of[m] for m in gpu_masks)
                old = self._views[i]
                self._views[i] = daemon_policy.NodeView(old.name, old.gpu_type, old.partitions,
                                                        classes, gpus=len(gpu_masks),
                                                        gpu_classes=per_gpu, idle_gpus=idle)
                self._masks[i], self._idle[i] = mask, idle
                if classes != old.resident_classes or per_gpu != old.gpu_classes:
                    classes_changed.add(old.gpu_type)
                if idle != old.idle_gpus:
                    idle_changed.add(old.gpu_type)
            # A new snapshot per change of allocations, so decisions between changes share
            # their answers (as on the daemon's snapshots). Answers that read nothing that
            # changed carry over: feasibility reads only partitions, features and states, which
            # never change here; idle types read idle GPUs, node exclusions resident classes,
            # each only on nodes of the types in their key. Room now is unknown here (these
            # views carry no free units per GPU), whatever changed.
            # The answers that hold move to the new snapshot (no copy: the previous one is not
            # read again), the others are dropped.
            checks, memo = self._nodes.checks, self._nodes.memo
            for key in [k for k in checks if not (
                    k[0] in ("feasibility", "room-nodes")
                    or (k[0] == "idle" and idle_changed.isdisjoint(k[1])))]:
                del checks[key]
            for key in [k for k in memo if not classes_changed.isdisjoint(k[1])]:
                del memo[key]
            self._nodes = _Snapshot(self._views)
            self._nodes.checks, self._nodes.memo = checks, memo
        return self._nodes

    def node_now(self, i: int) -> daemon_policy.NodeView:
        """Node i's view as of the last ``nodes()``."""
        return self._views[i]


class SimCompatibility:
    """``policy.Compatibility`` over the simulator's class-pair knowledge."""

    def __init__(self, knowledge: ClassPairTable, profile_of: dict[str, int]):
        self.knowledge, self.profile_of = knowledge, profile_of

    def compatible(self, class_a: int, class_b: int, gpu_type: str | None = None) -> bool:
        profile = self.profile_of.get(gpu_type, 2)
        return self.knowledge.compatible(profile, class_a, class_b)


class SimPairs:
    """The pair predictor as the daemon uses it (``daemon.pairing``), in the simulator: the
    packaged prior (``pairs.default_model``) on each job kind's profile per GPU from Gavel's
    utilisation proxy (``knowledge.gavel_profiles``: the telemetry the daemon would have
    measured), with corrections learned from the co-runs the simulation measures (``observe``:
    a job's run against its time alone, as the daemon learns at each job's end), on each GPU
    type apart against the kind's profile there (``pairs.typed_key``). A kind is one
    fingerprint key: every job of a kind resubmits one script (the daemon's best case). Running
    shares are known by job index; one judge per kind (``for_job``).

    The daemon re-learns at every measured co-run; here the model is re-learned each time the
    measured sides have grown by half (from ``FIRST_LEARN``), so the whole trace costs about
    three re-learnings of all of them. Without ``observe`` (``GpuShare(learn_coruns=False)``):
    the cold prior throughout."""

    FIRST_LEARN, GROWTH = 8, 1.5

    def __init__(self, kinds, job_kind: list[int], type_profile: dict[str, int],
                 gpu_type_names: Sequence[str]):
        from slurm_gpushare.predict.knowledge import GAVEL_MEM_MIB, gavel_profiles
        from slurm_gpushare.predict.pairs import default_model, typed_key

        util = {(row.job, row.gpu): float(row.gpu_util_pct)
                for row in gavel_profiles().itertuples()}
        # profiles[speed profile][kind]: None where the kind was not measured on that GPU
        self.profiles = [[{"gpu_util_pct": util[(kind, gpu)], "mem_total_mib": GAVEL_MEM_MIB[gpu]}
                          if (kind, gpu) in util else None for kind in kinds]
                         for gpu in SPEED_PROFILES]
        self.names = tuple(kinds)
        self.model = default_model()
        self.job_kind, self.type_profile = job_kind, type_profile
        # Each kind's profile on the cluster's GPU types averaged (the daemon's is the mean
        # over the job's own runs, on whichever types they ran): copies and learning read it.
        self.typical: dict[str, dict] = {}
        for kind, name in enumerate(self.names):
            known = [self.profiles[p][kind] for p in sorted(set(type_profile.values()))
                     if self.profiles[p][kind] is not None]
            if known:
                self.typical[name] = {
                    "gpu_util_pct": sum(p["gpu_util_pct"] for p in known) / len(known),
                    "mem_total_mib": max(p["mem_total_mib"] for p in known)}
        # What learning reads: the typical profile by kind, and each kind's profile on each
        # GPU type under its typed key (``pairs.typed_key``: what it suffers and inflicts on a
        # type is learned against its profile there).
        self.learning_profiles = {**self.typical, **{
            typed_key(name, gpu_type): self.profiles[p][kind]
            for kind, name in enumerate(self.names) for gpu_type, p in type_profile.items()
            if self.profiles[p][kind] is not None}}
        self.gpu_type_names = list(gpu_type_names)  # per GPU index
        self.verdicts: dict[tuple, bool] = {}
        self._judges: dict[int, _KindPairs | None] = {}
        self.runs: dict = {}  # (cluster, job a, job b, GPU) -> pairs.CoRun
        self.typed_runs: dict = {}  # the same under typed keys, where both kinds have a profile
        self.measured = 0  # measured sides among them
        self.learn_at = self.FIRST_LEARN
        self.relearned = 0

    def for_job(self, j: int) -> "_KindPairs | None":
        """Job j's judge (``policy.PairCompatibility``); None where its kind has no profile
        (the class knowledge decides then)."""
        kind = self.job_kind[j]
        if kind not in self._judges:
            self._judges[kind] = _KindPairs(self, kind) if self._name(kind) else None
        return self._judges[kind]

    def _name(self, kind: int) -> str | None:
        """The kind's name where it has a profile (its key for corrections), else None."""
        name = self.names[kind] if kind < len(self.names) else None
        return name if name in self.typical else None

    def observe(self, j: int, gpu: int, overlap: dict[int, float], duration_s: float,
                solo_s: float) -> bool:
        """Job j ended after ``duration_s`` on GPU ``gpu`` (``solo_s`` alone), next to each
        partner for ``overlap[partner]`` seconds: its side of each co-run, measured where the
        partner overlapped nearly its whole run (``pairs.MEASURED_OVERLAP``). Returns whether
        the model was re-learned (the judges' verdicts are then new)."""
        from slurm_gpushare.predict.knowledge import measured_isd
        from slurm_gpushare.predict.pairs import MEASURED_OVERLAP, CoRun, typed_key

        own = self._name(self.job_kind[j])
        if own is None or duration_s <= 0 or solo_s <= 0:
            return False
        isd = measured_isd(duration_s, solo_s)
        for partner, seconds in overlap.items():
            other = self._name(self.job_kind[partner])
            if other is None:
                continue
            first = j < partner
            ident = ("", *((str(j), str(partner)) if first else (str(partner), str(j))), gpu)
            keys = (own, other) if first else (other, own)
            run = self.runs.get(ident)
            sides = list(run.isd) if run else [None, None]
            measured = bool(seconds >= MEASURED_OVERLAP * duration_s)
            sides[0 if first else 1] = isd if measured else None
            self.measured += measured
            run = self.runs[ident] = CoRun(keys, tuple(sides),
                                           max(seconds, run.overlap_s or 0.0) if run else seconds)
            typed = tuple(typed_key(k, self.gpu_type_names[gpu]) for k in keys)
            if all(k in self.learning_profiles for k in typed):
                self.typed_runs[ident] = run._replace(keys=typed)
        if self.measured < self.learn_at:
            return False
        self.learn_at = math.ceil(self.measured * self.GROWTH)
        self.model = self.model.learned_from(self.runs, self.learning_profiles,
                                             self.typed_runs)
        self.verdicts.clear()
        self.relearned += 1
        return True


class _KindPairs:
    """One kind's judgement of the running shares (``policy.PairCompatibility``)."""

    def __init__(self, pairs: SimPairs, kind: int):
        self.pairs, self.kind = pairs, kind
        # Copies of itself per GPU: judged on its typical profile (``SimPairs.typical``).
        self.typical = pairs.typical[pairs.names[kind]]

    def compatible_with_group(self, resident_jobs, gpu_type: str | None = None) -> bool:
        pairs = self.pairs
        p = pairs.type_profile.get(gpu_type, len(SPEED_PROFILES) - 1)
        profiles = pairs.profiles[p]
        if profiles[self.kind] is None:
            return True  # not measured on this GPU: nothing is known against it
        if len(resident_jobs) == 1:  # most GPUs hold one share: no sort
            kind = pairs.job_kind[resident_jobs[0]]
            kinds = (kind,) if profiles[kind] is not None else ()
        else:
            kinds = tuple(sorted(k for k in (pairs.job_kind[i] for i in resident_jobs)
                                 if profiles[k] is not None))
        if not kinds:
            return True
        key = (gpu_type, self.kind, kinds)
        verdict = pairs.verdicts.get(key)
        if verdict is None:
            group = (self.kind,) + kinds
            names = [pairs.names[k] for k in group]
            if gpu_type in pairs.type_profile:  # judged with the kinds' corrections there
                from slurm_gpushare.predict.pairs import typed_key

                names = [typed_key(n, gpu_type) for n in names]
            verdict = pairs.verdicts[key] = pairs.model.fast_enough(
                [profiles[k] for k in group], names)
        return verdict

    def compatible_with(self, resident_job, gpu_type: str | None = None) -> bool:
        return self.compatible_with_group((resident_job,), gpu_type)

    def copies_allowed(self, limit: int) -> int:
        return self.pairs.model.copies_allowed(self.typical, self.pairs.names[self.kind], limit)


def job_kind_utilisation(kinds, type_names) -> dict[int, float]:
    """Peak GPU utilisation per job kind, as the daemon would have measured it: the Gavel
    utilisation proxy (knowledge.gavel_profiles, derived from isolated throughputs only), the
    highest over the cluster's GPU types it was measured on. Kinds without one size by memory.
    """
    from slurm_gpushare.predict.knowledge import gavel_profiles

    table = {(row.job, row.gpu): row.gpu_util_pct for row in gavel_profiles().itertuples()}
    out = {}
    for index, kind in enumerate(kinds):
        values = [table[(kind, t.lower())] for t in type_names if (kind, t.lower()) in table]
        if values:
            out[index] = float(max(values))
    return out


@dataclass(slots=True)
class _Look:
    """What a waiting share saw at its last look (``GpuShare._place_looking_again``): how far
    it had read ``Engine.changes``, each node's landing GPU, and the nodes it may join."""
    seen: int = 0
    landing: dict[int, int] = field(default_factory=dict)
    fine: set[int] = field(default_factory=set)


class GpuShare(Policy):
    """Calls ``slurm_gpushare.core.policy.decide`` -- the daemon's code -- for every submission.

    The queue is ordered as Slurm's priority/multifactor orders it with the decision's nice
    (``priority = "sjf"``; 0 otherwise) and the age factor of a site with
    ``PriorityWeightAge=1000``, ``PriorityMaxAge=7-0`` (other factors equal for all jobs, and a
    base above ``sjf_nice_max``, so no priority reaches Slurm's floor of 1):
    priority = base + 1000 x age / 7 days - nice. Age grows alike for every waiting job, so
    the order is fixed at submission: by nice + 1000 x submit time / 7 days. (The age cap at 7
    days is not modelled.) FCFS with EASY backfill, as Slurm's backfill scheduler. A share is placed
    as Slurm places gres/shard (``Policy.place``): the first node in weight order with room,
    then its first GPU with enough free shards.
    """

    name = "gpushare"
    shares = True
    # Verdicts on GPUs holding one share are looked up, not asked again (a subclass that
    # counts every judgement turns this off).
    remember_verdicts = True
    AGE_WEIGHT, MAX_AGE_S = 1000.0, 7 * 86400.0

    def __init__(self, knowledge: ClassPairTable, gpu_time_budget_pct: float = 0.0,
                 priority: str = "none", keep_whole_when_idle: bool = True,
                 learn_coruns: bool = True, **settings):
        self.knowledge = knowledge
        # The pair predictor learns from the co-runs the simulation measures, as the daemon
        # learns from the node agents' reports (``SimPairs.observe``); False: the cold prior.
        self.learns_coruns = learn_coruns
        # The daemon's [policy] settings (``settings``: any other PolicyConfig field).
        self.gpu_time_budget_pct = gpu_time_budget_pct
        self.priority = priority
        self.keep_whole_when_idle = keep_whole_when_idle
        self.settings = settings
        if priority == "sjf":
            self.name = "gpushare-sjf"

    def prepare(self, engine):
        super().prepare(engine)
        cluster = engine.cluster
        # Sharing in the trace's partition unless the settings say otherwise (an empty
        # sharing_partitions with priority_partitions set: the SJF lever without sharing).
        settings = {"sharing_partitions": (cluster.partition,), **self.settings}
        self.config = Config(
            policy=PolicyConfig(gpu_time_budget_pct=self.gpu_time_budget_pct,
                                priority=self.priority,
                                keep_whole_when_idle=self.keep_whole_when_idle,
                                **settings),
            gpu_types=tuple(GpuType(t.name, t.memory_gib, feature=t.name, model=t.model or t.name,
                                    sharing="shard", shard_mib=engine.unit_mib)
                            for t in cluster.types))
        self.view = SimView(engine, cluster.partition)
        type_profile = {t.name: SPEED_PROFILES.index(t.speed_profile) for t in cluster.types}
        self.compat = SimCompatibility(self.knowledge, type_profile)
        self.pairs = SimPairs(engine.work.kinds, engine.work.kind.tolist(), type_profile,
                              [cluster.types[t].name for t in engine.g_type_list])
        self.node_index = {n.name: i for i, n in enumerate(cluster.nodes)}
        self.type_names = cluster.type_names
        self.all_types = engine.work.allowed.shape[1]
        self.decisions: list = []
        work = engine.work
        # Per job: what its request is made of (GPUs, nodes, allowed types), and its estimates
        # per type as lists (read once per admission).
        self.shape_of = list(zip(work.n_gpus.tolist(), work.n_nodes.tolist(),
                                 map(np.ndarray.tobytes, work.allowed)))
        self.mem_rows, self.runtime_rows = work.mem_safe.tolist(), work.runtime_pred.tolist()
        self.class_rows, self.kind_rows = work.job_class.tolist(), work.kind.tolist()
        # The percent of a GPU a job asks for itself (openb's gpu_milli below 1000; 0: none).
        self.percent_asked = np.where(work.gpu_request < work.n_gpus,
                                      np.ceil(100 * work.gpu_request), 0).astype(int).tolist()
        self._requests: dict = {}
        # Shares whose exclusions follow the cluster (job -> its judgement: a waiting share,
        # ``core/waiting.py``), the judges' caches, node views with free units per GPU.
        self.judgements: dict[int, WaitingShare] = {}
        self._caches: dict = {}
        # A pair judge's verdict on a GPU holding one share, by the GPU's type and the share's
        # kind (judge -> {type + kind x types: blocked}): all that verdict reads, so the landing GPUs
        # a waiting share is judged against at every pass cost one look-up each.
        self._single: dict = {}
        # What a waiting share judged by its pair predictor saw at its last look, by judge and
        # request (``_place_looking_again``); forgotten at each re-learning, as verdicts are.
        self._looks: dict[tuple, _Look] = {}
        self._now: dict[int, tuple] = {}
        self._usable: dict = {}
        self.counters = {"started_kept_off": 0}
        self._type_masks: dict = {}
        self._shards: dict = {}
        # Peak utilisations matter only to a GPU-time budget (and cost a slow import).
        self.util = (job_kind_utilisation(engine.work.kinds, self.type_names)
                     if self.gpu_time_budget_pct > 0 else {})

    def request(self, j: int, engine) -> JobRequest:
        """The job as the hook would send it: ``sbatch -p <sharing partition> --gres=gpu:N`` (or
        ``--gres=mps:P``: a job asking for P% of a GPU itself)
        (one frozen value per shape of job, made once)."""
        key = (self.shape_of[j], engine.j_kills[j] > 0, self.percent_asked[j])
        request = self._requests.get(key)
        if request is None:
            request = self._requests[key] = self._request(j, engine)
        return request

    def _request(self, j: int, engine) -> JobRequest:
        work = engine.work
        n, k = int(work.n_gpus[j]), int(work.n_nodes[j])
        if not k:
            per_max = max(engine.type_pernode[np.flatnonzero(work.allowed[j])])
            k = max(1, math.ceil(n / per_max))
        allowed = work.allowed[j]
        features = "" if allowed.all() else "|".join(
            self.type_names[t] for t in np.flatnonzero(allowed))
        # A job that asks for part of a GPU itself sends a share: a percent of whichever GPU
        # (openb's reading of gpu_milli).
        gres = (f"gres:mps:{self.percent_asked[j]}" if self.percent_asked[j]
                else f"gres:gpu:{math.ceil(n / k)}")
        return JobRequest(uid=1000, partition=engine.cluster.partition,
                          tres_per_node=gres, min_nodes=k,
                          features=features, opt_out=engine.j_kills[j] > 0)

    def estimate(self, j: int, engine) -> daemon_policy.JobEstimate:
        names = self.type_names
        return daemon_policy.JobEstimate(
            source="history",
            memory_mib=dict(zip(names, self.mem_rows[j])),
            runtime_s=dict(zip(names, self.runtime_rows[j])),
            job_class=self.class_rows[j],
            util_pct=self.util.get(self.kind_rows[j]),
            detail="simulated history")

    def admit(self, j, engine):
        self.judgements.pop(j, None)  # re-admitted after a kill: its old request is gone
        # As the daemon: the pair predictor for a job with a profile. The classes judge a job
        # with a class but no profile, which the daemon never has (both are read from one
        # telemetry) and a simulated kind has only without Gavel's measurements (the unit
        # tests' workloads: every Philly kind has them).
        knowledge = self.pairs.for_job(j) or self.compat
        decision = daemon_policy.decide(self.request(j, engine), self.config,
                                        estimate=self.estimate(j, engine), view=self.view,
                                        knowledge=knowledge, decision_id=f"sim-{j}")
        nice = int(decision.writes.get("nice", 0))
        if decision.code == "already-shared":
            # Kept as submitted: the share it asked for, its fraction of whichever GPU it
            # lands on (its memory there, as the workload gives it).
            return self.share(j, engine, "mem_safe", decision.code, nice)
        if decision.action == "keep":
            return self.whole(j, engine, decision.code, nice)
        types, flags = self._type_mask(decision.gpu_types, j)
        if not any(flags):  # the user's own constraint and the decision's types do not meet
            return self.whole(j, engine, "no-common-type", nice)
        units = math.ceil(decision.share_gib * 1024 / engine.unit_mib - 1e-9)  # shards
        shards = self._shards.get(units)
        if shards is None:  # one array per share size (requests only read it)
            shards = self._shards[units] = np.full(len(self.type_names), units, np.int64)
        # Its longest predicted run time on those types (0 where a type is not one of them).
        est = max([r if ok else 0.0 for r, ok in zip(self.runtime_rows[j], flags)])
        # The decision's exclusions (``exc_nodes``) are not fixed here: they follow the cluster
        # (``place``), as the daemon makes them follow.
        req = Request(False, types, shards, frozenset(), est, decision.code, nice)
        entry = WaitingShare(
            f"sim-{j}", "", decision.writes.get("features", ""), types=(), later=(),
            user_exc_nodes="", away=(), blockers={}, partitions=(engine.cluster.partition,),
            units=units, job_class=decision.details.get("job_class"), knowledge=knowledge)
        if can_keep_off(entry):
            self.judgements[j] = entry
        return req

    def final_counters(self):
        # Shares started on a node after others were kept off; co-run sides learned from.
        return {"waiting_started_kept_off": self.counters["started_kept_off"],
                "coruns_measured": self.pairs.measured, "pairs_relearned": self.pairs.relearned}

    def run_ended(self, j, engine, overlap, duration_s, solo_s):
        if self.pairs.observe(j, engine.j_gpus[j][0], overlap, duration_s, solo_s):
            self._caches.clear()  # verdicts of the model before
            self._single.clear()
            self._looks.clear()

    def memo_key(self, j, req):
        """Shares judged alike (one judge, one size) share a queue bucket: where one cannot
        start, the others cannot either."""
        entry = None if req.whole else self.judgements.get(j)
        judge = -1 if entry is None else (id(entry.knowledge), entry.job_class, entry.units)
        return (req.whole, self.engine.ngpus[j], req.key[0], req.exclude, judge)

    # -- exclusions follow the cluster (core/waiting.py, as the daemon does in Slurm) ---------
    def place(self, j, req, engine, exclude):
        """The first node in Slurm's order with room whose landing GPU the job may join (the
        daemon's exclusions made with a view that is never stale: ``waiting.blocked_now``);
        the first with room where it would be kept off every node it could use."""
        entry = None if req.whole else self.judgements.get(j)
        if entry is None:
            return super().place(j, req, engine, exclude)
        # A pair judge and no blockers (the simulator keeps none): ``blocked_now`` comes to
        # ``keeps_off``'s judgement of the shares on the landing GPU (``should_not_join``),
        # read here off the engine's arrays instead of a node view made per node (the
        # simulator's costliest step; test_sim_engine checks both agree).
        pairwise = hasattr(entry.knowledge, "compatible_with") and not entry.blockers
        if pairwise and self.remember_verdicts:
            return self._place_looking_again(req, engine, exclude, entry)
        first, seen = None, 0
        # Each node's first GPU with room: where Slurm lands the share on that node.
        for g in engine.landing_gpus(req, exclude):
            if not self._blocked(entry, engine, g, pairwise):
                self.counters["started_kept_off"] += seen > 0
                return [g]
            if first is None:
                first = g
            seen += 1
        if seen and seen >= self._usable_nodes(engine, req):
            return [first]  # never kept off every node it could use: it would only wait
        return None

    def _verdict(self, entry, engine, g: int, single: dict) -> bool:
        """``_blocked`` for a pair judge, its verdict on a GPU holding one share remembered in
        ``single`` by the GPU's type and the share's kind (all such a verdict reads)."""
        jobs = engine.g_jobs[g]
        if len(jobs) != 1:
            return self._blocked(entry, engine, g, True)
        key = engine.g_type_list[g] + len(self.type_names) * self.pairs.job_kind[jobs[0]]
        blocked = single.get(key)
        if blocked is None:
            blocked = single[key] = self._blocked(entry, engine, g, True)
        return blocked

    def _place_looking_again(self, req, engine, exclude, entry):
        """``place`` for a share judged by its pair predictor, from what it saw at its last
        look: a node's landing GPU and the verdict on it change only when a job starts or ends
        there (``Engine.changes``), so only those nodes are looked at again; the pass's
        exclusions (``exclude``: a reservation) are left out of the answer, not of the look.
        The same answers as looking at every node (test_sim_engine)."""
        key = (id(entry.knowledge), req.key, req.exclude)
        look = self._looks.get(key)
        if look is None:
            if len(self._looks) > 4096:
                self._looks.clear()
            look = self._looks[key] = _Look()
            g_node = engine.g_node_list
            found = [(g_node[g], g) for g in engine.landing_gpus(req)]
        else:
            found = [(node, engine.landing_gpu(req, node))
                     for node in set(engine.changes[look.seen:])]
        look.seen = len(engine.changes)
        landing, fine = look.landing, look.fine
        single = self._single.setdefault(id(entry.knowledge), {})
        for node, g in found:
            if g is None:
                landing.pop(node, None)
                fine.discard(node)
                continue
            landing[node] = g
            if self._verdict(entry, engine, g, single):
                fine.discard(node)
            else:
                fine.add(node)
        nodes = landing
        if exclude:
            fine = [n for n in fine if n not in exclude]
            nodes = [n for n in landing if n not in exclude]
        if fine:
            node = min(fine)
            self.counters["started_kept_off"] += min(nodes) < node
            return [landing[node]]
        if nodes and len(nodes) >= self._usable_nodes(engine, req):
            return [landing[min(nodes)]]  # never kept off every node it could use
        return None

    def _blocked(self, entry, engine, g: int, pairwise: bool) -> bool:
        """Whether the share should be kept off the node whose first GPU with room is ``g``
        (``waiting.blocked_now``; for a pair judge, read off the engine's arrays)."""
        if pairwise:
            return daemon_policy.should_not_join(
                engine.g_jobs[g], self.type_names[engine.g_type_list[g]], entry.knowledge)
        self.view.nodes()  # node views current
        return blocked_now(entry, self._node_now(engine, engine.g_node_list[g]),
                           judge_caches(entry, self._caches, fixed_view=False))

    def _node_now(self, engine, i: int) -> daemon_policy.NodeView:
        """Node i's view now with the free units and the shares of each GPU (what the
        daemon's view estimates), made once per change of the allocations."""
        hit = self._now.get(i)
        if hit is not None and hit[0] == engine.version:
            return hit[1]
        gpus = engine._n_gpu_range[i]
        gpu_jobs = tuple(tuple(engine.g_jobs[g]) for g in gpus)
        view = replace(self.view.node_now(i), free_units=tuple(int(engine.g_free[g]) for g in gpus),
                       gpu_jobs=gpu_jobs, resident_jobs=tuple(x for jobs in gpu_jobs for x in jobs))
        self._now[i] = (engine.version, view)
        return view

    def _usable_nodes(self, engine, req: Request) -> int:
        """How many nodes of the request's types there are (the nodes it could use)."""
        count = self._usable.get(req.key[0])
        if count is None:
            count = self._usable[req.key[0]] = int(req.types[engine.n_type].sum())
        return count

    def _type_mask(self, gpu_types: tuple[str, ...], j: int) -> tuple[np.ndarray, list[bool]]:
        """The decision's GPU types that job j allows, as a mask over the cluster's types and
        as a list (one of each per set of types and allowed types; requests only read them)."""
        key = (gpu_types, self.shape_of[j][2])
        mask = self._type_masks.get(key)
        if mask is None:
            types = np.array([name in gpu_types for name in self.type_names]) & \
                self.engine.work.allowed[j]
            mask = self._type_masks[key] = (types, types.tolist())
        return mask

    def key(self, j, engine):
        return (engine.j_req[j].nice + self.AGE_WEIGHT * engine.submit[j] / self.MAX_AGE_S, j)


POLICY_NAMES = ("slurm-default", "random-pack", "first-fit-share", "schedtune", "class-pair",
                "sjf-bsbf", "gpushare", "gpushare-sjf")


def make_policy(name: str, knowledge: ClassPairTable, seed: int = 0, *,
                gpu_time_budget_pct: float = 0.0, gpushare_settings: dict | None = None) -> Policy:
    """``gpushare_settings``: other [policy] settings of the gpushare policies (e.g.
    ``{"keep_whole_when_idle": False}``)."""
    if name == "slurm-default":
        return SlurmDefault()
    if name == "random-pack":
        return RandomPack(seed)
    if name == "first-fit-share":
        return FirstFitShare()
    if name == "schedtune":
        return SchedTune(knowledge)
    if name == "class-pair":
        return ClassPair(knowledge)
    if name == "sjf-bsbf":
        return SjfBsbf(knowledge)
    settings = dict(gpushare_settings or {})
    if name == "gpushare":
        return GpuShare(knowledge, gpu_time_budget_pct, **settings)
    if name == "gpushare-sjf":
        return GpuShare(knowledge, gpu_time_budget_pct, **{**settings, "priority": "sjf"})
    raise ValueError(f"unknown policy {name!r} (one of {', '.join(POLICY_NAMES)})")
