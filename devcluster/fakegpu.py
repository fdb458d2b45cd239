"""Fake GPUs for the local test cluster: jobs register on a shared board, the agent reads it.

The test cluster's GPUs are plain files, so nothing real runs on them. To exercise the whole
telemetry path with real jobs, a job script runs ``python -m devcluster.fakegpu
run ...``: it finds the GPU Slurm gave it (``scontrol show job -d``: ``GRES=shard:N(IDX:k)``),
registers its process on ``<root>/<node>/gpu<k>/<job>.json`` with the memory and utilisation it
"uses", does a fixed amount of work and leaves. Memory and work may be given per GPU type (a
job needs a little more memory, and far less time, on a larger GPU); work given once takes as
long on every type. ``FakeGpuProvider`` reads the board as NVML
would read a GPU: device utilisation and memory are the sums over registered processes, and
each process is attributed to its job.

Contention rule (documented so a test can compute run times by hand): the jobs on one GPU
share its SM time; while the registered utilisations sum to more than 100 %, every job runs at
``100 / sum`` of its solo speed. Two jobs at 70 % each run at 1/1.4 = 0.714x (ISD 0.4); 30 %
and 40 % do not slow each other. Memory: a job whose registration would take the GPU past its
memory dies as CUDA would ("out of memory", exit 2) -- the OOM the sizing must prevent.
``$GPUSHARE_FAKEGPU_EXTRA_MIB`` in a job's environment makes it use that much more than its
script says (a run that outgrows its history).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from slurm_gpushare.core.files import pid_alive, process_started
from slurm_gpushare.slurm.jobs import gpu_indices
from slurm_gpushare.node.telemetry.nvml import DeviceSample, ProcessSample

ROOT_ENV = "GPUSHARE_FAKEGPU_ROOT"
# How fast each type runs the same training, relative to a V100: the run-time predictor's
# packaged fit of the public SchedTune and Gavel throughputs (``predict_runtime``, 100 s on a
# V100: 59.6 s on an A100, 257 s on a T4). Scripts that give their work per type with
# ``work_per_type`` take that much less or more time there, as on real GPUs, so a run on one
# type tells the predictor what it would take on another.
TYPE_SPEED = {"v100": 1.0, "a100": 1.68, "t4": 0.39}
EXTRA_ENV = "GPUSHARE_FAKEGPU_EXTRA_MIB"
TICK_S = 0.1


def _gpu_dir(root: str | os.PathLike, node: str, index: int) -> Path:
    return Path(root) / node / f"gpu{index}"


def write_board(root: str | os.PathLike, node: str, gpu_type: str, gpus: list[dict]) -> None:
    """Describe a node's fake GPUs: their gres type and [{"index", "name", "mem_total_mib"}]."""
    base = Path(root) / node
    base.mkdir(parents=True, exist_ok=True)
    for gpu in gpus:
        directory = _gpu_dir(root, node, gpu["index"])
        directory.mkdir(exist_ok=True)
        live = {str(e["job_id"]) for e in _registrations(directory) if "started" in e}
        for path in directory.glob("*.json"):  # left by jobs killed in an earlier run
            if path.stem not in live:
                path.unlink(missing_ok=True)
    (base / "board.json").write_text(json.dumps({"type": gpu_type, "gpus": gpus}))


def read_board(root: str | os.PathLike, node: str) -> dict:
    return json.loads((Path(root) / node / "board.json").read_text())


