"""The predictor daemon: ``slurm-gpushare serve``.

A threaded server on a Unix socket (mode 0600, peers checked with SO_PEERCRED) speaking the
newline-delimited JSON protocol of ``protocol.py``. Each connection may send many requests (the
hook keeps one open). A malformed or oversized request gets an error reply, never a crash or a
hang. SIGHUP reloads the configuration (a bad file keeps the old one); SIGTERM/SIGINT stop it
cleanly and remove the socket. Logs are JSON lines; they never hold scripts, names or comments.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import queue
import secrets
import signal
import socket
import socketserver
import struct
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import click

from . import __version__
from .clusterview import SlurmClusterView
from .config import Config, ConfigError, load_config
from .estimate import HistoryEstimator
from .fingerprint import Fingerprinter
from .models import load_memory_model
from .policy import decide
from .protocol import ProtocolError, parse_request, reply_error, reply_ok, request
from .slurmjobs import lookup_job, parse_tag
from .store import Store

log = logging.getLogger("slurm_gpushare.daemon")


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ts, level, event, and the record's structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(record.created, 3), "level": record.levelname.lower(),
                 "event": record.getMessage()}
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, sort_keys=False, default=str)


def setup_logging(config: Config) -> None:
    handler: logging.Handler
    if config.daemon.log_file:
        Path(config.daemon.log_file).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(config.daemon.log_file)
    else:
        handler = logging.StreamHandler()
    handler.setFormatter(JsonLogFormatter())
    root = logging.getLogger("slurm_gpushare")
    root.handlers[:] = [handler]
    root.setLevel(config.daemon.log_level.upper())
    root.propagate = False


def _event(level: int, event: str, **fields) -> None:
    log.log(level, event, extra={"fields": fields})


class RecordWriter:
    """Writes records to the store on its own thread, so SQLite never delays a reply."""

    def __init__(self, store: Store | None):
        self.store = store
        self.queue: queue.Queue = queue.Queue(maxsize=100_000)
        self.thread = threading.Thread(target=self._run, name="record-writer", daemon=True)
        self.thread.start()

    def put(self, work: Callable[..., Any], *args) -> None:
        """Run ``work(*args)`` on the writer thread (dropped, with a log line, if backed up)."""
        if self.store is None:
            return
        try:
            self.queue.put_nowait((work, args))
        except queue.Full:
            _event(logging.WARNING, "record-dropped", work=getattr(work, "__name__", "?"))

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            work, args = item
            try:
                work(*args)
            except Exception:  # noqa: BLE001 -- a bad record must not stop the writer
                log.exception("record-failed",
                              extra={"fields": {"work": getattr(work, "__name__", "?")}})
            finally:
                self.queue.task_done()

    def flush(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        self.flush()
        self.queue.put(None)
        self.thread.join(5)


@dataclass(frozen=True)
class Peer:
    uid: int
    admin: bool  # root, the daemon's user or an allowed uid (slurmctld, prolog/epilog)


class Predictor:
    """Turns requests into replies. Holds the configuration; swapped whole on reload."""

    # Ops a non-admin peer may use (on the query socket); everything else is admin-only.
    USER_OPS = {"ping", "explain", "job"}

    def __init__(self, config: Config, *, fingerprinter: Fingerprinter | None = None,
                 store: Store | None = None, reader: Store | None = None, view=None):
        self.config = config
        self.fingerprinter = fingerprinter or Fingerprinter.from_file(config.daemon.secret_file)
        self.store = store
        self.records = RecordWriter(store)
        self.estimator = None
        self.knowledge = None
        self.view = view
        if store is not None:
            from .knowledge import KnowledgeBase

            # Decisions read history through their own connection: in WAL mode a reader sees
            # the last committed state and never waits for the writer thread's transactions.
            self.estimator = HistoryEstimator(reader or store,
                                              predictor=load_memory_model(config))
            self.estimator.estimate([], config)  # warm-up: first calls pay for imports
            self.knowledge = KnowledgeBase.from_store(store, self.estimator.classes)
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()

    @property
    def digest(self) -> Callable[[str, str], str]:
        return self.fingerprinter.digest

    def handle(self, message: Any, peer: Peer | None = None) -> dict[str, Any]:
        peer = peer or Peer(uid=os.getuid(), admin=True)
        rid = message.get("rid") if isinstance(message, dict) else None
        reply = self._handle(message, peer)
        if rid is not None:
            reply["rid"] = rid
        return reply

    def _count(self, key: str) -> None:
        with self._lock:
            self.counters[key] += 1

    def _handle(self, message: Any, peer: Peer) -> dict[str, Any]:
        config = self.config  # one consistent config for the whole request, even across reload
        op = message.get("op") if isinstance(message, dict) else None
        if not peer.admin and op not in self.USER_OPS:
            self._count("refused")
            return reply_error(f"op {op!r} is not available on this socket")
        try:
            if op == "ingest":
                return self._ingest(message)
            if op == "overrun":
                return self._overrun(message)
            if op == "job":
                return self._job(message, peer)
            op, request = parse_request(message, opt_out_token=config.policy.opt_out_token,
                                        mem_hint_token=config.policy.mem_hint_token,
                                        digest=self.digest)
        except ProtocolError as exc:
            self._count("errors")
            _event(logging.WARNING, "bad-request", error=str(exc))
            return reply_error(str(exc))
        if op == "ping":
            with self._lock:
                counters = dict(self.counters)
            return reply_ok(version=__version__, counters=counters)
        if not peer.admin:
            # A user may ask what would happen to a job of theirs, never of someone else's.
            request = replace(request, uid=peer.uid, user=_user_name(peer.uid))
        started = time.perf_counter()
        decision_id = secrets.token_hex(4)
        keys = self.fingerprinter.keys_from_digests(
            request.user or str(request.uid), request.script_digest, request.name_digest)
        estimate, history = None, "no store"
        if self.estimator is not None:
            estimate, history = self.estimator.estimate(keys.sizing_keys(), config,
                                                        request.mem_hint_mib)
        decision = decide(request, config, estimate=estimate, view=self.view,
                          knowledge=self.knowledge, decision_id=decision_id)
        elapsed_us = int((time.perf_counter() - started) * 1e6)
        self._count(f"{op}:{decision.action}")
        _event(logging.INFO, "decision" if op == "decide" else "explain",
               id=decision_id, action=decision.action, code=decision.code,
               reason=decision.reason, uid=request.uid, account=request.account,
               partition=request.partition, share_gib=decision.share_gib,
               gpu_types=list(decision.gpu_types), writes=dict(decision.writes),
               job_class=estimate.job_class if estimate else None, history=history,
               decide_us=elapsed_us)
        if op == "decide":
            self.records.put(self.store.record_decision, {
                **decision.to_dict(), "ts": time.time(), "uid": request.uid,
                "account": request.account, "partition": request.partition,
                "keys": keys.as_list(),
                "job_class": estimate.job_class if estimate else None})
        return reply_ok(decision)

    def _ingest(self, message: dict[str, Any]) -> dict[str, Any]:
        """A job's telemetry summary from the prolog/epilog agent."""
        summary = message.get("summary")
        if not isinstance(summary, dict):
            raise ProtocolError("summary must be an object")
        self.records.put(self._store_summary, summary)
        self._count("ingest")
        return reply_ok()

    def _overrun(self, message: dict[str, Any]) -> dict[str, Any]:
        """A running share above its memory, reported live by its collector."""
        job_id = str(message.get("job_id", ""))
        if not job_id.replace("_", "").isdigit():
            raise ProtocolError("overrun needs a job_id")
        action = self.config.policy.on_share_exceeded
        self._count("share-overrun")
        _event(logging.WARNING, "share-overrun", job_id=job_id, peak_mib=message.get("peak_mib"),
               limit_mib=message.get("limit_mib"), action=action)
        if action == "requeue":
            self.records.put(self._requeue, job_id)
        return reply_ok(action=action)

    def _requeue(self, job_id: str) -> None:
        """On the writer thread: requeue a job that outgrew its share (its next run is sized
        from the new peak)."""
        try:
            result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True,
                                    text=True, timeout=15)
            ok, detail = result.returncode == 0, (result.stderr or result.stdout).strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            ok, detail = False, type(exc).__name__
        self._count("requeued" if ok else "requeue-failed")
        _event(logging.WARNING if ok else logging.ERROR, "requeued" if ok else "requeue-failed",
               job_id=job_id, detail=detail)

    def _store_summary(self, summary: dict[str, Any]) -> None:
        """On the writer thread: keep the summary and tie the job to its decision, so the
        summary becomes history under the job's fingerprint keys."""
        if not self.store.ingest_summary(summary):
            return
        job_id = str(summary.get("job_id", ""))
        job = lookup_job(job_id) if job_id else None
        linked = bool(job and job.decision_id and self.store.link_decision(
            job.decision_id, job_id, str(summary.get("cluster", ""))))
        if self.estimator is not None:
            self.estimator.invalidate()
        learned = self._learn_coruns(summary, job) if linked else 0
        self._check_share(summary, job)
        _event(logging.INFO, "ingested", job_id=job_id, gpu_index=summary.get("gpu_index"),
               gpu_model=summary.get("gpu_model"), peak_mib=summary.get("mgmap_max_mib"),
               linked=linked, coruns=len(summary.get("coruns") or []), learned=learned)

    def _check_share(self, summary: dict[str, Any], job) -> None:
        """gres/shard sets no hardware limit: record a job that used more than its share, so
        admins see it (log event, counter, report) before a co-runner runs out of memory."""
        shard = parse_tag(job.admin_comment).get("shard") if job else None
        peak = summary.get("mgmap_max_mib")
        if shard is None or peak is None or peak <= int(shard) * 1024:
            return
        self._count("share-exceeded")
        _event(logging.WARNING, "share-exceeded", job_id=job.job_id, share_gib=int(shard),
               peak_mib=peak, gpu_model=summary.get("gpu_model"), uid=job.uid)

    def _learn_coruns(self, summary: dict[str, Any], job) -> int:
        """Record this job's side of each co-run (its class and measured slowdown); a pair
        that now has both sides joins the knowledge base. Returns the sides recorded."""
        from .estimate import config_type_of, observed_runtimes
        from .knowledge import measured_isd

        coruns = [c for c in summary.get("coruns") or [] if c.get("job_id")]
        record = self.store.decision(job.decision_id) if coruns else None
        if not record:
            return 0
        duration = float(summary.get("duration_s") or 0)
        solo = observed_runtimes(self.store.history(record.get("keys", []))).get(
            summary.get("gpu_model", ""))
        gpu_type = config_type_of(summary.get("gpu_model", ""), self.config)
        cluster = str(summary.get("cluster", ""))
        recorded, completed = 0, []
        for corun in coruns:
            other_id = str(corun["job_id"])
            was_complete = _complete(self._corun_row(job.job_id, other_id))
            other = lookup_job(other_id)
            other_class = parse_tag(other.admin_comment).get("class") if other else None
            # A measured slowdown only when the co-run covered (nearly) the whole run.
            isd = (measured_isd(duration, solo) if solo and duration
                   and float(corun.get("overlap_s") or 0) >= 0.8 * duration else None)
            self.store.record_corun(
                job.job_id, str(corun["job_id"]), cluster=cluster,
                gpu_uuid=str(summary.get("gpu_uuid") or ""), overlap_s=corun.get("overlap_s"),
                gpu_type=gpu_type, class_a=record.get("job_class"),
                class_b=int(other_class) if other_class is not None else None, isd_a=isd)
            recorded += 1
            row = self._corun_row(job.job_id, other_id)
            if _complete(row) and not was_complete:
                completed.append(row)
        if completed:
            self._learn_pairs(completed)
        return recorded

    def _corun_row(self, job_id: str, other_id: str) -> dict[str, Any] | None:
        return next((r for r in self.store.coruns_of(job_id) if r["job_b"] == other_id), None)

    def _learn_pairs(self, rows: list[dict[str, Any]]) -> None:
        """Add measured pairs to a copy of the knowledge base and swap it in: decisions on
        other threads keep reading the old one meanwhile, and nothing is rebuilt from the
        whole store (which would hold the GIL longer as the store grows)."""
        from .knowledge import KnowledgeBase

        knowledge = KnowledgeBase.from_dict(self.knowledge.to_dict())
        for row in rows:
            knowledge.observe(row["class_a"], row["class_b"], row["isd_a"], row["isd_b"],
                              ps=row["ps"], gpu_type=row["gpu_type"])
        self.knowledge = knowledge

    def _job(self, message: dict[str, Any], peer: Peer) -> dict[str, Any]:
        """The decision recorded for one job; owners and admins only."""
        job_id = str(message.get("job_id", ""))
        try:
            job = lookup_job(job_id)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        if job is None:
            return reply_error(f"job {job_id} not found")
        if not peer.admin and job.uid != peer.uid:
            return reply_error("permission denied: not your job")
        record, co_runners, telemetry = None, [], []
        if self.store is not None and job.decision_id:
            self.records.flush(2)
            self.store.link_decision(job.decision_id, job_id, self.config.daemon.cluster_name)
            record = self.store.decision(job.decision_id)
            co_runners = [{"job_id": c["job_b"], "class": c["class_b"],
                           "overlap_s": c["overlap_s"], "isd": c["isd_a"]}
                          for c in self.store.coruns_of(job_id)]
            telemetry = [{k: s.get(k) for k in ("gpu_index", "gpu_model", "mgmap_max_mib",
                                                "mgup_max", "mgtsamp_max", "duration_s")}
                         for s in self.store.summaries(job_id)]
        return reply_ok(job={"job_id": job_id, "state": job.state, "nodes": job.nodes,
                             "admin_comment": job.admin_comment, "uid": job.uid},
                        record=record, co_runners=co_runners, telemetry=telemetry)


