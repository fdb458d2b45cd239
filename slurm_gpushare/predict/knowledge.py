"""What is known about running two jobs on one GPU: the class-pair knowledge base (the pair
predictor itself is ``pairs.py``).

**Knowledge base.** For each unordered pair of interference classes (and GPU type where known)
it keeps the slowdown of each side, ISD = T_packed / T_alone - 1, and the packing saving
PS = 1 - max(T_packed_a, T_packed_b) / (T_alone_a + T_alone_b), as counts, means and spreads
(standard deviations). It is seeded from the 34 measured pairs of Ray et al. (Tables III/IV,
Tesla P100, ``data/alnair``) and learns online from the site's co-runs (``observe``).

A lookup falls back from the most specific cell to coarser ones: (classes, GPU type) ->
(classes, any GPU) -> the *prior*. The documented prior is the pooled statistics of every seeded
pair (all classes together): an unmeasured class pair is assumed to behave like the average
measured pair, with the pooled spread.

**Compatibility rule.** Two classes may share when each side's *pessimistic* predicted
normalised speed, 1 / (1 + ISD_mean + ISD_spread), is at least ``threshold`` (default 0.7: no
job should run slower than 0.7x of alone). The spread of a cell with fewer than two
observations is the prior's spread. Speed here means throughput when sharing / alone.

**The Gavel telemetry proxy (what it is, honestly).** Gavel published throughputs, not
telemetry. Each job type's GPU utilisation on each GPU is *derived* from its isolated
throughputs on K80, P100 and V100 with a two-term Amdahl model: step time = t_host + W / s(g),
where s(g) is a GPU speed index -- the 90th percentile over all job types of the throughput
speed-up relative to K80 (so ~10% of jobs are treated as purely GPU-bound) -- and t_host, W >= 0
are fitted by non-negative least squares. The proxy utilisation is the GPU part of a step,
W / s(g) * throughput(g), clipped to [0, 1]. It uses only isolated runs, never a pair, so a
held-out job type's proxy carries no information about its pairs; the speed index is a
population statistic of isolated throughputs. It is a model of utilisation, not a measurement:
a host-bound job (Recommendation) comes out near 0%, a GPU-bound one (ResNet) near 100%.
The quantile 0.9 was chosen among 0.5/0.75/0.9/1.0 by a leave-one-job-type-out evaluation of
the earlier gradient-boosted pair model on these pairs, so figures on Gavel are slightly
optimistic.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from slurm_gpushare.predict.persist import load_json, save_json

if TYPE_CHECKING:
    import pandas as pd

    from slurm_gpushare.predict.classes import ClassModel

DEFAULT_THRESHOLD = 0.7
KB_FORMAT = "slurm-gpushare/knowledge-base/1"
ALNAIR_GPU = "p100"  # Ray et al. measured on a Tesla P100 16 GB
ANY_GPU = "*"
# Memory of the GPUs in Gavel's measurements (MiB): K80 counts one of its two 12 GB dies.
GAVEL_MEM_MIB = {"k80": 12 * 1024, "p100": 16 * 1024, "v100": 16 * 1024}
GAVEL_SPEED_QUANTILE = 0.9


def measured_isd(time_with_s: float, time_solo_s: float) -> float:
    """Slowdown of a job that ran ``time_with_s`` next to a co-runner and ``time_solo_s`` alone
    (from its history or a prediction): ISD = T_packed / T_alone - 1."""
    if time_solo_s <= 0:
        raise ValueError("solo time must be positive")
    return time_with_s / time_solo_s - 1.0


def packing_saving(packed_a_s: float, packed_b_s: float, alone_a_s: float,
                   alone_b_s: float) -> float:
    """PS = 1 - max(T_packed) / (T_alone_a + T_alone_b): time saved against running in turn."""
    return 1.0 - max(packed_a_s, packed_b_s) / (alone_a_s + alone_b_s)


def speed_of(isd: float) -> float:
    """Normalised speed (throughput shared / alone) of a job with slowdown ``isd``."""
    return 1.0 / (1.0 + max(isd, -0.99))


# -- knowledge base --------------------------------------------------------------------------
@dataclass
class _Moments:
    n: int = 0
    total: float = 0.0
    squares: float = 0.0

    def add(self, value: float | None) -> None:
        if value is None or not math.isfinite(value):
            return
        self.n += 1
        self.total += value
        self.squares += value * value

    def merge(self, other: "_Moments") -> None:
        self.n += other.n
        self.total += other.total
        self.squares += other.squares

    @property
    def mean(self) -> float | None:
        return self.total / self.n if self.n else None

    @property
    def std(self) -> float | None:
        if self.n < 2:
            return None
        var = (self.squares - self.total * self.total / self.n) / (self.n - 1)
        return math.sqrt(max(var, 0.0))


@dataclass
class _Cell:
    isd_a: _Moments
    isd_b: _Moments
    ps: _Moments

    @classmethod
    def empty(cls) -> "_Cell":
        return cls(_Moments(), _Moments(), _Moments())

    def merge(self, other: "_Cell") -> None:
        self.isd_a.merge(other.isd_a)
        self.isd_b.merge(other.isd_b)
        self.ps.merge(other.ps)


@dataclass(frozen=True)
class PairStats:
    """What is known about classes ``class_a`` and ``class_b`` sharing a GPU.

    ``isd_a``/``isd_b``: mean slowdown of each side; ``*_spread``: standard deviation (the
    prior's where fewer than two observations); ``count``: observations behind the numbers
    (0: the prior); ``source``: "gpu" (this GPU type), "class-pair" (any GPU) or "prior".
    """

    class_a: int
    class_b: int
    gpu_type: str | None
    isd_a: float
    isd_b: float
    ps: float | None
    count: int
    isd_a_spread: float
    isd_b_spread: float
    ps_spread: float | None
    source: str

    @property
    def speed_a(self) -> float:
        return speed_of(self.isd_a)

    @property
    def speed_b(self) -> float:
        return speed_of(self.isd_b)

    @property
    def pessimistic_speeds(self) -> tuple[float, float]:
        return (speed_of(self.isd_a + self.isd_a_spread), speed_of(self.isd_b + self.isd_b_spread))

    @property
    def spread(self) -> float:
        return max(self.isd_a_spread, self.isd_b_spread)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["speed_a"], out["speed_b"] = round(self.speed_a, 4), round(self.speed_b, 4)
        return out


class KnowledgeBase:
    """ISD/PS per class pair (and GPU type), seeded from published pairs, learning online."""

    def __init__(self, *, threshold: float = DEFAULT_THRESHOLD, classes_digest: str = ""):
        self.threshold = threshold
        self.classes_digest = classes_digest  # which class model the class ids belong to
        self._cells: dict[tuple[int, int, str], _Cell] = {}
        self._prior = _Cell.empty()

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def seeded(cls, classes: ClassModel | None = None, *,
               threshold: float = DEFAULT_THRESHOLD) -> "KnowledgeBase":
        """Seeded with the 34 measured pairs of Ray et al. (``seed_pairs``). With ``classes``,
        each published job is placed in *its* class from its telemetry; without, the paper's
        cluster ids are used."""
        kb = cls(threshold=threshold, classes_digest=classes.digest() if classes else "paper")
        for row in seed_pairs():
            if classes is None:
                class_a, class_b = row["paper_class_a"], row["paper_class_b"]
            else:
                class_a = classes.predict_one(*row["features_a"])
                class_b = classes.predict_one(*row["features_b"])
            kb.observe(class_a, class_b, row["isd_a"], row["isd_b"], ps=row["ps"],
                       gpu_type=ALNAIR_GPU, prior=True)
        return kb

    @classmethod
    def from_store(cls, store, classes: ClassModel | None = None, *,
                   threshold: float = DEFAULT_THRESHOLD) -> "KnowledgeBase":
        """The seeded base plus every co-run in ``store`` that has classes and slowdowns."""
        kb = cls.seeded(classes, threshold=threshold)
        for obs in store.corun_observations():
            if None in (obs["class_a"], obs["class_b"], obs["isd_a"], obs["isd_b"]):
                continue
            kb.observe(obs["class_a"], obs["class_b"], obs["isd_a"], obs["isd_b"],
                       ps=obs["ps"], gpu_type=obs["gpu_type"])
        return kb

    def observe(self, class_a: int, class_b: int, isd_a: float, isd_b: float, *,
                ps: float | None = None, gpu_type: str | None = None,
                prior: bool = False) -> None:
        """Add one measured co-run (ISD as a fraction: 0.15 = 15% slower). ``prior=True`` also
        feeds the pooled prior (the seed does; site observations do not move the prior)."""
        class_a, class_b = int(class_a), int(class_b)
        if class_b < class_a:
            class_a, class_b, isd_a, isd_b = class_b, class_a, isd_b, isd_a
        cell = self._cells.setdefault((class_a, class_b, gpu_type or ANY_GPU), _Cell.empty())
        cell.isd_a.add(isd_a)
        cell.isd_b.add(isd_b)
        cell.ps.add(ps)
        if prior:
            for value in (isd_a, isd_b):
                self._prior.isd_a.add(value)
                self._prior.isd_b.add(value)
            self._prior.ps.add(ps)

    # -- lookup -----------------------------------------------------------------------------
    def pair(self, class_a: int, class_b: int, gpu_type: str | None = None) -> PairStats:
        """Statistics for the pair, oriented so that ``isd_a`` is ``class_a``'s slowdown."""
        a, b = int(class_a), int(class_b)
        swap = b < a
        lo, hi = (b, a) if swap else (a, b)
        cell, source = None, "prior"
        if gpu_type and (lo, hi, gpu_type) in self._cells:
            cell, source = self._cells[(lo, hi, gpu_type)], "gpu"
        else:
            pooled = _Cell.empty()
            for (x, y, _), found in self._cells.items():
                if (x, y) == (lo, hi):
                    pooled.merge(found)
            if pooled.isd_a.n:
                cell, source = pooled, "class-pair"
        prior_spread = self._prior.isd_a.std or 0.0
        if cell is None:
            isd_lo = isd_hi = self._prior.isd_a.mean or 0.0
            spread_lo = spread_hi = prior_spread
            ps, ps_spread, count = self._prior.ps.mean, self._prior.ps.std, 0
        else:
            isd_lo, isd_hi = cell.isd_a.mean, cell.isd_b.mean
            spread_lo = cell.isd_a.std if cell.isd_a.std is not None else prior_spread
            spread_hi = cell.isd_b.std if cell.isd_b.std is not None else prior_spread
            ps = cell.ps.mean
            ps_spread = cell.ps.std if cell.ps.std is not None else self._prior.ps.std
            count = cell.isd_a.n
        if swap:
            isd_lo, isd_hi, spread_lo, spread_hi = isd_hi, isd_lo, spread_hi, spread_lo
        return PairStats(class_a=a, class_b=b, gpu_type=gpu_type, isd_a=isd_lo, isd_b=isd_hi,
                         ps=ps, count=count, isd_a_spread=spread_lo, isd_b_spread=spread_hi,
                         ps_spread=ps_spread, source=source)

    def compatible(self, class_a: int, class_b: int, gpu_type: str | None = None) -> bool:
        """Whether both sides' pessimistic predicted speed is at least ``threshold``."""
        speed_a, speed_b = self.pair(class_a, class_b, gpu_type).pessimistic_speeds
        return speed_a >= self.threshold and speed_b >= self.threshold

    def classes(self) -> list[int]:
        return sorted({c for (a, b, _) in self._cells for c in (a, b)})

    def table(self, gpu_type: str | None = None) -> list[dict[str, Any]]:
        """Every known class pair with its statistics and verdict (for ``kb show``)."""
        out = []
        known = self.classes()
        for i, a in enumerate(known):
            for b in known[i:]:
                stats = self.pair(a, b, gpu_type)
                row = stats.to_dict()
                row["compatible"] = self.compatible(a, b, gpu_type)
                out.append(row)
        return out

    # -- persistence ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        def cell(c: _Cell) -> dict[str, Any]:
            return {name: asdict(getattr(c, name)) for name in ("isd_a", "isd_b", "ps")}

        return {
            "format": KB_FORMAT, "threshold": self.threshold,
            "classes_digest": self.classes_digest, "prior": cell(self._prior),
            "cells": [{"class_a": a, "class_b": b, "gpu_type": g, **cell(c)}
                      for (a, b, g), c in sorted(self._cells.items())],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "KnowledgeBase":
        if data.get("format") != KB_FORMAT:
            raise ValueError(f"not a knowledge base (format {data.get('format')!r})")

        def cell(d) -> _Cell:
            return _Cell(_Moments(**d["isd_a"]), _Moments(**d["isd_b"]), _Moments(**d["ps"]))

        kb = cls(threshold=float(data["threshold"]), classes_digest=data.get("classes_digest", ""))
        kb._prior = cell(data["prior"])
        for c in data["cells"]:
            kb._cells[(int(c["class_a"]), int(c["class_b"]), c["gpu_type"])] = cell(c)
        return kb

    def save(self, path: str | os.PathLike) -> None:
        save_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "KnowledgeBase":
        return cls.from_dict(load_json(path))


def alnair_pairs(classes: ClassModel | None = None) -> pd.DataFrame:
    """The paper's 34 measured pairs with ISD and PS as fractions and each side's class."""
    import pandas as pd

    from slurm_gpushare.predict.datasets import alnair_job_telemetry, load_alnair

    raw = load_alnair("pairs")
    out = pd.DataFrame({
        "task_a": raw["task_a"], "bs_a": raw["bs_a"], "task_b": raw["task_b"],
        "bs_b": raw["bs_b"], "paper_class_a": raw["cluster_a"], "paper_class_b": raw["cluster_b"],
        "isd_a": raw["isd_a_pct"] / 100.0, "isd_b": raw["isd_b_pct"] / 100.0,
        "ps": raw["packing_saving_pct"] / 100.0,
    })
    for side in ("a", "b"):
        jobs = alnair_job_telemetry(pd.DataFrame({"task": out[f"task_{side}"],
                                                  "batch_size": out[f"bs_{side}"]}))
        for feature in ("MGUP", "MGMAP", "MGTSAMP"):
            out[f"{feature}_{side}"] = jobs[feature].to_numpy()
        out[f"class_{side}"] = (classes.predict(jobs) if classes is not None
                                else out[f"paper_class_{side}"]).astype(int)
    return out


SEED_FORMAT = "slurm-gpushare/kb-seed/1"


def seed_pairs() -> list[dict[str, Any]]:
    """The paper's 34 pairs as the knowledge base is seeded with them, read from the packaged
    ``data/models/kb-seed.json`` (no pandas on the daemon's start): ISD and PS as fractions,
    each side's paper class and telemetry (MGUP, MGMAP, MGTSAMP)."""
    from slurm_gpushare.predict.persist import packaged_fit

    data = packaged_fit("kb-seed")
    if data.get("format") != SEED_FORMAT:
        raise ValueError(f"not a knowledge-base seed (format {data.get('format')!r})")
    return data["pairs"]


def fresh_seed_pairs() -> dict[str, Any]:
    """What ``seed_pairs`` reads, computed now from the packaged alnair tables (``persist``
    stores it; a test checks it is current)."""
    return {"format": SEED_FORMAT, "pairs": [
        {"isd_a": float(r.isd_a), "isd_b": float(r.isd_b), "ps": float(r.ps),
         "paper_class_a": int(r.paper_class_a), "paper_class_b": int(r.paper_class_b),
         "features_a": [float(r.MGUP_a), float(r.MGMAP_a), float(r.MGTSAMP_a)],
         "features_b": [float(r.MGUP_b), float(r.MGMAP_b), float(r.MGTSAMP_b)]}
        for r in alnair_pairs().itertuples(index=False)]}


# -- Gavel's telemetry proxy -------------------------------------------------------------------
def gavel_profiles(speed_quantile: float = GAVEL_SPEED_QUANTILE) -> pd.DataFrame:
    """The telemetry proxy of each Gavel job type on each GPU (see the module text):
    columns gpu, job, gpu_util_pct, mem_util_pct (None: not derivable), mem_used_mib (None),
    mem_total_mib."""
    import numpy as np
    import pandas as pd
    from scipy.optimize import nnls

    from slurm_gpushare.predict.datasets import load_gavel_pairs

    pairs = load_gavel_pairs()
    alone = pd.concat([
        pairs[["gpu", "job_a", "tput_a_alone"]].set_axis(["gpu", "job", "tput"], axis=1),
        pairs[["gpu", "job_b", "tput_b_alone"]].set_axis(["gpu", "job", "tput"], axis=1),
    ]).drop_duplicates(["gpu", "job"]).pivot(index="job", columns="gpu", values="tput")
    gpus = [g for g in ("k80", "p100", "v100") if g in alone.columns]
    speedup = alone[gpus].div(alone[gpus[0]], axis=0)
    index = {g: float(np.quantile(speedup[g], speed_quantile)) for g in gpus}
    rows = []
    for job, tput in alone.iterrows():
        design = np.array([[1.0, 1.0 / index[g]] for g in gpus])
        (t_host, work), _ = nnls(design, np.array([1.0 / tput[g] for g in gpus]))
        for g in gpus:
            util = min(1.0, (work / index[g]) * tput[g])
            rows.append({"gpu": g, "job": job, "gpu_util_pct": round(100.0 * util, 2),
                         "mem_util_pct": None, "mem_used_mib": None,
                         "mem_total_mib": GAVEL_MEM_MIB[g]})
    return pd.DataFrame(rows)


def class_of_history(classes: ClassModel, history: Iterable[Mapping[str, Any]]
                     ) -> tuple[int | None, str]:
    """A job's class from its past summaries (``Store.history``): the runs found by the most
    specific key are used, and within them the peak of each feature (the paper's features are
    maxima). Returns ``(class, detail)``, or ``(None, why)`` when nothing usable is there."""
    usable = [s for s in history
              if None not in (s.get("mgup_max"), s.get("mgmap_max_pct"), s.get("mgtsamp_max"))]
    if not usable:
        return None, "no usable telemetry in history"
    best = min(s.get("matched_key", 0) for s in usable)
    runs = [s for s in usable if s.get("matched_key", 0) == best]
    features = [max(s["mgup_max"] for s in runs), max(s["mgmap_max_pct"] for s in runs),
                max(s["mgtsamp_max"] for s in runs)]
    job_class = classes.predict_one(*features)
    level = ("exact script", "job name", "user")[min(best, 2)]
    return job_class, (f"class {job_class} from {len(runs)} earlier run(s) matched by {level} "
                       f"(peak util {features[0]:.0f}%, mem {features[1]:.0f}%, "
                       f"mem-access {features[2]:.0f}%)")
