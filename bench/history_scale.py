#!/usr/bin/env python3
"""History at site scale: decision latency and ingest rate with 10k, 100k and 1M past jobs.

For each size it generates a synthetic store (users, job names and scripts, with one *hot*
script that has 8.8% of all runs, as an array/sweep resubmitted all year; one decision and one
summary per job, co-runs for one job in ten), written at schema version 1 and then opened with
the code under test (which migrates it: the migration's time is recorded). Then, over several
rounds, in the daemon's own objects (``Service.handle`` for decisions, ``Learner.ingest`` for
telemetry, ``scontrol`` answered by a fake ``cmd.run``):

- cold decisions (estimate cache emptied first) and warm ones (cached), for the hot script
  and for typical scripts (a handful of runs each);
- the ingest rate of new summaries of the hot script, each with a co-run (the heaviest case);
- ``Store.decisions()`` and ``Store.coruns_of()``;
- the store's bytes per job and the query plans of the hot queries.

    .venv/bin/python bench/history_scale.py [--sizes 10000 100000 1000000] [--rounds 3]
        [--label after] [--code DIR] [--cache DIR] [--out bench/results/history_scale.json]

``--code DIR`` runs the benchmark against another checkout of the package (e.g. the commit
before a change, unpacked with ``git archive``); results are merged into ``--out`` under
``--label``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOT_SHARE = 0.088  # the 1M store: 88k runs of the most resubmitted script
RUNS_PER_TYPICAL = 10
V100 = "Tesla V100-SXM2-16GB"


def load_code(code_dir: Path):
    sys.path.insert(0, str(code_dir))
    from slurm_gpushare.core.config import parse_config
    from slurm_gpushare.daemon import store as storemod
    from slurm_gpushare.daemon.service import Service
    from slurm_gpushare.slurm import cmd

    return parse_config, storemod, Service, cmd


def config_for(parse_config, tmp: Path):
    return parse_config({
        "daemon": {"socket": str(tmp / "d.sock"), "secret_file": str(tmp / "secret"),
                   "query_socket": "", "state_dir": str(tmp / "state")},
        "policy": {"sharing_partitions": ["gpu"]},
        "gpu_types": {"v100": {"memory_gib": 16, "model": "V100-16GB"},
                      "a100": {"memory_gib": 80, "model": "A100-80GB"}},
    })


def script_text(n: int) -> str:
    return f"#!/bin/sh\n#SBATCH --gres=gpu:1\npython train_{n}.py --seed {n}\n"


def job_fields(user: str, script: str, name: str) -> dict:
    return {"uid": 1000, "user": user, "partition": "gpu", "tres_per_node": "gres:gpu:1",
            "min_nodes": 1, "shared": 65534, "script": script, "name": name}


def generate(path: Path, jobs: int, storemod, fingerprinter, rng: random.Random) -> dict:
    """Write a schema-1 store with ``jobs`` jobs; returns what the measurements need."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=OFF")
    db.execute("BEGIN")
    storemod.MIGRATIONS[0](db)
    db.execute("PRAGMA user_version=1")
    db.execute("COMMIT")
    users = [f"user{u}" for u in range(max(20, jobs // 2000))]
    hot_runs = int(jobs * HOT_SHARE)
    typical = max(1, (jobs - hot_runs) // RUNS_PER_TYPICAL)
    scripts = {}  # script number -> (user, script, name, keys)

    def keys_of(n: int):
        if n not in scripts:
            user = users[n % len(users)] if n else users[0]
            name = f"job{n % max(1, typical // 3)}"
            script = script_text(n)
            keys = fingerprinter.job_keys(user, script, name).as_list()
            scripts[n] = (user, script, name, keys)
        return scripts[n]

    base = time.time() - jobs * 30.0
    batch_s, batch_k, batch_d, batch_c = [], [], [], []

    def flush():
        db.execute("BEGIN")
        db.executemany("INSERT INTO summaries VALUES (?, ?, ?, ?, ?, ?, ?)", batch_s)
        db.executemany("INSERT OR IGNORE INTO job_keys VALUES (?, ?, ?)", batch_k)
        db.executemany("INSERT INTO decisions VALUES (?, ?, ?, ?, ?, ?, ?)", batch_d)
        db.executemany("INSERT OR IGNORE INTO coruns (cluster, job_a, job_b, gpu_uuid, ts, "
                       "overlap_s, gpu_type, class_a, class_b, isd_a, isd_b, ps) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", batch_c)
        db.execute("COMMIT")
        for batch in (batch_s, batch_k, batch_d, batch_c):
            batch.clear()

    for i in range(jobs):
        job_id = str(i + 1)
        n = 0 if rng.random() < HOT_SHARE else rng.randint(1, typical)
        _user, _script, _name, keys = keys_of(n)
        end = base + i * 30.0
        peak = 4000.0 + (n % 50) * 200 + rng.random() * 100
        coruns = ([{"job_id": str(max(1, i - rng.randint(1, 50))), "overlap_s": 600.0}]
                  if i % 10 == 0 and i else [])
        summary = {"v": 1, "cluster": "", "job_id": job_id, "gpu_index": 0,
                   "gpu_uuid": f"GPU-{i % 4000:08d}", "gpu_model": V100,
                   "mem_total_mib": 16384.0, "duration_s": 3600.0 + rng.random() * 600,
                   "start_ts": end - 3600.0, "end_ts": end, "samples": 360,
                   "mgup_max": 70.0 + rng.random() * 30, "mgup_mean": 50.0,
                   "mgmap_max_mib": peak, "mgmap_max_pct": peak / 163.84,
                   "mgtsamp_max": 30.0, "mgtsamp_mean": 20.0, "shared": bool(coruns),
                   "coruns": coruns, "conditions": [], "keys": keys}
        clean = storemod.clean_summary(summary)
        batch_s.append(("", job_id, 0, end, end, V100, json.dumps(clean, sort_keys=True)))
        batch_k.extend(("", job_id, k) for k in keys)
        decision_id = f"{i:08x}"
        record = storemod.clean_decision({
            "decision_id": decision_id, "ts": end - 3700.0, "action": "share", "code": "history",
            "reason": "history: peak 7.8 GiB on V100-16GB; shares of 9 GiB", "share_gib": 9,
            "gpu_types": ["v100"], "job_class": 1, "keys": keys, "job_id": job_id,
            "details": {"source": "history"}})
        batch_d.append((decision_id, record["ts"], "", job_id, "share", "history",
                        json.dumps(record, sort_keys=True)))
        for corun in coruns:
            a, b = sorted((job_id, corun["job_id"]), key=int)
            batch_c.append(("", a, b, summary["gpu_uuid"], end, 600.0, "v100", 1, 2, 0.1,
                            0.2, 0.3))
        if len(batch_s) >= 20_000:
            flush()
    flush()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return {"scripts": scripts, "typical": typical, "hot_runs": hot_runs, "next_job": jobs + 1,
            "base": base}


class FakeScontrol:
    """``scontrol -o show job N`` answered from a dict of AdminComment tags (no Slurm)."""

    def __init__(self, cmd):
        self.cmd = cmd
        self.tags: dict[str, str] = {}

    def run(self, argv, **_kwargs):
        argv = tuple(argv)
        if argv[:3] == ("scontrol", "-o", "show") and argv[4] in self.tags:
            line = (f"JobId={argv[4]} UserId=user0(1000) JobState=COMPLETED NodeList=n1 "
                    f"AdminComment={self.tags[argv[4]]}")
            return self.cmd.Result(argv, 0, line + "\n", "")
        return self.cmd.Result(argv, 1, "", "no such job")


def timed(fn, *args) -> float:
    """Wall milliseconds of one call; its CPU milliseconds (this thread) go to ``CPU_MS``."""
    started, cpu = time.perf_counter(), time.thread_time()
    fn(*args)
    CPU_MS.append((time.thread_time() - cpu) * 1000)
    return (time.perf_counter() - started) * 1000


# CPU time of the last timed calls: on a busy machine wall time mostly measures the wait for a
# CPU; the thread's CPU time is what the code itself costs.
CPU_MS: list[float] = []


def summary_of(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"p50_ms": round(statistics.median(ordered), 4),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * (len(ordered) - 1) + 0.5))], 4),
            "max_ms": round(ordered[-1], 4), "n": len(ordered)}


