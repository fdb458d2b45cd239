"""Measure the workload set on a real NVIDIA GPU: telemetry, memory, and co-run speeds.

    python3 bench/gpu_measure.py --out OUT [--phases env,solo,pairs,mps] [--resume DIR]
                                 [--deadline-s S] [--warm-s 1] [--measure-s 3]

Needs one NVIDIA GPU, PyTorch, torchvision, timm, transformers and nvidia-ml-py; nothing is
downloaded. Every job runs in its own process (a "worker") whose environment holds its own
``SLURM_JOB_ID``, so the project's NVML adapter attributes its processes as it does in a Slurm
job; this process never initialises CUDA, it only reads NVML through ``node.telemetry``.

Phases, each writing to OUT as it goes (so a run cut short keeps what it measured):

- ``env``: GPU, driver, NVML and software versions; the CUDA context's memory; GPM support.
- ``solo``: every config of ``bench/gpu_workloads.py`` alone on the GPU: iterations/s over
  ``--measure-s`` after ``--warm-s``, peak memory (NVML and PyTorch's allocator), and the
  telemetry summary the node agent would store (``JobSampler`` at 250 ms), with the sampler's
  own CPU cost. -> ``solo.csv``
- ``pairs``: every unordered pair of the paired configs, self-pairs included, both started
  together (time slicing, the default compute mode); each side's iterations/s, and what NVML
  reports per process while two jobs share the GPU. The first job of each row is re-measured
  alone just before its pairs (a second solo figure, for the noise). ``--resume DIR`` skips
  the pairs already in DIR/pairs.csv. -> ``pairs.csv``
- ``mps``: if ``nvidia-cuda-mps-control`` runs, a subset of pairs under MPS, and
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: does a job over its limit fail, does its neighbour
  survive? -> ``mps.csv``, ``env.json``

At the end ``profiles.csv`` and ``coruns.csv`` are written in the format of
``slurm-gpushare kb predict-pairs`` (normalised speed = shared / mean of the solo figures).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SAMPLE_INTERVAL_S = 0.25  # the node agent's default
MPS_PAIRS = [("resnet50-b64", "resnet50-b64"), ("resnet50-b64", "mobilenetv3-b64"),
             ("gpt-small-b16", "dlrm-b4096"), ("bert-base-b32", "lstm-b64"),
             ("vit-s16-b64", "effnet-b0-b64"), ("infer-resnet50-b64", "loader-resnet18-b64"),
             ("resnet18-b128", "resnet18-b128"), ("mobilenetv3-b64", "dlrm-b4096")]
SOLO_FIELDS = ["config", "workload", "batch", "what", "its_per_s", "build_s",
               "torch_peak_alloc_mib", "torch_peak_reserved_mib", "nvml_peak_mib",
               "gpu_util_mean", "gpu_util_max", "mem_util_mean", "mem_util_max",
               "gpm_sm_occupancy_mean", "gpm_dram_bw_mean", "sm_clock_max_mhz", "samples",
               "sampler_cpu_pct", "sample_ms"]
PAIR_FIELDS = ["mode", "job_a", "job_b", "its_a", "its_b", "solo_a_again", "status",
               "attribution_a", "attribution_b", "proc_util_mean_a", "proc_util_mean_b",
               "proc_mem_peak_a", "proc_mem_peak_b", "device_util_mean"]


# ----------------------------------------------------------------------------- the worker
def worker_main() -> None:
    """One job: commands as JSON lines on stdin, replies on the original stdout."""
    reply_to = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # libraries that print go to stderr, never into the replies
    import gc

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_workloads import DEVICE, build

    on_gpu = DEVICE == "cuda"
    step = None
    held = []
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "ctx":
                torch.zeros(1, device=DEVICE)
                reply = {"ok": True}
            elif op == "load":
                started = time.monotonic()
                step = build(cmd["config"])
                warm_until = time.monotonic() + 1.0
                for i in range(100):
                    step()
                    if i >= 2 and time.monotonic() > warm_until:
                        break
                reply = {"ok": True, "build_s": round(time.monotonic() - started, 2)}
            elif op == "run":
                reply = {"ok": True, **_timed_run(step, cmd["warm_s"], cmd["measure_s"])}
                if on_gpu:
                    reply["peak_alloc_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
                    reply["peak_reserved_mib"] = round(torch.cuda.max_memory_reserved() / 2**20)
            elif op == "unload":
                step = None
                gc.collect()
                if on_gpu:
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                reply = {"ok": True}
            elif op == "alloc":
                held.append(torch.empty(cmd["mib"] * 2**20, dtype=torch.uint8, device=DEVICE))
                held[-1].fill_(1)
                if on_gpu:
                    torch.cuda.synchronize()
                reply = {"ok": True}
            elif op == "ping":
                reply = {"ok": True}
            elif op == "exit":
                return
            else:
                reply = {"ok": False, "error": f"unknown op {op}"}
        except Exception as exc:  # noqa: BLE001 -- reported to the coordinator, which goes on
            step = None
            gc.collect()
            if on_gpu:
                torch.cuda.empty_cache()
            reply = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                     "traceback": traceback.format_exc()[-2000:]}
        reply_to.write(json.dumps(reply) + "\n")


def _timed_run(step, warm_s: float, measure_s: float) -> dict:
    """Iterations/s over the window [warm_s, warm_s + measure_s] after the start: the number
    of iterations completed between the first and last completion inside the window, over
    the time between them."""
    start = time.monotonic()
    window_start, window_end = start + warm_s, start + warm_s + measure_s
    done = []
    while True:
        step()
        now = time.monotonic()
        if now >= window_start:
            done.append(now)
        if now >= window_end:
            break
    inside = [t for t in done if t <= window_end] or done
    if len(inside) >= 2:
        rate = (len(inside) - 1) / (inside[-1] - inside[0])
    else:  # one iteration longer than the window
        rate = 1.0 / (done[-1] - start) if done else 0.0
    return {"its_per_s": round(rate, 4), "iterations": len(inside)}


class Worker:
    """A worker process with its own SLURM_JOB_ID."""

    def __init__(self, job_id: str, log_dir: Path, extra_env: dict | None = None):
        self.job_id = job_id
        env = dict(os.environ, SLURM_JOB_ID=job_id, PYTHONUNBUFFERED="1",
                   TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error")
        env.update(extra_env or {})
        self.log = open(log_dir / f"worker-{job_id}.log", "a")
        self.proc = subprocess.Popen([sys.executable, __file__, "worker"], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log)

    def send(self, op: str, **args) -> None:
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()

    def receive(self, timeout_s: float = 180.0) -> dict:
        """The next reply; a worker silent for ``timeout_s`` (a hung CUDA call) is killed."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            self.proc.kill()
            return {"ok": False, "error": f"no reply in {timeout_s:.0f} s: worker killed"}
        line = self.proc.stdout.readline()
        if not line:
            return {"ok": False, "error": f"worker exited with {self.proc.wait()}"}
        return json.loads(line)

    def call(self, op: str, **args) -> dict:
        if self.proc.poll() is not None:
            return {"ok": False, "error": f"worker exited with {self.proc.returncode}"}
        self.send(op, **args)
        return self.receive()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("exit")
                self.proc.wait(timeout=20)
            except Exception:  # noqa: BLE001
                self.proc.kill()
        self.log.close()


