"""Real NVML: runs wherever a GPU and driver are present, skipped (with the reason) elsewhere."""

from __future__ import annotations

import threading

import pytest

from slurm_gpushare.node.telemetry.nvml import NvmlProvider, nvml_available
from slurm_gpushare.node.telemetry.sampler import JobSampler

AVAILABLE, WHY = nvml_available()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not AVAILABLE, reason=f"no GPU/driver: nvmlInit failed ({WHY})")]


def test_real_device_sample():
    provider = NvmlProvider()
    try:
        indices = provider.device_indices()
        assert indices, "NVML initialised but reports no device"
        s = provider.sample(indices[0])
        assert not s.lost
        assert s.name and s.uuid and s.uuid.startswith(("GPU-", "MIG-"))
        assert s.mem_total_mib and s.mem_total_mib > 1024
        assert s.mem_used_mib is not None and 0 <= s.mem_used_mib <= s.mem_total_mib
        assert s.util_gpu is None or 0 <= s.util_gpu <= 100
        assert s.processes is None or all(p.pid > 0 for p in s.processes)
        assert provider.index_of(s.uuid) == indices[0]
    finally:
        provider.close()


def test_real_sampler_summary():
    provider = NvmlProvider()
    try:
        sampler = JobSampler(provider, "1", [provider.device_indices()[0]], interval_s=0.05)
        stop = threading.Event()
        threading.Timer(0.6, stop.set).start()
        sampler.run(stop)
        (s,) = sampler.summaries()
        assert s["samples"] >= 3 and s["gpu_model"] and "gpu-lost" not in s["conditions"]
        assert s["mgmap_max_pct"] is not None and 0 <= s["mgmap_max_pct"] <= 100
        # GPM (Hopper and newer): a number when the device supports it, else None
        assert s["gpm_sm_occupancy_mean"] is None or 0 <= s["gpm_sm_occupancy_mean"] <= 100
    finally:
        provider.close()