def spread(per_round: list[float]) -> dict:
    return {"median": round(statistics.median(per_round), 4), "min": round(min(per_round), 4),
            "max": round(max(per_round), 4), "rounds": [round(v, 4) for v in per_round]}


def bench_size(jobs: int, rounds: int, code, workdir: Path, rng_seed: int,
               cache: Path | None) -> dict:
    parse_config, storemod, Service, cmd = code
    from slurm_gpushare.daemon.fingerprint import Fingerprinter
    from slurm_gpushare.core.tag import Tag

    tmp = Path(tempfile.mkdtemp(prefix=f"hist{jobs}-", dir=workdir))
    try:
        config = config_for(parse_config, tmp)
        path = tmp / "store.sqlite"
        started = time.perf_counter()
        cached = cache / f"history-{jobs}-{rng_seed}" if cache else None
        if cached and (cached / "done").exists():  # the same schema-1 store, made earlier
            shutil.copy(cached / "secret", config.daemon.secret_file)
            shutil.copy(cached / "store.sqlite", path)
            data = json.loads((cached / "data.json").read_text())
            data["scripts"] = {int(n): v for n, v in data["scripts"].items()}
            fingerprinter = Fingerprinter.from_file(config.daemon.secret_file)
        else:
            fingerprinter = Fingerprinter.from_file(config.daemon.secret_file)
            data = generate(path, jobs, storemod, fingerprinter, random.Random(rng_seed))
            if cached:
                cached.mkdir(parents=True, exist_ok=True)
                shutil.copy(config.daemon.secret_file, cached / "secret")
                shutil.copy(path, cached / "store.sqlite")
                (cached / "data.json").write_text(json.dumps(data))
                (cached / "done").write_text("")
        generate_s = time.perf_counter() - started
        started = time.perf_counter()
        store = storemod.Store(path)
        migrate_s = time.perf_counter() - started
        reader = storemod.Store(path)
        store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        bytes_per_job = path.stat().st_size / jobs
        fake = FakeScontrol(cmd)
        cmd.run = fake.run
        service = Service(config, fingerprinter=fingerprinter, store=store, reader=reader)
        estimator, learner = service.estimator, service.learner
        rng = random.Random(rng_seed + 1)

        def decide(n):
            user, script, name, _keys = data["scripts"][n]
            reply = service.handle({"v": 1, "op": "decide", "job": job_fields(user, script, name)})
            assert reply["ok"], reply
            return reply

        hot_reply = decide(0)["decision"]
        figures = {name: [] for name in ("cold_hot", "cold_typical", "warm_hot", "warm_typical",
                                         "cold_hot_cpu", "cold_typical_cpu", "warm_hot_cpu",
                                         "warm_typical_cpu", "ingest_per_s", "decisions_ms",
                                         "coruns_of_ms")}
        samples = {name: [] for name in ("cold_hot", "cold_typical", "warm_hot", "warm_typical")}
        typical_ids = [n for n in data["scripts"] if n]
        next_job = data["next_job"]
        for _round in range(rounds):
            cold_hot, cold_typical, warm_hot, warm_typical = [], [], [], []
            cpu = {name: [] for name in samples}
            for _ in range(10):
                estimator.invalidate()
                cold_hot.append(timed(decide, 0))
                cpu["cold_hot"].append(CPU_MS[-1])
                warm_hot.append(timed(decide, 0))
                cpu["warm_hot"].append(CPU_MS[-1])
            for n in rng.sample(typical_ids, min(50, len(typical_ids))):
                estimator.invalidate()
                cold_typical.append(timed(decide, n))
                cpu["cold_typical"].append(CPU_MS[-1])
                warm_typical.append(timed(decide, n))
                cpu["warm_typical"].append(CPU_MS[-1])
            for _ in range(190):
                warm_hot.append(timed(decide, 0))
                cpu["warm_hot"].append(CPU_MS[-1])
            for name, values in cpu.items():
                figures[name + "_cpu"].append(statistics.median(values))
            service.records.flush(60)
            # Ingest: new runs of the hot script, each sharing its GPU with an earlier job.
            count, started = 0, time.perf_counter()
            while count < 200 and (count < 5 or time.perf_counter() - started < 15):
                job_id = str(next_job)
                next_job += 1
                decision_id = f"n{next_job:08x}"
                store.record_decision({"decision_id": decision_id, "action": "share",
                                       "code": "history", "job_class": 1,
                                       "keys": data["scripts"][0][3]})
                fake.tags[job_id] = Tag(action="share", why="history", decision_id=decision_id,
                                        shard=9, types=("v100",), job_class=1).encode()
                partner = str(next_job - 2)
                fake.tags.setdefault(partner, Tag(action="share", why="history",
                                                  decision_id="x", shard=4, job_class=2).encode())
                learner.ingest({"v": 1, "cluster": "", "job_id": job_id, "gpu_index": 0,
                                "gpu_uuid": "GPU-00000001", "gpu_model": V100,
                                "duration_s": 3700.0, "end_ts": time.time(),
                                "mgmap_max_mib": 8000.0, "mgmap_max_pct": 48.8,
                                "mgup_max": 80.0, "shared": True,
                                "coruns": [{"job_id": partner, "overlap_s": 3600.0}]}, config)
                count += 1
            figures["ingest_per_s"].append(count / (time.perf_counter() - started))
            figures["decisions_ms"].append(statistics.median(
                timed(store.decisions, 100) for _ in range(5)))
            figures["coruns_of_ms"].append(statistics.median(
                timed(store.coruns_of, str(rng.randint(1, jobs))) for _ in range(20)))
            for name, values in (("cold_hot", cold_hot), ("cold_typical", cold_typical),
                                 ("warm_hot", warm_hot), ("warm_typical", warm_typical)):
                figures[name].append(statistics.median(values))
                samples[name] += values
        plans = {}
        for name, (query, args) in getattr(storemod, "HOT_QUERIES", {}).items():
            plans[name] = [r[3] for r in reader._db.execute("EXPLAIN QUERY PLAN " + query, args)]
        hot_history = len(store.history(data["scripts"][0][3][:1], limit=10**9)) \
            if jobs <= 100_000 else None
        service.records.close()
        store.close()
        reader.close()
        return {
            "jobs": jobs, "hot_script_runs": data["hot_runs"], "typical_scripts": data["typical"],
            "generate_s": round(generate_s, 1), "migrate_s": round(migrate_s, 2),
            "bytes_per_job": round(bytes_per_job),
            "hot_decision": hot_reply.get("code"),
            "decision_cold_hot_ms": spread(figures["cold_hot"]),
            "decision_cold_typical_ms": spread(figures["cold_typical"]),
            "decision_warm_hot_ms": spread(figures["warm_hot"]),
            "decision_warm_typical_ms": spread(figures["warm_typical"]),
            "decision_cold_hot_cpu_ms": spread(figures["cold_hot_cpu"]),
            "decision_cold_typical_cpu_ms": spread(figures["cold_typical_cpu"]),
            "decision_warm_hot_cpu_ms": spread(figures["warm_hot_cpu"]),
            "decision_warm_typical_cpu_ms": spread(figures["warm_typical_cpu"]),
            "decision_samples": {name: summary_of(values) for name, values in samples.items()},
            "ingest_per_s": spread(figures["ingest_per_s"]),
            "decisions_query_ms": spread(figures["decisions_ms"]),
            "coruns_of_ms": spread(figures["coruns_of_ms"]),
            "query_plans": plans, "hot_history_rows": hot_history,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--label", default="after")
    parser.add_argument("--code", default=str(REPO), help="checkout whose package is measured")
    parser.add_argument("--workdir", default=tempfile.gettempdir())
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cache", help="keep generated (schema 1) stores here and reuse them, "
                                        "so runs against several checkouts read the same data")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "history_scale.json"))
    args = parser.parse_args(argv)

    code = load_code(Path(args.code).resolve())
    import logging
    logging.getLogger("slurm_gpushare").addHandler(logging.NullHandler())
    logging.getLogger("slurm_gpushare").propagate = False
    commit = subprocess.run(["git", "-C", args.code, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "(not a checkout)"
    load_before = os.getloadavg()
    sizes = {}
    for jobs in args.sizes:
        sizes[str(jobs)] = bench_size(jobs, args.rounds, code, Path(args.workdir), args.seed,
                                      Path(args.cache) if args.cache else None)
        print(json.dumps(sizes[str(jobs)], indent=1), flush=True)
    run = {"command": "python bench/history_scale.py " + " ".join(argv or sys.argv[1:]),
           "code": args.code, "commit": commit, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                       "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
                       "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
           "rounds": args.rounds, "sizes": sizes}
    smallest, largest = sizes[str(min(args.sizes))], sizes[str(max(args.sizes))]
    run["growth_smallest_to_largest"] = {
        name: round(largest[name]["median"] / smallest[name]["median"], 2)
        for name in ("decision_cold_hot_ms", "decision_cold_typical_ms", "decision_warm_hot_ms",
                     "decision_warm_typical_ms", "decision_cold_hot_cpu_ms",
                     "decision_cold_typical_cpu_ms", "decision_warm_hot_cpu_ms",
                     "decision_warm_typical_cpu_ms", "decisions_query_ms", "coruns_of_ms")}
    run["growth_smallest_to_largest"]["ingest_slowdown"] = round(
        smallest["ingest_per_s"]["median"] / largest["ingest_per_s"]["median"], 2)
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {
        "benchmark": "history_scale",
        "targets": {"cold_hot_decision_ms_at_1M": 5.0, "growth_10k_to_1M": 2.0}}
    results.setdefault("runs", {})[args.label] = run
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
