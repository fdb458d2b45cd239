"""Engine and policies on small hand-checked traces: known answers and invariants."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from slurm_gpushare.core.hostlist import expand_hostlist
from slurm_gpushare.sim import policies
from slurm_gpushare.sim.cluster import parse_cluster
from slurm_gpushare.sim.engine import DONE, Engine, EngineOptions
from slurm_gpushare.sim.interference import ClassPairTable
from slurm_gpushare.sim.workload import Workload


def cluster(nodes=((1, 1, "v100"),), cap=2, types=("v100",)):
    """nodes: (count, gpus, type) groups, in Slurm order."""
    spec = {"name": "t", "partition": "gpu", "reference_gpu": types[0], "max_jobs_per_gpu": cap,
            "gpu_types": {t: {"memory_gib": 16 if t != "k80" else 12,
                              "speed_profile": t if t in ("k80", "p100", "v100") else "v100",
                              "memory_profile": "V100"} for t in types},
            "nodes": [{"prefix": f"{t}-{i}-", "count": c, "gpus": g, "type": t, "weight": i}
                      for i, (c, g, t) in enumerate(nodes)]}
    return parse_cluster(spec)


def work(cl, jobs):
    """jobs: dicts with submit, solo (s), and optionally gpus, mem (GiB real), pred (GiB
    predicted), cls, kind."""
    T = len(cl.types)
    n = len(jobs)
    get = lambda k, d: np.array([j.get(k, d) for j in jobs])  # noqa: E731
    solo = np.repeat(get("solo", 100.0).astype(float)[:, None], T, axis=1)
    mem = np.repeat((get("mem", 4.0) * 1024.0)[:, None], T, axis=1)
    pred = np.repeat((get("pred", np.nan) * 1024.0)[:, None], T, axis=1)
    pred = np.where(np.isnan(pred), mem, pred)
    cap = np.array([t.memory_gib * 1024 for t in cl.types])
    return Workload(
        name="t", type_names=cl.type_names, job_id=[str(i) for i in range(n)],
        submit=get("submit", 0.0).astype(float), n_gpus=get("gpus", 1), n_nodes=np.zeros(n, int),
        solo=solo, runtime_pred=solo.copy(), allowed=mem <= cap, mem_true=mem, mem_pred=pred,
        mem_safe=pred * 1.1, kind=get("kind", 0), job_class=get("cls", 0),
        gpu_request=get("gpus", 1).astype(float))


class Constant:
    """Every co-runner runs at ``speed`` per co-runner (product rule)."""

    name = "constant"

    def __init__(self, speed=0.5, fail=()):
        self.speed, self.fail = speed, set(fail)

    def speeds(self, profile, kinds, classes):
        if len(kinds) > 1 and any(k in self.fail for k in kinds):
            return None
        return [self.speed ** (len(kinds) - 1)] * len(kinds)


def table(speed=0.6, bad=None):
    """Class-pair knowledge: every pair at ``speed``; pairs in ``bad`` at 0.3."""
    s = np.full((3, 3, 3), speed)
    for a, b in bad or ():
        s[:, a, b] = s[:, b, a] = 0.3
    return ClassPairTable(s, "test")


def run(cl, jobs, policy, model=None, **opts):
    w = work(cl, jobs)
    p = policies.make_policy(policy, table()) if isinstance(policy, str) else policy
    e = Engine(cl, w, p, model or Constant(), options=EngineOptions(**opts))
    return e, e.run()


def jct(result):
    return list(result.jobs["end"] - result.jobs["submit"])


# --- known answers --------------------------------------------------------------------------

def test_single_job_runs_its_solo_time():
    _, r = run(cluster(), [{"solo": 100}], "slurm-default")
    assert jct(r) == [100]
    assert r.jobs["state"][0] == DONE


def test_fcfs_whole_gpus_queue_in_order():
    _, r = run(cluster(), [{"submit": 0, "solo": 100}, {"submit": 1, "solo": 50}], "slurm-default")
    assert list(r.jobs["start"]) == [0, 100]
    assert list(r.jobs["end"]) == [100, 150]


def test_easy_backfill_starts_short_job_without_delaying_the_reserved_one():
    cl = cluster(((1, 2, "v100"),))
    jobs = [{"submit": 0, "solo": 1000},           # A: 1 GPU until 1000
            {"submit": 1, "solo": 100, "gpus": 2},  # B: blocked, reserved at 1000
            {"submit": 2, "solo": 100},             # C: ends at 102 < 1000: backfilled
            {"submit": 3, "solo": 5000}]            # D: would delay B: waits
    _, r = run(cl, jobs, "slurm-default")
    assert list(r.jobs["start"]) == [0, 1000, 2, 1100]


def test_sharing_slows_both_and_replans_when_one_leaves():
    # Both at speed 0.5: A (100 s of work) ends at 200; B has done 100 of 300 by then and
    # runs the remaining 200 alone: ends at 400.
    _, r = run(cluster(), [{"solo": 100}, {"solo": 300}], "first-fit-share")
    assert list(r.jobs["end"]) == pytest.approx([200, 400])
    assert r.jobs["shared"].all()


def test_third_co_runner_compounds_slowdowns():
    # cap 3, speed 0.5 per co-runner: three jobs at 0.25 each.
    cl = cluster(cap=3)
    _, r = run(cl, [{"solo": 100}] * 3, "first-fit-share")
    assert list(r.jobs["end"]) == pytest.approx([400, 400, 400])


def test_oom_kills_the_newcomer_and_requeues_it_on_a_whole_gpu():
    # Predicted 6 GiB each (fits twice), real 10 GiB each: the second overflows the 16 GiB GPU.
    jobs = [{"solo": 1000, "mem": 10, "pred": 6}, {"submit": 1, "solo": 100, "mem": 10, "pred": 6}]
    e, r = run(cluster(), jobs, "first-fit-share", oom_delay=60)
    assert r.counters["oom_kills"] == 1
    assert list(r.jobs["oom_kills"]) == [0, 1]
    assert list(r.jobs["state"]) == [DONE, DONE]
    # killed at 61; A runs at 0.5 for 60 s (30 s of work), then alone: ends at 1030; B waits.
    assert r.jobs["end"][0] == pytest.approx(1030)
    assert r.jobs["start"][1] == pytest.approx(1030)
    assert r.jobs["end"][1] == pytest.approx(1130)


def test_safe_estimate_avoids_the_oom():
    jobs = [{"solo": 1000, "mem": 10, "pred": 10}, {"submit": 1, "solo": 100, "mem": 10, "pred": 10}]
    for policy in ("random-pack", "schedtune", "class-pair", "sjf-bsbf", "gpushare"):
        _, r = run(cluster(), jobs, policy)
        assert r.counters["oom_kills"] == 0, policy
        assert not r.jobs["shared"].any(), policy


def test_failed_pair_is_counted_apart_from_oom():
    jobs = [{"solo": 1000, "kind": 1}, {"submit": 1, "solo": 100, "kind": 2}]
    _, r = run(cluster(), jobs, "first-fit-share", model=Constant(fail={2}))
    assert r.counters["pair_failures"] == 1
    assert r.counters["oom_kills"] == 0
    assert (r.jobs["state"] == DONE).all()


def test_sjf_orders_by_predicted_run_time():
    jobs = [{"submit": 0, "solo": 10, "mem": 15}, {"submit": 1, "solo": 500, "mem": 15},
            {"submit": 2, "solo": 50, "mem": 15}]
    _, r = run(cluster(cap=1), jobs, "sjf-bsbf")
    assert list(r.jobs["start"]) == [0, 60, 10]


def test_class_pair_keeps_incompatible_classes_apart():
    pol = policies.ClassPair(table(bad=[(0, 1)]))
    jobs = [{"solo": 100, "cls": 0}, {"submit": 1, "solo": 100, "cls": 1},
            {"submit": 2, "solo": 100, "cls": 0}]
    _, r = run(cluster(((2, 1, "v100"),)), jobs, pol)
    gpus = r.jobs["start"]
    assert list(gpus) == [0, 1, 2]
    # job 2 (class 0) packs next to job 0, not next to the class-1 job
    assert r.jobs["max_corunners"][0] == 2 and r.jobs["max_corunners"][1] == 1


def test_schedtune_threshold_caps_co_location_below_the_cluster_cap():
    _, r = run(cluster(cap=4), [{"solo": 100, "mem": 2}] * 3, "schedtune")
    assert r.jobs["max_corunners"].max() == 2
    assert sorted(r.jobs["start"]) == [0, 0, 200]


def test_sjf_bsbf_prefers_an_empty_gpu():
    _, r = run(cluster(((2, 1, "v100"),)), [{"solo": 100}, {"solo": 100}], "sjf-bsbf")
    assert not r.jobs["shared"].any()
    assert list(r.jobs["end"]) == [100, 100]


def test_random_pack_is_reproducible_by_seed():
    cl = cluster(((4, 2, "v100"),), cap=2)
    jobs = [{"submit": i, "solo": 50 + 7 * i, "mem": 3} for i in range(20)]
    a = run(cl, jobs, policies.RandomPack(3))[1]
    b = run(cl, jobs, policies.RandomPack(3))[1]
    assert list(a.jobs["end"]) == list(b.jobs["end"])


def test_multi_gpu_jobs_take_whole_gpus_across_nodes():
    cl = cluster(((2, 2, "v100"),), cap=4)
    _, r = run(cl, [{"solo": 100, "gpus": 4}, {"submit": 1, "solo": 10}], "first-fit-share")
    assert list(r.jobs["start"]) == [0, 100]
    assert not r.jobs["shared"][0]


def test_job_too_big_for_the_cluster_is_rejected():
    _, r = run(cluster(), [{"solo": 10, "gpus": 2}, {"solo": 10}], "slurm-default")
    assert list(r.jobs["state"]) == ["rejected", DONE]


# --- gpushare goes through the daemon's decide() ---------------------------------------------

def test_gpushare_calls_decide_with_the_safe_estimate(monkeypatch):
    calls = []
    real = policies.daemon_policy.decide

    def spy(request, config, **kw):
        calls.append((request, kw["estimate"]))
        return real(request, config, **kw)

    monkeypatch.setattr(policies.daemon_policy, "decide", spy)
    jobs = [{"solo": 100, "mem": 4, "pred": 5}, {"submit": 1, "solo": 100, "gpus": 2}]
    _, r = run(cluster(((1, 2, "v100"),)), jobs, "gpushare")
    assert [c[0].tres_per_node for c in calls] == ["gres:gpu:1", "gres:gpu:2"]
    assert calls[0][0].partition == "gpu"
    assert calls[0][1].memory_mib["v100"] == pytest.approx(5 * 1024 * 1.1)
    # A GPU is idle at the first submission: shares only under pressure, so it runs whole.
    assert r.codes == {"idle-gpu": 1, "multi-gpu": 1}


def test_gpushare_shares_where_decide_says_and_keeps_otherwise():
    jobs = [{"solo": 100, "mem": 4}, {"submit": 1, "solo": 100, "mem": 4},
            {"submit": 2, "solo": 100, "mem": 15}]
    always = policies.GpuShare(table(), keep_whole_when_idle=False)
    _, r = run(cluster(((1, 1, "v100"),), cap=4), jobs, always)
    assert list(r.jobs["start"]) == [0, 1, 200]   # two shares co-run; the big job keeps a GPU
    assert list(r.jobs["shared"]) == [True, True, False]


def test_gpushare_shares_only_under_pressure():
    # Two GPUs: the first two jobs find an idle GPU and run whole; the third becomes a share
    # (no GPU idle) and starts on the first GPU that has room for it.
    jobs = [{"solo": 100, "mem": 4}, {"submit": 1, "solo": 100, "mem": 4},
            {"submit": 2, "solo": 100, "mem": 4}, {"submit": 3, "solo": 100, "mem": 4}]
    _, r = run(cluster(((1, 2, "v100"),), cap=4), jobs, "gpushare")
    assert r.codes == {"idle-gpu": 2, "history-share": 2}
    assert list(r.jobs["start"]) == [0, 1, 100, 100]
    assert list(r.jobs["shared"]) == [False, False, True, True]


def test_gpushare_sjf_orders_by_nice_with_age():
    # One GPU busy until 100; then a 10 h job (submitted first) and a 6 min job wait: the lever
    # starts the short one first; without it, first come first served.
    jobs = [{"solo": 100, "mem": 15}, {"submit": 1, "solo": 36000, "mem": 15},
            {"submit": 2, "solo": 360, "mem": 15}]
    _, r = run(cluster(((1, 1, "v100"),)), jobs, "gpushare-sjf")
    assert list(r.jobs["start"]) == [0, 460, 100]
    _, r = run(cluster(((1, 1, "v100"),)), jobs, "gpushare")
    assert list(r.jobs["start"]) == [0, 100, 36100]


def test_gpushare_judges_a_job_with_a_profile_by_the_pair_predictor():
    # As the daemon judges a job with a telemetry profile (here: its kind's utilisation on the
    # GPU): CycleGAN (busy) should not join ResNet-18 at batch 64 (35% busy) on v100-0-0, so it
    # lands on v100-0-1, where Slurm's packing alone would have put it next to it; A3C (14%)
    # may, and does.
    jobs = [{"solo": 100, "kind": 0}, {"submit": 1, "solo": 100, "kind": 1},
            {"submit": 2, "solo": 100, "kind": 2}]
    cl = cluster(((2, 1, "v100"),), cap=3)
    w = work(cl, jobs)
    w.kinds = ("ResNet-18 (batch size 64)", "CycleGAN", "A3C")
    judged = policies.GpuShare(table(), keep_whole_when_idle=False)
    e = Engine(cl, w, judged, Constant(1.0))
    r = e.run()
    assert [e.j_gpus[j] for j in range(3)] == [[0], [1], [0]]
    assert list(r.jobs["start"]) == [0, 1, 2] and r.counters["waiting_started_kept_off"] == 1
    # Kinds without a profile are judged by their class (all compatible here): packed.
    w.kinds = ()
    e = Engine(cl, w, policies.GpuShare(table(), keep_whole_when_idle=False), Constant(1.0))
    e.run()
    assert [e.j_gpus[j] for j in range(3)] == [[0], [0], [0]]


def test_a_share_is_never_kept_off_every_node_it_could_use():
    # One node only: CycleGAN should not join ResNet-18 there, but kept off it, it could run
    # nowhere (the daemon never excludes every node either): it joins at once.
    cl = cluster(((1, 1, "v100"),), cap=3)
    w = work(cl, [{"solo": 100, "kind": 0}, {"submit": 1, "solo": 100, "kind": 1}])
    w.kinds = ("ResNet-18 (batch size 64)", "CycleGAN")
    r = Engine(cl, w, policies.GpuShare(table(), keep_whole_when_idle=False),
               Constant(1.0)).run()
    assert list(r.jobs["start"]) == [0, 1]


def test_hostlist_expansion():
    assert expand_hostlist("n[1-3,05],gpu7") == ["n1", "n2", "n3", "n05", "gpu7"]


# --- invariants -------------------------------------------------------------------------------

class Checked(Engine):
    """Asserts the invariants after every start and at every event."""

    def start(self, j, gpus):
        super().start(j, gpus)
        assert (self.g_used <= self.g_cap).all()
        # the empty-GPU counts kept per type match a recount
        assert self.n_free_list == self.n_free.tolist()
        assert self.free_counts == [[int(((self.n_type == t) & (self.n_free >= n)).sum())
                                     for n in range(len(counts))]
                                    for t, counts in enumerate(self.free_counts)]
        for g in gpus:
            real = sum(self.work.mem_true[i, self.g_type[g]] for i in self.g_jobs[g])
            if real > self.g_cap[g] * 1024:
                assert self.j_pending_kill[j] is not None  # an overflow is always recorded
            assert len(self.g_jobs[g]) <= self.cap

    def schedule(self, only=None):
        assert self.now >= getattr(self, "_last_now", -math.inf)
        self._last_now = self.now
        # the kept heads are every bucket's head, sorted
        assert self.heads == sorted((b[0][0], s, 0) for s, b in self.buckets.items() if b)
        super().schedule(only)

    def _queue(self, j, req):
        super()._queue(j, req)
        # every queued job once, in the bucket of its request's shape, in policy order
        assert sum(len(b) for b in self.buckets.values()) == self.queued
        assert self.heads == sorted((b[0][0], s, 0) for s, b in self.buckets.items() if b)
        for shape, bucket in self.buckets.items():
            assert bucket == sorted(bucket)
            for key, i in bucket:
                r = self.j_req[i]
                assert shape == (self.policy.memo_key(i, r), tuple(r.shards.tolist())
                                 if not r.whole else None)
                assert (key, i) == (self.policy.key(i, self), i)

    def landing_gpus(self, req, exclude=None):
        got = list(super().landing_gpus(req, exclude))
        # each node's first GPU of the full list
        every = super().share_candidates(req, exclude)
        assert got == [g for i, g in enumerate(every)
                       if i == 0 or self.g_node[g] != self.g_node[every[i - 1]]]
        return iter(got)

    def landing_gpu(self, req, node):
        got = super().landing_gpu(req, node)
        on_node = [g for g in super().share_candidates(req) if self.g_node[g] == node]
        assert got == (on_node[0] if on_node else None)
        return got

    def share_candidates(self, req, exclude=None, *, cap=None, rooms=None, first=False):
        got = super().share_candidates(req, exclude, cap=cap, rooms=rooms, first=first)
        # against every GPU, from the arrays: the GPUs the share fits now outside the exclusions
        need = req.shards[self.g_type]
        ok = (req.types[self.g_type] & ~self.g_whole & (self.g_njobs < (cap or self.cap))
              & (self.g_used + need <= self.g_cap))
        for node in req.exclude | (exclude or frozenset()):
            ok[self.g_node == node] = False
        fits = np.flatnonzero(ok).tolist()
        assert self.g_free == [int(c - u) if not w and n < self.cap else 0 for c, u, w, n
                               in zip(self.g_cap, self.g_used, self.g_whole, self.g_njobs)]
        if rooms is None:
            assert got == (fits[:1] if first else fits)
        else:  # a class's room: every fitting GPU the class may join is looked at
            c = next(c for c, r in enumerate(self.class_node_room) if r is rooms)
            joinable = [g for g in fits if self.policy.joinable(self, g)[c]]
            assert set(joinable) <= set(got) <= set(fits)
        return got


@pytest.mark.parametrize("policy", policies.POLICY_NAMES)
def test_invariants_on_a_random_small_trace(policy):
    rng = np.random.default_rng(7)
    cl = cluster(((2, 2, "v100"), (2, 2, "k80")), cap=3, types=("v100", "k80"))
    jobs = [{"submit": float(rng.integers(0, 2000)), "solo": float(rng.integers(10, 800)),
             "gpus": int(rng.choice([1, 1, 1, 2, 4])), "mem": float(rng.uniform(1, 11)),
             "pred": float(rng.uniform(1, 11)), "cls": int(rng.integers(0, 3)),
             "kind": int(rng.integers(0, 4))} for _ in range(120)]
    jobs.sort(key=lambda j: j["submit"])
    w = work(cl, jobs)
    e = Checked(cl, w, policies.make_policy(policy, table(bad=[(0, 2)]), 1),
                Constant(0.6, fail={3}))
    r = e.run()
    states = set(r.jobs["state"])
    assert states <= {DONE, "killed", "rejected"}
    done = r.jobs["state"] == DONE
    assert (r.jobs["end"][done] >= r.jobs["start"][done]).all()
    assert (r.jobs["first_start"][done] >= r.jobs["submit"][done]).all()
    # a job never runs faster than alone
    assert ((r.jobs["end"] - r.jobs["start"])[done] >= r.jobs["solo"][done] - 1e-6).all()
    assert np.all(np.diff(r.timeline["time"]) >= 0)
    assert e.free_whole == e.G and not e.g_used.any()
    if policy == "slurm-default":
        assert not r.jobs["shared"].any()
    if policy == "gpushare":  # shares were kept off nodes of partners they should not join
        assert r.counters["waiting_started_kept_off"] > 0


def test_gpushare_places_openb_pods_on_every_type_they_fit():
    # openb reads gpu_milli as the fraction of whichever GPU a pod lands on: a pod that fills a
    # GPU needs 16 GiB on a T4 and 32 GiB on a V100M32. Such a pod used to be offered a 32 GiB
    # share on the V100M32 alone (and was dropped once it was taken), and a half pod 16 GiB on
    # both types.
    spec = {"name": "t", "partition": "gpu", "reference_gpu": "t4", "max_jobs_per_gpu": 8,
            "gpu_types": {"t4": {"memory_gib": 16, "speed_profile": "p100", "memory_profile": "V100"},
                          "v100m32": {"memory_gib": 32, "speed_profile": "v100",
                                      "memory_profile": "V100"}},
            "nodes": [{"prefix": "t4-", "count": 1, "gpus": 2, "type": "t4"},
                      {"prefix": "v32-", "count": 1, "gpus": 1, "type": "v100m32"}]}
    cl = parse_cluster(spec)
    fraction = np.array([1.0, 0.5, 0.5, 1.0, 1.0])
    w = work(cl, [{"submit": i, "solo": 1e9} for i in range(len(fraction))])
    w.mem_true = w.mem_pred = w.mem_safe = fraction[:, None] * np.array([16, 32]) * 1024.0
    w.allowed = np.ones_like(w.allowed)
    w.gpu_request, w.until = fraction, 10.0
    p = policies.GpuShare(table(), keep_whole_when_idle=False)
    r = Engine(cl, w, p, Constant(1.0), options=EngineOptions(drop_unplaced=True)).run()
    # The whole pods run whole, the halves share the second T4 (8 GiB each), the third whole
    # pod takes the V100M32; only the last pod finds no GPU. A half pod asks for its share
    # itself: the hook keeps it as submitted ("already-shared"), at any setting.
    assert r.codes == {"whole-share": 3, "already-shared": 2}
    assert list(r.jobs["state"]) == ["cutoff"] * 4 + ["dropped"]
    assert list(r.jobs["gpu_type"]) == ["t4", "t4", "t4", "v100m32", ""]
    # At the defaults (a whole GPU while one is idle) the halves still get their shares: a
    # whole GPU is what the product gives a job that asked for one, not one that asked for half.
    default = Engine(cl, w, policies.GpuShare(table()), Constant(1.0),
                     options=EngineOptions(drop_unplaced=True)).run()
    assert default.codes == r.codes and list(default.jobs["gpu_type"]) == list(r.jobs["gpu_type"])


def test_shares_round_up_to_the_sites_shard_size():
    # Three jobs of 4.7 GiB (safe estimate 5.17 GiB) on one 16 GiB GPU: in 1 GiB shards each
    # takes 6 (18 > 16: the third waits); in 256 MiB shards 21 (63 of 64: all three start).
    jobs = [{"submit": i, "solo": 100, "mem": 4.7} for i in range(3)]
    for unit, starts in ((1024, [0, 1, 100]), (256, [0, 1, 2])):
        always = policies.GpuShare(table(), keep_whole_when_idle=False)
        _, r = run(cluster(((1, 1, "v100"),), cap=4), jobs, always, Constant(1.0),
                   share_unit_mib=unit)
        assert list(r.jobs["start"]) == starts, unit
        assert r.counters["oom_kills"] == 0


def test_gpushare_lifts_an_exclusion_once_the_share_that_caused_it_ends():
    # As the daemon does for jobs in Slurm's queue (core/waiting.py): job 2 (class 2) is kept
    # off v100-0-0, whose GPU holds job 0 (class 0, which it should not join), while v100-1-0
    # is held whole by job 1 until 1001. When job 0 ends at 100, the exclusion is lifted and
    # job 2 starts there; left as decided, it would wait for job 1's GPU.
    jobs = [{"solo": 100, "mem": 4, "cls": 0}, {"submit": 1, "solo": 1000, "mem": 15, "cls": 1},
            {"submit": 2, "solo": 100, "mem": 4, "cls": 2}]
    cl = cluster(((1, 1, "v100"), (1, 1, "v100")), cap=2)
    follows = policies.GpuShare(table(bad=[(0, 2)]), keep_whole_when_idle=False)
    e, r = run(cl, jobs, follows)
    assert list(r.jobs["start"]) == [0, 1, 100] and e.j_gpus[2] == [0]


def test_gpushare_keeps_an_exclusion_while_a_partner_it_should_not_join_is_there():
    # Job 0 ends at 197, but job 3 (class 0 as well) joined it at 3: job 2 stays off v100-0-0
    # until job 3 ends too (600), still before job 1's GPU frees (1001).
    jobs = [{"solo": 100, "mem": 4, "cls": 0}, {"submit": 1, "solo": 1000, "mem": 15, "cls": 1},
            {"submit": 2, "solo": 100, "mem": 4, "cls": 2},
            {"submit": 3, "solo": 500, "mem": 4, "cls": 0}]
    cl = cluster(((1, 1, "v100"), (1, 1, "v100")), cap=2)
    _, r = run(cl, jobs, policies.GpuShare(table(bad=[(0, 2)]), keep_whole_when_idle=False))
    assert list(r.jobs["start"]) == [0, 1, 600, 3]
    assert list(r.jobs["end"])[:1] == [197]


def test_a_policy_that_learns_hears_each_runs_partners_overlap_and_length():
    # Job 1 joins job 0 at t=10, both at 0.5x: job 1 needs 40 s for 20 s of work (ends at 50);
    # job 0 did 10 + 20 s of work by then, 70 s alone after (ends at 120). Each end reports
    # its partners and overlap as the node agent would; a killed run reports nothing.
    heard = []

    class Listening(policies.FirstFitShare):
        learns_coruns = True

        def run_ended(self, j, engine, overlap, duration_s, solo_s):
            heard.append((j, dict(overlap), duration_s, solo_s))

    cl = cluster(cap=2)
    run(cl, [{"solo": 100}, {"submit": 10, "solo": 20}], Listening(), Constant(0.5))
    assert heard == [(1, {0: 40.0}, 40.0, 20.0), (0, {1: 40.0}, 120.0, 100.0)]
    heard.clear()
    run(cl, [{"solo": 100}, {"submit": 10, "solo": 20}], policies.FirstFitShare(), Constant(0.5))
    assert heard == []  # (a policy that does not learn is told nothing)


def test_gpushare_learns_from_the_coruns_it_measures(monkeypatch):
    # Cold, A3C (14% busy) may join ResNet-18 at batch 64 (35%), and does; measured there at
    # 0.3x, it teaches the pair predictor, and the next A3C is kept off ResNet-18's GPU.
    # Without learning, the next one joins again.
    monkeypatch.setattr(policies.SimPairs, "FIRST_LEARN", 1)
    jobs = [{"solo": 1000, "kind": 0}, {"submit": 1, "solo": 10, "kind": 1},
            {"submit": 100, "solo": 10, "kind": 1}]
    cl = cluster(((2, 1, "v100"),), cap=3)
    w = work(cl, jobs)
    w.kinds = ("ResNet-18 (batch size 64)", "A3C")
    placed = {}
    for learn in (True, False):
        policy = policies.GpuShare(table(), keep_whole_when_idle=False, learn_coruns=learn)
        e = Engine(cl, w, policy, Constant(0.3))
        r = e.run()
        placed[learn] = [e.j_gpus[j] for j in range(3)]
        assert r.counters["coruns_measured"] == (1 if learn else 0)
        assert r.counters["pairs_relearned"] == (1 if learn else 0)
        json.dumps(r.counters)  # recorded as JSON by the benchmarks: plain numbers
    assert placed == {True: [[0], [0], [1]], False: [[0], [0], [0]]}


def random_kinds_trace(seed: int, n: int):
    """A random trace of ``n`` jobs of four Gavel kinds (pair judges) on V100 and K80 nodes."""
    rng = np.random.default_rng(seed)
    cl = cluster(((3, 2, "v100"), (3, 2, "k80")), cap=3, types=("v100", "k80"))
    jobs = sorted(({"submit": float(rng.integers(0, 3000)), "solo": float(rng.integers(50, 900)),
                    "mem": float(rng.uniform(1, 6)), "cls": int(rng.integers(0, 3)),
                    "kind": int(rng.integers(0, 4))} for _ in range(n)),
                  key=lambda j: j["submit"])
    w = work(cl, jobs)
    w.kinds = ("CycleGAN", "A3C", "ResNet-18 (batch size 64)", "LM (batch size 80)")
    return cl, w


def test_gpushare_reads_the_landing_gpu_as_blocked_now_does():
    # place() judges a node by its landing GPU's shares read off the engine's arrays (no node
    # view per node): on a random trace with pair judges and learning, every verdict equals
    # waiting.blocked_now on the node's view.
    from slurm_gpushare.core.waiting import blocked_now, judge_caches
    verdicts = []

    class Both(policies.GpuShare):
        def _blocked(self, entry, engine, g, pairwise):
            fast = super()._blocked(entry, engine, g, pairwise)
            self.view.nodes()
            slow = blocked_now(entry, self._node_now(engine, engine.g_node_list[g]),
                               judge_caches(entry, self._caches, fixed_view=False))
            verdicts.append((pairwise, fast == slow, fast))
            return fast

    cl, w = random_kinds_trace(3, 200)
    policy = Both(table(), keep_whole_when_idle=False, priority="sjf")
    Engine(cl, w, policy, Constant(0.6)).run()
    judged = [v for v in verdicts if v[0]]
    assert judged and all(same for _, same, _ in verdicts)
    assert {blocked for *_, blocked in judged} == {True, False}  # both answers were given


def test_gpushare_learns_corrections_on_the_gpu_type_of_the_co_run(monkeypatch):
    # The co-run on a V100 teaches A3C's and ResNet-18's corrections there (against their V100
    # profiles), not on the K80s, where they never met.
    from slurm_gpushare.predict.pairs import typed_key

    monkeypatch.setattr(policies.SimPairs, "FIRST_LEARN", 1)
    jobs = [{"solo": 1000, "kind": 0}, {"submit": 1, "solo": 10, "kind": 1}]
    cl = cluster(((1, 1, "v100"), (1, 1, "k80")), cap=3, types=("v100", "k80"))
    w = work(cl, jobs)
    w.kinds = ("ResNet-18 (batch size 64)", "A3C")
    policy = policies.GpuShare(table(), keep_whole_when_idle=False)
    e = Engine(cl, w, policy, Constant(0.3))
    e.run()
    assert e.j_gpus[0] == e.j_gpus[1] == [0]  # shared the V100
    model = policy.pairs.model
    assert model.suffers[typed_key("A3C", "v100")] > 0
    assert typed_key("A3C", "k80") not in model.suffers
    v100, k80 = (policy.pairs.profiles[policies.SPEED_PROFILES.index(t)] for t in ("v100", "k80"))
    judge = policy.pairs.for_job(1)
    assert judge.compatible_with(0, "v100") is False
    assert judge.compatible_with(0, "k80") == policy.pairs.model.fitted_copy().fast_enough(
        [k80[1], k80[0]])  # the prior's verdict there


@pytest.mark.parametrize("priority", ["none", "sjf"])
def test_remembered_verdicts_place_shares_as_asking_each_time_does(priority):
    # GpuShare.place remembers a judge's verdict on a GPU holding one share by type and kind,
    # and what a waiting share saw at its last look (only nodes changed since are looked at
    # again); asking every time on every node (remember_verdicts off) must start every job at
    # the same time on the same GPUs, learning and backfill reservations included.
    n = 300
    cl, w = random_kinds_trace(5, n)
    asked = []

    class Counting(policies.GpuShare):
        def _blocked(self, entry, engine, g, pairwise):
            asked[-1] += 1
            return super()._blocked(entry, engine, g, pairwise)

    placed = []
    for remember in (True, False):
        policy = Counting(table(), keep_whole_when_idle=False, priority=priority)
        policy.remember_verdicts = remember
        asked.append(0)
        # (remembering, with the engine's invariants checked: landing GPUs among them)
        e = (Checked if remember else Engine)(cl, w, policy, Constant(0.6))
        r = e.run()
        placed.append((list(r.jobs["start"]), [e.j_gpus[j] for j in range(n)]))
    assert placed[0] == placed[1]
    assert sum(len(g) > 0 for g in placed[0][1]) == n
    assert 0 < asked[0] < asked[1]  # verdicts were remembered, and judgements made
