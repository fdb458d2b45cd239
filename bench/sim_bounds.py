"""Benchmark: how much better shares could be placed -- upper bounds, on the Philly trace.

    .venv/bin/python bench/sim_bounds.py [--seeds 0-4] [--draws 1] [--variants slurm,gpushare]
                                         [--jobs 2] [--data-dir ../shared/data] [--limit N]
                                         [--out bench/results/sim_bounds.json]

gpushare with the SJF lever (``gpushare-sjf``, default settings) decides each share at
submission, Slurm lands it on the first GPU with room on a node it may use, and the daemon keeps
its exclusions current while it waits (a node where it would land next to a partner its pair
predictor or class says it should not join is excluded; ``core/waiting.py``). These variants
keep everything else (decisions, queue order, backfill) and change only what the share may land
next to, some by an oracle that no Slurm site has:

- ``gpushare``: as simulated everywhere else (``bench/sim_philly.py``): the product (its
  landing-GPU judgements counted against the measured speeds: ``judged_*`` per run);
- ``gpushare-cold``: the product without learning from the co-runs it measures (the pair
  predictor's packaged prior throughout; decisions change too, not only placement);
- ``pair-evidence``: the product judging shares by the prior and what each pair of kinds ran
  at together (``PairEvidenceModel``): per-job corrections, learned from partners a job ran
  next to, are not carried to partners it never met (a pair the product keeps apart is never
  measured, so such a correction is never put right); decisions change too;
- ``slurm``: Slurm's packing alone: the first GPU with room, exclusions neither made nor
  followed (what the daemon's exclusions are measured against);
- ``class-at-start``: when a share starts, GPUs holding a class that the policy's class-pair
  knowledge calls incompatible are skipped (perfect, always-current exclusions with today's
  class knowledge);
- ``pair-at-start``: skipped where the measured pair speeds (Gavel's, the simulator's truth) put
  a co-runner below the 0.7x threshold (perfect pair knowledge, always current);
- ``pair-at-landing``: the same knowledge where Slurm lands a share: each node's first GPU with
  room, judged as the product judges it (its exclusions follow the cluster, never every node it
  could use): what a perfect pair predictor would earn the product in Slurm;
- ``no-co-location``: gpushare's decisions (types, share sizes, the lever), but a share never
  joins another job on a GPU: it takes an empty one on any node (not only the GPU Slurm would
  land it on) or waits (what the product earns without any co-location);
- ``pair-at-submit``: the same knowledge used once, at submission, on the GPU each node would
  land the share on (kept when it would exclude every candidate node), never followed.
- ``predicted-at-start``: as ``pair-at-start``, but by the product's own pair predictor (the
  packaged prior, ``pairs.default_model``, on the kinds' Gavel utilisation) with corrections
  learned from 3 measured co-runs per kind on each GPU (``pairs.history_split``, drawn by the
  seed), on any GPU with room (not only where Slurm would land the share);
  ``predicted-cold-at-start`` and ``predicted-10-at-start``: the same with no co-run and with
  10 per kind.

``--priority none`` runs every gpushare variant with the SJF lever off (``slurm-default`` is then
the reference the issue's goal names; it always runs).

Records per variant and seed mean and p95 JCT, the mean slowdown of shared runs (ISD) and the
shared fraction; averages over seeds (changes against ``slurm``); wins against SJF-BSBF.
``--draws N`` runs each seed N times (the seed and replicates whose true run times move by
~0.1%, as ``bench/sim_philly.py --draws``): a seed's figures are then its averages over the
draws, and the runs where a variant is below ``slurm`` are counted pair by pair. The gap
between ``slurm`` and ``pair-at-start`` is what pair knowledge that follows the cluster could
earn; ``gpushare`` shows how much of it the product keeps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_gpushare.core.hostlist import expand_ranges  # noqa: E402
from slurm_gpushare.predict.knowledge import GAVEL_MEM_MIB, gavel_profiles  # noqa: E402
from slurm_gpushare.predict.pairs import (HISTORY_PER_JOB, PairModel, data_sets,  # noqa: E402
                                          default_model, demand_of, history_split,
                                          prior_isd)
from slurm_gpushare.sim.cluster import SPEED_PROFILES, load_cluster  # noqa: E402
from slurm_gpushare.sim.engine import Engine  # noqa: E402
from slurm_gpushare.sim.interference import make_model  # noqa: E402
from slurm_gpushare.sim.metrics import summarise  # noqa: E402
from slurm_gpushare.sim.policies import GpuShare, Policy, make_policy  # noqa: E402
from slurm_gpushare.sim.run import default_data_dir, knowledge_table, load_workload  # noqa: E402
from slurm_gpushare.sim.workload import WorkloadOptions  # noqa: E402

THRESHOLD = 0.7
VARIANTS = ("slurm", "gpushare", "gpushare-cold", "pair-evidence", "no-co-location",
            "class-at-start", "pair-at-start", "pair-at-landing", "pair-at-submit",
            "predicted-cold-at-start", "predicted-at-start", "predicted-10-at-start")
# Measured co-runs per kind the predictor learned from, per predicted-* variant.
CO_RUNS = {"predicted-cold-at-start": 0, "predicted-at-start": HISTORY_PER_JOB,
           "predicted-10-at-start": 10}


def pair_ok(engine, g: int, j: int) -> bool:
    """Would every co-runner on GPU g, job j with them, run at >= THRESHOLD (measured)?"""
    group = engine.g_jobs[g] + [j]
    speeds = engine.model.speeds(engine.g_profile[g], [engine.kind[i] for i in group],
                                 [engine.jclass[i] for i in group])
    return speeds is not None and min(speeds) >= THRESHOLD


class _Judging(GpuShare):
    """The product, remembering which job ``place`` judges (``_blocked`` is told only the GPU).
    Every judgement is asked of ``_blocked`` (to count it, or to judge it by other means)."""

    remember_verdicts = False

    def place(self, j, req, engine, exclude):
        self._judging = j
        return super().place(j, req, engine, exclude)


class JudgedGpuShare(_Judging):
    """The product, counting its landing-GPU judgements against the measured pair speeds (per
    GPU model: allowed where the measured pair is at the threshold or better, ``ok_joined``,
    or below, ``bad_joined``; kept off where it is good, ``ok_kept_off``, or bad,
    ``bad_kept_off``). A waiting share is judged again at every pass, so these count
    judgements, not jobs."""

    def prepare(self, engine):
        super().prepare(engine)
        self.judged: dict[str, int] = {}

    def _blocked(self, entry, engine, g, pairwise):
        blocked = super()._blocked(entry, engine, g, pairwise)
        if engine.g_jobs[g]:
            truth = "ok" if pair_ok(engine, g, self._judging) else "bad"
            key = (f"judged_{SPEED_PROFILES[engine.g_profile[g]]}_{truth}_"
                   f"{'kept_off' if blocked else 'joined'}")
            self.judged[key] = self.judged.get(key, 0) + 1
        return blocked

    def final_counters(self):
        return {**super().final_counters(), **self.judged}


class Packed(GpuShare):
    """gpushare's decisions, placed by Slurm's packing alone (its exclusions not followed)."""

    place, memo_key = Policy.place, Policy.memo_key


class ColdGpuShare(GpuShare):
    """The product without learning from co-runs: the pair predictor's cold prior throughout."""

    def __init__(self, knowledge, **settings):
        super().__init__(knowledge, learn_coruns=False, **settings)


