"""The per-job telemetry collector that a Slurm prolog starts and the epilog stops.

    prolog:  python -m slurm_gpushare.node.agent start   # job, GPUs, cluster from the environment
    epilog:  python -m slurm_gpushare.node.agent stop

``start`` launches a detached collector (its own session, no inherited descriptors) and
returns at once; its pid file is ``<state_dir>/agent/job-<id>.pid``. ``stop`` signals it and
returns at once (``--wait`` to wait, for tests). Both are idempotent and always exit 0: a
collector that cannot start, a GPU that vanishes or a daemon that is down never delays or fails
a job; each leaves one line in ``<state_dir>/agent.log`` (job ids and counts only).

On stop the collector reduces its samples to one summary per GPU (``telemetry.sampler``) and
hands each to ``deliver(summary)``. The default delivery sends
``{"v": 1, "op": "ingest", "summary": {...}}`` as one JSON line to the daemon's Unix socket
(or, with ``GPUSHARE_DAEMON_ADDRESS``, munge-sealed to its TCP listener: ``delivery.py``) and
reads one reply line; if the daemon is unreachable or says no, the summary is spooled as
``<state_dir>/spool/<cluster>-<job>-<gpu>.json`` and a detached ``drain`` process retries it
with backoff until the daemon takes it (``delivery.drain_loop``).

Environment: ``SLURM_JOB_ID``, ``SLURM_JOB_GPUS`` (else ``CUDA_VISIBLE_DEVICES``),
``SLURM_CLUSTER_NAME``, ``GPUSHARE_STATE_DIR``, ``GPUSHARE_SOCKET``,
``GPUSHARE_DAEMON_ADDRESS`` (``HOST:PORT`` of the daemon's TCP listener; set on nodes that do
not run the daemon), ``GPUSHARE_MUNGE_SOCKET`` (munged's socket, if not the default),
``GPUSHARE_TELEMETRY_SCENARIO`` (a profile to replay instead of real NVML).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from slurm_gpushare import PROTOCOL_VERSION
from slurm_gpushare.core import signals
from slurm_gpushare.core.config import DaemonConfig
from slurm_gpushare.core.files import pid_alive, process_started, replace_atomically
from slurm_gpushare.node.delivery import (DEFAULT_TIMEOUT_S, DeliveryError, Link, drain_loop,
                                          drain_once, ingest_op)

DEFAULT_INTERVAL_S = 0.25
# A collector whose epilog never came (slurmd crash) ends by itself after this long.
DEFAULT_MAX_DURATION_S = 14 * 24 * 3600.0

Deliver = Callable[[dict[str, Any]], Any]
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


# -- paths and logging --------------------------------------------------------------------------
def pid_path(state_dir: str | os.PathLike, job_id: str) -> Path:
    return Path(state_dir) / "agent" / f"job-{job_id}.pid"


def spool_dir(state_dir: str | os.PathLike) -> Path:
    return Path(state_dir) / "spool"


def checkpoint_path(state_dir: str | os.PathLike, job_id: str) -> Path:
    """The running collector's last summaries, for the epilog if the collector dies."""
    return Path(state_dir) / "agent" / f"job-{job_id}.checkpoint.json"


# How often a running collector saves its summaries so far (what a kill -9 can lose).
CHECKPOINT_S = 30.0
FIRST_CHECKPOINT_S = 2.0
# A collector that gets no answer from slurmctld about its job's GPUs (shards on 22.05) asks
# again after this long, at most this many times in all.
GPU_QUESTION_WAIT_S = 0.5
GPU_QUESTIONS = 20


def _log(state_dir: str | os.PathLike, message: str) -> None:
    try:
        path = Path(state_dir) / "agent.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as handle:
            handle.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} pid={os.getpid()} {message}\n")
    except OSError:
        pass  # logging must never be the reason a prolog fails


def _valid_job_id(job_id: str | None) -> bool:
    return bool(job_id) and job_id.replace("_", "").isdigit()


