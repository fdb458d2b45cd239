"""Placement in decide(): one shard count on every type it fits, shares only under pressure."""

from __future__ import annotations

from dataclasses import replace

from slurm_gpushare.core.config import parse_config
from slurm_gpushare.core.policy import (JobEstimate, NodeView, decide, mean_rounds,
                                         queued_completion)
from slurm_gpushare.core.types import MANY_ARRAY_TASKS, JobRequest
from slurm_gpushare.daemon.clusterview import idle_gpus_per_node


def config(**policy):
    return parse_config({
        "policy": {"sharing_partitions": ["gpu"], "gpu_time_budget_pct": 0, **policy},
        "gpu_types": {"t4": {"memory_gib": 16}, "v100": {"memory_gib": 32},
                      "a100": {"memory_gib": 80}},
    })


def request(**fields) -> JobRequest:
    return JobRequest(**{"uid": 1000, "partition": "gpu", "tres_per_node": "gres:gpu:1", **fields})


def history(**memory_gib) -> JobEstimate:
    return JobEstimate(source="history", job_class=0,
                       memory_mib={t: gib * 1024 for t, gib in memory_gib.items()},
                       runtime_s={"t4": 900.0, "v100": 400.0, "a100": 200.0})


class View:
    def __init__(self, *nodes):
        self._nodes = nodes

    def nodes(self):
        return self._nodes


def test_one_count_offered_on_every_type_it_fits():
    # 5.2 GiB on a100 (the fastest), 6.5 GiB on the others: one count of 7 shards = 7 GiB
    # everywhere, on every type, not only the fastest.
    decision = decide(request(), config(), estimate=history(t4=6.5, v100=6.5, a100=5.2))
    assert decision.writes["tres_per_node"] == "gres:shard:7"
    assert decision.gpu_types == ("a100", "v100", "t4")
    assert decision.writes["features"] == "a100|v100|t4"


def test_a_type_too_small_for_the_one_count_is_left_out():
    decision = decide(request(), config(), estimate=history(t4=15.5, v100=20, a100=20))
    assert decision.writes["tres_per_node"] == "gres:shard:20"
    assert decision.gpu_types == ("a100", "v100")


def test_an_idle_gpu_of_a_fitting_type_keeps_the_job_whole():
    busy = NodeView("a1", "a100", ("gpu",), gpus=4, idle_gpus=0)
    idle_t4 = NodeView("t1", "t4", ("gpu",), gpus=2, idle_gpus=1)
    estimate = history(t4=6, v100=6, a100=6)
    decision = decide(request(), config(), estimate=estimate, view=View(busy, idle_t4),
                      decision_id="x")
    assert decision.action == "keep" and decision.code == "idle-gpu"
    assert decision.writes == {"admin_comment": "gpushare:v1:keep:id=x:why=idle-gpu"}
    assert "t4 GPU is idle" in decision.reason
    # Under pressure (nothing idle) it shares, on every type.
    full = View(busy, NodeView("t1", "t4", ("gpu",), gpus=2, idle_gpus=0))
    assert decide(request(), config(), estimate=estimate, view=full).action == "share"
    # An idle GPU the job does not fit on, or in another partition, is no reason to wait whole.
    other = View(busy, NodeView("t1", "t4", ("debug",), gpus=2, idle_gpus=2))
    assert decide(request(), config(), estimate=estimate, view=other).action == "share"
    too_small = history(t4=20, v100=20, a100=20)
    assert decide(request(), config(), estimate=too_small,
                  view=View(busy, idle_t4)).action == "share"
    # The admin may share regardless.
    assert decide(request(), config(keep_whole_when_idle=False), estimate=estimate,
                  view=View(busy, idle_t4)).action == "share"