class PairEvidenceModel(PairModel):
    """The pair predictor judging a share by the prior and what its jobs ran at together: each
    ordered pair of keys measured together gets its own term (its sides' mean log residual,
    ``n / (n + 1)`` of the way with ``n`` sides); no per-job correction is learned. The cold
    margin throughout: it is the one calibrated on the prior."""

    pair_terms: dict[tuple[str, str], float] = {}

    def learn(self, coruns, profiles):
        totals: dict[tuple[str, str], list[float]] = {}
        for own, other, r, _same_user in self.residuals(coruns, profiles):
            totals.setdefault((own, other), []).append(r)
        self.pair_terms = {pair: sum(v) / (len(v) + 1.0) for pair, v in totals.items()}
        return self

    @classmethod
    def of(cls, model: PairModel) -> "PairEvidenceModel":
        """``model``'s prior and margins, without corrections."""
        return cls(latency=model.latency, threshold=model.threshold, margin=model.margin,
                   margin_learned=model.margin_learned, shrinkage=model.shrinkage,
                   n_train=model.n_train)

    def fitted_copy(self):
        return PairEvidenceModel.of(self)

    def safe_speeds(self, profiles, keys=None):
        keys = list(keys) if keys is not None else [None] * len(profiles)
        terms = self.pair_terms
        isd = prior_isd([demand_of(p) for p in profiles], self.latency,
                        lambda i, j: terms.get((keys[i], keys[j]), 0.0))
        return [1.0 / (1.0 + self.margin * d) for d in isd]

    def copies_allowed(self, profile, key=None, limit=1_000):
        # The product's closed form, with the self-pair's own term as the only correction.
        judge = PairModel(latency=self.latency, threshold=self.threshold, margin=self.margin,
                          margin_learned=self.margin)
        judge.suffers = {key: self.pair_terms.get((key, key), 0.0)}
        return judge.copies_allowed(profile, key, limit)


