"""Turn a trace into simulator jobs: what the trace lacks is drawn reproducibly (seeded).

Every draw below uses one ``numpy.random.Generator`` seeded by ``--seed``, in job order, so the
same trace, cluster and seed give the same jobs under every policy.

- **Job kind** (for speeds): a Gavel job type (26 types: ResNet-18/50, Transformer, LM,
  Recommendation at several batch sizes, A3C, CycleGAN), uniformly, as Gavel's own simulator
  draws them. It fixes the job's throughput on each GPU and its measured pair speeds.
- **Solo run time per GPU type**: the trace's duration is the run time on the cluster's
  ``reference_gpu``; on another type it scales by Gavel's alone throughputs of the job's kind:
  ``duration * tput[reference][kind] / tput[type][kind]`` (each type maps to the Gavel GPU named
  by its ``speed_profile``). Multi-GPU jobs scale the same way (scale-1 throughputs).
- **Peak GPU memory per type** (the truth that can OOM): a SchedTune measurement
  (``schedtune/model_stats.csv``: 12 CNNs x batch 8-64 x 5 GPUs). ResNet-18/50 kinds take the
  SchedTune row of the same network at the nearest measured batch (<= 64); the other kinds take
  a row drawn uniformly (SchedTune measured CNNs only). Each type reads the column of the
  SchedTune GPU named by its ``memory_profile`` (e.g. P100, absent from SchedTune, uses V100).
  Traces that state the memory use it, with nothing to predict: openb's ``gpu_milli`` is the
  fraction of the GPU a single-GPU pod takes, on whichever type it lands (FGD's reading; 1000
  = all of it); sacct's
  gres/shard count is the GiB the job was given.
- **Types the user's request allows**: the types where the true peak fits the GPU (a user whose
  job does not fit a K80 asks for the others); a trace's own GPU type when it names one.
- **Predicted memory**: truth x (1 + e), e ~ N(0, 3%) clipped to +-9% (SchedTune's reported
  error: 1.5% average, 8.98% max); the **safe** estimate adds ``memory_margin`` (10%), so it
  covers the truth whenever the error stays inside the clip. Policies that share "aggressively"
  use the prediction without margin.
- **Predicted run time** per type: truth x exp(N(0, ``runtime_error``)) (0.5: off by more than
  x1.65 for a third of the jobs), one draw per job. Every policy orders and backfills with these
  same estimates (no policy sees true run times).
- **Interference class**: the class of the job's Gavel kind (``interference.gavel_classes``:
  terciles of the pressure each kind puts on its partners), standing in for the telemetry
  K-means class that a trace without telemetry cannot give.
- **Replicates of a seed** (``draw`` > 0): the seed's jobs with every true run time scaled by
  exp(N(0, 0.1%)), one factor per job from the stream (seed, draw); nothing else changes. A
  congested queue is chaotic: so small a change reorders it, and a seed's p95 JCT moves by up
  to 9% (``bench/sim_philly.py --draws``). Comparisons closer than that need several draws.

openb is replayed FGD's way for the allocation experiment (``openb_inflate``): pods are drawn
with replacement from the trace and arrive one by one until their GPU requests reach ``load`` x
the cluster's GPUs; they never finish.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from slurm_gpushare.predict import datasets
from slurm_gpushare.sim.cluster import MEMORY_PROFILES, SPEED_PROFILES, Cluster
from slurm_gpushare.sim.interference import gavel_classes, load_gavel

# SchedTune's GPUs by CUDA core count (see the data README).
SCHEDTUNE_GPUS = {2496: "K80", 2560: "RTX2070S", 5120: "V100", 5888: "RTX3070", 10496: "RTX3090"}
DRAW_SIGMA = 1e-3  # run-time perturbation of a replicate (``WorkloadOptions.draw``)


@dataclass(frozen=True)
class WorkloadOptions:
    seed: int = 0
    load: float = 1.0  # arrival-rate factor: submit times are divided by it
    limit: int | None = None  # first N jobs of the trace
    memory_margin: float = 0.10
    memory_error: float = 0.03
    memory_error_max: float = 0.09
    # Run-time estimates (every ordering policy and every backfill use the same ones):
    # truth x exp(N(0, runtime_error)) per job; 0.5 puts a third of the estimates off by
    # more than x1.65 -- what a prediction from a job's own earlier runs may miss by.
    runtime_error: float = 0.5
    # A replicate of the seed (0: none): every true run time times exp(N(0, DRAW_SIGMA)), one
    # factor per job from the stream (seed, draw); the jobs, kinds, memory and estimates stay
    # the seed's. Moving event times by ~0.1% reorders a congested queue, so the spread of a
    # seed's figures over draws is the simulator's noise floor (bench/sim_philly.py --draws).
    draw: int = 0


@dataclass
class Workload:
    """Jobs as arrays; row j is job j, columns of (J, T) arrays are the cluster's GPU types."""

    name: str
    type_names: tuple[str, ...]
    job_id: list[str]
    submit: np.ndarray
    n_gpus: np.ndarray
    n_nodes: np.ndarray  # 0: as many as the GPUs need
    solo: np.ndarray  # (J, T) run time alone, s
    runtime_pred: np.ndarray  # (J, T)
    allowed: np.ndarray  # (J, T) bool
    mem_true: np.ndarray  # (J, T) MiB
    mem_pred: np.ndarray  # (J, T) MiB
    mem_safe: np.ndarray  # (J, T) MiB
    kind: np.ndarray  # Gavel job type index
    job_class: np.ndarray
    gpu_request: np.ndarray  # GPUs asked for in the trace's own units (openb: milli / 1000)
    kinds: tuple[str, ...] = ()
    until: float | None = None  # stop time (openb inflation: the last arrival)
    notes: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.submit)

    def subset(self, index) -> "Workload":
        index = np.asarray(index)
        arrays = {k: getattr(self, k)[index] for k in (
            "submit", "n_gpus", "n_nodes", "solo", "runtime_pred", "allowed", "mem_true",
            "mem_pred", "mem_safe", "kind", "job_class", "gpu_request")}
        return replace(self, job_id=[self.job_id[i] for i in index], **arrays)


