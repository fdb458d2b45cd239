"""The pair predictor: each co-runner's normalised speed (throughput shared / alone) from the
jobs' own solo telemetry, learning per-job corrections from the site's co-runs.

**Inputs per job** (a *profile*, a mapping): ``gpu_util_pct`` and ``mem_util_pct`` (means over
the run: SM busy and memory-controller busy, NVML), optional ``gpu_util_max_pct`` and
``mem_util_max_pct`` (peaks), ``mem_used_mib`` (peak GPU memory) and ``mem_total_mib`` (the
GPU's memory). Where a mean is missing it is taken as ``MEAN_PER_PEAK`` times the peak; where
memory-controller use is missing altogether, as ``MEM_PER_SM`` times the SM demand.

**The prior: time-slicing contention, one shape parameter fixed by physics.** Without MPS
(gres/shard) the kernels of two processes never run at once: the GPU time-slices between them.
A job waits whenever it needs the GPU while a partner holds it, so job ``a``'s slowdown
(ISD = 1 / speed - 1) next to partners ``B`` is

    ISD_a = exposure_a * sum over b in B of occupancy_b
    exposure_a = latency + (1 - latency) * occupancy_a

with ``occupancy`` the share of time the job keeps the GPU busy (the larger of its mean SM and
mean memory-controller utilisation, a fraction). ``exposure`` is how much of ``a``'s time is
stretched by a busy partner: its own busy share (the fluid limit, ``latency`` = 0: a job that
rarely uses the GPU rarely waits) or all of it (``latency`` = 1: every GPU call of a
latency-bound job waits for the partner's time slice, as host-bound jobs in the measured pairs
do). The scale is not fitted: two jobs that each keep the GPU busy all the time run at half speed
(ISD 1), three at a third -- absolute speed, not one foreign GPU's contention level.
``latency`` is chosen where the margins are calibrated, on the sets whose telemetry is what the
daemon reads (``calibration_sets``): the largest grid value that ranks their sides within one
standard error of the best (``estimators.PairSpeedModel``; each set weighs the same). On the
project's H100 pairs alone that was 0.4 (Spearman 0.929; the best, 0.0, 0.939 with a standard
error of 0.010); its H200 pairs, where light jobs next to busy ones barely wait (0.87-0.99x),
rank 0.868 at 0.0 and 0.732 at 0.4, and with both sets it is 0.1 (0.934 and 0.843). With none
of those sets it is 0.5 (``DEFAULT_LATENCY``), the middle of the two physical
limits: on synthetic pairs whose true latency lies anywhere in [0, 1] its Spearman is at worst
0.82 (within 0.13 of the best choice), where either limit falls to 0.59-0.63 and adding
utilisations to 0.60 (``bench/pairs_eval.py``, ``shape_robustness``); the public sets'
telemetry cannot tell (Gavel's utilisation proxy pulls it to 0.7-1.0, Ray et al.'s host-bound
pairs to 1.0). On Lucid's public pairs (never fitted on) 0.1 recommends 66% of the pairs, 0.1%
of them bad, where 0.5 recommended 56%: light jobs there barely wait for a busy partner either.
Every term is non-decreasing in every partner's demand (monotone: a busier partner never
predicts a faster job); it is defined for a job next to a copy of itself and for any number of
co-runners.

**Saturation.** The term above is the *collision* slowdown: it holds while the GPU has time to
spare. Where the co-runners together ask for more than all of it, time slicing gives each at
most its max-min fair share of the GPU's time (a job asking less than an equal share gets what
it asks; the rest is split equally among the others), so a job whose occupancy exceeds its share
``f`` runs at no more than ``f / occupancy``: its *saturation* slowdown ``occupancy / f - 1``. A
job's slowdown is the larger of the two, still monotone and still without a fitted scale. The
term came from the project's own H100 pairs (``data/measured/h100``): the busy side of a
saturated pair ran close to its fair share (ResNet-50 training, 93% busy, next to a launch-bound
CNN at 46%: 0.59x measured, 0.58x from its fair share), where collision alone predicted 0.69x
and made it the faster of the two (the CNN ran at 0.74x; both terms give it 0.60x). So those
pairs are no longer blind to the form.

**Learning from the site's co-runs.** Each job (a key: a fingerprint in the daemon, a name in
the CLI) gets two corrections in log space: ``suffers`` (how much more than the prior it slows
down) and ``hurts`` (how much more it slows its partners). A measured pair gives residuals
``log((ISD + eps) / (ISD_prior + eps))`` for each side; corrections are the ridge solution
``r_ab ~ suffers_a + hurts_b`` with penalty ``shrinkage`` per correction (with ``n``
observations a correction moves ``n / (n + shrinkage)`` of the way to the data), so they shrink
towards the prior. A side teaches how much its partner hurts only where one user ran both jobs:
a side's slowdown is its job's run time, which its user controls, and another user's reports
must not steer how a job is paired with third parties. ``shrinkage`` is chosen on the training
data: each set is replayed with three co-runs per job as history and the value that ranks its
other pairs best is kept. A partner's collision term is multiplied by ``exp(suffers_a +
hurts_b)``. The saturation term is not: it is the GPU's time running out, which no job's past
lifts. (Corrections scaled it too until the public Lucid set, 1,388 pairs on an RTX 3090, was
checked: jobs whose three co-runs had been next to light partners learned corrections of
exp(-0.6) to exp(-1.4), which lifted saturated pairs measured at 0.5-0.7x to 0.7-0.97x
predicted, and 3.1% of the pairs recommended with history had a side below 0.7x; see
``bench/pairs_eval.py``.)

**Recommending a pair.** Both jobs fit in memory together, and each side's *pessimistic* speed,
``1 / (1 + margin * ISD)``, is at least the threshold (0.7). ``margin`` is the smallest factor
that keeps the share of recommended training pairs with a side measured below the threshold at or
under ``max_bad_rate``, on the sets whose telemetry is what the daemon reads
(``calibration_sets``: the project's own NVML measurements; every set where none is in the
training data). The public sets' telemetry has errors of its own and asked for 2.1: Gavel's
proxies cannot be calibrated at all, and two host-bound pairs of Ray et al.'s set with moderate
peaks ran at 0.60-0.67x. On the H100 measurements alone 1.0 was enough (1.15 with corrections,
over five history draws per set), but held out the H200 pairs then had 1 of 15 recommended
pairs at 0.698x: the busy side of a busy-light pair pays more than its fair share there. Both
sets ask for 1.45 cold and 1.25 with corrections; on Lucid's public set (never fitted on) that
recommends 66% of the pairs with 0.1% bad, where 2.1 recommended 15%. Sites can ask for more
(``policy.pair_margin``).

Data (fitted only on ``slurm_gpushare/data``: copies of the public sets in ``../shared/data``
and the project's own measurements): Gavel's measured pairs on K80, P100 and V100 (telemetry:
the Amdahl utilisation proxy derived from isolated throughputs, see ``knowledge.py``; no
memory-controller figure), Ray et al.'s 34 pairs on a P100 (peak utilisation and peak memory
access per job), 90 pairs on an H100 and 53 on an H200 (``data/measured/h100``, ``h200``:
means and peaks from the node agent's sampler). ``bench/pairs_eval.py`` evaluates it leaving
one data set out, and on public sets kept for evaluation (``--external``).

The fit is ``estimators.PairSpeedModel``; what it produces, and what the daemon loads (the
packaged prior, ``data/interference/pair_prior.json``), is ``PairModel`` here (pure Python).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from typing import TYPE_CHECKING

import numpy as np

from slurm_gpushare.predict.persist import stored_pair_prior

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_THRESHOLD = 0.7
# Mean / peak utilisation where only the peak is known (alnair's 49 runs: median mean/peak SM
# utilisation 0.17, memory 0.19; 0.5 errs towards more contention, the safe side).
MEAN_PER_PEAK = 0.5
# Memory-controller demand per unit of SM demand where it was not measured (alnair: median
# ratio of mean memory to mean SM utilisation 0.43).
MEM_PER_SM = 0.5
EPS = 0.05  # ISD offset for log residuals: a 0% slowdown is not an infinite ratio
MIN_SPEED = 0.02
MAX_MARGIN = 6.0  # the most pessimism a calibration may ask for (ISD x 6)
PARAMETERS = ("latency",)
DEFAULT_LATENCY = 0.5  # the middle of the two physical limits: without NVML-measured pairs
LATENCY_GRID = np.round(np.linspace(0.0, 1.0, 21), 2)
# Penalties per correction to choose from on training data (see ``_calibrate_learned``).
SHRINKAGE_GRID = (0.25, 0.5, 1.0, 2.0)


@dataclass(frozen=True)
class Demand:
    """A job's SM (``sm``) and memory-controller (``mem``) demand, fractions of one GPU."""

    sm: float
    mem: float


