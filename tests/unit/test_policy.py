"""policy.decide: the one decision implementation (daemon and simulator)."""

from __future__ import annotations

import pytest

from slurm_gpushare.core.config import ConfigError, parse_config
from slurm_gpushare.core.policy import JobEstimate, decide
from slurm_gpushare.core.types import Decision, JobRequest
from slurm_gpushare.daemon.protocol import parse_comment, parse_request

CONFIG = parse_config({
    "policy": {"sharing_partitions": ["gpu"], "default_share_gib": 8, "first_run": "default-share"},
    "gpu_types": {"v100": {"memory_gib": 16}, "a100": {"memory_gib": 80}},
})


def request(**fields) -> JobRequest:
    base = dict(uid=1000, partition="gpu", tres_per_node="gres:gpu:1")
    base.update(fields)
    return JobRequest(**base)


def test_default_share_on_every_type_that_fits():
    decision = decide(request(), CONFIG, decision_id="abc")
    assert decision.action == "share" and decision.code == "default-share"
    assert decision.writes == {
        "tres_per_node": "gres:shard:8", "features": "v100|a100",
        "admin_comment": "gpushare:v1:share:id=abc:shard=8:types=v100+a100:why=default-share",
    }


def test_history_estimate_sizes_per_type_and_excludes_what_does_not_fit():
    estimate = JobEstimate(source="history", memory_mib={"v100": 17000, "a100": 15000},
                           detail="peak 14 GiB")
    decision = decide(request(), CONFIG, estimate=estimate)
    assert decision.writes["tres_per_node"] == "gres:shard:15"
    assert decision.writes["features"] == "a100"
    assert "excluded v100" in decision.reason


def test_nothing_fits_keeps_a_whole_gpu_and_says_so():
    estimate = JobEstimate(source="history", memory_mib={"v100": 90000, "a100": 90000},
                           detail="peak 85 GiB")
    decision = decide(request(), CONFIG, estimate=estimate, decision_id="d1")
    assert decision.action == "keep" and decision.code == "does-not-fit"
    assert "fits no GPU type" in decision.reason
    # Kept eligible jobs are only tagged, so their telemetry becomes history.
    assert decision.writes == {"admin_comment": "gpushare:v1:keep:id=d1:why=does-not-fit"}


def test_first_run_on_a_whole_gpu_by_default():
    config = parse_config({"policy": {"sharing_partitions": ["gpu"]},
                           "gpu_types": {"v100": {"memory_gib": 16}}})
    decision = decide(request(), config, decision_id="d2")
    assert (decision.action, decision.code) == ("keep", "first-run")
    assert decision.writes == {"admin_comment": "gpushare:v1:keep:id=d2:why=first-run"}
    assert "profiled" in decision.reason
    # A memory hint lets even a first run share.
    hinted = decide(request(mem_hint_mib=4096), config)
    assert hinted.action == "share" and hinted.writes["tres_per_node"] == "gres:shard:5"


def test_unknown_types_in_estimate_are_not_assumed_to_fit():
    estimate = JobEstimate(source="history", memory_mib={"a100": 4000})
    assert decide(request(), CONFIG, estimate=estimate).gpu_types == ("a100",)


@pytest.mark.parametrize("fields,code", [
    ({"tres_per_node": ""}, "no-gpu"),
    ({"tres_per_node": "gres:gpu:2"}, "multi-gpu"),
    ({"tres_per_node": "gres:shard:2"}, "already-shared"),
    ({"tres_per_node": "gres:gpu:1,gres:mps:10"}, "already-shared"),
    ({"tres_per_node": "gres:gpu:x:y:z"}, "unparsable-tres"),
    ({"tres_per_node": "gres:gpu:1", "tres_per_job": "gres:gpu:1"}, "complex-gpu-request"),
    ({"tres_per_node": "", "tres_per_task": "gres:gpu:1"}, "per-task-gpus"),
    ({"min_nodes": 2}, "multi-node"),
    ({"min_nodes": 1, "max_nodes": 2}, "multi-node"),  # -N 1-2: may get two nodes
    ({"tres_freq": "gpu:high"}, "gpu-freq"),  # Slurm refuses a shared gres with it
    ({"tres_freq": "gpu:medium,memory=high"}, "gpu-freq"),
    ({"prefer": "t4"}, "prefer"),  # Slurm tries it in place of the share's types
    ({"exclusive": True}, "exclusive"),
    ({"mem_per_tres": "gres:gpu:4096"}, "per-gpu-options"),
    ({"partition": "cpu"}, "partition-off"),
    ({"partition": ""}, "partition-off"),
    ({"opt_out": True}, "opt-out"),
    ({"het_offset": 1}, "het-job"),
    ({"batch": False}, "allocation"),
])
def test_keep_cases(fields, code):
    decision = decide(request(**fields), CONFIG)
    assert (decision.action, decision.code, dict(decision.writes)) == ("keep", code, {})