@functools.lru_cache(maxsize=4)
def load_schedtune(data_dir: str) -> pd.DataFrame:
    """Peak memory (MiB) per (model, batch) row and SchedTune GPU column."""
    frame = datasets.load_schedtune(Path(data_dir) / "schedtune")
    profile = frame.cuda_cores.map(SCHEDTUNE_GPUS)  # the memory profiles' names
    table = frame.assign(profile=profile).pivot_table(index=["model", "batch_size"],
                                                      columns="profile", values="peak_mib")
    return table[list(MEMORY_PROFILES)]


def _memory_rows(kinds: tuple[str, ...], table: pd.DataFrame) -> list[np.ndarray]:
    """For each Gavel kind, the SchedTune rows it may draw from (see the module docstring)."""
    index = list(table.index)
    rows = []
    for kind in kinds:
        net = {"ResNet-18": "resnet18", "ResNet-50": "resnet50"}.get(kind.split(" (")[0])
        if net is None:
            rows.append(np.arange(len(index)))
            continue
        batch = int(kind.split("batch size ")[1].rstrip(")"))
        measured = sorted(b for m, b in index if m == net)
        nearest = max([b for b in measured if b <= batch] or measured[:1])
        rows.append(np.array([index.index((net, nearest))]))
    return rows


def build_workload(trace: pd.DataFrame, cluster: Cluster, data_dir: str | Path,
                   options: WorkloadOptions = WorkloadOptions(), name: str = "") -> Workload:
    data_dir = str(data_dir)
    if options.limit:
        trace = trace.iloc[: options.limit]
    if options.load <= 0:
        raise ValueError("load must be positive")
    rng = np.random.default_rng(options.seed)
    gavel = load_gavel(data_dir)
    table = load_schedtune(data_dir)
    n, types = len(trace), cluster.types

    kind = rng.integers(0, gavel.n_kinds, n)
    speed_col = np.array([SPEED_PROFILES.index(t.speed_profile) for t in types])
    ref = cluster.type_index(cluster.reference_gpu)
    tput = gavel.alone[:, kind].T  # (J, profile)
    duration = trace["duration"].to_numpy(float)
    solo = duration[:, None] * tput[:, [speed_col[ref]]] / tput[:, speed_col]

    # Memory: a SchedTune row per job, then the column of each type's memory profile.
    choices = _memory_rows(gavel.kinds, table)
    pick = rng.random(n)
    row = np.array([c[int(u * len(c))] for c, u in zip((choices[k] for k in kind), pick)])
    mem_cols = [MEMORY_PROFILES.index(t.memory_profile) for t in types]
    mem_true = table.to_numpy()[row][:, mem_cols].astype(float)
    known = trace["mem_mib"].to_numpy(float)
    milli = trace["gpu_milli"].to_numpy(float)
    if trace.attrs.get("milli_is_memory"):
        from_milli = trace["num_gpus"].to_numpy() == 1
    else:
        from_milli = milli < 1000
    gpu_mem = np.array([t.memory_gib * 1024 for t in types], float)
    mem_true[from_milli] = (milli[from_milli] / 1000)[:, None] * gpu_mem[None, :]
    has_mem = ~np.isnan(known)
    mem_true[has_mem] = known[has_mem][:, None]

    error = np.clip(rng.normal(0, options.memory_error, n), -options.memory_error_max,
                    options.memory_error_max)
    mem_pred = mem_true * (1 + error)[:, None]
    mem_safe = mem_pred * (1 + options.memory_margin)
    # A trace that states the memory (openb's gpu_milli) leaves nothing to predict.
    given = from_milli | has_mem
    mem_pred[given] = mem_safe[given] = mem_true[given]
    runtime_pred = solo * np.exp(rng.normal(0, options.runtime_error, n))[:, None]
    if options.draw:  # after every other draw: the estimates stay the seed's
        jitter = np.random.default_rng([options.seed, options.draw]).normal(0, DRAW_SIGMA, n)
        solo = solo * np.exp(jitter)[:, None]

    allowed = mem_true <= gpu_mem[None, :]
    asked = trace["gpu_type"].astype(str).to_numpy()
    for t, spec in enumerate(types):
        named = (asked != "") & (np.char.lower(asked.astype(str)) == spec.name.lower())
        allowed[named] = False
        allowed[named, t] = True
    # A job fitting no type keeps the largest (Slurm would run it there and it would fail;
    # rare: SchedTune's peaks are below 16 GiB).
    none = ~allowed.any(axis=1)
    allowed[none, int(np.argmax(gpu_mem))] = True

    classes = gavel_classes(gavel)
    submit = trace["submit"].to_numpy(float) / options.load
    n_gpus = trace["num_gpus"].to_numpy(int)
    request = np.where(from_milli, milli / 1000, 1.0) * n_gpus
    return Workload(
        name=name, type_names=cluster.type_names, job_id=trace["job_id"].astype(str).tolist(),
        submit=submit, n_gpus=n_gpus, n_nodes=trace["num_nodes"].to_numpy(int), solo=solo,
        runtime_pred=runtime_pred, allowed=allowed, mem_true=mem_true, mem_pred=mem_pred,
        mem_safe=mem_safe, kind=kind, job_class=classes[kind], gpu_request=request,
        kinds=gavel.kinds,
        notes={"seed": options.seed, "draw": options.draw, "load": options.load,
               "memory_margin": options.memory_margin},
    )