def test_an_array_keeps_whole_gpus_only_when_all_its_tasks_find_an_idle_one():
    # One decision covers every task: two idle GPUs keep an array of two whole, but an array
    # of four would leave two tasks waiting for a whole GPU while they could share.
    busy = NodeView("a1", "a100", ("gpu",), gpus=4, idle_gpus=0)
    two_idle = View(busy, NodeView("t1", "t4", ("gpu",), gpus=2, idle_gpus=1),
                    NodeView("v1", "v100", ("gpu",), gpus=2, idle_gpus=1))
    estimate = history(t4=6, v100=6, a100=6)
    two = decide(request(array_tasks=2), config(), estimate=estimate, view=two_idle)
    assert (two.action, two.code) == ("keep", "idle-gpu"), two.reason
    assert two.details["idle_gpus"] == 2 and two.details["tasks"] == 2
    four = decide(request(array_tasks=4), config(), estimate=estimate, view=two_idle)
    assert four.action == "share", four.reason
    # An array whose size is not known counts as more tasks than any idle GPUs.
    unknown = decide(request(array_tasks=MANY_ARRAY_TASKS), config(), estimate=estimate,
                     view=two_idle)
    assert unknown.action == "share", unknown.reason


def test_an_array_kept_whole_claims_an_idle_gpu_per_task():
    from slurm_gpushare.daemon.clusterview import SlurmClusterView, Snapshot

    view = SlurmClusterView(config())
    view._snapshot = Snapshot((NodeView("a1", "a100", ("gpu",), gpus=4, idle_gpus=0),
                               NodeView("t1", "t4", ("gpu",), gpus=2, idle_gpus=1),
                               NodeView("t2", "t4", ("gpu",), gpus=2, idle_gpus=2)))
    estimate = history(t4=6, v100=6, a100=6)
    array = decide(request(array_tasks=2), config(), estimate=estimate, view=view)
    assert array.code == "idle-gpu", array.reason
    view.claim_idle(array.details["idle_types"], array.details["tasks"])
    assert sum(n.idle_gpus for n in view.nodes()) == 1
    # The one idle GPU left is no room for a second array of two, but is for a single job.
    assert decide(request(array_tasks=2), config(), estimate=estimate,
                  view=view).action == "share"
    assert decide(request(), config(), estimate=estimate, view=view).code == "idle-gpu"


def test_unknown_idle_count_does_not_keep_the_job_whole():
    view = View(NodeView("t1", "t4", ("gpu",), gpus=2))
    assert decide(request(), config(), estimate=history(t4=6, v100=6, a100=6),
                  view=view).action == "share"


def test_idle_gpus_per_node_from_running_jobs():
    nodes = {"a1": 4, "t1": 2, "t2": 2, "v1": 2}
    queue = "\n".join([
        "10|a1|gres:gpu:2",          # two whole GPUs
        "11|a1|gres:shard:8",        # a share: at most one more GPU
        "12|t[1-2]|gres:gpu:2",      # a two-node job, two GPUs on each
        "13|v1|gres/gpu:v100:1",     # 23.11+ prefix and a type
        "14|v1|",                    # no GPU
    ])
    assert idle_gpus_per_node(nodes, queue, up={"a1", "t1", "t2"}) == {
        "a1": 1, "t1": 0, "t2": 0, "v1": 0}


def test_a_burst_claims_idle_gpus_one_by_one():
    from slurm_gpushare.daemon.clusterview import SlurmClusterView, Snapshot

    view = SlurmClusterView(config())
    view._snapshot = Snapshot((NodeView("a1", "a100", ("gpu",), gpus=4, idle_gpus=0),
                               NodeView("t1", "t4", ("gpu",), gpus=2, idle_gpus=2)))
    estimate = history(t4=6, v100=6, a100=6)
    codes = []
    for _ in range(4):
        decision = decide(request(), config(), estimate=estimate, view=view)
        codes.append(decision.code)
        if decision.code == "idle-gpu":
            view.claim_idle(decision.details["idle_types"])
    assert codes == ["idle-gpu", "idle-gpu", "history-share", "history-share"]


class OneCopyPerGpu:
    """A pair predictor's answer for a busy job: no second copy of it on a GPU."""

    def copies_allowed(self, limit):
        return 1

    def compatible_with(self, resident_job, gpu_type=None):
        return True

    def compatible_with_group(self, resident_jobs, gpu_type=None):
        return True


def full_view(free_units):
    return View(*(NodeView(f"{t}1", t, ("gpu",), gpus=2, idle_gpus=0, free_units=(free, free),
                           gpu_jobs=(("x",), ("y",)))
                  for t, free in free_units.items()))


