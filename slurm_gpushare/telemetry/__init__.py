"""GPU telemetry: one NVML adapter, a scenario provider that replays profiles, and the sampler.

A *provider* answers ``device_indices()``, ``sample(index) -> DeviceSample``,
``job_of_pid(pid)`` and ``close()``. ``open_provider`` picks the scenario provider when a
profile is given (or ``$GPUSHARE_TELEMETRY_SCENARIO`` names one), real NVML otherwise, and
on the local test cluster the fake-GPU board ($GPUSHARE_FAKEGPU_ROOT); returns None where
none is available (no driver, no GPU): callers then collect nothing.
"""

from __future__ import annotations

import os

from .nvml import DeviceSample, NvmlProvider, ProcessSample, nvml_available
from .scenario import ScenarioProvider

SCENARIO_ENV = "GPUSHARE_TELEMETRY_SCENARIO"

__all__ = ["DeviceSample", "ProcessSample", "NvmlProvider", "ScenarioProvider",
           "open_provider", "nvml_available", "SCENARIO_ENV"]


def open_provider(scenario: str | os.PathLike | None = None, *, job_id: str | None = None):
    """The scenario provider if a profile is named, else NVML if it initialises, else None.

    ``job_id`` is the job being sampled (a scenario's ``job_id = "self"`` processes are its).
    """
    scenario = scenario or os.environ.get(SCENARIO_ENV)
    if scenario:
        return ScenarioProvider.from_file(scenario, job_id=job_id)
    fake_root, node = os.environ.get("GPUSHARE_FAKEGPU_ROOT"), os.environ.get("SLURMD_NODENAME")
    if fake_root and node:  # the local test cluster's fake GPUs
        from .fakegpu import FakeGpuProvider

        return FakeGpuProvider(fake_root, node)
    try:
        return NvmlProvider()
    except Exception:  # noqa: BLE001 -- no driver / no GPU: telemetry is simply absent
        return None
