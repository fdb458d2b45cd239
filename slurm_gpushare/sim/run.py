"""Run a trace under several policies on one cluster: the function behind ``simulate``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from slurm_gpushare.predict.datasets import default_data_dir  # noqa: F401 -- the commands' default
from slurm_gpushare.sim import metrics
from slurm_gpushare.sim import traces
from slurm_gpushare.sim.cluster import Cluster
from slurm_gpushare.sim.engine import Engine, EngineOptions, Result
from slurm_gpushare.sim.interference import ClassPairTable, gavel_classes, load_gavel, make_model
from slurm_gpushare.sim.policies import POLICY_NAMES, make_policy
from slurm_gpushare.sim.workload import Workload, WorkloadOptions, build_workload


def knowledge_table(data_dir: str | Path, source: str = "gavel") -> ClassPairTable:
    """What sharing policies know about pairs: speeds by class.

    ``gavel``: Gavel's pairs averaged by class; ``kb``: the project's knowledge base
    (``slurm_gpushare.predict.knowledge``, seeded from the public data), per speed profile.
    """
    if source == "kb":
        from slurm_gpushare.predict.knowledge import KnowledgeBase  # noqa: PLC0415

        kb = KnowledgeBase.seeded()
        return ClassPairTable.from_knowledge_base(kb, ("k80", "p100", "v100"))
    gavel = load_gavel(str(data_dir))
    return ClassPairTable.from_gavel(gavel, gavel_classes(gavel))


@dataclass
class Outcome:
    summary: pd.DataFrame
    relative: pd.DataFrame
    jobs: pd.DataFrame
    timelines: pd.DataFrame
    results: list[Result] = field(default_factory=list)


def run_policies(cluster: Cluster, work: Workload, policies: list[str], *, data_dir: str | Path,
                 seed: int = 0, interference: str = "gavel", knowledge: str = "gavel",
                 options: EngineOptions | None = None, task_mix=None, progress=None,
                 gpu_time_budget_pct: float = 0.0, gpushare_settings: dict | None = None
                 ) -> Outcome:
    model = make_model(interference, str(data_dir))
    table = knowledge_table(data_dir, knowledge)
    results, rows, jobs, timelines = [], [], [], []
    for name in policies:
        policy = make_policy(name, table, seed, gpu_time_budget_pct=gpu_time_budget_pct,
                             gpushare_settings=gpushare_settings)
        engine = Engine(cluster, work, policy, model, options=options,
                        progress=progress(name) if progress else None)
        result = engine.run()
        results.append(result)
        cap = (options.max_jobs_per_gpu if options and options.max_jobs_per_gpu
               else cluster.max_jobs_per_gpu)
        rows.append(metrics.summarise(result, cap_jobs=cap, task_mix=task_mix))
        jobs.append(metrics.jobs_frame(result))
        timelines.append(metrics.timeline_frame(result))
    summary = pd.DataFrame(rows)
    return Outcome(summary, metrics.relative(summary), pd.concat(jobs, ignore_index=True),
                   pd.concat(timelines, ignore_index=True), results)


def load_workload(trace: str, cluster: Cluster, data_dir: str | Path,
                  options: WorkloadOptions) -> Workload:
    frame = traces.load_trace(trace, data_dir)
    return build_workload(frame, cluster, data_dir, options, name=trace)


def expand_policies(names: tuple[str, ...] | list[str]) -> list[str]:
    out = []
    for name in names:
        for part in name.split(","):
            part = part.strip()
            if part == "all":
                out += [p for p in POLICY_NAMES if p not in out]
            elif part:
                if part not in POLICY_NAMES:
                    raise ValueError(f"unknown policy {part!r} (all or {', '.join(POLICY_NAMES)})")
                if part not in out:
                    out.append(part)
    if not out:
        raise ValueError(f"no policy given (all or {', '.join(POLICY_NAMES)})")
    return out
