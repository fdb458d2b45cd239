"""Interference models: how fast co-located jobs run, as a fraction of their speed alone.

A model answers ``speeds(profile, kinds, classes)`` for the jobs sharing one GPU: a list of
normalised speeds (shared / alone, 1.0 = no slowdown), or ``None`` when the co-run does not work
at all. Two ground truths are provided, and the policies' own knowledge is a ``ClassPairTable``
(speeds by interference class, which is all the daemon can know about a job):

- ``GavelPairs``: Gavel's measured throughputs (OSDI'20, ``gavel/simulation_throughputs.json``)
  on K80, P100 and V100, by job type, pairs at scale 1. A pair recorded as ``[0, 0]`` failed to
  co-run in Gavel's harness (out of memory there); since whether a co-run fits is the memory
  model's call in the simulator, such pairs get a speed filled in from the measured ones
  (``failed_pairs="fail"``: the model answers ``None``, "does not fit").
  On V100, 69 pairs have a shared throughput exactly equal to the alone value: such entries
  look filled in, not measured, so they take the median measured speed on that GPU instead.
- ``ClassPairs``: speeds by class pair, from a ``ClassPairTable``: Ray et al.'s measured pairs
  (alnair, Tables III/IV, speed = 1 / (1 + ISD)), Gavel's pairs averaged by class, or the
  project's knowledge base.

More than two co-runners (no published measurements): slowdowns compound independently, so a
job's speed is the product of its pairwise speeds with each co-runner. With the pair speeds
measured here (mostly 0.4-0.9) this makes a third co-runner clearly costly, as MPS/time-slicing
measurements show.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
import pandas as pd

from slurm_gpushare.predict.datasets import load_alnair, load_gavel_throughputs
from slurm_gpushare.sim.cluster import SPEED_PROFILES

N_CLASSES = 3


class InterferenceModel(Protocol):
    name: str

    def speeds(self, profile: int, kinds: Sequence[int],
               classes: Sequence[int]) -> list[float] | None: ...


@dataclass(frozen=True)
class GavelData:
    kinds: tuple[str, ...]  # Gavel job types, e.g. "ResNet-50 (batch size 64)"
    alone: np.ndarray  # (profile, kind) steps/s alone, scale 1
    pair: np.ndarray  # (profile, kind a, kind b): speed of a next to b; NaN = failed co-run
    filled: int  # ordered pair entries replaced because they looked filled in

    @property
    def n_kinds(self) -> int:
        return len(self.kinds)


def _key(text: str) -> tuple[str, int]:
    return ast.literal_eval(text)


@functools.lru_cache(maxsize=4)
def load_gavel(data_dir: str) -> GavelData:
    raw = load_gavel_throughputs(data_dir)
    kinds = sorted({_key(k)[0] for k in raw["v100"] if _key(k)[1] == 1})
    index = {k: i for i, k in enumerate(kinds)}
    n, profiles = len(kinds), SPEED_PROFILES
    alone = np.zeros((len(profiles), n))
    pair = np.full((len(profiles), n, n), np.nan)
    filled = 0
    for p, gpu in enumerate(profiles):
        for key, entry in raw[gpu].items():
            name, scale = _key(key)
            if scale != 1:
                continue
            a = index[name]
            alone[p, a] = entry["null"]
        for key, entry in raw[gpu].items():
            name, scale = _key(key)
            if scale != 1:
                continue
            a = index[name]
            for other, value in entry.items():
                if other == "null":
                    continue
                b = index[_key(other)[0]]
                if value[0] == 0 and value[1] == 0:
                    continue  # failed co-run: stays NaN
                pair[p, a, b] = value[0] / alone[p, a]
        # Exactly equal to alone: filled in, not measured.
        equal = pair[p] == 1.0
        filled += int(equal.sum())
        measured = pair[p][~equal & ~np.isnan(pair[p])]
        pair[p][equal] = np.median(measured)
    return GavelData(tuple(kinds), alone, pair, filled)


def gavel_classes(gavel: GavelData) -> np.ndarray:
    """Interference class of each Gavel job type: terciles of the pressure it puts on partners.

    Pressure = 1 - mean speed of the partners co-located with it (all GPUs, measured pairs;
    failed pairs count as speed 0). Class 0 is the lightest, class 2 the heaviest. This stands in
    for the telemetry classifier (K-means over max GPU utilisation / memory / memory-access
    time), which a trace without telemetry cannot run.
    """
    partner_speed = np.nan_to_num(gavel.pair, nan=0.0).mean(axis=(0, 1))
    order = np.argsort(-partner_speed, kind="stable")
    classes = np.empty(gavel.n_kinds, int)
    classes[order] = np.arange(gavel.n_kinds) * N_CLASSES // gavel.n_kinds
    return classes


class GavelPairs:
    """Ground truth from Gavel's measured pairs (see the module docstring)."""

    name = "gavel"

    def __init__(self, gavel: GavelData, *, failed_pairs: str = "fill"):
        # Gavel's [0, 0] pairs failed in Gavel's harness (out of memory there); in the simulator
        # whether a co-run fits is the memory model's call (each job's own peak memory), so by
        # default such a pair gets a speed instead: a rank-1 fill from what was measured,
        # speed(a next to b) = mean speed of a with any partner x mean speed of b's partners
        # / the GPU's mean speed. ``failed_pairs="fail"`` keeps them as failing co-runs.
        if failed_pairs not in ("fill", "fail"):
            raise ValueError("failed_pairs must be 'fill' or 'fail'")
        pair = gavel.pair.copy()
        if failed_pairs == "fill":
            for p in range(pair.shape[0]):
                table = pair[p]
                missing = np.isnan(table)
                if not missing.any():
                    continue
                mean = np.nanmean(table)
                counts = (~missing).sum(axis=1), (~missing).sum(axis=0)
                sums = np.nansum(table, axis=1), np.nansum(table, axis=0)
                # How fast a runs next to anyone, how fast anyone runs next to b (a kind that
                # failed with every partner on this GPU: the GPU's mean).
                suffers = np.where(counts[0] > 0, sums[0] / np.maximum(counts[0], 1), mean)
                hurts = np.where(counts[1] > 0, sums[1] / np.maximum(counts[1], 1), mean)
                fill = np.clip(np.outer(suffers, hurts) / mean, 0.05, 1.0)
                table[missing] = fill[missing]
        self.pair = pair
        self.failed_pairs = failed_pairs

    def speeds(self, profile, kinds, classes):
        if len(kinds) == 1:
            return [1.0]
        table = self.pair[profile]
        out = []
        for i, a in enumerate(kinds):
            speed = 1.0
            for j, b in enumerate(kinds):
                if i != j:
                    s = table[a, b]
                    if s != s:  # NaN: the pair failed to co-run
                        return None
                    speed *= s
            out.append(speed)
        return out


