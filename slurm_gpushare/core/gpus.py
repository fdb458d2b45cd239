"""GPU catalogue: the characteristics the predictors use, per GPU model.

The facts live in ``data/gpus.csv`` (one cited source per row). A configured type whose model
the catalogue lacks gets a stand-in that knows only its configured memory (``for_gpu_type``),
and ``check-config`` warns. Names are looked up the way NVML and
admins write them: ``"v100"``, ``"Tesla V100-SXM2-16GB"``, ``"NVIDIA A100 80GB PCIe"``; a family
with several memory sizes (V100, A100) is resolved by the memory in the name or the one given.
"""

from __future__ import annotations

import csv
import functools
import io
import math
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Iterable

NUMERIC_FIELDS = ("cuda_cores", "tensor_cores", "sm_count", "memory_gib", "memory_bandwidth_gbs",
                  "memory_clock_mhz", "boost_clock_mhz", "ecc_reserved_fraction")


class UnknownGpu(KeyError):
    """A name that matches no catalogue model, or several."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass(frozen=True)
class GpuSpec:
    model: str
    family: str
    architecture: str
    compute_capability: str
    cuda_cores: int
    tensor_cores: int
    sm_count: int
    memory_gib: float
    memory_type: str
    memory_bandwidth_gbs: float
    memory_clock_mhz: float
    boost_clock_mhz: float
    ecc_reserved_fraction: float = 0.0
    source: str = ""

    @property
    def usable_mib(self) -> float:
        """Memory a job can use with the default ECC setting (before the CUDA context)."""
        return self.memory_gib * 1024 * (1 - self.ecc_reserved_fraction)

    @property
    def fp32_tflops(self) -> float:
        return 2 * self.cuda_cores * self.boost_clock_mhz / 1e6

    @property
    def cc(self) -> float:
        return float(self.compute_capability)

    def features(self) -> list[float]:
        """Numeric characteristics for the learned models (SchedTune's five, plus memory)."""
        return [self.cuda_cores, self.memory_bandwidth_gbs, self.memory_clock_mhz,
                self.tensor_cores, self.sm_count, self.memory_gib]


def _normalise(name: str) -> tuple[str, float | None]:
    """``"Tesla V100-SXM2-32GB"`` -> ``("v100", 32.0)``."""
    text = name.lower().replace("super", " super")
    memory = None
    found = re.search(r"(\d+)\s*gb", text)
    if found:
        memory = float(found.group(1))
        text = text[:found.start()] + text[found.end():]
    # Words NVML and admins put around the model name that say nothing about the chip.
    text = re.sub(r"nvidia|tesla|geforce|sxm\d?|pcie|nvl|hbm\d?e?|[\s_\-]+", "", text)
    return text, memory


class Catalogue:
    """Lookup of ``GpuSpec`` by model key, NVML name or family alias."""

    def __init__(self, specs: Iterable[GpuSpec]):
        self._specs = {spec.model: spec for spec in specs}
        self._found: dict[tuple[str, float | None], GpuSpec] = {}  # lookups already resolved

    def __iter__(self):
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def __contains__(self, name: str) -> bool:
        try:
            self.lookup(name)
        except UnknownGpu:
            return False
        return True

    @property
    def models(self) -> list[str]:
        return list(self._specs)

    def lookup(self, name: str, memory_gib: float | None = None) -> GpuSpec:
        """The spec for ``name``; ``memory_gib`` picks among a family's memory sizes."""
        if name in self._specs:
            return self._specs[name]
        found = self._found.get((name, memory_gib))
        if found is None:
            found = self._found[(name, memory_gib)] = self._resolve(name, memory_gib)
        return found

    def _resolve(self, name: str, memory_gib: float | None) -> GpuSpec:
        for spec in self._specs.values():
            if spec.model.lower() == name.lower():
                return spec
        family, named_memory = _normalise(name)
        memory = named_memory if named_memory is not None else memory_gib
        candidates = [s for s in self._specs.values()
                      if s.family == family or _normalise(s.model)[0] == family]
        if not candidates:
            raise UnknownGpu(f"unknown GPU model {name!r} (known: {', '.join(self._specs)})")
        if len(candidates) == 1:
            return candidates[0]
        if memory is None:
            raise UnknownGpu(f"GPU model {name!r} is ambiguous "
                             f"({', '.join(s.model for s in candidates)}); give its memory")
        # Configs give usable memory (e.g. 15 for a 16 GiB card): take the nearest size.
        return min(candidates, key=lambda s: abs(math.log(s.memory_gib / max(memory, 0.5))))

    def for_gpu_type(self, gpu_type) -> GpuSpec:
        """The spec of a config ``GpuType`` (its ``model``, resolved with its memory). For a
        model the catalogue lacks (a GPU newer than it), a stand-in that knows only the
        configured memory: the job's own runs there size its shares, and nothing carries over
        to or from other types (the predictors look it up and find nothing)."""
        try:
            return self.lookup(gpu_type.model or gpu_type.name, memory_gib=gpu_type.memory_gib)
        except UnknownGpu:
            return GpuSpec(model=gpu_type.model or gpu_type.name, family="", architecture="",
                           compute_capability="0", cuda_cores=0, tensor_cores=0, sm_count=0,
                           memory_gib=float(gpu_type.memory_gib), memory_type="",
                           memory_bandwidth_gbs=0.0, memory_clock_mhz=0.0, boost_clock_mhz=0.0,
                           source="the site's configuration (not in the catalogue)")

    def configured_type(self, name: str, gpu_types: Iterable) -> Any | None:
        """The config ``GpuType`` an NVML or catalogue model name stands for: the one whose
        spec it resolves to, or, for a GPU the catalogue lacks, the one whose name or model
        reads the same (``NVIDIA B200`` is ``b200``); None if none."""
        try:
            model = self.lookup(name).model
        except UnknownGpu:
            model = None
        for gpu_type in gpu_types:
            if model is not None and self.for_gpu_type(gpu_type).model == model:
                return gpu_type
            if model is None and _normalise(name) == _normalise(gpu_type.model or gpu_type.name):
                return gpu_type
        return None


def _coerce(name: str, value: Any) -> Any:
    if name in ("cuda_cores", "tensor_cores", "sm_count"):
        return int(value)
    if name in NUMERIC_FIELDS:
        return float(value)
    return str(value)


def parse_catalogue(text: str) -> Catalogue:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    specs = []
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        specs.append(GpuSpec(**{k: _coerce(k, v) for k, v in row.items()}))
    return Catalogue(specs)


@functools.lru_cache(maxsize=1)
def default_catalogue() -> Catalogue:
    """The packaged catalogue (``slurm_gpushare/data/gpus.csv``)."""
    text = resources.files("slurm_gpushare").joinpath("data/gpus.csv").read_text()
    return parse_catalogue(text)
