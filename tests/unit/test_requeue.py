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


def test_a_peak_that_fits_no_share_becomes_a_whole_gpu(tmp_path):
    plan = requeuemod.resize(SHARE, 20_000, make_config(tmp_path))  # > a v100's 16 GiB
    assert plan.tres_per_node == "gres:gpu:1" and plan.whole_gpu
    assert not plan.tag.shared and plan.tag.limit_mib is None  # no more overrun reports
    single = requeuemod.resize(Tag("share", "x", "cd34", shard=8, types=("v100",)), 20_000,
                               make_config(tmp_path))
    assert single.tres_per_node == "gres:gpu:v100:1"


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
