"""Trace loaders, cluster specs, workload enrichment and interference models."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from slurm_gpushare.sim import traces
from slurm_gpushare.sim.cluster import ClusterSpecError, load_cluster, parse_cluster
from slurm_gpushare.sim.run import default_data_dir

DATA = Path(os.environ.get("GPUSHARE_DATA", default_data_dir()))
needs_data = pytest.mark.skipif(not (DATA / "gavel").exists(), reason="public data sets not found")

SACCT_P = """JobID|User|Submit|Start|End|NNodes|AllocTRES
101|ann|1700000000|1700000010|1700000110|1|billing=1,cpu=1,gres/gpu:v100=1,gres/gpu=1,node=1
101.batch|ann|1700000010|1700000010|1700000110|1|cpu=1
102|bob|2023-11-14T22:15:00|2023-11-14T22:20:00|2023-11-14T22:30:00|1|cpu=2,gres/shard=6,node=1
103|bob|1700000200|1700000300|1700000400|2|cpu=8,gres/gpu=4,node=2
104|cy|1700000300|1700000300|1700000350|1|cpu=4,node=1
"""


def test_sacct_pipe_export(tmp_path):
    path = tmp_path / "sacct.txt"
    path.write_text(SACCT_P)
    frame = traces.load_sacct(path)
    assert list(frame.job_id) == ["101", "102", "103"]  # no steps, no CPU-only job; by submit
    first = frame.iloc[0]
    assert (first.submit, first.duration, first.num_gpus, first.gpu_type) == (0, 100, 1, "v100")
    assert frame.set_index("job_id").loc["102", "mem_mib"] == 6 * 1024
    assert frame.set_index("job_id").loc["103", "num_nodes"] == 2


def test_sacct_json_export(tmp_path):
    doc = {"jobs": [
        {"job_id": 7, "user": "ann", "allocation_nodes": 1, "state": {"current": "COMPLETED"},
         "time": {"submission": 100, "start": 130, "end": 230, "elapsed": 100},
         "tres": {"allocated": [{"type": "gres", "name": "gpu", "count": 2},
                                {"type": "cpu", "name": None, "count": 4}]}},
        {"job_id": 8, "state": {"current": "COMPLETED"}, "time": {"submission": 90, "start": 90, "end": 100, "elapsed": 10},
         "tres": {"allocated": [{"type": "cpu", "count": 1}]}}]}
    path = tmp_path / "sacct.json"
    path.write_text(json.dumps(doc))
    frame = traces.load_sacct(path)
    assert list(frame.job_id) == ["7"] and frame.num_gpus.iloc[0] == 2
    assert frame.duration.iloc[0] == 100


def test_sacct_errors(tmp_path):
    with pytest.raises(traces.TraceError):
        traces.load_sacct(tmp_path / "missing")
    bad = tmp_path / "bad.txt"
    bad.write_text("not an export\n")
    with pytest.raises(traces.TraceError):
        traces.load_sacct(bad)
    # Plain sacct -P (its default fields): the error names what is missing and how to export.
    plain = tmp_path / "plain.txt"
    plain.write_text("JobID|JobName|Partition|Account|AllocCPUS|State|ExitCode\n"
                     "5|train|gpu|phys|1|COMPLETED|0:0\n")
    with pytest.raises(traces.TraceError) as err:
        traces.load_sacct(plain)
    message = str(err.value)
    assert "lacks Submit, Start, End or ElapsedRaw, AllocTRES or ReqTRES" in message
    assert "sacct -a -D -P" in message and "\n" not in message


def test_sacct_jobs_take_their_own_telemetry_from_the_store(tmp_path):
    """Array task 68_3 (JobIDRaw 72) shared a GPU: its memory is its own measured peak, its
    run time alone the median of its own solo runs; job 80 has no telemetry: public data."""
    from slurm_gpushare.daemon.fingerprint import Fingerprinter
    from slurm_gpushare.daemon.store import Store

    keys = Fingerprinter(b"k" * 32).job_keys(user="ann", script="#!/bin/sh\nx\n",
                                              name="x").as_list()
    tag = "gpushare:v1:share:id=d1:shard=8:types=a100:why=history-share"
    export = tmp_path / "sacct.psv"
    export.write_text(
        "JobID|JobIDRaw|State|Submit|Start|End|AllocTRES|AdminComment\n"
        f"68_3|72|COMPLETED|1000|1000|1200|gres/gpu:a100=0,gres/shard=8,node=1|{tag}\n"
        "80|80|COMPLETED|1000|1010|1110|gres/gpu=1,node=1|\n")
    with Store(tmp_path / "s.db") as store:
        for job_id, seconds in (("1", 100.0), ("2", 140.0), ("3", 120.0)):
            store.ingest_summary({"v": 1, "job_id": job_id, "gpu_index": 0, "shared": False,
                                  "duration_s": seconds, "coruns": [], "keys": keys})
        store.record_decision({"decision_id": "d1", "action": "share", "code": "history-share",
                               "share_gib": 8, "keys": keys, "job_id": "72"})
        store.ingest_summary({"v": 1, "job_id": "72", "gpu_index": 0, "shared": True,
                              "duration_s": 200.0, "mgmap_max_mib": 6000.0, "keys": keys})
        frame = traces.load_sacct(export, store=store).set_index("job_id")
    task, plain = frame.loc["68_3"], frame.loc["80"]
    assert (task.store_id, task.mem_mib, task.duration) == ("72", 6000.0, 120.0)
    assert (task.memory_from, task.runtime_from) == ("own telemetry", "own solo runs (3)")
    assert np.isnan(plain.mem_mib) and plain.duration == 100.0
    assert (plain.memory_from, plain.runtime_from) == ("public data", "sacct")


def test_builtin_cluster_specs():
    local = load_cluster("local")
    assert local.n_gpus == 10 and local.type_names == ("v100", "a100", "t4")
    assert sorted(local.gpu_mem_gib) == [16] * 6 + [80] * 4
    philly = load_cluster("philly")
    assert set(philly.type_names) == {"k80", "p100", "v100"}
    openb = load_cluster("openb")
    assert openb.n_gpus == 6212 and len(openb.nodes) == 1213


def test_cluster_spec_errors():
    good = {"gpu_types": {"v100": {"memory_gib": 16}},
            "nodes": [{"count": 1, "gpus": 2, "type": "v100"}]}
    assert parse_cluster(good).n_gpus == 2
    for broken in ({**good, "typo": 1}, {**good, "nodes": [{"type": "a100"}]},
                   {"gpu_types": {"v100": {"memory_gib": 0}}, "nodes": good["nodes"]}):
        with pytest.raises(ClusterSpecError):
            parse_cluster(broken)
    with pytest.raises(ClusterSpecError):
        load_cluster("no-such-spec")


def test_nodes_follow_slurm_weight_order():
    spec = {"gpu_types": {"v100": {"memory_gib": 16}, "k80": {"memory_gib": 12,
                                                           "speed_profile": "k80"}},
            "nodes": [{"prefix": "k", "count": 1, "type": "k80", "weight": 5},
                      {"prefix": "v", "count": 1, "type": "v100", "weight": 1}]}
    assert [n.name for n in parse_cluster(spec).nodes] == ["v1", "k1"]


@needs_data
def test_philly_and_openb_loaders():
    philly = traces.load_philly(DATA)
    assert len(philly) == 82247 and philly.submit.iloc[0] == 0
    assert philly.submit.max() / 86400 == pytest.approx(108.9, abs=0.1)  # Sep 4 - Dec 22
    openb = traces.load_openb(DATA)
    assert (openb.num_gpus > 0).all() and openb.gpu_milli.between(1, 1000).all()


@needs_data
def test_workload_draws_are_seeded_and_documented_quantities_hold():
    from slurm_gpushare.sim.interference import load_gavel
    from slurm_gpushare.sim.workload import WorkloadOptions, build_workload

    cl = load_cluster("philly")
    trace = traces.load_philly(DATA).iloc[:500]
    a = build_workload(trace, cl, DATA, WorkloadOptions(seed=1))
    b = build_workload(trace, cl, DATA, WorkloadOptions(seed=1))
    c = build_workload(trace, cl, DATA, WorkloadOptions(seed=2))
    assert (a.kind == b.kind).all() and (a.mem_true == b.mem_true).all()
    assert not (a.kind == c.kind).all()
    gavel = load_gavel(str(DATA))
    ref = cl.type_index("p100")
    k80 = cl.type_index("k80")
    j = 0
    ratio = gavel.alone[1, a.kind[j]] / gavel.alone[0, a.kind[j]]  # p100 / k80 throughput
    assert a.solo[j, ref] == trace.duration.iloc[0]
    assert a.solo[j, k80] == pytest.approx(trace.duration.iloc[0] * ratio)
    assert (a.mem_safe >= a.mem_true).all()  # error clipped inside the margin
    cap = np.array([t.memory_gib * 1024 for t in cl.types])
    assert (a.mem_true <= cap)[a.allowed].all()  # allowed types are those where it fits
    assert not a.allowed[:, k80].all()  # some SchedTune peaks exceed a K80's 12 GiB
    half = build_workload(trace, cl, DATA, WorkloadOptions(seed=1, load=2.0))
    assert half.submit == pytest.approx(a.submit / 2)



@needs_data
def test_a_draw_moves_only_the_true_run_times_and_by_about_a_thousandth():
    from slurm_gpushare.sim.workload import WorkloadOptions, build_workload

    cl = load_cluster("philly")
    trace = traces.load_philly(DATA).iloc[:500]
    base = build_workload(trace, cl, DATA, WorkloadOptions(seed=1))
    one = build_workload(trace, cl, DATA, WorkloadOptions(seed=1, draw=1))
    again = build_workload(trace, cl, DATA, WorkloadOptions(seed=1, draw=1))
    two = build_workload(trace, cl, DATA, WorkloadOptions(seed=1, draw=2))
    assert (one.solo == again.solo).all()  # a draw is reproducible
    assert not (one.solo == two.solo).all() and not (one.solo == base.solo).all()
    ratio = one.solo / base.solo
    assert np.allclose(ratio, ratio[:, :1])  # one factor per job, on every type
    assert 0.0005 < np.std(np.log(ratio[:, 0])) < 0.002
    # Everything else is the seed's: the same jobs, kinds, memory and estimates.
    for name in ("submit", "kind", "mem_true", "mem_safe", "runtime_pred", "allowed"):
        assert (getattr(one, name) == getattr(base, name)).all(), name

@needs_data
def test_gavel_pairs_and_the_more_than_two_rule():
    from slurm_gpushare.sim.interference import GavelPairs, gavel_classes, load_gavel

    gavel = load_gavel(str(DATA))
    assert gavel.n_kinds == 26
    assert np.isnan(gavel.pair).sum(axis=(1, 2)).tolist() == [87, 20, 40]  # [0, 0] pairs
    model = GavelPairs(gavel)
    a, b = 0, 1
    assert model.speeds(2, [a, b], [0, 0]) == pytest.approx([gavel.pair[2, a, b], gavel.pair[2, b, a]])
    three = model.speeds(2, [a, b, a], [0, 0, 0])
    assert three[1] == pytest.approx(gavel.pair[2, b, a] ** 2)
    failed = np.argwhere(np.isnan(gavel.pair[0]))[0]
    # A failed [0, 0] pair gets a speed (the memory model decides whether co-runs fit) ...
    filled = model.speeds(0, list(failed), [0, 0])
    assert filled is not None and all(0.05 <= s <= 1.0 for s in filled)
    assert not np.isnan(model.pair).any()
    # ... or stays a failing co-run when asked to.
    assert GavelPairs(gavel, failed_pairs="fail").speeds(0, list(failed), [0, 0]) is None
    assert sorted(np.bincount(gavel_classes(gavel)).tolist()) == [8, 9, 9]


@needs_data
def test_alnair_class_table():
    from slurm_gpushare.sim.interference import ClassPairTable

    table = ClassPairTable.from_alnair(str(DATA))
    speed = table.speed[0]
    assert ((speed > 0.5) & (speed <= 1.0)).all()
    # renumbered by pressure: class 0 keeps its partners fastest
    assert speed[:, 0].mean() >= speed[:, 2].mean()
