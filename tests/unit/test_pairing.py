"""The pair predictor in the daemon: profiles from the store, node exclusion, learning."""

from __future__ import annotations

import time
import pytest

from slurm_gpushare.core.config import Config, GpuType, PolicyConfig
from slurm_gpushare.core.policy import JobEstimate, NodeView, decide
from slurm_gpushare.core.types import JobRequest
from slurm_gpushare.daemon.pairing import Pairing, profile_of_history
from slurm_gpushare.daemon.store import Store

LIGHT, HEAVY, OTHER_LIGHT = "a" * 64, "b" * 64, "c" * 64


def summary(job_id, key, util_mean, mem_mean, **extra):
    return {"v": 1, "cluster": "c1", "job_id": job_id, "gpu_index": 0, "gpu_model": "Tesla V100",
            "mem_total_mib": 16384.0, "duration_s": 60.0,
            "end_ts": time.time() - 3600 + float(job_id),  # recent: kept by retention
            "mgup_max": min(100.0, 2 * util_mean), "mgup_mean": util_mean,
            "mgmap_max_mib": 2000.0, "mgmap_max_pct": 12.2, "mgtsamp_max": 2 * mem_mean,
            "mgtsamp_mean": mem_mean, "shared": False, "coruns": [], "conditions": [],
            "keys": [key]} | extra


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "s.db") as s:
        s.ingest_summary(summary("10", LIGHT, 35.0, 8.0))
        s.ingest_summary(summary("11", HEAVY, 95.0, 60.0))
        s.ingest_summary(summary("12", OTHER_LIGHT, 6.0, 3.0))
        for decision_id, key in (("dheavy", HEAVY), ("dlight", OTHER_LIGHT)):
            s.record_decision({"decision_id": decision_id, "action": "share", "code": "x",
                               "keys": [key]})
        yield s


class View:
    def __init__(self, *nodes):
        self._nodes = nodes

    def nodes(self):
        return self._nodes


def test_profile_from_history_uses_means_of_the_most_specific_key():
    history = [{"mgup_mean": 40.0, "mgup_max": 90.0, "mgtsamp_mean": 10.0, "mgtsamp_max": 30.0,
                "mgmap_max_mib": 3000.0, "mem_total_mib": 16384.0, "matched_key": 0},
               {"mgup_mean": 60.0, "mgup_max": 95.0, "mgtsamp_mean": 20.0, "mgtsamp_max": 20.0,
                "mgmap_max_mib": 5000.0, "mem_total_mib": 16384.0, "matched_key": 0},
               {"mgup_mean": 99.0, "matched_key": 1}]
    profile, rank = profile_of_history(history)
    assert rank == 0
    assert profile["gpu_util_pct"] == 50.0 and profile["mem_util_pct"] == 15.0
    assert profile["gpu_util_max_pct"] == 95.0 and profile["mem_used_mib"] == 5000.0
    assert profile_of_history([{"mgmap_max_mib": 1.0}]) == (None, -1)


def test_a_light_job_is_kept_away_from_a_heavy_share_only(store):
    pairing = Pairing(store).load()
    compat = pairing.compatibility([LIGHT])
    assert compat is not None and compat.key == LIGHT
    assert compat.compatible_with("dheavy") is False
    assert compat.compatible_with("dlight") is True
    assert compat.compatible_with("unknown-decision") is True  # nothing known against it
    assert pairing.compatibility(["f" * 64]) is None  # no profile: no pair judgement


def test_a_job_is_judged_with_all_the_shares_of_a_gpu_together(store):
    pairing = Pairing(store).load()
    # A decision's keys are known before its record is written (a burst's next decision).
    pairing.remember("dpending", [HEAVY])
    assert pairing.resident("dpending")[1] == HEAVY
    compat = pairing.compatibility([LIGHT])
    assert compat.compatible_with_group([]) is True
    assert compat.compatible_with_group(["dlight"]) is True
    assert compat.compatible_with_group(["dlight", "dpending"]) is False  # the heavy one
    assert compat.compatible_with_group(["unknown-decision"]) is True
    # Monotone: more partners never make a group acceptable that one of them spoils.
    light = pairing.compatibility([LIGHT])
    assert light.compatible_with_group(["dheavy"]) is False
    assert light.compatible_with_group(["dheavy", "dlight"]) is False


