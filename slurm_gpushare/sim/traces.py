"""Trace loaders. Each returns a ``pandas.DataFrame`` with one row per GPU job:

``job_id`` (str), ``submit`` (s from the trace's first submission), ``duration`` (s, the run
time as recorded), ``num_gpus`` (total GPUs), ``num_nodes`` (0 = as many as needed),
``gpu_milli`` (share of one GPU x 1000, openb), ``mem_mib`` (GPU memory when the trace knows
it, else NaN), ``gpu_type`` (the type the job asked for, else ""), ``user``.

Sources: Philly (Sia's prepared CSV), Alibaba openb (FGD), and a site's own history from
``sacct -P`` (pipe-separated with a header) or ``sacct --json`` (Slurm 22.05, v0.0.38 layout),
read by ``sim.site`` (with the jobs' own telemetry where the store has it).
Jobs without GPUs are dropped: the simulator schedules GPUs only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from slurm_gpushare.predict import datasets

COLUMNS = ["job_id", "submit", "duration", "num_gpus", "num_nodes", "gpu_milli", "mem_mib",
           "gpu_type", "user"]


class TraceError(ValueError):
    """A trace that cannot be read."""


def _read(loader, data_dir):
    try:
        return loader(data_dir)
    except datasets.MissingDataSet as exc:
        raise TraceError(str(exc)) from None


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
    raw = _read(datasets.load_philly, data_dir)
    stamps = pd.to_datetime(raw["timestamp"])
    submit = (stamps - stamps.min()).dt.total_seconds()  # unit-proof across pandas versions
    return _frame(job_id=[f"philly-{i}" for i in range(len(raw))], submit=submit.to_numpy(float),
                  duration=raw["duration"].to_numpy(float),
                  num_gpus=raw["num_gpus"].to_numpy(int), user=raw["cluster"].astype(str).tolist())


def load_openb(data_dir: str | Path) -> pd.DataFrame:
    """openb GPU pods; ``duration`` is deletion minus scheduled (or creation) time."""
    raw = _read(datasets.load_openb, data_dir)
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

def load_sacct(path: str | Path, store=None) -> pd.DataFrame:
    """A site's history from ``sacct -P ...`` (``|``-separated, header line) or ``sacct --json``,
    read by the one sacct parser, with each job's own telemetry from ``store`` where it has it
    (``sim.site.load_site``; the fields it needs are in docs/reports.md)."""
    from slurm_gpushare.sim.site import SiteTraceError, load_site

    try:
        return load_site(path, store)
    except SiteTraceError as exc:
        raise TraceError(str(exc)) from None


def load_trace(name: str, data_dir: str | Path) -> pd.DataFrame:
    """``philly``, ``openb`` or ``sacct:FILE``."""
    if name == "philly":
        return load_philly(data_dir)
    if name == "openb":
        return load_openb(data_dir)
    if name.startswith("sacct:"):
        return load_sacct(name[len("sacct:"):])
    raise TraceError(f"unknown trace {name!r} (philly, openb or sacct:FILE)")
