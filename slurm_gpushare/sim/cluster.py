"""Cluster specs: a small TOML file naming GPU types and node groups.

    name = "local"
    partition = "gpu"              # the sharing partition jobs are submitted to
    reference_gpu = "v100"         # trace durations are solo run times on this type
    max_jobs_per_gpu = 2           # co-location cap for sharing policies

    [gpu_types.v100]
    memory_gib = 16
    speed_profile = "v100"         # Gavel column for per-type throughput and pair speeds
    memory_profile = "V100"        # SchedTune GPU whose peak-memory column the type uses
    model = "V100-16GB"            # optional; catalogue model for predictors

    [[nodes]]
    prefix = "v"                   # names v1, v2, ...
    count = 2
    gpus = 2
    type = "v100"
    weight = 1                     # Slurm node Weight: lower is allocated first

Nodes are ordered as Slurm orders them for allocation: by weight, then as listed.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

SPEED_PROFILES = ("k80", "p100", "v100")
MEMORY_PROFILES = ("K80", "RTX2070S", "V100", "RTX3070", "RTX3090")


class ClusterSpecError(ValueError):
    """A cluster spec that cannot be used."""


@dataclass(frozen=True)
class GpuTypeSpec:
    name: str
    memory_gib: int
    speed_profile: str
    memory_profile: str
    model: str = ""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpu_type: int  # index into Cluster.types
    gpus: int
    weight: int


@dataclass(frozen=True)
class Cluster:
    name: str
    types: tuple[GpuTypeSpec, ...]
    nodes: tuple[NodeSpec, ...]
    partition: str = "gpu"
    reference_gpu: str = ""
    max_jobs_per_gpu: int = 2
    description: str = ""
    # Flat per-GPU arrays (GPU g lives on node gpu_node[g]), filled in __post_init__.
    gpu_node: np.ndarray = field(default=None, repr=False)
    gpu_type: np.ndarray = field(default=None, repr=False)
    gpu_mem_gib: np.ndarray = field(default=None, repr=False)
    node_first_gpu: np.ndarray = field(default=None, repr=False)

    def __post_init__(self):
        counts = [n.gpus for n in self.nodes]
        object.__setattr__(self, "gpu_node", np.repeat(np.arange(len(self.nodes)), counts))
        object.__setattr__(self, "gpu_type",
                           np.repeat([n.gpu_type for n in self.nodes], counts).astype(int))
        mem = np.array([t.memory_gib for t in self.types])
        object.__setattr__(self, "gpu_mem_gib", mem[self.gpu_type])
        object.__setattr__(self, "node_first_gpu", np.concatenate([[0], np.cumsum(counts)[:-1]]))

    @property
    def n_gpus(self) -> int:
        return len(self.gpu_node)

    @property
    def type_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.types)

    def type_index(self, name: str) -> int:
        for i, t in enumerate(self.types):
            if t.name == name:
                return i
        raise ClusterSpecError(f"unknown GPU type {name!r}")

    def summary(self) -> str:
        parts = []
        for i, t in enumerate(self.types):
            nodes = [n for n in self.nodes if n.gpu_type == i]
            parts.append(f"{sum(n.gpus for n in nodes)} x {t.name} ({t.memory_gib} GiB) "
                         f"on {len(nodes)} nodes")
        return f"{self.name}: " + ", ".join(parts)


def parse_cluster(raw: dict, name: str = "") -> Cluster:
    known = {"name", "description", "partition", "reference_gpu", "max_jobs_per_gpu",
             "gpu_types", "nodes"}
    unknown = set(raw) - known
    if unknown:
        raise ClusterSpecError(f"unknown key(s): {', '.join(sorted(unknown))}")
    types = []
    for tname, spec in raw.get("gpu_types", {}).items():
        extra = set(spec) - {"memory_gib", "speed_profile", "memory_profile", "model"}
        if extra:
            raise ClusterSpecError(f"unknown key(s) in [gpu_types.{tname}]: {', '.join(sorted(extra))}")
        memory = spec.get("memory_gib")
        if not isinstance(memory, int) or memory <= 0:
            raise ClusterSpecError(f"[gpu_types.{tname}] memory_gib must be a positive integer")
        speed = spec.get("speed_profile", tname)
        if speed not in SPEED_PROFILES:
            raise ClusterSpecError(f"[gpu_types.{tname}] speed_profile must be one of "
                                   f"{', '.join(SPEED_PROFILES)}")
        mem_profile = spec.get("memory_profile", "V100")
        if mem_profile not in MEMORY_PROFILES:
            raise ClusterSpecError(f"[gpu_types.{tname}] memory_profile must be one of "
                                   f"{', '.join(MEMORY_PROFILES)}")
        types.append(GpuTypeSpec(tname, memory, speed, mem_profile, spec.get("model", "")))
    if not types:
        raise ClusterSpecError("no [gpu_types]")
    type_ids = {t.name: i for i, t in enumerate(types)}
    groups = raw.get("nodes", [])
    if not groups:
        raise ClusterSpecError("no [[nodes]]")
    listed = []
    for k, group in enumerate(groups):
        extra = set(group) - {"prefix", "count", "gpus", "type", "weight"}
        if extra:
            raise ClusterSpecError(f"unknown key(s) in [[nodes]] #{k + 1}: {', '.join(sorted(extra))}")
        if group.get("type") not in type_ids:
            raise ClusterSpecError(f"[[nodes]] #{k + 1}: type must be one of {', '.join(type_ids)}")
        count, gpus = group.get("count", 1), group.get("gpus", 1)
        if not (isinstance(count, int) and count > 0 and isinstance(gpus, int) and gpus > 0):
            raise ClusterSpecError(f"[[nodes]] #{k + 1}: count and gpus must be positive integers")
        prefix = group.get("prefix", group["type"])
        for i in range(count):
            listed.append((group.get("weight", 1), k, i,
                           NodeSpec(f"{prefix}{i + 1}", type_ids[group["type"]], gpus,
                                    group.get("weight", 1))))
    names = [n.name for *_, n in listed]
    if len(set(names)) != len(names):
        raise ClusterSpecError("node names are not unique (give each [[nodes]] its own prefix)")
    nodes = tuple(n for *_, n in sorted(listed, key=lambda x: x[:3]))
    reference = raw.get("reference_gpu", types[0].name)
    if reference not in type_ids:
        raise ClusterSpecError(f"reference_gpu {reference!r} is not a configured type")
    cap = raw.get("max_jobs_per_gpu", 2)
    if not isinstance(cap, int) or cap < 1:
        raise ClusterSpecError("max_jobs_per_gpu must be a positive integer")
    return Cluster(name=raw.get("name", name), types=tuple(types), nodes=nodes,
                   partition=raw.get("partition", "gpu"), reference_gpu=reference,
                   max_jobs_per_gpu=cap, description=raw.get("description", ""))


def builtin_specs() -> list[str]:
    root = resources.files("slurm_gpushare") / "data" / "clusters"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".toml"))


def load_cluster(spec: str) -> Cluster:
    """Load a spec from a path, or a built-in one by name (``philly``, ``openb``, ``local``)."""
    path = Path(spec)
    if path.suffix != ".toml" or not path.exists():
        builtin = resources.files("slurm_gpushare") / "data" / "clusters" / f"{spec}.toml"
        if not builtin.is_file():
            raise ClusterSpecError(f"no cluster spec {spec!r} (a .toml file or one of "
                                   f"{', '.join(builtin_specs())})")
        text, name = builtin.read_text(), spec
    else:
        text, name = path.read_text(), path.stem
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ClusterSpecError(f"{spec}: {exc}") from None
    return parse_cluster(raw, name)
