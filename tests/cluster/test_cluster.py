"""Integration tests on the real local cluster: slurmctld runs the real hook, which talks to
the real daemon; slurmd run the jobs on fake GPUs; slurmdbd stores the accounting."""

from __future__ import annotations

import json
import re
import time

import pytest

from conftest import MisbehavingServer

from slurm_gpushare.slurm.jobs import gres_placements

pytestmark = pytest.mark.cluster

SLEEP = "#!/bin/sh\nsleep {}\n"
# New jobs run whole and are profiled (first_run = "whole-gpu"); a memory hint shares at once:
# 7 GiB + 10% margin = an 8 GiB share.
HINT = "--comment=gpushare:mem=7G"


def test_cluster_comes_up_within_a_minute(cluster):
    assert cluster.startup_seconds < 60
    assert all(cluster.status().values()), cluster.status()


def test_slurm_resolves_this_hosts_name(cluster):
    # srun, slurmctld and slurmstepd reach each other by the submit host's name; inside a
    # Slurm root without it every step completion was retried for minutes and nodes drained.
    import socket
    import subprocess

    name = socket.gethostname()
    found = subprocess.run(cluster.in_root(["getent", "hosts", name]), capture_output=True,
                           text=True, timeout=30)
    assert found.returncode == 0 and name in found.stdout, found


def test_first_run_is_profiled_on_a_whole_gpu(cluster):
    job_id = cluster.sbatch("--gres=gpu:1", script=SLEEP.format(0) + f"RUN={time.time()}\n")
    job = cluster.job(job_id)
    assert job["TresPerNode"] == cluster.gres_prefix + "gpu:1"
    assert job.get("Features", "(null)") == "(null)"
    assert re.fullmatch(r"gpushare:v1:keep:id=[0-9a-f]{8}:why=first-run", job["AdminComment"])


def test_ordinary_gpu_job_becomes_a_share(cluster):
    job_id = cluster.sbatch("--gres=gpu:1", HINT, script=SLEEP.format(1))
    job = cluster.job(job_id)
    assert job["TresPerNode"] == cluster.gres_prefix + "shard:8"
    assert job["Features"] == "a100|v100", job["AdminComment"]
    assert re.fullmatch(r"gpushare:v1:share:id=[0-9a-f]{8}:shard=8:types=a100\+v100:"
                        r"why=hint-share", job["AdminComment"])

    # squeue --json in 22.05 ignores -j and lists every job: pick ours.
    queued = [j for j in json.loads(cluster.slurm("squeue", "--json").stdout)["jobs"]
              if str(j["job_id"]) == job_id]
    assert queued and queued[0]["tres_per_node"] == cluster.gres_prefix + "shard:8"

    # Free text last: Constraints may hold "|", sacct -P's delimiter.
    record = cluster.sacct(job_id, "JobID,State,AllocTRES,NodeList,AdminComment,Constraints")
    assert record["State"] == "COMPLETED"
    assert record["AdminComment"] == job["AdminComment"]
    assert "gres/shard=8" in record["AllocTRES"] and "gres/gpu=" not in record["AllocTRES"]
    assert record["NodeList"] in {"a100-1", "a100-2", "v100-1", "v100-2"}
    # 22.05 fills Constraints in some accounting records and leaves it empty in others: the
    # tag's types= is the durable record of where a share was allowed to run.
    assert record["Constraints"] in ("a100|v100", "")

    # The daemon logged the same decision, with its reason.
    decisions = [json.loads(line) for line in (cluster.log / "gpushare.log").read_text().splitlines()]
    decision_id = job["AdminComment"].split("id=")[1].split(":")[0]
    logged = [d for d in decisions if d.get("id") == decision_id]
    assert logged and logged[0]["action"] == "share" and "memory hint" in logged[0]["reason"]


def test_gpus_option_and_typed_request(cluster):
    job_id = cluster.sbatch("--gpus=1", HINT, script=SLEEP.format(0))
    job = cluster.job(job_id)
    assert job["TresPerNode"] == cluster.gres_prefix + "shard:8" and "TresPerJob" not in job
    typed = cluster.job(cluster.sbatch("--gres=gpu:a100:1", HINT, script=SLEEP.format(0)))
    assert typed["TresPerNode"] == cluster.gres_prefix + "shard:8" and typed["Features"] == "a100", \
        typed["AdminComment"]


def test_memory_hint_excludes_gpus_it_does_not_fit(cluster):
    job = cluster.job(cluster.sbatch("--gres=gpu:1", "--comment=gpushare:mem=20G",
                                     script=SLEEP.format(0)))
    assert job["TresPerNode"] == cluster.gres_prefix + "shard:22" and job["Features"] == "a100", \
        job["AdminComment"]


