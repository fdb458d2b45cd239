#!/usr/bin/env python3
"""What a restart of the daemon costs: GPU jobs kept whole while the hook's breaker is open.

On the local test cluster, with the production breaker settings (``hook`` section of
``etc/gpushare.toml``: 3 failures, cooldowns of 1 s doubling up to 30 s), a submitter sends one
held GPU job every ``--every-s`` while the daemon is stopped and started again (as
``systemctl restart`` does). Per round it records how long the daemon was away (stop to
answering), how long after it answered again jobs were still kept whole, and how many jobs
were kept whole in all. ``--before-rev REV`` runs the same rounds, interleaved, with the hook
of an older commit (``git show REV:slurm_gpushare/lua/job_submit.lua``) for comparison.

    .venv/bin/python bench/breaker_restart.py [--rounds 3] [--before-rev REV]
        [--out bench/results/breaker_restart.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devcluster.cluster import TestCluster  # noqa: E402
from slurm_gpushare.core.config import load_config  # noqa: E402

HOOK = REPO / "slurm_gpushare" / "lua" / "job_submit.lua"
GIVE_UP_S = 60.0  # after the daemon answers again (the old breaker stayed open for 30 s)


def production_breaker() -> dict:
    """The breaker settings of the shipped configuration (the test cluster's are shorter)."""
    return {k: v for k, v in load_config(REPO / "etc" / "gpushare.toml").hook_settings().items()
            if k.startswith("breaker")}


def use_hook(cluster: TestCluster, script: Path) -> None:
    """Point slurmctld at ``script`` with the production hook settings; it reloads the
    script (and the settings beside it) when the script's mtime changes."""
    settings = load_config(cluster.daemon_config).hook_settings()
    settings.update(production_breaker())
    (cluster.etc / "gpushare_hook.json").write_text(json.dumps(settings, indent=2) + "\n")
    link = cluster.etc / "job_submit.lua"
    link.unlink()
    link.symlink_to(script)
    os.utime(script)
    cluster.wait_hook()


def restart_round(cluster: TestCluster, every_s: float) -> dict:
    submitted: list[tuple[float, str]] = []
    stop = threading.Event()

    def submit_steadily() -> None:
        while not stop.is_set():
            started = time.monotonic()
            job_id = cluster.sbatch("--hold", "--gres=gpu:1", "--comment=gpushare:mem=1G",
                                    script="#!/bin/sh\ntrue\n")
            submitted.append((started, job_id))
            stop.wait(max(0.0, every_s - (time.monotonic() - started)))

    submitter = threading.Thread(target=submit_steadily, daemon=True)
    submitter.start()
    time.sleep(1.0)  # shared before the restart
    stopped_at = time.monotonic()
    cluster.stop_daemon()
    cluster.start_daemon()  # returns once the daemon answers a ping
    answering_at = time.monotonic()
    shared_again_at = None
    while shared_again_at is None and time.monotonic() - answering_at < GIVE_UP_S:
        time.sleep(every_s)
        for started, job_id in list(submitted):
            if started > answering_at and cluster.job(job_id).get("AdminComment", ""):
                shared_again_at = started
                break
    stop.set()
    submitter.join()
    kept = sum(1 for started, job_id in submitted
               if started >= stopped_at and not cluster.job(job_id).get("AdminComment", ""))
    cluster.slurm("scancel", *[job_id for _, job_id in submitted], check=False)
    return {"daemon_away_s": round(answering_at - stopped_at, 2),
            "kept_whole_after_daemon_answered_s": (
                round(shared_again_at - answering_at, 2) if shared_again_at else None),
            "jobs_kept_whole": kept,
            "jobs_submitted_from_stop": sum(1 for s, _ in submitted if s >= stopped_at)}


def summary(values: list) -> dict:
    known = [v for v in values if v is not None]
    return {"mean": round(statistics.mean(known), 2) if known else None,
            "min": min(known) if known else None, "max": max(known) if known else None,
            "missing": len(values) - len(known)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--every-s", type=float, default=0.25,
                        help="one held GPU job submitted this often")
    parser.add_argument("--before-rev", help="also run the hook of this commit, interleaved")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "breaker_restart.json"))
    args = parser.parse_args(argv)

    cluster = TestCluster()
    cluster.start()
    hooks = {"this": HOOK}
    if args.before_rev:
        old = cluster.root / "job_submit_before.lua"
        old.write_text(subprocess.run(
            ["git", "show", f"{args.before_rev}:slurm_gpushare/lua/job_submit.lua"],
            cwd=REPO, capture_output=True, text=True, check=True).stdout)
        hooks = {f"before ({args.before_rev})": old, **hooks}
    load_before = os.getloadavg()
    rounds: dict[str, list[dict]] = {name: [] for name in hooks}
    try:
        for round_no in range(args.rounds):
            for name, script in hooks.items():
                use_hook(cluster, script)
                result = restart_round(cluster, args.every_s)
                rounds[name].append(result)
                print(f"round {round_no + 1}/{args.rounds} {name}: {result}", flush=True)
    finally:
        use_hook(cluster, HOOK)
        cluster.write_config()  # the test cluster's own hook settings again
    record = {
        "benchmark": "breaker_restart",
        "command": "python bench/breaker_restart.py " + " ".join(argv or sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "every_s": args.every_s,
        "hook_settings": production_breaker(),
        "rounds": rounds,
        "summary": {name: {key: summary([r[key] for r in results])
                           for key in ("daemon_away_s", "kept_whole_after_daemon_answered_s",
                                       "jobs_kept_whole")}
                    for name, results in rounds.items()},
    }
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record["summary"], indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