def _complete(row: dict[str, Any] | None) -> bool:
    """A co-run observation the knowledge base can use: both classes and both slowdowns."""
    return row is not None and None not in (row["class_a"], row["class_b"], row["isd_a"],
                                            row["isd_b"])


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


class _Handler(socketserver.StreamRequestHandler):
    server: "DaemonServer"

    def handle(self) -> None:
        server = self.server
        uid = peer_uid(self.request)
        admin = uid in server.admin_uids()
        if not admin and not server.public:
            _event(logging.WARNING, "peer-refused", uid=uid)
            self._send(reply_error("permission denied"))
            return
        peer = Peer(uid=uid, admin=admin)
        limit = server.predictor.config.daemon.max_request_bytes
        self.request.settimeout(server.predictor.config.daemon.idle_timeout_s)
        while not server.stopping.is_set():
            try:
                line = self.rfile.readline(limit + 1)
            except (socket.timeout, OSError):
                return
            if not line:
                return
            if len(line) > limit and not line.endswith(b"\n"):
                self._send(reply_error(f"request larger than {limit} bytes"))
                _event(logging.WARNING, "oversized-request", uid=uid)
                return  # the rest of the line is unread: the stream cannot be resynchronised
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                server.predictor._count("errors")
                self._send(reply_error("request is not valid JSON"))
                continue
            try:
                reply = server.predictor.handle(message, peer)
            except Exception as exc:  # noqa: BLE001 -- a bug must cost one reply, not the daemon
                log.exception("internal-error", extra={"fields": {"uid": uid}})
                reply = reply_error(f"internal error: {type(exc).__name__}")
            if not self._send(reply):
                return

    def _send(self, reply: dict[str, Any]) -> bool:
        try:
            self.wfile.write(json.dumps(reply, separators=(",", ":")).encode() + b"\n")
            self.wfile.flush()
            return True
        except OSError:
            return False


class DaemonServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """One listening socket. The main one is 0600 (slurmctld, prolog/epilog, admins); the
    public query socket is 0666 and serves only Predictor.USER_OPS, for the caller's uid."""

    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 refuses (EAGAIN) a burst of connections.
    request_queue_size = 256

    def __init__(self, predictor: Predictor, *, public: bool = False,
                 stopping: threading.Event | None = None):
        self.predictor = predictor
        self.public = public
        self.stopping = stopping or threading.Event()
        path = predictor.config.daemon.query_socket if public else predictor.config.daemon.socket
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_socket(path)
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where others can connect
        try:
            super().__init__(path, _Handler)
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o666 if public else 0o600)

    def admin_uids(self) -> set[int]:
        return {0, os.getuid(), *self.predictor.config.daemon.allowed_uids}

    def server_close(self) -> None:
        super().server_close()
        try:
            os.unlink(self.server_address)
        except OSError:
            pass


def _remove_stale_socket(path: str) -> None:
    """Remove a socket left by a dead daemon; refuse to steal a live one."""
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise click.ClickException(f"another daemon is listening on {path}")


def open_store(config: Config) -> Store:
    return Store(Path(config.daemon.state_dir) / "store.sqlite")


def serve(config_path: str | None) -> None:
    config = load_config(config_path)
    setup_logging(config)
    view = SlurmClusterView(config, interval_s=config.daemon.view_refresh_s)
    view.start()
    predictor = Predictor(config, store=open_store(config), reader=open_store(config), view=view)
    stopping = threading.Event()
    servers = [DaemonServer(predictor, stopping=stopping)]
    if config.daemon.query_socket:
        servers.append(DaemonServer(predictor, public=True, stopping=stopping))

    def reload(_signum, _frame):
        try:
            new = load_config(config.path)
        except ConfigError as exc:
            _event(logging.ERROR, "reload-failed", error=str(exc))
            return
        if (new.daemon.socket, new.daemon.query_socket, new.daemon.state_dir) != (
                predictor.config.daemon.socket, predictor.config.daemon.query_socket,
                predictor.config.daemon.state_dir):
            _event(logging.WARNING, "reload-needs-restart",
                   detail="socket paths and state_dir change only on restart")
        setup_logging(new)
        predictor.config = new
        predictor.fingerprinter = Fingerprinter.from_file(new.daemon.secret_file)
        if predictor.estimator is not None:  # a model refit by `models fit`
            predictor.estimator.set_predictor(load_memory_model(new))
        _event(logging.INFO, "reloaded", config=new.path)

    def stop(signum, _frame):
        _event(logging.INFO, "stopping", signal=signal.Signals(signum).name)
        stopping.set()
        # shutdown() waits for serve_forever to return, so call it from other threads.
        for server in servers:
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGHUP, reload)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    _event(logging.INFO, "started", version=__version__, socket=config.daemon.socket,
           query_socket=config.daemon.query_socket, pid=os.getpid(), config=config.path)
    extra = [threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                              daemon=True) for server in servers[1:]]
    for thread in extra:
        thread.start()
    try:
        servers[0].serve_forever(poll_interval=0.5)
    finally:
        for thread in extra:
            thread.join(5)
        for server in servers:
            server.server_close()
        predictor.records.close()
        for store in {predictor.store, predictor.estimator.store if predictor.estimator else None}:
            if store is not None:
                store.close()
        _event(logging.INFO, "stopped")