def test_a_share_that_would_wait_and_packs_no_copy_keeps_the_job_as_submitted():
    # No two copies of it may share a GPU, so its share is more than half of each GPU: one
    # count (41 of 80 GiB) suits the a100s alone. With no room for it anywhere, the share would
    # wait for an a100 while the job as submitted takes the first GPU of any type to free.
    estimate = history(t4=6, v100=6, a100=6)
    decision = decide(request(), config(), estimate=estimate, knowledge=OneCopyPerGpu(),
                      view=full_view({"t4": 2, "v100": 10, "a100": 20}), decision_id="w")
    assert (decision.action, decision.code) == ("keep", "waits-whole"), decision.reason
    assert decision.writes == {"admin_comment": "gpushare:v1:keep:id=w:why=waits-whole"}
    assert "first GPU to free of" in decision.reason
    # With room for it now, it shares (it starts at once, beside a smaller partner).
    room = decide(request(), config(), estimate=estimate, knowledge=OneCopyPerGpu(),
                  view=full_view({"t4": 2, "v100": 10, "a100": 60}))
    assert room.action == "share" and room.gpu_types == ("a100",)
    assert room.details["copies_per_gpu"] == 1
    # A share that packs copies may wait: a GPU that frees then takes several jobs.
    packs = decide(request(), config(), estimate=estimate,
                   view=full_view({"t4": 2, "v100": 2, "a100": 2}))
    assert packs.action == "share" and packs.details["room_now"] is False
    # Where the job fits only some types, as submitted it could land on one it does not fit:
    # the share stays (OOM avoidance).
    big = decide(request(), config(), estimate=history(t4=20, v100=20, a100=20),
                 knowledge=OneCopyPerGpu(), view=full_view({"t4": 2, "v100": 10, "a100": 20}))
    assert big.action == "share" and "t4" not in big.gpu_types
    # A job that asked for one type keeps its share there: as submitted it waits for the same GPUs.
    typed = decide(request(tres_per_node="gres:gpu:a100:1"), config(), estimate=estimate,
                   knowledge=OneCopyPerGpu(), view=full_view({"t4": 2, "v100": 10, "a100": 20}))
    assert typed.action == "share" and typed.gpu_types == ("a100",)


def test_an_array_whose_tasks_would_not_all_start_keeps_them_as_submitted():
    # Room for one share of 41 on the a100s now, but four tasks: three would wait for an a100.
    estimate = history(t4=6, v100=6, a100=6)
    four = request(array_tasks=4)
    one_room = full_view({"t4": 2, "v100": 10, "a100": 0})
    one_room = View(*one_room.nodes(), NodeView("a2", "a100", ("gpu",), gpus=2, idle_gpus=0,
                                                free_units=(50, 0), gpu_jobs=(("z",), ("w",))))
    decision = decide(four, config(), estimate=estimate, knowledge=OneCopyPerGpu(),
                      view=one_room)
    assert decision.code == "waits-whole", decision.reason
    assert "its 4 array tasks" in decision.reason
    # A single job starts there now: it shares.
    assert decide(request(), config(), estimate=estimate, knowledge=OneCopyPerGpu(),
                  view=one_room).action == "share"
    # Room for all four tasks: they share.
    room = full_view({"t4": 2, "v100": 10, "a100": 50})
    room = View(*room.nodes(), NodeView("a2", "a100", ("gpu",), gpus=2, idle_gpus=0,
                                        free_units=(50, 50), gpu_jobs=(("z",), ("w",))))
    assert decide(four, config(), estimate=estimate, knowledge=OneCopyPerGpu(),
                  view=room).action == "share"


class ThreeCopiesPerGpu(OneCopyPerGpu):
    """A pair predictor's answer for a light job: at most three copies of it on a GPU."""

    def copies_allowed(self, limit):
        return min(limit, 3)