def _number(value) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def demand_of(profile: Mapping[str, Any]) -> Demand:
    """Mean SM and memory-controller demand of a profile (see the module text)."""
    def mean_of(mean_key: str, peak_key: str) -> float | None:
        mean = _number(profile.get(mean_key))
        if mean is None:
            peak = _number(profile.get(peak_key))
            mean = None if peak is None else MEAN_PER_PEAK * peak
        return None if mean is None else min(max(mean, 0.0), 100.0) / 100.0

    sm = mean_of("gpu_util_pct", "gpu_util_max_pct")
    mem = mean_of("mem_util_pct", "mem_util_max_pct")
    if sm is None and mem is None:
        raise ValueError("a profile needs gpu_util_pct (or gpu_util_max_pct)")
    if sm is None:
        sm = min(1.0, mem / MEM_PER_SM)
    if mem is None:
        mem = MEM_PER_SM * sm
    return Demand(sm, mem)


def occupancy(demand: Demand) -> float:
    """Share of time the job keeps the GPU busy: SM or memory controller, whichever is more."""
    return max(demand.sm, demand.mem)


def exposure(own: Demand, latency: float) -> float:
    """Share of the job's time that a partner holding the GPU stretches (see the module text)."""
    return latency + (1.0 - latency) * occupancy(own)


