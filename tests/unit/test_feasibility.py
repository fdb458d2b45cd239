"""Rewrites only where Slurm can place them (core/feasibility.py through policy.decide).

Each case is one of issue 12's reproductions on 22.05.8: a rewrite naming a type outside the
job's partition, excluded or drained nodes, a --constraint or --nodelist ignored.
"""

from __future__ import annotations

import pytest

from slurm_gpushare.core import feasibility
from slurm_gpushare.core.config import GpuType, parse_config
from slurm_gpushare.core.policy import JobEstimate, NodeView, decide
from slurm_gpushare.core.types import JobRequest
from slurm_gpushare.daemon.fingerprint import Fingerprinter
from slurm_gpushare.daemon.protocol import parse_request

CONFIG = parse_config({
    "policy": {"sharing_partitions": ["gpu", "v100only"], "first_run": "whole-gpu"},
    "gpu_types": {"v100": {"memory_gib": 16}, "a100": {"memory_gib": 80}},
})
# History says: fits both types, a100 is faster.
FITS_BOTH = JobEstimate(source="history", memory_mib={"v100": 6000, "a100": 6000},
                        runtime_s={"v100": 200.0, "a100": 100.0}, detail="peak 5.9 GiB")
A100_ONLY = JobEstimate(source="history", memory_mib={"a100": 30000}, detail="peak 29 GiB",
                        excluded={"v100": "too small"})


class View:
    def __init__(self, *nodes, reservations=None):
        self._nodes = nodes
        self._reservations = reservations or {}

    def nodes(self):
        return self._nodes

    def reservations(self):
        return self._reservations


def node(name, gpu_type, partitions=("gpu",), state="idle", extra=()):
    return NodeView(name, gpu_type, partitions, (), gpus=2,
                    features=(gpu_type, f"gpumem{16 if gpu_type == 'v100' else 80}g", *extra),
                    state=state)


CLUSTER = View(node("v100-1", "v100", ("gpu", "v100only")), node("v100-2", "v100", ("gpu", "v100only")),
               node("a100-1", "a100"), node("a100-2", "a100", extra=("ib",)))


def job(**fields) -> JobRequest:
    base = dict(uid=1000, partition="gpu", tres_per_node="gres:gpu:1")
    base.update(fields)
    return JobRequest(**base)


def test_partition_without_the_fastest_type_gets_the_type_it_has():
    decision = decide(job(partition="v100only"), CONFIG, estimate=FITS_BOTH, view=CLUSTER)
    assert decision.action == "share"
    assert decision.writes["features"] == "v100"
    assert "a100 (no usable node: partition)" in decision.reason


def test_partition_without_any_fitting_type_keeps_the_job():
    decision = decide(job(partition="v100only"), CONFIG, estimate=A100_ONLY, view=CLUSTER,
                      decision_id="d1")
    assert (decision.action, decision.code) == ("keep", "no-valid-type")
    assert decision.writes == {"admin_comment": "gpushare:v1:keep:id=d1:why=no-valid-type"}


def test_excluded_nodes_are_not_named():
    decision = decide(job(exc_nodes="a100-[1-2]"), CONFIG, estimate=FITS_BOTH, view=CLUSTER)
    assert decision.writes["features"] == "v100"
    assert "exc_nodes" not in decision.writes  # the user's list stays as it was
    kept = decide(job(exc_nodes="a100-1,a100-2"), CONFIG, estimate=A100_ONLY, view=CLUSTER)
    assert kept.code == "no-valid-type"


def test_user_constraint_limits_the_types():
    decision = decide(job(features="v100"), CONFIG, estimate=FITS_BOTH, view=CLUSTER)
    assert decision.writes["features"] == "v100&v100"  # never v100&a100
    kept = decide(job(features="v100"), CONFIG, estimate=A100_ONLY, view=CLUSTER)
    assert kept.code == "no-valid-type"
    ib = decide(job(features="ib"), CONFIG, estimate=FITS_BOTH, view=CLUSTER)
    assert ib.writes["features"] == "ib&a100"


def test_matching_or_and_counts_of_one_are_evaluated_for_one_node():
    decision = decide(job(features="[v100|ib]&gpumem16g*1"), CONFIG, estimate=FITS_BOTH,
                      view=CLUSTER)
    assert decision.writes["features"] == "(v100|ib)&gpumem16g&v100"


@pytest.mark.parametrize("constraint", ["v100*2", "v100&ib|a100", "v100,a100", "v100!", "(v100",
                                        "v100)", "&v100", "v100|"])
def test_constraints_that_cannot_be_evaluated_keep_the_job(constraint):
    decision = decide(job(features=constraint), CONFIG, estimate=FITS_BOTH, view=CLUSTER)
    assert (decision.action, decision.code) == ("keep", "constraint-unsupported")
    assert set(decision.writes) == {"admin_comment"}


