"""End to end on the real local cluster: a small workload runs, three jobs share one GPU, and the
report's PS, ISD and GPU-hours saved equal the values computed by hand from what sacct recorded.

The fake GPUs do not slow anything down, so the workload states its slowdown: each training
script sleeps ``$WORK_S`` seconds, less when run alone (its solo run, on a whole GPU) than when
shared. Telemetry from the prolog/epilog path is not wired yet, so the test writes the store
records that path and the daemon would: solo runs as summaries under the job's fingerprint
keys, the shared jobs' decisions (by the id in their AdminComment) with those keys. Co-run
groups come from where the jobs ran (``scontrol show job -d``, sampled while they run) and
sacct's Start/End.
"""

from __future__ import annotations

import time

import pytest

from slurm_gpushare.slurm.accounting import (SACCT_FIELDS, node_gpu_types_from_scontrol, parse_json,
                                       parse_psv, placements_from_scontrol, resolve_gpu_types)
from slurm_gpushare.daemon.fingerprint import Fingerprinter
from slurm_gpushare.reports.savings import build_report, groups_from_placements, record_groups
from slurm_gpushare.daemon.store import Store

pytestmark = pytest.mark.cluster

# One script per model; ": model-x" survives script normalisation, so each has its own keys.
SCRIPT = '#!/bin/sh\n: {model}\nsleep "$WORK_S"\n'
SHARED_NODE, SOLO_NODE, EXCL_NODE = "a100-2", "a100-1", "v100-1"
SOLO_S = {"a": 4, "b": 6}  # how long each model takes alone
SHARED_S = {"a": 6, "b": 8, "d": 4}  # ... and next to the others (the known slowdown)
PREDICTED_SOLO_S = {"d": 3.0}  # model d has no solo history: the predictor's figure
CLASSES = {"a": 0, "b": 1, "d": 1}


def _submit(cluster, model: str, seconds: int, *args: str) -> str:
    return cluster.sbatch(*args, f"--job-name=train-{model}", f"--export=ALL,WORK_S={seconds}",
                          script=SCRIPT.format(model=f"model-{model}"))


def _watch_placements(cluster, ids: list[str], timeout: float = 120) -> dict:
    """Sample ``scontrol show job -d`` until every job has ended; slurmctld drops the GPU
    indexes when a job ends, so they are only visible while it runs."""
    seen: dict = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queued = cluster.slurm("squeue", "-h", "-j", ",".join(ids), "-o", "%i %t",
                               check=False).stdout.split("\n")
        if not any(line.strip() for line in queued):
            return seen
        for line in queued:
            if line.endswith(" R"):  # 22.05's scontrol shows one job id at a time
                detail = cluster.slurm("scontrol", "show", "job", "-d", line.split()[0],
                                       check=False).stdout
                for job_id, places in placements_from_scontrol(detail).items():
                    seen.setdefault(job_id, set()).update(places)
        time.sleep(0.2)
    pytest.fail(f"jobs {ids} still queued after {timeout}s")


