"""A share requeued for going above its memory comes back re-sized, a bounded number of times."""

from __future__ import annotations

import pytest

from conftest import make_config
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.daemon import requeue as requeuemod
from slurm_gpushare.slurm.cmd import Result
from slurm_gpushare.slurm.jobs import SlurmJob

SHARE = Tag("share", "history", "ab12", shard=8, types=("v100", "a100"), job_class=2)


def test_a_share_is_resized_to_its_peak_plus_margin(tmp_path):
    plan = requeuemod.resize(SHARE, 11_000, make_config(tmp_path))  # 10.7 GiB x 1.1 -> 12
    assert plan.tres_per_node == "gres:shard:12" and not plan.whole_gpu
    assert plan.tag.shard == 12 and plan.tag.decision_id == "ab12" and plan.tag.shared


def test_a_peak_that_outgrew_the_smallest_type_moves_to_the_types_that_hold_it(tmp_path):
    """Slurm 22.05 refuses TresPerNode=gres:gpu:1 for a queued share (tests/cluster): the share
    stays a share, re-sized, on the types whose GPUs hold it, the user's constraint kept."""
    config = make_config(tmp_path)
    plan = requeuemod.resize(SHARE, 20_000, config, "v100|a100")  # 22 GiB > a v100's 16
    assert plan.tres_per_node == "gres:shard:22" and not plan.whole_gpu
    assert plan.features == "a100" and plan.tag.types == ("a100",) and plan.tag.shard == 22
    user = requeuemod.resize(SHARE, 20_000, config, "ib&(v100|a100)")
    assert user.features == "ib&a100"
    # A constraint changed since the decision: not guessed at.
    assert "constraint" in requeuemod.resize(SHARE, 20_000, config, "ib")


def test_a_peak_no_share_holds_gets_all_of_the_largest_gpu(tmp_path):
    config = make_config(tmp_path)
    plan = requeuemod.resize(SHARE, 100_000, config, "v100|a100")  # 107 GiB > an a100's 80
    assert plan.tres_per_node == "gres:shard:80" and plan.whole_gpu and plan.features == "a100"
    assert not plan.tag.shared and plan.tag.limit_mib is None  # no more overrun reports
    mps = requeuemod.resize(Tag("share", "x", "cd34", mps=40, mem_mib=6000, types=("a100",)),
                            9_000, config, "a100")
    assert mps.tres_per_node == "gres:mps:100" and mps.whole_gpu and mps.features is None
    assert not mps.tag.shared


@pytest.mark.parametrize("restarts,expected", [(0, True), (1, True), (2, False)])
def test_requeue_is_held_updated_released_and_bounded(tmp_path, monkeypatch, restarts, expected):
    calls = []
    monkeypatch.setattr(requeuemod.cmd, "run",
                        lambda argv, **kw: calls.append(argv) or Result(tuple(argv), 0, "", ""))
    job = SlurmJob("77", 1000, SHARE.encode(), "RUNNING", "n1", restarts=restarts)
    done, detail = requeuemod.requeue_resized(job, 11_000, make_config(tmp_path))
    assert done is expected
    if expected:
        assert [c[:2] for c in calls] == [["scontrol", "requeuehold"], ["scontrol", "update"],
                                          ["scontrol", "release"]]
        assert "TresPerNode=gres:shard:12" in calls[1]
        assert Tag.decode(calls[1][-1].split("=", 1)[1]).shard == 12
    else:
        assert calls == [] and "max_requeues" in detail
