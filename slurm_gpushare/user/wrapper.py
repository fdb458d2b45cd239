"""``gpushare-sbatch`` (also ``slurm-gpushare sbatch``): sbatch, plus a look at the decision.

Without its own flags it runs the real sbatch with the same arguments, standard input and
standard error, relays its standard output byte for byte and returns its exit status; after a
successful submission it adds one line on standard error: the decision recorded on the job
(its AdminComment tag), or a warning when the gpushare daemon is not reachable (the job then
runs exactly as plain sbatch submitted it). Standard output stays sbatch's alone, so
``jobid=$(gpushare-sbatch --parsable ...)`` keeps working.

Its own flags, recognised only among sbatch's options (never among the script's arguments):

* ``--explain``: build the job fields the hook would see from the options, the ``SBATCH_*``
  environment and the script's ``#SBATCH`` lines, ask the daemon's query socket what it would
  decide and why; submit nothing. ``--json`` prints the answer as JSON.
* ``--no-share``: the documented opt-out: adds the opt-out token (``gpushare=off``) to the
  job's comment, keeping the user's own comment.

``$GPUSHARE_SBATCH`` names the real sbatch (default: the first ``sbatch`` on PATH that is not
this program, so the wrapper may be installed as ``sbatch`` itself).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import sys
import threading
from pathlib import Path
from typing import IO

import click

from slurm_gpushare.core.errors import UserError
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.slurm import cmd
from slurm_gpushare.slurm.version import installed_version
from slurm_gpushare.user import explain as explainmod
from slurm_gpushare.core.config import Config
from slurm_gpushare.user.sbatchargs import (CommandLine, SbatchArgsError, Submission, add_comment_token,
                         script_options, split_command_line)

PROG = "gpushare-sbatch"
SBATCH_ENV = "GPUSHARE_SBATCH"
EXPLAIN, NO_SHARE, JSON = "--explain", "--no-share", "--json"
WRAPPER_FLAGS = (EXPLAIN, NO_SHARE, JSON)
_SUBMITTED = re.compile(rb"^Submitted batch job (\d+)(?: on cluster (\S+))?\s*$")
_PARSABLE = re.compile(rb"^(\d+)(?:;(\S+))?\s*$")


class WrapperError(UserError):
    """A problem of the wrapper itself (sbatch's own errors pass through untouched)."""


def find_sbatch() -> str:
    """The real sbatch: $GPUSHARE_SBATCH, else the first sbatch on PATH that is not us."""
    if os.environ.get(SBATCH_ENV):
        return os.environ[SBATCH_ENV]
    me = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(folder or ".", "sbatch")
        if os.access(candidate, os.X_OK) and os.path.realpath(candidate) != me:
            return candidate
    raise WrapperError("sbatch not found on PATH (set GPUSHARE_SBATCH to the real sbatch)")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``gpushare-sbatch``; returns sbatch's exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return run(argv)
    except UserError as exc:
        if os.environ.get("GPUSHARE_DEBUG"):
            raise
        click.echo(f"{PROG}: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def run(argv: list[str], *, stdin: IO[bytes] | None = None) -> int:
    """Do what ``gpushare-sbatch argv`` does; errors of the wrapper raise WrapperError."""
    try:
        command_line = split_command_line(argv, WRAPPER_FLAGS)
    except SbatchArgsError as exc:
        if not any(flag in argv for flag in WRAPPER_FLAGS):
            return submit(argv)  # not ours to judge: sbatch prints its own error
        raise WrapperError(str(exc)) from None
    flags = command_line.wrapper_flags
    if JSON in flags and EXPLAIN not in flags:
        raise WrapperError("--json goes with --explain")
    if not flags:
        return submit(argv)
    config = explainmod.user_config()
    stdin = stdin if stdin is not None else sys.stdin.buffer
    script_bytes = None
    if command_line.script is None and command_line.last("wrap") is None:
        script_bytes = stdin.read()  # the script comes on stdin: read it once, hand it on
    if EXPLAIN in flags:
        return explain_submission(command_line, script_bytes, config,
                                  no_share=NO_SHARE in flags, as_json=JSON in flags)
    return submit(opt_out_argv(command_line, script_bytes, config), stdin_bytes=script_bytes)


# ---- --no-share ------------------------------------------------------------------------------

def _script_text(command_line: CommandLine, script_bytes: bytes | None) -> str | None:
    if script_bytes is not None:
        return script_bytes.decode("utf-8", "replace")
    if command_line.script is None:
        return None
    try:
        return Path(command_line.script).read_text(errors="replace")
    except OSError:
        return None


def effective_comment(command_line: CommandLine, script: str | None) -> str | None:
    """The comment sbatch would send: the command line's, else the script's #SBATCH one."""
    option = command_line.last("comment")
    if option is not None:
        return option.value
    found = [o.value for o in script_options(script or "") if o.name == "comment"]
    return found[-1] if found else None


def opt_out_argv(command_line: CommandLine, script_bytes: bytes | None, config: Config) -> list[str]:
    """sbatch's argv with the opt-out token added to the job's comment."""
    if command_line.hetjob:
        raise WrapperError("--no-share does not handle heterogeneous jobs; add "
                           f"--comment={config.policy.opt_out_token} to each component")
    comment = effective_comment(command_line, _script_text(command_line, script_bytes))
    merged = add_comment_token(comment, config.policy.opt_out_token)
    words = list(command_line.option_words)
    # After the user's own --comment (the last one wins) but before a closing "--".
    at = len(words) - 1 if words and words[-1] == "--" else len(words)
    words.insert(at, f"--comment={merged}")
    tail = ([command_line.script] if command_line.script is not None else [])
    return words + tail + command_line.script_args


# ---- --explain -------------------------------------------------------------------------------

def default_partition() -> str:
    """The cluster's default partition, as the hook takes it from part_list."""
    for line in (cmd.output(["scontrol", "-o", "show", "partition"]) or "").splitlines():
        fields = explainmod.parse_scontrol_line(line)
        if fields.get("Default") == "YES":
            return fields.get("PartitionName", "")
    return ""


def explain_fields(command_line: CommandLine, script_bytes: bytes | None, config: Config, *,
                   no_share: bool = False, environ=None) -> dict:
    """The job object the hook would send for this submission."""
    if command_line.script is not None and script_bytes is None:
        try:
            script_bytes = Path(command_line.script).read_bytes()
        except OSError as exc:
            raise WrapperError(f"cannot read the batch script {command_line.script}: "
                               f"{exc.strerror}") from None
    text = (script_bytes or b"").decode("utf-8", "replace")
    try:
        submission = Submission.build(command_line, text, environ=environ)
        if no_share:
            submission.values["comment"] = add_comment_token(submission.get("comment"),
                                                             config.policy.opt_out_token)
        uid = os.getuid()
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
        partition = "" if submission.get("partition") else default_partition()
        version = installed_version()  # 23.11+ clients spell gres "gres/gpu:1"
        job = submission.job_fields(uid=uid, user=user, default_partition=partition,
                                    gres=version.tres_prefix if version else "gres:")
    except SbatchArgsError as exc:
        raise WrapperError(str(exc)) from None
    # The hook sends at most max_script_bytes of the script.
    limit = config.hook.max_script_bytes
    if len(job["script"].encode()) > limit:
        job["script"] = job["script"].encode()[:limit].decode("utf-8", "ignore")
    return job


def explain_submission(command_line: CommandLine, script_bytes: bytes | None, config: Config, *,
                       no_share: bool = False, as_json: bool = False) -> int:
    job = explain_fields(command_line, script_bytes, config, no_share=no_share)
    socket_path = explainmod.query_socket_path(config)
    try:
        reply = explainmod.query(socket_path, {"op": "explain", "job": job})
    except explainmod.DaemonUnavailable as exc:
        raise WrapperError(f"{exc}; nothing to explain (a submission now would run "
                           "exactly as written)") from None
    if not reply.get("ok"):
        raise WrapperError(f"the daemon refused the request: {reply.get('error')}")
    decision = reply.get("decision") or {}
    if as_json:
        shown = {k: v for k, v in job.items() if k != "script"}
        shown["script_bytes"] = len(job["script"].encode())
        click.echo(json.dumps({"job": shown, "decision": decision}, indent=2, sort_keys=True))
    else:
        request = ", ".join(f"{k}={job[k]}" for k in ("partition", "tres_per_node", "tres_per_job",
                                                      "features", "comment") if job.get(k))
        rows = [("request", request or "no GPU or partition options")]
        rows += explainmod.decision_rows(decision, what_if=True, extra=reply)
        rows.append(("submitted", "nothing (--explain)"))
        click.echo(explainmod.render_rows(rows))
    return 0


# ---- submission ------------------------------------------------------------------------------

def submit(argv: list[str], *, stdin_bytes: bytes | None = None) -> int:
    """Run the real sbatch; relay its stdout and report the decision on stderr."""
    sbatch = find_sbatch()
    quiet, parsable = _output_options(argv)
    job_line = _PARSABLE if parsable else _SUBMITTED
    try:
        # argv[0] "sbatch", so its messages read exactly as when run by hand.
        proc = cmd.popen(["sbatch", *argv], executable=sbatch, stdout=cmd.PIPE,
                         stdin=cmd.PIPE if stdin_bytes is not None else None)
    except OSError as exc:
        raise WrapperError(f"cannot run {sbatch}: {exc.strerror}") from None
    if stdin_bytes is not None:
        threading.Thread(target=_feed, args=(proc.stdin, stdin_bytes), daemon=True).start()
    # The terminal's Ctrl-C reaches sbatch directly (same process group); forward what is sent
    # to the wrapper alone, so `sbatch --wait` is interrupted as if it ran by itself.
    previous = {}
    if threading.current_thread() is threading.main_thread():  # signal.signal's requirement
        previous = {sig: signal.signal(sig, lambda s, _f: proc.send_signal(s))
                    for sig in (signal.SIGTERM, signal.SIGHUP)}
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        out = sys.stdout.buffer
        reported = False
        for line in iter(proc.stdout.readline, b""):
            out.write(line)
            out.flush()
            if not reported:
                match = job_line.match(line)
                if match:
                    reported = True
                    report_decision(match.group(1).decode(),
                                    match.group(2).decode() if match.group(2) else None,
                                    quiet=quiet)
        status = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - status if status < 0 else status


def _feed(pipe: IO[bytes], data: bytes) -> None:
    try:
        pipe.write(data)
    except BrokenPipeError:
        pass
    finally:
        try:
            pipe.close()
        except BrokenPipeError:
            pass


def _output_options(argv: list[str]) -> tuple[bool, bool]:
    """(--quiet, --parsable) as sbatch will read them."""
    try:
        names = {o.name for o in split_command_line(argv).options}
    except SbatchArgsError:
        return False, False
    return "quiet" in names, "parsable" in names


def report_decision(job_id: str, cluster: str | None, *, quiet: bool = False) -> None:
    """One line on stderr: the decision on the job, or why there is none."""
    try:
        job = explainmod.slurm_job(job_id, cluster)
    except UserError:
        job = None
    tag = Tag.decode(job.get("AdminComment")) if job else None
    if tag:
        if quiet:
            return
        if tag.shared:
            what = f"runs as a share: {explainmod.share_phrase(tag)} on " + (
                " or ".join(tag.types) or "any type")
        else:
            what = "keeps its whole GPU(s)"
        click.echo(f"gpushare: job {job_id} {what} [{tag.why}]; details: "
                   f"slurm-gpushare explain {job_id}", err=True)
        return
    reachable, why = explainmod.daemon_reachable(explainmod.query_socket_path())
    if not reachable:
        click.echo(f"{PROG}: warning: {why or 'the gpushare daemon did not answer'}; job "
                   f"{job_id} was submitted as plain sbatch would submit it", err=True)
    elif not quiet and job and _asks_for_gpu(job):
        token = explainmod.user_config().policy.opt_out_token
        why = " (opted out)" if token in re.split(r"[\s,;]+", job.get("Comment", "")) else ""
        click.echo(f"gpushare: job {job_id} keeps its whole GPU(s) as submitted{why}; details: "
                   f"slurm-gpushare explain {job_id}", err=True)


def _asks_for_gpu(job: dict[str, str]) -> bool:
    return any("gpu" in job.get(key, "") for key in ("TresPerNode", "TresPerJob", "TresPerTask",
                                                     "TresPerSocket"))


__all__ = ["main", "run", "submit", "find_sbatch", "explain_fields", "opt_out_argv"]
