#!/usr/bin/env python3
"""Sharing off vs on, on the real local cluster: the same workload, measured from sacct.

One workload (fixed seed): six job profiles on the fake GPU board (light, medium, busy,
large-memory, A100-only, short-and-busy), submitted as plain jobs and job arrays, arriving
over about two and a half minutes -- 42 GPU jobs per run. Each repetition starts the daemon on
an empty store and runs every profile once first (a profiled first run on a whole GPU), so the
daemon has each job's own history and nothing from earlier repetitions or invocations (until
this was so, repetitions and runs on the same cluster decided with the co-runs and pair
corrections of all earlier ones: figures recorded before commit "A/B from an empty store"
depend on what that cluster had run).

The two arms differ only in where the jobs are submitted, the admin's switch for sharing:
"off" submits to partition ``gpu-excl`` (not in ``policy.sharing_partitions``: the hook keeps
every job whole), "on" to ``gpu`` (a sharing partition). Both partitions span the same nodes;
the daemon runs the product's default policy (share only under pressure, no SJF lever).
Repetitions are interleaved (off/on, on/off, off/on, ...) so drift on the machine hits both.

Figures per run come from sacct parsed by ``slurm/accounting.py`` and the report of
``reports/savings.py`` (co-runs and solo times from the daemon's store), never re-derived:
makespan (first submit to last end), mean job completion time (end - submit), mean queueing
time (start - submit), GPU-hours used (the report's: a co-run counted once), the slowdown of
shared jobs against their own solo runs (ISD), OOMs and failures.

What the fake board models (devcluster/fakegpu.py): co-runners share SM time only -- while the
registered utilisations on a GPU sum past 100 %, each runs at 100/sum of its speed; below, not
at all. Memory bandwidth, caches and context switches cost nothing there, so the A/B shows
what packing does to queueing and makespan when the slowdown follows that rule; it does not
show real GPUs' interference (often worse: Gavel's median pair speed is 0.57x).

    GPUSHARE_CLUSTER_DIR=... GPUSHARE_CLUSTER_PORT_BASE=... \\
        .venv/bin/python bench/ab_cluster.py [--reps 3] [--out bench/results/ab_cluster.json]

``--type-speeds`` gives each job's work per GPU type (``devcluster.fakegpu.TYPE_SPEED``: less
time on an A100, more on a T4 than on a V100, as on real GPUs); without it every type runs a
job as fast, as in the records before it.

``--arrivals 0.5`` submits the same jobs twice as close together: the cluster is then
oversubscribed and jobs queue, the case sharing is for (at 1 the workload roughly fills the
GPUs, so a share mostly trades a short wait for a slower run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devcluster.cluster import TestCluster  # noqa: E402
from devcluster.fakegpu import TYPE_SPEED, work_per_type  # noqa: E402
from slurm_gpushare.reports.savings import build_report  # noqa: E402
from slurm_gpushare.slurm.accounting import (SACCT_FIELDS, node_gpu_types_from_scontrol,  # noqa: E402
                                             parse_psv, resolve_gpu_types)

ARMS = {"off": "gpu-excl", "on": "gpu"}  # arm -> partition (sharing off there / on there)


@dataclass(frozen=True)
class Profile:
    work_s: float  # seconds of work at solo speed
    util: float  # SM utilisation %
    mem_util: float  # memory-controller utilisation %
    mem_mib: dict  # peak memory per GPU type
    gres: str = "gpu:1"


PROFILES = {
    "light": Profile(30, 25, 10, {"v100": 2500, "a100": 2900, "t4": 2500}),
    "medium": Profile(36, 45, 25, {"v100": 6000, "a100": 6600, "t4": 6000}),
    "busy": Profile(36, 80, 45, {"v100": 4000, "a100": 4500, "t4": 4000}),
    "large": Profile(40, 40, 30, {"v100": 12000, "a100": 13500, "t4": 12000}),
    # Needs more than a 16 GiB GPU: its users ask for an A100 by type.
    "a100-only": Profile(30, 55, 35, {"v100": 30000, "a100": 30000, "t4": 30000},
                         gres="gpu:a100:1"),
    "short-busy": Profile(24, 65, 20, {"v100": 1500, "a100": 1800, "t4": 1500}),
}
# (arrival offset s, profile, submissions, array size or 0 for plain jobs)
WORKLOAD = (
    (0, "medium", 3, 0), (0, "large", 2, 0),
    (15, "light", 1, 8),
    (35, "busy", 3, 0), (35, "a100-only", 2, 0),
    (60, "short-busy", 1, 6),
    (85, "medium", 3, 0), (85, "large", 2, 0),
    (110, "busy", 1, 4),
    (135, "light", 4, 0), (135, "a100-only", 1, 0),
    (150, "medium", 1, 4),
)
N_JOBS = sum(n * (size or 1) for _, _, n, size in WORKLOAD)
AB_POLICY = {  # the product's defaults where the test cluster's config departs from them
    "keep_whole_when_idle": "true",
    "priority": '"none"',
}


def script(cluster: TestCluster, name: str, scale: float, type_speeds: bool = False) -> str:
    p = PROFILES[name]
    work = work_per_type(p.work_s * scale) if type_speeds else p.work_s * scale
    shebang, rest = cluster.training_script(work_s=work, util=p.util,
                                            mem_util=p.mem_util, mem_mib=p.mem_mib).split("\n", 1)
    return f"{shebang}\nPROFILE={name}\n{rest}"  # the line makes each profile its own script


def fresh_store(cluster: TestCluster) -> None:
    """Restart the daemon on an empty store (its history, co-runs and knowledge base)."""
    cluster.stop_daemon()
    for path in (cluster.root / "predictor").glob("store.sqlite*"):
        path.unlink()
    cluster.start_daemon()
    cluster.wait_hook()


def set_policy(cluster: TestCluster, text: str) -> None:
    cluster.daemon_config.write_text(text)
    cluster.restart_daemon()


def ab_config(original: str, policy: dict[str, str]) -> str:
    text = original
    for key, value in policy.items():
        text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
        if not n:
            text = text.replace("[policy]\n", f"[policy]\n{key} = {value}\n", 1)
    return text


def daemon_events(cluster: TestCluster):
    """The daemon's log events (one JSON object per line; a line cut short is skipped)."""
    path = cluster.log / "gpushare.log"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            yield json.loads(line)
        except ValueError:
            continue