def collision_isd(own: Demand, partners: Sequence[Demand], latency: float) -> list[float]:
    """Each partner's contribution to ``own``'s collision slowdown (see the module text)."""
    return [exposure(own, latency) * occupancy(p) for p in partners]


def fair_shares(occupancies: Sequence[float]) -> list[float]:
    """Max-min fair shares of one GPU's time among jobs asking for ``occupancies``."""
    shares = [0.0] * len(occupancies)
    left, waiting = 1.0, sorted(range(len(occupancies)), key=lambda i: occupancies[i])
    while waiting:
        equal = left / len(waiting)
        smallest = waiting[0]
        if occupancies[smallest] > equal:
            for i in waiting:
                shares[i] = equal
            break
        shares[smallest] = occupancies[smallest]
        left -= occupancies[smallest]
        waiting.pop(0)
    return shares


def saturation_isd(occupancies: Sequence[float]) -> list[float]:
    """Each job's slowdown from the GPU's time running out: ``occupancy / fair share - 1``
    where its occupancy exceeds its max-min fair share, else 0."""
    return [o / f - 1.0 if o > f > 0 else 0.0
            for o, f in zip(occupancies, fair_shares(occupancies))]


def corrected(isd: float, factor: float) -> float:
    """A prior slowdown scaled by a correction factor in log(ISD + eps) space, as learned."""
    return max(0.0, (isd + EPS) * factor - EPS)


def prior_isd(demands: Sequence[Demand], latency: float,
              correction: Callable[[int, int], float] | None = None) -> list[float]:
    """Each co-runner's slowdown: the larger of its collision and saturation slowdowns (see the
    module text), co-runner i's collision term next to j scaled by ``exp(correction(i, j))``
    (learned, log space) where given (none: the prior itself)."""
    saturation = saturation_isd([occupancy(d) for d in demands])
    out = []
    for i, own in enumerate(demands):
        others = [j for j in range(len(demands)) if j != i]
        collision = sum(corrected(collision_isd(own, [demands[j]], latency)[0],
                                  math.exp(correction(i, j)) if correction else 1.0)
                        for j in others)
        # Saturation is the GPU's time running out: no job's history lifts it.
        out.append(float(max(collision, saturation[i])))
    return out


