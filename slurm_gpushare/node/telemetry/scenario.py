"""A fake provider that replays a telemetry profile, so the whole path runs without a GPU.

A profile (JSON, or TOML by the ``.toml`` suffix) lists GPUs, each with phases that follow one
another in time; the last phase holds until the end (or the phases repeat with
``loop = true``)::

    [[gpus]]
    index = 0
    name = "Tesla V100-SXM2-16GB"
    mem_total_mib = 16160
    lost_after_s = 600            # optional: the GPU falls off the bus after this long
    [[gpus.phases]]
    duration_s = 5
    util_gpu = 80                 # any DeviceSample metric; a missing one is None
    util_mem = 35
    mem_used_mib = 9000
    fail = ["sm_clock_mhz"]       # metrics that fail (None) during this phase
    [[gpus.phases.processes]]     # omit "processes" entirely: the process list fails
    pid = 4242
    job_id = "self"               # "self": the job being sampled; else a job id string
    used_mib = 9000
    sm_util = 80
    mem_util = 35

Time is ``clock() - start``; ``clock`` is injectable so tests replay a profile instantly.
"""

from __future__ import annotations

import json
import os
import time
import tomllib
from pathlib import Path
from typing import Any, Callable

from slurm_gpushare.node.telemetry.nvml import DeviceSample, ProcessSample

_METRICS = ("util_gpu", "util_mem", "mem_used_mib", "mem_total_mib", "sm_clock_mhz",
            "gpm_sm_occupancy", "gpm_dram_bw_util")


class ScenarioError(ValueError):
    """A profile that cannot be replayed."""


class ScenarioProvider:
    """Replays a profile as if NVML were reading real GPUs."""

    def __init__(self, profile: dict[str, Any], *, job_id: str | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        gpus = profile.get("gpus")
        if not isinstance(gpus, list) or not gpus:
            raise ScenarioError("profile needs a non-empty 'gpus' list")
        self._gpus: dict[int, dict[str, Any]] = {}
        for position, gpu in enumerate(gpus):
            phases = gpu.get("phases")
            if not isinstance(phases, list) or not phases:
                raise ScenarioError(f"gpus[{position}] needs a non-empty 'phases' list")
            for phase in phases:
                if float(phase.get("duration_s", 1.0)) <= 0:
                    raise ScenarioError("phase duration_s must be positive")
            self._gpus[int(gpu.get("index", position))] = gpu
        self._job_id = job_id
        self._clock = clock
        self._wall = wall
        self._start = clock()
        self._pids: dict[int, str | None] = {}
        for gpu in self._gpus.values():
            for phase in gpu["phases"]:
                for proc in phase.get("processes") or []:
                    self._pids[int(proc["pid"])] = self._resolve(proc.get("job_id"))

    @classmethod
    def from_file(cls, path: str | os.PathLike, **kwargs) -> "ScenarioProvider":
        path = Path(path)
        try:
            if path.suffix == ".toml":
                profile = tomllib.loads(path.read_text())
            else:
                profile = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ScenarioError(f"cannot read scenario {path}: {exc}") from None
        return cls(profile, **kwargs)

    def _resolve(self, job_id) -> str | None:
        if job_id == "self":
            return self._job_id
        return None if job_id is None else str(job_id)

    # -- provider interface -------------------------------------------------------------
    def device_indices(self) -> list[int]:
        return sorted(self._gpus)

    def index_of(self, ident: str) -> int | None:
        if ident.isdigit():
            return int(ident)
        for index, gpu in self._gpus.items():
            if gpu.get("uuid") == ident:
                return index
        return None

    def job_of_pid(self, pid: int) -> str | None:
        return self._pids.get(pid)

    def sample(self, index: int) -> DeviceSample:
        now = self._wall()
        gpu = self._gpus.get(index)
        if gpu is None:
            return DeviceSample(index=index, ts=now, lost=True, error="gpu-not-found")
        elapsed = self._clock() - self._start
        lost_after = gpu.get("lost_after_s")
        if lost_after is not None and elapsed >= float(lost_after):
            return DeviceSample(index=index, ts=now, lost=True, error="gpu-lost")
        phase = self._phase(gpu, elapsed)
        failing = set(phase.get("fail", ()))
        values = {m: (None if m in failing else _num(phase.get(m, gpu.get(m)))) for m in _METRICS}
        processes = None
        if "processes" in phase and "processes" not in failing:
            processes = tuple(
                ProcessSample(pid=int(p["pid"]), used_mib=_num(p.get("used_mib")),
                              sm_util=_num(p.get("sm_util")), mem_util=_num(p.get("mem_util")))
                for p in phase["processes"]
            )
        return DeviceSample(index=index, ts=now, uuid=gpu.get("uuid", f"GPU-scenario-{index}"),
                            name=gpu.get("name"), processes=processes, **values)

    def close(self) -> None:
        pass

    @staticmethod
    def _phase(gpu: dict[str, Any], elapsed: float) -> dict[str, Any]:
        phases = gpu["phases"]
        durations = [float(p.get("duration_s", 1.0)) for p in phases]
        if gpu.get("loop"):
            elapsed %= sum(durations)
        for phase, duration in zip(phases, durations):
            if elapsed < duration:
                return phase
            elapsed -= duration
        return phases[-1]


def _num(value) -> float | None:
    return None if value is None else float(value)
