"""Privacy end to end: a job's script, name and comment never land in what we store or log.

Secrets are planted in a real submission (script text and arguments, job name, comment); the
job runs through the real hook, daemon and telemetry path twice (profiled, then shared); then
every byte of the daemon's store (SQLite files), its logs, the agent's state (log, spool) and
our hook's lines in slurmctld.log is scanned. Slurm's own job records (which keep the script)
are Slurm's, not ours, and are not scanned.
"""

from __future__ import annotations

import time
import uuid

import pytest

from test_cluster_history import wait_daemon_quiet, wait_ingested

pytestmark = pytest.mark.cluster


def test_no_script_name_or_comment_text_is_kept(cluster):
    token = uuid.uuid4().hex[:12]
    secrets = [f"resnet-secret-{token}", f"imagenet-private-{token}", f"lr0.0314{token}",
               f"jobname-{token}", f"comment-{token}", f"argument-{token}"]
    shebang, rest = cluster.training_script(work_s=1, util=20, mem_mib={"v100": 3000}).split("\n", 1)
    script = (f"{shebang}\n# model {secrets[0]} on {secrets[1]}\n"
              f"ARGS='--model {secrets[0]} --data {secrets[1]} --lr {secrets[2]}'\n{rest}")
    # A script file with an argument: job_desc.argv carries it to the hook (a keyed digest).
    path = cluster.root / "jobs" / f"private-{token}.sh"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    job_ids = []
    wait_daemon_quiet(cluster)  # this test needs the hook's decisions, not its fail-open
    for _ in range(2):  # first run (profiled), then the resubmission decided from history
        job_id = cluster.sbatch("--gres=gpu:v100:1", f"--job-name={secrets[3]}",
                                f"--comment={secrets[4]}", str(path), secrets[5], script="")
        cluster.wait_completed(job_id)
        wait_ingested(cluster, job_id)
        job_ids.append(job_id)
    assert cluster.job(job_ids[1])["AdminComment"].startswith("gpushare:v1:share:")
    time.sleep(0.5)  # let the writer thread finish its last records

    ours = [p for p in (cluster.root / "predictor").rglob("*") if p.is_file()]
    ours += [cluster.log / "gpushare.log", cluster.log / "gpushare.out"]
    ours += [p for p in (cluster.root / "agent").rglob("*") if p.is_file()]
    assert any(p.name.startswith("store.sqlite") for p in ours)
    for path in ours:
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, f"{secret} found in {path}"
    hook_lines = [line for line in (cluster.log / "slurmctld.log").read_text().splitlines()
                  if "gpushare" in line]
    for secret in secrets:
        assert not any(secret in line for line in hook_lines)
