"""Report output: a terminal table, CSV/JSON files and PNG plots (matplotlib, imported lazily)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from slurm_gpushare.sim.engine import DONE

TABLE_COLUMNS = [
    ("policy", "policy", "{}"), ("jct_mean_s", "avg JCT h", "h"), ("jct_median_s", "med JCT h", "h"),
    ("jct_p95_s", "p95 JCT h", "h"), ("queue_mean_s", "avg queue h", "h"),
    ("makespan_s", "makespan h", "h"), ("gpu_hours", "GPU-h", "{:.0f}"),
    ("shared_jobs", "shared", "{:.0%}"), ("isd_mean", "ISD avg", "{:.2f}"),
    ("isd_p95", "ISD p95", "{:.2f}"), ("ps_cluster", "PS", "{:.2f}"),
    ("oom_kills", "OOM", "{}"), ("pair_failures", "pair fail", "{}"),
    ("allocation", "alloc", "{:.0%}"), ("wall_s", "sim s", "{:.1f}"),
]
RELATIVE_COLUMNS = [("jct_mean_s", "avg JCT"), ("jct_median_s", "med JCT"), ("jct_p95_s", "p95 JCT"),
                    ("queue_mean_s", "avg queue"), ("makespan_s", "makespan"), ("gpu_hours", "GPU-h")]


def _fmt(value, how: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if how == "h":
        return f"{value / 3600:.1f}"
    return how.format(value)


def print_tables(summary: pd.DataFrame, relative: pd.DataFrame, title: str = "") -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=title or None)
    for _, label, _ in TABLE_COLUMNS:
        table.add_column(label, justify="left" if label == "policy" else "right")
    for _, row in summary.iterrows():
        table.add_row(*[_fmt(row.get(col), how) for col, _, how in TABLE_COLUMNS])
    console.print(table)
    if relative.empty:
        return
    rel = Table(title="relative to slurm-default")
    rel.add_column("policy")
    for _, label in RELATIVE_COLUMNS:
        rel.add_column(label, justify="right")
    for _, row in relative.iterrows():
        rel.add_row(row.policy, *[_fmt(row[col], "{:+.1%}") for col, _ in RELATIVE_COLUMNS])
    console.print(rel)


def write_files(out: Path, summary: pd.DataFrame, relative: pd.DataFrame, jobs: pd.DataFrame,
                meta: dict) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "summary.csv", out / "relative.csv", out / "jobs.csv.gz", out / "summary.json"]
    summary.to_csv(paths[0], index=False)
    relative.to_csv(paths[1], index=False)
    jobs.to_csv(paths[2], index=False)
    doc = {"meta": meta, "summary": _records(summary), "relative": _records(relative)}
    paths[3].write_text(json.dumps(doc, indent=2) + "\n")
    return paths


def _records(frame: pd.DataFrame) -> list[dict]:
    return [{k: (None if isinstance(v, float) and math.isnan(v) else
                 v.item() if isinstance(v, np.generic) else v) for k, v in row.items()}
            for row in frame.to_dict(orient="records")]


def write_plots(out: Path, jobs: pd.DataFrame, timelines: pd.DataFrame) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, frame in jobs[jobs.state == DONE].groupby("policy", sort=False):
        jct = np.sort(frame.jct.to_numpy() / 3600)
        ax.plot(jct, np.arange(1, len(jct) + 1) / len(jct), label=policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "jct_cdf.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, frame in timelines.groupby("policy", sort=False):
        step = max(1, len(frame) // 4000)  # thin long timelines
        ax.step(frame.time.to_numpy()[::step] / 86400, frame.queued.to_numpy()[::step],
                where="post", label=policy, linewidth=0.8)
    ax.set_xlabel("time (days)")
    ax.set_ylabel("jobs queued")
    ax.set_title("queue length over time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "queue_length.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths
