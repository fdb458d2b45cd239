"""The test cluster's fake GPU board: what a fake job finds on its GPU decides whether it
"runs out of memory", so only processes that are really still there may count."""

from __future__ import annotations

import json
import os

import pytest

from devcluster import fakegpu
from slurm_gpushare.core.files import process_started


def board(tmp_path):
    fakegpu.write_board(tmp_path, "v100-1", "v100",
                        [{"index": 0, "name": "Tesla V100-SXM2-16GB", "mem_total_mib": 16160}])
    return tmp_path / "v100-1" / "gpu0"


def register(directory, job_id: str, pid: int, started, mem_mib: float) -> None:
    (directory / f"{job_id}.json").write_text(json.dumps(
        {"job_id": job_id, "pid": pid, "started": started, "mem_mib": mem_mib, "util": 40,
         "mem_util": 20}))


def test_a_registration_left_by_a_killed_job_does_not_count_once_its_pid_is_reused(tmp_path):
    gpu = board(tmp_path)
    me, started = os.getpid(), process_started(os.getpid())
    register(gpu, "7", me, started, 4000)           # a job that is running (this process)
    register(gpu, "8", me, started - 1, 12000)      # killed; its pid now names this process
    register(gpu, "9", 0, None, 9000)               # no process at all
    provider = fakegpu.FakeGpuProvider(tmp_path, "v100-1")
    assert provider.sample(0).mem_used_mib == 4000


def test_the_board_written_at_cluster_start_drops_what_killed_jobs_left(tmp_path):
    gpu = board(tmp_path)
    me, started = os.getpid(), process_started(os.getpid())
    register(gpu, "7", me, started, 4000)
    register(gpu, "8", me, started - 1, 12000)
    (gpu / "9.json").write_text(json.dumps({"job_id": "9", "pid": me, "mem_mib": 9000}))
    board(tmp_path)  # without a start time, a pid says nothing: an older board's file
    assert sorted(p.name for p in gpu.iterdir()) == ["7.json"]


def test_work_and_memory_may_be_given_per_gpu_type(tmp_path, monkeypatch):
    # A fake job works as long as the script says on its GPU's type; work given once takes as
    # long everywhere; a type the script names nothing for gets its largest figure.
    assert fakegpu.per_type({"v100": 10.0, "a100": 6.0}, "a100") == 6.0
    assert fakegpu.per_type({"v100": 10.0, "a100": 6.0}, "t4") == 10.0
    assert fakegpu.per_type({"*": 3.0}, "a100") == 3.0
    seen = {}
    monkeypatch.setattr(fakegpu, "run_workload", lambda **kw: seen.update(kw) or 0)
    monkeypatch.setenv(fakegpu.ROOT_ENV, str(tmp_path))
    monkeypatch.setenv("SLURMD_NODENAME", "a100-1")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert fakegpu.main(["run", "--work", "v100:10", "--work", "a100:6", "--mem", "v100:4000"]) == 0
    assert seen["work_s"] == {"v100": 10.0, "a100": 6.0}
    assert fakegpu.main(["run", "--work", "2.5", "--mem", "v100:4000"]) == 0
    assert seen["work_s"] == {"*": 2.5}


def test_the_fake_types_run_as_fast_as_the_run_time_predictor_says():
    # TYPE_SPEED copies the packaged run-time model's speed-ups (the fake board's jobs cannot
    # import it): a refit that moves them by more than 2% must move the copy too.
    from slurm_gpushare.predict.runtime import default_runtime

    model = default_runtime()
    for gpu_type, name in (("a100", "A100-80GB"), ("t4", "T4")):
        predicted = 100.0 / model.predict_runtime({"V100-16GB": 100.0}, name)
        assert fakegpu.TYPE_SPEED[gpu_type] == pytest.approx(predicted, rel=0.02), gpu_type
