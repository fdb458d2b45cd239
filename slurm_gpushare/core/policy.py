"""The sharing decision: one implementation, called by the daemon and by the simulator.

``decide`` is a pure function of the request, the configuration, what is known about the job
(``JobEstimate``: from its own history, a hint, or nothing) and a view of the cluster
(``ClusterView``). It returns a ``Decision`` value and touches nothing else.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import AbstractSet, Any, Callable, Mapping, Protocol, Sequence

from slurm_gpushare.core import feasibility
from slurm_gpushare.core import tres as tresmod
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.core.config import Config, GpuType, shards_per_gpu
from slurm_gpushare.core.hostlist import expand_hostlist
from slurm_gpushare.core.types import MANY_ARRAY_TASKS, Decision, JobRequest

SHARED_GRES = ("shard", "mps")


@dataclass(frozen=True)
class JobEstimate:
    """What is known about a job before it runs.

    ``memory_mib`` holds the *safe* peak GPU memory per GPU type name (prediction plus margin);
    a type missing from it is one the job is not known to fit. ``runtime_s`` is the predicted
    run time per type (for node choice), ``job_class`` the interference class.
    """

    source: str  # "history", "hint" or "default"
    memory_mib: Mapping[str, float] = field(default_factory=dict)
    runtime_s: Mapping[str, float] = field(default_factory=dict)
    job_class: int | None = None
    util_pct: float | None = None  # peak GPU utilisation seen (MGUP): the GPU time it needs
    detail: str = ""  # one phrase for the reason, e.g. "peak 9.1 GiB on v100 + 12% margin"
    excluded: Mapping[str, str] = field(default_factory=dict)  # type -> why it cannot hold the job


@dataclass(frozen=True)
class NodeView:
    name: str
    gpu_type: str
    partitions: tuple[str, ...] = ()
    resident_classes: tuple[int, ...] = ()  # interference classes of jobs sharing its GPUs
    gpus: int = 0  # GPUs on the node (0: unknown)
    # Classes per GPU where the view knows them (the simulator); () where it does not (the
    # daemon: squeue shows a share's node, not its GPU index).
    gpu_classes: tuple[tuple[int, ...], ...] = ()
    # Ids of the jobs sharing its GPUs, for a PairCompatibility (the daemon: decision ids).
    resident_jobs: tuple[str, ...] = ()
    features: tuple[str, ...] = ()  # active features where the view knows them (the daemon)
    state: str = ""  # sinfo %t state ("" = usable); see feasibility.UNUSABLE_STATES
    idle_gpus: int | None = None  # GPUs holding no job at all; None: unknown
    # Units of the shared gres free on each GPU, in Slurm's GPU order, and the ids of the
    # shares on each GPU, where the view estimates them (the daemon: running shares and the
    # shares it decided that are not placed yet); () where it does not.
    free_units: tuple[int, ...] = ()
    gpu_jobs: tuple[tuple[str, ...], ...] = ()


class ClusterView(Protocol):
    """The cluster as a decision sees it (the daemon's cached sinfo/squeue, or the simulator)."""

    def nodes(self) -> Sequence[NodeView]: ...


class Compatibility(Protocol):
    """Which interference classes may share a GPU (knowledge.KnowledgeBase)."""

    def compatible(self, class_a: int, class_b: int, gpu_type: str | None = None) -> bool: ...


class PairCompatibility(Protocol):
    """Which running shares one job may join, from both jobs' telemetry (the pair predictor,
    daemon.pairing); the daemon's decisions read it only (the simulator's also the classes,
    for a kind with a class but no profile)."""

    def compatible_with(self, resident_job: str, gpu_type: str | None = None) -> bool: ...

    def compatible_with_group(self, resident_jobs: Sequence[str],
                              gpu_type: str | None = None) -> bool: ...

    def copies_allowed(self, limit: int) -> int: ...


# Run times within this fraction of each other count as equal when types are chosen: a run time
# on a type the job never ran on is a catalogue ratio, no finer than that.
RUNTIME_TIE = 0.25
# One count of a shared gres is offered on several types only where it over-allocates none of
# them by more than this fraction of its need there (or one unit): a job predicted to need
# 8 GiB on one type and 16 GiB on another is not given 16 GiB on both.
OVERSIZE_TIE = 0.25


def landing_gpu(node: NodeView, units: int) -> int | None:
    """The GPU on ``node`` where Slurm would put a share of ``units``: it packs a shared gres
    onto the first GPU with room (a GPU already shared fills before an idle one); None where the
    node has no room now or the view does not know."""
    for index, free in enumerate(node.free_units):
        if free >= units:
            return index
    return None


def should_not_join(joined: Sequence, gpu_type: str, knowledge: PairCompatibility,
                    clashes: Callable[[Any, str], bool] | None = None) -> bool:
    """Whether a job judged by its pair predictor should not join the shares ``joined`` of
    one GPU: all of them together where the knowledge can judge a group, else any one of
    them (``clashes``: a cached answer per resident; default: asked each time)."""
    if not joined:
        return False
    if hasattr(knowledge, "compatible_with_group"):
        return not knowledge.compatible_with_group(joined, gpu_type)
    if clashes is None:
        return any(not knowledge.compatible_with(r, gpu_type) for r in joined)
    return any(clashes(r, gpu_type) for r in joined)


def keeps_off(node: NodeView, job_class: int | None,
              knowledge: Compatibility | PairCompatibility | None, units: int | None = None,
              *, _answers: dict | None = None, _verdicts: dict | None = None) -> bool:
    """Whether a job (its class, or its pair predictor) should be kept off ``node``: it could
    only land there next to a share it should not join. Slurm takes exclusions by node, not by
    GPU, so only when none of the node's GPUs is free of such a share: known per GPU where the
    view has it, else when the node holds at least as many of them as GPUs (with its GPU count
    unknown: any). Where the view estimates each GPU's free units and shares (the daemon), a
    share of ``units`` lands on the GPU Slurm packs it onto (``landing_gpu``): kept off when the
    job should not join the shares there (all of them together, where the knowledge can judge a
    group), never for lack of room now. (``_answers``, ``_verdicts``: caches shared by the
    calls of one scan.)"""
    pairwise = hasattr(knowledge, "compatible_with")
    if knowledge is None or (job_class is None and not pairwise):
        return False
    residents = node.resident_jobs if pairwise else node.resident_classes
    if not residents:
        return False
    answers = {} if _answers is None else _answers

    def clashes(resident: int | str, gpu_type: str) -> bool:
        key = (resident, gpu_type)
        if key not in answers:
            answers[key] = not (knowledge.compatible_with(resident, gpu_type) if pairwise
                                else knowledge.compatible(job_class, resident, gpu_type))
        return answers[key]

    if pairwise and units and node.free_units:
        gpu = landing_gpu(node, units)
        if gpu is None:
            # No room now: Slurm cannot start it there now, and by the time it can, the
            # residents are others (an exclusion is for good; the view is seconds old).
            return False
        joined = node.gpu_jobs[gpu] if gpu < len(node.gpu_jobs) else ()
        return should_not_join(joined, node.gpu_type, knowledge, clashes)
    if node.gpu_classes and not pairwise:
        if () in node.gpu_classes:  # a GPU without shares: the job can land there
            return False
        # Nodes of one type with the same classes per GPU share the answer.
        key = (node.gpu_type, node.gpu_classes)
        verdict = None if _verdicts is None else _verdicts.get(key)
        if verdict is None:
            verdict = all(any(clashes(r, node.gpu_type) for r in gpu)
                          for gpu in node.gpu_classes)
            if _verdicts is not None:
                _verdicts[key] = verdict
        return verdict
    bad = sum(clashes(r, node.gpu_type) for r in residents)
    return bad > 0 and bad >= max(node.gpus, 1)


def incompatible_nodes(job_class: int | None, fits: Sequence[GpuType], partitions: Sequence[str],
                       view: ClusterView | None,
                       knowledge: Compatibility | PairCompatibility | None,
                       units: int | None = None, all_of_them: bool = False
                       ) -> tuple[list[str], int]:
    """Nodes of the fitting types in the job's partitions that the job should be kept off
    (``keeps_off``).

    Returns ``(excluded, candidates)``. Nothing is excluded when that would leave no candidate
    node (the job would only wait longer), unless ``all_of_them`` (which nodes it should not
    join, for the type choice).
    """
    pairwise = hasattr(knowledge, "compatible_with")
    if view is None or knowledge is None or (job_class is None and not pairwise):
        return [], 0
    types = {g.name for g in fits}
    nodes = view.nodes()
    # A view snapshot that never changes (the daemon's) keeps the answers given on it: every
    # decision of a class would otherwise loop over all of a large cluster's nodes.
    memo = getattr(nodes, "memo", None)
    # The share's size matters only to the per-GPU check (pairwise, where free units are known).
    # Kept: every node the job should not join; both questions (``all_of_them`` or not) are
    # answered from it.
    memo_key = (job_class, tuple(sorted(types)), tuple(partitions), units if pairwise else None)

    def answer(blocked_nodes, candidates: int) -> tuple[list[str], int]:
        if len(blocked_nodes) == candidates and not all_of_them:
            return [], candidates
        return list(blocked_nodes), candidates

    if memo is not None:
        hit = memo.get(memo_key)
        if hit is not None and hit[0] is knowledge:
            return answer(hit[1], hit[2])
    answers: dict[tuple[int | str, str], bool] = {}
    verdicts: dict[tuple, bool] = {}
    wanted = set(partitions)
    candidates = [n for n in nodes if n.gpu_type in types and in_partitions(n, wanted)]
    excluded = tuple(sorted(n.name for n in candidates
                            if keeps_off(n, job_class, knowledge, units,
                                         _answers=answers, _verdicts=verdicts)))
    if memo is not None:
        memo[memo_key] = (knowledge, excluded, len(candidates))
    return answer(excluded, len(candidates))


def in_partitions(node: NodeView, wanted: AbstractSet[str]) -> bool:
    """Whether a node serves one of the job's partitions (a node the view gives none serves all)."""
    return not node.partitions or not wanted.isdisjoint(node.partitions)


def idle_gpus_by_type(fits: Sequence[GpuType], partitions: Sequence[str],
                      view: ClusterView | None) -> dict[str, int]:
    """The job's fitting types with idle GPUs in one of its partitions, and how many (the
    view's word), in the order of ``fits``."""
    if view is None:
        return {}
    nodes = view.nodes()
    checks = getattr(nodes, "checks", None)  # a daemon snapshot: answered once per snapshot
    key = ("idle", tuple(g.name for g in fits), tuple(partitions))
    if checks is not None and key in checks:
        return dict(checks[key])
    types = {g.name for g in fits}
    wanted = set(partitions)
    idle: dict[str, int] = {}
    for n in nodes:
        if n.idle_gpus and n.gpu_type in types and in_partitions(n, wanted):
            idle[n.gpu_type] = idle.get(n.gpu_type, 0) + n.idle_gpus
    found = {g.name: idle[g.name] for g in fits if g.name in idle}
    if checks is not None:
        checks[key] = tuple(found.items())
    return found


def _keep(code: str, reason: str, decision_id: str = "", **details) -> Decision:
    return Decision(action="keep", code=code, reason=reason, decision_id=decision_id,
                    details=details)


def gpu_request(request: JobRequest) -> tuple[str, tresmod.TresToken] | None | str:
    """Where the job asks for GPUs: ``(field, token)``, ``None`` for no GPU, or a keep code."""
    return _gpu_request(request.tres_per_node, request.tres_per_job, request.tres_per_socket,
                        request.tres_per_task)


_TRES_FIELDS = ("tres_per_node", "tres_per_job", "tres_per_socket", "tres_per_task")


@functools.lru_cache(maxsize=4096)  # every decision reads one of a few requests again
def _gpu_request(*values: str | None) -> tuple[str, tresmod.TresToken] | None | str:
    found = []
    for name, value in zip(_TRES_FIELDS, values):
        if not value:  # most are empty: nothing to parse
            continue
        try:
            tokens = tresmod.parse(value)
        except tresmod.TresError:
            return "unparsable-tres"
        if any(t.name in SHARED_GRES for t in tokens):
            return "already-shared"
        found += [(name, t) for t in tresmod.find(tokens, "gpu")]
    if not found:
        return None
    if len(found) > 1:
        return "complex-gpu-request"
    return found[0]


def default_estimate(request: JobRequest, config: Config) -> JobEstimate | None:
    """Without history: the user's memory hint (plus margin), else the first-run policy's
    default share, or None when first runs take a whole GPU."""
    if request.mem_hint_mib:
        need = request.mem_hint_mib * (1 + config.policy.hint_margin)
        return JobEstimate(source="hint", memory_mib={g.name: need for g in config.gpu_types},
                           detail=f"memory hint {request.mem_hint_mib / 1024:.1f} GiB "
                                  f"+ {config.policy.hint_margin:.0%} margin")
    if config.policy.first_run == "whole-gpu":
        return None
    need = config.policy.default_share_gib * 1024
    return JobEstimate(source="default", memory_mib={g.name: need for g in config.gpu_types},
                       detail=f"default share of {config.policy.default_share_gib} GiB")


def _partitions(request: JobRequest) -> list[str]:
    return [p for p in request.partition.split(",") if p]


def _combine_features(user: str, types: Sequence[GpuType]) -> str:
    """AND the user's constraint (canonical, an AND operand: feasibility.check) with an OR of
    the chosen types' features."""
    ours = "|".join(g.feature for g in types)
    if not user:
        return ours
    return f"{user}&({ours})" if len(types) > 1 else f"{user}&{ours}"


def retype_features(features: str, types: Sequence[GpuType], new_types: Sequence[GpuType]
                    ) -> str | None:
    """``features`` as ``_combine_features`` wrote it for ``types``, rewritten for
    ``new_types`` (the user's constraint kept); None where it is not in that form (changed
    since). A requeue narrows a share's types, a waiting share is widened."""
    ours = "|".join(g.feature for g in types)
    for form in (f"&({ours})", f"&{ours}") if len(types) > 1 else (f"&{ours}",):
        if features.endswith(form):
            return _combine_features(features[:-len(form)], new_types)
    return _combine_features("", new_types) if features == ours else None


MPS_PER_GPU = 100  # gres/mps Count per GPU: percent of one GPU


def capacity(gpu_type: GpuType) -> int:
    """Units of the shared gres on one GPU: shards (of shard_mib) or MPS percent."""
    return MPS_PER_GPU if gpu_type.sharing == "mps" else shards_per_gpu(gpu_type)


def units_needed(gpu_type: GpuType, memory_mib: float, util_pct: float | None,
                 budget_pct: float) -> int:
    """Units a job needs on one GPU type: its memory, or its part of the GPU-time budget
    (co-runners' peak utilisations may add up to ``budget_pct``) if that is more."""
    unit_mib = (gpu_type.shard_mib if gpu_type.sharing == "shard"
                else gpu_type.memory_gib * 1024 / MPS_PER_GPU)  # MPS: 1% of the GPU's memory
    units = math.ceil(memory_mib / unit_mib - 1e-9)
    if util_pct is None or budget_pct <= 0:
        return units
    return max(units, math.ceil(util_pct / budget_pct * capacity(gpu_type) - 1e-9))


def copies_per_gpu(request: JobRequest, estimate: JobEstimate, fits: Sequence[GpuType],
                   needs: Mapping[str, int],
                   knowledge: Compatibility | PairCompatibility | None) -> int | None:
    """How many jobs like this one may share a GPU, where fewer than its share's count would
    let in; None where nothing limits them.

    Slurm places a share wherever its count fits, without the pair predictor: when the job
    waits in the queue, and for the tasks of an array (one decision for all of them, which
    Slurm packs onto the first GPU with room). Only the count holds there. So where the pair
    predictor judges the job (it has a profile), the share is sized so that no more copies of
    it fit on one GPU than may run together (each at least at the speed threshold): two jobs
    that should not share can then never both fit. A job without a profile is judged by its
    class, for its array's tasks only: all of them, or one per GPU."""
    if knowledge is None:
        return None
    by_count = max(capacity(g) // max(needs[g.name], 1) for g in fits)
    if hasattr(knowledge, "copies_allowed"):
        could = by_count
        allowed = knowledge.copies_allowed(could) if could >= 2 else could
    elif request.array and estimate.job_class is not None:
        could = min(request.array_tasks or by_count, by_count)
        allowed = (could if could < 2 or knowledge.compatible(estimate.job_class,
                                                              estimate.job_class) else 1)
    else:
        return None
    return allowed if allowed < could else None


def decide(request: JobRequest, config: Config, *, estimate: JobEstimate | None = None,
           view: ClusterView | None = None,
           knowledge: Compatibility | PairCompatibility | None = None,
           decision_id: str = "") -> Decision:
    """The sharing decision, then the job's place in the queue (``priority = "sjf"``)."""
    decision = share_or_keep(request, config, estimate=estimate, view=view,
                             knowledge=knowledge, decision_id=decision_id)
    nice = sjf_nice(request, config, estimate)
    if not nice:
        return decision
    runtime = min(s for s in estimate.runtime_s.values() if s and s > 0)
    return replace(decision, writes={**decision.writes, "nice": str(nice)},
                   reason=f"{decision.reason}; nice {nice:+d} (predicted run time "
                          f"{_duration(runtime)}, shortest job first)",
                   details={**decision.details, "nice": nice})


def sjf_nice(request: JobRequest, config: Config, estimate: JobEstimate | None) -> int | None:
    """The nice adjustment of the SJF lever, or None where it does not apply.

    Only from the job's own history (no history: its priority is left alone), on the fastest
    type it was predicted for; log-scaled, because run times span orders of magnitude and a
    factor of two in the estimate should move a job a little, not to the other end of the queue.
    """
    policy = config.policy
    if policy.priority != "sjf" or estimate is None or estimate.source != "history":
        return None
    runtimes = [s for s in estimate.runtime_s.values() if s and s > 0]
    partitions = _partitions(request)
    where = set(policy.priority_partitions or policy.sharing_partitions)
    if not runtimes or not partitions or not all(p in where for p in partitions):
        return None
    nice = round(policy.sjf_nice_per_decade * math.log10(min(runtimes) / policy.sjf_reference_s))
    return max(-policy.sjf_nice_max, min(policy.sjf_nice_max, nice))


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def room_nodes(fits: Sequence[GpuType], units: int, partitions: Sequence[str],
               view: ClusterView | None) -> dict[str, tuple[str, ...]] | None:
    """Per type among ``fits``, the usable nodes in one of the job's partitions where Slurm
    could place a share of ``units`` now (counting the shares decided but not placed yet, where
    the view has them); None where the view does not know free units."""
    if view is None:
        return None
    nodes = view.nodes()
    checks = getattr(nodes, "checks", None)  # a daemon snapshot: answered once per snapshot
    key = ("room-nodes", tuple(g.name for g in fits), tuple(partitions), units)
    if checks is not None and key in checks:
        return checks[key]
    types = {g.name for g in fits}
    wanted = set(partitions)
    known, found = False, {}
    for node in nodes:
        if node.gpu_type not in types or not in_partitions(node, wanted):
            continue
        if node.free_units:
            known = True
            if feasibility.state_usable(node.state) and landing_gpu(node, units) is not None:
                found.setdefault(node.gpu_type, []).append(node.name)
    answer = {t: tuple(names) for t, names in found.items()} if known else None
    if checks is not None:
        checks[key] = answer
    return answer


def room_types(fits: Sequence[GpuType], units: int, partitions: Sequence[str],
               view: ClusterView | None, excluded: Sequence[str] = ()) -> set[str] | None:
    """The types among ``fits`` with a node in one of the job's partitions, not ``excluded``,
    where Slurm could place a share of ``units`` now (``room_nodes``); None where the view does
    not know free units."""
    rooms = room_nodes(fits, units, partitions, view)
    if rooms is None:
        return None
    away = set(excluded)
    return {t for t, names in rooms.items() if any(n not in away for n in names)}


def _share_nodes(types: Sequence[GpuType], partitions: Sequence[str], view: ClusterView):
    """The usable nodes of ``types`` in the job's partitions (a node without partitions: any)."""
    names, wanted = {g.name for g in types}, set(partitions)
    return [n for n in view.nodes() if n.gpu_type in names and feasibility.state_usable(n.state)
            and in_partitions(n, wanted)]


def share_slots(types: Sequence[GpuType], units: int, partitions: Sequence[str],
                view: ClusterView, excluded: Sequence[str] = ()) -> int:
    """How many shares of ``units`` fit now on the GPUs of ``types`` in the job's partitions, on
    usable nodes not ``excluded`` (the room an array's tasks find at once)."""
    checks = getattr(view.nodes(), "checks", None)  # a daemon snapshot: once per snapshot
    key = ("slots", tuple(g.name for g in types), tuple(partitions), units, tuple(excluded))
    if checks is not None and key in checks:
        return checks[key]
    away = set(excluded)
    count = sum(free // max(units, 1) for n in _share_nodes(types, partitions, view)
                if n.name not in away for free in n.free_units)
    if checks is not None:
        checks[key] = count
    return count


def mean_rounds(tasks: int, slots: int) -> float:
    """Mean round in which ``tasks`` tasks finish where ``slots`` run at a time (1: all at once);
    infinite without a slot."""
    if slots <= 0:
        return math.inf
    full, rest = divmod(tasks, slots)
    return (slots * full * (full + 1) / 2 + rest * (full + 1)) / tasks


def queued_completion(tasks: int, runtime: float, start_now: int, pool: int,
                      length: float) -> float:
    """Mean completion of ``tasks`` tasks of ``runtime`` each where ``start_now`` start at once
    and the rest take places in a pool of ``pool`` as they free, one every ``length / pool``
    on average (a running job's end is not known: each place frees once per ``length``, the
    job's own run time standing in for its neighbours'); infinite without a place."""
    waiting = max(tasks - start_now, 0)
    if not waiting:
        return runtime
    if pool <= 0:
        return math.inf
    return runtime + waiting * (waiting + 1) / (2 * tasks) * length / pool


def gpus_by_type(types: Sequence[GpuType], partitions: Sequence[str],
                 view: ClusterView) -> dict[str, int] | None:
    """GPUs of ``types`` on usable nodes in the job's partitions, per type; None where the view
    does not know a node's GPUs (or there is no such node)."""
    nodes = view.nodes()
    checks = getattr(nodes, "checks", None)  # a daemon snapshot: answered once per snapshot
    key = ("gpus", tuple(g.name for g in types), tuple(partitions))
    if checks is not None and key in checks:
        found = checks[key]
        return None if found is None else dict(found)
    counts: dict[str, int] | None = {}
    for n in _share_nodes(types, partitions, view):
        if n.gpus <= 0:
            counts = None
            break
        counts[n.gpu_type] = counts.get(n.gpu_type, 0) + n.gpus
    counts = counts or None
    if checks is not None:
        checks[key] = None if counts is None else tuple(counts.items())
    return counts


def array_completions(offered: Sequence[GpuType], units: int, eligible: Sequence[GpuType],
                      tasks: int, estimate: JobEstimate, partitions: Sequence[str],
                      view: ClusterView) -> tuple[float, float] | None:
    """An array's tasks' mean completion (``queued_completion``) as shares of ``units`` on the
    ``offered`` types, and as submitted (a whole GPU each, on any ``eligible`` type): the share
    starts as many tasks as fit now and queues the rest on the GPUs that take shares; whole, as
    many as GPUs are idle, the rest queued on every GPU of its types. In the job's fastest run
    times; None where the view does not know the GPUs."""
    gpus_of = gpus_by_type(eligible, partitions, view)
    if gpus_of is None:
        return None
    runs = {g.name: estimate.runtime_s.get(g.name) for g in eligible}
    known = [r for r in runs.values() if r and r > 0]
    length = min(known) if known else 1.0
    run = lambda g: runs[g.name] if runs[g.name] and runs[g.name] > 0 else length  # noqa: E731
    share_run = min(run(g) for g in offered)
    copies = max(1, min(capacity(g) // max(units, 1) for g in offered))
    share = queued_completion(tasks, share_run, share_slots(offered, units, partitions, view),
                              share_gpus(offered, partitions, view) * copies, length)
    pool = sum(gpus_of.values())
    whole_run = sum(run(g) * gpus_of.get(g.name, 0) for g in eligible) / pool
    idle = sum(idle_gpus_by_type(eligible, partitions, view).values())
    return share / length, queued_completion(tasks, whole_run, idle, pool, length) / length


def share_gpus(types: Sequence[GpuType], partitions: Sequence[str], view: ClusterView) -> int:
    """GPUs of ``types`` in the job's partitions, on usable nodes, that a share may get when room
    frees there: those with room or shares now, not those held whole (when a whole-GPU job ends
    is not known); where the view does not know GPUs, every GPU of a shard type and one per node
    of an MPS type (Slurm uses MPS on one GPU of a node)."""
    nodes = view.nodes()
    checks = getattr(nodes, "checks", None)  # a daemon snapshot: answered once per snapshot
    key = ("share-gpus", tuple(g.name for g in types), tuple(partitions))
    if checks is not None and key in checks:
        return checks[key]
    mps = {g.name: g.sharing == "mps" for g in types}
    count = 0
    for n in _share_nodes(types, partitions, view):
        if n.free_units:
            count += sum(1 for i, free in enumerate(n.free_units)
                         if free or (i < len(n.gpu_jobs) and n.gpu_jobs[i]))
        else:
            count += min(n.gpus, 1) if mps[n.gpu_type] else n.gpus
    if checks is not None:
        checks[key] = count
    return count


def choose_offer(fits: Sequence[GpuType], needs: Mapping[str, int], estimate: JobEstimate,
                 partitions: Sequence[str], view: ClusterView | None,
                 knowledge: Compatibility | PairCompatibility | None = None, tasks: int = 1
                 ) -> tuple[int, list[GpuType], list[GpuType], bool | None]:
    """The request (one sharing gres, one count) and the types it is offered on.

    A request suits a set of types: those where the anchor type's count covers the job's need
    and fits the GPU (GiB shards, MPS percent, GPU-time sized shards). Each is judged by expected completion: whether a type has room now (no wait; a
    node the job would be kept away from for its partners is no room) first, then its run
    time, run times within ``RUNTIME_TIE`` counting as equal; then the request usable on more
    types. An array of ``tasks`` (one decision covers them all) is judged by its tasks' mean
    completion instead: run time times the mean round in which they finish, where as many
    start at once as shares fit now (``mean_rounds``): room for a few tasks on a fast type can
    leave the rest waiting while a slower type has room for all. It is offered on every type of its set not slower than the fastest one with room
    now (a faster type that is full is offered too: it may free first); where no type is known
    to have room, on every type of its set. Returns ``(units, types offered fastest first,
    types left out, whether an offered type has room now: None where the view does not say,
    the types of its set left out: slower ones the same request suits)``.
    """
    # Each type's run time (None: unknown) and capacity, read once: every candidate count and
    # its score read them again (this runs for every eligible submission).
    run: dict[str, float | None] = {}
    for g in fits:
        value = estimate.runtime_s.get(g.name)
        run[g.name] = value if value and value > 0 else None
    caps = {g.name: capacity(g) for g in fits}

    ordered = sorted(fits, key=lambda g: (run[g.name] is None, run[g.name] or 0.0))
    offers = []
    seen: list[list[str]] = []  # the offers' types by name
    # One candidate count per anchor type: its own need, on every type that count covers, holds
    # and does not oversize (``OVERSIZE_TIE``). (The largest need alone would drop every type
    # too small for it, even where a smaller count suits most types: a job that fills a 16 GiB
    # GPU is predicted to fill a 32 GiB one too, and was offered on the 32 GiB type alone.)
    for position, anchor in enumerate(ordered):
        units = max(needs[anchor.name], 1)
        sharing = anchor.sharing
        group = [g for g in ordered if g.sharing == sharing
                 and needs[g.name] <= units <= caps[g.name]
                 and units - needs[g.name] <= max(1.0, OVERSIZE_TIE * needs[g.name])]
        # (Types compared by name: a type's fields need not be compared, names are unique.)
        names = [g.name for g in group]
        if anchor.name not in names or names in seen:
            continue
        seen.append(names)
        room = None if view is None else room_types(group, units, partitions, view)
        slots = None  # shares of an array's tasks that fit now (None: a single job, or unknown)
        if room is not None:  # the view knows free units: a node to keep away from is no room
            away, _ = incompatible_nodes(estimate.job_class, group, partitions, view, knowledge,
                                         units, all_of_them=True)
            if away:
                room = room_types(group, units, partitions, view, away)
            if tasks > 1:
                slots = share_slots(group, units, partitions, view, away) if room else 0
        offers.append((units, group, position, room, slots))

    known_runs = [r for r in run.values() if r is not None]
    fastest = min(known_runs) if known_runs else None
    tie = None if fastest is None else fastest * (1 + RUNTIME_TIE)

    def completion(g: GpuType, room: set[str] | None) -> tuple[bool, float]:
        waits = room is not None and g.name not in room
        own = run[g.name]
        if own is None or fastest is None:
            return waits, 0.0
        return waits, (fastest if own <= tie else own)

    # Where no request has room now, the job waits for a GPU to free among its types: not for
    # GPUs held whole (when they free is not known), and, at equal run times, on the request
    # usable on more GPUs (a type with few GPUs for shares, such as MPS on one GPU per node,
    # would hold the job back while others free).
    waiting = view is not None and all(room is not None and not room
                                       for _, _, _, room, _ in offers)

    def score(offer) -> tuple:
        units, group, position, room, slots = offer
        waits, runtime = min([completion(g, room) for g in group])
        if slots is not None and not waiting:
            # An array: room for a few of its tasks on a fast type may finish them later than
            # room for all of them on a slower one. Its mean completion in run times: the tasks
            # start in rounds of the shares that fit now (no room at all goes last).
            return (slots == 0, (runtime or fastest or 1.0) * mean_rounds(tasks, slots),
                    -len(group), position)
        if waiting:
            # A request whose every GPU is held whole may wait for as long as those jobs run:
            # it goes last; among the others, the faster, then the one with more GPUs.
            gpus = share_gpus(group, partitions, view)
            return (waits, gpus == 0, runtime, -gpus, -len(group), position)
        return (waits, runtime, -len(group), position)

    units, group, _, room, _ = offers[0] if len(offers) == 1 else min(offers, key=score)
    # Without a view of free room, or with room on none of them, every type of the request is
    # offered: whichever frees first takes the job.
    known = ([run[g.name] for g in group if g.name in room and run[g.name] is not None]
             if room is not None else [])
    limit = min(known) * (1 + RUNTIME_TIE) if known else None
    offered = (list(group) if limit is None else
               [g for g in group if run[g.name] is None or run[g.name] <= limit])
    offered_names = {g.name for g in offered}
    left_out = [g for g in ordered if g.name not in offered_names]
    later = [g for g in group if g.name not in offered_names]
    has_room = None if room is None else any(g.name in room for g in offered)
    return units, offered, left_out, has_room, later


def share_or_keep(request: JobRequest, config: Config, *, estimate: JobEstimate | None = None,
                  view: ClusterView | None = None, knowledge: Compatibility | None = None,
                  decision_id: str = "") -> Decision:
    """Keep the job as submitted, or turn its one whole GPU into a share of GPU memory.

    Jobs that cannot or must not share (no GPU, several GPUs, multi-node, exclusive, partition
    without sharing, opted out) are kept and not written to at all. An eligible job that is
    kept (first run, does not fit) gets only an AdminComment tag, so that its telemetry is
    tied to its decision and becomes history for its next run.
    """
    keep = lambda code, reason, **d: _keep(code, reason, decision_id, **d)  # noqa: E731

    def keep_tagged(code: str, reason: str, **details) -> Decision:
        return Decision(action="keep", code=code, reason=reason, decision_id=decision_id,
                        writes={"admin_comment": Tag("keep", code, decision_id).encode()},
                        details=details)

    where = gpu_request(request)
    if where is None:
        return keep("no-gpu", "the job asks for no GPU")
    if where == "already-shared":
        return keep("already-shared", "the job already asks for shard or mps")
    if isinstance(where, str):
        return keep(where, "the GPU request is not a single plain one; left as submitted")
    field_name, gpu = where
    if field_name in ("tres_per_socket", "tres_per_task"):
        return keep("per-task-gpus", "GPUs per task or socket are not shared")
    if gpu.count != 1:
        return keep("multi-gpu", f"the job asks for {gpu.count} GPUs; only single-GPU jobs share")
    if (request.min_nodes or 1) > 1 or (request.max_nodes or 1) > 1:
        # A node range (-N 1-2) may give the job several nodes: a multi-node job then.
        return keep("multi-node", "multi-node jobs are not shared")
    if request.exclusive:
        return keep("exclusive", "--exclusive jobs get no shares")
    if request.cpus_per_tres or request.mem_per_tres or request.ntasks_per_tres:
        return keep("per-gpu-options", "per-GPU options (--cpus/--mem/--ntasks-per-gpu) "
                                       "would lose their GPU; left as submitted")
    if "gpu" in request.tres_freq:
        # Slurm refuses a shared gres with a GPU frequency (gres.c: ESLURM_INVALID_GRES).
        return keep("gpu-freq", "--gpu-freq cannot go with a share (Slurm refuses it): "
                                "left as submitted")
    if request.prefer:
        # Slurm tries a job's --prefer features in place of its constraint (set_job_features_use):
        # a share's GPU types would not hold, and one whose preferred nodes have no shards is
        # refused at submission ("Requested node configuration is not available").
        return keep("prefer", "--prefer replaces the GPU types a share is sized for while Slurm "
                              "tries it: left as submitted")
    partitions = _partitions(request)
    sharing = set(config.policy.sharing_partitions)
    if not partitions or not all(p in sharing for p in partitions):
        return keep("partition-off", f"sharing is off in partition {request.partition or '(none)'}")
    if request.opt_out:
        return keep("opt-out", "the user opted out of sharing")
    # Forms of submission (docs/user-guide.md, "What happens to each kind of job").
    if request.het_offset is not None:
        return keep("het-job", "components of heterogeneous jobs keep what they asked for")
    if not request.batch:
        return keep("allocation", "srun/salloc allocations keep a whole GPU: their steps ask "
                                  "for the GPU themselves, which a share cannot give")
    if request.steps_ask_gpus:
        return keep_tagged("steps-need-gpu", "the script's srun steps ask for GPUs themselves "
                                             "(--gres=gpu, --gpus, -G) or per GPU "
                                             "(--cpus/--mem/--ntasks-per-gpu): keeps a whole GPU")

    estimate = estimate or default_estimate(request, config)
    if estimate is None:
        return keep_tagged("first-run", "no history yet: runs on a whole GPU and is profiled "
                                        "so that its next run can share")
    if not estimate.memory_mib:
        return keep_tagged("memory-unknown", f"{estimate.detail}; keeps a whole GPU",
                           source=estimate.source)
    candidates = list(config.gpu_types)
    if gpu.type:
        candidates = [g for g in candidates if g.name == gpu.type]
        if not candidates:
            return keep_tagged("unknown-type",
                               f"GPU type {gpu.type} is not configured for sharing")
    fits, too_big = [], []
    for gpu_type in candidates:
        need = estimate.memory_mib.get(gpu_type.name)
        if need is None:
            if gpu_type.name in estimate.excluded:
                too_big.append(gpu_type)
            continue
        (fits if need <= gpu_type.memory_gib * 1024 else too_big).append(gpu_type)
    if not fits:
        return keep_tagged("does-not-fit", f"{estimate.detail or 'the estimate'} fits no GPU type "
                                    f"({', '.join(g.name for g in too_big) or 'none known'}); "
                                    "keeps a whole GPU", source=estimate.source)

    # Units per type (GiB shards, or MPS percent): the job's memory, or its part of the
    # GPU-time budget if that is more -- so Slurm's own accounting of the shared gres keeps
    # co-runners within the budget.
    budget = config.policy.gpu_time_budget_pct
    needs = {g.name: units_needed(g, estimate.memory_mib[g.name], estimate.util_pct, budget)
             for g in fits}
    fits, too_busy = ([g for g in fits if needs[g.name] <= capacity(g)],
                      [g for g in fits if needs[g.name] > capacity(g)])
    too_big += too_busy
    if not fits:
        return keep_tagged("does-not-fit", f"{estimate.detail}: its GPU time does not fit a "
                                           "share of any type; keeps a whole GPU",
                           source=estimate.source)
    # Only types on which Slurm can place the share: partitions, --constraint, --nodelist,
    # --exclude, reservation and node states (else the rewrite is rejected or pends forever).
    placement = feasibility.check(request, fits, view)
    if placement.code:
        return keep_tagged(placement.code, f"{placement.reason}; left as submitted",
                           source=estimate.source)
    fits = [g for g in fits if g.name in placement.types]
    copies = copies_per_gpu(request, estimate, fits, needs, knowledge)
    if copies == 1 and not hasattr(knowledge, "copies_allowed"):  # an array judged by class
        tasks = (f"its {request.array_tasks} array tasks" if request.array_tasks
                 and request.array_tasks < MANY_ARRAY_TASKS else "its array tasks")
        return keep_tagged("array-stacking", f"{estimate.detail}: {tasks} would share one GPU "
                                             "(one decision for all of them, and Slurm packs "
                                             f"shares together), and its class "
                                             f"{estimate.job_class} interferes with itself: "
                                             "keeps a whole GPU per task", source=estimate.source)
    if copies:
        # One more copy than allowed must not fit on any type: a count above 1/(copies + 1)
        # of the GPU.
        needs = {g.name: max(needs[g.name], capacity(g) // (copies + 1) + 1) for g in fits}
    # Which request to make, and on which types: by expected completion.
    eligible = fits
    tasks = (request.array_tasks or MANY_ARRAY_TASKS) if request.array else 1
    units, fits, slower, room, later = choose_offer(fits, needs, estimate, partitions, view,
                                                    knowledge, tasks)
    best = fits[0]
    if not too_big and all(units >= capacity(g) for g in fits):
        # A share of the whole GPU leaves room for no one and would narrow the job to these
        # types: as submitted, it may run on any type -- where it fits on every one (else the
        # share keeps it off the types it does not fit: OOM avoidance).
        return keep_tagged("whole-share", f"{estimate.detail or 'the estimate'} takes the whole "
                                          f"GPU on {', '.join(g.name for g in fits)}: runs on "
                                          "a whole GPU", source=estimate.source)
    if config.policy.keep_whole_when_idle:
        # One decision covers an array's tasks: whole GPUs only if each task finds an idle one
        # (else the rest would wait for a whole GPU while they could share).
        idle = idle_gpus_by_type(fits, partitions, view)
        idle_count = sum(idle.values())
        if idle and idle_count >= tasks:
            what = (f"a {next(iter(idle))} GPU is idle" if tasks == 1 else
                    f"{idle_count} GPUs of {', '.join(idle)} are idle for its {tasks} array tasks")
            return keep_tagged("idle-gpu", f"{what}: runs on a whole GPU "
                                           "(shares only when GPUs are scarce)",
                               source=estimate.source, idle_types=list(idle),
                               idle_gpus=idle_count, tasks=tasks)
    if (room is not None and not too_big and len(fits) < len(eligible)
            and all(2 * units > capacity(g) for g in fits)):
        # A share that packs no second job like it on a GPU holds a GPU of fewer types as good
        # as whole. Where it would wait (an array: where its tasks would not all start), the job
        # as submitted takes the first GPU of any type it fits to free.
        if not room or (tasks > 1 and share_slots(fits, units, partitions, view) < tasks):
            what = (f"its share of {units}" if tasks == 1 else
                    f"the shares of {units} of its "
                    + (f"{tasks} array tasks" if tasks < MANY_ARRAY_TASKS else "array tasks"))
            return keep_tagged("waits-whole", f"{estimate.detail}: no room for {what} on "
                                              f"{', '.join(g.name for g in fits)} now, and no "
                                              "two jobs like it fit on one GPU: runs as "
                                              "submitted, on the first GPU to free of "
                                              f"{', '.join(g.name for g in eligible)}",
                               source=estimate.source)
    if tasks > 1 and room is not None and not too_big:
        # One decision covers every task: a share narrows all of them to its types. Where its
        # tasks would queue on a few GPUs that take shares (one MPS GPU per node, say) while
        # the job as submitted could take any GPU of its types as they free, as submitted they
        # finish sooner (a share's completion within RUNTIME_TIE of it: the share, which saves
        # GPUs).
        completions = array_completions(fits, units, eligible, tasks, estimate, partitions,
                                        view)
        if completions and completions[1] * (1 + RUNTIME_TIE) < completions[0]:
            share_done, whole_done = completions
            many = f"{tasks} array tasks" if tasks < MANY_ARRAY_TASKS else "array tasks"
            return keep_tagged("array-queues", f"{estimate.detail}: its {many} would queue for "
                                               f"shares on {', '.join(g.name for g in fits)} "
                                               f"(mean completion {share_done:.2f} run times "
                                               f"against {whole_done:.2f} on a whole GPU of "
                                               f"{', '.join(g.name for g in eligible)}): runs "
                                               "as submitted", source=estimate.source,
                               share_completion=round(share_done, 3),
                               whole_completion=round(whole_done, 3), tasks=tasks)
    features = _combine_features(placement.constraint, fits)

    share = tresmod.TresToken(gpu.prefix or "gres:", best.sharing, None, units)
    writes = {"tres_per_node": tresmod.replace(request.tres_per_node, "gpu", share)}
    if field_name == "tres_per_job":
        # 22.05: a shared gres per job needs one node; move it per node and drop the job-wide GPU.
        writes["tres_per_job"] = tresmod.replace(request.tres_per_job, "gpu", None)
    writes["features"] = features
    away, candidates = incompatible_nodes(estimate.job_class, fits, partitions, view, knowledge,
                                          units)
    if away and request.req_nodes:
        # Slurm refuses a job whose --nodelist node is also excluded: the nodes the user named
        # are never excluded (the job shares there as it asked).
        required = set(expand_hostlist(request.req_nodes))
        away = [n for n in away if n not in required]
    if away:
        # Appended, not merged: the user's list may be a hostlist expression (n[1,3-4]).
        writes["exc_nodes"] = ",".join(([request.exc_nodes] if request.exc_nodes else []) + away)
    type_names = tuple(g.name for g in fits)
    code = f"{estimate.source}-share"
    # The memory the job may use wherever it lands (MPS enforces it: the TaskProlog reads it).
    limit_mib = math.ceil(max(estimate.memory_mib[g.name] for g in fits))
    shard_mib = best.shard_mib
    share_gib = (units * shard_mib / 1024 if best.sharing == "shard"
                 else math.ceil(limit_mib / 1024))
    share_gib = int(share_gib) if float(share_gib).is_integer() else share_gib
    # A shard share's memory is shard x 1 GiB unless the site's shards are another size
    # (then written out, as for MPS: the agent and reports read the tag's mem=).
    sized = ({"shard": units} if shard_mib == 1024 else
             {"shard": units, "mem_mib": units * shard_mib})
    writes["admin_comment"] = Tag(
        "share", code, decision_id, types=type_names, job_class=estimate.job_class,
        **(sized if best.sharing == "shard" else {"mps": units, "mem_mib": limit_mib}),
    ).encode()
    if best.sharing == "mps":
        what = f"{units}% MPS share (gres/mps, memory limit {limit_mib / 1024:.1f} GiB)"
    elif shard_mib == 1024:
        what = f"{units} GiB share (gres/shard)"
    else:
        what = f"{units * shard_mib / 1024:g} GiB share ({units} x {shard_mib} MiB gres/shard)"
    reason = (f"{estimate.detail}: {what} on "
              f"{', '.join(f'{g.name} ({g.memory_gib} GiB)' for g in fits)}")
    by_memory = units_needed(best, estimate.memory_mib[best.name], None, 0)
    by_time = units_needed(best, estimate.memory_mib[best.name], estimate.util_pct, budget)
    if by_time > by_memory and units >= by_time:
        reason += (f", sized by GPU time ({estimate.util_pct:.0f}% of a GPU, budget "
                   f"{config.policy.gpu_time_budget_pct:.0f}%)")
    if copies:
        reason += (f", sized so that at most {copies} job{'s' if copies > 1 else ''} like it "
                   "fit on one GPU (pair predictor)")
    if too_big:
        reason += f"; excluded {', '.join(g.name for g in too_big)} (does not fit)"
    if placement.dropped:
        reason += "; not on " + ", ".join(f"{t} (no usable node: {why})"
                                          for t, why in placement.dropped.items())
    if slower:
        reason += (f"; not offered on {', '.join(g.name for g in slower)} "
                   f"(slower than where it can start, or the same request would not suit it)")
    if room is not None and not room:
        reason += "; no room for it on any type now: waits for the first to free"
    if away and hasattr(knowledge, "compatible_with"):
        reason += (f"; away from {', '.join(away)} (resident shares the pair predictor says "
                   "would run below the speed threshold with it)")
    elif away:
        reason += (f"; away from {', '.join(away)} (resident shares of a class that interferes "
                   f"with class {estimate.job_class})")
    return Decision(action="share", code=code, reason=reason, decision_id=decision_id,
                    writes=writes, share_gib=share_gib, gpu_types=type_names,
                    details={"source": estimate.source,
                             "memory_mib": dict(estimate.memory_mib),
                             "runtime_s": dict(estimate.runtime_s),
                             "job_class": estimate.job_class,
                             "excluded_types": [g.name for g in too_big],
                             "excluded_nodes": away, "candidate_nodes": candidates,
                             # Slower types the same request suits: where it may go if the
                             # offered ones stay full while one of these has room (waiting.py).
                             "later_types": [g.name for g in later],
                             "sharing": best.sharing, "units": units, "room_now": room,
                             "memory_limit_mib": limit_mib,
                             **({"copies_per_gpu": copies} if copies else {})})
