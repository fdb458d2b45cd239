"""Benchmark: the Philly trace (82,247 jobs) under each policy over several seeds; records JSON.

    .venv/bin/python bench/sim_philly.py [--seeds 0-4] [--policies a,b,...|all] [--limit N]
                                         [--jobs N] [--draws N] [--policy KEY=VALUE ...]
                                         [--out bench/sim_philly.json]
    .venv/bin/python bench/sim_philly.py --merge seed0.json seed1.json ... --out all.json

Cluster: ``slurm_gpushare/data/clusters/philly.toml`` (heterogeneous V100/P100/K80); co-run
speeds: Gavel's measured pairs. A seed draws what the trace lacks (job kind, memory, run-time
estimate errors); every policy of a seed replays the same jobs with the same estimates. Writes
per seed each policy's figures, the figures relative to slurm-default and the wall time per
policy; then per policy the mean, min and max over seeds, and the goals the project is judged
by (``checks``):

- gpushare at its default settings with the SJF lever on (``gpushare-sjf``) against
  ``sjf-bsbf`` on mean and p95 JCT: on average and seed by seed;
- with the lever off (``gpushare``): mean JCT against slurm-default, average over seeds;
- each seed's results digest (figures less wall time, counters, decision codes): a speed
  change must leave it unchanged;
- OOM kills of every policy; wall time of every policy (goal <= 30 s on a 2-core machine),
  and CPU time (what the wall time would be on an otherwise idle core).

A congested queue is chaotic: a replicate of a seed whose true run times move by ~0.1%
(``--draws N``: the seed and N-1 replicates) moves its p95 JCT by up to 9% and its mean by up
to 6%. With ``--draws`` the checks are made again on each seed's average over its draws
(``checks_over_draws``, with each figure's range over draws and the wins draw by draw).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import sys
import time
import tomllib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_gpushare.core.config import PolicyConfig  # noqa: E402
from slurm_gpushare.core.hostlist import expand_ranges  # noqa: E402
from slurm_gpushare.sim.cluster import load_cluster  # noqa: E402
from slurm_gpushare.sim.report import _records, print_tables  # noqa: E402
from slurm_gpushare.sim.run import (default_data_dir, expand_policies, load_workload,  # noqa: E402
                                   run_policies)
from slurm_gpushare.sim.workload import WorkloadOptions  # noqa: E402

DEFAULT_POLICIES = "slurm-default,sjf-bsbf,gpushare,gpushare-sjf"
WALL_GOAL_S = 30.0


def spread(values) -> dict:
    values = [float(v) for v in values]
    return {"mean": float(np.mean(values)), "min": float(np.min(values)),
            "max": float(np.max(values)), "per_seed": values}


GOAL_METRICS = ("jct_mean_s", "jct_p95_s")


def goals(per_seed: list[dict]) -> dict:
    """The comparisons the project is judged by, from per-seed figures (policy -> metric ->
    value): gpushare-sjf against SJF-BSBF on mean and p95 JCT, gpushare against
    slurm-default on mean JCT; each where both policies ran."""
    out = {}
    if all("gpushare-sjf" in s and "sjf-bsbf" in s for s in per_seed):
        for metric in GOAL_METRICS:
            ours = [s["gpushare-sjf"][metric] for s in per_seed]
            theirs = [s["sjf-bsbf"][metric] for s in per_seed]
            wins = sum(a < b for a, b in zip(ours, theirs))
            out[f"gpushare-sjf_vs_sjf-bsbf_{metric}"] = {
                "gpushare-sjf": spread(ours), "sjf-bsbf": spread(theirs),
                "seeds_won": wins, "seeds": len(ours),
                "better_on_average": bool(np.mean(ours) < np.mean(theirs)),
                "goal_met": bool(np.mean(ours) < np.mean(theirs) and wins >= min(4, len(ours)))}
    if all("gpushare" in s and "slurm-default" in s for s in per_seed):
        change = [s["gpushare"]["jct_mean_s"] / s["slurm-default"]["jct_mean_s"] - 1
                  for s in per_seed]
        out["gpushare_vs_slurm-default_jct_mean"] = {
            **spread(change), "goal": -0.40, "goal_met": bool(np.mean(change) <= -0.40)}
    return out


def checks(seeds: list[dict]) -> dict:
    """The goals, from the per-seed figures."""
    summ = [{r["policy"]: r for r in s["summary"]} for s in seeds]
    out = goals(summ)
    kills = {p: int(sum(s[p]["oom_kills"] for s in summ)) for p in summ[0]}
    out["oom_kills_total"] = kills
    walls = {p: max(s["wall_s_per_policy"][p] for s in seeds) for p in seeds[0]["wall_s_per_policy"]}
    cpus = {p: max(s["cpu_s_per_policy"][p] for s in seeds) for p in seeds[0]["cpu_s_per_policy"]}
    out["wall_s_max"] = walls
    out["cpu_s_max"] = cpus
    out["wall_goal_met"] = {p: w <= WALL_GOAL_S for p, w in walls.items()}
    out["cpu_goal_met"] = {p: c <= WALL_GOAL_S for p, c in cpus.items()}
    return out


def over_draws(seeds: list[dict]) -> dict:
    """The goals again on each seed's figures averaged over its draws (the seed itself and its
    replicates, ``--draws``), with how far each figure moves over one seed's draws (relative
    range) and who wins draw by draw (paired: every policy of a draw replays the same jobs)."""
    runs = [[{r["policy"]: r for r in run["summary"]} for run in [s] + s.get("replicates", [])]
            for s in seeds]
    policies = list(runs[0][0])
    averages = [{p: {m: float(np.mean([run[p][m] for run in seed])) for m in GOAL_METRICS}
                 for p in policies} for seed in runs]
    out: dict = {"draws": len(runs[0]), **goals(averages), "relative_range": {
        p: {m: spread([(max(v) - min(v)) / np.mean(v) for v in (
            [run[p][m] for run in seed] for seed in runs)]) for m in GOAL_METRICS}
        for p in policies}}
    for metric in GOAL_METRICS:
        entry = out.get(f"gpushare-sjf_vs_sjf-bsbf_{metric}")
        if entry is not None:
            paired = [run["gpushare-sjf"][metric] < run["sjf-bsbf"][metric]
                      for seed in runs for run in seed]
            entry.update(runs_won=int(sum(paired)), runs=len(paired))
    return out


def _figures(record: dict) -> list:
    """A seed's summary less the wall time: what must not change from run to run."""
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in record["summary"]]


