#!/usr/bin/env python3
"""Reports at site scale: ``slurm-gpushare report`` on 10k, 100k and 1M sacct job rows.

It writes synthetic but realistic ``sacct -a -D -P -o <SACCT_FIELDS>`` output (epoch times, as
``SLURM_TIME_FORMAT=%s`` gives): a month of a site with 300 users in 40 accounts, three GPU
types; jobs the hook made shares (tagged ``share``, with ``gres/shard``), jobs it kept on whole
GPUs (tagged ``keep``), untagged whole-GPU and multi-GPU jobs, jobs that asked for shards
themselves, CPU-only jobs; array tasks (``68_3`` with their own ``JobIDRaw``) and pending array
remainders (``68_[4-9]``), het components (``70+1``), requeued jobs (``-D``: two runs under one
JobID), failed, cancelled, timed-out, OOM-killed and still-running jobs; a ``batch`` step line
for every job that started and a ``0`` step for most; half the jobs in Slurm 22.05's TRES
spelling (``gres/gpu:a100=1,gres/gpu=1``), half in 24.11's (``gres/gpu=1,gres/gpu:a100=1,
gres/gpumem=...,gres/gpuutil=...``). A size counts job rows (jobs, array tasks, het components
and each run of a requeued job); the file holds about 2.7 lines per job row.

Each round runs the report as a subprocess (``--format json -o FILE``, the format with every
job row in it, and ``--format table``) and takes its wall time and peak RSS from
``resource.getrusage(RUSAGE_CHILDREN)`` measured in a fresh wrapper process per round, so no
earlier round's peak hides a later one's. ``--code DIR`` runs another checkout of the package
(the code before a change, unpacked with ``git archive``); results are merged into ``--out``
under ``--label``.

    .venv/bin/python bench/report_scale.py [--sizes 10000 100000 1000000] [--rounds 3 3 2]
        [--formats json table] [--label after] [--code DIR] [--cache DIR]
        [--out bench/results/report_scale.json]

``--check`` also compares the JSON report of every size with the other labels' report of the
same input (the figures, less the generation time), and records whether they are identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WINDOW_END = 1_795_000_000  # a fixed "now": every run writes the same file for a size and seed
WINDOW_S = 30 * 86400
FIELDS = ("JobID|JobIDRaw|Cluster|User|Account|Partition|State|ExitCode|DerivedExitCode|Submit|"
          "Eligible|Start|End|ElapsedRaw|NNodes|NodeList|ReqTRES|AllocTRES|AdminComment")
GPU_TYPES = (("a100", 40), ("v100", 16), ("t4", 16))  # type, GiB (shards per GPU)
NODES_PER_TYPE = 120


def _tres(version: str, cpus: int, mem_mib: int, gres: list[tuple[str, int]], gpu_type: str,
          alloc: bool) -> str:
    """A TRES string as 22.05 or 24.11 prints it; ``gres``: [(name, count)] (gpu, shard)."""
    parts = [f"billing={cpus}", f"cpu={cpus}"]
    for name, count in gres:
        if version == "22.05":
            typed = [f"gres/{name}:{gpu_type}={count}"] if gpu_type and alloc else []
            parts += typed + [f"gres/{name}={count}"]
        else:
            parts += [f"gres/{name}={count}"] + (
                [f"gres/{name}:{gpu_type}={count}"] if gpu_type and alloc else [])
            if name == "gpu" and alloc:
                parts += [f"gres/gpumem={count * 40}G", f"gres/gpuutil={count * 100}"]
    mem = f"mem={mem_mib}M" if version == "22.05" or mem_mib % 1024 else f"mem={mem_mib // 1024}G"
    if alloc or version == "22.05":
        parts.append(mem)
    parts.append("node=1")
    return ",".join(parts)


def generate(path: Path, jobs: int, seed: int = 1) -> dict:
    """Write ``jobs`` job rows (plus their step lines) to ``path``; returns what it holds."""
    rng = random.Random(seed)
    users = [f"u{i:03d}" for i in range(300)]
    account_of = {u: f"acct{rng.randrange(40):02d}" for u in users}
    counts = {"lines": 1, "job_rows": 0, "shared": 0, "array_tasks": 0, "het": 0,
              "requeued": 0, "running": 0}
    next_id = 1_000_000
    with open(path, "w") as out:
        out.write(FIELDS + "\n")

        def job(job_id: str, raw_id: int, user: str, version: str, rerun: bool = False,
                start_after: int | None = None) -> int:
            """One job row and its steps; returns its end time."""
            kind = rng.random()
            gpu_type, gib = GPU_TYPES[rng.randrange(len(GPU_TYPES))]
            node = f"{gpu_type}-{rng.randrange(NODES_PER_TYPE) + 1}"
            cpus = rng.choice((1, 2, 4, 8, 16))
            mem = rng.choice((4000, 8000, 16000, 32768))
            tag, gres, req = "", [], []
            dec = f"{rng.getrandbits(32):08x}"
            if kind < 0.40:  # the hook made it a share
                shards = max(1, min(gib, int(rng.lognormvariate(2.0, 0.6))))
                gres, req = [("shard", shards)], [("shard", shards)]
                types = "+".join(sorted({gpu_type, rng.choice(GPU_TYPES)[0]}))
                tag = f"gpushare:v1:share:id={dec}:shard={shards}:types={types}:why=default-share"
                counts["shared"] += 1
            elif kind < 0.60:  # the hook kept it on a whole GPU
                gres = req = [("gpu", 1)]
                tag = f"gpushare:v1:keep:id={dec}:why={rng.choice(('first-run', 'too-big'))}"
            elif kind < 0.75:  # whole GPU(s), no tag (before the hook, or a multi-GPU job)
                n = rng.choice((1, 1, 2, 4, 8))
                gres = req = [("gpu", n)]
            elif kind < 0.85:  # asked for shards itself
                shards = rng.choice((2, 4, 8))
                gres = req = [("shard", shards)]
            elif kind < 0.95:  # CPU only
                pass
            else:  # a whole GPU with an admin's free-text comment (not ours: dropped)
                gres = req = [("gpu", 1)]
                tag = rng.choice(("maintenance test", "moved|by admin"))
            state = rng.choices(
                ("COMPLETED", "FAILED", "CANCELLED by 1234", "TIMEOUT", "OUT_OF_MEMORY",
                 "RUNNING", "NODE_FAIL"),
                (84, 5, 4, 2, 1, 3, 1))[0]
            if rerun:
                state = "REQUEUED"
            run = int(rng.lognormvariate(7.5, 1.3)) + 1
            if start_after is None:
                start = int(WINDOW_END - rng.random() * WINDOW_S - run)
            else:  # the final run of a requeued job starts after the earlier one ended
                start = start_after + rng.randrange(5, 600)
            submit = start - int(rng.expovariate(1 / 900))
            end = start + run
            exit_code = "0:0"
            if state == "FAILED":
                exit_code = rng.choice(("1:0", "0:9", "137:0"))
            elif state == "OUT_OF_MEMORY":
                exit_code = "0:125"
            elif state.startswith("CANCELLED"):
                exit_code = "0:15"
            if state == "RUNNING":
                end_s, elapsed = "Unknown", str(int(WINDOW_END - start))
                counts["running"] += 1
            else:
                end_s, elapsed = str(end), str(run)
            alloc_gres = gres
            req_t = _tres(version, cpus, mem, req, gpu_type, alloc=False)
            alloc_t = _tres(version, cpus, mem, alloc_gres, gpu_type, alloc=True)
            out.write(f"{job_id}|{raw_id}|site|{user}|{account_of[user]}|"
                      f"{'gpu' if gres else 'cpu'}|{state}|{exit_code}|0:0|{submit}|{submit}|"
                      f"{start}|{end_s}|{elapsed}|1|{node}|{req_t}|{alloc_t}|{tag}\n")
            counts["lines"] += 1
            counts["job_rows"] += 1
            step_alloc = _tres(version, cpus, 0, alloc_gres, "", alloc=True)
            steps = ["batch"] + (["0"] if rng.random() < 0.7 else [])
            for step in steps:
                step_state = state.split(" ")[0] if state != "REQUEUED" else "CANCELLED"
                out.write(f"{job_id}.{step}|{raw_id}.{step}|site||{account_of[user]}||"
                          f"{step_state}|{exit_code}||{start}|{start}|{start}|{end_s}|"
                          f"{elapsed}|1|{node}||{step_alloc}|\n")
                counts["lines"] += 1
            return end

        while counts["job_rows"] < jobs:
            user = users[min(int(rng.paretovariate(1.2)) - 1, len(users) - 1)]
            version = "22.05" if rng.random() < 0.5 else "24.11"
            shape = rng.random()
            if shape < 0.03:  # an array: tasks with their own raw ids, and a pending rest
                array_id, tasks = next_id, rng.randrange(2, 20)
                for task in range(tasks):
                    job(f"{array_id}_{task}", next_id + task, user, version)
                    counts["array_tasks"] += 1
                next_id += tasks
                if rng.random() < 0.3:
                    out.write(f"{array_id}_[{tasks}-{tasks + 9}]|{array_id}|site|{user}|"
                              f"{account_of[user]}|gpu|PENDING|0:0|0:0|{WINDOW_END - 60}|"
                              f"{WINDOW_END - 60}|Unknown|Unknown|0|1|None assigned|"
                              f"billing=1,cpu=1,gres/gpu=1,mem=8000M,node=1||\n")
                    counts["lines"] += 1
            elif shape < 0.05:  # a het job: two components
                for offset in range(2):
                    job(f"{next_id}+{offset}", next_id + offset, user, version)
                    counts["het"] += 1
                next_id += 2
            elif shape < 0.08:  # requeued: an earlier run, then the final one, same JobID
                ended = job(str(next_id), next_id, user, version, rerun=True)
                job(str(next_id), next_id, user, version, start_after=ended)
                counts["requeued"] += 1
                next_id += 1
            else:
                job(str(next_id), next_id, user, version)
                next_id += 1
    return counts


def _measure(argv: list[str], env: dict, cwd: Path) -> dict:
    """Run ``argv`` from a fresh wrapper so ``RUSAGE_CHILDREN`` holds only its peak."""
    wrapper = ("import json, resource, subprocess, sys, time\n"
               "argv = json.loads(sys.argv[1])\n"
               "t = time.perf_counter()\n"
               "p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
               "wall = time.perf_counter() - t\n"
               "ru = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
               "print(json.dumps({'rc': p.returncode, 'wall_s': wall,\n"
               "                  'cpu_s': ru.ru_utime + ru.ru_stime,\n"
               "                  'peak_rss_mib': ru.ru_maxrss / 1024,\n"
               "                  'stderr': p.stderr.decode()[-400:]}))\n")
    done = subprocess.run([sys.executable, "-c", wrapper, json.dumps(argv)], env=env, cwd=cwd,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def _figures_digest(path: Path) -> str:
    """The report's figures: everything but when it was generated."""
    report = json.loads(path.read_text())
    report.pop("generated", None)
    return hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest()


