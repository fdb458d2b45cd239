"""gpushare-sbatch: sbatch's arguments read as sbatch reads them, pass-through fidelity,
--explain / --no-share, the decision shown after submission, and `slurm-gpushare explain`."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest


from slurm_gpushare.user import wrapper
from slurm_gpushare.cli import main as cli_main
from slurm_gpushare.core.config import Config
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.user.explain import (parse_scontrol_line)
from slurm_gpushare.user.sbatchargs import (split_command_line)

REPO = Path(__file__).resolve().parents[2]
FLAGS = wrapper.WRAPPER_FLAGS
SCRIPT = "#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH --comment=\"my run\"  # trailing note\nsleep 0\n"


# ---- sbatch's command line ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def hook_ready(cluster):
    """Wait (polling) until the hook gets answers from the daemon: a held probe job carries a
    tag. Right after a daemon restart the hook's breaker may still be open for a few seconds."""
    deadline = time.monotonic() + 45
    while True:
        probe = cluster.sbatch("-H", "--gres=gpu:1", "-o", "/dev/null")
        tagged = "AdminComment" in cluster.job(probe)
        cluster.slurm("scancel", probe, check=False)
        if tagged:
            return cluster
        if time.monotonic() > deadline:
            pytest.fail("the test cluster's hook gets no answers from its daemon")
        time.sleep(0.5)


def _use_cluster(cluster, monkeypatch):
    for name, value in cluster.client_environ().items():  # SLURM_CONF (and PATH for 24.11)
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GPUSHARE_CONFIG", str(cluster.daemon_config))
    monkeypatch.delenv("GPUSHARE_QUERY_SOCKET", raising=False)
    monkeypatch.delenv("GPUSHARE_SBATCH", raising=False)
    monkeypatch.chdir(cluster.root / "jobs")


def _submit(capfd, *args):
    status = wrapper.main(["-o", "/dev/null", *args])
    out, err = capfd.readouterr()
    return status, out, err


@pytest.mark.cluster
def test_fields_match_what_slurmctld_records(cluster, monkeypatch, tmp_path):
    """The fields --explain builds equal those sbatch sends (seen on a kept, held job)."""
    _use_cluster(cluster, monkeypatch)
    script = tmp_path / "fit.sh"
    script.write_text("#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH -t 1-02:03:04\nsleep 0\n")
    args = ["-p", "gpu-excl", "--gpus=2", "--gpus-per-task=1", "-n", "2", "--cpus-per-gpu=2",
            "--mem-per-gpu=1G", "-C", "v100", "-N", "1-2", "--exclusive=user", "-x", "a100-2",
            "--comment=hi there", str(script)]
    job = wrapper.explain_fields(split_command_line(args), None, Config())
    job_id = cluster.sbatch("-H", *args[:-1], script=script.read_text())
    try:
        seen = cluster.job(job_id)
        record = parse_scontrol_line(cluster.slurm("scontrol", "-o", "show", "job", job_id)
                                     .stdout.splitlines()[0])
    finally:
        cluster.slurm("scancel", job_id, check=False)
    assert job["tres_per_node"] == seen["TresPerNode"]
    assert job["tres_per_job"] == seen["TresPerJob"]
    assert job["tres_per_task"] == seen["TresPerTask"]
    assert job["cpus_per_tres"] == seen["CpusPerTres"]
    assert job["mem_per_tres"] == seen["MemPerTres"]
    assert job["features"] == seen["Features"]
    assert job["exc_nodes"] == seen["ExcNodeList"]
    assert job["comment"] == record["Comment"]
    assert job["shared"] == 2 and seen["OverSubscribe"] == "USER"
    days, hms = seen["TimeLimit"].split("-")
    hours, minutes, seconds = map(int, hms.split(":"))
    assert job["time_limit"] == int(days) * 1440 + hours * 60 + minutes + (seconds > 0)