def _read_pid(path: Path) -> tuple[int, int | None] | None:
    """A collector's pid file: ``(pid, start time)`` (``files.process_started``), so a pid
    that the kernel has since given to another process is not taken for the collector (nor
    sent the epilog's SIGTERM). A file with only the pid (written where there was no /proc to
    read a start time from) names a live process only if it runs the agent; another process
    holding that pid gets a start time no process has, so it reads as the collector, dead."""
    try:
        fields = path.read_text().split()
    except OSError:
        return None
    if not fields or not fields[0].isdigit():
        return None
    pid = int(fields[0])
    if len(fields) > 1 and fields[1].isdigit():
        return pid, int(fields[1])
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return pid, None  # gone (or no /proc to tell it by)
    return pid, (None if b"slurm_gpushare.node.agent" in command else -1)


# -- delivery --------------------------------------------------------------------------------
def send_to_daemon(summary: dict[str, Any], socket_path: str, timeout_s: float = 5.0) -> dict:
    """Send one ingest request and return the daemon's reply; raises DeliveryError."""
    return Link(socket_path, timeout_s=timeout_s).send_one(ingest_op(summary))


def link_of(args: argparse.Namespace) -> Link:
    """The way to the daemon that the command line and environment name."""
    return Link(args.socket, address=args.daemon_address or None,
                munge_socket=args.munge_socket or None, timeout_s=args.delivery_timeout)


def share_limit_mib(job_id: str) -> float | None:
    """The memory a shared job may use, from its decision tag: shards x 1 GiB, or an MPS
    share's mem=; None for a job that is not a share (or whose tag cannot be read)."""
    from slurm_gpushare.slurm.jobs import lookup_job

    try:
        job = lookup_job(job_id)
    except ValueError:
        return None
    tag = job.tag if job else None
    return tag.limit_mib if tag else None


def overrun_watch(job_id: str, limit_mib: float, notify: Callable[[dict[str, Any]], Any],
                  log: Callable[[str], None]) -> Callable:
    """A sampler watch that tells the daemon, once, that the job went above its share."""
    told = []

    def watch(sampler) -> None:
        peak = sampler.peak_mib()
        if told or peak is None or peak <= limit_mib:
            return
        told.append(peak)
        try:
            notify({"v": PROTOCOL_VERSION, "op": "overrun", "job_id": job_id,
                    "peak_mib": peak, "limit_mib": limit_mib})
            log(f"job {job_id}: above its share ({peak:.0f} > {limit_mib:.0f} MiB), reported")
        except Exception as exc:  # noqa: BLE001 -- a report that fails must not stop sampling
            log(f"job {job_id}: above its share, report failed: {type(exc).__name__}")

    return watch


