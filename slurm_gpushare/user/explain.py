"""What the product decided (or would decide) for a job, for the people who submit jobs.

User-side tools cannot reach the daemon's 0600 hook socket; they talk to its read-only
*query* socket (``daemon.query_socket``, or ``$GPUSHARE_QUERY_SOCKET``), which answers two ops
for the peer's uid (SO_PEERCRED):

* ``{"v": 1, "op": "explain", "job": {...}}`` -- the what-if decision for a job description
  (the same job fields the hook sends, ``protocol.JOB_FIELDS``);
* ``{"v": 1, "op": "job", "job_id": "123"}`` -- the decision recorded for a job the peer owns
  (any job for root and SlurmUser).

``slurm-gpushare explain JOBID`` asks the daemon for its record; when the daemon cannot answer
it falls back to what Slurm itself recorded: the job's ``AdminComment`` tag
(``gpushare:v1:share:id=...:shard=N:types=a+b:why=code``) and, once finished, its accounting.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping


from slurm_gpushare.core.errors import UserError
from slurm_gpushare.daemon.protocol import request
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.slurm import cmd
from slurm_gpushare import PROTOCOL_VERSION
from slurm_gpushare.core.config import Config, ConfigError, load_config

QUERY_SOCKET_ENV = "GPUSHARE_QUERY_SOCKET"

# What each reason code's source means, for decisions known only from their tag.
SOURCE_PHRASES = {
    "history": "peak GPU memory of this job's earlier runs + margin",
    "hint": "the memory hint in the job's comment + margin",
    "default": "the default share (no earlier runs, no memory hint)",
}
# Kept-but-tagged decisions (the job is eligible, its GPU stays whole this time).
KEEP_PHRASES = {
    "first-run": "no history yet: runs on a whole GPU and is profiled so its next run can share",
    "memory-unknown": "earlier runs left no usable memory measurement; keeps a whole GPU",
    "does-not-fit": "the job's memory fits no GPU type's share; keeps a whole GPU",
    "unknown-type": "the requested GPU type is not configured for sharing",
}
# How the per-type memory figures were obtained, by source.
MEMORY_NOTES = {"history": "predicted peak + margin", "hint": "hint + margin",
                "default": "default share"}


class DaemonUnavailable(UserError):
    """The query socket did not answer."""


def user_config() -> Config:
    """The site configuration if this user can read it; the defaults otherwise."""
    try:
        return load_config()
    except ConfigError:
        return Config()


def query_socket_path(config: Config | None = None) -> str:
    """$GPUSHARE_QUERY_SOCKET, else ``daemon.query_socket`` ("" when the site turned it off)."""
    if os.environ.get(QUERY_SOCKET_ENV):
        return os.environ[QUERY_SOCKET_ENV]
    return (config or user_config()).daemon.query_socket


def query(socket_path: str, message: dict[str, Any], timeout: float = 2.0) -> dict[str, Any]:
    """One request on the query socket. Raises DaemonUnavailable if nobody answers."""
    if not socket_path:
        raise DaemonUnavailable("the site turned the query socket off (daemon.query_socket)")
    try:
        reply = request(socket_path, {"v": PROTOCOL_VERSION, **message}, timeout)
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise DaemonUnavailable(f"the gpushare daemon is not reachable on {socket_path}: {why}")
    if not isinstance(reply, dict):
        raise DaemonUnavailable(f"unreadable reply from {socket_path}")
    return reply


def daemon_reachable(socket_path: str, timeout: float = 1.0) -> tuple[bool, str]:
    try:
        reply = query(socket_path, {"op": "ping"}, timeout)
    except DaemonUnavailable as exc:
        return False, str(exc)
    return bool(reply.get("ok")), str(reply.get("error", ""))


# ---- what Slurm recorded -------------------------------------------------------------------

def slurm_job(job_id: str, cluster: str | None = None) -> dict[str, str] | None:
    """``scontrol -o show job`` for one job (its first line for an array), or None where Slurm
    does not know it; UserError where Slurm did not answer (no controller, no config)."""
    args = ["scontrol", "-o", "show", "job", job_id]
    if cluster:
        args[1:1] = ["-M", cluster]
    result = cmd.run(args)
    if result.returncode != 0 and "Invalid job id" not in result.stderr:
        said = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[0]
        raise UserError(f"Slurm did not answer about job {job_id}: {said[:300]}")
    if result.returncode != 0 or not result.stdout.strip():
        return None
    return parse_scontrol_line(result.stdout.splitlines()[0])


def parse_scontrol_line(line: str) -> dict[str, str]:
    """``Key=value`` pairs of one ``scontrol -o`` line. Slurm's keys start with a capital;
    other words (``gpushare=off`` in a Comment with spaces) continue the value before them.
    The first occurrence of a key wins, so a user's comment cannot fake a field printed
    before it (AdminComment comes before Comment)."""
    fields: dict[str, str] = {}
    key = None
    for word in line.split(" "):
        match = re.match(r"^([A-Z][A-Za-z0-9_:/]*)=(.*)$", word)
        if match:
            key = match.group(1)
            if key not in fields:
                fields[key] = match.group(2)
            else:
                key = None
        elif key is not None and word:
            fields[key] += " " + word
    return fields


def numeric_job_id(job_id: str) -> str | None:
    """sacct's JobIDRaw of a job (an array task ``68_3`` -> its own id), or None."""
    result = cmd.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobIDRaw"])
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return lines[0] if result.returncode == 0 and lines else None


