"""GPU telemetry: one NVML adapter, a scenario provider that replays profiles, and the sampler.

A *provider* answers ``device_indices()``, ``sample(index) -> DeviceSample``,
``job_of_pid(pid)`` and ``close()``. ``open_provider`` picks the scenario provider when a
profile is given (or ``$GPUSHARE_TELEMETRY_SCENARIO`` names one), else a provider named by
``$GPUSHARE_TELEMETRY_PROVIDER``, else real NVML; returns None where none is available (no
driver, no GPU): callers then collect nothing.
"""

from __future__ import annotations

import importlib
import os

from slurm_gpushare.node.telemetry.nvml import DeviceSample, NvmlProvider, ProcessSample, nvml_available
from slurm_gpushare.node.telemetry.scenario import ScenarioProvider

SCENARIO_ENV = "GPUSHARE_TELEMETRY_SCENARIO"
PROVIDER_ENV = "GPUSHARE_TELEMETRY_PROVIDER"

__all__ = ["DeviceSample", "ProcessSample", "NvmlProvider", "ScenarioProvider",
           "open_provider", "nvml_available", "SCENARIO_ENV", "PROVIDER_ENV"]


def open_provider(scenario: str | os.PathLike | None = None, *, job_id: str | None = None):
    """The scenario provider if a profile is named, else NVML if it initialises, else None.

    ``job_id`` is the job being sampled (a scenario's ``job_id = "self"`` processes are its).
    ``$GPUSHARE_TELEMETRY_PROVIDER`` may name another provider as ``module:factory`` (the
    development cluster's fake GPU board is one); ``factory(job_id=...)`` returns it or None.
    """
    scenario = scenario or os.environ.get(SCENARIO_ENV)
    if scenario:
        return ScenarioProvider.from_file(scenario, job_id=job_id)
    named = os.environ.get(PROVIDER_ENV)
    if named:
        module_name, _, factory = named.partition(":")
        return getattr(importlib.import_module(module_name), factory or "provider")(job_id=job_id)
    try:
        return NvmlProvider()
    except Exception:  # noqa: BLE001 -- no driver / no GPU: telemetry is simply absent
        return None