class PairEvidenceGpuShare(GpuShare):
    """The product with ``PairEvidenceModel`` deciding its shares."""

    def prepare(self, engine):
        super().prepare(engine)
        self.pairs.model = PairEvidenceModel.of(self.pairs.model)


class ClassAtStart(Packed):
    def place(self, j, req, engine, exclude):
        if req.whole:
            return self.first_whole(j, req, engine, exclude)
        c, names = engine.jclass[j], self.type_names
        for g in engine.share_candidates(req, exclude):
            gpu_type = names[engine.g_type_list[g]]
            if all(self.compat.compatible(c, engine.jclass[i], gpu_type)
                   for i in engine.g_jobs[g]):
                return [g]
        return None


class PairAtStart(Packed):
    def place(self, j, req, engine, exclude):
        if req.whole:
            return self.first_whole(j, req, engine, exclude)
        for g in engine.share_candidates(req, exclude):
            if not engine.g_jobs[g] or pair_ok(engine, g, j):
                return [g]
        return None


class PairAtLanding(_Judging):
    """The product with a perfect pair judge: ``GpuShare.place`` (each node's landing GPU,
    never kept off every node it could use), judged by the measured speeds."""

    def _blocked(self, entry, engine, g, pairwise):
        return bool(engine.g_jobs[g]) and not pair_ok(engine, g, self._judging)


class NoCoLocation(GpuShare):
    """gpushare's decisions; a share only ever takes an empty GPU."""

    def place(self, j, req, engine, exclude):
        if req.whole or j not in self.judgements:
            return Policy.place(self, j, req, engine, exclude)
        for g in engine.share_candidates(req, exclude):  # any GPU with room, not only Slurm's
            if not engine.g_jobs[g]:
                return [g]
        return None


class PairAtSubmit(Packed):
    def admit(self, j, engine):
        req = super().admit(j, engine)
        if req.whole:
            return req
        away, candidates = set(req.exclude), 0
        for node in range(engine.N):
            t = engine.n_type_list[node]
            if not req.types[t]:
                continue
            candidates += 1
            # The GPU Slurm would land it on now (policy.landing_gpu's rule: the first with room).
            for g in engine._n_gpu_range[node]:
                if engine.g_free[g] >= req.shards[t]:
                    if engine.g_jobs[g] and not pair_ok(engine, g, j):
                        away.add(node)
                    break
        if len(away) >= candidates:
            return req
        return replace(req, exclude=frozenset(away))