def openb_inflate(trace: pd.DataFrame, cluster: Cluster, data_dir: str | Path,
                  options: WorkloadOptions, load: float) -> Workload:
    """FGD's workload inflation: pods drawn with replacement until requests reach load x GPUs."""
    rng = np.random.default_rng(options.seed + 7919)  # its own stream: the draws differ in kind
    per_pod = (np.where(trace.gpu_milli < 1000, trace.gpu_milli / 1000, 1.0) * trace.num_gpus).to_numpy()
    target = load * cluster.n_gpus
    mean = per_pod.mean()
    count = int(math.ceil(target / mean * 1.2)) + 10
    picks = rng.integers(0, len(trace), count)
    cumulative = np.cumsum(per_pod[picks])
    picks = picks[: int(np.searchsorted(cumulative, target)) + 1]
    sample = trace.iloc[picks].reset_index(drop=True)
    sample.attrs["milli_is_memory"] = trace.attrs.get("milli_is_memory", False)
    sample["submit"] = np.arange(len(sample), dtype=float)
    sample["duration"] = 1e12  # pods stay: FGD measures allocation as the cluster fills
    sample["job_id"] = [f"{j}#{i}" for i, j in enumerate(sample.job_id)]
    work = build_workload(sample, cluster, data_dir, replace(options, load=1.0, limit=None),
                          name="openb")
    work.until = float(len(sample))
    work.notes["inflation_load"] = load
    return work