def test_an_admin_can_ask_for_more_caution_than_the_calibrated_margin(store):
    # policy.pair_margin: a site whose jobs slow each other more than the packaged calibration
    # expects raises the pessimism for every pair judgement; it never lowers it.
    store.ingest_summary(summary("13", "d" * 64, 45.0, 20.0))
    store.record_decision({"decision_id": "dmid", "action": "share", "code": "x",
                           "keys": ["d" * 64]})
    pairing = Pairing(store).load()
    calibrated = pairing.compatibility(["d" * 64])
    cautious = pairing.compatibility(["d" * 64], margin_at_least=2.1)
    assert calibrated.compatible_with("dmid") is True  # two jobs at 45%: about 0.75x each
    assert cautious.compatible_with("dmid") is False
    assert cautious.copies_allowed(8) < calibrated.copies_allowed(8)
    assert pairing.compatibility(["d" * 64], margin_at_least=0.5).model is pairing.model
    assert cautious.model.margin == 2.1 and pairing.model.margin < 2.1  # the shared one is kept


def test_decide_excludes_nodes_by_the_pair_predictor(store):
    config = Config(policy=PolicyConfig(sharing_partitions=("gpu",)),
                    gpu_types=(GpuType("v100", 16),))
    request = JobRequest(uid=1000, user="alice", partition="gpu", tres_per_node="gres:gpu:1")
    estimate = JobEstimate(source="history", memory_mib={"v100": 3000}, job_class=None)
    view = View(NodeView("n1", "v100", ("gpu",), gpus=1, resident_jobs=("dheavy",)),
                NodeView("n2", "v100", ("gpu",), gpus=1, resident_jobs=("dlight",)),
                NodeView("n3", "v100", ("gpu",), gpus=2, resident_jobs=("dheavy",)))
    knowledge = Pairing(store).compatibility([LIGHT])
    decision = decide(request, config, estimate=estimate, view=view, knowledge=knowledge)
    assert decision.action == "share"
    # n3 still has a free GPU: Slurm excludes by node, so only a node with no clean GPU goes.
    assert decision.writes["exc_nodes"] == "n1"
    assert "pair predictor" in decision.reason


def test_co_runs_in_the_store_become_corrections(store):
    before = Pairing(store).load()
    assert before.compatibility([LIGHT]).compatible_with("dlight") is True
    # Measured: job 10 ran at 0.4x next to job 12 (far below what their telemetry predicts).
    store.record_corun("10", "12", cluster="c1", isd_a=1.5, isd_b=0.02)
    after = Pairing(store).load()
    assert after.model.suffers[LIGHT] > 0
    assert after.compatibility([LIGHT]).compatible_with("dlight") is False
    # Learning at ingest swaps in a new model; a decision's compatibility keeps its own.
    held = before.compatibility([LIGHT])
    before.observe(store.corun_observations())
    assert held.model is not before.model
    assert before.compatibility([LIGHT]).compatible_with("dlight") is False


def test_ingest_learns_corrections_from_a_measured_co_run(store, monkeypatch):
    from slurm_gpushare.core.tag import Tag
    from slurm_gpushare.daemon import learning
    from slurm_gpushare.slurm.jobs import SlurmJob

    # Jobs 20 and 21 (the scripts of 10 and 12, which ran alone in 60 s) shared a GPU:
    # job 20 took 150 s (ISD 1.5, far above what two light jobs predict), job 21 61 s.
    for job_id, key in (("20", LIGHT), ("21", OTHER_LIGHT)):
        store.record_decision({"decision_id": f"d{job_id}", "action": "share", "code": "x",
                               "keys": [key, "f" * 64], "job_class": 0})  # script, user
    jobs = {job_id: SlurmJob(job_id, 1000, Tag("share", "history-share", f"d{job_id}",
                                                types=("v100",), job_class=0, shard=4).encode())
            for job_id in ("20", "21")}
    monkeypatch.setattr(learning, "lookup_job", jobs.get)
    pairing = Pairing(store).load()
    learner = learning.Learner(store, None, count=lambda _: None, pairing=pairing)
    config = Config(gpu_types=(GpuType("v100", 16),))

    def ingest(done, config):  # as the daemon does: commit, then learn on the writer thread
        assert store.ingest_summary(done)
        learner.learn(done, config)

    ingest(summary("20", LIGHT, 5.0, 2.0, duration_s=150.0, keys=[],
                           coruns=[{"job_id": "21", "overlap_s": 150.0}]), config)
    assert pairing.model.suffers == {}  # job 21 has not reported yet: nothing to pair with
    ingest(summary("21", OTHER_LIGHT, 6.0, 3.0, duration_s=61.0, keys=[],
                           coruns=[{"job_id": "20", "overlap_s": 61.0}]), config)
    assert pairing.model.suffers[LIGHT] > 0.3
    assert pairing.compatibility([LIGHT]).compatible_with("dlight") is False


