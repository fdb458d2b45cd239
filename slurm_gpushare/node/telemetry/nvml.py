"""The one adapter over NVML (``nvidia-ml-py``, import name ``pynvml``).

Every metric is read on its own: one that fails (unsupported on this GPU, driver too old,
permission) is None and the others still come. A GPU that falls off the bus
(``NVML_ERROR_GPU_IS_LOST``) or whose handle cannot be had is returned as a sample with
``lost=True`` and the error's name -- a recorded condition, never an exception. Hopper GPM
metrics (SM occupancy, DRAM bandwidth) are computed between two consecutive GPM samples of
the same device when the device supports GPM, and are None otherwise.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024


@dataclass(frozen=True)
class ProcessSample:
    """One process on a GPU: memory it holds and, where NVML has a sample, its utilisation."""

    pid: int
    used_mib: float | None = None
    sm_util: float | None = None  # % of time a kernel of this process ran
    mem_util: float | None = None  # % of time this process accessed memory


@dataclass(frozen=True)
class DeviceSample:
    """One reading of one GPU. Metrics are None when NVML could not give them."""

    index: int
    ts: float  # time.time() of the reading
    uuid: str | None = None
    name: str | None = None
    util_gpu: float | None = None  # % of time one or more kernels ran (NVML "GPU utilisation")
    util_mem: float | None = None  # % of time device memory was read or written
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    sm_clock_mhz: float | None = None
    gpm_sm_occupancy: float | None = None  # Hopper+ only
    gpm_dram_bw_util: float | None = None  # Hopper+ only
    processes: tuple[ProcessSample, ...] | None = None  # None: the process list failed
    lost: bool = False
    error: str | None = None  # why the device is lost


def nvml_available() -> tuple[bool, str]:
    """Whether NVML initialises here, and why not."""
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True, ""
    except Exception as exc:  # noqa: BLE001 -- any failure means: no usable NVML
        return False, f"{type(exc).__name__}: {exc}"


def job_of_pid(pid: int, proc_root: str | os.PathLike = "/proc") -> str | None:
    """The Slurm job id a process belongs to: its environment, else its cgroup path.

    ``SLURM_JOB_ID`` in ``/proc/<pid>/environ`` needs the same uid or root (the prolog agent
    runs as root); the cgroup path (``.../job_<id>/step_...`` under cgroup v1 and v2) works for
    any reader. None when neither says.
    """
    base = Path(proc_root) / str(pid)
    try:
        for item in (base / "environ").read_bytes().split(b"\0"):
            if item.startswith(b"SLURM_JOB_ID="):
                value = item[len(b"SLURM_JOB_ID="):].decode("ascii", "replace").strip()
                if value.isdigit():
                    return value
    except OSError:
        pass
    try:
        for line in (base / "cgroup").read_text().splitlines():
            for part in line.split("/"):
                if part.startswith("job_") and part[4:].isdigit():
                    return part[4:]
    except OSError:
        pass
    return None


class NvmlProvider:
    """Samples GPUs through NVML. Raises at construction only if NVML does not initialise."""

    def __init__(self, proc_root: str = "/proc"):
        import pynvml

        self._nv = pynvml
        pynvml.nvmlInit()
        self._proc_root = proc_root
        self._handles: dict[int, object] = {}
        self._last_util_ts: dict[int, int] = {}  # per device: newest process-utilisation sample
        self._gpm_prev: dict[int, object] = {}
        self._gpm_supported: dict[int, bool] = {}
        self._closed = False

    # -- provider interface -------------------------------------------------------------
    def device_indices(self) -> list[int]:
        try:
            return list(range(self._nv.nvmlDeviceGetCount()))
        except self._nv.NVMLError:
            return []

    def index_of(self, ident: str) -> int | None:
        """Device index for an index string or a GPU UUID (as CUDA_VISIBLE_DEVICES may hold)."""
        if ident.isdigit():
            return int(ident)
        for index in self.device_indices():
            try:
                uuid = self._nv.nvmlDeviceGetUUID(self._handle(index))
            except self._nv.NVMLError:
                continue
            if isinstance(uuid, bytes):
                uuid = uuid.decode()
            if uuid == ident or uuid.startswith(ident):
                return index
        return None

    def job_of_pid(self, pid: int) -> str | None:
        return job_of_pid(pid, self._proc_root)

    def sample(self, index: int) -> DeviceSample:
        nv = self._nv
        now = time.time()
        try:
            handle = self._handle(index)
        except nv.NVMLError as exc:
            return DeviceSample(index=index, ts=now, lost=True, error=_error_name(exc))
        lost: list[str] = []

        def read(fn, *args):
            try:
                return fn(*args)
            except nv.NVMLError as exc:
                if _is_lost(nv, exc):
                    lost.append(_error_name(exc))
                return None

        uuid = _text(read(nv.nvmlDeviceGetUUID, handle))
        name = _text(read(nv.nvmlDeviceGetName, handle))
        rates = read(nv.nvmlDeviceGetUtilizationRates, handle)
        memory = read(nv.nvmlDeviceGetMemoryInfo, handle)
        clock = read(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM)
        processes = self._processes(handle, index, read)
        occupancy, dram = self._gpm(handle, index) if not lost else (None, None)
        if lost:
            self._handles.pop(index, None)
        return DeviceSample(
            index=index, ts=now, uuid=uuid, name=name,
            util_gpu=_num(getattr(rates, "gpu", None)),
            util_mem=_num(getattr(rates, "memory", None)),
            mem_used_mib=_mib(getattr(memory, "used", None)),
            mem_total_mib=_mib(getattr(memory, "total", None)),
            sm_clock_mhz=_num(clock),
            gpm_sm_occupancy=occupancy, gpm_dram_bw_util=dram,
            processes=processes, lost=bool(lost), error=lost[0] if lost else None,
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sample in self._gpm_prev.values():
            try:
                self._nv.nvmlGpmSampleFree(sample)
            except Exception:  # noqa: BLE001
                pass
        try:
            self._nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass

    # -- helpers --------------------------------------------------------------------------
    def _handle(self, index: int):
        if index not in self._handles:
            self._handles[index] = self._nv.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def _processes(self, handle, index: int, read) -> tuple[ProcessSample, ...] | None:
        nv = self._nv
        running = read(nv.nvmlDeviceGetComputeRunningProcesses, handle)
        if running is None:
            return None
        utils: dict[int, tuple[float, float]] = {}
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(handle, self._last_util_ts.get(index, 0))
        except nv.NVMLError:
            samples = []  # NOT_FOUND: no new sample since the last call; others: unsupported
        newest = self._last_util_ts.get(index, 0)
        for s in sorted(samples, key=lambda s: s.timeStamp):
            utils[int(s.pid)] = (float(s.smUtil), float(s.memUtil))
            newest = max(newest, int(s.timeStamp))
        self._last_util_ts[index] = newest
        out = []
        for proc in running:
            pid = int(proc.pid)
            sm, mem = utils.get(pid, (None, None))
            out.append(ProcessSample(pid=pid, used_mib=_mib(getattr(proc, "usedGpuMemory", None)),
                                     sm_util=sm, mem_util=mem))
        return tuple(out)

    def _gpm(self, handle, index: int) -> tuple[float | None, float | None]:
        nv = self._nv
        if self._gpm_supported.get(index) is False:
            return None, None
        try:
            if index not in self._gpm_supported:
                support = nv.nvmlGpmQueryDeviceSupport(handle)
                self._gpm_supported[index] = bool(support.isSupportedDevice)
                if not self._gpm_supported[index]:
                    return None, None
            current = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(handle, current)
        except Exception:  # noqa: BLE001 -- GPM absent (pre-Hopper, old driver, old bindings)
            self._gpm_supported[index] = False
            return None, None
        previous = self._gpm_prev.get(index)
        self._gpm_prev[index] = current
        if previous is None:
            return None, None
        try:
            request = nv.c_nvmlGpmMetricsGet_t()
            request.version = nv.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = 2
            request.sample1 = previous
            request.sample2 = current
            request.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_OCCUPANCY
            request.metrics[1].metricId = nv.NVML_GPM_METRIC_DRAM_BW_UTIL
            nv.nvmlGpmMetricsGet(request)
            values = []
            for i in range(2):
                metric = request.metrics[i]
                values.append(float(metric.value) if metric.nvmlReturn == 0 else None)
            return values[0], values[1]
        except Exception:  # noqa: BLE001
            return None, None
        finally:
            try:
                nv.nvmlGpmSampleFree(previous)
            except Exception:  # noqa: BLE001
                pass


# NVML errors that mean the device itself is gone (fell off the bus, removed), as opposed to
# one metric being unsupported.
_LOST_ERRORS = {"NVML_ERROR_GPU_IS_LOST": "gpu-lost", "NVML_ERROR_GPU_NOT_FOUND": "gpu-not-found"}


def _is_lost(nv, exc) -> bool:
    codes = {getattr(nv, name, None) for name in _LOST_ERRORS}
    return getattr(exc, "value", None) in codes


def _error_name(exc) -> str:
    import pynvml

    value = getattr(exc, "value", None)
    for name, label in _LOST_ERRORS.items():
        if value is not None and value == getattr(pynvml, name, None):
            return label
    return f"nvml-error-{value}" if value is not None else type(exc).__name__


def _text(value) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _num(value) -> float | None:
    return None if value is None else float(value)


def _mib(value) -> float | None:
    # NVML reports an unknown per-process memory as NVML_VALUE_NOT_AVAILABLE (ULLONG_MAX).
    if value is None or value >= 1 << 63:
        return None
    return value / MIB