def test_unconfigured_type_is_kept_but_tagged():
    decision = decide(request(tres_per_node="gres:gpu:h100:1"), CONFIG, decision_id="d3")
    assert (decision.action, decision.code) == ("keep", "unknown-type")
    assert decision.writes == {"admin_comment": "gpushare:v1:keep:id=d3:why=unknown-type"}


def test_gpus_per_job_moves_per_node():
    decision = decide(request(tres_per_node="gres:nic:1", tres_per_job="gres:gpu:1"), CONFIG)
    assert decision.writes["tres_per_node"] == "gres:shard:8,gres:nic:1"
    assert decision.writes["tres_per_job"] == ""


def test_newer_slurm_prefix_is_kept():
    decision = decide(request(tres_per_node="gres/gpu:1"), CONFIG)
    assert decision.writes["tres_per_node"] == "gres/shard:8"


def test_decisions_are_pure_values():
    first = decide(request(), CONFIG, decision_id="x")
    assert first == decide(request(), CONFIG, decision_id="x")
    with pytest.raises(ValueError):
        Decision(action="keep", reason="", code="x", writes={"tres_per_node": "gres:shard:1"})
    Decision(action="keep", reason="", code="x", writes={"admin_comment": "gpushare:v1:keep:x"})
    with pytest.raises(ValueError):
        Decision(action="share", reason="", code="x", writes={"partition": "debug"})


def test_comment_tokens():
    assert parse_comment("x gpushare=off", "gpushare=off", "gpushare:mem=") == (True, None)
    assert parse_comment("gpushare:mem=1.5G", "gpushare=off", "gpushare:mem=") == (False, 1536)
    assert parse_comment("gpushare:mem=500", "gpushare=off", "gpushare:mem=") == (False, 500)
    assert parse_comment("gpushare:mem=lots", "gpushare=off", "gpushare:mem=") == (False, None)


def test_request_parsing_turns_unset_markers_into_none_and_drops_texts():
    op, parsed = parse_request({"v": 1, "op": "decide", "job": {
        "uid": 5, "min_nodes": 4294967294, "shared": 65534, "time_limit": 4294967294,
        "script": "#!/bin/sh\nsecret", "name": "n", "comment": "c"}},
        digest=lambda kind, text: f"{kind}-digest")
    assert op == "decide"
    assert (parsed.min_nodes, parsed.exclusive, parsed.time_limit_min) == (None, False, None)
    assert (parsed.script_digest, parsed.name_digest) == ("script-digest", "name-digest")
    assert "secret" not in repr(parsed)


