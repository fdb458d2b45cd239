"""What-if from a site's own history: its ``sacct`` export, its jobs' own telemetry from the
store, its own cluster, and a verdict on turning sharing on.

The export is read by the one sacct parser (``slurm.accounting.parse_sacct``); the fields it
needs are documented in docs/reports.md (``SACCT_REQUIRED``). Each job's inputs come from the
store where it has them -- peak GPU memory from its telemetry, run time alone from its own solo
runs (a shared run's time is slowed by its co-runners) -- and from public data otherwise; the
frame says per job which (``memory_from``, ``runtime_from``). Speeds on other GPU types and the
interference class always come from public data (Gavel): the simulator's interference model
is defined over Gavel's job kinds, which the site's telemetry classes do not map onto.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from slurm_gpushare.core.hostlist import expand_hostlist
from slurm_gpushare.slurm import accounting

# Fields a ``sacct -P`` export needs: each entry is satisfied by any one of its names.
SACCT_REQUIRED = (("JobID",), ("Submit",), ("Start",), ("End", "ElapsedRaw"),
                  ("AllocTRES", "ReqTRES"))
SACCT_COMMAND = ("SLURM_TIME_FORMAT=%s sacct -a -D -P -S <start> -E <end> -o "
                 + ",".join(accounting.SACCT_FIELDS))
PUBLIC = "public data"


class SiteTraceError(ValueError):
    """An export that cannot be replayed."""


def check_fields(text: str, path: str = "") -> None:
    """A clear error naming the fields a ``-P`` export lacks (JSON carries them all)."""
    if text.lstrip().startswith("{"):
        return
    lines = text.splitlines()
    header = lines[0].split("|") if lines else []
    missing = [" or ".join(names) for names in SACCT_REQUIRED
               if not any(n in header for n in names)]
    if missing:
        where = f"{path}: " if path else ""
        raise SiteTraceError(f"{where}the sacct export lacks {', '.join(missing)}; export it "
                             f"with: {SACCT_COMMAND}")


def _typed_gpu(job: accounting.JobRecord) -> str:
    """The GPU type the job asked for, when its TRES name one."""
    for key in list(job.req_tres) + list(job.alloc_tres):
        if key.startswith("gres/gpu:"):
            return key.split(":", 1)[1]
    return ""


def load_site(path: str | Path, store=None) -> pd.DataFrame:
    """The trace frame (``traces.COLUMNS``) of a sacct export, enriched from ``store``.

    Extra columns: ``store_id`` (JobIDRaw), ``partition``, ``memory_from`` and
    ``runtime_from`` ("own telemetry"/"own solo runs", "the share it was given", "sacct", or
    "public data")."""
    from slurm_gpushare.reports.savings import StoreView, solo_from_history, store_id

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # as report reads it (a BOM is no header)
    except FileNotFoundError:
        raise SiteTraceError(f"sacct export not found: {path}") from None
    except UnicodeDecodeError:
        raise SiteTraceError(f"cannot read {path}: not UTF-8 text (sacct writes UTF-8)") from None
    except OSError as exc:
        raise SiteTraceError(f"cannot read {path}: {exc.strerror}") from None
    check_fields(text, str(path))
    try:
        jobs = accounting.parse_sacct(text, progress=False)
    except accounting.AccountingError as exc:
        raise SiteTraceError(f"{path}: {exc}") from None
    accounting.resolve_gpu_types(jobs, accounting.query_node_gpu_types())
    view = StoreView(store) if store is not None else None
    rows = []
    for job in jobs:
        run = job.run_time_s
        ended = job.finished or (not job.state and job.end is not None)  # State not exported
        if not (ended and job.gpu_job and job.submit is not None and run):
            continue
        mem, memory_from = math.nan, PUBLIC
        if job.shards:
            mem, memory_from = job.shards * 1024.0, "the share it was given"
        duration, runtime_from = run, "sacct"
        if view is not None:
            peaks = [s["mgmap_max_mib"] for s in view.summaries(job)
                     if s.get("mgmap_max_mib") is not None]
            if peaks:
                mem, memory_from = float(max(peaks)), "own telemetry"
            if job.on_share:
                solo = solo_from_history(job, view)
                if solo is not None:
                    duration = solo.seconds
                    runtime_from = f"own solo runs ({solo.runs})"
        if job.on_share and runtime_from == "sacct":
            runtime_from = "sacct (a shared run)"
        nodes = int(job.alloc_tres.get("node") or len(expand_hostlist(job.nodes)) or 0)
        rows.append({"job_id": job.job_id, "submit": job.submit, "duration": duration,
                     "num_gpus": int(job.gpus) if job.gpus else 1, "num_nodes": nodes,
                     "gpu_milli": 1000, "mem_mib": mem, "gpu_type": _typed_gpu(job),
                     "user": job.user, "store_id": store_id(job),
                     "partition": job.partition, "memory_from": memory_from,
                     "runtime_from": runtime_from})
    if not rows:
        raise SiteTraceError(f"{path}: the sacct export holds no finished GPU jobs")
    frame = pd.DataFrame(rows)
    frame = frame.sort_values("submit", kind="stable").reset_index(drop=True)
    frame["submit"] = frame["submit"] - frame["submit"].iloc[0]
    return frame


# -- the site's own cluster ---------------------------------------------------------------------
def cluster_from_scontrol(text: str, profiles: dict[str, dict]) -> dict[str, Any]:
    """A cluster spec (``sim.cluster.parse_cluster``'s dict) from ``scontrol -o show nodes``:
    one node group per node, its typed GPUs; each type's speed and memory profiles from
    ``profiles`` (the built-in specs' ``gpu_types``, by type name)."""
    nodes, types = [], {}
    for name, (gpu_type, count) in accounting.node_gpus_from_scontrol(text).items():
        if gpu_type not in profiles:
            raise SiteTraceError(f"GPU type {gpu_type} of node {name} has no built-in "
                                 "profile: describe the cluster in a spec file (--cluster)")
        types[gpu_type] = profiles[gpu_type]
        nodes.append({"prefix": name, "count": 1, "gpus": count, "type": gpu_type})
    if not nodes:
        raise SiteTraceError("scontrol shows no node with typed GPUs: pass --cluster")
    largest = Counter(g["type"] for g in nodes).most_common(1)[0][0]
    return {"name": "this cluster", "description": "this Slurm cluster (scontrol show nodes)",
            "gpu_types": types, "nodes": nodes, "reference_gpu": largest,
            "max_jobs_per_gpu": 4}


# -- the verdict -------------------------------------------------------------------------------
def verdict(summary: pd.DataFrame, partitions: list[str], policy: str = "gpushare",
            baseline: str = "slurm-default") -> str:
    """One line: turn sharing on (or not) for these partitions, and what to expect."""
    rows = {r["policy"]: r for r in summary.to_dict("records")}
    if policy not in rows or baseline not in rows:
        return f"No verdict: run both {baseline} and {policy} (--policy all)."
    base, share = rows[baseline], rows[policy]
    saved = base["gpu_hours"] - share["gpu_hours"]
    frac = saved / base["gpu_hours"] if base["gpu_hours"] else math.nan
    jct = _change(share["jct_mean_s"], base["jct_mean_s"])
    queue = share["queue_mean_s"] - base["queue_mean_s"]
    where = ", ".join(partitions) or "the GPU partitions"
    worse = share["oom_kills"] > base["oom_kills"] or (jct == jct and jct > 0.05)
    advice = (f"Do not turn sharing on for {where}" if saved <= 0 else
              f"Turn sharing on for {where} but watch its costs" if worse else
              f"Turn sharing on for {where}")
    return (f"{advice}: expected {human_hours(saved)} GPU-h saved "
            f"({frac:.1%}), mean JCT {jct:+.0%}, mean queueing {human_seconds(queue, True)}, "
            f"OOM kills {int(share['oom_kills'])} (whole GPUs: {int(base['oom_kills'])}).")


def _change(new: float, old: float) -> float:
    return new / old - 1 if old else math.nan


def human_seconds(seconds: float, signed: bool = False) -> str:
    """48 s, 12.5 min, 3.2 h, 2.1 d: the unit that keeps the figure readable."""
    if seconds != seconds:
        return "-"
    value = abs(seconds)
    shown_zero = value < 0.5
    sign = "" if shown_zero else ("+" if seconds > 0 else "-") if signed else \
        ("-" if seconds < 0 else "")
    for limit, unit, scale in ((120, "s", 1), (7200, "min", 60), (172800, "h", 3600)):
        if value < limit:
            return f"{sign}{value / scale:.0f} {unit}" if unit == "s" else \
                f"{sign}{value / scale:.1f} {unit}"
    return f"{sign}{value / 86400:.1f} d"


def human_hours(hours: float) -> str:
    """GPU-hours with the decimals a small figure needs (0.0042, not 0.0)."""
    if hours != hours:
        return "-"
    if abs(hours) >= 10:
        return f"{hours:.0f}"
    if abs(hours) >= 0.1:
        return f"{hours:.2f}"
    return f"{hours:.2g}"