def spool(summary: dict[str, Any], directory: str | os.PathLike) -> Path:
    """Write a summary into the spool directory atomically (mode 0600); returns its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name = f"{summary.get('cluster') or 'local'}-{summary['job_id']}-{summary['gpu_index']}.json"
    final = directory / name
    replace_atomically(final, json.dumps(summary, sort_keys=True).encode(), mode=0o600)
    return final


def default_deliver(socket_path: str, spool_path: str | os.PathLike,
                    timeout_s: float = 5.0, *, link: Link | None = None,
                    on_spooled: Callable[[], Any] | None = None) -> Deliver:
    """Deliver to the daemon (``link``, else its Unix socket), spooling when it is unreachable
    or refuses, then calling ``on_spooled`` (e.g. start the drainer). Returns "sent" or
    "spooled"."""
    link = link or Link(socket_path, timeout_s=timeout_s)

    def deliver(summary: dict[str, Any]) -> str:
        try:
            link.send_one(ingest_op(summary))
        except DeliveryError:
            spool(summary, spool_path)
            if on_spooled is not None:
                on_spooled()
            return "spooled"
        # The daemon is back: hand it what was spooled while it was not (once per contact).
        try:
            sent, _, _ = drain_once(Path(spool_path), link)
        except DeliveryError:
            sent = 0
        return f"sent (+{sent} from the spool)" if sent else "sent"

    return deliver


def drain_spool(directory: str | os.PathLike, handle: Deliver) -> tuple[int, int]:
    """Hand every spooled summary to ``handle`` (e.g. ``Store.ingest_summary`` or
    ``lambda s: send_to_daemon(s, sock)``); a file goes once ``handle`` returns without raising.
    Returns (handled, failed). Unreadable files are counted failed and left for a person."""
    handled = failed = 0
    directory = Path(directory)
    if not directory.is_dir():
        return 0, 0
    for path in sorted(directory.glob("*.json")):
        try:
            summary = json.loads(path.read_text())
            handle(summary)
        except Exception:  # noqa: BLE001 -- keep the file, try again later
            failed += 1
            continue
        path.unlink(missing_ok=True)
        handled += 1
    return handled, failed


# -- the collector --------------------------------------------------------------------------
def parse_gpus(text: str | None, provider=None) -> list[int]:
    """GPU indices from ``SLURM_JOB_GPUS``/``CUDA_VISIBLE_DEVICES`` style text (indices or
    UUIDs); UUIDs are resolved through the provider."""
    out = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item or item in ("NoDevFiles",):
            continue
        if item.isdigit():
            out.append(int(item))
        elif provider is not None and hasattr(provider, "index_of"):
            index = provider.index_of(item)
            if index is not None:
                out.append(index)
    return sorted(set(out))


def ask_for_gpus(job_id: str, node: str, stop: threading.Event) -> list[int]:
    """Slurm set no GPU variables (shards on 22.05, file-backed GPUs): ask slurmctld. Its answer
    is final, "none here" included (a multi-node job's other nodes); without one (slurmctld
    busy with a burst of submissions) ask again while the job runs, a bounded number of times."""
    from slurm_gpushare.slurm import jobs

    for _ in range(GPU_QUESTIONS):
        indices = jobs.gpu_indices(job_id, node)
        if indices is not None:
            return indices
        if stop.wait(GPU_QUESTION_WAIT_S):  # the job ended (the epilog's stop)
            break
    return []


def collect(job_id: str, gpus: str | None, *, provider=None, deliver: Deliver,
            stop: threading.Event, cluster: str = "", interval_s: float = DEFAULT_INTERVAL_S,
            max_duration_s: float | None = DEFAULT_MAX_DURATION_S, keys: Iterable[str] = (),
            scenario: str | None = None, log: Callable[[str], None] = lambda m: None,
            notify: Callable[[dict[str, Any]], Any] | None = None,
            limit_mib: float | None = None,
            checkpoint: Callable[[list[dict[str, Any]]], Any] | None = None,
            checkpoint_s: float = CHECKPOINT_S) -> int:
    """Sample until ``stop`` is set, then deliver one summary per GPU. Returns the number of
    summaries delivered; never raises."""
    from slurm_gpushare.node.telemetry import open_provider
    from slurm_gpushare.node.telemetry.sampler import JobSampler

    own_provider = provider is None
    try:
        if provider is None:
            provider = open_provider(scenario, job_id=job_id)
        if provider is None:
            log(f"job {job_id}: no GPU telemetry here (no NVML, no scenario); nothing collected")
            return 0
        indices = parse_gpus(gpus, provider)
        if not indices and os.environ.get("SLURMD_NODENAME"):
            indices = ask_for_gpus(job_id, os.environ["SLURMD_NODENAME"], stop)
        present = set(provider.device_indices())
        absent = [i for i in indices if present and i not in present]
        if absent:  # a summary without one sample each would be all they could give
            log(f"job {job_id}: gpu(s) {','.join(map(str, absent))} not on this node; skipped")
            indices = [i for i in indices if i not in absent]
        if not indices:
            log(f"job {job_id}: no GPUs given; nothing collected")
            return 0
        sampler = JobSampler(provider, job_id, indices, cluster=cluster,
                             interval_s=interval_s, keys=keys)
        overrun = (overrun_watch(job_id, limit_mib, notify, log)
                   if notify is not None and limit_mib else None)
        # The first checkpoint a little after the start (short jobs need none), then regularly.
        saved = [time.monotonic() - checkpoint_s + min(checkpoint_s, FIRST_CHECKPOINT_S)]

        def watch(sampler) -> None:
            if overrun is not None:
                overrun(sampler)
            if checkpoint is not None and time.monotonic() - saved[0] >= checkpoint_s:
                saved[0] = time.monotonic()
                try:
                    checkpoint(sampler.summaries())
                except Exception as exc:  # noqa: BLE001 -- a full disk must not stop sampling
                    log(f"job {job_id}: checkpoint failed: {type(exc).__name__}")

        sampler.run(stop, max_duration_s=max_duration_s, watch=watch)
        delivered = 0
        for summary in sampler.summaries():
            try:
                outcome = deliver(summary)
                delivered += 1
                log(f"job {job_id}: gpu {summary['gpu_index']} summary {outcome or 'delivered'} "
                    f"({summary['samples']} samples)")
            except Exception as exc:  # noqa: BLE001
                log(f"job {job_id}: gpu {summary['gpu_index']} delivery failed: "
                    f"{type(exc).__name__}")
        return delivered
    except Exception as exc:  # noqa: BLE001 -- the collector must end quietly whatever happens
        log(f"job {job_id}: collector error {type(exc).__name__}")
        return 0
    finally:
        if own_provider and provider is not None:
            try:
                provider.close()
            except Exception:  # noqa: BLE001
                pass


def stop_on_signals(stop: threading.Event) -> None:
    """Set ``stop`` when a stop signal arrives, from a watcher thread, not a handler: a handler
    runs in the main thread, possibly inside ``stop.wait`` holding the event's own lock, and
    setting the event there deadlocked the collector. ``start`` spawns us with the signals
    blocked, so an epilog's SIGTERM that comes while we are still importing stays pending
    until the watcher is there, instead of killing us before we deliver."""
    signals.handle_in_thread(STOP_SIGNALS, lambda _signum: stop.set(), name="stop-signals")


def run(args: argparse.Namespace, deliver: Deliver | None = None) -> int:
    """The collector process itself (``agent run``): sample until SIGTERM, deliver, exit 0."""
    state_dir = args.state_dir
    pidfile = pid_path(state_dir, args.job_id)
    stop = threading.Event()
    stop_on_signals(stop)
    saved = checkpoint_path(state_dir, args.job_id)
    try:
        link = link_of(args)
        deliver = deliver or default_deliver(args.socket, spool_dir(state_dir), link=link,
                                             on_spooled=lambda: start_drainer(args))
        # Beside the sampling, never before it: with the daemon cut off, a drain waits for its
        # connection's timeout, and a short job would end before its first sample.
        threading.Thread(target=_drain_quietly, args=(args,), daemon=True).start()
        # Under slurmd (the prolog started us): the job's share, to report it going above.
        limit = share_limit_mib(args.job_id) if os.environ.get("SLURMD_NODENAME") else None
        collect(args.job_id, args.gpus, deliver=deliver, stop=stop, cluster=args.cluster,
                interval_s=args.interval, max_duration_s=args.max_duration,
                keys=[k for k in (args.keys or "").split(",") if k],
                scenario=args.scenario, log=lambda m: _log(state_dir, m),
                notify=link.send_one, limit_mib=limit,
                checkpoint=lambda summaries: replace_atomically(
                    saved, json.dumps(summaries).encode(), mode=0o600))
    finally:
        saved.unlink(missing_ok=True)
        found = _read_pid(pidfile)
        if found is not None and found[0] == os.getpid():
            pidfile.unlink(missing_ok=True)
    return 0


def recover(args: argparse.Namespace, why: str) -> None:
    """The epilog found the job's collector dead (killed, OOM): deliver its last checkpoint,
    marked, and say so in the log. Samples after the checkpoint are lost."""
    state_dir, job_id = args.state_dir, args.job_id
    saved = checkpoint_path(state_dir, job_id)
    try:
        summaries = json.loads(saved.read_text())
    except (OSError, ValueError):
        _log(state_dir, f"job {job_id}: collector {why}; no checkpoint, its samples are lost")
        return
    deliver = default_deliver(args.socket, spool_dir(state_dir), link=link_of(args),
                              on_spooled=lambda: start_drainer(args))
    outcomes = []
    for summary in summaries if isinstance(summaries, list) else []:
        if isinstance(summary, dict):
            summary["conditions"] = [*summary.get("conditions", []), "collector-died"]
            try:
                outcomes.append(deliver(summary))
            except Exception as exc:  # noqa: BLE001
                outcomes.append(f"failed ({type(exc).__name__})")
    saved.unlink(missing_ok=True)
    _log(state_dir, f"job {job_id}: collector {why}; delivered its last checkpoint "
                    f"({len(outcomes)} summaries: {', '.join(outcomes) or 'none'})")


def _drain_quietly(args: argparse.Namespace) -> None:
    """Send what this node spooled while the daemon was away (a new job is a contact); what
    is still left goes to the drainer."""
    directory = spool_dir(args.state_dir)
    try:
        sent, refused, left = drain_once(directory, link_of(args))
        if sent or refused:
            _log(args.state_dir, f"spool drained: {sent} sent, {refused} refused, {left} kept")
    except DeliveryError:
        start_drainer(args)
    except Exception as exc:  # noqa: BLE001
        _log(args.state_dir, f"spool drain failed: {type(exc).__name__}")


def start_drainer(args: argparse.Namespace) -> None:
    """Start the detached process that retries the spool with backoff (``agent drain``); a
    second one exits at once (the spool's lock), so this may be called on every spooling.
    Only for a daemon on another host: a daemon on this host is back when a new job's prolog
    reaches it, which drains the spool then."""
    if not args.daemon_address:
        return
    try:
        command = [sys.executable, "-m", "slurm_gpushare.node.agent", "drain",
                   *_forward_link(args)]
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True,
                         cwd="/")
    except Exception as exc:  # noqa: BLE001
        _log(args.state_dir, f"could not start the spool drainer: {type(exc).__name__}")


def drain(args: argparse.Namespace) -> int:
    """The drainer itself: deliver the spool, retrying with backoff, until it is empty."""
    outcome = drain_loop(spool_dir(args.state_dir), link_of(args),
                         log=lambda m: _log(args.state_dir, m))
    if outcome is not None and any(outcome):
        _log(args.state_dir, f"spool drained: {outcome[0]} sent, {outcome[1]} refused")
    return 0


def start(args: argparse.Namespace) -> int:
    """Launch the detached collector unless one already runs for this job. Always 0."""
    state_dir, job_id = args.state_dir, args.job_id
    pidfile = pid_path(state_dir, job_id)
    try:
        pidfile.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(pidfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                break
            except FileExistsError:
                found = _read_pid(pidfile)
                if found is not None and pid_alive(*found):
                    _log(state_dir, f"job {job_id}: collector already running (pid {found[0]})")
                    return 0
                if found is None and time.time() - _mtime(pidfile) < 5:
                    return 0  # another start is writing it right now
                pidfile.unlink(missing_ok=True)  # stale: the collector died
        else:
            return 0
        command = [sys.executable, "-m", "slurm_gpushare.node.agent", "run", *_forward(args)]
        # The child inherits the blocked mask; its signal watcher takes them from there.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, close_fds=True,
                                     start_new_session=True, cwd="/")
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        started = process_started(child.pid)
        with os.fdopen(fd, "w") as handle:
            handle.write(f"{child.pid} {started}\n" if started is not None else f"{child.pid}\n")
        _log(state_dir, f"job {job_id}: collector started (pid {child.pid}, gpus {args.gpus})")
    except Exception as exc:  # noqa: BLE001
        _log(state_dir, f"job {job_id}: could not start collector: {type(exc).__name__}")
    return 0


def stop(args: argparse.Namespace) -> int:
    """Ask the job's collector to finish; returns at once unless ``--wait``. Always 0."""
    state_dir, job_id = args.state_dir, args.job_id
    pidfile = pid_path(state_dir, job_id)
    try:
        found = _read_pid(pidfile)
        if found is None and pidfile.exists():  # start is between creating and filling it
            time.sleep(0.2)
            found = _read_pid(pidfile)
        if found is None:
            if checkpoint_path(state_dir, job_id).exists():
                recover(args, "gone without its pid file")
            else:
                _log(state_dir, f"job {job_id}: no collector to stop")
            return 0
        pid, started = found
        try:
            if not pid_alive(pid, started):  # its pid may be another process's by now
                raise ProcessLookupError
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pidfile.unlink(missing_ok=True)
            recover(args, f"(pid {pid}) died before the epilog")
            return 0
        deadline = time.monotonic() + max(0.0, args.wait)
        while time.monotonic() < deadline and pidfile.exists() and pid_alive(pid, started):
            time.sleep(0.05)
        _log(state_dir, f"job {job_id}: collector asked to stop (pid {pid})")
    except Exception as exc:  # noqa: BLE001
        _log(state_dir, f"job {job_id}: could not stop collector: {type(exc).__name__}")
    return 0


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _forward_link(args: argparse.Namespace) -> list[str]:
    return ["--state-dir", str(args.state_dir), "--socket", args.socket,
            "--daemon-address", args.daemon_address or "",
            "--munge-socket", args.munge_socket or "",
            "--delivery-timeout", str(args.delivery_timeout)]


def _forward(args: argparse.Namespace) -> list[str]:
    out = ["--job-id", args.job_id, *_forward_link(args),
           "--cluster", args.cluster, "--interval", str(args.interval),
           "--max-duration", str(args.max_duration), "--gpus", args.gpus or ""]
    if args.scenario:
        out += ["--scenario", str(Path(args.scenario).resolve())]
    if args.keys:
        out += ["--keys", args.keys]
    return out


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="python -m slurm_gpushare.node.agent",
                                     description="Per-job GPU telemetry collector.")
    parser.add_argument("action", choices=("start", "stop", "run", "flush", "drain"))
    parser.add_argument("--job-id", default=env("SLURM_JOB_ID", ""))
    parser.add_argument("--gpus", default=env("SLURM_JOB_GPUS") or env("CUDA_VISIBLE_DEVICES"),
                        help="GPU indices or UUIDs, comma-separated")
    parser.add_argument("--cluster", default=env("SLURM_CLUSTER_NAME", ""))
    parser.add_argument("--state-dir", default=env("GPUSHARE_STATE_DIR", DaemonConfig.state_dir))
    parser.add_argument("--socket", default=env("GPUSHARE_SOCKET", DaemonConfig.socket))
    parser.add_argument("--daemon-address", default=env("GPUSHARE_DAEMON_ADDRESS", ""),
                        help="HOST:PORT of the daemon's TCP listener (instead of --socket)")
    parser.add_argument("--munge-socket", default=env("GPUSHARE_MUNGE_SOCKET", ""),
                        help="munged's socket (default: munge's own)")
    parser.add_argument("--delivery-timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help="seconds to wait for the daemon's answer before spooling")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S)
    parser.add_argument("--max-duration", type=float, default=DEFAULT_MAX_DURATION_S)
    parser.add_argument("--scenario", default=env("GPUSHARE_TELEMETRY_SCENARIO"))
    parser.add_argument("--keys", default="", help="fingerprint keys to attach (hex, comma-sep.)")
    parser.add_argument("--wait", type=float, default=0.0, help="stop: seconds to wait")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; always returns 0 so that prolog and epilog never fail because of it."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        return 0
    if args.interval <= 0:
        args.interval = DEFAULT_INTERVAL_S
    if args.action == "flush":
        try:
            sent, refused, left = drain_once(spool_dir(args.state_dir), link_of(args))
            _log(args.state_dir, f"spool flushed: {sent} sent, {refused} refused, {left} kept")
        except Exception as exc:  # noqa: BLE001
            _log(args.state_dir, f"spool flush failed: {type(exc).__name__}")
        return 0
    if args.action == "drain":
        try:
            return drain(args)
        except Exception as exc:  # noqa: BLE001
            _log(args.state_dir, f"spool drain failed: {type(exc).__name__}")
            return 0
    if not _valid_job_id(args.job_id):
        _log(args.state_dir, f"{args.action}: no valid job id; nothing done")
        return 0
    return {"start": start, "stop": stop, "run": run}[args.action](args)


if __name__ == "__main__":
    sys.exit(main())
