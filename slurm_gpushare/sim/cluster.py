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
# 2^20: several times the largest GPU clusters (~10^5 GPUs); a typo such as
# count = 99999999999 is an error, not hours spent listing nodes.
MAX_GPUS = 1 << 20


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


def _integer(value, key: str, minimum: int) -> int:
    # TOML booleans are Python ints: ``gpus = true`` must not read as 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ClusterSpecError(f"{key} must be an integer >= {minimum}, not {value!r}")
    return value


def _string(value, key: str) -> str:
    if not isinstance(value, str):
        raise ClusterSpecError(f"{key} must be a string, not {value!r}")
    return value


def parse_cluster(raw: dict, name: str = "") -> Cluster:
    known = {"name", "description", "partition", "reference_gpu", "max_jobs_per_gpu",
             "gpu_types", "nodes"}
    unknown = set(raw) - known
    if unknown:
        raise ClusterSpecError(f"unknown key(s): {', '.join(sorted(unknown))}")
    for key in ("name", "description", "partition", "reference_gpu"):
        if key in raw:
            _string(raw[key], key)
    gpu_types = raw.get("gpu_types", {})
    if not isinstance(gpu_types, dict):
        raise ClusterSpecError("gpu_types must be [gpu_types.NAME] tables")
    types = []
    for tname, spec in gpu_types.items():
        if not isinstance(spec, dict):
            raise ClusterSpecError(f"[gpu_types.{tname}] must be a table")
        extra = set(spec) - {"memory_gib", "speed_profile", "memory_profile", "model"}
        if extra:
            raise ClusterSpecError(f"unknown key(s) in [gpu_types.{tname}]: {', '.join(sorted(extra))}")
        memory = _integer(spec.get("memory_gib"), f"[gpu_types.{tname}] memory_gib", 1)
        speed = spec.get("speed_profile", tname)
        if speed not in SPEED_PROFILES:
            raise ClusterSpecError(f"[gpu_types.{tname}] speed_profile must be one of "
                                   f"{', '.join(SPEED_PROFILES)}")
        mem_profile = spec.get("memory_profile", "V100")
        if mem_profile not in MEMORY_PROFILES:
            raise ClusterSpecError(f"[gpu_types.{tname}] memory_profile must be one of "
                                   f"{', '.join(MEMORY_PROFILES)}")
        model = _string(spec.get("model", ""), f"[gpu_types.{tname}] model")
        types.append(GpuTypeSpec(tname, memory, speed, mem_profile, model))
    if not types:
        raise ClusterSpecError("no [gpu_types]")
    type_ids = {t.name: i for i, t in enumerate(types)}
    groups = raw.get("nodes", [])
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise ClusterSpecError("nodes must be an array of tables: write [[nodes]], not [nodes]")
    if not groups:
        raise ClusterSpecError("no [[nodes]]")
    listed, total = [], 0
    for k, group in enumerate(groups):
        where = f"[[nodes]] #{k + 1}"
        extra = set(group) - {"prefix", "count", "gpus", "type", "weight"}
        if extra:
            raise ClusterSpecError(f"unknown key(s) in {where}: {', '.join(sorted(extra))}")
        gpu_type = group.get("type")
        if not isinstance(gpu_type, str) or gpu_type not in type_ids:
            raise ClusterSpecError(f"{where}: type must be one of {', '.join(type_ids)}")
        count = _integer(group.get("count", 1), f"{where}: count", 1)
        gpus = _integer(group.get("gpus", 1), f"{where}: gpus", 1)
        weight = _integer(group.get("weight", 1), f"{where}: weight", 0)  # Slurm's node Weight
        prefix = _string(group.get("prefix", gpu_type), f"{where}: prefix")
        total += count * gpus
        if total > MAX_GPUS:
            raise ClusterSpecError(f"{where}: count x gpus takes the cluster past {MAX_GPUS} GPUs")
        for i in range(count):
            listed.append((weight, k, i,
                           NodeSpec(f"{prefix}{i + 1}", type_ids[gpu_type], gpus, weight)))
    names = [n.name for *_, n in listed]
    if len(set(names)) != len(names):
        raise ClusterSpecError("node names are not unique (give each [[nodes]] its own prefix)")
    nodes = tuple(n for *_, n in sorted(listed, key=lambda x: x[:3]))
    reference = raw.get("reference_gpu", types[0].name)
    if reference not in type_ids:
        raise ClusterSpecError(f"reference_gpu {reference!r} is not a configured type")
    cap = _integer(raw.get("max_jobs_per_gpu", 2), "max_jobs_per_gpu", 1)
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
        try:
            text, name = path.read_text(), path.stem
        except (OSError, UnicodeDecodeError) as exc:
            raise ClusterSpecError(f"{spec}: cannot read it ({exc})") from None
    try:
        return parse_cluster(tomllib.loads(text), name)
    except (tomllib.TOMLDecodeError, ClusterSpecError) as exc:
        raise ClusterSpecError(f"{spec}: {exc}") from None