def results_digest(record: dict) -> str:
    """sha256[:16] of a seed's figures (less wall time), engine counters and decision codes:
    equal digests before and after a speed change mean the same results."""
    same = {"rows": _figures(record), "counters": record["counters"],
            "codes": record["decision_codes"]}
    return hashlib.sha256(json.dumps(same, sort_keys=True).encode()).hexdigest()[:16]


def policy_settings(parser, items: list[str]) -> dict:
    """``--policy KEY=VALUE`` items as the gpushare policies' [policy] settings."""
    known = {f.name for f in dataclasses.fields(PolicyConfig)}
    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in known:
            parser.error(f"--policy {item!r}: use KEY=VALUE with a [policy] setting")
        try:
            settings[key] = tomllib.loads(f"value = {value}")["value"]
            if isinstance(settings[key], list):  # partitions: tuples, as the config has them
                settings[key] = tuple(settings[key])
        except tomllib.TOMLDecodeError:
            parser.error(f"--policy {item!r}: the value is not a TOML value")
    return settings


def run_seed(args, seed: int, draw: int = 0) -> dict:
    """Every policy on one seed's jobs (``draw`` > 0: a replicate of them): the record."""
    data_dir = args.data_dir or default_data_dir()
    cluster = load_cluster(args.cluster)
    policies = expand_policies([args.policies])
    started = time.perf_counter()
    work = load_workload("philly", cluster, data_dir,
                         WorkloadOptions(seed=seed, limit=args.limit, load=args.load,
                                         runtime_error=args.runtime_error, draw=draw))
    load_s = time.perf_counter() - started
    outcome = run_policies(cluster, work, policies, data_dir=data_dir, seed=seed,
                           gpu_time_budget_pct=args.gpu_time_budget,
                           gpushare_settings=args.settings)
    print_tables(outcome.summary, outcome.relative,
                 title=f"Philly on {cluster.summary()} ({len(work)} jobs, seed {seed}"
                       + (f", draw {draw})" if draw else ")"))
    record = {
        "seed": seed, "jobs": len(work), "trace_load_s": round(load_s, 2),
        "wall_s_per_policy": {r.policy: round(r.wall_s, 2) for r in outcome.results},
        "cpu_s_per_policy": {r.policy: round(r.cpu_s, 2) for r in outcome.results},
        "summary": _records(outcome.summary),
        "relative_to_slurm_default": _records(outcome.relative),
        "counters": {r.policy: r.counters for r in outcome.results},
        "decision_codes": {r.policy: r.codes for r in outcome.results},
    }
    if draw:
        record["draw"] = draw
    record["results_digest"] = results_digest(record)
    which = f"seed {seed}" + (f" draw {draw}" if draw else "")
    print(f"{which}: results digest {record['results_digest']}, CPU s per policy "
          f"{record['cpu_s_per_policy']}", flush=True)
    return record