@pytest.mark.cluster
@pytest.mark.parametrize("args", [
    ["--gres=gpu:1"],
    ["--gpus=1", "--comment=gpushare:mem=20G"],
    ["--gres=gpu:a100:1", "-t", "30"],
    ["--gres=gpu:1", "--no-share"],
    ["--gres=gpu:1", "--exclusive"],
    ["-p", "gpu-excl", "--gres=gpu:1"],
    ["--gres=gpu:1", "--comment=gpushare:mem=100G"],
])
def test_explain_predicts_what_the_hook_does(hook_ready, monkeypatch, capfd, args):
    cluster = hook_ready
    _use_cluster(cluster, monkeypatch)
    argv = [*args, "--wrap", "sleep 0"]
    assert wrapper.main(["--explain", "--json", *argv]) == 0
    decision = json.loads(capfd.readouterr().out)["decision"]
    status, out, err = _submit(capfd, "-H", *argv)
    job_id = re.fullmatch(r"Submitted batch job (\d+)\n", out).group(1)
    try:
        tag = Tag.decode(cluster.job(job_id).get("AdminComment"))
    finally:
        cluster.slurm("scancel", job_id, check=False)
    assert status == 0
    expected = Tag.decode((decision.get("writes") or {}).get("admin_comment"))
    if expected is None:
        assert tag is None
    else:  # the same tag, but for the decision id each request gets
        assert tag and replace(tag, decision_id="") == replace(expected, decision_id="")
        assert tag.why == decision["code"]
    if decision["action"] == "share":
        assert f"job {job_id} runs as a share: {tag.shard} GiB" in err
    else:
        assert f"job {job_id} keeps its whole GPU(s)" in err


@pytest.mark.cluster
def test_submission_output_is_sbatchs(hook_ready, monkeypatch, capfd):
    cluster = hook_ready
    _use_cluster(cluster, monkeypatch)
    status, out, err = _submit(capfd, "--parsable", "--gres=gpu:1", "--wrap", "sleep 0")
    assert status == 0 and re.fullmatch(r"\d+\n", out)
    tag = Tag.decode(cluster.job(out.strip()).get("AdminComment"))
    verb = "runs as a share" if tag.shared else "keeps its whole GPU(s)"
    assert err.count("\n") == 1 and err.startswith(f"gpushare: job {out.strip()} {verb}")
    assert err.endswith(f"[{tag.why}]; details: slurm-gpushare explain {out.strip()}\n")

    # sbatch's own failures: same status and the same message as sbatch run by hand.
    plain = cluster.slurm("sbatch", "--no-such-option", "x.sh", check=False)
    status, out, err = _submit(capfd, "--no-such-option", "x.sh")
    assert (status, out, err) == (plain.returncode, plain.stdout, plain.stderr)
    assert status != 0

    # A CPU job, and a user-side view of the daemon that is down: one warning line.
    monkeypatch.setenv("GPUSHARE_QUERY_SOCKET", str(cluster.root / "run" / "absent.sock"))
    status, out, err = _submit(capfd, "--wrap", "true")
    assert status == 0 and out.startswith("Submitted batch job ")
    assert err.count("\n") == 1 and "warning: the gpushare daemon is not reachable" in err


@pytest.mark.cluster
def test_no_share_opts_out_and_keeps_the_comment(cluster, monkeypatch, capfd, tmp_path):
    _use_cluster(cluster, monkeypatch)
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    status, out, err = _submit(capfd, "--parsable", "--no-share", str(script))
    job = cluster.job(out.strip())
    record = parse_scontrol_line(cluster.slurm("scontrol", "-o", "show", "job", out.strip())
                                 .stdout.splitlines()[0])
    assert status == 0 and job["TresPerNode"] == cluster.gres_prefix + "gpu:1" and "AdminComment" not in job
    assert record["Comment"] == "my run gpushare=off"
    assert "(opted out)" in err


@pytest.mark.cluster
def test_explain_a_submitted_job(hook_ready, monkeypatch, capfd):
    cluster = hook_ready
    _use_cluster(cluster, monkeypatch)
    status, out, _ = _submit(capfd, "--parsable", "--gres=gpu:1", "--comment=gpushare:mem=20G",
                             "--wrap", "sleep 0")
    job_id = out.strip()
    tag = Tag.decode(cluster.job(job_id)["AdminComment"])
    assert cli_main(["explain", job_id, "--json"]) == 0
    report = json.loads(capfd.readouterr().out)
    assert report["source"] == "daemon"  # the daemon's own record, not just the job's tag
    decision = report["decision"]
    assert (decision["action"], decision["decision_id"], decision["share_gib"],
            decision["gpu_types"], decision["code"]) == (
        "share", tag.decision_id, tag.shard, list(tag.types), tag.why)
    assert report["slurm"]["TresPerNode"] == cluster.gres_prefix + f"shard:{tag.shard}"
    assert cli_main(["explain", job_id]) == 0
    text = capfd.readouterr().out
    assert f"job {job_id}" in text and f"runs as a share: {tag.shard} GiB" in text

    assert cli_main(["explain", "999999999"]) == 1
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "999999999" in err
