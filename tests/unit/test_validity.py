"""A decision is written only if it is valid for this cluster; a reload that would make
invalid ones is refused."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import RunningDaemon, make_config
from slurm_gpushare.core.config import GpuType
from slurm_gpushare.core.policy import NodeView
from slurm_gpushare.daemon.protocol import request as request_once
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.core.types import Decision, JobRequest
from slurm_gpushare.daemon.validity import config_problem, decision_problem

JOB = {"uid": 1000, "user": "alice", "partition": "gpu", "tres_per_node": "gres:gpu:1",
       "min_nodes": 4294967294, "shared": 65534, "batch": True}


class View:
    def __init__(self, *nodes):
        self._nodes = nodes

    def nodes(self):
        return self._nodes


def test_a_feature_no_node_has_keeps_the_job_as_submitted(tmp_path):
    config = make_config(tmp_path)
    # The TOML says a100 nodes carry feature "a100", but the cluster's nodes say "A100".
    view = View(NodeView("a1", "a100", ("gpu",), features=("A100",)),
                NodeView("v1", "v100", ("gpu",), features=("v100",)))
    running = RunningDaemon(config)
    running.service.view = view
    try:
        reply = request_once(config.daemon.socket, {"v": 1, "op": "decide", "rid": 1,
                                                    "job": {**JOB, "tres_per_node":
                                                            "gres:gpu:a100:1"}})
        decision = reply["decision"]
        assert decision["action"] == "keep" and decision["code"] == "invalid-decision"
        assert decision["writes"] == {} and "a100" in decision["reason"]
        # A type whose feature is real still shares.
        ok = request_once(config.daemon.socket, {"v": 1, "op": "decide", "rid": 2,
                                                 "job": {**JOB, "tres_per_node":
                                                         "gres:gpu:v100:1"}})
        assert ok["decision"]["action"] == "share"
        running.service.records.flush()
        assert [d["action"] for d in running.store.decisions()] == ["share"]
    finally:
        running.stop()


@pytest.mark.parametrize("tres,tag,problem", [
    ("gres:shard:0", True, "outside 1..16"),
    ("gres:shard:17", True, "outside 1..16"),
    ("gres:shard:8", False, "without its tag"),
    ("gres:shard:8,gres:shard:2", True, "exactly one"),
])
def test_counts_and_tags_are_checked(tmp_path, tres, tag, problem):
    config = make_config(tmp_path)
    writes = {"tres_per_node": tres}
    if tag:
        writes["admin_comment"] = Tag("share", "history", "ab12", shard=8,
                                      types=("v100",)).encode()
    decision = Decision(action="share", reason="r", code="history", writes=writes,
                        gpu_types=("v100",))
    request = JobRequest(uid=1000, partition="gpu")
    assert problem in decision_problem(decision, request, config, ())


@pytest.mark.parametrize("change,problem", [
    (lambda c: replace(c, gpu_types=(GpuType("a100", 80, feature="a10O"),)), "a10O"),
    (lambda c: replace(c, policy=replace(c.policy, sharing_partitions=("gpuu",))), "gpuu"),
])
def test_reload_that_would_make_invalid_decisions_is_refused(tmp_path, change, problem):
    config = change(make_config(tmp_path))
    found = config_problem(config, frozenset({"a100", "v100", "ib"}), frozenset({"gpu", "cpu"}))
    assert found and problem in found
    assert config_problem(make_config(tmp_path), frozenset({"a100", "v100"}),
                          frozenset({"gpu"})) is None