# ------------------------------------------------------------------------- the coordinator
class Sampling:
    """The node agent's sampler for each job over a run, with its CPU cost. One thread and one
    NVML handle read the GPU every 250 ms and hand the same reading to every job's
    ``JobSampler`` (on a node each job's collector reads on its own; here two NVML users in one
    process crashed the process)."""

    def __init__(self, job_ids: list[str], delay_s: float):
        from slurm_gpushare.node.telemetry.nvml import NvmlProvider
        from slurm_gpushare.node.telemetry.sampler import JobSampler

        self.provider = NvmlProvider()
        self.reading = None
        self.samplers = [JobSampler(self, job_id, [0], interval_s=SAMPLE_INTERVAL_S)
                         for job_id in job_ids]
        self.stop = threading.Event()
        self.delay_s = delay_s
        self.cpu_s = self.wall_s = 0.0
        self.readings: list = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    # the provider interface the samplers see: the reading of this round
    def sample(self, index):
        return self.reading

    def job_of_pid(self, pid):
        return self.provider.job_of_pid(pid)

    def _run(self) -> None:
        if self.stop.wait(self.delay_s):
            return
        cpu, wall = time.thread_time(), time.monotonic()
        while True:
            self.reading = self.provider.sample(0)
            self.readings.append(self.reading)
            for sampler in self.samplers:
                sampler.sample_once()
            if self.stop.wait(SAMPLE_INTERVAL_S):
                break
        self.cpu_s, self.wall_s = time.thread_time() - cpu, time.monotonic() - wall

    def finish(self) -> list[dict]:
        self.stop.set()
        self.thread.join()
        self.provider.close()
        return [sampler.summaries()[0] for sampler in self.samplers]

    def per_process(self, pids: set[int]) -> tuple[float | None, float | None]:
        """Mean SM utilisation and peak memory NVML reported for these processes."""
        utils, mems = [], []
        for reading in self.readings:
            for proc in reading.processes or ():
                if proc.pid in pids:
                    if proc.sm_util is not None:
                        utils.append(proc.sm_util)
                    if proc.used_mib is not None:
                        mems.append(proc.used_mib)
        return (round(statistics.mean(utils), 1) if utils else None,
                round(max(mems)) if mems else None)


