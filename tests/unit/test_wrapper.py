"""gpushare-sbatch: sbatch's arguments read as sbatch reads them, pass-through fidelity,
--explain / --no-share, the decision shown after submission, and `slurm-gpushare explain`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_gpushare.daemon import protocol

from slurm_gpushare.user import wrapper
from slurm_gpushare.core.config import Config
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.user.explain import (decision_from_tag, decision_rows, parse_scontrol_line,
                                    render_rows)
from slurm_gpushare.user.sbatchargs import (SbatchArgsError, Submission, add_comment_token,
                                       script_options, split_command_line, time_minutes)

REPO = Path(__file__).resolve().parents[2]
FLAGS = wrapper.WRAPPER_FLAGS
SCRIPT = "#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH --comment=\"my run\"  # trailing note\nsleep 0\n"


# ---- sbatch's command line ---------------------------------------------------------------------

def test_options_end_at_the_script_and_its_arguments_are_untouched():
    line = split_command_line(["-p", "gpu", "--gres=gpu:1", "job.sh", "--no-share", "-p", "x"],
                              FLAGS)
    assert line.script == "job.sh" and line.script_args == ["--no-share", "-p", "x"]
    assert line.wrapper_flags == set()
    assert line.option_words == ["-p", "gpu", "--gres=gpu:1"]


def test_an_option_argument_that_looks_like_a_wrapper_flag_stays_an_argument():
    line = split_command_line(["--comment", "--explain", "job.sh"], FLAGS)
    assert line.last("comment").value == "--explain" and line.wrapper_flags == set()


def test_getopt_rules_clusters_abbreviations_optional_arguments():
    line = split_command_line(["-Hpgpu", "--part", "debug", "--explain", "-k", "--exclusive",
                               "--", "s.sh", "a"], FLAGS)
    assert [(o.name, o.value) for o in line.options] == [
        ("hold", None), ("partition", "gpu"), ("partition", "debug"), ("no-kill", None),
        ("exclusive", None)]
    assert line.wrapper_flags == {"--explain"}
    assert line.script == "s.sh" and line.script_args == ["a"]
    assert "--explain" not in line.option_words and line.option_words[-1] == "--"


def test_arguments_sbatch_would_refuse_are_reported():
    with pytest.raises(SbatchArgsError, match="ambiguous"):
        split_command_line(["--ex", "s.sh"])
    with pytest.raises(SbatchArgsError, match="unrecognized"):
        split_command_line(["--no-such-option", "s.sh"])
    with pytest.raises(SbatchArgsError, match="requires an argument"):
        split_command_line(["--partition"])


def test_sbatch_lines_stop_at_the_first_command_and_honour_quotes_and_comments():
    script = ("#!/bin/bash\n\n# a comment\n#SBATCH -p gpu --comment 'two words'  # note\n"
              "#SBATCH --gres=gpu:a100:1\necho start\n#SBATCH --partition=ignored\n")
    assert [(o.name, o.value) for o in script_options(script)] == [
        ("partition", "gpu"), ("comment", "two words"), ("gres", "gpu:a100:1")]
    het = "#SBATCH -p a\n#SBATCH hetjob\n#SBATCH -p b\n"
    assert [o.value for o in script_options(het)] == ["a"]


def test_command_line_beats_environment_beats_script():
    script = "#!/bin/sh\n#SBATCH -p from-script\n#SBATCH -t 10\n#SBATCH -J script-name\n"
    line = split_command_line(["-p", "from-cli", "job.sh"])
    sub = Submission.build(line, script, environ={"SBATCH_PARTITION": "from-env",
                                                  "SBATCH_TIMELIMIT": "20"})
    assert sub.get("partition") == "from-cli" and sub.get("time") == "20"
    assert sub.get("job-name") == "script-name"


@pytest.mark.parametrize("text,minutes", [
    ("90", 90), ("1:30", 2), ("2:00:00", 120), ("1-0", 1440), ("1-02:03", 1563),
    ("1-02:03:01", 1564), ("UNLIMITED", 0xFFFFFFFF)])
def test_time_limits_as_slurm_counts_them(text, minutes):
    assert time_minutes(text) == minutes


def test_job_fields_for_gpu_options():
    line = split_command_line(["--gpus-per-node=1", "--gres=shard:2,nic:1", "--gpus=a100:2",
                               "--gpus-per-task=1", "--cpus-per-gpu=4", "--mem-per-gpu=2G",
                               "-N", "1-2", "-n", "2", "--exclusive=user", "-t", "1:00:00",
                               "-C", "a100", "-A", "proj", "-q", "high", "-x", "n[1-2]",
                               "--gpu-freq=high", "--prefer=v100", "job.sh"])
    job = Submission.build(line, "#!/bin/sh\n", environ={}).job_fields(uid=1000, user="alice")
    script = job.pop("script")
    assert script == "#!/bin/sh\n"
    assert job == {
        "uid": 1000, "user": "alice", "account": "proj", "qos": "high",
        "tres_per_node": "gres:gpu:1,gres:shard:2,gres:nic:1", "tres_per_job": "gres:gpu:a100:2",
        "tres_per_task": "gres:gpu:1", "cpus_per_tres": "gres:gpu:4",
        "mem_per_tres": "gres:gpu:2048", "features": "a100", "exc_nodes": "n[1-2]",
        "tres_freq": "gpu:high", "prefer": "v100", "time_limit": 60,
        "min_nodes": 1, "max_nodes": 2, "num_tasks": 2, "shared": 2, "name": "job.sh",
        "batch": True}


def test_explain_builds_every_field_the_hook_sends():
    line = split_command_line(["-p", "gpu", "-A", "a", "-q", "q", "--gres=gpu:1", "--gpus=1",
                               "--gpus-per-socket=1", "--gpus-per-task=1", "--cpus-per-gpu=1",
                               "--mem-per-gpu=1", "--ntasks-per-gpu=1", "--gpu-freq=low", "-C",
                               "f", "--prefer=g", "-x", "n1",
                               "-t", "1", "-N", "1", "-n", "1", "--exclusive", "-J", "j",
                               "--comment=c", "-w", "n2", "--reservation=r", "job.sh", "arg"])
    job = Submission.build(line, "#!/bin/sh\n", environ={}).job_fields(uid=1, user="u")
    # Array and het fields are the hook's alone: --explain models neither; script_digest stands
    # in for a script the hook sent before (the wrapper always sends the script).
    assert set(job) == set(protocol.JOB_FIELDS) - {"array_inx", "het_job_offset", "script_digest"}
    assert job["argv"] == ["job.sh", "arg"] and job["req_nodes"] == "n2"


def test_wrap_builds_sbatchs_script_and_name():
    line = split_command_line(["--wrap", "python train.py"])
    job = Submission.build(line, "", environ={}).job_fields(uid=1, user="u", default_partition="gpu")
    assert job["script"] == ("#!/bin/sh\n# This script was created by sbatch --wrap.\n\n"
                             "python train.py\n")
    assert job["name"] == "wrap" and job["partition"] == "gpu"


# ---- --no-share --------------------------------------------------------------------------------

def test_comment_token_is_added_once_keeping_the_users_text():
    assert add_comment_token(None, "gpushare=off") == "gpushare=off"
    assert add_comment_token("my run", "gpushare=off") == "my run gpushare=off"
    assert add_comment_token("a,gpushare=off", "gpushare=off") == "a,gpushare=off"


def test_no_share_keeps_the_script_comment_and_the_script_arguments(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    line = split_command_line(["-p", "gpu", "--no-share", "--", str(script), "--comment=x"], FLAGS)
    argv = wrapper.opt_out_argv(line, None, Config())
    assert argv == ["-p", "gpu", "--comment=my run gpushare=off", "--", str(script), "--comment=x"]
    line = split_command_line(["--comment", "cli", "--no-share", str(script)], FLAGS)
    assert wrapper.opt_out_argv(line, None, Config())[:3] == ["--comment", "cli",
                                                              "--comment=cli gpushare=off"]


# ---- pass-through, with a stand-in sbatch that records what it got -----------------------------

FAKE_SBATCH = """#!/bin/sh
printf '%s\\n' "$@" > "$RECORD.argv"
cat > "$RECORD.stdin"
printf 'Submitted batch job 4294967290\\n'
printf 'sbatch: some note\\n' >&2
exit 7
"""


def _run_wrapper(tmp_path, args, *, stdin=b"", env=None):
    fake = tmp_path / "sbatch"
    fake.write_text(FAKE_SBATCH)
    fake.chmod(0o755)
    environ = {**os.environ, "GPUSHARE_SBATCH": str(fake), "RECORD": str(tmp_path / "rec"),
               "GPUSHARE_QUERY_SOCKET": str(tmp_path / "no-daemon.sock"),
               "PYTHONPATH": str(REPO), **(env or {})}
    code = "import sys; from slurm_gpushare.user.wrapper import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], input=stdin, env=environ,
                          capture_output=True, timeout=30)


def test_passes_everything_through_unchanged(tmp_path):
    args = ["-J", "a b", "--wrap=x", "--", "weird arg", "--explain"]
    result = _run_wrapper(tmp_path, args, stdin=b"input bytes\x00\xff")
    assert result.returncode == 7
    assert result.stdout == b"Submitted batch job 4294967290\n"
    assert (tmp_path / "rec.argv").read_text().splitlines() == args
    assert (tmp_path / "rec.stdin").read_bytes() == b"input bytes\x00\xff"
    errors = result.stderr.decode().splitlines()
    # sbatch's own stderr first, then exactly one line of ours (no daemon: a warning).
    assert errors[0] == "sbatch: some note" and len(errors) == 2
    assert errors[1].startswith("gpushare-sbatch: warning: the gpushare daemon is not reachable")
    assert "4294967290 was submitted as plain sbatch would" in errors[1]


def test_no_share_with_the_script_on_stdin(tmp_path):
    result = _run_wrapper(tmp_path, ["-o", "/dev/null", "--no-share"], stdin=SCRIPT.encode())
    assert result.returncode == 7
    assert (tmp_path / "rec.argv").read_text().splitlines() == [
        "-o", "/dev/null", "--comment=my run gpushare=off"]
    assert (tmp_path / "rec.stdin").read_bytes() == SCRIPT.encode()


def test_explain_without_daemon_is_one_line_and_submits_nothing(tmp_path):
    result = _run_wrapper(tmp_path, ["--explain", "-p", "gpu", "--gres=gpu:1", "--wrap", "true"])
    assert result.returncode == 1 and not (tmp_path / "rec.argv").exists()
    assert result.stderr.decode().count("\n") == 1
    assert "not reachable" in result.stderr.decode() and result.stdout == b""


# ---- --explain against a daemon in this process ----------------------------------------------------

def test_explain_asks_the_daemon_and_submits_nothing(daemon, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPUSHARE_QUERY_SOCKET", daemon.query_socket)
    monkeypatch.setenv("GPUSHARE_SBATCH", "/nonexistent/sbatch")  # would fail if called
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n#SBATCH --comment=gpushare:mem=20G\npython train.py\n")
    assert wrapper.main(["--explain", "-p", "gpu", "--gres=gpu:1", str(script)]) == 0
    out = capsys.readouterr().out
    assert "would run as a share: 22 GiB of GPU memory (gres/shard) on a100" in out
    assert "excluded v100" in out and "[hint-share]" in out
    assert "submitted  nothing" in out

    assert wrapper.main(["--explain", "--json", "--no-share", "-p", "gpu", "--gpus=1",
                         str(script)]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["decision"]["code"] == "opt-out"
    assert answer["job"]["comment"] == "gpushare:mem=20G gpushare=off"
    assert "script" not in answer["job"] and answer["job"]["script_bytes"] > 0


def test_explain_reports_unusable_arguments_in_one_line(daemon, monkeypatch, capsys):
    monkeypatch.setenv("GPUSHARE_QUERY_SOCKET", daemon.query_socket)
    assert wrapper.main(["--explain", "-t", "soon", "--wrap", "x"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid time limit" in err
    assert wrapper.main(["--json", "--wrap", "x"]) == 1
    assert "--json goes with --explain" in capsys.readouterr().err


# ---- what Slurm recorded ---------------------------------------------------------------------------

def test_tags_and_scontrol_lines_are_read_safely():
    tag = Tag.decode("gpushare:v1:share:id=0a1b2c3d:shard=22:types=a100:why=hint-share")
    assert tag == Tag("share", "hint-share", "0a1b2c3d", shard=22, types=("a100",))
    assert Tag.decode("") is None and Tag.decode("someone else's note") is None
    kept = decision_from_tag(Tag.decode("gpushare:v1:keep:id=0a1b2c3d:why=first-run"))
    assert kept["action"] == "keep" and "whole GPU" in kept["reason"]
    assert "[first-run]" in render_rows(decision_rows(kept))
    mps = decision_from_tag(Tag.decode(
        "gpushare:v1:share:id=0a1b2c3d:mps=25:mem=4096:types=t4:why=history-share"))
    headline = dict(decision_rows(mps))["decision"]
    assert headline == "runs as an MPS share: 25% of a GPU (gres/mps, memory limit 4.0 GiB) on t4"
    shard = decision_from_tag(Tag.decode(
        "gpushare:v1:share:id=0a1b2c3d:shard=22:types=a100:why=hint-share"))
    assert "22 GiB of GPU memory (gres/shard) on a100" in dict(decision_rows(shard))["decision"]
    fields = parse_scontrol_line("JobId=5 AdminComment=gpushare:v1:x Comment=a b gpushare=off "
                                 "AdminComment=fake StdErr=/x")
    assert fields["AdminComment"] == "gpushare:v1:x"
    assert fields["Comment"] == "a b gpushare=off" and fields["StdErr"] == "/x"


def test_explain_asks_the_daemon_for_an_array_task_by_its_own_id(monkeypatch):
    """68_3 is job 72 to the daemon (its decision, telemetry and co-runners are under 72)."""
    from slurm_gpushare.user import explain

    asked = []
    monkeypatch.setattr(explain, "slurm_job", lambda job_id: {
        "JobId": "72", "ArrayJobId": "68", "ArrayTaskId": "3", "JobState": "RUNNING"})
    monkeypatch.setattr(explain, "job_outcome", lambda job_id: None)

    def query(socket_path, message, timeout=2.0):
        asked.append(message["job_id"])
        return {"ok": True, "job": {}, "co_runners": [{"job_id": "73", "class": 1}],
                "record": {"action": "share", "code": "history-share", "share_gib": 8,
                           "gpu_types": ["a100"], "decision_id": "d1"}}

    monkeypatch.setattr(explain, "query", query)
    report = explain.explain_job("68_3", socket_path="/nonexistent")
    assert asked == ["72"] and report["numeric_id"] == "72"
    assert "73 (class 1)" in explain.format_report(report)


def test_explain_reads_a_daemon_reply_of_the_wrong_shape_as_no_record(monkeypatch):
    from slurm_gpushare.user import explain

    monkeypatch.setattr(explain, "slurm_job", lambda job_id: {
        "JobId": "7", "JobState": "PENDING",
        "AdminComment": "gpushare:v1:keep:id=ab12:why=idle-gpu"})
    monkeypatch.setattr(explain, "job_outcome", lambda job_id: None)
    monkeypatch.setattr(explain, "query", lambda *a, **k: {"ok": True, "job": 5, "record": []})
    report = explain.explain_job("7", socket_path="/nonexistent")
    assert report["source"] == "admin_comment" and report["decision"]["code"] == "idle-gpu"


@pytest.mark.parametrize("stderr, message", [
    ("slurm_load_jobs error: Invalid job id specified", "job 123 is unknown to Slurm"),
    ("slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
     "Slurm did not answer about job 123: slurm_load_jobs error: Unable to contact slurm "
     "controller (connect failure)"),
])
def test_explain_tells_an_unknown_job_from_a_slurm_that_does_not_answer(
        tmp_path, monkeypatch, stderr, message):
    from slurm_gpushare.core.errors import UserError
    from slurm_gpushare.user import explain

    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho '{stderr}' >&2\nexit 1\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(UserError) as error:
        explain.explain_job("123", socket_path=str(tmp_path / "none.sock"))
    assert message in str(error.value)


# ---- on the real test cluster -------------------------------------------------------------------------