def fits_memory(profiles: Sequence[Mapping[str, Any]]) -> bool | None:
    """Whether the jobs' memory fits together on one GPU of the smallest memory among them;
    None when a figure is missing."""
    used = [_number(p.get("mem_used_mib")) for p in profiles]
    totals = [_number(p.get("mem_total_mib")) for p in profiles]
    if None in used or None in totals:
        return None
    return sum(used) <= min(totals)


class PairModel:
    """The fitted pair predictor as plain data (pure Python): the prior's shape (``latency``),
    the calibrated margins (``margin`` cold, ``margin_learned`` with corrections), the
    ``shrinkage`` of corrections and the corrections themselves (``suffers``, ``hurts`` by job
    key). What the daemon loads (``default_model``); ``estimators.PairSpeedModel.fit``
    produces it and predicts through it."""

    def __init__(self, *, latency: float, threshold: float = DEFAULT_THRESHOLD,
                 margin: float = 1.0, margin_learned: float = 1.0,
                 shrinkage: float = SHRINKAGE_GRID[-1], n_train: int = 0):
        self.latency = float(latency)
        self.threshold = threshold
        self.margin = margin
        self.margin_learned = margin_learned
        self.shrinkage = shrinkage
        self.n_train = n_train
        self.suffers: dict[str, float] = {}
        self.hurts: dict[str, float] = {}

    # -- per-job corrections --------------------------------------------------------------
    def learn(self, coruns: Iterable[tuple], profiles: Mapping[str, Mapping[str, Any]]
              ) -> "PairModel":
        """Per-job corrections from measured co-runs ``(job_a, job_b, speed_a, speed_b)``
        (a speed may be None: that side was not measured), optionally with a fifth field,
        ``same_user`` (default True); ``profiles`` maps job keys to profiles. Replaces earlier
        corrections (the co-runs given are the whole evidence).

        A side's measured slowdown teaches how much its own job suffers, and how much its
        partner hurts only where one user runs both: a job's run time is its user's to choose,
        and another user's reports must not make a job look harmless to third parties (nor
        harmful, keeping it off shares)."""
        obs = self.residuals(coruns, profiles)
        suffers: dict[str, float] = {}
        hurts: dict[str, float] = {}
        for _ in range(10):  # alternating ridge updates; converges in a few rounds
            totals: dict[str, list[float]] = {}
            for own, other, r, _same_user in obs:
                totals.setdefault(own, []).append(r - hurts.get(other, 0.0))
            suffers = {k: sum(v) / (len(v) + self.shrinkage) for k, v in totals.items()}
            totals = {}
            for own, other, r, same_user in obs:
                if same_user:
                    totals.setdefault(other, []).append(r - suffers.get(own, 0.0))
            hurts = {k: sum(v) / (len(v) + self.shrinkage) for k, v in totals.items()}
        self.suffers, self.hurts = suffers, hurts
        return self

    def residuals(self, coruns: Iterable[tuple], profiles: Mapping[str, Mapping[str, Any]]
                  ) -> list[tuple[str, str, float, bool]]:
        """``(job, partner, log((ISD + eps) / (prior ISD + eps)), same_user)`` per measured
        side of ``coruns`` (as ``learn`` takes them) whose jobs both have a profile: what
        learning fits."""
        obs: list[tuple[str, str, float, bool]] = []
        for a, b, speed_a, speed_b, *rest in coruns:
            same_user = bool(rest[0]) if rest else True
            if a not in profiles or b not in profiles:
                continue
            da, db = demand_of(profiles[a]), demand_of(profiles[b])
            sides = [(a, b, da, db, speed_a)] + ([] if a == b else [(b, a, db, da, speed_b)])
            for own, other, d_own, d_other, speed in sides:
                speed = _number(speed)
                if speed is None:
                    continue
                isd = 1.0 / min(max(speed, MIN_SPEED), 1.0) - 1.0
                prior = prior_isd([d_own, d_other], self.latency)[0]
                obs.append((own, other, math.log((isd + EPS) / (prior + EPS)), same_user))
        return obs

    # -- prediction -----------------------------------------------------------------------
    def predict_isd(self, profiles: Sequence[Mapping[str, Any]],
                    keys: Sequence[str | None] | None = None) -> list[float]:
        """Each co-runner's predicted slowdown (ISD) in a group of two or more."""
        demands = [demand_of(p) for p in profiles]
        keys = list(keys) if keys is not None else [None] * len(profiles)
        suffers = [self.suffers.get(k, 0.0) for k in keys]
        hurts = [self.hurts.get(k, 0.0) for k in keys]
        return prior_isd(demands, self.latency, lambda i, j: suffers[i] + hurts[j])

    def predict_group(self, profiles: Sequence[Mapping[str, Any]],
                      keys: Sequence[str | None] | None = None) -> list[float]:
        """Each co-runner's predicted normalised speed (1.0: no slowdown)."""
        return [1.0 / (1.0 + d) for d in self.predict_isd(profiles, keys)]

    def safe_speeds(self, profiles: Sequence[Mapping[str, Any]],
                    keys: Sequence[str | None] | None = None) -> list[float]:
        """Pessimistic speeds (ISD times the calibrated margin), for recommending."""
        margin = self._margin(keys)
        return [1.0 / (1.0 + margin * d) for d in self.predict_isd(profiles, keys)]

    def _margin(self, keys: Sequence[str | None] | None) -> float:
        """The learned margin where every job of the group has corrections, else the cold one."""
        known = keys is not None and all(k in self.suffers or k in self.hurts for k in keys)
        return self.margin_learned if known else self.margin

    def copies_allowed(self, profile: Mapping[str, Any], key: str | None = None,
                       limit: int = 1_000) -> int:
        """How many copies of one job may share a GPU, at most ``limit``: each copy's
        pessimistic speed (``safe_speeds``) stays at the threshold or above. Read off in closed
        form, not by trying every group size: ``m`` copies collide ``m - 1`` times as much as
        one pair does, and saturate once ``m * occupancy`` exceeds the GPU (each gets ``1 /
        m``; corrections do not apply there). At least 1."""
        margin = self._margin([key])
        allowed_isd = (1.0 / self.threshold - 1.0) / margin
        own = demand_of(profile)
        factor = math.exp(self.suffers.get(key, 0.0) + self.hurts.get(key, 0.0))
        per_copy = corrected(collision_isd(own, [own], self.latency)[0], factor)
        copies = float(limit)
        if per_copy > 0:
            copies = min(copies, 1 + math.floor(allowed_isd / per_copy + 1e-9))
        busy = occupancy(own)
        if busy > 0:
            # m * busy - 1 (each copy's saturation) at most allowed_isd, solved for m.
            copies = min(copies, math.floor((1.0 + allowed_isd) / busy + 1e-9))
        return int(max(1, min(limit, copies)))

    def recommend(self, profiles: Sequence[Mapping[str, Any]],
                  keys: Sequence[str | None] | None = None) -> bool:
        """Whether the jobs may share one GPU: memory fits (or is unknown) and every side's
        pessimistic speed is at least the threshold."""
        if fits_memory(profiles) is False:
            return False
        return self.fast_enough(profiles, keys)

    def fast_enough(self, profiles: Sequence[Mapping[str, Any]],
                    keys: Sequence[str | None] | None = None) -> bool:
        """Whether every side's pessimistic speed (``safe_speeds``) is at least the threshold
        (memory aside: where Slurm accounts it, by shards)."""
        return bool(min(self.safe_speeds(profiles, keys)) >= self.threshold)

    def learned_from(self, runs: Mapping[tuple, "CoRun"],
                     profiles: Mapping[str, Mapping[str, Any]],
                     typed_runs: Mapping[tuple, "CoRun"] | None = None) -> "PairModel":
        """The same prior and margins with corrections learned from all of ``runs`` (co-runs
        keyed by ``(cluster, job_a, job_b, gpu)``, read by ``pair_speeds``); ``profiles`` maps
        the runs' keys to profiles. What the daemon and the simulator call at each re-learning.

        ``typed_runs`` are the same co-runs keyed by ``typed_key`` (each job on the GPU type
        it ran on; ``profiles`` holds its profile there under that key): their corrections are
        learned apart (the two sets of keys never meet) and judge pairs on that type."""
        model = self.fitted_copy().learn(pair_speeds(runs, profiles, self.latency), profiles)
        if typed_runs:
            typed = self.fitted_copy().learn(pair_speeds(typed_runs, profiles, self.latency),
                                             profiles)
            model.suffers.update(typed.suffers)
            model.hurts.update(typed.hurts)
        return model

    def with_margin_at_least(self, margin: float) -> "PairModel":
        """The same model (corrections shared, not copied) with both margins raised to at
        least ``margin``."""
        copy = PairModel(latency=self.latency, threshold=self.threshold,
                         margin=max(self.margin, margin),
                         margin_learned=max(self.margin_learned, margin),
                         shrinkage=self.shrinkage, n_train=self.n_train)
        copy.suffers, copy.hurts = self.suffers, self.hurts
        return copy

    def fitted_copy(self) -> "PairModel":
        """The same prior and margins, without corrections."""
        return PairModel(latency=self.latency, threshold=self.threshold, margin=self.margin,
                         margin_learned=self.margin_learned, shrinkage=self.shrinkage,
                         n_train=self.n_train)

    def predict_pairs(self, profiles: Sequence[Mapping[str, Any]],
                      keys: Sequence[str]) -> list[dict[str, Any]]:
        """One row per unordered pair of ``profiles`` including each job with itself, in input
        order: ``job_a, job_b, pred_speed_a, pred_speed_b, fits_memory, recommended``."""
        rows = []
        indices = list(range(len(profiles)))
        pairs = [(i, i) for i in indices] + list(combinations(indices, 2))
        for i, j in sorted(pairs):
            group, names = [profiles[i], profiles[j]], [keys[i], keys[j]]
            speed_a, speed_b = self.predict_group(group, names)
            fits = fits_memory(group)
            rows.append({"job_a": keys[i], "job_b": keys[j], "pred_speed_a": round(speed_a, 4),
                         "pred_speed_b": round(speed_b, 4), "fits_memory": fits,
                         "recommended": self.recommend(group, names)})
        return rows