def job_outcome(job_id: str) -> dict[str, str] | None:
    """The finished job's accounting record (None while it runs or without accounting)."""
    names = ["JobID", "State", "ExitCode", "Elapsed", "NodeList", "AllocTRES"]
    result = cmd.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", ",".join(names)])
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0 or not lines:
        return None
    record = dict(zip(names, lines[0].split("|")))
    if record.get("State", "").split(" ")[0] in ("PENDING", "RUNNING", "REQUEUED", "SUSPENDED"):
        return None
    return record


# ---- reports ---------------------------------------------------------------------------------

def share_phrase(tag: Tag) -> str:
    """What a share is, in words: ``22 GiB share (gres/shard)`` or an MPS share and its limit."""
    if tag.shard is not None and tag.mem_mib is not None:  # shards other than 1 GiB
        return f"{tag.mem_mib / 1024:g} GiB share ({tag.shard} shards of gres/shard)"
    if tag.shard is not None:
        return f"{tag.shard} GiB share (gres/shard)"
    limit = f", memory limit {tag.mem_mib / 1024:.1f} GiB" if tag.mem_mib is not None else ""
    return f"{tag.mps}% MPS share (gres/mps{limit})"


def decision_from_tag(tag: Tag) -> dict[str, Any]:
    """A decision dict (the daemon's shape) rebuilt from an AdminComment tag."""
    code = tag.why
    source = code[:-len("-share")] if code.endswith("-share") else ""
    reason = SOURCE_PHRASES.get(source) or KEEP_PHRASES.get(code, code)
    if tag.shared and (tag.shard is not None or tag.mps is not None):
        reason = f"{reason}: {share_phrase(tag)} on {', '.join(tag.types) or 'any type'}"
    details: dict[str, Any] = {"source": source}
    if tag.mps is not None:
        details.update(sharing="mps", units=tag.mps, memory_limit_mib=tag.mem_mib)
    elif tag.shard is not None:
        details["sharing"] = "shard"
    return {"action": tag.action, "code": code, "reason": reason,
            "decision_id": tag.decision_id,
            "share_gib": tag.mem_mib / 1024 if tag.shard is not None and tag.mem_mib else tag.shard,
            "gpu_types": list(tag.types), "details": details}


def decision_from_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A decision dict from the daemon's stored record (flat; fingerprint keys left out)."""
    decision = {k: v for k, v in record.items() if k not in ("keys", "source", "details")}
    decision["details"] = {**(record.get("details") or {}), "source": record.get("source", "")}
    return decision


def explain_job(job_id: str, socket_path: str | None = None) -> dict[str, Any]:
    """Everything known about one job's sharing decision, as a JSON-able report.

    The daemon's record when it has one (asked on the query socket, which checks that the job
    is the caller's); else the job's AdminComment tag; plus Slurm's view and, once the job has
    finished, its accounting."""
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise UserError(f"not a job id: {job_id!r}")
    socket_path = socket_path or query_socket_path()
    report: dict[str, Any] = {"job_id": job_id}
    job = slurm_job(job_id)
    # The daemon knows an array task by its own numeric id (68_3 is, say, 72), as its
    # decisions, telemetry and co-runners are recorded.
    numeric = job_id
    if "_" in job_id:
        numeric = job.get("JobId", job_id) if job else (numeric_job_id(job_id) or job_id)
    if numeric != job_id:
        report["numeric_id"] = numeric
    try:
        reply = query(socket_path, {"op": "job", "job_id": numeric})
    except DaemonUnavailable as exc:
        reply = {"ok": False, "error": str(exc)}
    if str(reply.get("error", "")).startswith("permission denied"):
        raise UserError(f"job {job_id}: only its owner and admins may see its decision")
    admin_comment = None
    if reply.get("ok"):
        daemon_job = reply.get("job") if isinstance(reply.get("job"), dict) else {}
        admin_comment = daemon_job.get("admin_comment")
        if isinstance(reply.get("record"), dict):
            report["decision"] = decision_from_record(reply["record"])
            report["source"] = "daemon"
        # Whatever else the daemon knows (co-runners, predictions, outcome) goes along as is.
        report.update({k: v for k, v in reply.items()
                       if k not in ("v", "ok", "rid", "job", "record", "decision")})
    else:
        report["daemon_error"] = reply.get("error", "no answer")

    if job is None and not reply.get("ok"):
        raise UserError(f"job {job_id} is unknown to Slurm ({report['daemon_error']})")
    if job is not None:
        admin_comment = job.get("AdminComment", admin_comment)
        report["slurm"] = {k: job[k] for k in ("JobState", "Partition", "TresPerNode", "TresPerJob",
                                               "Features", "NodeList")
                           if job.get(k) not in (None, "", "(null)")}
    if "decision" not in report:
        tag = Tag.decode(admin_comment)
        report["source"] = "admin_comment"
        report["decision"] = decision_from_tag(tag) if tag else {
            "action": "keep", "code": "", "decision_id": "",
            "reason": "no gpushare tag: the job runs as submitted (kept, no GPU asked for, "
                      "or the daemon was not reachable at submission)"}
    if "outcome" not in report:
        outcome = job_outcome(job_id)
        if outcome:
            report["outcome"] = outcome
    return report


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB"