def test_nodelist_limits_the_types_and_must_be_usable():
    decision = decide(job(req_nodes="v100-1"), CONFIG, estimate=FITS_BOTH, view=CLUSTER)
    assert decision.writes["features"] == "v100"
    kept = decide(job(req_nodes="v100-1"), CONFIG, estimate=A100_ONLY, view=CLUSTER)
    assert kept.code == "no-valid-type" and "v100-1 (type)" in kept.reason
    unknown = decide(job(req_nodes="cpu-1"), CONFIG, estimate=FITS_BOTH, view=CLUSTER)
    assert unknown.code == "no-valid-type"


def test_nodes_that_take_no_jobs_are_not_candidates():
    drained = View(node("v100-1", "v100"), node("a100-1", "a100", state="drain"),
                   node("a100-2", "a100", state="idle*"))
    decision = decide(job(), CONFIG, estimate=FITS_BOTH, view=drained)
    assert decision.writes["features"] == "v100"
    assert "a100 (no usable node: state)" in decision.reason
    assert decide(job(), CONFIG, estimate=A100_ONLY, view=drained).code == "no-valid-type"
    mixed = View(node("a100-1", "a100", state="plnd"), node("a100-2", "a100", state="idle~"))
    assert decide(job(), CONFIG, estimate=A100_ONLY, view=mixed).action == "share"


def test_reservations_limit_the_nodes_and_unknown_ones_keep_the_job():
    view = View(node("v100-1", "v100", state="resv"), node("a100-1", "a100"),
                reservations={"course": ("v100-1",)})
    inside = decide(job(reservation="course"), CONFIG, estimate=FITS_BOTH, view=view)
    assert inside.writes["features"] == "v100"
    outside = decide(job(), CONFIG, estimate=FITS_BOTH, view=view)
    assert outside.writes["features"] == "a100"  # reserved nodes take no other jobs
    unknown = decide(job(reservation="other"), CONFIG, estimate=FITS_BOTH, view=view)
    assert unknown.code == "not-checkable"


def test_a_view_that_knows_no_nodes_yet_keeps_the_job():
    decision = decide(job(), CONFIG, estimate=FITS_BOTH, view=View())
    assert (decision.action, decision.code) == ("keep", "not-checkable")


def test_constraint_grammar_round_trip():
    expr = feasibility.parse_constraint("a&(b|c)&[d|e]")
    assert feasibility.render(expr) == "a&(b|c)&(d|e)"
    assert feasibility.satisfies(expr, {"a", "c", "e"})
    assert not feasibility.satisfies(expr, {"a", "c"})
    assert feasibility.parse_constraint("  ") is None


# --- forms of submission -------------------------------------------------------------------

def test_allocations_without_a_script_keep_their_gpu():
    _, srun = parse_request({"v": 1, "op": "decide", "job": {
        "uid": 1000, "partition": "gpu", "tres_per_node": "gres:gpu:1", "name": "train"}})
    assert srun.batch is False
    decision = decide(srun, CONFIG, estimate=FITS_BOTH, view=CLUSTER)
    assert (decision.action, decision.code, dict(decision.writes)) == ("keep", "allocation", {})


def test_scripts_whose_steps_ask_for_gpus_keep_a_whole_gpu():
    script = "#!/bin/sh\nsrun --gres=gpu:1 python train.py\n"
    _, batch = parse_request({"v": 1, "op": "decide", "job": {
        "uid": 1000, "partition": "gpu", "tres_per_node": "gres:gpu:1", "script": script}})
    assert batch.batch and batch.steps_ask_gpus
    assert decide(batch, CONFIG, estimate=FITS_BOTH, view=CLUSTER).code == "steps-need-gpu"
    plain = "#!/bin/sh\nsrun python train.py  # --gres=gpu:1 in a comment\n"
    _, ok = parse_request({"v": 1, "op": "decide", "job": {
        "uid": 1000, "partition": "gpu", "tres_per_node": "gres:gpu:1", "script": plain}})
    assert not ok.steps_ask_gpus


def test_steps_asking_for_gpus_on_continued_lines_are_seen():
    """A step's options are often on the lines after ``srun \\``: the shell reads one command."""
    from slurm_gpushare.daemon.protocol import steps_ask_for_gpus

    assert steps_ask_for_gpus("#!/bin/bash\nsrun --ntasks=1 \\\n     --gres=gpu:1 python t.py\n")
    assert steps_ask_for_gpus("#!/bin/bash\nsrun \\\r\n  -G 1 python t.py\n")
    assert steps_ask_for_gpus("#!/bin/sh\nexport X=1; srun --gpus=1 python t.py\n")
    assert not steps_ask_for_gpus("#!/bin/sh\nsrun python t.py \\\n  --epochs 3\n")
    # Per-GPU options of a step need GPUs in the job: in a share's job srun refuses the step
    # ("Unable to create step ...: Invalid generic resource (gres) specification", seen).
    for option in ("--cpus-per-gpu=2", "--mem-per-gpu 8G", "--ntasks-per-gpu=1",
                   "--tres-per-task=gres/gpu:1"):
        assert steps_ask_for_gpus(f"#!/bin/sh\nsrun -n1 {option} python t.py\n"), option
    assert not steps_ask_for_gpus("#!/bin/sh\nsrun --cpus-per-task=2 --mem=8G python t.py\n")
    assert not steps_ask_for_gpus("#!/bin/sh\n# srun --gres=gpu:1\npython t.py\n")
    assert not steps_ask_for_gpus("#!/bin/sh\n" + "echo a line of a long job script\n" * 2000)


