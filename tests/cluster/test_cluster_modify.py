"""`scontrol update` of a share on the real cluster (the hook's slurm_job_modify).

22.05 cannot turn a pending share back into a whole GPU (its gres list keeps the shard entry),
so updates of what the decision rests on are refused, and the share runs as decided."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.cluster

HINT = "--comment=gpushare:mem=3G"


def test_updates_a_share_rests_on_are_refused_and_others_go_through(cluster):
    job_id = cluster.sbatch("--hold", "--gres=gpu:1", HINT, script="#!/bin/sh\nsleep 1\n")
    before = cluster.job(job_id)
    assert before["AdminComment"].startswith("gpushare:v1:share:")
    for update in (["Partition=gpu-excl"], ["TresPerNode=gres/gpu:1", "Features="],
                   ["TresPerNode=gres:gpu:1"], ["ExcNodeList=v100-1"]):
        result = cluster.slurm("scontrol", "update", f"JobId={job_id}", *update, check=False)
        assert result.returncode != 0, update
    after = cluster.job(job_id)
    for field in ("Partition", "TresPerNode", "Features", "ExcNodeList", "AdminComment"):
        assert after.get(field) == before.get(field), field
    cluster.slurm("scontrol", "update", f"JobId={job_id}", "TimeLimit=5")  # not refused
    assert cluster.job(job_id)["TimeLimit"] == "00:05:00"
    cluster.slurm("scontrol", "release", job_id)
    record = cluster.sacct(job_id, "JobID,State,AllocTRES,AdminComment")
    assert record["State"] == "COMPLETED"
    shard = before["TresPerNode"].rsplit(":", 1)[1]
    assert f"gres/shard={shard}" in record["AllocTRES"] and "gres/gpu=" not in record["AllocTRES"]
    log = (cluster.log / "slurmctld.log").read_text()
    assert f"gpushare: update of share job {job_id} refused" in log