def test_report_figures_equal_hand_computation(cluster, tmp_path):
    # -- the workload ---------------------------------------------------------------------
    solo = {m: _submit(cluster, m, s, "--gres=gpu:1", "--comment=gpushare=off",
                       f"--nodelist={SOLO_NODE}") for m, s in SOLO_S.items()}
    # New jobs run whole by default (first_run = "whole-gpu"); a 7 GiB hint (+10%) shares
    # them at once in 8 GiB shares.
    shared = {m: _submit(cluster, m, s, "--gres=gpu:1", "--comment=gpushare:mem=7G",
                         f"--nodelist={SHARED_NODE}") for m, s in SHARED_S.items()}
    whole = _submit(cluster, "c", 3, "--gres=gpu:1", "-p", "gpu-excl", f"--nodelist={EXCL_NODE}")
    ids = list(solo.values()) + list(shared.values()) + [whole]
    placements = _watch_placements(cluster, ids)
    for job_id in ids:
        cluster.sacct(job_id, "JobID,State")  # until slurmdbd holds the end of every job
    psv = cluster.slurm("sacct", "-a", "-P", "-o", ",".join(SACCT_FIELDS), "-j", ",".join(ids),
                        env={"SLURM_TIME_FORMAT": "%s"}).stdout
    jobs = {j.job_id: j for j in parse_psv(psv)}
    node_types = node_gpu_types_from_scontrol(
        cluster.slurm("scontrol", "-o", "show", "nodes").stdout)
    resolve_gpu_types(jobs.values(), node_types)
    assert all(jobs[i].state == "COMPLETED" for i in ids), {i: jobs[i].state for i in ids}
    assert all(jobs[shared[m]].shared for m in shared), "the hook did not share the jobs"
    assert not any(jobs[solo[m]].shared for m in solo) and not jobs[whole].shared
    # The three shares ran on one GPU at overlapping times (that is what the test is about).
    gpus = {frozenset(placements[shared[m]]) for m in shared}
    assert len(gpus) == 1 and len(next(iter(gpus))) == 1, placements
    run = {i: jobs[i].end - jobs[i].start for i in ids}
    # sacct keeps whole seconds and a loaded host adds start-up time (prolog and epilog on
    # two shared cores: seen up to +6 s): sleep lengths bound the run times from below; the
    # hand computation below uses what sacct recorded.
    for m, seconds in SOLO_S.items():
        assert seconds <= run[solo[m]] <= seconds + 15
    for m, seconds in SHARED_S.items():
        assert seconds <= run[shared[m]] <= seconds + 15

    # -- the store, as the prolog/epilog path and the daemon would fill it -------------------------
    fp = Fingerprinter(b"report-e2e-secret" * 2)
    keys = {m: fp.job_keys(user="root", script=SCRIPT.format(model=f"model-{m}"),
                           name=f"train-{m}").as_list() for m in CLASSES}
    store = Store(tmp_path / "gpushare.db")
    for m, job_id in solo.items():
        store.ingest_summary({"v": 1, "job_id": job_id, "gpu_index": 0, "gpu_model": "A100-80GB",
                              "start_ts": jobs[job_id].start, "end_ts": jobs[job_id].end,
                              "duration_s": run[job_id], "shared": False, "coruns": [],
                              "mgmap_max_mib": 5 * 1024, "keys": keys[m]})
    peaks_gib = {"a": 5.0, "b": 9.0, "d": 2.0}  # b outgrows its 8 GiB share
    for m, job_id in shared.items():
        job = jobs[job_id]
        store.record_decision({"decision_id": job.decision_id, "action": "share",
                               "code": job.decision_code, "share_gib": job.shards,
                               "job_class": CLASSES[m], "keys": keys[m], "job_id": job_id,
                               "details": {"source": "history"}})
        store.ingest_summary({"v": 1, "job_id": job_id, "gpu_index": 0, "gpu_model": "A100-80GB",
                              "duration_s": run[job_id], "shared": True,
                              "mgmap_max_mib": peaks_gib[m] * 1024, "keys": keys[m]})
    groups = groups_from_placements(jobs.values(), placements)
    assert record_groups(store, groups) == 3  # the pairs a-b, a-d, b-d

    # -- the report -----------------------------------------------------------------------
    by_id = {v: k for k, v in shared.items()}

    def predictor(job):
        return PREDICTED_SOLO_S.get(by_id.get(job.job_id))

    window = dict(since=min(j.submit for j in jobs.values()) - 1, until=time.time() + 1)
    report = build_report(list(jobs.values()), store=store, predictor=predictor, **window)

    # -- by hand, from sacct's Start/End and the solo times -------------------------------
    solo_s = {"a": run[solo["a"]], "b": run[solo["b"]], "d": PREDICTED_SOLO_S["d"]}
    makespan = (max(jobs[shared[m]].end for m in shared)
                - min(jobs[shared[m]].start for m in shared))
    # d's solo time is a prediction: it fills GPU-hours, not PS or the slowdown totals.
    isd = {m: run[shared[m]] / solo_s[m] - 1 for m in shared}
    whole_gpu_s = run[solo["a"]] + run[solo["b"]] + run[whole]  # exclusive jobs: used = needed
    used_h = (makespan + whole_gpu_s) / 3600
    exclusive_h = (sum(solo_s.values()) + whole_gpu_s) / 3600
    saved_h = (sum(solo_s.values()) - makespan) / 3600

    totals = report["totals"]
    assert totals["ps"] is None
    assert totals["gpu_hours_used"] == pytest.approx(used_h, abs=1e-12)
    assert totals["gpu_hours_exclusive"] == pytest.approx(exclusive_h, abs=1e-12)
    assert totals["gpu_hours_saved"] == pytest.approx(saved_h, abs=1e-12)
    reported = {by_id[j["job_id"]]: j for j in report["shared_jobs"]}
    for m in shared:
        assert reported[m]["isd"] == pytest.approx(isd[m], abs=1e-12)
    assert {m: reported[m]["solo_source"] for m in shared} == {
        "a": "history", "b": "history", "d": "predictor"}
    (group,) = [g for g in report["groups"] if len(g["jobs"]) > 1]
    assert group["ps"] is None and group["class_pair"] == "0+1+1"
    assert totals["isd_median"] == pytest.approx((isd["a"] + isd["b"]) / 2, abs=1e-12)
    assert totals["isd_n"] == 2 and totals["isd_against_prediction"] == 1
    assert report["prediction"]["history"]["share_below_peak"] == 1  # b: 9 GiB peak on 8 GiB
    assert totals["overrun_shared"] == 1
    print(f"\nhand: ISD={ {m: round(v, 6) for m, v in isd.items()} } "
          f"saved={saved_h:.8f} GPU-h; report: "
          f"saved={totals['gpu_hours_saved']:.8f} GPU-h (makespan {makespan:.0f}s, "
          f"solo {solo_s})")

    # The same figures from sacct --json, and from the co-runs now in the store.
    js = cluster.slurm("sacct", "-a", "--json", "-j", ",".join(ids)).stdout
    from_json = parse_json(js)
    resolve_gpu_types(from_json, node_types)
    again = build_report(from_json, store=store, predictor=predictor, **window)
    assert again["totals"]["ps"] is None
    for name in ("gpu_hours_used", "gpu_hours_saved", "isd_mean"):
        assert again["totals"][name] == pytest.approx(totals[name], abs=1e-12)
    store.close()


def test_import_usage_reads_real_sacct(cluster, monkeypatch, capsys):
    """``import-usage`` runs the real sacct with TRESUsageInMax on this version; the fake GPUs
    have no NVML, so Slurm accounted no GPU memory and nothing is sent."""
    from slurm_gpushare.cli import main as cli_main

    for name, value in cluster.client_environ().items():  # SLURM_CONF (and PATH for 24.11)
        monkeypatch.setenv(name, value)
    job = _submit(cluster, "u", 1, "--gres=gpu:1", "-p", "gpu-excl")
    cluster.wait_state(job, {"COMPLETED"}, timeout=120)
    assert cli_main(["import-usage", "--config", str(cluster.daemon_config), "--since", "-1h",
                     "--min-age", "0"]) == 0
    out = capsys.readouterr().out
    jobs = int(out.split(" jobs,")[0])
    assert jobs >= 1 and ", 0 with Slurm's GPU accounting: sent 0" in out, out
