"""Report figures on small hand-made workloads whose PS, ISD and GPU-hours are worked out here."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from slurm_gpushare.slurm.accounting import JobRecord
from slurm_gpushare.cli import main
from slurm_gpushare.daemon.fingerprint import Fingerprinter
from slurm_gpushare.reports.savings import (build_report, groups_from_placements, groups_from_store,
                                   record_groups)
from slurm_gpushare.daemon.store import Store

DATA = Path(__file__).resolve().parents[1] / "data" / "sacct"
T0 = 1_800_000_000.0
FP = Fingerprinter(b"k" * 32)


def job(job_id, start, end, *, shared=True, gpus=0, user="alice", account="physics",
        state="COMPLETED", submit=None, node="a100-1", decision=None, signal=0):
    tag = (f"gpushare:v1:share:id={decision or 'd' + job_id}:shard=8:types=a100:why=history-share"
           if shared else "")
    alloc = {"gres/shard": 8.0} if shared else ({"gres/gpu": float(gpus)} if gpus else {})
    return JobRecord(job_id=job_id, raw_id=job_id, user=user, account=account, partition="gpu",
                     state=state, exit_code=0, signal=signal,
                     submit=T0 + (submit if submit is not None else start), start=T0 + start,
                     end=T0 + end, nodes=node, alloc_tres=alloc, tag=tag, gpu_type="a100")


def keys(name):
    return FP.job_keys(user="alice", script=f"#!/bin/sh\n: {name}\n", name=name).as_list()


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "gpushare.db")
    yield s
    s.close()


def solo_run(store, job_id, name, seconds, model="A100-80GB", shared=False):
    store.ingest_summary({"v": 1, "job_id": job_id, "gpu_index": 0, "gpu_model": model,
                          "duration_s": seconds, "shared": shared, "coruns": [],
                          "keys": keys(name)})


def decide(store, j, name, job_class=None, share_gib=8, safe_mib=None):
    details = {"source": "history"}
    if safe_mib is not None:
        details["memory_mib"] = {"a100": safe_mib, "v100": 1.0}
    store.record_decision({"decision_id": j.decision_id, "action": "share", "code": "history-share",
                           "share_gib": share_gib, "keys": keys(name), "job_class": job_class,
                           "job_id": j.job_id, "details": details})


@pytest.fixture
def pair_workload(store):
    """x (solo 100 s) and y (solo 50 s) share one GPU: x runs 0..130, y 10..80. One whole-GPU
    job z runs 0..40 on two GPUs. Hand figures: makespan 130, PS = 1 - 130/150,
    ISD x = 130/100 - 1 = 0.3, y = 70/50 - 1 = 0.4."""
    solo_run(store, "1", "x", 100.0)
    solo_run(store, "2", "y", 50.0)
    x, y = job("10", 0, 130), job("11", 10, 80, user="bob", account="chem")
    z = job("12", 0, 40, shared=False, gpus=2)
    decide(store, x, "x", job_class=0)
    decide(store, y, "y", job_class=2)
    placements = {"10": {("a100-1", 0)}, "11": {("a100-1", 0)},
                  "12": {("a100-2", 0), ("a100-2", 1)}}
    return [x, y, z], groups_from_placements([x, y, z], placements)


def test_pair_figures_equal_hand_computation(store, pair_workload):
    jobs, groups = pair_workload
    report = build_report(jobs, since=T0, until=T0 + 3600, store=store, groups=groups)
    t = report["totals"]
    assert t["ps"] == pytest.approx(1 - 130 / 150)
    isd = {j["job_id"]: j["isd"] for j in report["shared_jobs"]}
    assert isd == {"10": pytest.approx(0.3), "11": pytest.approx(0.4)}
    assert t["gpu_hours_used"] == pytest.approx((130 + 2 * 40) / 3600)
    assert t["gpu_hours_exclusive"] == pytest.approx((150 + 2 * 40) / 3600)
    assert t["gpu_hours_saved"] == pytest.approx(20 / 3600)
    assert t["solo_from_history"] == 2 and t["solo_unknown"] == 0
    (group,) = [g for g in report["groups"] if len(g["jobs"]) > 1]
    assert group["class_pair"] == "0+2" and group["gpu"] == "a100-1:0"
    assert report["class_matrix"] == [
        {"class": "0", "with": "2", "n": 1, "isd_mean": pytest.approx(0.3)},
        {"class": "2", "with": "0", "n": 1, "isd_mean": pytest.approx(0.4)}]


def test_rows_split_a_group_by_solo_time(store, pair_workload):
    jobs, groups = pair_workload
    report = build_report(jobs, since=T0, until=T0 + 3600, store=store, groups=groups, by="user")
    rows = {r["key"]: r for r in report["rows"]}
    # The 130 s makespan is attributed 100:50 by solo time; each user's PS is the group's.
    assert rows["alice"]["gpu_hours_used"] == pytest.approx((130 * 100 / 150 + 80) / 3600)
    assert rows["bob"]["gpu_hours_used"] == pytest.approx(130 * 50 / 150 / 3600)
    assert rows["alice"]["ps"] == pytest.approx(rows["bob"]["ps"]) == pytest.approx(1 - 130 / 150)
    assert sum(r["gpu_hours_saved"] for r in rows.values()) == pytest.approx(
        report["totals"]["gpu_hours_saved"])


def test_groups_from_store_match_groups_from_placement(store, pair_workload):
    jobs, groups = pair_workload
    assert record_groups(store, groups) == 1
    from_store = groups_from_store(jobs, store.corun_observations())
    assert [g.ids for g in from_store] == [["10", "11"]]
    report = build_report(jobs, since=T0, until=T0 + 3600, store=store)  # groups from store
    assert report["totals"]["ps"] == pytest.approx(1 - 130 / 150)


def test_co_run_groups_chain_and_touching_intervals_do_not_overlap():
    a, b, c = job("1", 0, 10), job("2", 5, 20), job("3", 15, 30)  # a-b, b-c: one chain
    d = job("4", 30, 40)  # starts as c ends: alone
    e = job("5", 0, 10, node="a100-2")
    place = {j.job_id: {(j.nodes, 0)} for j in (a, b, c, d, e)}
    groups = groups_from_placements([a, b, c, d, e], place)
    assert sorted(g.ids for g in groups) == [["1", "2", "3"], ["4"], ["5"]]
    assert next(g for g in groups if g.shared).makespan_s == 30


def test_solo_time_sources_and_which_one_is_shown(store):
    solo_run(store, "1", "x", 100.0)
    solo_run(store, "2", "x", 120.0)  # median of the two: 110
    solo_run(store, "3", "x", 10.0, model="V100-16GB")  # another GPU type: not this job's solo
    solo_run(store, "4", "x", 10.0, shared=True)  # ran shared: not a solo run
    x, y, w = job("10", 0, 132), job("11", 0, 66), job("12", 0, 50)
    decide(store, x, "x")
    decide(store, y, "y")  # no solo history for y ...
    store.record_decision({"decision_id": w.decision_id, "action": "share", "code": "c",
                           "keys": [keys("x")[2]]})  # w shares only the *user* key with x

    def predictor(j):  # ... so its solo time is predicted
        return {"11": 60.0}.get(j.job_id)

    place = {j.job_id: {("a100-1", 0)} for j in (x, y, w)}
    report = build_report([x, y, w], since=T0, until=T0 + 3600, store=store, predictor=predictor,
                          groups=groups_from_placements([x, y, w], place))
    shown = {j["job_id"]: (j["solo_s"], j["solo_source"]) for j in report["shared_jobs"]}
    assert shown == {"10": (110.0, "history"), "11": (60.0, "predictor"), "12": (None, "unknown")}
    t = report["totals"]
    assert (t["solo_from_history"], t["solo_from_predictor"], t["solo_unknown"]) == (1, 1, 1)
    assert t["ps"] is None  # w's solo time is unknown, so the group has no PS
    assert any("no solo run time" in n for n in report["notes"])


def test_failures_oom_queue_delay_and_running_jobs(store):
    ok = job("1", 10, 20, submit=0)
    oom = job("2", 5, 15, state="FAILED", signal=9, submit=0)
    timeout = job("3", 0, 60, shared=False, gpus=1, state="TIMEOUT", submit=0)
    cancelled = job("4", 0, 5, shared=False, gpus=1, state="CANCELLED")
    running = job("5", 0, 10)
    running.state, running.end = "RUNNING", None
    report = build_report([ok, oom, timeout, cancelled, running], since=T0, until=T0 + 3600,
                          store=store)
    t = report["totals"]
    assert (t["oom_shared"], t["oom_exclusive"]) == (1, 0)
    assert (t["failed_shared"], t["failed_exclusive"]) == (1, 1)
    assert (t["cancelled_shared"], t["cancelled_exclusive"]) == (0, 1)
    assert t["running_jobs"] == 1 and t["gpu_jobs"] == 4
    assert t["queue_delay_shared_median_s"] == pytest.approx(7.5)
    assert t["queue_delay_exclusive_median_s"] == pytest.approx(0)


def test_predictor_error_is_kept_apart_from_over_allocation(store):
    """x: estimate 6.6 GiB, share 8, peak 6 -> error +10%, share/peak 1.33. y: estimate 9 GiB,
    share 8, peak 10 -> error -10% (the margin was not enough), outgrew its share (0.8)."""
    x, y = job("10", 0, 10), job("11", 0, 10)
    decide(store, x, "x", share_gib=8, safe_mib=6.6 * 1024)
    decide(store, y, "y", share_gib=8, safe_mib=9 * 1024)
    for j, peak_gib in ((x, 6.0), (y, 10.0)):
        store.ingest_summary({"v": 1, "job_id": j.job_id, "gpu_index": 0, "shared": True,
                              "mgmap_max_mib": peak_gib * 1024})
    report = build_report([x, y], since=T0, until=T0 + 3600, store=store)
    q = report["prediction"]["history"]
    assert q["n"] == 2 and q["estimate_n"] == 2 and q["share_n"] == 2
    assert q["estimate_error_mean"] == pytest.approx((0.1 - 0.1) / 2, abs=1e-12)
    assert q["estimate_error_p95"] == pytest.approx(0.1)
    assert q["estimate_below_peak"] == 1 and q["share_below_peak"] == 1
    assert q["share_over_peak_median"] == pytest.approx((8 / 6 + 8 / 10) / 2)
    assert report["totals"]["overrun_shared"] == 1


def test_anonymise_replaces_user_names_everywhere(store, pair_workload):
    jobs, groups = pair_workload
    report = build_report(jobs, since=T0, until=T0 + 3600, store=store, groups=groups,
                          by="user", anonymise=True)
    text = json.dumps(report)
    assert "alice" not in text and "bob" not in text
    assert [r["key"] for r in report["rows"]] == ["user-1", "user-2"]  # alice used more


def test_group_by_each_key(store, pair_workload):
    jobs, groups = pair_workload
    keys_by = {}
    for by in ("user", "account", "partition", "gpu-type", "class-pair"):
        report = build_report(jobs, since=T0, until=T0 + 3600, store=store, groups=groups, by=by)
        keys_by[by] = [r["key"] for r in report["rows"]]
    assert keys_by == {"user": ["alice", "bob"], "account": ["chem", "physics"],
                       "partition": ["gpu"], "gpu-type": ["a100"],
                       "class-pair": ["0+2", "solo"]}
    with pytest.raises(ValueError):
        build_report(jobs, since=T0, until=T0 + 1, by="model")


# -- the command ---------------------------------------------------------------------------
WINDOW = ["--since", "2026-01-01", "--until", "1795400000"]


def test_cli_formats_on_recorded_sacct(tmp_path, capsys):
    psv = str(DATA / "awkward.psv")
    assert main(["report", "--sacct-file", psv, *WINDOW, "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["totals"]["shared_jobs"] == 10 and report["totals"]["running_jobs"] == 1
    assert report["totals"]["failed_shared"] == 3 and report["totals"]["oom_shared"] == 1
    assert main(["report", "--sacct-file", psv, *WINDOW, "--format", "csv", "--by", "user"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["user"] for r in rows if r["row"] == "summary"] == ["nobody", "root", "all"]
    job_rows = [r for r in rows if r["row"] == "job"]
    assert len(job_rows) == report["totals"]["gpu_jobs"]
    assert {r["job_id"] for r in job_rows} == {j["job_id"] for j in report["jobs"]}
    assert main(["report", "--sacct-file", psv, *WINDOW]) == 0
    out = capsys.readouterr().out
    assert "By account" in out and "physics" in out
    target = tmp_path / "r.html"
    assert main(["report", "--sacct-file", str(DATA / "awkward.json"), *WINDOW,
                 "--format", "html", "-o", str(target), "--anonymise", "--by", "user"]) == 0
    page = target.read_text()
    assert page.startswith("<!DOCTYPE html>") and "root" not in page.replace("root:", "")


def test_cli_takes_the_store_from_the_config(tmp_path, capsys, store, pair_workload,
                                             monkeypatch):
    """Without --store the report reads daemon.state_dir/store.sqlite of the config."""
    from slurm_gpushare.reports import savings

    state = tmp_path / "state"
    state.mkdir()
    config = tmp_path / "gpushare.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state}"\n')
    psv = str(DATA / "awkward.psv")
    monkeypatch.delenv("GPUSHARE_CONFIG", raising=False)
    assert main(["report", "--sacct-file", psv, *WINDOW, "--format", "json",
                 "--config", str(config)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["notes"][0].startswith(f"no store at {state / 'store.sqlite'}")
    seen = []
    real = savings.build_report
    monkeypatch.setattr("slurm_gpushare.cli.report.build_report",
                        lambda *a, **k: seen.append(k["store"]) or real(*a, **k))
    Store(state / "store.sqlite").close()
    assert main(["report", "--sacct-file", psv, *WINDOW, "--format", "json",
                 "--config", str(config)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert seen[0] is not None and not report["notes"][0].startswith("no store")


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["report", "--sacct-file", str(tmp_path / "missing.psv")]) == 1
    assert main(["report", "--sacct-file", str(DATA / "constraints_pipe.psv"), *WINDOW]) == 1
    assert main(["report", "--since", "yesterday-ish"]) != 0
    assert main(["report", "--store", str(tmp_path / "none.db"), "--sacct-file",
                 str(DATA / "awkward.psv")]) == 1
    assert main(["report", "--since", "now", "--until", "-1d"]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("slurm-gpushare:")]
    assert len(lines) >= 4 and "Traceback" not in err
    assert "Constraints" in err and "no store" in err


def test_array_tasks_and_het_components_find_their_own_telemetry(store):
    """sacct names an array task 68_3 and a het component 70+1; the store knows them by their
    numeric ids (JobIDRaw) 72 and 71. Both share one GPU (co-run recorded under those ids)."""
    solo_run(store, "1", "x", 100.0)
    solo_run(store, "2", "y", 50.0)
    task = job("68_3", 0, 130)
    task.raw_id = "72"
    comp = job("70+1", 10, 80)
    comp.raw_id = "71"
    decide(store, task, "x", job_class=0)
    decide(store, comp, "y", job_class=2)
    store.record_corun("72", "71", gpu_uuid="GPU-1", overlap_s=70.0)
    for j, peak in ((task, 6.0), (comp, 3.0)):
        store.ingest_summary({"v": 1, "job_id": j.raw_id, "gpu_index": 0, "shared": True,
                              "mgmap_max_mib": peak * 1024})
    report = build_report([task, comp], since=T0, until=T0 + 3600, store=store)
    rows = {r["job_id"]: r for r in report["shared_jobs"]}
    assert rows["68_3"]["store_id"] == "72" and rows["68_3"]["co_runners"] == ["70+1"]
    assert rows["68_3"]["isd"] == pytest.approx(0.3) and rows["70+1"]["isd"] == pytest.approx(0.4)
    assert rows["68_3"]["peak_gib"] == 6.0 and rows["70+1"]["peak_gib"] == 3.0
    assert report["totals"]["gpu_hours_saved"] == pytest.approx((150 - 130) / 3600)


def test_isd_bounds_follow_sacct_resolution_and_small_samples_are_flagged(store, pair_workload):
    jobs, groups = pair_workload
    report = build_report(jobs, since=T0, until=T0 + 3600, store=store, groups=groups)
    x = next(r for r in report["shared_jobs"] if r["job_id"] == "10")
    # run 130 s, solo 100 s, each of sacct's times +-1 s: run +-2, solo +-2.
    assert x["isd_low"] == pytest.approx(128 / 102 - 1) and x["isd_high"] == pytest.approx(132 / 98 - 1)
    assert x["solo_runs"] == 1
    t = report["totals"]
    assert t["isd_small_sample"] and t["isd_thin_history"] == 2
    assert t["isd_noisy"] == 1  # y: 68/52 - 1 to 72/48 - 1, half-width 9.6%
    assert t["slowed_jobs"] == 2 and t["extra_run_hours"] == pytest.approx((30 + 20) / 3600)
    assert any("small sample" in n for n in report["notes"])
    assert report["verdict"].startswith("Sharing saved 0.01 GPU-h (8.7%)")
    assert "2 of 2 jobs with a known slowdown slowed more than 20%" in report["verdict"]
    assert "shares waited" in report["verdict"] or "extra queueing" in report["verdict"]
    assert "Too few to judge" in report["verdict"]


def test_requeued_runs_count_as_gpu_time_used(store):
    """sacct -D lists a requeued job twice under one JobID: the earlier run (0..20 on a share,
    REQUEUED) held a GPU, which whole GPUs would not have needed; the final run is the job."""
    from slurm_gpushare.slurm.accounting import parse_psv

    head = "JobID|JobIDRaw|State|Submit|Start|End|AllocTRES|AdminComment"
    tag = "gpushare:v1:share:id=d9:shard=8:types=a100:why=history-share"
    text = "\n".join([head,
                      f"9|9|REQUEUED|{T0:.0f}|{T0:.0f}|{T0 + 20:.0f}|gres/shard=8|{tag}",
                      f"9|9|COMPLETED|{T0 + 25:.0f}|{T0 + 30:.0f}|{T0 + 90:.0f}|gres/shard=8|{tag}",
                      f"9.batch|9|COMPLETED||{T0 + 30:.0f}|{T0 + 90:.0f}||"]) + "\n"
    (record,) = parse_psv(text)
    assert record.state == "COMPLETED" and len(record.earlier_runs) == 1
    t = build_report([record], since=T0, until=T0 + 3600, store=store)["totals"]
    assert t["requeued_runs_shared"] == 1 and t["requeued_gpu_hours"] == pytest.approx(20 / 3600)
    assert t["gpu_hours_used"] == pytest.approx(80 / 3600)
    assert t["gpu_hours_exclusive"] == pytest.approx(60 / 3600)


def test_solo_time_falls_back_to_the_daemons_recorded_run_time_prediction(store):
    """x has no solo history; its decision recorded a predicted 100 s on a100 (and 50 s on
    v100, not its type): that is its solo time, marked as a prediction."""
    x, y = job("10", 0, 130), job("11", 0, 60)
    for j, name in ((x, "x"), (y, "y")):
        store.record_decision({"decision_id": j.decision_id, "action": "share",
                               "code": "history-share", "share_gib": 8, "keys": keys(name),
                               "job_id": j.job_id, "details": {
                                   "source": "history",
                                   "runtime_s": {"a100": 100.0 if name == "x" else 40.0,
                                                 "v100": 50.0}}})
    groups = groups_from_placements([x, y], {"10": {("a100-1", 0)}, "11": {("a100-1", 0)}})
    report = build_report([x, y], since=T0, until=T0 + 3600, store=store, groups=groups)
    rows = {r["job_id"]: r for r in report["shared_jobs"]}
    assert (rows["10"]["solo_s"], rows["10"]["solo_source"]) == (100.0, "predictor")
    assert rows["10"]["isd"] == pytest.approx(0.3) and rows["10"]["isd_low"] is None
    # A prediction fills the GPU-hours, never PS or the slowdown totals.
    t = report["totals"]
    assert t["gpu_hours_exclusive"] == pytest.approx((100 + 40) / 3600)
    assert t["ps"] is None and t["isd_n"] == 0 and t["isd_against_prediction"] == 2


def test_peaks_from_slurms_own_gpu_accounting_where_no_agent_summary(store):
    from test_accounting import GPU_USAGE_PSV

    from slurm_gpushare.slurm.accounting import parse_psv

    jobs = parse_psv(GPU_USAGE_PSV)
    report = json.loads(json.dumps(build_report(jobs, since=0, until=100)))  # no store
    rows = {r["job_id"]: r for r in report["jobs"]}
    assert rows["41"]["peak_gib"] == pytest.approx(9830 / 1024)
    assert rows["41"]["peak_source"] == "slurm"
    assert rows["42"]["peak_gib"] is None and rows["42"]["peak_source"] is None
    # 9.6 GiB on a share of 8 shards (8 GiB): it outgrew its share.
    assert report["prediction"]["unknown"]["share_below_peak"] == 1
    assert report["totals"]["overrun_shared"] == 1
    # The node agent's own summary, where the store holds one, comes first.
    store.ingest_summary({"v": 1, "job_id": "41", "gpu_index": 0, "mgmap_max_mib": 7168})
    report = json.loads(json.dumps(build_report(jobs, since=0, until=100, store=store)))
    rows = {r["job_id"]: r for r in report["jobs"]}
    assert rows["41"]["peak_gib"] == 7.0 and rows["41"]["peak_source"] == "agent"