# A side of a co-run is measured only where the partner overlapped at least this share of the
# job's run (the node agent reports the overlap; the daemon and the simulator learn alike).
MEASURED_OVERLAP = 0.8


def typed_key(key: str, gpu_type: str) -> str:
    """The key of a job's corrections on one GPU type. A job keeps a small GPU busier than a
    large one, so its profile differs per type, and what it suffers and inflicts there is
    learned against that profile: corrections learned against its profile averaged over types
    and applied to its profile on one type mislead. On the Philly trace (Gavel's measured
    pairs as truth; seeds 0-4, lever off, ``bench/sim_bounds.py --variants gpushare
    --priority none``) one correction per job gave -36.0% mean JCT against slurm-default and
    shared runs at a mean slowdown of 0.41; per type -39.2% and 0.28. Corrections per type
    falling back to the job's over all types where it has none there: -35.0%."""
    return f"{key}@{gpu_type}"


class CoRun(NamedTuple):
    """One co-run as learning reads it: both jobs' keys (whose corrections it teaches), each
    side's measured slowdown (ISD; None where not measured), how long they overlapped
    (seconds) and whether one user ran both (the simulator has no users: one)."""
    keys: tuple[str, str]
    isd: tuple[float | None, float | None]
    overlap_s: float | None
    same_user: bool = True