def _load_avg() -> float:
    return os.getloadavg()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--rounds", type=int, nargs="+", default=[3, 3, 2],
                        help="rounds per size (the last figure repeats for further sizes)")
    parser.add_argument("--formats", nargs="+", default=["json", "table"],
                        choices=["json", "table", "csv", "html"])
    parser.add_argument("--label", default="after")
    parser.add_argument("--code", type=Path, default=REPO,
                        help="the checkout whose slurm_gpushare package runs (default: this)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) /
                        "report_scale", help="where the generated sacct files are kept")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/report_scale.json")
    parser.add_argument("--check", action="store_true",
                        help="record each size's figures digest (to compare labels)")
    args = parser.parse_args()

    args.cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(args.code.resolve()), "COLUMNS": "160"}
    env.pop("SLURM_CONF", None)  # scontrol fails at once here (no Slurm): no GPU types
    env["GPUSHARE_CONFIG"] = "/nonexistent/gpushare.toml"  # no store: accounting alone
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    label = results.setdefault("runs", {}).setdefault(args.label, {})
    label["code"] = str(args.code)
    label["git"] = subprocess.run(["git", "-C", str(args.code), "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True).stdout.strip() or None
    for i, size in enumerate(args.sizes):
        rounds = args.rounds[min(i, len(args.rounds) - 1)]
        path = args.cache / f"sacct_{size}.psv"
        meta_path = path.with_suffix(".json")
        if not path.exists() or not meta_path.exists():
            t = time.perf_counter()
            meta = generate(path, size)
            meta["generate_s"] = round(time.perf_counter() - t, 1)
            meta["bytes"] = path.stat().st_size
            meta_path.write_text(json.dumps(meta))
        meta = json.loads(meta_path.read_text())
        entry = {"input": meta, "formats": {}}
        for fmt in args.formats:
            report_path = args.cache / f"report_{args.label}_{size}.{fmt}"
            argv = [sys.executable, "-m", "slurm_gpushare", "report", "--sacct-file", str(path),
                    "--since", str(WINDOW_END - WINDOW_S - 86400), "--until", str(WINDOW_END),
                    "--format", fmt, "-o", str(report_path)]
            samples = []
            for r in range(rounds):
                load = _load_avg()
                # Run from the cache directory: python -m puts the working directory first on
                # sys.path, so only PYTHONPATH says whose package runs.
                sample = _measure(argv, env, args.cache)
                sample["load_before"] = round(load, 2)
                if sample["rc"] != 0:
                    print(f"size {size} {fmt}: exit {sample['rc']}: {sample['stderr']}",
                          file=sys.stderr)
                    return 1
                sample.pop("stderr")
                samples.append(sample)
                print(f"{args.label} {size} {fmt} round {r + 1}: {sample['wall_s']:.1f} s, "
                      f"{sample['peak_rss_mib']:.0f} MiB (load {load:.1f})", flush=True)
            walls = [s["wall_s"] for s in samples]
            rss = [s["peak_rss_mib"] for s in samples]
            entry["formats"][fmt] = {
                "rounds": samples,
                "wall_s_median": statistics.median(walls), "wall_s_min": min(walls),
                "wall_s_max": max(walls),
                "peak_rss_mib_median": statistics.median(rss), "peak_rss_mib_max": max(rss),
                "us_per_job_row": statistics.median(walls) / meta["job_rows"] * 1e6,
            }
            if fmt == "json" and args.check:
                entry["formats"][fmt]["figures_sha256"] = _figures_digest(report_path)
            label[str(size)] = entry  # written after each format: a long run keeps its rounds
            args.out.parent.mkdir(parents=True, exist_ok=True)
            results["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count(),
                                  "platform": platform.platform()}
            results["command"] = ("bench/report_scale.py " + " ".join(sys.argv[1:])).strip()
            args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