# The CLI's, tests' and benchmarks' client (one implementation, in protocol.py).
request_once = request


@click.command("serve")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="TOML configuration (default: $GPUSHARE_CONFIG or /etc/slurm-gpushare/gpushare.toml).")
def serve_command(config_path: str | None) -> None:
    """Run the predictor daemon in the foreground."""
    try:
        serve(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot serve: {exc}") from None


@click.command("ping")
@click.option("--config", "config_path", type=click.Path(dir_okay=False))
@click.option("--socket", "socket_path", help="Daemon socket (default: from the config).")
@click.option("--json", "as_json", is_flag=True)
def ping_command(config_path: str | None, socket_path: str | None, as_json: bool) -> None:
    """Check that the daemon answers; print its version and counters."""
    if not socket_path:
        socket_path = load_config(config_path).daemon.socket
    try:
        started = time.perf_counter()
        reply = request_once(socket_path, {"v": 1, "op": "ping"})
        elapsed = (time.perf_counter() - started) * 1000
    except OSError as exc:
        raise click.ClickException(f"daemon not reachable on {socket_path}: {exc.strerror or exc}")
    if as_json:
        click.echo(json.dumps({**reply, "round_trip_ms": round(elapsed, 3)}))
    else:
        click.echo(f"daemon {reply.get('version')} on {socket_path}: {elapsed:.2f} ms; "
                   f"counters {reply.get('counters')}")


@click.command("hook-config")
@click.option("--config", "config_path", type=click.Path(dir_okay=False))
@click.option("--output", "-o", type=click.Path(dir_okay=False), default="-",
              help="Where to write gpushare_hook.json (default: stdout).")
def hook_config_command(config_path: str | None, output: str) -> None:
    """Write the hook's settings (gpushare_hook.json) from the daemon's TOML."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    text = json.dumps(config.hook_settings(), indent=2) + "\n"
    if output == "-":
        click.echo(text, nl=False)
    else:
        tmp = f"{output}.tmp"
        with open(tmp, "w") as handle:
            handle.write(text)
        os.replace(tmp, output)


commands = [serve_command, ping_command, hook_config_command]