def decision_rows(decision: Mapping[str, Any], *, what_if: bool = False,
                  extra: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
    """A decision as ``(label, text)`` rows."""
    extra = extra or {}
    details = decision.get("details") or {}
    action = decision.get("action", "?")
    code = decision.get("code") or ""
    lines = []
    if action == "share":
        verb = "would run" if what_if else "runs"
        types = " or ".join(decision.get("gpu_types") or []) or "any type"
        if details.get("sharing") == "mps":
            limit = details.get("memory_limit_mib")
            limit = f", memory limit {_gib(limit)}" if limit else ""
            lines.append(("decision", f"{verb} as an MPS share: {details.get('units')}% of a "
                                      f"GPU (gres/mps{limit}) on {types}"))
        else:
            lines.append(("decision", f"{verb} as a share: {decision.get('share_gib')} GiB of "
                                      f"GPU memory (gres/shard) on {types}"))
    else:
        lines.append(("decision", ("would be kept" if what_if else "kept") + " as submitted"))
    lines.append(("why", f"{decision.get('reason', '')}" + (f" [{code}]" if code else "")))
    job_class = decision.get("job_class", details.get("job_class", extra.get("job_class")))
    if job_class is not None:
        lines.append(("class", f"interference class {job_class}"))
    elif details.get("source") in ("hint", "default"):
        lines.append(("class", "unknown (no earlier runs of this job)"))
    memory = details.get("memory_mib") or {}
    if memory:
        note = MEMORY_NOTES.get(details.get("source"), "estimate + margin")
        lines.append(("memory", ", ".join(f"{t} {_gib(v)}" for t, v in sorted(memory.items()))
                      + f" per GPU ({note})"))
    chosen = decision.get("gpu_types") or []
    excluded = details.get("excluded_types") or []
    if chosen or excluded:
        lines.append(("types", f"chosen {', '.join(chosen) or 'none'}; "
                               f"excluded {', '.join(excluded) or 'none'}"))
    for key, label in (("chosen_nodes", "nodes"), ("excluded_nodes", "excluded nodes")):
        value = details.get(key) or extra.get(key)
        if value:
            lines.append((label, ", ".join(value) if isinstance(value, list) else str(value)))
    writes = decision.get("writes") or {}
    shown = {k: v for k, v in writes.items() if k != "admin_comment"}
    if shown:
        lines.append(("changes", " ".join(f"{k}={v}" for k, v in shown.items())))
    corunners = extra.get("co_runners", details.get("co_runners"))
    if corunners is not None:
        lines.append(("co-runners", ", ".join(map(_corunner, corunners)) or "none seen"))
    if decision.get("decision_id") and not what_if:  # a what-if decision is not recorded
        lines.append(("id", str(decision["decision_id"])))
    return lines


def render_rows(rows: list[tuple[str, str]], indent: str = "") -> str:
    width = max((len(label) for label, _ in rows), default=0)
    return "\n".join(f"{indent}{label:<{width}}  {text}" for label, text in rows)


def _corunner(entry: Any) -> str:
    if isinstance(entry, Mapping):
        text = str(entry.get("job_id", "?"))
        if entry.get("class") is not None:
            text += f" (class {entry['class']})"
        return text
    return str(entry)


def format_report(report: Mapping[str, Any]) -> str:
    rows = decision_rows(report.get("decision") or {}, extra=report)
    slurm = report.get("slurm") or {}
    if slurm:
        rows.append(("slurm", " ".join(f"{k}={v}" for k, v in slurm.items()
                                       if k != "AdminComment")))
    outcome = report.get("outcome")
    if outcome:
        rows.append(("outcome", f"{outcome.get('State')} after {outcome.get('Elapsed')} on "
                                f"{outcome.get('NodeList')} (exit {outcome.get('ExitCode')}; "
                                f"{outcome.get('AllocTRES') or 'no TRES recorded'})"))
    if report.get("source") == "admin_comment":
        why = report.get("daemon_error", "it kept no record of this job")
        rows.append(("source", f"the job's AdminComment tag (daemon: {why})"))
    return f"job {report['job_id']}\n" + render_rows(rows, indent="  ")
