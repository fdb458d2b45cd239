"""A burst of shares: the daemon's ledger of shares decided but not running yet, and the type
choice by expected completion (room now first, then run time)."""

from __future__ import annotations

from slurm_gpushare.core.config import parse_config
from slurm_gpushare.core.policy import (JobEstimate, NodeView, decide,
                                         incompatible_nodes, landing_gpu, room_types)
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.core.types import JobRequest
from slurm_gpushare.daemon import clusterview
from slurm_gpushare.daemon.clusterview import RunningJob, SlurmClusterView, gpu_occupancy
from slurm_gpushare.slurm import cmd

CONFIG = parse_config({
    # Shares on idle GPUs too (a burst on an idle cluster is the case of interest).
    "policy": {"sharing_partitions": ["gpu"], "keep_whole_when_idle": False},
    "gpu_types": {"a100": {"memory_gib": 80}, "v100": {"memory_gib": 16},
                  "t4": {"memory_gib": 16, "sharing": "mps"}},
})


def request() -> JobRequest:
    return JobRequest(uid=1000, partition="gpu", tres_per_node="gres:gpu:1")


def estimate(gib: float = 9, runtimes=None) -> JobEstimate:
    return JobEstimate(source="history", job_class=0,
                       memory_mib={t: gib * 1024 for t in ("a100", "v100", "t4")},
                       runtime_s=runtimes or {"a100": 100.0, "v100": 110.0, "t4": 115.0})


def node(name, gpu_type, free, jobs=None, idle=None) -> NodeView:
    return NodeView(name, gpu_type, ("gpu",), gpus=len(free), free_units=tuple(free),
                    gpu_jobs=tuple(jobs or [()] * len(free)),
                    resident_jobs=tuple(j for g in (jobs or []) for j in g),
                    idle_gpus=sum(f in (16, 80, 100) for f in free) if idle is None else idle)


class View:
    def __init__(self, *nodes):
        self._nodes = nodes

    def nodes(self):
        return self._nodes


class AtMostOnePartner:
    """A pair predictor stand-in: a job may join one share on a GPU, not two."""

    def compatible_with(self, resident, gpu_type=None):
        return True

    def compatible_with_group(self, residents, gpu_type=None):
        return len(residents) < 2


def test_slurm_packs_a_share_onto_the_first_gpu_with_room():
    assert landing_gpu(node("v1", "v100", [4, 16]), 8) == 1
    assert landing_gpu(node("v1", "v100", [10, 16]), 8) == 0
    assert landing_gpu(node("v1", "v100", [4, 2]), 8) is None
    assert landing_gpu(NodeView("v1", "v100"), 8) is None  # not known


def test_gpu_occupancy_estimates_each_gpu_from_the_running_jobs():
    jobs = [RunningJob(("n",), 1, job_id="10"),  # a whole GPU: the first empty one
            RunningJob(("n",), 1, 1, "d1", True, "11", 6),  # shares: the first GPU with room
            RunningJob(("n",), 1, 1, "d2", True, "12", 6),
            RunningJob(("n",), 1, 1, "d3", True, "13", 6)]
    free, held = gpu_occupancy(3, 16, jobs)
    assert free == (0, 4, 10) and held == ((), ("d1", "d2"), ("d3",))


def test_an_mps_node_offers_room_for_shares_on_one_gpu_only():
    # Slurm uses MPS on one GPU of a node: the GPU that holds MPS shares, else the first idle.
    share = RunningJob(("n",), 1, 1, "d1", True, "11", 51)
    assert gpu_occupancy(2, 100, [share], one_shared_gpu=True) == ((49, 0), (("d1",), ()))
    assert gpu_occupancy(2, 100, [share]) == ((49, 100), (("d1",), ()))  # shards: both
    whole = RunningJob(("n",), 1, job_id="10")
    assert gpu_occupancy(2, 100, [whole], one_shared_gpu=True) == ((0, 100), ((), ()))
    assert gpu_occupancy(2, 100, [], one_shared_gpu=True) == ((100, 0), ((), ()))
    # A second MPS share too large for the first GPU's room waits: no node-level room for it.
    assert landing_gpu(node("t1", "t4", [49, 0]), 51) is None


def test_the_type_with_room_is_chosen_over_a_faster_full_one():
    full_a100 = node("a1", "a100", [0, 0])
    v100 = node("v1", "v100", [16, 16])
    decision = decide(request(), CONFIG, estimate=estimate(), view=View(full_a100, v100))
    # a100 is full but no slower: offered too (it may free first).
    assert decision.writes["features"] == "a100|v100"
    # Much slower types with room are left out where a faster one has room.
    slow = estimate(runtimes={"a100": 100.0, "v100": 400.0, "t4": 900.0})
    decision = decide(request(), CONFIG, estimate=slow,
                      view=View(node("a1", "a100", [80, 80]), v100, node("t1", "t4", [100, 100])))
    assert decision.gpu_types == ("a100",) and "not offered on v100, t4" in decision.reason