def _gres_index(cluster, job_id):
    """(node, GPU index) of a running shard job, from `scontrol show job -d`."""
    detail = cluster.slurm("scontrol", "show", "job", "-d", job_id).stdout
    places = gres_placements(detail)  # GRES=shard:8(IDX:0) in 22.05, shard:8(8/16,0/16) in 24.11
    return (places[0][0], places[0][1][0]) if places else None


def test_two_jobs_share_one_gpu_at_the_same_time(cluster):
    # Three 8 GiB shares on one node with two GPUs: at least two must sit on the same GPU.
    ids = [cluster.sbatch("--gres=gpu:1", HINT, "-w", "v100-2", script=SLEEP.format(8))
           for _ in range(3)]
    for job_id in ids:
        cluster.wait_state(job_id, {"RUNNING"}, timeout=60)
    places = [_gres_index(cluster, job_id) for job_id in ids]
    assert all(places), places
    assert len(set(places)) < len(places), f"no two jobs on one GPU: {places}"
    states = {cluster.job(job_id)["JobState"] for job_id in ids}
    assert states == {"RUNNING"}


@pytest.mark.parametrize("args,script_extra", [
    ((), ""),                                             # no GPU at all
    (("--gres=gpu:2",), ""),                              # two GPUs
    (("--gres=gpu:1", "--exclusive"), ""),                # exclusive
    (("--gres=gpu:1", "-N", "2"), ""),                    # multi-node
    (("--gres=gpu:1", "-p", "gpu-excl"), ""),             # sharing off in this partition
    (("--gres=gpu:1", "--comment=gpushare=off"), ""),     # user opt-out
    (("--gres=shard:4",), ""),                            # already a share
    (("--gres=gpu:1", "--cpus-per-gpu=2"), ""),           # per-GPU options
    # With a hint (a share otherwise): Slurm refuses a shared gres with --gpu-freq ("Invalid
    # generic resource (gres) specification"); a node range may give the job several nodes.
    (("--gres=gpu:1", "--gpu-freq=high", HINT), ""),
    (("--gres=gpu:1", "-N", "1-2", HINT), ""),
    # Slurm tries --prefer in place of the share's types: refused where t4 has no shards.
    (("--gres=gpu:1", "--prefer=t4", HINT), ""),
])
def test_untouched_jobs_stay_untouched(cluster, args, script_extra):
    job_id = cluster.sbatch(*args, "--hold", script=SLEEP.format(0) + script_extra)
    job = cluster.job(job_id)
    cluster.slurm("scancel", job_id)
    assert "shard:8" not in job.get("TresPerNode", "")
    assert job.get("AdminComment", "") == ""
    requested = [a.split("=", 1)[1] for a in args if a.startswith("--gres=")]
    if requested:
        assert job["TresPerNode"] == cluster.gres_prefix + f"{requested[0]}"
    else:
        assert "TresPerNode" not in job


@pytest.mark.parametrize("step_option", ["--cpus-per-gpu=1", "--mem-per-gpu=100M",
                                         "--ntasks-per-gpu=1"])
def test_steps_with_per_gpu_options_run(cluster, step_option):
    # In a job holding shards, not GPUs, srun refuses such a step ("Unable to create step ...:
    # Invalid generic resource (gres) specification"): the job keeps its whole GPU.
    from devcluster.cluster import FAKEGPU_ROOT_ENV, REPO

    script = (f"#!/bin/sh\nset -e\nexport {FAKEGPU_ROOT_ENV}={cluster.fakegpu_root} "
              f"PYTHONPATH={REPO}\n"
              f"srun -n1 {step_option} {cluster.node_python} -m devcluster.fakegpu smi\n")
    job_id = cluster.sbatch("--gres=gpu:1", HINT, script=script)
    job = cluster.job(job_id)
    assert job["TresPerNode"] == cluster.gres_prefix + "gpu:1", job.get("AdminComment")
    assert "why=steps-need-gpu" in job["AdminComment"]
    cluster.wait_completed(job_id)  # the step ran
    assert "GPU 0:" in cluster.job_output(job_id)


@pytest.mark.parametrize("option", ["--gres-flags=multiple-tasks-per-sharing",
                                    "--tres-bind=gres/gpu:closest", "--segment=1",
                                    "--oom-kill-step"])
def test_options_new_in_24_11_share_and_their_steps_run(cluster, option):
    # Submission options 22.05's sbatch does not know: such a job still becomes a share, Slurm
    # accepts it and runs it, and its srun step runs (probed with 70 option sets on 24.11.5:
    # none behaved otherwise than without the hook).
    if cluster.slurm_version != "24.11":
        pytest.skip("options of Slurm 24.11")
    job_id = cluster.sbatch("--gres=gpu:1", HINT, option,
                            script="#!/bin/sh\nsrun -n1 sh -c 'echo step-ran'\n")
    assert ":share:" in cluster.job(job_id)["AdminComment"]
    cluster.wait_completed(job_id)
    assert "step-ran" in cluster.job_output(job_id)