def _gpu_pids(worker: Worker) -> set[int]:
    """The worker's process and its children (data-loader workers)."""
    pids = {worker.proc.pid}
    try:
        for line in Path(f"/proc/{worker.proc.pid}/task/{worker.proc.pid}/children").read_text().split():
            pids.add(int(line))
    except OSError:
        pass
    return pids


def run_together(workers: list[Worker], warm_s: float, measure_s: float,
                 sample: bool = True) -> tuple[list[dict], list[dict], Sampling | None]:
    """Start every worker's run at once; replies, telemetry summaries (one per worker) and
    the sampling."""
    sampling = Sampling([w.job_id for w in workers], warm_s) if sample else None
    for w in workers:
        w.send("run", warm_s=warm_s, measure_s=measure_s)
    replies = [w.receive() for w in workers]
    summaries = sampling.finish() if sampling else []
    return replies, summaries, sampling


def env_phase(out: Path, log_dir: Path) -> dict:
    import pynvml

    from slurm_gpushare.node.telemetry.nvml import NvmlProvider

    info: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    text = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731
    info["gpu"] = text(pynvml.nvmlDeviceGetName(handle))
    info["driver"] = text(pynvml.nvmlSystemGetDriverVersion())
    info["nvml"] = text(pynvml.nvmlSystemGetNVMLVersion())
    info["cuda_driver"] = pynvml.nvmlSystemGetCudaDriverVersion()
    info["mem_total_mib"] = round(pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20)
    try:
        info["compute_mode"] = pynvml.nvmlDeviceGetComputeMode(handle)
    except pynvml.NVMLError as exc:
        info["compute_mode"] = str(exc)
    try:
        info["gpm_supported"] = bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except Exception as exc:  # noqa: BLE001
        info["gpm_supported"] = f"{type(exc).__name__}: {exc}"
    pynvml.nvmlShutdown()
    versions = subprocess.run(
        [sys.executable, "-c", "import torch, torchvision, timm, transformers, pynvml, sys;"
         "print(sys.version.split()[0], torch.__version__, torch.version.cuda,"
         " torchvision.__version__, timm.__version__, transformers.__version__)"],
        capture_output=True, text=True)
    names = ["python", "torch", "torch_cuda", "torchvision", "timm", "transformers"]
    info["software"] = dict(zip(names, versions.stdout.split())) or versions.stderr[-300:]
    try:
        import importlib.metadata as md
        info["software"]["nvidia-ml-py"] = md.version("nvidia-ml-py")
    except Exception:  # noqa: BLE001
        pass
    # The CUDA context: device memory before and after one process creates it.
    provider = NvmlProvider()
    before = provider.sample(0).mem_used_mib
    worker = Worker("9001", log_dir)
    worker.call("ctx")
    reading = provider.sample(0)
    mine = [p for p in reading.processes or () if p.pid == worker.proc.pid]
    info["cuda_context_mib"] = {"device_delta": round(reading.mem_used_mib - before),
                                "per_process": mine[0].used_mib if mine else None,
                                "job_of_pid": provider.job_of_pid(worker.proc.pid)}
    worker.close()
    provider.close()
    return info