def test_shard_types_full_sends_the_share_to_mps_types_with_room():
    view = View(node("a1", "a100", [0, 0]), node("v1", "v100", [2, 2]),
                node("t1", "t4", [100, 100]))
    decision = decide(request(), CONFIG, estimate=estimate(), view=view)
    assert decision.writes["tres_per_node"].startswith("gres:mps:")
    assert decision.gpu_types == ("t4",)


def test_with_room_nowhere_every_type_of_the_request_is_offered():
    slow = estimate(runtimes={"a100": 100.0, "v100": 400.0, "t4": 900.0})
    view = View(node("a1", "a100", [0, 0]), node("v1", "v100", [2, 2]), node("t1", "t4", [5, 5]))
    decision = decide(request(), CONFIG, estimate=slow, view=view)
    assert decision.gpu_types == ("a100", "v100")
    assert "no room for it on any type now" in decision.reason


def fake_slurm(running: list[str]):
    sinfo = "\n".join(["a1|a100|gpu*|gpu:a100:2|mix", "v1|v100|gpu*|gpu:v100:2|idle",
                       "v2|v100|gpu*|gpu:v100:2|idle", "t1|t4|gpu*|gpu:t4:2|idle"])

    def run(argv, **_kwargs):
        if argv[0] == "sinfo":
            return cmd.Result(argv, 0, sinfo + "\n", "")
        if argv[0] == "squeue":
            return cmd.Result(argv, 0, "\n".join(running) + "\n", "")
        return cmd.Result(argv, 0, "", "")
    return run


def test_a_burst_spreads_over_gpus_and_types_through_the_ledger(monkeypatch):
    # Both a100 GPUs are busy (whole-GPU jobs); v100 and t4 GPUs are idle. Without the ledger
    # every decision of the burst saw the same idle cluster, and Slurm packed them all.
    running = ["1|a1|gres:gpu:a100:2|(null)"]
    monkeypatch.setattr(cmd, "run", fake_slurm(running))
    view = SlurmClusterView(CONFIG)
    assert view.refresh()
    placed, decisions = [], []
    for i in range(7):
        decision = decide(request(), CONFIG, estimate=estimate(gib=5), view=view,
                          knowledge=AtMostOnePartner(), decision_id=f"d{i}")
        assert decision.action == "share", decision.reason
        view.claim_share(f"d{i}", decision.gpu_types, decision.details["units"], ["gpu"],
                         decision.details["excluded_nodes"], 0, decision.details["room_now"])
        where = {n.name: n.gpu_jobs for n in view.nodes() if any(f"d{i}" in g for g in n.gpu_jobs)}
        decisions.append(decision)
        placed.append((decision.gpu_types, decision.details["excluded_nodes"], where))
    # Two per GPU that Slurm would use (it packs GPU 0 of a node first): v1, v2, then t1.
    assert [sorted(w) for _, _, w in placed[:6]] == [["v1"], ["v1"], ["v2"], ["v2"], ["t1"], ["t1"]]
    assert placed[4][0] == ("t4",)  # the shard types' GPUs it may join are taken: MPS on t4
    # Then it could start only next to two partners: it is kept away from them and waits.
    types, excluded, where = placed[6]
    assert not where and "no room for it on any type now" in decisions[6].reason


def test_ledger_entries_go_when_the_job_runs_or_after_a_few_refreshes(monkeypatch):
    running = ["1|a1|gres:gpu:a100:2|(null)"]
    monkeypatch.setattr(cmd, "run", fake_slurm(running))
    view = SlurmClusterView(CONFIG)
    view.refresh()
    view.claim_share("d1", ("v100",), 6, ["gpu"])
    view.claim_share("d2", ("v100",), 6, ["gpu"])
    assert {e.decision_id for e in view.pending()} == {"d1", "d2"}
    assert next(n for n in view.nodes() if n.name == "v1").gpu_jobs[0] == ("d1", "d2")
    # Slurm started d1 (on v2, not where the ledger guessed): the view's word replaces it.
    tag = Tag("share", "history", decision_id="d1", shard=6, job_class=0).encode()
    running.append(f"7|v2|gres:shard:6|{tag}")
    view.refresh()
    assert {e.decision_id for e in view.pending()} == {"d2"}
    nodes = {n.name: n for n in view.nodes()}
    # Still pending, still counted: now where Slurm would pack it, next to d1.
    assert nodes["v2"].gpu_jobs[0] == ("d1", "d2") and nodes["v2"].free_units == (4, 16)
    assert nodes["v1"].gpu_jobs == ((), ())
    for _ in range(clusterview.PENDING_REFRESHES):
        view.refresh()
    assert view.pending() == []  # never seen running (queued, cancelled): gone
    assert {n.name: n for n in view.nodes()}["v2"].gpu_jobs == (("d1",), ())