def test_scontrol_update_on_a_shared_job_still_works(cluster):
    job_id = cluster.sbatch("--gres=gpu:1", HINT, "--hold", script=SLEEP.format(0))
    cluster.slurm("scontrol", "update", f"JobId={job_id}", "TimeLimit=5")
    job = cluster.job(job_id)
    cluster.slurm("scancel", job_id)
    assert job["TimeLimit"] == "00:05:00" and job["TresPerNode"] == cluster.gres_prefix + "shard:8"


def _timed_submit(cluster):
    started = time.perf_counter()
    job_id = cluster.sbatch("--gres=gpu:1", HINT, "--hold", script=SLEEP.format(0))
    elapsed = time.perf_counter() - started
    job = cluster.job(job_id)
    cluster.slurm("scancel", job_id)
    return elapsed, job


def _wait_for_sharing_again(cluster):
    """After a failure test: the breaker closes (cooldown 5 s) and jobs are shared again."""
    deadline = time.monotonic() + 30
    while _timed_submit(cluster)[1]["TresPerNode"] != cluster.gres_prefix + "shard:8":
        assert time.monotonic() < deadline, "hook never recovered"
        time.sleep(0.5)


@pytest.fixture
def daemon_replaced(cluster):
    """Stop the real daemon; the test may put a misbehaving server on its socket."""
    cluster.stop_daemon()
    servers = []

    def put(mode):
        server = MisbehavingServer(str(cluster.daemon_socket), mode)
        servers.append(server)
        return server

    yield put
    for server in servers:
        server.stop()
    cluster.start_daemon()
    _wait_for_sharing_again(cluster)


@pytest.mark.parametrize("mode", ["stopped", "hang", "garbage"])
def test_daemon_failures_leave_jobs_unchanged_and_prompt(cluster, daemon_replaced, mode):
    if mode != "stopped":
        daemon_replaced(mode)
    log_before = (cluster.log / "slurmctld.log").read_text().count("gpushare: job left as submitted")
    timings = []
    for _ in range(6):
        elapsed, job = _timed_submit(cluster)
        timings.append(elapsed)
        assert job["TresPerNode"] == cluster.gres_prefix + "gpu:1" and job.get("AdminComment", "") == ""
    # The hook's deadline is 50 ms; sbatch itself costs tens of ms here.
    assert max(timings) < 1.5, timings
    log_after = (cluster.log / "slurmctld.log").read_text().count("gpushare: job left as submitted")
    # One line per job (exactly so in the Lua unit tests; here other submitters may add theirs).
    assert log_after - log_before >= 6


def test_job_decision_lookup_for_owner_and_admin_only(cluster):
    from slurm_gpushare.daemon.protocol import request as request_once

    job_id = cluster.sbatch("--gres=gpu:1", HINT, "--hold", script=SLEEP.format(0))
    query = str(cluster.run / "gpushare-query.sock")
    reply = request_once(query, {"v": 1, "op": "job", "job_id": job_id})  # root: admin
    cluster.slurm("scancel", job_id)
    assert reply["ok"], reply
    assert reply["record"]["decision_id"] in reply["job"]["admin_comment"]
    assert reply["record"]["job_id"] == job_id and reply["record"]["action"] == "share"

    # Another user is refused the details of root's job.
    import os

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            os.write(write_end, json.dumps(request_once(
                query, {"v": 1, "op": "job", "job_id": job_id})).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    assert json.loads(os.read(read_end, 65536))["error"] == "permission denied: not your job"


def _slurmd_pids(cluster, node: str) -> list[int]:
    """The slurmd processes of ``node`` that belong to this cluster (by their SLURM_CONF)."""
    import os
    from pathlib import Path

    mine = f"SLURM_CONF={cluster.slurm_conf}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")
            environ = Path("/proc", entry, "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:3] == [b"slurmd", b"-N", node.encode()] and mine in environ:
            pids.append(int(entry))
    return pids


def test_start_never_runs_a_second_slurmd_for_a_node(cluster):
    """24.11's slurmd restarts itself on reconfigure, and for a moment its pid file names the
    process that has exited: a `cluster start` then must not start a second slurmd for the
    node, and `cluster stop` must stop every slurmd of the cluster whatever the pid files say."""
    import subprocess

    node = cluster.nodes[-1].name
    pid_file = cluster._pid_file(f"slurmd-{node}")
    assert len(_slurmd_pids(cluster, node)) == 1
    gone = subprocess.Popen(["true"])
    gone.wait()
    saved = pid_file.read_text()
    pid_file.write_text(f"{gone.pid}\n")
    try:
        cluster.start()
        time.sleep(1)  # a second slurmd would be running or failing to bind by now
        assert len(_slurmd_pids(cluster, node)) == 1
        assert cluster.status()[f"slurmd-{node}"]
    finally:
        if len(_slurmd_pids(cluster, node)) == 1:
            pid_file.write_text(saved)