MEDIUM = "d" * 64


@pytest.fixture
def array_store(store):
    store.ingest_summary(summary("13", MEDIUM, 30.0, 15.0))
    return store


def array_decision(store, key, memory_mib, array_tasks, util_estimate=None):
    config = Config(policy=PolicyConfig(sharing_partitions=("gpu",), keep_whole_when_idle=False),
                    gpu_types=(GpuType("v100", 16),))
    request = JobRequest(uid=1000, user="alice", partition="gpu", tres_per_node="gres:gpu:1",
                         array_tasks=array_tasks)
    estimate = JobEstimate(source="history", memory_mib={"v100": memory_mib}, job_class=None)
    view = View(NodeView("n1", "v100", ("gpu",), gpus=2, free_units=(16, 16),
                         gpu_jobs=((), ())))
    return decide(request, config, estimate=estimate, view=view,
                  knowledge=Pairing(store).compatibility([key]))


def units(decision) -> int:
    return int(decision.writes["tres_per_node"].rsplit(":", 1)[1])


def test_a_share_lets_no_more_jobs_like_it_onto_a_gpu_than_may_run_together(array_store):
    # Slurm places a queued share, and every task of an array (one decision for all, packed
    # onto the first GPU with room), by its count alone: the count must keep copies apart.
    for array_tasks in (None, 6):
        decision = array_decision(array_store, MEDIUM, 2000, array_tasks=array_tasks)
        assert decision.action == "share", decision.reason
        copies = decision.details["copies_per_gpu"]
        assert 1 <= copies < 8  # 8 would fit by memory (2 GiB of 16)
        assert 16 // units(decision) == copies
        assert f"at most {copies} job" in decision.reason
    # Two busy jobs together run below 0.7x: one per GPU (a light partner still fits beside).
    heavy = array_decision(array_store, HEAVY, 2000, array_tasks=4)
    assert heavy.details["copies_per_gpu"] == 1 and units(heavy) == 9
    # Light jobs may all stack: the share stays sized by memory.
    light = array_decision(array_store, OTHER_LIGHT, 2000, array_tasks=2)
    assert units(light) == 2 and "copies_per_gpu" not in light.details


def test_an_array_without_a_pair_profile_is_judged_by_its_class():
    config = Config(policy=PolicyConfig(sharing_partitions=("gpu",), keep_whole_when_idle=False),
                    gpu_types=(GpuType("v100", 16),))
    request = JobRequest(uid=1000, partition="gpu", tres_per_node="gres:gpu:1", array_tasks=4)
    estimate = JobEstimate(source="history", memory_mib={"v100": 2000}, job_class=2)
    view = View(NodeView("n1", "v100", ("gpu",), gpus=2, free_units=(16, 16),
                         gpu_jobs=((), ())))

    class Classes:
        def __init__(self, ok):
            self.ok = ok

        def compatible(self, a, b, gpu_type=None):
            return self.ok

    kept = decide(request, config, estimate=estimate, view=view, knowledge=Classes(False))
    assert kept.code == "array-stacking"
    shared = decide(request, config, estimate=estimate, view=view, knowledge=Classes(True))
    assert shared.action == "share" and shared.writes["tres_per_node"] == "gres:shard:2"
    # Not an array: the classes judge residents (node exclusion), not the count.
    single = decide(JobRequest(uid=1000, partition="gpu", tres_per_node="gres:gpu:1"), config,
                    estimate=estimate, view=view, knowledge=Classes(False))
    assert single.action == "share" and single.writes["tres_per_node"] == "gres:shard:2"


