"""A share that outgrew its memory is requeued re-sized on the real cluster: held, its
TresPerNode and tag updated, released (requeue does not run the hook again)."""

from __future__ import annotations

from contextlib import contextmanager

from slurm_gpushare.core.config import load_config
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.daemon.requeue import requeue_resized
from slurm_gpushare.slurm.jobs import lookup_job


@contextmanager
def running_share(cluster, monkeypatch):
    """A job the hook shared (a 4 GiB hint), running; cancelled after."""
    for name, value in cluster.client_environ().items():  # SLURM_CONF (and PATH for 24.11)
        monkeypatch.setenv(name, value)
    job_id = cluster.sbatch("--gres=gpu:1", "--comment=gpushare:mem=4G", "-p", "gpu",
                            script="#!/bin/sh\nsleep 120\n")
    try:
        cluster.wait_state(job_id, {"RUNNING"}, 90)
        yield job_id
    finally:
        cluster.slurm("scancel", job_id, check=False)


def test_a_running_share_is_requeued_with_its_peak_plus_margin(cluster, monkeypatch):
    with running_share(cluster, monkeypatch) as job_id:
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


def test_a_share_that_outgrew_its_smallest_type_moves_to_the_types_that_hold_it(cluster,
                                                                               monkeypatch):
    """Slurm 22.05 refuses to turn a pending share back into a whole GPU (``scontrol update
    TresPerNode=gres:gpu:1``: "Invalid generic resource specification"; the job's shards stay
    in its request): a share whose peak outgrew a 16 GiB v100 is re-sized as a share, on the
    types whose GPUs hold it (a100), where it queues for its next run."""
    with running_share(cluster, monkeypatch) as job_id:
        job = lookup_job(job_id)
        assert job.tag and job.tag.shared and set(job.tag.types) >= {"v100", "a100"}
        done, detail = requeue_resized(job, 20_000, load_config(cluster.daemon_config))
        assert done, detail
        after = cluster.job(job_id)
        # 20,000 MiB x 1.1 -> 22 GiB: more than a v100 holds, a share of 22 on the a100s.
        assert after["TresPerNode"] == f"{cluster.gres_prefix}shard:22", after
        assert "v100" not in after["Features"] and "a100" in after["Features"], after
        tag = Tag.decode(after["AdminComment"])
        assert tag.shard == 22 and tag.types == ("a100",) and tag.why == "requeue-resized"
        # What Slurm will allocate: the shards alone (no whole GPU beside them), on an a100.
        # (A requeued job is not eligible again for two minutes: it is not waited for here.)
        cluster.wait_state(job_id, {"PENDING"}, 60)
        record = cluster.job(job_id)
        queued = record.get("ReqTRES") or record["TRES"]  # 24.11: ReqTRES; 22.05: TRES
        assert queued.endswith("gres/shard=22") and "gres/gpu" not in queued, queued
