"""On the real cluster: shares go where GPUs are free, and the SJF lever sets nice.

The burst case: a profiled job resubmitted 12 times while every a100 is busy must start on the
idle v100 and t4 GPUs, not wait for one type while the other idles, and no GPU may take more
of it than fits. (The test cluster shares on idle GPUs too, `keep_whole_when_idle = false`.)
"""

from __future__ import annotations

import time
import uuid

import pytest

from devcluster.cluster import _wait_until
from slurm_gpushare.core.config import PolicyConfig
from slurm_gpushare.slurm.jobs import gres_placements
from test_cluster_history import decision_of, profile, unique_script

pytestmark = pytest.mark.cluster

NICE_OFFSET = 2 ** 31


def test_sjf_lever_sets_nice_from_the_jobs_own_run_time(cluster):
    # The test cluster runs with priority = "sjf". A new job has no history: nice untouched.
    script = unique_script(cluster, work_s=2, util=20, mem_mib={"v100": 3000, "a100": 3000})
    ingested = profile(cluster, script, "--gres=gpu:v100:1")
    job = cluster.job(cluster.sbatch("--gres=gpu:1", "--hold", script=script))
    cluster.slurm("scancel", job["JobId"])
    decision = decision_of(cluster, job)
    nice = int(decision["writes"]["nice"])
    # A few seconds against the one-hour reference (over two decades shorter): a boost,
    # bounded by sjf_nice_max.
    lever = PolicyConfig()
    assert -lever.sjf_nice_max <= nice < -2 * lever.sjf_nice_per_decade, decision
    assert int(job["Nice"]) == nice
    assert "shortest job first" in decision["reason"]
    # The user's own --nice is kept and the adjustment added to it.
    job = cluster.job(cluster.sbatch("--gres=gpu:1", "--hold", "--nice=100", script=script))
    cluster.slurm("scancel", job["JobId"])
    assert int(job["Nice"]) == 100 + int(decision_of(cluster, job)["writes"]["nice"])
    assert ingested["linked"]


def gpus_in_use(cluster, job_ids) -> dict[tuple[str, str], list[str]]:
    """(node, GPU index) -> running jobs on it, from Slurm (``scontrol show job -d``, read by
    the product's parser of both versions' spellings)."""
    held: dict[tuple[str, str], list[str]] = {}
    for job_id in job_ids:
        out = cluster.slurm("scontrol", "show", "job", "-d", job_id, check=False).stdout
        for node, indices in gres_placements(out):
            for index in indices:
                held.setdefault((node, str(index)), []).append(job_id)
    return held


def test_a_burst_starts_on_idle_types_while_one_type_is_busy(cluster):
    # 12 copies of a profiled job arrive in one burst while every a100 is busy. Its 9 GiB fit
    # one to a 16 GiB GPU: the four v100 GPUs (shards) and the two t4 GPUs (MPS) are where it
    # can start now. Before, every copy got the shard request (fastest type first): four
    # started on the v100s and eight waited while both t4 GPUs idled.
    script = unique_script(cluster, work_s=10, util=30, mem_util=15,
                           mem_mib={"v100": 9000, "a100": 9500, "t4": 9000})
    busy, burst = [], []
    try:
        profile(cluster, script, "--gres=gpu:v100:1")
        for _ in range(4):  # every a100 busy with a whole-GPU job
            busy.append(cluster.sbatch("--gres=gpu:a100:1", "--partition=gpu-excl",
                                       script=f"#!/bin/sh\nRUN={uuid.uuid4().hex}\nsleep 300\n"))
        for job_id in busy:
            cluster.wait_state(job_id, {"RUNNING"}, timeout=60)
        cluster.wait_view(time.time())  # the daemon has seen them (it reads Slurm every 5 s)
        submitted = time.monotonic()
        burst = [cluster.sbatch("--gres=gpu:1", script=script) for _ in range(12)]
        most: dict[tuple[str, str], int] = {}
        started: dict[str, str] = {}  # job -> node, from squeue

        def all_started() -> bool:
            out = cluster.slurm("squeue", "-h", "-t", "R", "-o", "%i|%N", "-j", ",".join(burst),
                                check=False).stdout
            for line in out.split():
                job_id, node = line.split("|")
                started.setdefault(job_id, node)
            for gpu, jobs in gpus_in_use(cluster, burst).items():
                most[gpu] = max(most.get(gpu, 0), len(jobs))
            return len(started) == len(burst)

        # Two waves of 10 s jobs on six GPUs (the fake board runs them at solo speed there).
        _wait_until(all_started, 90, "the 12 burst jobs to start", interval=0.5)
        waited = time.monotonic() - submitted
        nodes = sorted(set(started.values()))
        print(f"burst: 12 jobs started within {waited:.1f} s on {nodes}; most per GPU {most}")
        assert not any(n.startswith("a100") for n in nodes), nodes
        # Both idle types used: the burst did not funnel onto the first type offered.
        assert {"t4-1", "v100-1", "v100-2"} <= set(nodes), started
        # No GPU held more of the burst at once than fits it (9 GiB: one per 16 GiB GPU).
        assert most and max(most.values()) == 1, most
        for job_id in burst:  # and accounting agrees on where each ran
            cluster.wait_completed(job_id, timeout=90)
            assert cluster.sacct(job_id, "NodeList,State")["NodeList"] == started[job_id]
    finally:
        for job_id in busy + burst:
            cluster.slurm("scancel", job_id, check=False)