def pair_speeds(runs: Mapping[tuple, CoRun], profiles: Mapping[str, Mapping[str, Any]],
                latency: float) -> list[tuple[str, str, float | None, float | None, bool]]:
    """Co-runs as pair measurements ``(key_a, key_b, speed_a, speed_b, same_user)`` for
    ``PairModel.learn``.
    ``runs`` is keyed by ``(cluster, job_a, job_b, gpu)``: one run of two jobs on one GPU.

    A job's measured slowdown (ISD) is its whole run's, and it appears on every row of the
    co-run: with several partners on its GPU it was slowed by all of them, not by each.
    Taken as a pair's, it makes every pair look that bad (four light jobs and two larger
    ones, each at 0.56x, taught that two light jobs run at 0.56x together). So each side's
    ISD is split over its partners on that GPU the way the prior splits it (each partner's
    term, weighted by its overlap relative to the longest): the pair terms then add up to
    what was measured. (A side is measured only where the partner overlapped nearly its
    whole run, so the longest overlap is about the run's length.) A job with one partner
    is taken as measured."""
    sides: dict[tuple, list[tuple[tuple, int]]] = {}  # (cluster, job, GPU) -> its rows
    for ident in runs:
        cluster, job_a, job_b, gpu = ident
        sides.setdefault((cluster, job_a, gpu), []).append((ident, 0))
        sides.setdefault((cluster, job_b, gpu), []).append((ident, 1))
    speeds = {ident: [None, None] for ident in runs}
    for members in sides.values():
        rows = [(ident, side, runs[ident]) for ident, side in members]
        measured = [run.isd[side] for _, side, run in rows if run.isd[side] is not None]
        if not measured:
            continue
        isd = sum(float(v) for v in measured) / len(measured)
        _, side, run = rows[0]
        own = demand_of(profiles[run.keys[side]])
        longest = max((run.overlap_s or 0.0 for _, _, run in rows), default=0.0)
        terms = [collision_isd(own, [demand_of(profiles[run.keys[1 - side]])], latency)[0]
                 for _, side, run in rows]
        weights = [1.0 if not longest or run.overlap_s is None else run.overlap_s / longest
                   for _, _, run in rows]
        exposure = sum(w * t for w, t in zip(weights, terms))
        for (ident, side, run), term in zip(rows, terms):
            if run.isd[side] is None:
                continue  # this side was not measured against this partner
            pair_isd = isd if len(rows) == 1 or exposure <= 0 else isd * term / exposure
            speeds[ident][side] = 1.0 / (1.0 + max(pair_isd, -0.99))
    return [(*run.keys, *speeds[ident], run.same_user) for ident, run in runs.items()]