def solo_phase(out: Path, log_dir: Path, args, configs) -> list[dict]:
    from gpu_workloads import WORKLOADS

    rows = []
    worker = Worker("9101", log_dir)
    with open(out / "solo.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, SOLO_FIELDS)
        writer.writeheader()
        for config in configs:
            kind, batch, what = WORKLOADS[config]
            row = {"config": config, "workload": kind, "batch": batch, "what": what}
            loaded = worker.call("load", config=config)
            if not loaded.get("ok"):
                print(f"solo {config}: {loaded.get('error')}", flush=True)
                row["its_per_s"] = "failed: " + loaded.get("error", "")[:120]
                writer.writerow(row)
                if worker.proc.poll() is not None:
                    worker = Worker("9101", log_dir)
                continue
            (reply,), (s,), sampling = run_together([worker], args.warm_s, args.measure_s)
            calls = max(1, s["samples"])
            row.update({
                "its_per_s": reply.get("its_per_s"), "build_s": loaded["build_s"],
                "torch_peak_alloc_mib": reply.get("peak_alloc_mib"),
                "torch_peak_reserved_mib": reply.get("peak_reserved_mib"),
                "nvml_peak_mib": s["mgmap_max_mib"], "gpu_util_mean": s["mgup_mean"],
                "gpu_util_max": s["mgup_max"], "mem_util_mean": s["mgtsamp_mean"],
                "mem_util_max": s["mgtsamp_max"],
                "gpm_sm_occupancy_mean": s["gpm_sm_occupancy_mean"],
                "gpm_dram_bw_mean": s["gpm_dram_bw_mean"], "sm_clock_max_mhz": s["sm_clock_max_mhz"],
                "samples": s["samples"],
                "sampler_cpu_pct": round(100 * sampling.cpu_s / max(sampling.wall_s, 1e-9), 3),
                "sample_ms": round(1000 * sampling.cpu_s / calls, 3),
            })
            writer.writerow(row)
            f.flush()
            rows.append(row)
            print(f"solo {config}: {row['its_per_s']} it/s, util {s['mgup_mean']}%, "
                  f"mem {s['mgmap_max_mib']} MiB", flush=True)
            worker.call("unload")
    worker.close()
    return rows


def pairs_phase(out: Path, log_dir: Path, args, paired, *, mode: str = "time-slicing",
                pairs=None, extra_env=None, filename: str = "pairs.csv", done=frozenset()):
    wanted = pairs or [(a, b) for i, a in enumerate(paired) for b in paired[i:]]
    wanted = [p for p in wanted if p not in done]
    started = time.monotonic()
    path = out / filename
    fresh = not path.exists()
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, PAIR_FIELDS)
        if fresh:
            writer.writeheader()
        first = second = None
        current = None
        for a, b in wanted:
            if args.deadline_s and time.monotonic() - started > args.deadline_s:
                print(f"{mode}: deadline reached, {len(wanted)} pairs wanted", flush=True)
                break
            if first is None or first.proc.poll() is not None:
                first = Worker("9201", log_dir, extra_env)
                current = None
            if second is None or second.proc.poll() is not None:
                second = Worker("9202", log_dir, extra_env)
            row = {"mode": mode, "job_a": a, "job_b": b}
            if current != a:
                first.call("unload")
                loaded = first.call("load", config=a)
                current = a if loaded.get("ok") else None
                if current is None:
                    row["status"] = "failed a: " + loaded.get("error", "")[:150]
                    writer.writerow(row)
                    continue
                second.call("ctx")  # the other job exists (idle) when a runs alone
                (alone,), _, _ = run_together([first], args.warm_s, args.measure_s, sample=False)
                row["solo_a_again"] = alone.get("its_per_s")
            loaded = second.call("load", config=b)
            if not loaded.get("ok"):
                row["status"] = "failed b: " + loaded.get("error", "")[:150]
                writer.writerow(row)
                f.flush()
                continue
            ok = measure_pair(first, second, row, args)
            writer.writerow(row)
            f.flush()
            print(f"{mode} {a} + {b}: {row['its_a']} / {row['its_b']} it/s {row['status'][:60]}",
                  flush=True)
            second.call("unload")
            if not ok:
                first.call("unload")
                current = None
    for w in (first, second):
        if w is not None:
            w.close()