def test_an_array_shares_where_its_tasks_finish_first():
    # At most three copies per GPU: 21 of 80 GiB on an a100, 9 of 32 on a v100 -- one count
    # cannot mean the same on both. With room for one task on the a100s (twice as fast) and
    # for nine on the v100s, an array of 8 would finish its tasks in 4.5 a100 runs on average
    # (one at a time) against one v100 run: it goes to the v100s.
    def view(a100_free):
        return View(NodeView("a1", "a100", ("gpu",), gpus=2, idle_gpus=0,
                             free_units=(a100_free, 0), gpu_jobs=(("x",), ("y",))),
                    NodeView("v1", "v100", ("gpu",), gpus=3, idle_gpus=0,
                             free_units=(27, 27, 27), gpu_jobs=(("x",), ("y",), ("z",))))

    def offer(tasks, a100_free):
        decision = decide(request(array_tasks=tasks) if tasks > 1 else request(), config(),
                          estimate=history(t4=2, v100=2, a100=2),
                          knowledge=ThreeCopiesPerGpu(), view=view(a100_free))
        assert decision.action == "share", decision.reason
        return decision.writes["tres_per_node"], decision.gpu_types

    assert offer(8, 21) == ("gres:shard:9", ("v100",))
    # A single job starts at once on either: the faster type, as before.
    assert offer(1, 21) == ("gres:shard:21", ("a100",))
    # Room for three of the eight on the a100s: in rounds of three they finish in 1.9 a100
    # runs on average, sooner than in one v100 run.
    assert offer(8, 63) == ("gres:shard:21", ("a100",))
    assert offer(3, 63) == ("gres:shard:21", ("a100",))


def test_an_array_that_would_queue_on_a_few_share_gpus_runs_as_submitted():
    # The cluster A/B's tail (bench/results/ab_cluster_congested_f01276c.json, per_job): an
    # array of four arrived while every v100 and a100 was busy; the one t4 GPU taking MPS
    # shares had room for one task, so all four were narrowed to it and ran one or two at a
    # time until long after the v100s had freed. As submitted they take any GPU as it frees.
    mixed = parse_config({
        "policy": {"sharing_partitions": ["gpu"], "gpu_time_budget_pct": 0},
        "gpu_types": {"t4": {"memory_gib": 16, "sharing": "mps"}, "v100": {"memory_gib": 16},
                      "a100": {"memory_gib": 80}}})
    same = JobEstimate(source="history", job_class=0,
                       memory_mib={"t4": 6000, "v100": 6000, "a100": 6600},
                       runtime_s={"t4": 36.0, "v100": 36.0, "a100": 36.0})
    whole = lambda name, t: NodeView(name, t, ("gpu",), gpus=2, idle_gpus=0,  # noqa: E731
                                     free_units=(0, 0), gpu_jobs=((), ()))
    busy = View(whole("v1", "v100"), whole("v2", "v100"), whole("a1", "a100"),
                whole("a2", "a100"),
                NodeView("t1", "t4", ("gpu",), gpus=2, idle_gpus=0, free_units=(63, 0),
                         gpu_jobs=(("s",), ())))
    decision = decide(request(array_tasks=4), mixed, estimate=same, view=busy)
    assert decision.code == "array-queues", decision.reason
    assert decision.writes.keys() == {"admin_comment"}  # the request as submitted
    assert "its 4 array tasks would queue for shares on t4" in decision.reason
    assert decision.details["share_completion"] == 1.75  # 1 now, 3 as the 2 places free
    assert decision.details["whole_completion"] == 1.25  # 4 as 10 GPUs free
    # Two tasks: one starts now, the other soon: they share.
    two = decide(request(array_tasks=2), mixed, estimate=same, view=busy)
    assert two.action == "share" and two.gpu_types == ("t4",), two.reason
    # A single job is not an array: it shares where it starts now.
    assert decide(request(), mixed, estimate=same, view=busy).action == "share"
    # Where the view does not know a node's GPUs, nothing is compared: the array shares.
    unknown = View(*busy.nodes()[:-1], replace(busy.nodes()[-1], gpus=0))
    assert decide(request(array_tasks=4), mixed, estimate=same, view=unknown).code != \
        "array-queues"


def test_queued_completion():
    assert queued_completion(4, 1.0, 4, 0, 1.0) == 1.0  # all start now
    assert queued_completion(4, 1.0, 1, 2, 1.0) == 1.0 + 3 * 4 / 8 / 2
    assert queued_completion(4, 1.0, 0, 0, 1.0) == float("inf")


def test_mean_rounds():
    assert mean_rounds(8, 9) == 1.0
    assert mean_rounds(8, 1) == 4.5
    assert mean_rounds(8, 3) == (3 * 1 + 3 * 2 + 2 * 3) / 8
    assert mean_rounds(4, 0) == float("inf")
