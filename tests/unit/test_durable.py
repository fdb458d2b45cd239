"""Telemetry is not lost: the spool drains on the next contact with the daemon, and a
collector killed with -9 leaves its last checkpoint for the epilog, which says so."""

from __future__ import annotations

import json
import os
import signal

from conftest import wait_for
from slurm_gpushare.node import agent

PROFILE = {"gpus": [{"index": 0, "name": "A100", "mem_total_mib": 40000, "phases": [
    {"duration_s": 600, "util_gpu": 50, "util_mem": 20, "mem_used_mib": 6000}]}]}


def test_spooled_summaries_drain_on_the_next_contact(daemon, tmp_path):
    spool = tmp_path / "spool"
    away = agent.default_deliver(str(tmp_path / "absent.sock"), spool)
    for job in ("41", "42"):
        assert away({"job_id": job, "gpu_index": 0, "cluster": "c1"}) == "spooled"
    back = agent.default_deliver(daemon.socket, spool)
    assert back({"job_id": "43", "gpu_index": 0, "cluster": "c1"}) == "sent (+2 from the spool)"
    assert sorted(s["job_id"] for s in daemon.store.all_summaries()) == ["41", "42", "43"]
    assert list(spool.iterdir()) == []


def test_a_killed_collector_leaves_its_checkpoint_to_the_epilog(daemon, tmp_path):
    scenario = tmp_path / "profile.json"
    scenario.write_text(json.dumps(PROFILE))
    state = tmp_path / "state"
    common = ["--job-id", "51", "--gpus", "0", "--cluster", "c1", "--state-dir", str(state),
              "--socket", daemon.socket, "--scenario", str(scenario), "--interval", "0.05"]
    assert agent.main(["start", *common]) == 0
    pid = int(agent.pid_path(state, "51").read_text().split()[0])
    assert wait_for(lambda: agent.checkpoint_path(state, "51").exists())
    # The first checkpoint is written after the first round of samples.
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)  # this test is its parent; under slurmd init reaps it
    assert agent.main(["stop", *common]) == 0
    summaries = daemon.store.all_summaries()
    assert [s["job_id"] for s in summaries] == ["51"]
    assert "collector-died" in summaries[0]["conditions"] and summaries[0]["samples"] >= 1
    log = (state / "agent.log").read_text()
    assert "died before the epilog; delivered its last checkpoint (1 summaries: sent)" in log
    # A collector that died before its first checkpoint: nothing to deliver, and it is said.
    agent.pid_path(state, "52").write_text("999999\n")
    assert agent.main(["stop", *common[:1], "52", *common[2:]]) == 0
    assert "job 52: collector (pid 999999) died before the epilog; no checkpoint" in \
        (state / "agent.log").read_text()