def measure_pair(first: Worker, second: Worker, row: dict, args) -> bool:
    """Both workers' loaded jobs run together: each side's it/s, NVML's attribution and
    per-process figures, into ``row``; whether both ran."""
    (ra, rb), (sa, sb), sampling = run_together([first, second], args.warm_s, args.measure_s)
    ok = bool(ra.get("ok") and rb.get("ok"))
    row["status"] = "ok" if ok else "failed: " + (ra.get("error") or rb.get("error") or "")[:150]
    row.update({"its_a": ra.get("its_per_s"), "its_b": rb.get("its_per_s"),
                "attribution_a": sa["attribution"], "attribution_b": sb["attribution"],
                "device_util_mean": _device_util(sampling.readings)})
    row["proc_util_mean_a"], row["proc_mem_peak_a"] = sampling.per_process(_gpu_pids(first))
    row["proc_util_mean_b"], row["proc_mem_peak_b"] = sampling.per_process(_gpu_pids(second))
    return ok


def pool_pairs_phase(out: Path, log_dir: Path, args, paired, done=frozenset()) -> None:
    """The pairs of ``pairs_phase`` with every config loaded once in a worker of its own (and
    a twin for its self-pair), so a pair costs its run and nothing else: for a GPU with room
    for all of them at once (``--pool``). Each config is measured alone again, with every
    other worker idle beside it, before its first pair."""
    wanted = [(a, b) for i, a in enumerate(paired) for b in paired[i:] if (a, b) not in done]
    started = time.monotonic()
    path = out / "pairs.csv"
    fresh = not path.exists()
    workers: dict[str, Worker] = {}
    failed: set[str] = set()  # workers whose config did not load

    def worker_for(config: str, twin: bool = False) -> Worker | None:
        key = config + ("#twin" if twin else "")
        if key not in workers:
            workers[key] = Worker(str(9300 + len(workers)), log_dir)
            reply = workers[key].call("load", config=config)
            if not reply.get("ok"):
                failed.add(key)
                print(f"pool {key}: {reply.get('error')}", flush=True)
        worker = workers[key]
        return None if key in failed or worker.proc.poll() is not None else worker

    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, PAIR_FIELDS)
        if fresh:
            writer.writeheader()
        alone_done: set[str] = set()
        for a, b in wanted:
            if args.deadline_s and time.monotonic() - started > args.deadline_s:
                print(f"pool: deadline reached, {len(wanted)} pairs wanted", flush=True)
                break
            row = {"mode": "time-slicing", "job_a": a, "job_b": b}
            first, second = worker_for(a), worker_for(b, twin=a == b)
            if first is None or second is None:
                row["status"] = "failed: " + ("a" if first is None else "b") + " did not load"
                writer.writerow(row)
                continue
            if a not in alone_done:
                (alone,), _, _ = run_together([first], args.warm_s, args.measure_s, sample=False)
                row["solo_a_again"] = alone.get("its_per_s")
                alone_done.add(a)
            measure_pair(first, second, row, args)
            writer.writerow(row)
            f.flush()
            print(f"pool {a} + {b}: {row['its_a']} / {row['its_b']} it/s {row['status'][:60]}",
                  flush=True)
    for w in workers.values():
        w.close()