def positive_load(text: str) -> float:
    """An arrival-rate factor as simulate takes it (nan hung the run; 0 sends no job)."""
    value = float(text)
    if not 0.001 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: a finite factor of at least 0.001")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-4", help="seeds, e.g. 0-4 or 0,3")
    parser.add_argument("--policies", default=DEFAULT_POLICIES, help="comma-separated, or all")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--load", type=positive_load, default=1.0)
    parser.add_argument("--runtime-error", type=float, default=WorkloadOptions.runtime_error,
                        help="sigma of the log-normal run-time estimate error (every policy)")
    parser.add_argument("--cluster", default="philly")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--gpu-time-budget", type=float, default=0.0,
                        help="the gpushare policies' gpu_time_budget_pct (0: the default, memory only)")
    parser.add_argument("--policy", action="append", default=[], metavar="KEY=VALUE",
                        help="a [policy] setting of the gpushare policies over the defaults "
                             "(TOML value, e.g. sjf_nice_per_decade=1000; sharing_partitions=[] "
                             "with priority_partitions=[\"gpu\"]: the SJF lever without "
                             "sharing); repeatable")
    parser.add_argument("--jobs", type=int, default=1,
                        help="seeds run in parallel processes (wall time is then per process; "
                             "CPU time per policy is still each run's own)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of each seed: every run's wall and CPU time per policy are "
                             "kept under 'rounds' (the figures must come out the same)")
    parser.add_argument("--draws", type=int, default=1,
                        help="runs per seed: the seed and draws-1 replicates whose true run "
                             "times move by ~0.1%% (the simulator's noise floor); the checks "
                             "are then also made on each seed's average over its draws")
    parser.add_argument("--out", default=str(ROOT / "bench" / "sim_philly.json"))
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="combine the seeds of earlier runs (same settings) into --out")
    args = parser.parse_args(argv)
    args.settings = policy_settings(parser, args.policy)
    if args.merge:
        docs = [json.loads(Path(p).read_text()) for p in args.merge]
        doc = {**docs[0], "command": "; ".join(d["command"] for d in docs),
               "seeds": sorted((s for d in docs for s in d["seeds"]), key=lambda s: s["seed"])}
        doc["checks"] = checks(doc["seeds"])
        if all("replicates" in s for s in doc["seeds"]):
            doc["checks_over_draws"] = over_draws(doc["seeds"])
        doc["results_digest_per_seed"] = {s["seed"]: s["results_digest"] for s in doc["seeds"]}
        doc["load_average"] = [d.get("load_average") for d in docs]
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
        print(json.dumps(doc["checks"], indent=2))
        return 0
    cluster = load_cluster(args.cluster)
    policies = expand_policies([args.policies])
    seed_list = expand_ranges(args.seeds)
    if args.draws < 1:
        parser.error("--draws must be at least 1")
    tasks = [(seed, draw) for seed in seed_list for draw in range(args.draws)]
    if args.jobs > 1:
        # One process per seed and draw: the same figures (a run does not depend on the
        # others), in the wall time of the slowest where there are cores for it.
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            records = list(pool.map(run_seed, [args] * len(tasks), *zip(*tasks)))
    else:
        records = [run_seed(args, seed, draw) for seed, draw in tasks]
    seeds = [r for r in records if not r.get("draw")]
    for seed in seeds:
        seed["replicates"] = [
            {k: r[k] for k in ("draw", "summary", "results_digest", "cpu_s_per_policy",
                               "wall_s_per_policy")}
            for r in records if r.get("draw") and r["seed"] == seed["seed"]]
        if not seed["replicates"]:
            del seed["replicates"]
    for seed in seeds:
        seed["rounds"] = [{k: seed[k] for k in ("wall_s_per_policy", "cpu_s_per_policy")}]
        for _ in range(args.rounds - 1):
            again = run_seed(args, seed["seed"])
            if again["results_digest"] != seed["results_digest"]:
                raise SystemExit(f"seed {seed['seed']}: a second run gave other figures")
            seed["rounds"].append({k: again[k] for k in ("wall_s_per_policy", "cpu_s_per_policy")})
    doc = {
        "what": "Philly trace, several seeds, Gavel measured co-run speeds",
        "command": "python bench/sim_philly.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cluster": cluster.summary(), "load": args.load, "runtime_error": args.runtime_error,
        "gpu_time_budget_pct": args.gpu_time_budget, "gpushare_settings": args.settings,
        "policies": policies,
        "rounds": args.rounds, "load_average": os.getloadavg(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "checks": checks(seeds),
        **({"draws": args.draws, "checks_over_draws": over_draws(seeds)} if args.draws > 1
           else {}),
        "results_digest_per_seed": {s["seed"]: s["results_digest"] for s in seeds},
        "seeds": seeds,
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc["checks"], indent=2))
    if args.draws > 1:
        print(json.dumps(doc["checks_over_draws"], indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
