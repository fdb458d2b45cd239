"""History filled in from Slurm's own GPU accounting (gres/gpumem) where the node agent left no
summary: ``import-usage`` against the real daemon's socket and store."""

from __future__ import annotations

import time

from slurm_gpushare.cli import main
from slurm_gpushare.daemon.store import SLURM_ACCOUNTING

# Crafted (fake GPUs have no NVML), in the layout of Slurm 23.02+ with AutoDetect=nvml.
# 43: a whole v100; 44: two GPUs (its figure is not one GPU's); 45: the agent already sent
# its summary; 46: a share (the tag allows only v100); 47: no GPU accounting on its node.
HEADER = "JobID|JobIDRaw|Cluster|State|Start|End|AllocTRES|TRESUsageInMax|AdminComment\n"
USAGE = "cpu=00:00:50,gres/gpumem={mem},gres/gpuutil={util},mem=1056K"
TAG = "gpushare:v1:share:id=d46:shard=8:types=v100:why=history-share"
# Ended an hour ago: within the store's retention (older runs are compacted away).
END = int(time.time()) - 3600


def line(job, tres, usage="", tag=""):
    return (f"{job}|{job}|c1|COMPLETED|{END - 100}|{END}|{tres}||{tag}\n"
            f"{job}.batch|{job}.batch|c1|COMPLETED|{END - 100}|{END}|{tres}|{usage}|\n")


def sacct_file(tmp_path):
    path = tmp_path / "sacct.psv"
    path.write_text(HEADER
                    + line(43, "gres/gpu:v100=1,gres/gpu=1", USAGE.format(mem="5G", util=90))
                    + line(44, "gres/gpu:v100=2,gres/gpu=2", USAGE.format(mem="20G", util=99))
                    + line(45, "gres/gpu:v100=1,gres/gpu=1", USAGE.format(mem="3G", util=50))
                    + line(46, "gres/shard=8", USAGE.format(mem="7000M", util=40), TAG)
                    + line(47, "gres/gpu:v100=1,gres/gpu=1", "cpu=00:00:50,mem=1056K"))
    return path


def config_file(tmp_path, daemon):
    path = tmp_path / "gpushare.toml"
    path.write_text(f'[daemon]\nsocket = "{daemon.socket}"\n'
                    f'secret_file = "{tmp_path}/secret"\nstate_dir = "{tmp_path}/state"\n'
                    '[policy]\nsharing_partitions = ["gpu"]\n'
                    '[gpu_types.v100]\nmemory_gib = 16\nmodel = "V100-16GB"\n')
    return path


def test_import_fills_in_only_where_the_agent_left_nothing(tmp_path, daemon, capsys):
    agent = {"v": 1, "cluster": "c1", "job_id": "45", "gpu_index": 1, "gpu_model": "V100-16GB",
             "mgmap_max_mib": 2900.0, "samples": 40, "attribution": "pid"}
    assert daemon.store.ingest_summary(agent)
    argv = ["import-usage", "--config", str(config_file(tmp_path, daemon)),
            "--sacct-file", str(sacct_file(tmp_path)), "--since", "-1d", "--min-age", "0"]
    assert main(argv) == 0
    assert "5 jobs, 4 with Slurm's GPU accounting: sent 3" in capsys.readouterr().out
    (whole,) = daemon.store.summaries("43", cluster="c1")
    assert whole["mgmap_max_mib"] == 5 * 1024 and whole["mgup_max"] == 90
    assert whole["attribution"] == SLURM_ACCOUNTING and whole["gpu_model"] == "V100-16GB"
    assert whole["mgmap_max_pct"] == 5 / 16 * 100 and not whole["shared"]
    (share,) = daemon.store.summaries("46", cluster="c1")
    assert share["mgmap_max_mib"] == 7000 and share["shared"]
    assert daemon.store.summaries("44", cluster="c1") == []  # two GPUs
    assert daemon.store.summaries("47", cluster="c1") == []  # nothing measured
    assert daemon.store.summaries("45", cluster="c1") == [agent]
    # Again: nothing is held twice.
    assert main(argv) == 0
    assert len(daemon.store.summaries("43", cluster="c1")) == 1
    # The agent's own summary of 43, arriving late, replaces the one from accounting.
    late = agent | {"job_id": "43", "mgmap_max_mib": 5000.0}
    assert daemon.store.ingest_summary(late)
    assert daemon.store.summaries("43", cluster="c1") == [late]


def test_recent_jobs_wait_for_their_agent_and_dry_run_sends_nothing(tmp_path, daemon, capsys):
    argv = ["import-usage", "--config", str(config_file(tmp_path, daemon)),
            "--sacct-file", str(sacct_file(tmp_path)), "--since", "-1d"]
    assert main([*argv, "--min-age", "0", "--dry-run"]) == 0
    assert "3 to send" in capsys.readouterr().out
    assert daemon.store.summaries("43", cluster="c1") == []
    assert main([*argv, "--min-age", "7200"]) == 0  # every job ended too recently
    assert "sent 0" in capsys.readouterr().out


def test_an_unreachable_daemon_is_one_line_and_non_zero(tmp_path, capsys):
    config = tmp_path / "gpushare.toml"
    config.write_text(f'[daemon]\nsocket = "{tmp_path}/none.sock"\n'
                      '[gpu_types.v100]\nmemory_gib = 16\n')
    assert main(["import-usage", "--config", str(config), "--sacct-file",
                 str(sacct_file(tmp_path)), "--since", "-1d", "--min-age", "0"]) == 1
    err = capsys.readouterr().err
    assert "daemon not reachable" in err and len(err.strip().splitlines()) == 1


def test_an_imported_run_becomes_history_under_its_decisions_keys(tmp_path, daemon, capsys):
    # The share's decision was made at submit; the job ended long ago (slurmctld forgot it).
    keys = ["a" * 64, "b" * 64]
    daemon.store.record_decision({"decision_id": "d46", "action": "share", "code": "history-share",
                                  "reason": "r", "keys": keys})
    assert daemon.store.history(keys) == []
    assert main(["import-usage", "--config", str(config_file(tmp_path, daemon)),
                 "--sacct-file", str(sacct_file(tmp_path)), "--since", "-1d",
                 "--min-age", "0"]) == 0
    (run,) = daemon.store.history(keys)
    assert run["job_id"] == "46" and run["mgmap_max_mib"] == 7000
    assert daemon.store.keys_of_job("46", "c1") == keys
