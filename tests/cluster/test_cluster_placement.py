"""On the real cluster: shares go where GPUs are free, and the SJF lever sets nice.

The burst case: a profiled job resubmitted 12 times while every a100 is busy must start on the
idle v100 GPUs (one shard count, offered on every type it fits), not wait for an a100. (The
test cluster shares on idle GPUs too, `keep_whole_when_idle = false`, so the 12 pack.)
"""

from __future__ import annotations

import time
import uuid

import pytest

from devcluster.cluster import _wait_until
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
    # A few seconds against the one-hour reference: a boost, bounded by sjf_nice_max.
    assert -2000 <= nice < -1000, decision
    assert int(job["Nice"]) == nice
    assert "shortest job first" in decision["reason"]
    # The user's own --nice is kept and the adjustment added to it.
    job = cluster.job(cluster.sbatch("--gres=gpu:1", "--hold", "--nice=100", script=script))
    cluster.slurm("scancel", job["JobId"])
    assert int(job["Nice"]) == 100 + int(decision_of(cluster, job)["writes"]["nice"])
    assert ingested["linked"]


def test_a_burst_starts_on_idle_types_while_one_type_is_busy(cluster):
    # Profiled on a v100; 12 copies then arrive while every a100 is busy. Before, all 12 got
    # Features=a100 (a count valid only there) and waited while the v100s idled.
    script = unique_script(cluster, work_s=40, util=30, mem_mib={"v100": 3000, "a100": 3200})
    busy, burst = [], []
    try:
        profile(cluster, script, "--gres=gpu:v100:1")
        for _ in range(4):  # every a100 busy with a whole-GPU job
            busy.append(cluster.sbatch("--gres=gpu:a100:1", "--partition=gpu-excl",
                                       script=f"#!/bin/sh\nRUN={uuid.uuid4().hex}\nsleep 300\n"))
        for job_id in busy:
            cluster.wait_state(job_id, {"RUNNING"}, timeout=60)
        submitted = time.monotonic()
        burst = [cluster.sbatch("--gres=gpu:1", script=script) for _ in range(12)]

        def all_running() -> bool:
            return all(cluster.job(j)["JobState"] == "RUNNING" for j in burst)

        _wait_until(all_running, 30, "the 12 burst jobs to start")
        waited = time.monotonic() - submitted
        jobs = [cluster.job(j) for j in burst]
        nodes = sorted(j["NodeList"] for j in jobs)
        assert not any(n.startswith("a100") for n in nodes), nodes
        # One count (GiB) offered on every type the job fits, fastest first.
        assert {j["Features"] for j in jobs} == {"a100|v100"}
        assert len({j["TresPerNode"] for j in jobs}) == 1
        print(f"burst: 12 jobs running {waited:.1f} s after submission on {nodes}")
    finally:
        for job_id in busy + burst:
            cluster.slurm("scancel", job_id, check=False)