def _device_util(readings) -> float | None:
    values = [r.util_gpu for r in readings if r.util_gpu is not None]
    return round(statistics.mean(values), 1) if values else None


def mps_phase(out: Path, log_dir: Path, args) -> dict:
    control = shutil.which("nvidia-cuda-mps-control")
    if not control:
        return {"available": False, "why": "nvidia-cuda-mps-control not on PATH"}
    pipe, logs = Path("/tmp/gpushare-mps-pipe"), Path("/tmp/gpushare-mps-log")
    pipe.mkdir(exist_ok=True)
    logs.mkdir(exist_ok=True)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    started = subprocess.run([control, "-d"], env=dict(os.environ, **env), capture_output=True,
                             text=True)
    result: dict = {"available": True, "start_rc": started.returncode,
                    "start_output": (started.stdout + started.stderr)[-300:]}
    try:
        probe = Worker("9301", log_dir, env)
        reply = probe.call("ctx")
        probe.close()
        result["client_ok"] = reply
        if not reply.get("ok"):
            return result
        # solo figures under MPS for the configs of the subset
        configs = sorted({c for pair in MPS_PAIRS for c in pair})
        solo = {}
        worker = Worker("9302", log_dir, env)
        for config in configs:
            if worker.call("load", config=config).get("ok"):
                (r,), _, _ = run_together([worker], args.warm_s, args.measure_s, sample=False)
                solo[config] = r.get("its_per_s")
            worker.call("unload")
        worker.close()
        result["solo_under_mps"] = solo
        pairs_phase(out, log_dir, args, [], mode="mps", pairs=MPS_PAIRS, extra_env=env,
                    filename="mps.csv")
        result["memory_limit"] = _mps_memory_limit(log_dir, env)
        with open(logs / "control.log") as f:
            result["control_log_tail"] = f.read()[-600:]
    except Exception as exc:  # noqa: BLE001
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        subprocess.run([control], input="quit\n", env=dict(os.environ, **env), text=True,
                       capture_output=True)
    return result


def _mps_memory_limit(log_dir: Path, env: dict) -> dict:
    """A job limited to 4 GiB asks for 2 GiB, then 3 GiB more; its neighbour trains."""
    limited = Worker("9401", log_dir, dict(env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=4G"))
    neighbour = Worker("9402", log_dir, env)
    out: dict = {"limit": "0=4G"}
    try:
        out["neighbour_load"] = neighbour.call("load", config="resnet18-b128").get("ok")
        out["limited_ctx"] = limited.call("ctx")
        out["limited_alloc_2048"] = limited.call("alloc", mib=2048)
        neighbour.send("run", warm_s=0.5, measure_s=2.0)
        out["limited_alloc_3072_more"] = limited.call("alloc", mib=3072)
        out["neighbour_run"] = neighbour.receive()
        out["limited_alive_after"] = limited.call("ping")
        out["limited_alloc_1024_after"] = limited.call("alloc", mib=1024)
    finally:
        limited.close()
        neighbour.close()
    for key, value in out.items():
        if isinstance(value, dict):
            value.pop("traceback", None)
    return out


def _rows(path: Path) -> list[dict]:
    """A CSV file's rows (none when it does not exist)."""
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def gpu_type_of(name: str) -> str:
    """A short GPU type from NVML's name: ``NVIDIA H100 80GB HBM3`` -> ``h100``."""
    words = [w for w in name.lower().replace("nvidia", "").split() if w]
    return words[0] if words else "gpu"


def derive(out: Path) -> None:
    """profiles.csv and coruns.csv for ``kb predict-pairs``."""
    solo = {r["config"]: r for r in _rows(out / "solo.csv")}
    solos: dict[str, list[float]] = {}
    for config, r in solo.items():
        try:
            solos.setdefault(config, []).append(float(r["its_per_s"]))
        except (TypeError, ValueError):
            pass
    rows = _rows(out / "pairs.csv")
    for r in rows:
        if r.get("solo_a_again"):
            solos.setdefault(r["job_a"], []).append(float(r["solo_a_again"]))
    with open(out / "profiles.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job", "gpu_util_pct", "mem_util_pct", "mem_used_mib", "mem_total_mib",
                    "gpu_type", "gpu_util_max_pct", "mem_util_max_pct"])
        env = json.loads((out / "env.json").read_text())
        total, gpu_type = env.get("mem_total_mib", ""), gpu_type_of(env.get("gpu", ""))
        for config, r in solo.items():
            if r.get("gpu_util_mean"):
                w.writerow([config, r["gpu_util_mean"], r["mem_util_mean"], r["nvml_peak_mib"],
                            total, gpu_type, r["gpu_util_max"], r["mem_util_max"]])
    with open(out / "coruns.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job_a", "job_b", "speed_a", "speed_b"])
        for r in rows:
            if r["status"] == "ok" and solos.get(r["job_a"]) and solos.get(r["job_b"]):
                w.writerow([r["job_a"], r["job_b"],
                            round(float(r["its_a"]) / statistics.mean(solos[r["job_a"]]), 4),
                            round(float(r["its_b"]) / statistics.mean(solos[r["job_b"]]), 4)])