class PredictedAtStart(Packed):
    def __init__(self, *args, seed: int = 0, co_runs: int = HISTORY_PER_JOB, **kwargs):
        super().__init__(*args, **kwargs)
        self.models, self.profiles = learned_predictors(seed, co_runs)
        self.verdicts: dict = {}

    def place(self, j, req, engine, exclude):
        if req.whole:
            return self.first_whole(j, req, engine, exclude)
        kinds = engine.work.kinds
        for g in engine.share_candidates(req, exclude):
            residents = engine.g_jobs[g]
            if not residents:
                return [g]
            profile = engine.g_profile[g]
            keys = tuple(sorted(kinds[engine.kind[i]] for i in residents + [j]))
            verdict = self.verdicts.get((profile, keys))
            if verdict is None:
                model, profiles = self.models[profile], self.profiles[profile]
                verdict = self.verdicts[(profile, keys)] = model.recommend(
                    [profiles[k] for k in keys], list(keys))
            if verdict:
                return [g]
        return None


def learned_predictors(seed: int, per_job: int = HISTORY_PER_JOB) -> tuple[dict, dict]:
    """Per Gavel GPU (the simulator's speed profile index): the packaged pair predictor with
    corrections learned from ``per_job`` of Gavel's measured pairs per kind on that GPU, and
    every kind's profile there (Gavel's utilisation proxy)."""
    util = gavel_profiles()
    models, profiles = {}, {}
    for name, pairs, _ in data_sets():
        if not name.startswith("gavel-"):
            continue
        gpu = name.removeprefix("gavel-")
        rows = util[util.gpu == gpu]
        kinds = {r.job: {"gpu_util_pct": float(r.gpu_util_pct), "mem_total_mib": GAVEL_MEM_MIB[gpu]}
                 for r in rows.itertuples()}
        history, _ = history_split(pairs, seed, per_job) if per_job else ([], pairs)
        profile = SPEED_PROFILES.index(gpu)
        models[profile] = default_model().learn(history, kinds) if history else default_model()
        profiles[profile] = kinds
    return models, profiles