@pytest.mark.parametrize("raw,message", [
    ({"policy": {"sharing_partition": ["gpu"]}}, "unknown key"),
    ({"policy": {"default_share_gib": "8"}}, "must be int"),
    ({"gpu_types": {"v100": {}}}, "needs memory_gib"),
    ({"gpu_types": {"v100": {"memory_gib": -1}}}, "positive integer"),
    ({"daemons": {}}, "unknown section"),
    ({"policy": {"first_run": "sometimes"}}, "first_run must be one of"),
])
def test_config_errors_are_specific(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(raw)


def test_generic_job_names_form_no_name_key():
    for name, expected in (("sbatch", ""), ("wrap", ""), ("resnet-sweep", "name-digest")):
        _, parsed = parse_request({"v": 1, "op": "decide", "job": {"uid": 5, "name": name}},
                                  digest=lambda kind, text: f"{kind}-digest")
        assert parsed.name_digest == expected


def test_only_the_script_key_sizes_a_share():
    from slurm_gpushare.predict.history import observed_peaks
    from slurm_gpushare.daemon.fingerprint import Fingerprinter

    keys = Fingerprinter(b"s" * 32).job_keys("alice", script="#!/bin/sh\ntrain\n", name="train")
    assert keys.sizing_keys() == [keys.exact]  # never the name or the user
    run = {"gpu_model": "Tesla V100-SXM2-16GB", "mgmap_max_mib": 9000.0}
    # The most specific key's runs decide; runs that never touched the GPU say nothing.
    assert observed_peaks([{**run, "matched_key": 1, "mgmap_max_mib": 5000.0},
                           {**run, "matched_key": 0}]) == {"Tesla V100-SXM2-16GB": [9000.0]}
    assert observed_peaks([{**run, "matched_key": 0, "mgmap_max_mib": 0}]) == {}


BUDGET_CONFIG = parse_config({
    "policy": {"sharing_partitions": ["gpu"], "default_share_gib": 8, "first_run": "default-share",
               "gpu_time_budget_pct": 100},
    "gpu_types": {"v100": {"memory_gib": 16}, "a100": {"memory_gib": 80}},
})


def test_gpu_time_sizes_the_share_and_picks_the_fastest_type():
    # 7 GiB and 50% of a GPU's time: on an 80 GiB A100 that is 40 shards; the A100 is faster.
    estimate = JobEstimate(source="history", memory_mib={"v100": 7000, "a100": 7400},
                           runtime_s={"v100": 100.0, "a100": 60.0}, util_pct=50.0)
    decision = decide(request(), BUDGET_CONFIG, estimate=estimate)
    assert decision.writes["tres_per_node"] == "gres:shard:40"
    assert decision.gpu_types == ("a100",)  # 40 shards would not fit a 16 GiB V100
    assert "sized by GPU time" in decision.reason and "not offered on v100" in decision.reason
    # Faster on the V100 instead: 8 shards there (50% of 16), and 8 would undercut the A100.
    estimate = JobEstimate(source="history", memory_mib={"v100": 7000, "a100": 7400},
                           runtime_s={"v100": 50.0, "a100": 60.0}, util_pct=50.0)
    decision = decide(request(), BUDGET_CONFIG, estimate=estimate)
    assert (decision.writes["tres_per_node"], decision.gpu_types) == ("gres:shard:8", ("v100",))


def test_memory_bound_jobs_are_offered_on_every_type_that_fits():
    estimate = JobEstimate(source="history", memory_mib={"v100": 12000, "a100": 12000},
                           util_pct=10.0)
    decision = decide(request(), BUDGET_CONFIG, estimate=estimate)
    # 12 GiB dominates 10% of either GPU (2 and 8 shards): one count suits both types.
    assert decision.writes["tres_per_node"] == "gres:shard:12"
    assert set(decision.gpu_types) == {"v100", "a100"}


def test_gpu_time_budget_zero_sizes_by_memory_only():
    config = parse_config({
        "policy": {"sharing_partitions": ["gpu"], "gpu_time_budget_pct": 0},
        "gpu_types": {"a100": {"memory_gib": 80}}})
    estimate = JobEstimate(source="history", memory_mib={"a100": 7400}, util_pct=50.0)
    assert decide(request(), config, estimate=estimate).writes["tres_per_node"] == "gres:shard:8"


def test_mps_types_get_a_percent_share_with_a_memory_limit_in_the_tag():
    config = parse_config({
        "policy": {"sharing_partitions": ["gpu"], "gpu_time_budget_pct": 100},
        "gpu_types": {"t4": {"memory_gib": 16, "sharing": "mps"},
                      "v100": {"memory_gib": 16}}})
    estimate = JobEstimate(source="history", memory_mib={"t4": 4000, "v100": 3900},
                           runtime_s={"t4": 50.0, "v100": 90.0}, util_pct=20.0)
    decision = decide(request(), config, estimate=estimate, decision_id="m1")
    # 4000 MiB of 16 GiB is 25% (more than 20% GPU time): mps:25 on the faster T4 only.
    assert decision.writes["tres_per_node"] == "gres:mps:25"
    assert decision.writes["features"] == "t4"
    assert decision.writes["admin_comment"] == (
        "gpushare:v1:share:id=m1:mps=25:types=t4:mem=4000:why=history-share")
    assert "memory limit 3.9 GiB" in decision.reason and "not offered on v100" in decision.reason
    with pytest.raises(ConfigError, match="sharing must be"):
        parse_config({"gpu_types": {"t4": {"memory_gib": 16, "sharing": "mig"}}})


class FakeView:
    def __init__(self, *nodes):
        self._nodes = nodes

    def nodes(self):
        return self._nodes


class ClassRule:
    """Compatibility as a set of incompatible class pairs."""

    def __init__(self, *bad):
        self.bad = {frozenset(p) for p in bad}

    def compatible(self, a, b, gpu_type=None):
        return frozenset((a, b)) not in self.bad


def test_nodes_with_incompatible_residents_are_excluded():
    from slurm_gpushare.core.policy import NodeView

    view = FakeView(NodeView("a1", "a100", ("gpu",), (2,)), NodeView("a2", "a100", ("gpu",), (0,)),
                    NodeView("v1", "v100", ("gpu",), (2, 2)), NodeView("v2", "v100", ("gpu",), ()))
    estimate = JobEstimate(source="history", memory_mib={"v100": 4000, "a100": 4000},
                           job_class=2, detail="peak 3.8 GiB")
    decision = decide(request(exc_nodes="old[1-2]"), CONFIG, estimate=estimate, view=view,
                      knowledge=ClassRule((2, 2)))
    assert decision.writes["exc_nodes"] == "old[1-2],a1,v1"  # the user's own list is kept
    assert "away from a1, v1" in decision.reason
    assert ":class=2:" in decision.writes["admin_comment"]


def test_no_exclusion_when_every_candidate_node_interferes():
    from slurm_gpushare.core.policy import NodeView

    view = FakeView(NodeView("a1", "a100", ("gpu",), (2,)), NodeView("v1", "v100", ("gpu",), (2,)))
    estimate = JobEstimate(source="history", memory_mib={"v100": 4000, "a100": 4000}, job_class=2)
    decision = decide(request(), CONFIG, estimate=estimate, view=view, knowledge=ClassRule((2, 2)))
    assert "exc_nodes" not in decision.writes  # excluding all would only make it wait


def test_resident_classes_come_from_running_shares():
    from slurm_gpushare.daemon.clusterview import parse_running

    tag = "gpushare:v1:share:id=ab12:shard=8:types=a100:class={}:why=history"
    squeue = "\n".join([
        "101|a100-1|gres:shard:8|" + tag.format(1),
        "102|a100-1|gres/shard:44,gres/nic:1|" + tag.format(2),
        "103|t4-1|gres:mps:25|" + tag.format(0) + " | and free text",
        "104|v100-1|gres:gpu:1|(null)",          # a whole GPU: not a share
        "105|a100-[1-2]|gres:shard:8|(null)",    # several nodes: not a share
        "106|a100-2|gres:shard:8|(null)",        # a share of unknown class
        "garbage line",
    ])
    running = {line.split("|")[0]: parse_running(line) for line in squeue.splitlines()}
    shares = {job: r for job, r in running.items() if r and r.shared}
    assert {job: r.nodes for job, r in shares.items()} == {
        "101": ("a100-1",), "102": ("a100-1",), "103": ("t4-1",), "106": ("a100-2",)}
    classes = {job: r.share_class for job, r in shares.items()}
    assert classes == {"101": 1, "102": 2, "103": None, "106": None}  # 103: not a tag
    assert running["104"].gpus == 1 and running["105"].nodes == ("a100-1", "a100-2")
    assert running["garbage line"] is None


def test_a_node_with_a_clean_gpu_is_not_excluded():
    from slurm_gpushare.core.policy import NodeView

    estimate = JobEstimate(source="history", memory_mib={"v100": 4000, "a100": 4000}, job_class=2)
    rule = ClassRule((2, 2))
    # Per-GPU view (the simulator): a1 has a GPU without class 2, a2 has class 2 on both.
    view = FakeView(NodeView("a1", "a100", ("gpu",), (2,), gpus=2, gpu_classes=((2,), ())),
                    NodeView("a2", "a100", ("gpu",), (2,), gpus=2, gpu_classes=((2,), (2, 0))),
                    NodeView("v1", "v100", ("gpu",), (), gpus=2))
    decision = decide(request(), CONFIG, estimate=estimate, view=view, knowledge=rule)
    assert decision.writes["exc_nodes"] == "a2"
    # Node-level view (the daemon: squeue has no GPU index): excluded once the incompatible
    # shares are at least as many as the node's GPUs.
    view = FakeView(NodeView("a1", "a100", ("gpu",), (2,), gpus=2),
                    NodeView("a2", "a100", ("gpu",), (2, 2), gpus=2),
                    NodeView("v1", "v100", ("gpu",), (), gpus=2))
    decision = decide(request(), CONFIG, estimate=estimate, view=view, knowledge=rule)
    assert decision.writes["exc_nodes"] == "a2"


def test_a_job_known_only_by_its_name_has_no_sizing_history():
    """A name says nothing about the work (issue: sized from another job): no key, no history."""
    from slurm_gpushare.daemon.fingerprint import Fingerprinter
    from slurm_gpushare.daemon.store import Store

    keys = Fingerprinter(b"s" * 32).job_keys("alice", script="", name="train")
    assert keys.sizing_keys() == []
    with Store(":memory:") as store:
        store.ingest_summary({"v": 1, "job_id": "1", "gpu_index": 0, "mgup_max": 50.0,
                              "mgmap_max_pct": 20.0, "mgtsamp_max": 10.0, "keys": [keys.name]})
        assert store.history(keys.sizing_keys()) == []


def test_a_share_of_the_whole_gpu_still_keeps_the_job_off_types_it_does_not_fit():
    # 15 GiB fills a 16 GiB GPU but not a 12 GiB one: kept as submitted, the job could land on
    # the 12 GiB type and run out of memory; the share keeps it on the types it fits.
    config = parse_config({
        "policy": {"sharing_partitions": ["gpu"], "keep_whole_when_idle": False},
        "gpu_types": {"v100": {"memory_gib": 16}, "p100": {"memory_gib": 16},
                      "k80": {"memory_gib": 12}}})
    estimate = JobEstimate(source="history",
                           memory_mib={"v100": 15500, "p100": 15500, "k80": 15500})
    decision = decide(request(), config, estimate=estimate)
    assert decision.action == "share"
    assert decision.writes["tres_per_node"] == "gres:shard:16"
    assert set(decision.gpu_types) == {"v100", "p100"}
    assert "k80" not in decision.writes["features"] and "v100" in decision.writes["features"]
    assert "excluded k80 (does not fit)" in decision.reason


def test_a_type_that_needs_more_memory_does_not_narrow_the_offer_to_itself():
    # openb's reading of gpu_milli: a job that fills a 16 GiB GPU is predicted to fill a
    # 32 GiB one too. One count of GiB cannot mean "all of it" on both, but a 16 GiB share
    # suits both 16 GiB types: the offer must not shrink to the 32 GiB type alone (which made
    # most such jobs wait for the few 32 GiB GPUs).
    config = parse_config({
        "policy": {"sharing_partitions": ["gpu"], "keep_whole_when_idle": False},
        "gpu_types": {"t4": {"memory_gib": 16}, "g2": {"memory_gib": 16},
                      "v100m32": {"memory_gib": 32}}})
    estimate = JobEstimate(source="history",
                           memory_mib={"t4": 16384, "g2": 16384, "v100m32": 32768})
    decision = decide(request(), config, estimate=estimate)
    # A share that fills the GPU wherever it is offered is a whole GPU: kept as submitted
    # (it may then run on any type, the 32 GiB one included).
    assert (decision.action, decision.code) == ("keep", "whole-share")
    assert "takes the whole GPU on t4, g2" in decision.reason
    estimate = JobEstimate(source="history",
                           memory_mib={"t4": 15000, "g2": 15000, "v100m32": 30000})
    decision = decide(request(), config, estimate=estimate)
    assert decision.writes["tres_per_node"] == "gres:shard:15"
    assert set(decision.gpu_types) == {"t4", "g2"}
    # Where one count suits every type, it is still offered on all of them.
    estimate = JobEstimate(source="history",
                           memory_mib={"t4": 9000, "g2": 9000, "v100m32": 9500})
    decision = decide(request(), config, estimate=estimate)
    assert decision.writes["tres_per_node"] == "gres:shard:10"
    assert set(decision.gpu_types) == {"t4", "g2", "v100m32"}
    # A count twice the need on a type is not offered there: 8 GiB on the 16 GiB types.
    estimate = JobEstimate(source="history",
                           memory_mib={"t4": 8192, "g2": 8192, "v100m32": 16384})
    decision = decide(request(), config, estimate=estimate)
    assert decision.writes["tres_per_node"] == "gres:shard:8"
    assert set(decision.gpu_types) == {"t4", "g2"}


@pytest.mark.parametrize("array_inx,tasks", [
    ("", None), ("0-7", 8), ("1,3,5", 3), ("0-15:4", 4), ("1-3,5-6", 5), ("0-15%4", 4),
    ("0-1%8", 2), ("7", 1), ("0-999999", 1000000),
    ("x-y", 1000000), ("5-1", 1000000),  # unreadable: as many as Slurm allows
])
def test_array_tasks_counts_what_may_run_at_once(array_inx, tasks):
    _, parsed = parse_request({"v": 1, "op": "decide", "job": {
        "uid": 5, "partition": "gpu", "tres_per_node": "gres:gpu:1", "array_inx": array_inx}})
    assert parsed.array is bool(array_inx)
    assert parsed.array_tasks == tasks