def main() -> int:
    if sys.argv[1:2] == ["worker"]:
        worker_main()
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--phases", default="env,solo,pairs,mps")
    parser.add_argument("--resume", type=Path, help="a folder with an earlier pairs.csv")
    parser.add_argument("--deadline-s", type=float, default=0.0,
                        help="start no new pair after this many seconds of the pairs phase")
    parser.add_argument("--warm-s", type=float, default=1.0)
    parser.add_argument("--measure-s", type=float, default=3.0)
    parser.add_argument("--configs", help="comma-separated subset (default: all)")
    parser.add_argument("--paired", help="comma-separated configs measured in pairs "
                        "(default: gpu_workloads.PAIRED among --configs)")
    parser.add_argument("--pool", action="store_true",
                        help="pairs with every paired config loaded at once (a GPU with room "
                             "for all of them): no reloading between pairs")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_workloads import PAIRED, WORKLOADS

    configs = args.configs.split(",") if args.configs else list(WORKLOADS)
    paired = (args.paired.split(",") if args.paired else
              [c for c in PAIRED if c in configs])
    unknown = [c for c in configs + paired if c not in WORKLOADS]
    if unknown:
        parser.error(f"unknown configs: {', '.join(unknown)}")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    log_dir = Path(os.environ.get("GPU_MEASURE_LOGS", "/tmp/gpu-measure-logs"))
    log_dir.mkdir(parents=True, exist_ok=True)
    phases = args.phases.split(",")
    env_path = out / "env.json"
    info = json.loads(env_path.read_text()) if env_path.exists() else {}
    if args.resume:
        for name in ("solo.csv", "pairs.csv", "env.json"):
            if (args.resume / name).exists() and not (out / name).exists():
                shutil.copy(args.resume / name, out / name)
        info = json.loads(env_path.read_text()) if env_path.exists() else info
    info["command"] = " ".join(sys.argv)
    if "env" in phases:
        info.update(env_phase(out, log_dir))
        env_path.write_text(json.dumps(info, indent=1))
    if "solo" in phases:
        solo_phase(out, log_dir, args, configs)
    if "pairs" in phases:
        done = frozenset((r["job_a"], r["job_b"]) for r in _rows(out / "pairs.csv")
                         if r["status"] == "ok")
        if args.pool:
            pool_pairs_phase(out, log_dir, args, paired, done=done)
        else:
            pairs_phase(out, log_dir, args, paired, done=done)
    if "mps" in phases:
        info["mps"] = mps_phase(out, log_dir, args)
        env_path.write_text(json.dumps(info, indent=1))
    if (out / "solo.csv").exists() and env_path.exists():
        derive(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