def run(task) -> dict:
    seed, draw, variant, data_dir, limit, priority = task
    cluster = load_cluster("philly")
    work = load_workload("philly", cluster, data_dir,
                         WorkloadOptions(seed=seed, draw=draw, limit=limit))
    knowledge = knowledge_table(data_dir)
    if variant in ("sjf-bsbf", "slurm-default"):
        policy = make_policy(variant, knowledge, seed)
    else:
        kind = {"gpushare": JudgedGpuShare, "gpushare-cold": ColdGpuShare, "slurm": Packed,
                "pair-evidence": PairEvidenceGpuShare,
                "no-co-location": NoCoLocation, "class-at-start": ClassAtStart,
                "pair-at-start": PairAtStart, "pair-at-landing": PairAtLanding,
                "pair-at-submit": PairAtSubmit}.get(variant, PredictedAtStart)
        extra = {"seed": seed, "co_runs": CO_RUNS[variant]} if kind is PredictedAtStart else {}
        policy = kind(knowledge, priority=priority, **extra)
    started = time.process_time()
    result = Engine(cluster, work, policy, make_model("gavel", data_dir)).run()
    summary = summarise(result, cap_jobs=cluster.max_jobs_per_gpu)
    return {"seed": seed, "draw": draw, "variant": variant,
            **{k: summary[k] for k in ("jct_mean_s", "jct_p95_s", "isd_mean", "shared_jobs",
                                       "oom_kills", "pair_failures")},
            **{k: int(v) for k, v in result.counters.items() if k.startswith("judged_")},
            "cpu_s": round(time.process_time() - started, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-4")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--limit", type=int, default=None, help="first N jobs (a quick look)")
    parser.add_argument("--draws", type=int, default=1, help="runs per seed (see above)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated; slurm (the reference), slurm-default and "
                             "sjf-bsbf always run")
    parser.add_argument("--priority", choices=("sjf", "none"), default="sjf",
                        help="the gpushare variants' SJF lever (none: off)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "sim_bounds.json"))
    args = parser.parse_args(argv)
    data_dir = args.data_dir or default_data_dir()
    seeds, draws = expand_ranges(args.seeds), range(args.draws)
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {', '.join(unknown)} (of {', '.join(VARIANTS)})")
    variants = ("slurm-default", "sjf-bsbf") + tuple(
        v for v in VARIANTS if v == "slurm" or v in chosen)
    tasks = [(s, d, v, data_dir, args.limit, args.priority)
             for s in seeds for d in draws for v in variants]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(run, tasks))
    for row in rows:
        print(json.dumps(row), flush=True)
    runs = {(r["variant"], r["seed"], r["draw"]): r for r in rows}
    # A seed's figure: its average over the draws (the run itself with one draw).
    by = {(v, s): {m: float(np.mean([runs[(v, s, d)][m] for d in draws]))
                   for m in ("jct_mean_s", "jct_p95_s", "isd_mean", "shared_jobs")}
          for v in variants for s in seeds}
    summary = {}
    for variant in variants:
        out = {}
        for metric in ("jct_mean_s", "jct_p95_s", "isd_mean", "shared_jobs"):
            values = [by[(variant, s)][metric] for s in seeds]
            out[metric] = {"mean": float(np.mean(values)), "min": float(np.min(values)),
                           "max": float(np.max(values)), "per_seed": values}
        if variant not in ("sjf-bsbf", "slurm-default"):
            out["jct_mean_s_vs_slurm_default"] = float(np.mean(
                [by[(variant, s)]["jct_mean_s"] / by[("slurm-default", s)]["jct_mean_s"] - 1
                 for s in seeds]))
            for metric in ("jct_mean_s", "jct_p95_s"):
                out[f"{metric}_seeds_beating_sjf-bsbf"] = sum(
                    by[(variant, s)][metric] < by[("sjf-bsbf", s)][metric] for s in seeds)
                out[f"{metric}_vs_slurm"] = float(np.mean(
                    [by[(variant, s)][metric] / by[("slurm", s)][metric] - 1 for s in seeds]))
                out[f"{metric}_runs_below_slurm"] = sum(
                    runs[(variant, s, d)][metric] < runs[("slurm", s, d)][metric]
                    for s in seeds for d in draws)
        mine = [r for r in rows if r["variant"] == variant]
        judged = sorted({k for r in mine for k in r if k.startswith("judged_")})
        if judged:  # totals over the runs
            out["judged"] = {k: sum(r.get(k, 0) for r in mine) for k in judged}
        out["cpu_s_max"] = max(r["cpu_s"] for r in mine)
        out["oom_kills"] = sum(r["oom_kills"] for r in mine)
        out["pair_failures"] = sum(r["pair_failures"] for r in mine)
        summary[variant] = out
    doc = {"what": __doc__.splitlines()[0],
           "command": "python bench/sim_bounds.py " + " ".join(
               argv if argv is not None else sys.argv[1:]),
           "threshold": THRESHOLD, "priority": args.priority, "seeds": seeds, "draws": args.draws,
           "load_average": os.getloadavg(),
           "summary": summary, "runs": rows}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    for variant, out in summary.items():
        change = out.get("jct_mean_s_vs_slurm_default")
        print(f"{variant:15s} mean {out['jct_mean_s']['mean']:8.0f}  p95 "
              f"{out['jct_p95_s']['mean']:8.0f}  ISD {out['isd_mean']['mean']:.3f}  "
              f"shared {out['shared_jobs']['mean']:.3f}"
              + ("" if change is None else f"  vs slurm-default {change:+.1%}"))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