HISTORY_PER_JOB = 3


def history_split(pairs: Sequence[tuple], seed: int, per_job: int = HISTORY_PER_JOB
                  ) -> tuple[list[tuple], list[tuple]]:
    """``(history, rest)``: for each job, up to ``per_job`` of the pairs it is in (with others
    or itself) drawn as measured history; the other pairs are left to predict."""
    rng = np.random.default_rng(seed)
    jobs = sorted({j for a, b, *_ in pairs for j in (a, b)})
    chosen: set[int] = set()
    for job in jobs:
        mine = [i for i, (a, b, *_) in enumerate(pairs) if job in (a, b)]
        rest = [i for i in mine if i not in chosen]
        missing = max(0, per_job - (len(mine) - len(rest)))
        chosen.update(int(i) for i in rng.permutation(rest)[:missing]) if rest else None
    return ([p for i, p in enumerate(pairs) if i in chosen],
            [p for i, p in enumerate(pairs) if i not in chosen])


# -- training data ---------------------------------------------------------------------------
def training_sides() -> pd.DataFrame:
    """One row per measured side of every usable pair in the packaged data sets, with columns
    ``group`` (data set), ``pair``, ``job``, ``other``, ``own_sm``, ``own_mem``, ``other_sm``,
    ``other_mem``, ``speed``. Gavel: failed pairs ([0, 0]) and V100 pairs filled in with the
    alone throughput are dropped; a self-pair counts once."""
    import pandas as pd

    rows = []
    for name, pairs, profiles in data_sets():
        for k, (a, b, speed_a, speed_b) in enumerate(pairs):
            da, db = demand_of(profiles[a]), demand_of(profiles[b])
            sides = [(a, b, da, db, speed_a)] + ([] if a == b else [(b, a, db, da, speed_b)])
            for own, other, d_own, d_other, speed in sides:
                rows.append({"group": name, "pair": f"{name}:{k}", "job": own, "other": other,
                             "own_sm": d_own.sm, "own_mem": d_own.mem, "other_sm": d_other.sm,
                             "other_mem": d_other.mem, "speed": float(speed)})
    return pd.DataFrame(rows)


