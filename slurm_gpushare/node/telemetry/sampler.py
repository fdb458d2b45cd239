"""Samples the GPUs of one job and reduces the readings to one summary per job and GPU.

Where a GPU is not shared, the device-level readings are the job's. Where other jobs' processes
are on it too, the job's share is the sum over its own processes (per-process SM and memory
utilisation, per-process memory), and every other job seen there is a co-runner with the
seconds of overlap. Processes are attributed to jobs by the provider's ``job_of_pid`` (real
NVML: ``SLURM_JOB_ID`` in ``/proc/<pid>/environ``, else the ``job_<id>`` cgroup path);
processes that belong to no job are grouped as the co-runner ``"other"`` when another job is
there too, and ignored otherwise (they may be the job's own, seen from another pid namespace).

Summary fields (``SUMMARY_FIELDS``; the store keeps exactly these):

- ``mgup_max`` / ``mgup_mean``: GPU utilisation % (the paper's MGUP is the max);
- ``mgmap_max_mib`` / ``mgmap_max_pct``: peak GPU memory in MiB and % of the GPU (MGMAP);
- ``mgtsamp_max`` / ``mgtsamp_mean``: % of time memory was read or written (MGTSAMP);
- ``duration_s``, ``gpu_model``, ``mem_total_mib``, ``sm_clock_max_mhz``, GPM means;
- ``coruns``: ``[{"job_id", "overlap_s"}]``; ``conditions``: e.g. ``["gpu-lost"]``.

No reading ever raises out of the sampler: a failed metric is None, a lost GPU a condition.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

SUMMARY_VERSION = 1
UNATTRIBUTED = "other"

SUMMARY_FIELDS = (
    "v", "cluster", "job_id", "gpu_index", "gpu_uuid", "gpu_model", "mem_total_mib",
    "start_ts", "end_ts", "duration_s", "samples",
    "mgup_max", "mgup_mean", "mgmap_max_mib", "mgmap_max_pct", "mgtsamp_max", "mgtsamp_mean",
    "sm_clock_max_mhz", "gpm_sm_occupancy_mean", "gpm_dram_bw_mean",
    "shared", "attribution", "coruns", "conditions", "keys",
)


@dataclass
class _Stat:
    """Running max and mean of one metric (memory stays bounded for long jobs)."""

    n: int = 0
    total: float = 0.0
    peak: float | None = None

    def add(self, value: float | None) -> None:
        if value is None:
            return
        self.n += 1
        self.total += value
        self.peak = value if self.peak is None else max(self.peak, value)

    @property
    def mean(self) -> float | None:
        return self.total / self.n if self.n else None


@dataclass
class _GpuState:
    index: int
    samples: int = 0
    first_ts: float | None = None
    last_ts: float | None = None
    last_clock: float | None = None
    uuid: str | None = None
    model: str | None = None
    mem_total: float | None = None
    util: _Stat = field(default_factory=_Stat)
    mem_mib: _Stat = field(default_factory=_Stat)
    mem_util: _Stat = field(default_factory=_Stat)
    clock: _Stat = field(default_factory=_Stat)
    occupancy: _Stat = field(default_factory=_Stat)
    dram: _Stat = field(default_factory=_Stat)
    shared: bool = False
    modes: set = field(default_factory=set)
    coruns: dict = field(default_factory=dict)
    conditions: list = field(default_factory=list)
    lost: bool = False


class JobSampler:
    """Samples ``gpus`` of job ``job_id`` through ``provider``; ``summaries()`` at the end."""

    def __init__(self, provider, job_id: str, gpus: Iterable[int], *, cluster: str = "",
                 interval_s: float = 0.25, clock: Callable[[], float] = time.monotonic,
                 keys: Iterable[str] = ()):
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.provider = provider
        self.job_id = str(job_id)
        self.cluster = cluster
        self.interval_s = interval_s
        self.keys = list(keys)
        self._clock = clock
        self._gpus = {int(i): _GpuState(int(i)) for i in gpus}
        self._attribute = getattr(provider, "job_of_pid", None) or (lambda pid: None)

    def sample_once(self) -> None:
        """Read every GPU once; never raises."""
        now = self._clock()
        for state in self._gpus.values():
            if state.lost:
                continue
            try:
                reading = self.provider.sample(state.index)
            except Exception as exc:  # noqa: BLE001 -- a provider bug must not stop the job's sampling
                _condition(state, f"sample-error:{type(exc).__name__}")
                continue
            dt = 0.0 if state.last_clock is None else max(0.0, now - state.last_clock)
            state.last_clock = now
            if reading.lost:
                state.lost = True
                _condition(state, reading.error or "gpu-lost")
                continue
            self._update(state, reading, dt)

    def peak_mib(self) -> float | None:
        """The job's highest memory on any of its GPUs so far."""
        peaks = [s.mem_mib.peak for s in self._gpus.values() if s.mem_mib.peak is not None]
        return max(peaks) if peaks else None

    def run(self, stop: threading.Event, max_duration_s: float | None = None,
            watch: Callable[["JobSampler"], None] | None = None) -> None:
        """Sample every ``interval_s`` until ``stop`` is set (or every GPU is lost); the first
        reading is taken at once, so even a job stopped immediately has one. ``watch`` is
        called after each round (it must not raise)."""
        started = self._clock()
        while True:
            self.sample_once()
            if watch is not None:
                watch(self)
            if all(s.lost for s in self._gpus.values()):
                break
            if max_duration_s is not None and self._clock() - started >= max_duration_s:
                break
            if stop.wait(self.interval_s):
                break

    def _update(self, state: _GpuState, r, dt: float) -> None:
        state.samples += 1
        state.first_ts = r.ts if state.first_ts is None else state.first_ts
        state.last_ts = r.ts
        state.uuid = r.uuid or state.uuid
        state.model = r.name or state.model
        state.mem_total = r.mem_total_mib or state.mem_total
        state.clock.add(r.sm_clock_mhz)
        state.occupancy.add(r.gpm_sm_occupancy)
        state.dram.add(r.gpm_dram_bw_util)

        others: dict[str, list] = {}
        mine = []
        if r.processes is not None:
            for proc in r.processes:
                owner = self._attribute(proc.pid)
                if owner == self.job_id:
                    mine.append(proc)
                else:
                    others.setdefault(owner or UNATTRIBUTED, []).append(proc)
        if not set(others) - {UNATTRIBUTED}:
            # No other *job* on the GPU (or no process list): the device readings are the
            # job's. Processes of no job are not taken as co-runners on their own: they may be
            # the job's own, seen from another pid namespace, or an MPS control daemon.
            state.modes.add("device")
            state.util.add(r.util_gpu)
            state.mem_mib.add(r.mem_used_mib)
            state.mem_util.add(r.util_mem)
            if r.processes is None:
                _condition(state, "no-process-list")
            return
        state.shared = True
        state.modes.add("process")
        for owner in others:
            state.coruns[owner] = state.coruns.get(owner, 0.0) + dt
        state.util.add(_sum_capped([p.sm_util for p in mine]))
        state.mem_util.add(_sum_capped([p.mem_util for p in mine]))
        used = [p.used_mib for p in mine]
        state.mem_mib.add(sum(u for u in used if u is not None) if all(
            u is not None for u in used) else None)

    def summaries(self) -> list[dict[str, Any]]:
        """One summary per GPU (a GPU never read still gets one, with its conditions)."""
        out = []
        for state in self._gpus.values():
            peak_mib = state.mem_mib.peak
            pct = (100.0 * peak_mib / state.mem_total
                   if peak_mib is not None and state.mem_total else None)
            duration = (state.last_ts - state.first_ts) if state.first_ts is not None else 0.0
            conditions = list(state.conditions)
            if state.samples == 0 and not conditions:
                conditions.append("no-samples")
            out.append({
                "v": SUMMARY_VERSION,
                "cluster": self.cluster,
                "job_id": self.job_id,
                "gpu_index": state.index,
                "gpu_uuid": state.uuid,
                "gpu_model": state.model,
                "mem_total_mib": _r(state.mem_total),
                "start_ts": _r(state.first_ts, 3),
                "end_ts": _r(state.last_ts, 3),
                "duration_s": _r(duration, 3),
                "samples": state.samples,
                "mgup_max": _r(state.util.peak),
                "mgup_mean": _r(state.util.mean),
                "mgmap_max_mib": _r(peak_mib),
                "mgmap_max_pct": _r(pct),
                "mgtsamp_max": _r(state.mem_util.peak),
                "mgtsamp_mean": _r(state.mem_util.mean),
                "sm_clock_max_mhz": _r(state.clock.peak),
                "gpm_sm_occupancy_mean": _r(state.occupancy.mean),
                "gpm_dram_bw_mean": _r(state.dram.mean),
                "shared": state.shared,
                "attribution": "+".join(sorted(state.modes)) or "none",
                "coruns": [{"job_id": job, "overlap_s": _r(sec, 3)}
                           for job, sec in sorted(state.coruns.items())],
                "conditions": conditions,
                "keys": list(self.keys),
            })
        return out


def _condition(state: _GpuState, condition: str) -> None:
    if condition not in state.conditions:
        state.conditions.append(condition)


def _sum_capped(values: list[float | None]) -> float | None:
    """Sum of per-process percentages (capped at 100); None if any is unknown."""
    if any(v is None for v in values):
        return None
    return min(100.0, float(sum(values)))


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(float(value), digits)
