"""The daemon's cluster view against the real slurmctld: one squeue call reads every running
share with its AdminComment (22.05's ``-O admin_comment``, unpadded at size 0)."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.cluster


def test_one_squeue_call_reads_running_shares_and_their_tags(cluster, monkeypatch):
    from slurm_gpushare.core.config import load_config
    from slurm_gpushare.core.tag import Tag
    from slurm_gpushare.daemon.clusterview import SQUEUE_RUNNING, SlurmClusterView, parse_running
    from slurm_gpushare.slurm import cmd

    job_id = cluster.sbatch("--gres=gpu:1", "--comment=gpushare:mem=7G",
                            script="#!/bin/sh\nsleep 20\n")
    try:
        cluster.wait_state(job_id, {"RUNNING"})
        job = cluster.job(job_id)
        for key, value in cluster.env().items():
            monkeypatch.setenv(key, value)
        (line,) = [line for line in cmd.check_output(SQUEUE_RUNNING).splitlines()
                   if line.split("|")[0].strip() == job_id]
        running = parse_running(line)
        tag = Tag.decode(job["AdminComment"])
        assert running.shared and running.nodes == (job["NodeList"],)
        assert (running.share_class, running.decision_id) == (tag.job_class, tag.decision_id)
        calls = []
        run = cmd.run
        monkeypatch.setattr(cmd, "run", lambda argv, **kw: (calls.append(argv[0]), run(argv, **kw))[1])
        view = SlurmClusterView(load_config(os.fspath(cluster.daemon_config)))
        assert view.refresh() and calls == ["sinfo", "squeue", "scontrol"]
        assert job["NodeList"] in {node.name for node in view.nodes()}
    finally:
        cluster.slurm("scancel", job_id, check=False)