def ingested(cluster: TestCluster) -> set[str]:
    """Job ids whose telemetry the daemon has taken in (its log's ``ingested`` events)."""
    return {str(e.get("job_id")) for e in daemon_events(cluster) if e.get("event") == "ingested"}


def wait_done(cluster: TestCluster, ids: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    wanted = set(ids)
    while time.monotonic() < deadline:
        queued = set(cluster.slurm("squeue", "-h", "-o", "%F", check=False).stdout.split())
        if not wanted & queued:
            return
        time.sleep(1)
    raise RuntimeError(f"jobs still queued after {timeout:.0f} s: {sorted(wanted & queued)}")


def sacct_records(cluster: TestCluster, ids: list[str], timeout: float = 120):
    """The jobs' records once slurmdbd has a finished row for every one of them."""
    deadline = time.monotonic() + timeout
    while True:
        psv = cluster.slurm("sacct", "-a", "-D", "-P", "-j", ",".join(ids), "-o",
                            ",".join(SACCT_FIELDS), env={"SLURM_TIME_FORMAT": "%s"}).stdout
        records = parse_psv(psv, progress=False)
        if len(records) >= N_JOBS and all(r.finished for r in records):
            return records
        if time.monotonic() > deadline:
            raise RuntimeError(f"sacct has {len(records)} of {N_JOBS} finished records")
        time.sleep(2)


def wait_ingested(cluster: TestCluster, records, timeout: float = 120) -> int:
    """Wait for every job's telemetry in the store (co-runs and solo history come from there);
    returns how many are still missing at the timeout."""
    deadline = time.monotonic() + timeout
    wanted = {r.raw_id or r.job_id for r in records}
    while time.monotonic() < deadline:
        missing = wanted - ingested(cluster)
        if not missing:
            return 0
        time.sleep(1)
    return len(missing)


def profile_first(cluster: TestCluster, scale: float, type_speeds: bool = False) -> list[str]:
    """Each profile's first run: kept on a whole GPU by the hook and profiled."""
    ids = [cluster.sbatch(f"--gres={p.gres}", "-p", ARMS["on"], f"--job-name=ab-{name}",
                          script=script(cluster, name, scale, type_speeds))
           for name, p in PROFILES.items()]
    wait_done(cluster, ids, 600)
    records = sacct_records_any(cluster, ids)
    wait_ingested(cluster, records)
    return ids


def sacct_records_any(cluster: TestCluster, ids: list[str]):
    psv = cluster.slurm("sacct", "-a", "-D", "-P", "-j", ",".join(ids), "-o",
                        ",".join(SACCT_FIELDS), env={"SLURM_TIME_FORMAT": "%s"}).stdout
    return parse_psv(psv, progress=False)


def run_arm(cluster: TestCluster, arm: str, scale: float, gpu_types: dict,
            arrivals: float = 1.0, type_speeds: bool = False) -> dict:
    partition = ARMS[arm]
    ids: list[str] = []
    profile_of: dict[str, str] = {}  # job id (an array's base id) -> profile name
    started = time.monotonic()
    for offset, name, count, size in WORKLOAD:
        while time.monotonic() - started < offset * scale * arrivals:
            time.sleep(0.2)
        p = PROFILES[name]
        for _ in range(count):
            args = [f"--gres={p.gres}", "-p", partition, f"--job-name=ab-{name}"]
            if size:
                args.append(f"--array=0-{size - 1}")
            ids.append(cluster.sbatch(*args, script=script(cluster, name, scale, type_speeds)))
            profile_of[ids[-1]] = name
    wait_done(cluster, ids, 900)
    records = sacct_records(cluster, ids)
    missing = wait_ingested(cluster, records)
    resolve_gpu_types(records, gpu_types)
    from slurm_gpushare.daemon.store import Store
    since = min(r.submit for r in records) - 1
    until = max(r.end for r in records) + 1
    store = Store(cluster.root / "predictor" / "store.sqlite")
    try:
        report = build_report(records, since=since, until=until, by="gpu-type", store=store,
                              source=f"A/B {arm}")
    finally:
        store.close()
    totals = report["totals"]
    jct = [r.end - r.submit for r in records]
    queue = [r.queue_delay_s for r in records if r.queue_delay_s is not None]
    return {
        "arm": arm, "partition": partition, "jobs": len(records),
        "makespan_s": max(r.end for r in records) - min(r.submit for r in records),
        "mean_jct_s": statistics.fmean(jct),
        "p95_jct_s": sorted(jct)[int(0.95 * (len(jct) - 1))],
        "mean_queue_s": statistics.fmean(queue),
        "gpu_hours_used": totals["gpu_hours_used"],
        "shared_jobs": totals["shared_jobs"],
        "isd_n": totals["isd_n"], "isd_mean": totals["isd_mean"],
        "isd_median": totals["isd_median"], "isd_max": totals["isd_max"],
        "ps": totals["ps"],
        "oom": totals["oom_shared"] + totals["oom_exclusive"],
        "failed": totals["failed_shared"] + totals["failed_exclusive"],
        "telemetry_missing": missing,
        "decisions": _codes(records),
        **_waiting(cluster, since, until),
        "per_job": _per_job(records, profile_of),
    }


def _per_job(records, profile_of: dict[str, str]) -> list[dict]:
    """Each job's profile, decision and times (seconds from the first submission): where
    the makespan and the tail come from."""
    t0 = min(r.submit for r in records)
    return [{"job": r.job_id, "profile": profile_of.get(r.job_id.split("_")[0], "?"),
             "code": r.decision_code or "untouched", "shared": r.shared,
             "gpu_type": r.gpu_type, "shards": r.shards, "nodes": r.nodes,
             "submit_s": round(r.submit - t0, 1), "start_s": round(r.start - t0, 1),
             "end_s": round(r.end - t0, 1)}
            for r in sorted(records, key=lambda r: r.end)]


def _waiting(cluster: TestCluster, since: float, until: float) -> dict[str, int]:
    """From the daemon's log, within the arm: decisions that kept their share off nodes, and
    what was changed for waiting shares as the cluster moved on (daemon/waiting.py)."""
    excluded = added = lifted = widened = 0
    for entry in daemon_events(cluster):
        if not since <= entry.get("ts", 0) <= until:
            continue
        if entry.get("event") == "decision" and entry.get("writes", {}).get("exc_nodes"):
            excluded += 1
        elif entry.get("event") == "waiting-share-updated":
            added += len(entry.get("excluded", ()))
            lifted += len(entry.get("lifted", ()))
            widened += bool(entry.get("added_types"))
    return {"decisions_with_exclusions": excluded, "exclusions_added": added,
            "exclusions_lifted": lifted, "shares_widened": widened}


def _codes(records) -> dict[str, int]:
    codes: dict[str, int] = {}
    for r in records:
        code = r.decision_code or "untouched"
        codes[code] = codes.get(code, 0) + 1
    return codes


METRICS = ("makespan_s", "mean_jct_s", "p95_jct_s", "mean_queue_s", "gpu_hours_used",
           "shared_jobs", "isd_mean", "isd_median", "isd_max", "ps", "oom", "failed",
           "decisions_with_exclusions", "exclusions_added", "exclusions_lifted", "shares_widened")


def summary(runs: list[dict]) -> dict:
    out = {}
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        out[arm] = {}
        for m in METRICS:
            values = [r[m] for r in mine if r.get(m) is not None]
            out[arm][m] = ({"mean": statistics.fmean(values), "min": min(values),
                            "max": max(values), "n": len(values)} if values else None)
    out["on_vs_off"] = {m: out["on"][m]["mean"] / out["off"][m]["mean"] - 1
                        for m in ("makespan_s", "mean_jct_s", "mean_queue_s", "gpu_hours_used")
                        if out["on"][m] and out["off"][m] and out["off"][m]["mean"]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply work and arrival times (smoke runs: 0.3)")
    parser.add_argument("--arrivals", type=float, default=1.0,
                        help="multiply the arrival times only: below 1 the same jobs arrive "
                             "closer together and queue (0.5: twice the load)")
    parser.add_argument("--type-speeds", action="store_true",
                        help="a job's work takes less time on an A100 and more on a T4 than on "
                             "a V100 (devcluster.fakegpu.TYPE_SPEED; its work_s is the V100's); "
                             "without it every type runs it as fast, as in the earlier records")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "ab_cluster.json"))
    parser.add_argument("--policy", action="append", default=[], metavar="KEY=VALUE",
                        help="a [policy] setting for both arms, over the defaults above "
                             "(TOML value, e.g. gpu_time_budget_pct=100); repeatable")
    args = parser.parse_args(argv)
    policy = dict(AB_POLICY)
    for item in args.policy:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[a-z_]+", key):
            parser.error(f"--policy {item!r}: use KEY=VALUE")
        policy[key] = value

    # The code the daemon runs is the tree at its start (set_policy restarts it): recorded then.
    git = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=REPO,
                         capture_output=True, text=True).stdout.strip()
    cluster = TestCluster()
    cluster.start()
    original = cluster.daemon_config.read_text()
    runs = []
    try:
        set_policy(cluster, ab_config(original, policy))
        gpu_types = node_gpu_types_from_scontrol(
            cluster.slurm("scontrol", "-o", "show", "nodes").stdout)
        for rep in range(args.reps):
            # Each repetition from an empty store: the same scripts' runs from earlier
            # repetitions (or earlier invocations on this cluster) would otherwise be history,
            # co-runs and pair corrections the next one decides with.
            fresh_store(cluster)
            t0 = time.monotonic()
            profiled = profile_first(cluster, args.scale, args.type_speeds)
            print(f"rep {rep}: empty store, profiled first runs {profiled} in "
                  f"{time.monotonic() - t0:.0f} s", flush=True)
            order = ("off", "on") if rep % 2 == 0 else ("on", "off")
            for arm in order:
                t0 = time.monotonic()
                run = run_arm(cluster, arm, args.scale, gpu_types, args.arrivals,
                              args.type_speeds)
                run["rep"] = rep
                runs.append(run)
                print(f"rep {rep} {arm}: makespan {run['makespan_s']:.0f} s, mean JCT "
                      f"{run['mean_jct_s']:.1f} s, queue {run['mean_queue_s']:.1f} s, "
                      f"{run['gpu_hours_used']:.3f} GPU-h, shared {run['shared_jobs']}, "
                      f"ISD mean {run['isd_mean']}, OOM {run['oom']}, failed {run['failed']} "
                      f"({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        set_policy(cluster, original)
    result = {
        "benchmark": "ab_cluster", "commit": git, "slurm": cluster.slurm_version,
        "command": "GPUSHARE_CLUSTER_DIR=... GPUSHARE_CLUSTER_PORT_BASE=... .venv/bin/python "
                   f"bench/ab_cluster.py --reps {args.reps} --scale {args.scale:g}"
                   + (f" --arrivals {args.arrivals:g}" if args.arrivals != 1 else "")
                   + (" --type-speeds" if args.type_speeds else "")
                   + "".join(f" --policy {item}" for item in args.policy),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "loadavg_end": os.getloadavg()},
        "workload": {"jobs_per_run": N_JOBS, "scale": args.scale, "arrivals": args.arrivals,
                     "type_speeds": TYPE_SPEED if args.type_speeds else None,
                     "profiles": {k: {**vars(v)} for k, v in PROFILES.items()},
                     # (arrival offset s, profile, submissions, array size or 0)
                     "schedule": [list(w) for w in WORKLOAD]},
        "arms": ARMS, "policy": policy,
        "gpus": "4 x v100 16 GiB, 4 x a100 80 GiB (gres/shard), 2 x t4 16 GiB (gres/mps)",
        "runs": runs, "summary": summary(runs),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
