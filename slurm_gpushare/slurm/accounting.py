"""Slurm accounting ingestion: what each job was, from ``sacct``, for the savings reports.

One ``JobRecord`` per job (an array task is a job, ``123_4``; a heterogeneous component is a
job, ``123+1``); step lines (``123.batch``, ``123.0``, ``123_4.extern``) are folded into their
job's ``steps``. Both of 22.05's machine formats are read:

- ``sacct -P -o <SACCT_FIELDS>`` with ``SLURM_TIME_FORMAT=%s`` (ISO times are accepted too),
  split by column position; AdminComment is the last field so a ``|``
  inside it cannot shift the others;
- ``sacct --json`` (openapi dbv0.0.38 layout, 22.05; and 24.11's, whose numbers are wrapped
  objects and states lists).

Of the AdminComment only the product's own tag (``gpushare:v1:...``) is kept: an admin's free
text has no place in a report. Job names and scripts are never requested.

Incremental use: ``AccountingCache`` keeps the finished jobs already ingested and the last end
time seen under a state directory, so a later run asks sacct only for what ended since (with a
slack for records that reach slurmdbd late). Jobs still running are never cached.
"""

from __future__ import annotations

import contextlib
import gc
import io
import itertools
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from slurm_gpushare.core.files import replace_atomically
from slurm_gpushare.core.hostlist import expand_hostlist
from slurm_gpushare.core.tag import TAG_PREFIX, Tag
from slurm_gpushare.slurm import cmd
from slurm_gpushare.slurm.jobs import gres_placements

SACCT_FIELDS = ("JobID", "JobIDRaw", "Cluster", "User", "Account", "Partition", "State",
                "ExitCode", "DerivedExitCode", "Submit", "Eligible", "Start", "End",
                "ElapsedRaw", "NNodes", "NodeList", "ReqTRES", "AllocTRES",
                "TRESUsageInMax", "AdminComment")
# AdminComment is free text, so it goes last. Constraints is left out: it is free text as well
# and its OR operator is the delimiter ("a100|v100"), so with -P it would split into two fields.

# States of jobs that have not finished; they are left out of finished figures.
ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
                           "RESIZING", "SUSPENDED", "CONFIGURING", "COMPLETING", "STAGE_OUT",
                           "SIGNALING", "RESV_DEL_HOLD", "SPECIAL_EXIT", "STOPPED"})
# Finished but not successful (CANCELLED is counted on its own: a user's choice, not a fault).
FAILURE_STATES = frozenset({"FAILED", "OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL",
                            "DEADLINE", "PREEMPTED"})
SIGKILL = 9
PROGRESS_MIN_LINES = 20000  # below this, parsing is too quick for a progress bar to help
# Free-text fields: with -P only the last field may hold a '|' without shifting the others.
FREE_TEXT_FIELDS = frozenset({"AdminComment", "Comment", "SystemComment", "Constraints",
                              "JobName", "WorkDir", "SubmitLine", "Reason"})
LATE_RECORD_SLACK_S = 3600  # re-read this much before the last end seen (late dbd records)


class AccountingError(RuntimeError):
    """sacct could not be run or its output not read."""