def _registrations(directory: Path) -> list[dict]:
    out = []
    for path in sorted(directory.glob("*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written or removed right now
        # A job killed with SIGKILL leaves its file; its pid may be another process's by now
        # (the test suite starts tens of thousands, and pids wrap at 32768).
        if pid_alive(int(entry.get("pid", 0)), entry.get("started")):
            out.append(entry)
    return out


class FakeGpuProvider:
    """A telemetry provider over one node's board (same interface as NvmlProvider)."""

    def __init__(self, root: str | os.PathLike, node: str):
        self.root, self.node = Path(root), node
        board = read_board(root, node)
        self._gpus = {int(g["index"]): g for g in board["gpus"]}
        self._pids: dict[int, str] = {}

    def device_indices(self) -> list[int]:
        return sorted(self._gpus)

    def index_of(self, ident: str) -> int | None:
        return int(ident) if ident.isdigit() else None

    def job_of_pid(self, pid: int) -> str | None:
        return self._pids.get(pid)

    def sample(self, index: int) -> DeviceSample:
        now = time.time()
        gpu = self._gpus.get(index)
        if gpu is None:
            return DeviceSample(index=index, ts=now, lost=True, error="gpu-not-found")
        entries = _registrations(_gpu_dir(self.root, self.node, index))
        processes = []
        for entry in entries:
            self._pids[int(entry["pid"])] = str(entry["job_id"])
            processes.append(ProcessSample(pid=int(entry["pid"]), used_mib=entry["mem_mib"],
                                           sm_util=entry["util"], mem_util=entry["mem_util"]))
        return DeviceSample(
            index=index, ts=now, uuid=f"GPU-fake-{self.node}-{index}", name=gpu["name"],
            util_gpu=min(100.0, sum(e["util"] for e in entries)),
            util_mem=min(100.0, sum(e["mem_util"] for e in entries)),
            mem_used_mib=sum(e["mem_mib"] for e in entries),
            mem_total_mib=float(gpu["mem_total_mib"]), sm_clock_mhz=1400.0 if entries else 0.0,
            processes=tuple(processes))

    def close(self) -> None:
        pass


def provider(job_id: str | None = None) -> FakeGpuProvider | None:
    """The agent's provider on the development cluster (``GPUSHARE_TELEMETRY_PROVIDER``)."""
    root, node = os.environ.get(ROOT_ENV), os.environ.get("SLURMD_NODENAME")
    return FakeGpuProvider(root, node) if root and node else None


def speed(util: float, co_runner_utils: list[float]) -> float:
    """Relative speed of a job under the board's contention rule."""
    total = util + sum(co_runner_utils)
    return 1.0 if total <= 100.0 else 100.0 / total


def work_per_type(v100_seconds: float) -> dict[str, float]:
    """Seconds of work on each type for a job that takes ``v100_seconds`` on a V100."""
    return {gpu_type: round(v100_seconds / speed, 1) for gpu_type, speed in TYPE_SPEED.items()}


def per_type(values: dict[str, float], gpu_type: str) -> float:
    """A job's figure on ``gpu_type`` from ``--mem``/``--work`` (``TYPE:VALUE``, or ``VALUE``
    for every type, kept under ``*``): a type it names none for gets the largest."""
    return values.get(gpu_type, values.get("*", max(values.values())))


def run_workload(*, root: str, node: str, job_id: str, mem_mib: dict[str, float],
                 util: float, mem_util: float, work_s: dict[str, float]) -> int:
    """Register on this job's GPU, do its seconds of solo-speed work there, leave. Exit code."""
    indices = gpu_indices(job_id, node)
    if not indices:
        print(f"fakegpu: job {job_id} holds no GPU on {node}", file=sys.stderr)
        return 2
    index = indices[0]
    board = read_board(root, node)
    gpu_type = board["type"]
    total = next(g["mem_total_mib"] for g in board["gpus"] if int(g["index"]) == index)
    need = per_type(mem_mib, gpu_type)
    work = per_type(work_s, gpu_type)
    # Test knob: a run that needs more than the script says (grown input), set per submission.
    need += float(os.environ.get(EXTRA_ENV, 0) or 0)
    directory = _gpu_dir(root, node, index)
    others = [e for e in _registrations(directory) if str(e["job_id"]) != job_id]
    used = sum(e["mem_mib"] for e in others)
    if used + need > total:
        holders = ", ".join(f"{e['job_id']} ({e['mem_mib']:.0f} MiB)" for e in others)
        print(f"fakegpu: CUDA out of memory on {node} GPU {index}: {need:.0f} MiB wanted, "
              f"{total - used:.0f} MiB free; held by jobs {holders}", file=sys.stderr)
        return 2
    me = directory / f"{job_id}.json"
    me.write_text(json.dumps({"job_id": job_id, "pid": os.getpid(),
                              "started": process_started(os.getpid()), "mem_mib": need,
                              "util": util, "mem_util": mem_util}))
    # scancel's SIGTERM: leave the GPU as a process would (run the `finally` below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        done, last = 0.0, time.monotonic()
        while done < work:
            time.sleep(TICK_S)
            now = time.monotonic()
            co = [e["util"] for e in _registrations(directory) if str(e["job_id"]) != job_id]
            done += (now - last) * speed(util, co)
            last = now
    finally:
        me.unlink(missing_ok=True)
    print(f"fakegpu: job {job_id} on {node} GPU {index} ({gpu_type}) done")
    return 0


def smi(*, root: str, node: str, job_id: str) -> int:
    """The board's ``nvidia-smi -L``: the GPUs this job (or step) can use, or exit 2 if none."""
    indices = gpu_indices(job_id, node)
    # A step of a heterogeneous job's group N sees the leader's id: its GPUs are component N's.
    group = os.environ.get("SLURM_HET_GROUP") or os.environ.get("SLURM_PACK_GROUP")
    if not indices and group is None and os.environ.get("SLURM_HET_SIZE"):
        group = next((k for k in range(int(os.environ["SLURM_HET_SIZE"]))
                      if gpu_indices(f"{job_id}+{k}", node)), None)
    if not indices and group is not None:
        indices = gpu_indices(f"{job_id}+{group}", node)
    if not indices:
        print(f"fakegpu: job {job_id} holds no GPU on {node}", file=sys.stderr)
        return 2
    board = read_board(root, node)
    for gpu in board["gpus"]:
        if int(gpu["index"]) in indices:
            print(f"GPU {gpu['index']}: {gpu['name']} ({board['type']}, "
                  f"{gpu['mem_total_mib']:.0f} MiB) on {node}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster.fakegpu")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("smi", help="list the GPUs this job holds (like nvidia-smi -L)")
    run = sub.add_parser("run", help="use this job's fake GPU for a while")
    run.add_argument("--mem", action="append", default=[], metavar="TYPE:MIB",
                     help="memory the job needs on a GPU type (repeat per type)")
    run.add_argument("--util", type=float, default=50.0)
    run.add_argument("--mem-util", type=float, default=20.0)
    run.add_argument("--work", action="append", default=[], metavar="[TYPE:]SECONDS",
                     help="seconds of work at solo speed, on every type or on one (repeat per "
                          "type)")
    args = parser.parse_args(argv)
    root = os.environ.get(ROOT_ENV)
    node, job_id = os.environ.get("SLURMD_NODENAME"), os.environ.get("SLURM_JOB_ID")
    if not (root and node and job_id):
        parser.error(f"needs {ROOT_ENV}, SLURMD_NODENAME and SLURM_JOB_ID (run it in a job)")
    if args.action == "smi":
        return smi(root=root, node=node, job_id=job_id)
    mem, work = {}, {}
    for item in args.mem:
        gpu_type, _, value = item.partition(":")
        mem[gpu_type] = float(value)
    for item in args.work:
        gpu_type, _, value = item.rpartition(":")
        work[gpu_type or "*"] = float(value)
    if not mem:
        parser.error("give --mem TYPE:MIB at least once")
    if not work:
        parser.error("give --work [TYPE:]SECONDS at least once")
    return run_workload(root=root, node=node, job_id=job_id, mem_mib=mem,
                        util=args.util, mem_util=args.mem_util, work_s=work)


if __name__ == "__main__":
    sys.exit(main())
