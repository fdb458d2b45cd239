"""The simulator's results on a slice of Philly, pinned: speed work must not change them.

A change that alters results on purpose updates ``EXPECTED`` and says why in its commit.
(Last on purpose: run-time estimates with realistic error for every policy, stale events no
longer moving the clock, Gavel's failed pairs filled in, gpushare shares under pressure and
orders by nice; gpushare-sjf added; a share is offered with the count that suits most types
without oversizing any, and a share of the whole GPU is kept whole; the gpushare policies judge
jobs with a profile by the pair predictor, and a waiting share's exclusions follow the cluster
when it could start, counted as the shares started after a node was skipped.)
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from slurm_gpushare.sim.cluster import load_cluster
from slurm_gpushare.sim.policies import POLICY_NAMES
from slurm_gpushare.sim.run import default_data_dir, load_workload, run_policies
from slurm_gpushare.sim.workload import WorkloadOptions

DATA = Path(os.environ.get("GPUSHARE_DATA", default_data_dir()))
needs_data = pytest.mark.skipif(not (DATA / "traces" / "philly").exists(),
                                reason="public data sets not found")
FIGURES = ("done", "killed", "jct_mean_s", "jct_p95_s", "queue_mean_s", "makespan_s",
           "gpu_hours", "oom_kills", "pair_failures", "shared_jobs", "allocation")
EXPECTED = "10294e41a62fab2c"


def summary_digest(summary) -> tuple[str, list]:
    rows = [[row["policy"]] + [round(float(row[f]), 3) for f in FIGURES]
            for row in summary.to_dict(orient="records")]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16], rows


@needs_data
def test_philly_slice_results_are_unchanged():
    cluster = load_cluster("philly")
    work = load_workload("philly", cluster, DATA, WorkloadOptions(seed=3, limit=1500))
    outcome = run_policies(cluster, work, list(POLICY_NAMES), data_dir=DATA, seed=3)
    digest, rows = summary_digest(outcome.summary)
    assert digest == EXPECTED, json.dumps(rows)


COUNTS_EXPECTED = "094c17504c19deed"  # gpushare counts co-run sides learned from, re-learnings


@needs_data
def test_philly_slice_counters_and_decisions_are_unchanged():
    """What the engine did, not only what came out: passes, starts, backfills, shared starts,
    kills and each policy's decision codes (integers: no rounding between platforms)."""
    cluster = load_cluster("philly")
    work = load_workload("philly", cluster, DATA, WorkloadOptions(seed=1, limit=1000))
    outcome = run_policies(cluster, work, list(POLICY_NAMES), data_dir=DATA, seed=1)
    counts = {r.policy: {"counters": r.counters, "codes": r.codes} for r in outcome.results}
    digest = hashlib.sha256(json.dumps(counts, sort_keys=True).encode()).hexdigest()[:16]
    assert digest == COUNTS_EXPECTED, json.dumps(counts, sort_keys=True)