@lru_cache(maxsize=1)
def _data_sets() -> tuple:
    from slurm_gpushare.predict.datasets import MEASURED_GPUS, load_gavel_pairs, load_measured
    from slurm_gpushare.predict.knowledge import (GAVEL_MEM_MIB, alnair_pairs, gavel_profiles,
                                                  speed_of)

    out = []
    util = gavel_profiles().set_index(["gpu", "job"])["gpu_util_pct"]
    raw = load_gavel_pairs()
    usable = raw[~raw["infeasible_zero"] & ~raw["a_equals_alone"] & ~raw["b_equals_alone"]]
    for gpu, frame in usable.groupby("gpu"):
        profiles = {job: {"gpu_util_pct": float(util[(gpu, job)]),
                          "mem_total_mib": GAVEL_MEM_MIB[gpu]}
                    for job in set(frame["job_a"]) | set(frame["job_b"])}
        pairs = list(zip(frame["job_a"], frame["job_b"], frame["norm_a"], frame["norm_b"]))
        out.append((f"gavel-{gpu}", tuple(pairs), profiles))
    alnair = alnair_pairs()
    profiles, pairs = {}, []
    for r in alnair.itertuples(index=False):
        a, b = f"{r.task_a}/{r.bs_a}", f"{r.task_b}/{r.bs_b}"
        profiles[a] = {"gpu_util_max_pct": r.MGUP_a, "mem_util_max_pct": r.MGTSAMP_a,
                       "mem_total_mib": GAVEL_MEM_MIB["p100"]}
        profiles[b] = {"gpu_util_max_pct": r.MGUP_b, "mem_util_max_pct": r.MGTSAMP_b,
                       "mem_total_mib": GAVEL_MEM_MIB["p100"]}
        pairs.append((a, b, speed_of(r.isd_a), speed_of(r.isd_b)))
    out.append(("alnair-p100", tuple(pairs), profiles))
    for gpu in MEASURED_GPUS:
        pairs, profiles = load_measured(gpu)
        out.append((f"measured-{gpu}", tuple(pairs), profiles))
    return tuple(out)


def calibration_sets(names: Iterable[str]) -> list[str]:
    """The data sets among ``names`` whose telemetry is what the daemon reads (NVML means from
    the node agent's sampler: the project's own measurements). The margins are calibrated on
    these: they cover the prediction error the daemon will make, and Gavel's utilisation (a
    proxy derived from throughputs) and Ray et al.'s peaks have errors of their own."""
    return sorted(n for n in set(names) if n.startswith("measured-"))


def data_sets() -> list[tuple[str, list[tuple[str, str, float, float]], dict[str, dict]]]:
    """``(name, pairs, profiles)`` per packaged data set (the public ones, then the project's
    own measurements): pairs as ``(job_a, job_b, speed_a, speed_b)``, profiles by job name."""
    return [(name, list(pairs), {k: dict(v) for k, v in profiles.items()})
            for name, pairs, profiles in _data_sets()]




def pair_table(model: PairModel, profiles: Sequence[Mapping[str, Any]],
               coruns: Sequence[tuple[str, str, float | None, float | None]] = ()
               ) -> list[dict[str, Any]]:
    """What ``kb predict-pairs`` prints: ``model`` (left unchanged) with corrections learned
    from ``coruns``, one row per unordered pair of ``profiles`` (each with a ``job`` key)
    including self-pairs."""
    keys = [p["job"] for p in profiles]
    learned = model.fitted_copy()
    if coruns:
        learned.learn(coruns, dict(zip(keys, profiles)))
    return learned.predict_pairs(profiles, keys)


def default_model() -> PairModel:
    """The packaged prior (fitted on every packaged data set; read once per process), a fresh
    copy with no corrections each call."""
    coef, shrinkage, margin, margin_learned, sides = stored_pair_prior()
    return PairModel(latency=coef[0], margin=margin, margin_learned=margin_learned,
                     shrinkage=shrinkage, n_train=sides)