def test_a_slowdown_shared_by_several_partners_is_not_taught_as_each_pairs(store):
    # Three copies of one job shared a GPU, each slowed exactly as much as the prior predicts
    # for three together (twice the pair's slowdown). The co-run gives three pair rows, each
    # carrying the job's whole slowdown: taken as pairs', they would teach that two copies
    # slow each other twice as much as they do.
    key = "e" * 64
    for job_id in ("30", "31", "32"):
        store.ingest_summary(summary(job_id, key, 40.0, 20.0))
    pairing = Pairing(store).load()
    profile = pairing.profile([key]).profile
    pair_isd = pairing.model.predict_isd([profile, profile])[0]
    group_isd = pairing.model.predict_isd([profile, profile, profile])[0]
    assert group_isd == pytest.approx(2 * pair_isd) and pair_isd > 0.1
    rows = [{"cluster": "c1", "job_a": a, "job_b": b, "gpu_uuid": "GPU-1", "overlap_s": 60.0,
             "isd_a": group_isd, "isd_b": group_isd}
            for a, b in (("30", "31"), ("30", "32"), ("31", "32"))]
    pairing.observe(rows)
    learned = pairing.model.predict_isd([profile, profile], [key, key])[0]
    assert learned == pytest.approx(pair_isd, rel=0.05)
    # One partner: the pair's slowdown is taken as measured (twice the prior here).
    other = Pairing(store).load()
    other.observe(rows[:1])
    assert other.model.predict_isd([profile, profile], [key, key])[0] > 1.3 * pair_isd


def test_a_job_is_judged_with_its_profile_on_the_gpu_type_it_would_share():
    # The same script keeps a T4 far busier than an A100: next to a resident that is busy
    # everywhere it may share an A100, not a T4. Its runs averaged over both types would
    # give one verdict for both.
    from slurm_gpushare.daemon.pairing import Profiles, profiles_by_type
    from slurm_gpushare.predict.pairs import default_model, typed_key

    def run(model, util, mem):
        return {"gpu_model": model, "mgup_mean": util, "mgtsamp_mean": mem, "mgup_max": util,
                "mgtsamp_max": mem, "mgmap_max_mib": 2000.0, "mem_total_mib": 16384.0}

    types = {"Tesla T4": "t4", "NVIDIA A100-SXM4-40GB": "a100"}
    history = [run("Tesla T4", 90.0, 60.0), run("Tesla T4", 86.0, 50.0),
               run("NVIDIA A100-SXM4-40GB", 12.0, 6.0), run("Unknown GPU", 50.0, 20.0)]
    by_type = profiles_by_type(history, types.get)
    assert set(by_type) == {"t4", "a100"}
    assert by_type["t4"]["gpu_util_pct"] == 88.0 and by_type["a100"]["gpu_util_pct"] == 12.0
    own = Profiles(profile_of_history(history)[0], "j" * 64, by_type)
    assert own.on("t4") == (by_type["t4"], typed_key("j" * 64, "t4"))
    assert own.on("v100") == (own.profile, "j" * 64)  # never ran there: its runs over all types
    busy = {"gpu_util_pct": 70.0, "mem_util_pct": 40.0, "mem_total_mib": 16384.0}
    resident = Profiles(busy, "r" * 64, {})
    from slurm_gpushare.daemon.pairing import PairCompatibility

    compat = PairCompatibility(default_model(), own, {"d1": resident}.get)
    assert compat.compatible_with("d1", "a100") is True
    assert compat.compatible_with("d1", "t4") is False


