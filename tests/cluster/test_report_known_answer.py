"""Known answer, end to end on the real cluster: an array of 8 tasks sharing GPUs, a het job
whose two components share, a requeued job and 4 whole-GPU jobs run through the real hook;
``slurm-gpushare report --format json`` on their ``sacct -D -P`` output and a store written
here must give exactly the figures computed below by hand from sacct and that store (this file
does not call the report's code to compute them).

The store is written as the prolog/epilog agent and the daemon would write it, keyed by
Slurm's numeric job ids (sacct's JobIDRaw: an array task ``68_3`` is ``72`` there): the array
script's solo history (three earlier solo runs), each shared job's decision and its peak GPU
memory, and the pairs that shared a GPU (from ``scontrol show job -d`` while they ran).
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict

import numpy as np
import pytest

from slurm_gpushare.cli import main
from slurm_gpushare.daemon.fingerprint import Fingerprinter
from slurm_gpushare.daemon.store import Store
from slurm_gpushare.slurm.accounting import SACCT_FIELDS

from test_report_cluster import _watch_placements  # tests/cluster is on sys.path

ARRAY_SCRIPT = '#!/bin/sh\n: known-answer-array\nsleep "$WORK_S"\n'
HET_SCRIPT = '#!/bin/sh\n: known-answer-het\nsleep "$WORK_S"\n'
WHOLE_SCRIPT = '#!/bin/sh\n: known-answer-whole\nsleep "$WORK_S"\n'
ARRAY_SOLO_RUNS_S = [3.0, 4.0, 6.0]  # the array script's earlier solo runs: median 4 s
HET_PREDICTED_S = 2.0  # the het job has no solo history: the daemon's run-time prediction
SAFE_MIB = 7.5 * 1024  # the decisions' safe estimate (prediction + margin) on a100
SHARE_GIB = 8.0
TYPES = ("a100", "v100")


def _gpu_type(nodes: str) -> str:
    return nodes.split("-")[0]  # the test cluster's nodes are named by their GPU type


def _fields(line: str, header: list[str]) -> dict[str, str]:
    return dict(zip(header, line.split("|", len(header) - 1)))


def _interp(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q * 100)) if values else None


def _mean(values):
    return sum(values) / len(values) if values else None


def test_report_json_equals_hand_computation(cluster, tmp_path, monkeypatch):
    for name, value in cluster.client_environ().items():  # the report asks scontrol for GPU
        monkeypatch.setenv(name, value)  # types: this cluster's clients (22.05 or 24.11)
    # The requeue first: the shares and whole-GPU jobs are watched from their submission.
    requeued = cluster.sbatch("--requeue", "--gres=gpu:1", "-p", "gpu-excl",
                              "--nodelist=v100-1", "--job-name=ka-requeue",
                              script=WHOLE_SCRIPT, env={"WORK_S": "3"})
    cluster.wait_state(requeued, {"RUNNING"}, timeout=60)
    time.sleep(1)
    cluster.slurm("scontrol", "requeue", requeued)
    # Slurm holds a requeued job back (BeginTime, about two minutes) once it is pending again;
    # let it start again at once.
    deadline = time.monotonic() + 30
    while cluster.job(requeued).get("Reason") != "BeginTime":
        assert time.monotonic() < deadline, cluster.job(requeued)
        time.sleep(0.2)
    # slurmd revoked the first run's credential when it was requeued, to the second: a new run
    # started within that second is refused ("Job credential revoked") and the job FAILS.
    time.sleep(2)
    cluster.slurm("scontrol", "update", f"jobid={requeued}", "StartTime=now")
    env = {"WORK_S": "4"}
    # Submitted held and released together, so that every one is watched while it runs.
    array = cluster.sbatch("--hold", "--array=0-7", "--gres=gpu:1", "--comment=gpushare:mem=7G",
                           "--nodelist=a100-2", "--job-name=ka-array", script=ARRAY_SCRIPT,
                           env=env)
    # (22.05 refuses --nodelist on het components next to the hook's constraints.)
    het = cluster.sbatch("--hold", "--gres=gpu:1", "--comment=gpushare:mem=7G", ":", "--gres=gpu:1",
                         "--comment=gpushare:mem=7G", "--job-name=ka-het", script=HET_SCRIPT,
                         env={"WORK_S": "3"})
    whole = [cluster.sbatch("--hold", "--gres=gpu:1", "-p", "gpu-excl", "--nodelist=v100-2",
                            "--job-name=ka-whole", script=WHOLE_SCRIPT, env={"WORK_S": "2"})
             for _ in range(4)]
    cluster.slurm("scontrol", "release", ",".join([array, het, *whole]))
    placements = _watch_placements(cluster, [array, het, requeued, *whole], timeout=180)

    ids = ",".join([array, het, requeued, *whole])
    header = list(SACCT_FIELDS)
    deadline = time.monotonic() + 30
    while True:  # until slurmdbd holds the end of every run
        psv = cluster.slurm("sacct", "-a", "-D", "-P", "-o", ",".join(SACCT_FIELDS), "-j", ids,
                            env={"SLURM_TIME_FORMAT": "%s"}).stdout
        lines = [_fields(line, header) for line in psv.splitlines()[1:] if line.strip()]
        runs = [r for r in lines if "." not in r["JobID"]]
        if len(runs) == 8 + 2 + 2 + 4 and all(r["End"].isdigit() for r in runs):
            break
        assert time.monotonic() < deadline, psv
        time.sleep(0.5)
    sacct_file = tmp_path / "sacct.psv"
    sacct_file.write_text(psv)

    # -- by hand: the jobs as sacct recorded them -------------------------------------------
    finals: dict[str, dict] = {}
    earlier: dict[str, list[dict]] = defaultdict(list)
    for r in sorted(runs, key=lambda r: int(r["Start"])):
        if r["JobID"] in finals:
            earlier[r["JobID"]].append(finals[r["JobID"]])
        finals[r["JobID"]] = r
    array_ids = [f"{array}_{i}" for i in range(8)]
    het_ids = [f"{het}+0", f"{het}+1"]
    assert set(finals) == {*array_ids, *het_ids, requeued, *whole}
    assert [e["State"] for e in earlier[requeued]] == ["REQUEUED"]
    assert all(r["State"] == "COMPLETED" for r in finals.values()), finals
    shared_ids = [i for i in finals if "gres/shard=" in finals[i]["AllocTRES"]]
    assert sorted(shared_ids) == sorted(array_ids), "the hook did not share the array's tasks"
    # Heterogeneous jobs are left whole, as submitted (one decision cannot fit every component).
    raw = {i: finals[i]["JobIDRaw"] for i in finals}
    assert len(set(raw.values())) == len(raw)  # each task and component: its own numeric id
    start = {i: float(finals[i]["Start"]) for i in finals}
    end = {i: float(finals[i]["End"]) for i in finals}
    run = {i: end[i] - start[i] for i in finals}
    queue = {i: start[i] - float(finals[i]["Submit"]) for i in finals}
    tag_id = {i: finals[i]["AdminComment"].split("id=")[1].split(":")[0] for i in shared_ids}

    # -- the store, as the agent and the daemon would write it -------------------------------
    fp = Fingerprinter(b"known-answer-secret" * 2)
    array_keys = fp.job_keys(user="root", script=ARRAY_SCRIPT, name="ka-array").as_list()
    het_keys = fp.job_keys(user="root", script=HET_SCRIPT, name="ka-het").as_list()
    store_path = tmp_path / "gpushare.db"
    store = Store(store_path)
    for n, seconds in enumerate(ARRAY_SOLO_RUNS_S):
        store.ingest_summary({"v": 1, "job_id": str(900000 + n), "gpu_index": 0,
                              "gpu_model": "A100-80GB", "duration_s": seconds, "shared": False,
                              "coruns": [], "mgmap_max_mib": 5000, "keys": array_keys})
    peak_gib = {i: (9.0 if i == array_ids[7] else 5.0) for i in array_ids}
    peak_gib.update({i: 3.0 for i in het_ids})
    for i in shared_ids:
        keys = array_keys if i in array_ids else het_keys
        store.record_decision({"decision_id": tag_id[i], "action": "share",
                               "code": "history-share", "share_gib": SHARE_GIB, "keys": keys,
                               "job_class": 0 if i in array_ids else 1, "job_id": raw[i],
                               "details": {"source": "history",
                                           "memory_mib": {t: SAFE_MIB for t in TYPES},
                                           "runtime_s": {t: HET_PREDICTED_S for t in TYPES}
                                           if i in het_ids else {}}})
        store.ingest_summary({"v": 1, "job_id": raw[i], "gpu_index": 0,
                              "gpu_model": _gpu_type(finals[i]["NodeList"]).upper(),
                              "duration_s": run[i], "shared": True,
                              "mgmap_max_mib": peak_gib[i] * 1024, "keys": keys})
    # Co-run groups by hand: per GPU, jobs whose [start, end) overlap, chained.
    on_gpu: dict[tuple, list[str]] = defaultdict(list)
    for i in shared_ids:
        (place,) = placements[i]
        on_gpu[place].append(i)
    groups = []
    for place, members in sorted(on_gpu.items()):
        members.sort(key=lambda i: (start[i], end[i], i))
        current, reach = [], None
        for i in members:
            if current and start[i] >= reach:
                groups.append((place, current))
                current = []
            current.append(i)
            reach = end[i] if len(current) == 1 else max(reach, end[i])
        groups.append((place, current))
    for (node, index), members in groups:
        for a_pos, a in enumerate(members):
            for b in members[a_pos + 1:]:
                overlap = min(end[a], end[b]) - max(start[a], start[b])
                if overlap > 0:
                    store.record_corun(raw[a], raw[b], gpu_uuid=f"{node}:{index}",
                                       overlap_s=overlap, gpu_type=_gpu_type(node))
    store.close()
    assert any(len(m) > 1 for _, m in groups), f"no two shares met on a GPU: {placements}"

    # -- the report --------------------------------------------------------------------------
    since = min(float(r["Submit"]) for r in runs) - 1
    until = max(end.values()) + 1
    out = tmp_path / "report.json"
    assert main(["report", "--sacct-file", str(sacct_file), "--store", str(store_path),
                 "--since", str(int(since)), "--until", str(int(until) + 1), "--format", "json",
                 "-o", str(out)]) == 0
    report = json.loads(out.read_text())

    # -- the same figures, by hand -------------------------------------------------------------
    solo = {}
    for i in shared_ids:
        solo[i] = statistics.median(ARRAY_SOLO_RUNS_S) if i in array_ids else HET_PREDICTED_S
    group_of = {i: (place, members) for place, members in groups for i in members}
    used, exclusive, isd, bounds = {}, {}, {}, {}
    for i in finals:
        if i in shared_ids:
            _, members = group_of[i]
            makespan = max(end[m] for m in members) - min(start[m] for m in members)
            used[i] = makespan * solo[i] / sum(solo[m] for m in members)
            exclusive[i] = solo[i]
            if len(members) > 1:
                isd[i] = run[i] / solo[i] - 1
                if i in array_ids:  # history: sacct's whole seconds, +-2 s on each side
                    bounds[i] = ((run[i] - 2) / (solo[i] + 2) - 1, (run[i] + 2) / (solo[i] - 2) - 1)
        else:
            gpu_s = run[i] + sum(float(e["End"]) - float(e["Start"]) for e in earlier[i])
            used[i] = exclusive[i] = gpu_s
    # PS and the ISD totals: against the jobs' own solo runs only (the het job has none).
    shared_groups = [m for _, m in groups if len(m) > 1 and not set(m) & set(het_ids)]
    ps_members = [i for m in shared_groups for i in m]
    ps_used = sum(used[i] for i in ps_members)
    isds = [v for i, v in isd.items() if i in array_ids]
    delays_sh = [queue[i] for i in shared_ids]
    delays_ex = [queue[i] for i in finals if i not in shared_ids]
    requeued_s = sum(float(e["End"]) - float(e["Start"]) for e in earlier[requeued])
    hand = {
        "jobs": len(finals), "gpu_jobs": len(finals), "shared_jobs": len(shared_ids),
        "exclusive_jobs": len(finals) - len(shared_ids), "running_jobs": 0,
        "gpu_hours_used": sum(used.values()) / 3600,
        "gpu_hours_exclusive": sum(exclusive.values()) / 3600,
        "gpu_hours_saved": (sum(exclusive.values()) - sum(used.values())) / 3600,
        "saved_fraction": 1 - sum(used.values()) / sum(exclusive.values()),
        "ps": 1 - ps_used / sum(solo[i] for i in ps_members) if ps_members else None,
        "ps_groups_jobs": len(ps_members),
        "isd_n": len(isds), "isd_mean": _mean(isds), "isd_median": _interp(isds, 0.5),
        "isd_median_low": _interp([b[0] for b in bounds.values()], 0.5),
        "isd_median_high": _interp([b[1] for b in bounds.values()], 0.5),
        "isd_p95": _interp(isds, 0.95), "isd_max": max(isds),
        "isd_noisy": len([b for b in bounds.values() if (b[1] - b[0]) / 2 > 0.05]),
        "isd_small_sample": len(isds) < 10,
        "isd_solo_runs_min": 3 if bounds else None, "isd_thin_history": 0,
        "slowed_jobs": len([v for v in isds if v > 0.2]),
        "extra_run_hours": sum(run[i] - solo[i] for i in isd if i in array_ids) / 3600,
        "isd_against_prediction": len([i for i in isd if i in het_ids]),
        "solo_from_history": len(array_ids),
        "solo_from_predictor": len([i for i in het_ids if i in shared_ids]),
        "solo_unknown": 0,
        "queue_delay_shared_mean_s": _mean(delays_sh),
        "queue_delay_shared_median_s": _interp(delays_sh, 0.5),
        "queue_delay_exclusive_mean_s": _mean(delays_ex),
        "queue_delay_exclusive_median_s": _interp(delays_ex, 0.5),
        "extra_queue_hours": (_mean(delays_sh) - _mean(delays_ex)) * len(delays_sh) / 3600,
        "oom_shared": 0, "oom_exclusive": 0, "failed_shared": 0, "failed_exclusive": 0,
        "cancelled_shared": 0, "cancelled_exclusive": 0,
        "overrun_shared": 1,  # array task 7: a 9 GiB peak on an 8 GiB share
        "requeued_runs_shared": 0, "requeued_runs_exclusive": 1,
        "requeued_gpu_hours": requeued_s / 3600,
    }
    totals = report["totals"]
    assert set(totals) == set(hand)
    for name, value in hand.items():
        expected = value if value is None or isinstance(value, bool) else pytest.approx(
            value, abs=1e-9)
        assert totals[name] == expected, name

    rows = {r["job_id"]: r for r in report["jobs"]}
    assert set(rows) == set(finals)
    for i in finals:
        assert rows[i]["store_id"] == raw[i]
        assert rows[i]["gpu_type"] == _gpu_type(finals[i]["NodeList"])
        assert rows[i]["gpu_s_used"] == pytest.approx(used[i], abs=1e-9)
        assert rows[i]["gpu_s_exclusive"] == pytest.approx(exclusive[i], abs=1e-9)
        if i in shared_ids:  # matched to its own telemetry under its numeric id
            assert rows[i]["peak_gib"] == peak_gib[i]
            assert rows[i]["solo_source"] == ("history" if i in array_ids else "predictor")
            assert rows[i]["isd"] == (pytest.approx(isd[i], abs=1e-12) if i in isd else None)
            assert sorted(rows[i]["co_runners"]) == sorted(
                m for m in group_of[i][1] if m != i)
    assert rows[requeued]["requeued_runs"] == 1

    errors = [(SAFE_MIB / 1024 - peak_gib[i]) / peak_gib[i] for i in shared_ids]
    q = report["prediction"]["history"]
    assert q["n"] == q["estimate_n"] == q["share_n"] == len(shared_ids)
    assert q["estimate_error_mean"] == pytest.approx(_mean(errors), abs=1e-12)
    assert q["estimate_error_p95"] == pytest.approx(_interp([abs(e) for e in errors], 0.95))
    assert q["estimate_below_peak"] == 1 and q["share_below_peak"] == 1
    assert q["share_over_peak_median"] == pytest.approx(
        _interp([SHARE_GIB / peak_gib[i] for i in shared_ids], 0.5))
    assert report["verdict"].startswith(f"Sharing saved {hand['gpu_hours_saved']:.2f} GPU-h")
