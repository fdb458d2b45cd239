"""A share that outgrew its memory is requeued re-sized on the real cluster: held, its
TresPerNode and tag updated, released (requeue does not run the hook again)."""

from __future__ import annotations

from slurm_gpushare.core.config import load_config
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.daemon.requeue import requeue_resized
from slurm_gpushare.slurm.jobs import lookup_job


def test_a_running_share_is_requeued_with_its_peak_plus_margin(cluster, monkeypatch):
    for name, value in cluster.client_environ().items():  # SLURM_CONF (and PATH for 24.11)
        monkeypatch.setenv(name, value)
    job_id = cluster.sbatch("--gres=gpu:1", "--comment=gpushare:mem=4G", "-p", "gpu",
                            script="#!/bin/sh\nsleep 120\n")
    try:
        cluster.wait_state(job_id, {"RUNNING"}, 90)
        job = lookup_job(job_id)
        assert job.tag and job.tag.shared and job.restarts == 0
        done, detail = requeue_resized(job, 9_000, load_config(cluster.daemon_config))
        assert done, detail
        after = cluster.job(job_id)
        # 9,000 MiB x 1.1 -> 10 GiB: a share of 10 shards, its tag saying so.
        assert after["TresPerNode"] == f"{cluster.gres_prefix}shard:10" and after["Restarts"] == "1"
        tag = Tag.decode(after["AdminComment"])
        assert tag.shard == 10 and tag.why == "requeue-resized"
        assert tag.decision_id == job.tag.decision_id
        # The old run is still completing, or the job waits for its next run: not held.
        assert after["JobState"] in ("COMPLETING", "PENDING", "RUNNING")
        assert after.get("Reason") != "JobHeldAdmin" and after.get("Priority") != "0"
    finally:
        cluster.slurm("scancel", job_id, check=False)