def test_co_runs_teach_corrections_on_their_gpu_type(tmp_path):
    # Two light jobs measured at 0.4x together on a V100: on a V100 they are kept apart from
    # then on; on an A100, where each ran alone but never together, the prior judges them.
    def typed_summary(job_id, key, util, mem, model):
        return summary(job_id, key, util, mem, gpu_model=model)

    a, b = "a" * 64, "c" * 64
    v100, a100 = "Tesla V100-SXM2-16GB", "NVIDIA A100-SXM4-40GB"
    types = {v100: "v100", a100: "a100"}
    with Store(tmp_path / "s.db") as s:
        for job_id, key, model in (("10", a, v100), ("11", b, v100), ("12", a, a100),
                                   ("13", b, a100)):
            s.ingest_summary(typed_summary(job_id, key, 20.0, 5.0, model))
        s.record_decision({"decision_id": "db", "action": "share", "code": "x", "keys": [b]})
        cold = Pairing(s, type_of=types.get).load()
        assert cold.compatibility([a]).compatible_with("db", "v100") is True
        s.record_corun("10", "11", cluster="c1", gpu_type="v100", isd_a=1.5, isd_b=1.5)
        learned = Pairing(s, type_of=types.get).load()
        from slurm_gpushare.predict.pairs import typed_key

        assert learned.model.suffers[typed_key(a, "v100")] > 0
        assert typed_key(a, "a100") not in learned.model.suffers
        assert learned.compatibility([a]).compatible_with("db", "v100") is False
        assert learned.compatibility([a]).compatible_with("db", "a100") is True


def test_another_users_co_runs_cannot_make_a_job_look_harmless_to_others(store):
    # Job 12's user reports no slowdown next to job 11 (the heavy share), run after run. A
    # job's run time is its user's to choose: taught as how little job 11 hurts its partners,
    # it let a third user's job (13, busy 25% of the time) onto 11's GPU, which the model
    # keeps it off (0.69x predicted with the margin; 0.79x once taught).
    victim = "e" * 64
    store.ingest_summary(summary("13", victim, 25.0, 8.0))
    assert Pairing(store).load().compatibility([victim]).compatible_with("dheavy") is False
    for gpu in range(5):
        store.record_corun("11", "12", cluster="c1", gpu_uuid=f"GPU-{gpu}", isd_b=0.0,
                           same_user=False)
    pairing = Pairing(store).load()
    assert HEAVY not in pairing.model.hurts
    assert pairing.compatibility([victim]).compatible_with("dheavy") is False
    assert pairing.model.suffers[OTHER_LIGHT] < 0  # what it measured of itself is its own
    # Measured by the heavy job's own user, the same co-runs teach how much it hurts.
    for gpu in range(5):
        store.record_corun("11", "12", cluster="c1", gpu_uuid=f"GPU-{gpu}", same_user=True)
    trusted = Pairing(store).load()
    assert trusted.model.hurts[HEAVY] < 0
    assert trusted.compatibility([victim]).compatible_with("dheavy") is True


def test_ingest_records_whether_co_runners_belong_to_one_user(store, monkeypatch):
    from slurm_gpushare.core.tag import Tag
    from slurm_gpushare.daemon import learning
    from slurm_gpushare.slurm.jobs import SlurmJob

    for job_id, key in (("20", LIGHT), ("21", OTHER_LIGHT), ("22", OTHER_LIGHT)):
        store.record_decision({"decision_id": f"d{job_id}", "action": "share", "code": "x",
                               "keys": [key, "f" * 64], "job_class": 0})
    uids = {"20": 1000, "21": 1001, "22": 1000}
    jobs = {job_id: SlurmJob(job_id, uid, Tag("share", "history-share", f"d{job_id}",
                                              types=("v100",), job_class=0, shard=4).encode())
            for job_id, uid in uids.items()}
    monkeypatch.setattr(learning, "lookup_job", jobs.get)
    learner = learning.Learner(store, None, count=lambda _: None,
                               pairing=Pairing(store).load())
    config = Config(gpu_types=(GpuType("v100", 16),))
    done = summary("20", LIGHT, 5.0, 2.0, duration_s=150.0, keys=[],
                   coruns=[{"job_id": "21", "overlap_s": 150.0}, {"job_id": "22", "overlap_s": 150.0}])
    assert store.ingest_summary(done)
    learner.learn(done, config)
    same = {row["job_b"]: row["same_user"] for row in store.coruns_of("20")}
    assert same == {"21": 0, "22": 1}
