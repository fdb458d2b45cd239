"""History from Slurm's own GPU accounting, for jobs the node agent left no summary of.

Slurm 23.02+ with ``AutoDetect=nvml`` accounts each step's GPU memory and utilisation peak
(``gres/gpumem``, ``gres/gpuutil`` in sacct's ``TRESUsageInMax``), per process, so right on a
shared GPU too. ``slurm-gpushare import-usage`` turns the finished single-GPU jobs of a window
into summaries and sends them to the daemon's ``ingest`` op: the checks and the learning are
the agent's. The store keeps one only for a job it holds no summary of, and replaces it by the
agent's if that comes later (``Store.ingest_summary``). These summaries carry less than the
agent's (peaks only: no means, co-runs or samples), so memory sizing and run times learn from
them, interference classes do not.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

from slurm_gpushare.core.config import Config
from slurm_gpushare.daemon.store import SLURM_ACCOUNTING
from slurm_gpushare.slurm.accounting import JobRecord

# A job's own agent delivers its summary at the job's end (or from its spool within minutes
# when the daemon was unreachable): wait this long before filling in from accounting.
DEFAULT_MIN_AGE_S = 15 * 60


def summaries_from_accounting(jobs: Iterable[JobRecord], config: Config, *,
                              min_age_s: float = DEFAULT_MIN_AGE_S,
                              now: float | None = None) -> list[dict[str, Any]]:
    """One summary per finished single-GPU job with Slurm's ``gres/gpumem`` on a GPU type the
    configuration names (the predictors know GPUs by catalogue model). A job on more GPUs is
    left out: its figure is not one GPU's peak."""
    now = time.time() if now is None else now
    types = {t.name: t for t in config.gpu_types}
    out = []
    for job in jobs:
        if not job.finished or job.end is None or job.start is None or now - job.end < min_age_s:
            continue
        peak, gpu_type = job.gpu_mem_peak_mib, types.get(job.gpu_type)
        if peak is None or gpu_type is None or job.exclusive_gpus != 1:
            continue
        total_mib = gpu_type.memory_gib * 1024
        out.append({
            "v": 1, "cluster": job.cluster, "job_id": job.raw_id or job.job_id, "gpu_index": 0,
            "gpu_model": gpu_type.model, "mem_total_mib": total_mib,
            "start_ts": job.start, "end_ts": job.end, "duration_s": job.end - job.start,
            "samples": 0, "mgmap_max_mib": peak, "mgmap_max_pct": 100.0 * peak / total_mib,
            "mgup_max": job.gpu_util_peak_pct, "shared": job.on_share,
            "attribution": SLURM_ACCOUNTING,
        })
    return out