@contextlib.contextmanager
def gc_paused():
    """No cyclic garbage collection inside: reading a million jobs makes millions of objects
    that live on, and each full collection would walk them all again (a quarter of the time)
    to find no cycle. Reference counting still frees everything that is dropped. On the way
    out the objects made inside go straight to the oldest generation (freeze, unfreeze), or
    the first young collection after would walk them all at once."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if not gc.get_freeze_count():  # leave what others froze frozen
            gc.freeze()
            gc.unfreeze()
        if enabled:
            gc.enable()


@dataclass(frozen=True, slots=True)
class StepRecord:
    step_id: str  # "batch", "extern", "0", ...
    state: str
    exit_code: int | None = None
    signal: int | None = None
    elapsed_s: float | None = None
    # Slurm's own GPU accounting (23.02+ with AutoDetect=nvml; None where it has none): the
    # step's peak GPU memory and utilisation, per process, so right on a shared GPU too.
    gpu_mem_mib: float | None = None
    gpu_util_pct: float | None = None


_UNDECODED = object()


@dataclass(slots=True)  # slots: a site's month is a million of these
class JobRecord:
    """One job (array task or het component included) as accounting knows it."""

    job_id: str  # as Slurm shows it: "123", "123_4", "123+1"
    raw_id: str = ""  # JobIDRaw: the unique numeric id
    cluster: str = ""
    user: str = ""
    account: str = ""
    partition: str = ""
    state: str = ""  # "CANCELLED by 0" is normalised to "CANCELLED"
    exit_code: int | None = None
    signal: int | None = None
    submit: float | None = None
    start: float | None = None
    end: float | None = None
    elapsed_s: float | None = None
    nodes: str = ""
    req_tres: dict[str, float] = field(default_factory=dict)
    alloc_tres: dict[str, float] = field(default_factory=dict)
    tag: str = ""  # the product's AdminComment tag, or ""
    steps: list[StepRecord] = field(default_factory=list)
    gpu_type: str = ""  # filled by ``resolve_gpu_types``
    # Runs of a requeued job before its final one (``sacct -D`` lists each run, same JobID).
    earlier_runs: list["JobRecord"] = field(default_factory=list)
    # Worked out once from ``tag`` and ``alloc_tres`` (reports read them many times per job).
    # ``shared``: the hook turned this job's whole-GPU request into a share.
    shared: bool = field(default=False, init=False, repr=False, compare=False)
    gpus: float = field(default=0.0, init=False, repr=False, compare=False)
    shards: float = field(default=0.0, init=False, repr=False, compare=False)
    _decision: Any = field(default=_UNDECODED, init=False, repr=False, compare=False)

    # -- what the tag says -----------------------------------------------------------------
    def __post_init__(self):  # the sacct reader sets the same in ``_sacct_record``
        self.shared = Tag.action_of(self.tag) == "share"
        # Whole GPUs allocated (typed and untyped TRES name the same GPUs; take one), shards.
        self.gpus = _gres_count(self.alloc_tres, "gpu")
        self.shards = _gres_count(self.alloc_tres, "shard")

    @property
    def decision(self) -> Tag | None:
        """The decoded tag (decoded when first asked for: most reports never need it)."""
        if self._decision is _UNDECODED:
            self._decision = Tag.decode(self.tag)
        return self._decision

    @property
    def decision_id(self) -> str:
        return self.decision.decision_id if self.decision else ""

    @property
    def decision_code(self) -> str:
        return self.decision.why if self.decision else ""

    # -- what it was given -----------------------------------------------------------------
    @property
    def requested_gpus(self) -> float:
        return _gres_count(self.req_tres, "gpu")

    @property
    def gpu_job(self) -> bool:
        return self.gpus > 0 or self.shards > 0 or self.shared

    @property
    def on_share(self) -> bool:
        """Ran on a share of a GPU: made one by the hook, or asked for shards itself."""
        return self.shared or self.shards > 0

    @property
    def exclusive_gpus(self) -> float:
        """GPUs the job would have held without sharing: a share replaced exactly one GPU."""
        return 1.0 if self.on_share else self.gpus

    # -- how it went -----------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return bool(self.state) and self.state not in ACTIVE_STATES and self.end is not None

    @property
    def started(self) -> bool:
        return self.start is not None

    @property
    def run_time_s(self) -> float | None:
        if self.start is not None and self.end is not None:
            return max(0.0, self.end - self.start)
        return self.elapsed_s if self.finished else None

    @property
    def queue_delay_s(self) -> float | None:
        if self.submit is not None and self.start is not None:
            return max(0.0, self.start - self.submit)
        return None

    @property
    def gpu_mem_peak_mib(self) -> float | None:
        """The GPU memory peak Slurm measured (``gres/gpumem``, the largest step's), or None
        where its accounting has none."""
        peaks = [s.gpu_mem_mib for s in self.steps if s.gpu_mem_mib is not None]
        return max(peaks) if peaks else None

    @property
    def gpu_util_peak_pct(self) -> float | None:
        """The GPU utilisation peak Slurm measured (``gres/gpuutil``), or None."""
        peaks = [s.gpu_util_pct for s in self.steps if s.gpu_util_pct is not None]
        return max(peaks) if peaks else None

    @property
    def oom_evidence(self) -> str:
        """Why the job counts as killed for memory: "state" (OUT_OF_MEMORY on the job or a
        step), "sigkill" (a failure by SIGKILL, how the kernel's OOM killer ends a process when
        no cgroup reports it), or "" when it does not."""
        state, steps = self.state, self.steps
        if state == "OUT_OF_MEMORY" or (steps and any(s.state == "OUT_OF_MEMORY" for s in steps)):
            return "state"
        if state == "FAILED" and (self.signal == SIGKILL or any(
                s.signal == SIGKILL and s.state == "FAILED" for s in steps)):
            return "sigkill"
        return ""

    @property
    def oom(self) -> bool:
        return bool(self.oom_evidence)

    @property
    def failed(self) -> bool:
        return self.finished and (self.state in FAILURE_STATES or self.oom)

    @property
    def cancelled(self) -> bool:
        return self.state == "CANCELLED"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for record in [data, *data["earlier_runs"]]:
            for derived in DERIVED_FIELDS:  # made again from tag and TRES
                del record[derived]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobRecord":
        data = dict(data)
        data["steps"] = [StepRecord(**s) for s in data.get("steps", [])]
        data["earlier_runs"] = [cls.from_dict(r) for r in data.get("earlier_runs", [])]
        known = set(cls.__dataclass_fields__) - set(DERIVED_FIELDS)
        return cls(**{k: v for k, v in data.items() if k in known})


DERIVED_FIELDS = ("shared", "gpus", "shards", "_decision")
_new = object.__new__


def _sacct_record(job_id: str, raw_id: str, cluster: str, user: str, account: str,
                  partition: str, state: str, exit_code: int | None, signal: int | None,
                  submit: float | None, start: float | None, end: float | None,
                  elapsed_s: float | None, nodes: str, req_tres: dict[str, float],
                  alloc_tres: dict[str, float], tag: str, gpus: float, shards: float
                  ) -> JobRecord:
    """``JobRecord(...)`` for the sacct reader at a third of its cost (a million per month):
    every slot set directly, the GPU and shard counts given (worked out once per TRES
    string). Sets what ``__init__`` and ``__post_init__`` set; a test holds the two equal."""
    record = _new(JobRecord)
    record.job_id, record.raw_id, record.cluster, record.user = job_id, raw_id, cluster, user
    record.account, record.partition, record.state = account, partition, state
    record.exit_code, record.signal = exit_code, signal
    record.submit, record.start, record.end, record.elapsed_s = submit, start, end, elapsed_s
    record.nodes, record.req_tres, record.alloc_tres, record.tag = nodes, req_tres, alloc_tres, tag
    record.steps, record.gpu_type, record.earlier_runs = [], "", []
    record.shared = bool(tag) and Tag.action_of(tag) == "share"
    record.gpus, record.shards, record._decision = gpus, shards, _UNDECODED
    return record


def _gres_count(tres: Mapping[str, float], name: str) -> float:
    plain = tres.get(f"gres/{name}")
    if plain is not None:
        return plain
    typed, total = f"gres/{name}:", 0
    for key, value in tres.items():
        if key.startswith(typed):
            total += value
    return total


# -- field parsers -------------------------------------------------------------------------
_MEM_UNITS = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 ** 2, "P": 1024.0 ** 3}


def parse_tres(text: str) -> dict[str, float]:
    """``billing=1,cpu=1,gres/shard=8,mem=8000M`` -> {name: count}; memory in MiB."""
    out: dict[str, float] = {}
    for part in (text or "").split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or not name:
            continue
        unit = value[-1:].upper()
        scale = 1.0
        if unit in _MEM_UNITS:
            value, scale = value[:-1], _MEM_UNITS[unit]
        try:
            out[name] = float(value) * scale
        except ValueError:
            continue  # a field we cannot read is left out, never guessed
    return out


_GPU_USAGE = re.compile(r"(?:^|,)gres/gpu(mem|util)=([0-9.]+)([KMGTP]?)")


def parse_gpu_usage(text: str) -> tuple[float | None, float | None]:
    """``gres/gpumem`` (MiB) and ``gres/gpuutil`` (%) of a step's ``TRESUsageInMax``
    (``cpu=00:56:24,...,gres/gpumem=38888M,gres/gpuutil=100,mem=...``); None for each that is
    not there (Slurm before 23.02, or no ``AutoDetect=nvml``)."""
    mem = util = None
    if "gres/gpu" in text:  # most sites: not there, and no regex run per step line
        for name, value, unit in _GPU_USAGE.findall(text):
            if name == "mem":
                mem = float(value) * _MEM_UNITS.get(unit, 1 / 1024 ** 2)  # no unit: bytes
            else:
                util = float(value)
    return mem, util


def _epoch(text: str) -> float | None:
    """``parse_time`` of a sacct field, quicker for epoch seconds (most of them)."""
    return float(text) if text.isdigit() and text != "0" else parse_time(text)


def parse_time(text: str | int | float | None) -> float | None:
    """Epoch seconds (``SLURM_TIME_FORMAT=%s``) or ISO local time; None when not set."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return float(text) if text > 0 else None
    text = text.strip()
    if not text or text in ("Unknown", "None", "N/A", "0"):
        return None
    if text.isdigit():
        return float(text)
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def parse_exit(text: str | None) -> tuple[int | None, int | None]:
    """sacct's ``ExitCode`` ``<return code>:<signal>``."""
    code, _, signal = (text or "").partition(":")
    try:
        return int(code), int(signal or 0)
    except ValueError:
        return None, None


def parse_state(text: str | None) -> str:
    """``CANCELLED by 0`` -> ``CANCELLED``; ``RUNNING`` stays."""
    return (text or "").split(" ")[0].strip().upper()


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def _own_tag(comment: str | None) -> str:
    comment = (comment or "").strip()
    return comment if comment.startswith(TAG_PREFIX) else ""


# -- sacct -P --------------------------------------------------------------------------------
def parse_psv(text: str | Iterable[str], *, progress: bool | None = None,
              total: int | None = None) -> list[JobRecord]:
    """Jobs from ``sacct -P`` output with a header line (steps folded into their jobs).

    ``text``: the whole output, or its lines (an open file: read as a stream, never held
    whole; ``total``: how many lines, for the progress bar). Each line is split once and read
    by column position into a compact record; repeated values (TRES strings, users, states)
    are parsed once and shared."""
    if isinstance(text, str):
        total = text.count("\n") if total is None else total
        text = io.StringIO(text)
    lines = iter(text)
    header = next(lines, "").rstrip("\r\n").split("|")
    if "JobID" not in header:
        raise AccountingError("sacct -P output needs its header line (do not pass -n)")
    early = [name for name in header[:-1] if name in FREE_TEXT_FIELDS]
    if early:
        raise AccountingError(f"sacct field {early[0]} is free text and may contain '|': "
                              "request it last, or not at all")
    rows = _with_progress(enumerate(lines, start=2), total, progress, "reading sacct")
    with gc_paused():
        return _psv_jobs(rows, header)


_ROW_JOB_ID = re.compile(r"^\d+([_+][0-9\[\]\-,%]+)?(\.[\w\-]+)?$")


class _Shared(dict):
    """Parsed values by their text, so a value seen a million times is parsed and held once
    (TRES strings, users, accounts, states). Bounded: cleared when it grows past ``limit``."""

    def __init__(self, parse: Callable[[str], Any], limit: int = 200_000):
        super().__init__()
        self.parse, self.limit = parse, limit

    def __missing__(self, text: str) -> Any:
        if len(self) >= self.limit:
            self.clear()
        value = self[text] = self.parse(text)
        return value


def _psv_jobs(rows: Iterable[tuple[int, str]], header: list[str]) -> list[JobRecord]:
    """Job lines become records, step lines (``123.batch``) join their job's ``steps`` in the
    order read; refuses a line that was cut short or is not sacct's (a report from it would be
    wrong). A job id seen more than once (a requeued job under ``sacct -D``) is one job: its
    latest run, holding the earlier ones in ``earlier_runs`` and every step line of the id.
    A line read twice (overlapping exports put together) counts once: the later one."""
    width = len(header)
    column = {name: i for i, name in enumerate(header)}

    def at(name: str) -> int:
        return column.get(name, width)  # a column not requested reads as ""

    (i_id, i_raw, i_cluster, i_user, i_account, i_partition, i_state, i_exit, i_submit,
     i_start, i_end, i_elapsed, i_nodes, i_req, i_alloc, i_usage, i_comment) = map(at, (
        "JobID", "JobIDRaw", "Cluster", "User", "Account", "Partition", "State", "ExitCode",
        "Submit", "Start", "End", "ElapsedRaw", "NodeList", "ReqTRES", "AllocTRES",
        "TRESUsageInMax", "AdminComment"))
    text = _Shared(sys.intern)
    tres, states, exits = _Shared(parse_tres), _Shared(parse_state), _Shared(parse_exit)
    counts = _Shared(lambda alloc: (_gres_count(tres[alloc], "gpu"),
                                    _gres_count(tres[alloc], "shard")))
    # Steps are values (frozen): the many alike ("batch", COMPLETED, 0:0, same run time) are
    # one object.
    step_of = _Shared(lambda key: StepRecord(key[0], states[key[1]], *exits[key[2]],
                                             _number(key[3]), *key[4]))
    jobs: dict[str, JobRecord] = {}
    orphans: dict[str, list[StepRecord]] = {}  # steps read before their job's line
    valid_id, held_run, epoch, number_of = _ROW_JOB_ID.match, jobs.get, _epoch, _number
    for number, line in rows:
        line = line.rstrip("\r\n")
        if not line:
            continue
        fields = line.split("|", width - 1)  # a '|' in the free-text last field stays in it
        if len(fields) < width:
            raise AccountingError(f"sacct line {number} is truncated: {len(fields)} of "
                                  f"{width} fields (first missing: {header[len(fields)]})")
        fields.append("")
        job_id = fields[i_id].strip()
        if not job_id:
            continue
        if not valid_id(job_id):
            raise AccountingError(f"sacct line {number} is corrupt: JobID {job_id[:40]!r}")
        parent, dot, step_id = job_id.partition(".")
        if dot:  # a step line: only what its job's figures read
            step = step_of[step_id, fields[i_state], fields[i_exit], fields[i_elapsed],
                           parse_gpu_usage(fields[i_usage])]
            held = held_run(parent)
            steps = orphans.setdefault(parent, []) if held is None else held.steps
            if step not in steps:  # the same step line read twice (overlapping exports)
                steps.append(step)
            continue
        if "[" in job_id:
            continue  # array tasks not yet started ("123_[4-9]"): not jobs until they run
        raw_id = fields[i_raw].strip()
        nodes, alloc = fields[i_nodes], fields[i_alloc]
        record = _sacct_record(
            job_id, job_id if raw_id == job_id else raw_id, text[fields[i_cluster]],
            text[fields[i_user]], text[fields[i_account]], text[fields[i_partition]],
            states[fields[i_state]], *exits[fields[i_exit]], epoch(fields[i_submit]),
            epoch(fields[i_start]), epoch(fields[i_end]), number_of(fields[i_elapsed]),
            "" if nodes == "None assigned" else text[nodes], tres[fields[i_req]],
            tres[alloc], tag if (tag := fields[i_comment].strip()).startswith(TAG_PREFIX)
            else "", *counts[alloc])  # only the product's own tag (as ``_own_tag``)
        held = held_run(job_id)
        if held is None:
            jobs[job_id] = record
        else:  # another run: the steps read so far go with the id's latest run
            steps, held.steps = held.steps, []
            _add_run(jobs, record)
            jobs[job_id].steps = steps
    for parent, steps in orphans.items():
        if parent in jobs:  # a step without its job line (cut-off output) is dropped
            held_steps = jobs[parent].steps
            held_steps[:0] = [step for step in steps if step not in held_steps]
    return list(jobs.values())


def _run_order(job: JobRecord) -> tuple[float, float]:
    return (job.start if job.start is not None else float("inf"),
            job.submit if job.submit is not None else float("inf"))


def _same_run(a: JobRecord, b: JobRecord) -> bool:
    """Two lines of one run of a job: the same submit time (a requeue gives the job a new one)
    and no two different start times (a later export may show a pending run started)."""
    return a.submit == b.submit and (a.start == b.start or a.start is None or b.start is None)


def _add_run(jobs: dict[str, JobRecord], record: JobRecord) -> None:
    held = jobs.get(record.job_id)
    if held is None:
        jobs[record.job_id] = record
        return
    # A run read twice (overlapping exports put together) is one run: its later line, from
    # the newer export, replaces the earlier.
    runs = [run for run in held.earlier_runs + [held] if not _same_run(run, record)]
    runs = sorted(runs + [record], key=_run_order)
    latest = runs[-1]
    for run in runs:
        run.earlier_runs = []
    latest.earlier_runs = runs[:-1]
    jobs[record.job_id] = latest


# -- sacct --json (22.05: openapi dbv0.0.38; 24.11: v0.0.41 with wrapped numbers) -------------
def parse_json(text: str, *, progress: bool | None = None) -> list[JobRecord]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise AccountingError(f"sacct --json output is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise AccountingError("sacct --json output has no 'jobs' list")
    jobs: dict[str, JobRecord] = {}
    for job in _with_progress(data["jobs"], len(data["jobs"]), progress, "reading sacct"):
        _add_run(jobs, _json_job(job))
    return list(jobs.values())


def _plain(value: Any) -> Any:
    """v0.0.39+ wraps numbers as ``{"set": true, "infinite": false, "number": 5}`` and states
    as lists (``["COMPLETED"]``); v0.0.38 (22.05) has them bare."""
    if isinstance(value, Mapping) and "number" in value:
        return value["number"] if value.get("set", True) else None
    if isinstance(value, list):
        return " ".join(str(v) for v in value) if value else None
    return value


def _json_job(job: Mapping[str, Any]) -> JobRecord:
    raw_id = str(job.get("job_id", ""))
    array = job.get("array") or {}
    het = job.get("het") or {}
    job_id = raw_id
    task_id, offset = _plain(array.get("task_id")), _plain(het.get("job_offset"))
    if task_id is not None and array.get("job_id"):
        job_id = f"{array['job_id']}_{task_id}"
    elif offset is not None and het.get("job_id"):
        job_id = f"{het['job_id']}+{offset}"
    times = {k: _plain(v) for k, v in (job.get("time") or {}).items()}
    exit_code, signal = _json_exit(job.get("exit_code"))
    record = JobRecord(
        job_id=job_id, raw_id=raw_id,
        cluster=job.get("cluster") or (job.get("association") or {}).get("cluster") or "",
        user=job.get("user") or "", account=job.get("account") or "",
        partition=job.get("partition") or "",
        state=parse_state(_plain((job.get("state") or {}).get("current"))),
        exit_code=exit_code, signal=signal,
        submit=parse_time(times.get("submission")), start=parse_time(times.get("start")),
        end=parse_time(times.get("end")), elapsed_s=_float(times.get("elapsed")),
        nodes="" if job.get("nodes") in (None, "None assigned") else job["nodes"],
        req_tres=_json_tres((job.get("tres") or {}).get("requested")),
        alloc_tres=_json_tres((job.get("tres") or {}).get("allocated")),
        tag=_own_tag((job.get("comment") or {}).get("administrator")),
    )
    for step in job.get("steps") or []:
        # The step's id ("batch", 0, 1); its name is the command line's program: not kept.
        # v0.0.39+ names the step "123.batch"; v0.0.38 "batch".
        step_id = str((step.get("step") or {}).get("id", "")).rpartition(".")[2]
        code, sig = _json_exit(step.get("exit_code"))
        record.steps.append(StepRecord(
            step_id=step_id, state=parse_state(_plain(step.get("state"))), exit_code=code,
            signal=sig, elapsed_s=_float(_plain((step.get("time") or {}).get("elapsed")))))
    return record


def _json_exit(value: Any) -> tuple[int | None, int | None]:
    if not isinstance(value, Mapping):
        return None, None
    signal = value.get("signal") or {}
    # v0.0.38: {"signal_id": 9}; v0.0.39+: {"id": {"set": true, "number": 9}}
    sig = (_plain(signal.get("signal_id", signal.get("id")))
           if isinstance(signal, Mapping) else None)
    code = _int(_plain(value.get("return_code")))
    if code is None and isinstance(value.get("return_code"), Mapping):
        code = 0  # v0.0.39+ leaves it unset for a job killed by a signal; sacct -P shows 0
    return code, _int(sig) or 0


def _json_tres(items: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items or []:
        if not isinstance(item, Mapping) or item.get("count") is None or item["count"] < 0:
            continue  # 24.11 lists TRES it has no figure for with a negative sentinel count
        name = item.get("type") or ""
        if item.get("name"):
            name = f"{name}/{item['name']}"
        out[name] = float(item["count"])
    return out


def _float(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def parse_sacct(text: str, *, progress: bool | None = None) -> list[JobRecord]:
    """Either format, recognised by its first character."""
    if text.lstrip().startswith("{"):
        return parse_json(text, progress=progress)
    return parse_psv(text, progress=progress)


def _with_progress(items: Iterable, total: int | None, progress: bool | None,
                   what: str) -> Iterator:
    """Iterate, with a rich progress bar on stderr for large inputs (``progress=None``: only
    when there are many lines, or an unknown number, and stderr is a terminal)."""
    if progress is None:
        progress = (total is None or total >= PROGRESS_MIN_LINES) and os.isatty(2)
    return _progress(items, total, what) if progress else iter(items)


def _progress(items: Iterable, total: int | None, what: str) -> Iterator:
    from rich.console import Console
    from rich.progress import Progress

    step = 1000  # advance the bar per thousand items: per item it would cost more than parsing
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=total)
        for done, item in enumerate(items, start=1):
            yield item
            if done % step == 0:
                bar.advance(task, step)


# -- running sacct ---------------------------------------------------------------------------
def sacct_argv(since: float, until: float, *, as_json: bool = False) -> list[str]:
    # -D: every run of a requeued job, each of which held GPUs.
    window = ["-a", "-D", "-S", _slurm_time(since), "-E", _slurm_time(until)]
    if as_json:
        return ["sacct", *window, "--json"]
    return ["sacct", *window, "-P", "-o", ",".join(SACCT_FIELDS)]


def _slurm_time(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%dT%H:%M:%S")


def run_sacct(since: float, until: float, *, as_json: bool = False,
              timeout: float = 600) -> str:
    """sacct's output for every job of every user in the window (needs operator rights)."""
    argv = sacct_argv(since, until, as_json=as_json)
    try:
        return cmd.check_output(argv, timeout=timeout, epoch_times=True)
    except cmd.SlurmError as exc:
        raise AccountingError(str(exc)) from None


# -- where jobs ran --------------------------------------------------------------------------
def node_gpus_from_scontrol(text: str) -> dict[str, tuple[str, int]]:
    """Node -> (GPU type, GPUs) from ``scontrol -o show nodes`` (``Gres=gpu:a100:2,shard:...``);
    nodes without typed GPUs are left out."""
    out: dict[str, tuple[str, int]] = {}
    for line in text.splitlines():
        name = re.search(r"\bNodeName=(\S+)", line)
        gres = re.search(r"\bGres=(\S+)", line)
        if not name or not gres:
            continue
        typed = re.search(r"(?:^|,)gpu:([A-Za-z0-9_.\-]+):(\d+)", gres.group(1))
        if typed:
            out[name.group(1)] = (typed.group(1), int(typed.group(2)))
    return out


def node_gpu_types_from_scontrol(text: str) -> dict[str, str]:
    """Node -> GPU type from ``scontrol -o show nodes``."""
    return {node: gpu_type for node, (gpu_type, _) in node_gpus_from_scontrol(text).items()}


def query_node_gpu_types(timeout: float = 10) -> dict[str, str]:
    out = cmd.output(["scontrol", "-o", "show", "nodes"], timeout=timeout)
    return node_gpu_types_from_scontrol(out) if out is not None else {}


def resolve_gpu_types(jobs: Iterable[JobRecord], node_types: Mapping[str, str]) -> None:
    """Fill ``gpu_type``: a typed GPU TRES, else the type of the node it ran on, else the
    tag's type when it allowed only one; "" when unknown."""
    # By TRES dict: jobs read from one sacct output share the dict of each TRES string.
    typed_in: dict[int, str] = {}
    for job in jobs:
        tres = job.alloc_tres
        typed = typed_in.get(id(tres))
        if typed is None:
            typed = typed_in[id(tres)] = next(
                (k.split(":", 1)[1] for k in tres
                 if k.startswith("gres/gpu:") or k.startswith("gres/shard:")), "")
        if typed:
            job.gpu_type = typed
            continue
        on_nodes = {node_types[n] for n in expand_hostlist(job.nodes) if n in node_types}
        if len(on_nodes) == 1:
            job.gpu_type = next(iter(on_nodes))
            continue
        allowed = job.decision.types if job.decision else ()
        if len(allowed) == 1:
            job.gpu_type = allowed[0]


def placements_from_scontrol(text: str) -> dict[str, set[tuple[str, int]]]:
    """Job id -> {(node, GPU index)} from ``scontrol show job -d`` (while the job runs;
    slurmctld forgets the indexes when a job ends). Array tasks and het components get the
    ids sacct uses (``123_4``, ``123+1``)."""
    out: dict[str, set[tuple[str, int]]] = {}
    for block in re.split(r"\n(?=JobId=)", text):
        head = re.search(r"JobId=(\d+)", block)
        if not head:
            continue
        job_id = head.group(1)
        array = re.search(r"ArrayJobId=(\d+) ArrayTaskId=(\d+)\b", block)
        het = re.search(r"HetJobId=(\d+) HetJobOffset=(\d+)", block)
        if array:
            job_id = f"{array.group(1)}_{array.group(2)}"
        elif het:
            job_id = f"{het.group(1)}+{het.group(2)}"
        for node, indexes in gres_placements(block):
            for name in expand_hostlist(node):
                for index in indexes:
                    out.setdefault(job_id, set()).add((name, index))
    return out


# -- incremental ingestion -------------------------------------------------------------------
class AccountingCache:
    """Finished jobs already read from sacct, and how far the reading got, in ``state_dir``.

    ``accounting-jobs/YYYY-MM-DD.jsonl``: one finished job per line, in the file of the UTC day
    it ended on, appended (a job read again replaces its earlier line when loaded); a run reads
    only the days of its window, and the days the jobs sacct returned end on, never the whole
    history. ``accounting-state.json``: ``last_end`` (the latest end time of a cached job),
    ``covered_from`` (the earliest time asked for) and the count of job lines kept.
    A cache of the earlier single-file layout (``accounting-jobs.jsonl``) is split into days
    the first time it is opened.
    """

    STATE = "accounting-state.json"
    JOBS_DIR = "accounting-jobs"
    SINGLE_FILE = "accounting-jobs.jsonl"  # the layout before the cache was split by day

    def __init__(self, state_dir: str | os.PathLike):
        self.dir = Path(state_dir)
        self.days_dir = self.dir / self.JOBS_DIR
        self.days_dir.mkdir(parents=True, exist_ok=True)
        self.state = self._read_state()
        self._split_single_file()

    def _read_state(self) -> dict[str, Any]:
        try:
            return json.loads((self.dir / self.STATE).read_text())
        except FileNotFoundError:
            return {"v": 1, "last_end": None, "covered_from": None, "jobs": 0}
        except ValueError:
            raise AccountingError(f"{self.dir / self.STATE} is damaged; remove it to re-read "
                                  "accounting from scratch") from None

    @staticmethod
    def day_of(when: float) -> str:
        return time.strftime("%Y-%m-%d", time.gmtime(when))

    def _day_path(self, day: str) -> Path:
        return self.days_dir / f"{day}.jsonl"

    def _read_day(self, day: str, into: dict[str, JobRecord]) -> None:
        path = self._day_path(day)
        try:
            handle = open(path)
        except FileNotFoundError:
            return
        with handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = JobRecord.from_dict(json.loads(line))
                except (ValueError, TypeError, KeyError):
                    raise AccountingError(f"{path} line {number} is damaged; remove the file to "
                                          "re-read that day from sacct") from None
                into[f"{record.cluster}/{record.job_id}"] = record

    def _append(self, records: Iterable[JobRecord]) -> int:
        by_day: dict[str, list[JobRecord]] = {}
        for record in records:
            by_day.setdefault(self.day_of(record.end), []).append(record)
        for day, day_records in by_day.items():
            with open(self._day_path(day), "a") as handle:
                handle.writelines(json.dumps(r.to_dict(), sort_keys=True) + "\n"
                                  for r in day_records)
        return sum(len(v) for v in by_day.values())

    def _split_single_file(self) -> None:
        single = self.dir / self.SINGLE_FILE
        if not single.exists():
            return
        records: list[JobRecord] = []
        with open(single) as handle:
            records = [JobRecord.from_dict(json.loads(line)) for line in handle if line.strip()]
        # An interrupted split leaves lines twice; loading keeps one of each job.
        self._append(r for r in records if r.end is not None)
        single.unlink()

    def days(self, since: float | None = None, until: float | None = None) -> list[str]:
        """The cached days (``YYYY-MM-DD``) from ``since`` to ``until``, oldest first."""
        first = self.day_of(since) if since is not None else ""
        last = self.day_of(until) if until is not None else "9999"
        return sorted(p.stem for p in self.days_dir.glob("*.jsonl") if first <= p.stem <= last)

    def jobs(self, since: float | None = None, until: float | None = None
             ) -> dict[str, JobRecord]:
        """The cached jobs that ended from ``since`` to ``until`` (whole days; all without
        bounds), by ``cluster/job_id``."""
        out: dict[str, JobRecord] = {}
        for day in self.days(since, until):
            self._read_day(day, out)
        return out

    def query_window(self, since: float, until: float) -> tuple[float, float]:
        """What sacct must still be asked for to cover ``[since, until]``."""
        covered_from, last_end = self.state.get("covered_from"), self.state.get("last_end")
        if covered_from is None or last_end is None or since < covered_from:
            return since, until
        return max(since, last_end - LATE_RECORD_SLACK_S), until

    def add(self, records: Iterable[JobRecord], since: float,
            held: dict[str, JobRecord] | None = None) -> int:
        """Keep the finished jobs not already held; returns how many were new. Only the days
        the records end on are read to tell. ``held``: jobs already read from this cache
        (they count as known; the new jobs are added to it)."""
        finished = [r for r in records if r.finished]
        known: dict[str, JobRecord] = {}
        for day in {self.day_of(r.end) for r in finished}:
            self._read_day(day, known)
        new: dict[str, JobRecord] = {}
        for record in finished:
            key = f"{record.cluster}/{record.job_id}"
            if key not in known and (held is None or key not in held):
                new[key] = record
        self._append(new.values())
        if held is not None:
            held.update(new)
        ends = [r.end for r in new.values()]
        last_end = self.state.get("last_end")
        covered_from = self.state.get("covered_from")
        self.state.update({
            "last_end": max([e for e in [last_end, *ends] if e is not None], default=None),
            "covered_from": since if covered_from is None else min(covered_from, since),
            "jobs": int(self.state.get("jobs") or 0) + len(new),
        })
        replace_atomically(self.dir / self.STATE,
                           (json.dumps(self.state, sort_keys=True) + "\n").encode())
        return len(new)


@dataclass
class Ingested:
    jobs: list[JobRecord]  # every job in the window, running ones included (marked)
    new: int  # jobs read for the first time (incremental runs)
    source: str  # "sacct", "file <path>", "cache <dir>"


def ingest(since: float, until: float, *, sacct_file: str | os.PathLike | None = None,
           state_dir: str | os.PathLike | None = None, as_json: bool = False,
           node_types: Mapping[str, str] | None = None,
           runner: Callable[..., str] = run_sacct, progress: bool | None = None) -> Ingested:
    """The jobs that ended in ``[since, until]`` plus those still running.

    From a recorded file (``sacct_file``, either format), else from sacct; with a
    ``state_dir``, sacct is asked only for what the cache does not hold yet.
    """
    if sacct_file is not None:
        try:
            # -P is read as a stream, --json whole; utf-8-sig: a byte-order mark an editor or
            # spreadsheet wrote is not part of the header line.
            with open(sacct_file, encoding="utf-8-sig") as handle:
                head = handle.readline()
                if head.lstrip().startswith("{"):
                    jobs = parse_json(head + handle.read(), progress=progress)
                else:
                    jobs = parse_psv(itertools.chain([head], handle), progress=progress)
        except OSError as exc:
            raise AccountingError(f"cannot read {sacct_file}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise AccountingError(f"cannot read {sacct_file}: not UTF-8 text (sacct writes "
                                  "UTF-8)") from None
        source = f"file {sacct_file}"
        new = len(jobs)
    elif state_dir is not None:
        cache = AccountingCache(state_dir)
        start, stop = cache.query_window(since, until)
        fetched = parse_sacct(runner(start, stop, as_json=as_json), progress=progress)
        held = cache.jobs(since, until)  # the window's days only
        new = cache.add(fetched, since, held)
        running = [j for j in fetched if not j.finished]
        jobs, source = list(held.values()) + running, f"cache {state_dir}"
    else:
        jobs = parse_sacct(runner(since, until, as_json=as_json), progress=progress)
        new, source = len(jobs), "sacct"
    jobs = [j for j in jobs if not j.finished or (j.end is not None and since <= j.end <= until)]
    if node_types is None:  # a recorded file too: its nodes are this cluster's, usually
        node_types = query_node_gpu_types()
    resolve_gpu_types(jobs, node_types)
    return Ingested(jobs=jobs, new=new, source=source)
