"""Trace loaders. Each returns a ``pandas.DataFrame`` with one row per GPU job:

``job_id`` (str), ``submit`` (s from the trace's first submission), ``duration`` (s, the run
time as recorded), ``num_gpus`` (total GPUs), ``num_nodes`` (0 = as many as needed),
``gpu_milli`` (share of one GPU x 1000, openb), ``mem_mib`` (GPU memory when the trace knows
it, else NaN), ``gpu_type`` (the type the job asked for, else ""), ``user``.

Sources: Philly (Sia's prepared CSV), Alibaba openb (FGD), and a site's own history from
``sacct -P`` (pipe-separated with a header) or ``sacct --json`` (Slurm 22.05, v0.0.38 layout).
Jobs without GPUs are dropped: the simulator schedules GPUs only.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

COLUMNS = ["job_id", "submit", "duration", "num_gpus", "num_nodes", "gpu_milli", "mem_mib",
           "gpu_type", "user"]

PHILLY_CSV = "traces/philly/philly_jobs.csv"
OPENB_PODS = "traces/alibaba_openb/openb_pod_list_default.csv"


class TraceError(ValueError):
    """A trace that cannot be read."""


def _frame(**cols) -> pd.DataFrame:
    n = len(cols["submit"])
    defaults = {"job_id": [str(i) for i in range(n)], "num_nodes": np.zeros(n, int),
                "gpu_milli": np.full(n, 1000), "mem_mib": np.full(n, np.nan),
                "gpu_type": [""] * n, "user": [""] * n}
    frame = pd.DataFrame({c: cols.get(c, defaults.get(c)) for c in COLUMNS})
    frame = frame[(frame.num_gpus > 0) & (frame.duration > 0)]
    frame = frame.sort_values("submit", kind="stable").reset_index(drop=True)
    if len(frame):
        frame["submit"] = frame["submit"] - frame["submit"].iloc[0]
    return frame


def load_philly(data_dir: str | Path) -> pd.DataFrame:
    path = Path(data_dir) / PHILLY_CSV
    if not path.exists():
        raise TraceError(f"Philly trace not found at {path}")
    raw = pd.read_csv(path)
    stamps = pd.to_datetime(raw["timestamp"])
    submit = (stamps - stamps.min()).dt.total_seconds()  # unit-proof across pandas versions
    return _frame(job_id=[f"philly-{i}" for i in range(len(raw))], submit=submit.to_numpy(float),
                  duration=raw["duration"].to_numpy(float),
                  num_gpus=raw["num_gpus"].to_numpy(int), user=raw["cluster"].astype(str).tolist())


def load_openb(data_dir: str | Path) -> pd.DataFrame:
    """openb GPU pods; ``duration`` is deletion minus scheduled (or creation) time."""
    path = Path(data_dir) / OPENB_PODS
    if not path.exists():
        raise TraceError(f"openb trace not found at {path}")
    raw = pd.read_csv(path)
    raw = raw[raw.num_gpu > 0]
    start = raw.scheduled_time.fillna(raw.creation_time)
    duration = (raw.deletion_time - start).clip(lower=1)
    spec = raw.gpu_spec.astype(object).fillna("").astype(str)
    frame = _frame(job_id=raw["name"].tolist(), submit=raw.creation_time.to_numpy(float),
                   duration=duration.to_numpy(float), num_gpus=raw.num_gpu.to_numpy(int),
                   num_nodes=np.ones(len(raw), int), gpu_milli=raw.gpu_milli.to_numpy(int),
                   gpu_type=spec.tolist())
    frame.attrs["milli_is_memory"] = True  # a pod's gpu_milli is what it takes of a GPU
    return frame


# --- sacct ---------------------------------------------------------------------------------

_GPU_TRES = re.compile(r"gres/(gpu|shard|mps)(?::([A-Za-z0-9_.\-]+))?=(\d+)")
_TIME = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)$")


def _epoch(text: str) -> float | None:
    text = (text or "").strip()
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    if re.fullmatch(r"\d+(\.\d+)?", text):  # SLURM_TIME_FORMAT=%s
        return float(text)
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def _elapsed(text: str) -> float | None:
    match = _TIME.match((text or "").strip())
    if not match:
        return None
    days, hours, minutes, seconds = match.groups()
    return (int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes) * 60
            + float(seconds))


def _gpus_from_tres(tres: str) -> tuple[int, str, float]:
    """(GPUs, type, shard GiB) from an AllocTRES/ReqTRES string."""
    gpus, gtype, shards = 0, "", 0.0
    for kind, typ, count in _GPU_TRES.findall(tres or ""):
        if kind == "gpu":
            if typ:
                gtype = typ
            else:
                gpus = max(gpus, int(count))
        elif kind == "shard" and not typ:
            shards = float(count)
    if gpus == 0 and shards:
        gpus = 1  # a share of one GPU
    return gpus, gtype, shards


def load_sacct(path: str | Path) -> pd.DataFrame:
    """A site's history from ``sacct -P ...`` (``|``-separated, header line) or ``sacct --json``.

    The ``-P`` export needs JobID, Submit, Start, End (or Elapsed), and AllocTRES (or ReqTRES);
    NNodes and User are used when present. Job steps (``123.batch``) are skipped. With gres/shard
    the share's GiB is taken as the job's known memory.
    """
    path = Path(path)
    if not path.exists():
        raise TraceError(f"sacct export not found: {path}")
    text = path.read_text()
    if text.lstrip().startswith("{"):
        return _sacct_json(json.loads(text))
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or "|" not in lines[0]:
        raise TraceError(f"{path}: not a sacct -P export (no '|'-separated header)")
    header = lines[0].split("|")
    if "JobID" not in header or "Submit" not in header:
        raise TraceError(f"{path}: sacct -P export needs JobID and Submit columns")
    rows = []
    for line in lines[1:]:
        cells = line.split("|")
        row = dict(zip(header, cells + [""] * (len(header) - len(cells))))
        if "." in row["JobID"]:
            continue
        submit, start, end = _epoch(row.get("Submit")), _epoch(row.get("Start")), _epoch(row.get("End"))
        duration = (end - start) if (start is not None and end is not None) else _elapsed(row.get("Elapsed"))
        tres = row.get("AllocTRES") or row.get("ReqTRES") or ""
        gpus, gtype, shards = _gpus_from_tres(tres)
        if submit is None or duration is None:
            continue
        nodes = int(row["NNodes"]) if row.get("NNodes", "").isdigit() else 0
        rows.append((row["JobID"], submit, duration, gpus, nodes, shards, gtype, row.get("User", "")))
    return _sacct_frame(rows)


def _sacct_json(doc: dict) -> pd.DataFrame:
    rows = []
    for job in doc.get("jobs", []):
        times = job.get("time", {})
        submit, start, end = times.get("submission"), times.get("start"), times.get("end")
        duration = times.get("elapsed")
        if duration is None and start and end:
            duration = end - start
        tres = job.get("tres", {})
        items = tres.get("allocated") or tres.get("requested") or []
        text = ",".join(f"{t.get('type')}/{t.get('name')}={t.get('count')}" for t in items
                        if t.get("type") == "gres")
        gpus, gtype, shards = _gpus_from_tres(text)
        if submit is None or duration is None:
            continue
        nodes = job.get("allocation_nodes") or 0
        rows.append((str(job.get("job_id")), float(submit), float(duration), gpus, int(nodes),
                     shards, gtype, job.get("user", "")))
    return _sacct_frame(rows)


def _sacct_frame(rows: list[tuple]) -> pd.DataFrame:
    if not rows:
        raise TraceError("the sacct export holds no finished GPU jobs")
    ids, submit, duration, gpus, nodes, shards, gtype, user = map(list, zip(*rows))
    mem = [s * 1024 if s else math.nan for s in shards]
    milli = [1000] * len(rows)
    frame = _frame(job_id=ids, submit=np.array(submit, float), duration=np.array(duration, float),
                   num_gpus=np.array(gpus, int), num_nodes=np.array(nodes, int),
                   gpu_milli=milli, mem_mib=np.array(mem, float), gpu_type=gtype, user=user)
    if frame.empty:
        raise TraceError("the sacct export holds no finished GPU jobs")
    return frame


def load_trace(name: str, data_dir: str | Path) -> pd.DataFrame:
    """``philly``, ``openb`` or ``sacct:FILE``."""
    if name == "philly":
        return load_philly(data_dir)
    if name == "openb":
        return load_openb(data_dir)
    if name.startswith("sacct:"):
        return load_sacct(name[len("sacct:"):])
    raise TraceError(f"unknown trace {name!r} (philly, openb or sacct:FILE)")
