"""Figures from a run: per-job and per-GPU monitors into pandas frames, and their summary.

- JCT = end - submit of completed jobs (a killed-and-requeued job keeps its first submit);
  queueing delay = first start - submit; makespan = last end - first submit.
- GPU-hours: time GPUs held at least one job. Allocation rate: mean busy GPUs / GPUs over the
  makespan (openb inflation: GPUs requested by placed pods / GPUs, FGD's measure).
- ISD (interference slowdown, Ray et al.) of a job that shared: run time / solo run time on
  its type - 1. PS (packing saving) of a GPU that hosted co-runners: 1 - busy time / solo work
  done on it (solo-seconds); 0.5 = two jobs packed at full speed. ``ps_cluster`` is the same over
  all GPUs.
- Fragmentation (FGD, ATC'23): the expected free GPU capacity that the workload's tasks cannot
  use, over the task mix of the trace: a share of s GiB cannot use a GPU with less than s GiB
  free (or at the co-location cap); a task of n whole GPUs cannot use a GPU that is partly
  used or on a node with fewer than n empty GPUs. As a fraction of all GPUs.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from slurm_gpushare.sim.engine import DONE, Result

def jobs_frame(result: Result) -> pd.DataFrame:
    frame = pd.DataFrame(result.jobs)
    frame["jct"] = frame["end"] - frame["submit"]
    frame["queue"] = frame["first_start"] - frame["submit"]
    frame["isd"] = np.where(frame["shared"] & (frame["state"] == DONE),
                            (frame["end"] - frame["start"]) / frame["solo"] - 1, np.nan)
    frame.insert(0, "policy", result.policy)
    return frame


def gpus_frame(result: Result) -> pd.DataFrame:
    frame = pd.DataFrame(result.gpus)
    with np.errstate(divide="ignore", invalid="ignore"):
        frame["ps"] = np.where(frame["shared_s"] > 0, 1 - frame["busy_s"] / frame["work_s"], np.nan)
    frame.insert(0, "policy", result.policy)
    return frame


def timeline_frame(result: Result) -> pd.DataFrame:
    frame = pd.DataFrame(result.timeline)
    frame.insert(0, "policy", result.policy)
    return frame


def fragmentation(gpus: pd.DataFrame, n_gpus: np.ndarray, share_gib: np.ndarray,
                  cap_jobs: int) -> float:
    """FGD's expected fragmentation over a task mix (``share_gib`` 0 = whole GPUs)."""
    cap = gpus["cap_gib"].to_numpy(float)
    free = np.where(gpus["whole"], 0.0, cap - gpus["used_gib"].to_numpy(float))
    free_frac = free / cap
    empty = gpus["njobs"].to_numpy() == 0
    at_cap = gpus["njobs"].to_numpy() >= cap_jobs
    node = gpus["node"].to_numpy()
    node_empty = np.bincount(node, weights=empty.astype(float))[node]
    tasks = pd.DataFrame({"n": n_gpus, "s": share_gib}).value_counts(normalize=True)
    expected = 0.0
    for (n, s), weight in tasks.items():
        if s > 0:
            unusable = (free < s) | at_cap
        else:
            unusable = ~empty | (node_empty < n)
        expected += weight * free_frac[unusable].sum()
    return float(expected / len(cap))


def summarise(result: Result, *, cap_jobs: int, task_mix=None) -> dict:
    jobs, gpus = jobs_frame(result), gpus_frame(result)
    done = jobs[jobs.state == DONE]
    states = jobs.state.value_counts().to_dict()
    first = float(jobs.submit.min()) if len(jobs) else 0.0
    makespan = float(jobs.end.max() - first) if done.size else math.nan
    timeline = result.timeline
    n_gpus = len(gpus)
    if len(timeline["time"]) > 1:
        dt = np.diff(timeline["time"])
        busy = float((timeline["busy_gpus"][:-1] * dt).sum() / max(dt.sum(), 1e-9) / n_gpus)
    else:
        busy = math.nan
    ps = gpus.ps.dropna()
    isd = done.isd.dropna()
    total_work = gpus.work_s.sum()

    def pct(series, q):
        return float(np.percentile(series, q)) if len(series) else math.nan

    out = {
        "policy": result.policy, "jobs": len(jobs), "done": int(states.get(DONE, 0)),
        "killed": int(states.get("killed", 0)), "rejected": int(states.get("rejected", 0)),
        "dropped": int(states.get("dropped", 0)), "cutoff": int(states.get("cutoff", 0)),
        "jct_mean_s": float(done.jct.mean()) if len(done) else math.nan,
        "jct_median_s": float(done.jct.median()) if len(done) else math.nan,
        "jct_p95_s": pct(done.jct, 95),
        "queue_mean_s": float(jobs.queue.dropna().mean()) if jobs.queue.notna().any() else math.nan,
        "queue_p95_s": pct(jobs.queue.dropna(), 95),
        "makespan_s": makespan, "gpu_hours": float(gpus.busy_s.sum() / 3600),
        "oom_kills": int(result.counters["oom_kills"]),
        "pair_failures": int(result.counters["pair_failures"]),
        "shared_jobs": float(done.shared.mean()) if len(done) else 0.0,
        "isd_mean": float(isd.mean()) if len(isd) else math.nan, "isd_p95": pct(isd, 95),
        "ps_mean": float(ps.mean()) if len(ps) else math.nan, "ps_p95": pct(ps, 95),
        "ps_cluster": float(1 - gpus.busy_s.sum() / total_work) if total_work else math.nan,
        "allocation": busy,
        "wall_s": result.wall_s,
    }
    if task_mix is not None:
        out["fragmentation"] = fragmentation(gpus, *task_mix, cap_jobs)
    return out


def task_mix(work) -> tuple[np.ndarray, np.ndarray]:
    """The workload's tasks for the fragmentation measure: (GPUs, share GiB or 0 = whole).

    A fractional task's share is its memory on the smallest GPU type."""
    fractional = work.gpu_request < work.n_gpus
    return work.n_gpus, np.where(fractional, np.ceil(work.mem_safe.min(axis=1) / 1024), 0).astype(int)


def relative(summary: pd.DataFrame, base: str = "slurm-default") -> pd.DataFrame:
    """Each policy's figures as a change against ``base`` (-0.25 = 25% lower)."""
    if base not in set(summary.policy):
        return pd.DataFrame()
    ref = summary.set_index("policy").loc[base]
    rows = []
    for _, row in summary.iterrows():
        out = {"policy": row.policy}
        for col in ("jct_mean_s", "jct_median_s", "jct_p95_s", "queue_mean_s", "makespan_s",
                    "gpu_hours"):
            out[col] = (row[col] / ref[col] - 1) if ref[col] else math.nan
        for col in ("oom_kills", "pair_failures", "shared_jobs", "isd_mean", "isd_p95",
                    "ps_mean", "ps_cluster", "allocation"):
            out[col] = row[col]
        rows.append(out)
    return pd.DataFrame(rows)