@dataclass(frozen=True)
class ClassPairTable:
    """Normalised speed of a class-``a`` job next to a class-``b`` job, per speed profile."""

    speed: np.ndarray  # (profile, class a, class b)
    source: str

    def pair_speed(self, profile: int, a: int, b: int) -> float:
        return float(self.speed[profile, a, b])

    def benefit(self, profile: int, a: int, b: int) -> float:
        """Throughput gained by co-locating (sum of speeds - 1); > 0 means sharing helps."""
        return float(self.speed[profile, a, b] + self.speed[profile, b, a] - 1.0)

    def compatible(self, profile: int, a: int, b: int, *, min_speed: float = 0.5,
                   min_benefit: float = 0.05) -> bool:
        """Ray et al.'s rule in speed terms: both ISDs bounded and a positive packing saving."""
        return (self.speed[profile, a, b] >= min_speed and self.speed[profile, b, a] >= min_speed
                and self.benefit(profile, a, b) >= min_benefit)

    def mean_speed(self, profile: int) -> float:
        return float(self.speed[profile].mean())

    @classmethod
    def from_gavel(cls, gavel: GavelData, classes: np.ndarray) -> "ClassPairTable":
        """Mean measured speeds between the Gavel job types of each class pair (failed = 0)."""
        speed = np.zeros((len(SPEED_PROFILES), N_CLASSES, N_CLASSES))
        pair = np.nan_to_num(gavel.pair, nan=0.0)
        for a in range(N_CLASSES):
            for b in range(N_CLASSES):
                block = pair[:, classes == a][:, :, classes == b]
                speed[:, a, b] = block.mean(axis=(1, 2))
        return cls(speed, "gavel pairs by class")

    @classmethod
    def from_alnair(cls, data_dir: str) -> "ClassPairTable":
        """Ray et al.'s 34 measured pairs (P100), speed = 1/(1+ISD), applied to every GPU.

        Their cluster ids are renumbered by the pressure they put on partners (0 lightest),
        the same order as ``gavel_classes``.
        """
        pairs = load_alnair("pairs", data_dir)
        rows = []
        for _, r in pairs.iterrows():
            rows.append((r.cluster_a, r.cluster_b, 1 / (1 + r.isd_a_pct / 100)))
            rows.append((r.cluster_b, r.cluster_a, 1 / (1 + r.isd_b_pct / 100)))
        frame = pd.DataFrame(rows, columns=["a", "b", "speed"])
        pressure = frame.groupby("b").speed.mean()  # speed partners keep next to cluster b
        rank = {c: i for i, c in enumerate(pressure.sort_values(ascending=False).index)}
        table = frame.assign(a=frame.a.map(rank), b=frame.b.map(rank)).groupby(["a", "b"]).speed.mean()
        speed = np.ones((N_CLASSES, N_CLASSES))
        for (a, b), value in table.items():
            speed[a, b] = value
        return cls(np.broadcast_to(speed, (len(SPEED_PROFILES), N_CLASSES, N_CLASSES)).copy(),
                   "alnair measured pairs")

    @classmethod
    def from_knowledge_base(cls, kb, profile_types: Sequence[str | None]) -> "ClassPairTable":
        """Speeds from the project's knowledge base: ``kb.pair(a, b, gpu_type)`` -> ISDs."""
        speed = np.ones((len(SPEED_PROFILES), N_CLASSES, N_CLASSES))
        for p, gpu_type in enumerate(profile_types):
            for a in range(N_CLASSES):
                for b in range(N_CLASSES):
                    stats = kb.pair(a, b, gpu_type=gpu_type)
                    isd = getattr(stats, "isd_a", None)
                    if isd is not None and isd == isd:
                        speed[p, a, b] = 1 / (1 + max(float(isd), 0.0))
        return cls(speed, "knowledge base")


class ClassPairs:
    """Ground truth by class pair (see the module docstring)."""

    def __init__(self, table: ClassPairTable, name: str = "classes"):
        self.table = table
        self.name = name

    def speeds(self, profile, kinds, classes):
        table = self.table.speed[profile]
        out = []
        for i, a in enumerate(classes):
            speed = 1.0
            for j, b in enumerate(classes):
                if i != j:
                    speed *= table[a, b]
            out.append(float(speed))
        return out


def make_model(name: str, data_dir: str) -> InterferenceModel:
    """``gavel`` (measured pairs by job type) or ``alnair`` (measured pairs by class)."""
    if name == "gavel":
        return GavelPairs(load_gavel(str(data_dir)))
    if name == "alnair":
        return ClassPairs(ClassPairTable.from_alnair(str(data_dir)), "alnair")
    raise ValueError(f"unknown interference model {name!r} (gavel or alnair)")
