"""The AdminComment tag codec: what decide() writes reads back as the same decision."""

from __future__ import annotations

import pytest

from slurm_gpushare.core.config import parse_config
from slurm_gpushare.core.policy import JobEstimate, decide
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.core.types import JobRequest

CONFIG = parse_config({
    "policy": {"sharing_partitions": ["gpu", "mps"], "default_share_gib": 8,
               "first_run": "whole-gpu"},
    "gpu_types": {"v100": {"memory_gib": 16}, "a100": {"memory_gib": 80},
                  "t4": {"memory_gib": 16, "sharing": "mps"}},
})


def _request(**fields) -> JobRequest:
    return JobRequest(**{"uid": 1000, "partition": "gpu", "tres_per_node": "gres:gpu:1", **fields})


@pytest.mark.parametrize("request_, estimate", [
    (_request(), JobEstimate(source="history", memory_mib={"v100": 6000, "a100": 7000},
                             detail="peak", job_class=2)),
    (_request(), JobEstimate(source="history", memory_mib={"t4": 5000}, detail="peak")),
    (_request(mem_hint_mib=20_000), None),
    (_request(), None),  # first run: kept, tagged
    (_request(partition="elsewhere"), None),  # not a sharing partition: no tag at all
])
def test_decisions_round_trip_through_their_tag(request_, estimate):
    decision = decide(request_, CONFIG, estimate=estimate, decision_id="0a1b2c3d")
    text = decision.writes.get("admin_comment")
    if text is None:
        assert decision.action == "keep"
        return
    tag = Tag.decode(text)
    assert tag is not None and tag.encode() == text
    assert (tag.action, tag.why, tag.decision_id) == (decision.action, decision.code, "0a1b2c3d")
    if decision.action == "share":
        assert tag.types == decision.gpu_types
        if tag.shard is not None:
            assert tag.shard == decision.share_gib and tag.limit_mib == tag.shard * 1024
        else:
            assert tag.mps is not None and tag.mem_mib is not None
            assert tag.limit_mib == tag.mem_mib
        if estimate is not None:
            assert tag.job_class == estimate.job_class


@pytest.mark.parametrize("text", [
    "", "someone else's note", "gpushare:v1:maybe:id=1:why=x", "gpushare:v1:share:id=1;rm:why=x",
    "gpushare:v1:share:id=1:shard=22:why=ok extra words",
])
def test_anything_else_is_not_a_tag(text):
    assert Tag.decode(text) is None


def test_unknown_fields_of_a_newer_writer_are_kept():
    tag = Tag.decode("gpushare:v1:share:id=ab:shard=4:types=a100:prio=7:why=history-share")
    assert tag.shard == 4 and tag.extra == {"prio": "7"}
    assert Tag.decode(tag.encode()) == tag


def test_a_tag_names_another_decision_without_being_decoded():
    tag = Tag("share", "history-share", "d1", shard=8, types=("v100", "a100"), job_class=1)
    renamed = Tag.with_id(tag.encode(), "d1", "d2")
    assert Tag.decode(renamed) == Tag("share", "history-share", "d2", shard=8,
                                      types=("v100", "a100"), job_class=1)
    assert Tag.with_id(tag.encode(), "d9", "d2") is None  # not this decision's tag
    assert Tag.with_id(tag.encode(), "", "d2") is None
    assert Tag.with_id("something else :id=d1:", "d1", "d2") is None