def test_a_claim_keeps_the_answers_about_other_types_and_skips_the_scan_without_room(
        monkeypatch):
    monkeypatch.setattr(cmd, "run", fake_slurm(["1|a1|gres:gpu:a100:2|(null)"]))
    view = SlurmClusterView(CONFIG)
    view.refresh()
    a100 = [g for g in CONFIG.gpu_types if g.name == "a100"]
    v100 = [g for g in CONFIG.gpu_types if g.name == "v100"]
    knowledge = AtMostOnePartner()
    for fits in (a100, v100):
        incompatible_nodes(0, fits, ["gpu"], view, knowledge, 6)
        room_types(fits, 6, ["gpu"], view)
    before = view.nodes()
    view.claim_share("d1", ("v100",), 6, ["gpu"])
    after = view.nodes()
    assert after is not before
    assert {k[1] for k in dict(after.memo)} == {("a100",)}
    assert {k[1] for k in dict(after.checks) if k[0] == "room-nodes"} == {("a100",)}
    # A share the decision saw no room for waits in the queue: in the ledger, on no node.
    view.claim_share("d2", ("v100",), 6, ["gpu"], room_now=False)
    assert view.nodes() is after and "d2" in {e.decision_id for e in view.pending()}


def test_a_job_that_could_start_only_next_to_bad_partners_waits_for_another_gpu():
    # v1's GPU 0 holds two shares (Slurm would pack the job there, GPU 1 stays idle); the
    # a100s are full: it is kept off v1 and waits for a GPU it may share.
    view = View(node("a1", "a100", [0, 0]), node("a2", "a100", [0, 0]),
                node("v1", "v100", [6, 16], [("x", "y"), ()]))
    decision = decide(request(), CONFIG, estimate=estimate(gib=5), view=view,
                      knowledge=AtMostOnePartner())
    assert decision.writes["exc_nodes"] == "v1"
    assert "no room for it on any type now" in decision.reason
    # A node without room now is never excluded (by the time it has room, others are there).
    view = View(node("a1", "a100", [0, 0]), node("v1", "v100", [2, 2], [("x", "y"), ("z",)]),
                node("v2", "v100", [16, 16]))
    decision = decide(request(), CONFIG, estimate=estimate(gib=5), view=view,
                      knowledge=AtMostOnePartner())
    assert "exc_nodes" not in decision.writes


def test_a_node_the_user_named_is_never_excluded():
    """Slurm refuses a job whose --nodelist node is also excluded ("Invalid node name
    specified"): the per-GPU check must leave the user's nodes alone."""
    view = View(node("a1", "a100", [0, 0]), node("v1", "v100", [6, 16], [("x", "y"), ()]),
                node("v2", "v100", [16, 16]))
    pinned = JobRequest(uid=1000, partition="gpu", tres_per_node="gres:gpu:1", req_nodes="v1")
    decision = decide(pinned, CONFIG, estimate=estimate(gib=5), view=view,
                      knowledge=AtMostOnePartner())
    assert "v1" not in decision.writes.get("exc_nodes", "").split(",")
    # Unpinned, the same job is kept off v1.
    decision = decide(request(), CONFIG, estimate=estimate(gib=5), view=view,
                      knowledge=AtMostOnePartner())
    assert decision.writes["exc_nodes"] == "v1"


def test_with_room_nowhere_the_request_for_more_gpus_is_chosen():
    # Equal run times, no room on any type. The a100s are held whole (when they free is not
    # known), the MPS type has one GPU per node for MPS: the v100s, full of shares that will
    # free, are the job's best chance.
    whole_a100 = [node(f"a{i}", "a100", [0, 0]) for i in range(2)]
    mps_busy = node("t1", "t4", [30, 0], jobs=[("dt",), ()])
    shared_v100 = [node(f"v{i}", "v100", [0, 0], jobs=[(f"d{i}a",), (f"d{i}b",)])
                   for i in range(2)]
    runtimes = {"a100": 50.0, "v100": 100.0, "t4": 100.0}  # a100 much faster, but held whole
    busy = JobEstimate(source="history", job_class=0, runtime_s=runtimes,
                       memory_mib={"a100": 30 * 1024, "v100": 6 * 1024, "t4": 6 * 1024})
    nodes = (*whole_a100, mps_busy, *shared_v100)
    decision = decide(request(), CONFIG, estimate=busy, view=View(*nodes))
    assert decision.writes["features"] == "v100", decision.reason
    # With room on the MPS type now, it goes there.
    mps_free = node("t1", "t4", [100, 0])
    decision = decide(request(), CONFIG, estimate=busy,
                      view=View(*whole_a100, mps_free, *shared_v100))
    assert decision.writes["features"] == "t4", decision.reason