def test_het_components_are_left_alone():
    _, component = parse_request({"v": 1, "op": "decide", "job": {
        "uid": 1000, "partition": "gpu", "tres_per_node": "gres:gpu:1", "script": "#!/bin/sh\n",
        "het_job_offset": 1}})
    assert decide(component, CONFIG, estimate=FITS_BOTH, view=CLUSTER).code == "het-job"


# --- history is the job's own ---------------------------------------------------------------

def _keys(fp, job_fields):
    _, request = parse_request({"v": 1, "op": "decide", "job": {
        "uid": 1000, "user": "alice", "partition": "gpu", "tres_per_node": "gres:gpu:1",
        "script": "#!/bin/sh\npython argmem.py \"$1\"\n", **job_fields}}, digest=fp.digest)
    return fp.keys_from_digests("alice", request.script_digest, request.name_digest,
                                request.args_digest)


def test_the_same_script_with_other_arguments_is_other_work():
    fp = Fingerprinter(b"k" * 32)
    small = _keys(fp, {"argv": ["argmem.sh", "2000"]})
    large = _keys(fp, {"argv": ["./argmem.sh", "40000"]})
    again = _keys(fp, {"argv": ["/home/alice/argmem.sh", "2000"]})  # path as typed differs
    assert small.exact != large.exact
    assert small.exact == again.exact
    assert _keys(fp, {}).exact not in (small.exact, large.exact)


def test_a_job_name_never_sizes_a_share():
    fp = Fingerprinter(b"k" * 32)
    keys = fp.job_keys("alice", script="", name="train")
    assert keys.name and keys.sizing_keys() == []
    with_script = fp.job_keys("alice", script="#!/bin/sh\ntrain\n", name="train")
    assert with_script.sizing_keys() == [with_script.exact]


# --- the daemon's view carries what the check needs (one sinfo call) ------------------------

def test_sinfo_lines_give_features_states_and_every_partition():
    from slurm_gpushare.daemon.clusterview import parse_reservations, parse_sinfo_nodes

    out = ("a100-1|a100,gpumem80g,ib|gpu*|gpu:a100:2,shard:a100:160|mix\n"
           "a100-1|a100,gpumem80g,ib|gpu-excl|gpu:a100:2,shard:a100:160|mix\n"
           "v100-1|v100,gpumem16g|v100only|gpu:v100:2(S:0),shard:v100:32|drain\n"
           "cpu-1|(null)|cpu|(null)|idle\n")
    nodes = parse_sinfo_nodes(out, CONFIG)
    assert nodes["a100-1"].partitions == ("gpu", "gpu-excl")
    assert nodes["a100-1"].features == ("a100", "gpumem80g", "ib")
    assert (nodes["v100-1"].gpu_type, nodes["v100-1"].gpus, nodes["v100-1"].state) == ("v100", 2, "drain")
    assert nodes["cpu-1"].gpu_type == "" and nodes["cpu-1"].features == ()
    res = parse_reservations(
        "ReservationName=course StartTime=2026-11-23T08:00:00 Nodes=v100-[1-2] NodeCnt=2\n"
        "ReservationName=empty Nodes=(null) NodeCnt=0\n")
    assert res == {"course": ("v100-1", "v100-2"), "empty": ()}


def test_a_daemon_snapshot_answers_each_kind_of_request_once():
    """The daemon's snapshots never change: a second job asking for the same placement gets
    the first one's answer without another scan of the nodes."""
    from slurm_gpushare.daemon.clusterview import Snapshot

    class CountingView:
        def __init__(self, nodes):
            self.snapshot, self.calls = Snapshot(nodes), 0

        def nodes(self):
            self.calls += 1
            return self.snapshot

        def reservations(self):
            return {}

    view = CountingView([NodeView("a1", "a100", ("gpu",), gpus=2, features=("a100",)),
                         NodeView("v1", "v100", ("gpu",), gpus=2, features=("v100",))])
    fits = [GpuType("a100", 80), GpuType("v100", 16)]
    first = feasibility.check(JobRequest(uid=1, partition="gpu", exc_nodes="v1"), fits, view)
    second = feasibility.check(JobRequest(uid=2, partition="gpu", exc_nodes="v1"), fits, view)
    assert first is second and first.types == ("a100",)
    other = feasibility.check(JobRequest(uid=3, partition="gpu"), fits, view)
    assert set(other.types) == {"a100", "v100"}
