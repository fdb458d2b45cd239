"""The predictor daemon's sockets and lifecycle: ``slurm-gpushare serve``.

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
import signal
import socket
import socketserver
import struct
import threading
import time
from pathlib import Path
from typing import Any

from slurm_gpushare import __version__
from slurm_gpushare.core import signals
from slurm_gpushare.core.config import Config, ConfigError, load_config
from slurm_gpushare.daemon.clusterview import SlurmClusterView
from slurm_gpushare.daemon.fingerprint import Fingerprinter
from slurm_gpushare.daemon.logs import event, log, setup_logging
from slurm_gpushare.daemon.protocol import (ProtocolError, decode_line, peek_op, peek_rid,
                                            reply_error)
from slurm_gpushare.daemon.service import Peer, Service
from slurm_gpushare.daemon.store import Store
from slurm_gpushare.daemon.validity import config_problem
from slurm_gpushare.predict.persist import load_classes_model, load_memory_model


class DaemonError(Exception):
    """The daemon cannot start (e.g. another one holds the socket)."""


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


class _Handler(socketserver.BaseRequestHandler):
    """One connection: request lines in, reply lines out, within the server's bounds."""

    server: "DaemonServer"

    def __init__(self, request, client_address, server, uid: int):
        self.uid = uid
        super().__init__(request, client_address, server)

    def handle(self) -> None:
        server = self.server
        uid = self.uid
        admin = uid in server.admin_uids()
        if not admin and not server.public:
            event(logging.WARNING, "peer-refused", uid=uid)
            self._send(reply_error("permission denied") | {"rid": None})
            return
        peer = Peer(uid=uid, admin=admin)
        self.buffer = b""
        while not server.stopping.is_set():
            daemon_config = server.service.config.daemon
            limit = server.request_limit()
            try:
                line = self._read_line(limit, daemon_config.idle_timeout_s,
                                       daemon_config.request_timeout_s)
            except _Oversized:
                self._send(reply_error(f"request larger than {limit} bytes")
                           | {"rid": peek_rid(self.buffer[:4096])})
                server.service._count("errors")
                return  # the rest of the line is unread: the stream cannot be resynchronised
            except (socket.timeout, OSError):
                return  # idle, too slow (whole-request deadline) or gone
            if line is None:
                return
            if not line.strip():
                continue
            reply = self._reply(line, peer)
            if not self._send(reply):
                return

    def _reply(self, line: bytes, peer: Peer) -> dict[str, Any]:
        server = self.server
        if server.public:
            op = peek_op(line)
            # The query socket serves users' read-only ops to everyone who can connect, each
            # uid at a bounded rate; checked on the raw line, before any decoding.
            if op not in Service.USER_OPS:
                server.service._count("refused")
                return reply_error(f"op {op!r} is not available on this socket"
                                   if op else "request names no op") | {"rid": peek_rid(line)}
            if not server.rate.allow(peer.uid):
                server.service._count("rate-limited")
                return reply_error("too many requests; slow down") | {"rid": peek_rid(line)}
        try:
            message = decode_line(line)
        except ProtocolError as exc:
            return server.service.refusal(peek_op(line), str(exc), peer) | {"rid": peek_rid(line)}
        return server.service.handle(message, peer)

    def _read_line(self, limit: int, idle_s: float, request_s: float) -> bytes | None:
        """The next line, or None at end of stream. Waits ``idle_s`` for a request to begin;
        once it has begun the whole line must arrive within ``request_s`` (a client that
        trickles bytes is dropped, whatever its pace)."""
        sock = self.request
        deadline = time.monotonic() + request_s if self.buffer else None
        while b"\n" not in self.buffer:
            if len(self.buffer) > limit:
                raise _Oversized
            if deadline is None:
                sock.settimeout(idle_s)
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout("request deadline")
                sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                return None
            if deadline is None:
                deadline = time.monotonic() + request_s
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        if len(line) > limit:
            raise _Oversized
        return line

    def _send(self, reply: dict[str, Any]) -> bool:
        try:
            self.request.settimeout(self.server.service.config.daemon.request_timeout_s)
            self.request.sendall(json.dumps(reply, separators=(",", ":")).encode() + b"\n")
            return True
        except OSError:
            return False


class _Oversized(Exception):
    pass


class RateLimit:
    """A token bucket per uid: ``rate`` requests a second on average, bursts of ``burst``."""

    def __init__(self, rate: float, burst: float):
        self.rate, self.burst = rate, burst
        self.buckets: dict[int, tuple[float, float]] = {}
        self.lock = threading.Lock()

    def allow(self, uid: int) -> bool:
        now = time.monotonic()
        with self.lock:
            tokens, last = self.buckets.get(uid, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            allowed = tokens >= 1
            self.buckets[uid] = (tokens - 1 if allowed else tokens, now)
            if len(self.buckets) > 10_000:  # forget idle users
                self.buckets = {u: b for u, b in self.buckets.items() if now - b[1] < 60}
            return allowed


class ConnectionCaps:
    """Open connections counted per key (a uid, a peer address): one over a cap is answered
    "too many connections" and closed, without a thread. The server provides ``service`` and
    ``_serve_connection(request, client_address, key)``, which ends with ``release(key)``."""

    def __init__(self) -> None:
        self.open: dict = {}  # key -> open connections
        self.open_lock = threading.Lock()

    def admit(self, request, client_address, key, total_cap: int,
              key_cap: int | None = None) -> None:
        with self.open_lock:
            refused = (sum(self.open.values()) >= total_cap
                       or (key_cap is not None and self.open.get(key, 0) >= key_cap))
            if not refused:
                self.open[key] = self.open.get(key, 0) + 1
        if refused:
            self.service._count("connections-refused")
            try:
                request.setblocking(False)
                request.send(json.dumps(reply_error("too many connections") | {"rid": None})
                             .encode() + b"\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            threading.Thread(target=self._serve_connection, args=(request, client_address, key),
                             daemon=True).start()
        except RuntimeError:  # no thread to be had: refuse, do not crash the accept loop
            self.release(key)
            self.shutdown_request(request)

    def release(self, key) -> None:
        with self.open_lock:
            self.open[key] -= 1
            if not self.open[key]:
                del self.open[key]


class DaemonServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer, ConnectionCaps):
    """One listening socket. The main one is 0600 (slurmctld, prolog/epilog, admins); the
    public query socket is 0666 and serves only Service.USER_OPS, for the caller's uid.

    Bounded: at most ``max_connections`` open connections (the query socket also at most
    ``query_connections_per_uid`` per user, and ``query_rate_per_s`` requests a second per
    user); one more is answered with an error and closed, without a thread."""

    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 refuses (EAGAIN) a burst of connections.
    request_queue_size = 256

    def __init__(self, service: Service, *, public: bool = False,
                 stopping: threading.Event | None = None):
        self.service = service
        self.public = public
        self.stopping = stopping or threading.Event()
        daemon_config = service.config.daemon
        self.rate = RateLimit(daemon_config.query_rate_per_s, 2 * daemon_config.query_rate_per_s)
        ConnectionCaps.__init__(self)  # keyed by uid
        path = daemon_config.query_socket if public else daemon_config.socket
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_socket(path)
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where others can connect
        try:
            super().__init__(path, _Handler)
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o666 if public else 0o600)

    def admin_uids(self) -> set[int]:
        return {0, os.getuid(), *self.service.config.daemon.allowed_uids}

    def request_limit(self) -> int:
        daemon_config = self.service.config.daemon
        if self.public:
            return min(daemon_config.max_request_bytes, daemon_config.query_max_request_bytes)
        return daemon_config.max_request_bytes

    def process_request(self, request, client_address) -> None:
        """Admit the connection within the caps (else one error line, closed), then serve it
        on its own thread."""
        try:
            uid = peer_uid(request)
        except OSError:
            self.shutdown_request(request)
            return
        daemon_config = self.service.config.daemon
        if self.public:
            self.admit(request, client_address, uid, daemon_config.query_max_connections,
                       daemon_config.query_connections_per_uid)
        else:
            self.admit(request, client_address, uid, daemon_config.max_connections)

    def _serve_connection(self, request, client_address, uid: int) -> None:
        try:
            _Handler(request, client_address, self, uid)
        except Exception:  # noqa: BLE001
            log.exception("connection-error", extra={"fields": {"uid": uid}})
        finally:
            self.shutdown_request(request)
            self.release(uid)

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
    raise DaemonError(f"another daemon is listening on {path}")


STORE_FILE = "store.sqlite"  # under daemon.state_dir


def open_store(config: Config) -> Store:
    return Store(Path(config.daemon.state_dir) / STORE_FILE)


def _reload(service: Service, view: SlurmClusterView) -> None:
    """SIGHUP: read the configuration file again; one that fails to load or to check keeps
    the running configuration."""
    try:
        new = load_config(service.config.path)
    except ConfigError as exc:
        event(logging.ERROR, "reload-failed", error=str(exc))
        return
    problem = config_problem(new, view.all_features, view.all_partitions)
    if problem is not None:
        event(logging.ERROR, "reload-refused", config=new.path, problem=problem,
              detail="the running configuration stays")
        return
    if (new.daemon.socket, new.daemon.query_socket, new.daemon.state_dir,
            new.daemon.listen_tcp) != (
            service.config.daemon.socket, service.config.daemon.query_socket,
            service.config.daemon.state_dir, service.config.daemon.listen_tcp):
        event(logging.WARNING, "reload-needs-restart",
              detail="socket paths, listen_tcp and state_dir change only on restart")
    setup_logging(new)
    service.config = new
    service.fingerprinter = Fingerprinter.from_file(new.daemon.secret_file)
    if service.estimator is not None:  # models refit by `models fit` / `classes fit`
        service.estimator.set_predictor(load_memory_model(new))
        service.estimator.set_classes(load_classes_model(new))
    event(logging.INFO, "reloaded", config=new.path)


DAEMON_SIGNALS = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)  # reload; stop; stop


def serve(config_path: str | None) -> None:
    config = load_config(config_path)
    setup_logging(config)
    stopping = threading.Event()
    servers: list[socketserver.BaseServer] = []
    service: Service | None = None  # None until the first view is read

    def on_signal(signum: int) -> None:  # from a watcher thread: see core/signals.py
        if signum != signal.SIGHUP:
            event(logging.INFO, "stopping", signal=signal.Signals(signum).name)
            stopping.set()  # before looking at `servers`: serve checks it after filling them
            # shutdown() waits for serve_forever to return, so call it from other threads.
            for server in list(servers):
                threading.Thread(target=server.shutdown, daemon=True).start()
        elif service is None:
            event(logging.WARNING, "reload-ignored",
                  detail="still starting: the configuration just read is the one used")
        else:
            _reload(service, view)

    # First, so that a signal during start-up (the first view waits as long as sinfo does)
    # is acted on, never fatal: a SIGHUP there used to kill the daemon.
    signals.handle_in_thread(DAEMON_SIGNALS, on_signal, name="daemon-signals")
    view = SlurmClusterView(config, interval_s=config.daemon.view_refresh_s)
    # Read the nodes once before the sockets open: until then every decision would keep its
    # job ("not-checkable"). A Slurm that does not answer only delays this by sinfo's timeout.
    try:
        view.refresh()
    except Exception:  # noqa: BLE001 -- the background refresh keeps trying
        log.exception("cluster-view-refresh-failed")
    if stopping.is_set():
        event(logging.INFO, "stopped")
        return
    view.start()
    service = Service(config, store=open_store(config), reader=open_store(config), view=view)
    servers.append(DaemonServer(service, stopping=stopping))
    if config.daemon.query_socket:
        servers.append(DaemonServer(service, public=True, stopping=stopping))
    if config.daemon.listen_tcp:
        from slurm_gpushare.daemon.netlistener import NetListener

        servers.append(NetListener(service, config.daemon.listen_tcp, stopping=stopping))
    extra = [threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                              daemon=True) for server in servers[1:]]
    try:
        # A stop that came while `servers` was being filled may have shut only some of them.
        if not stopping.is_set():
            event(logging.INFO, "started", version=__version__, socket=config.daemon.socket,
                  query_socket=config.daemon.query_socket,
                  listen_tcp=config.daemon.listen_tcp, pid=os.getpid(), config=config.path)
            for thread in extra:
                thread.start()
            servers[0].serve_forever(poll_interval=0.5)
    finally:
        for thread in extra:
            if thread.is_alive():
                thread.join(5)
        for server in servers:
            server.server_close()
        service.records.close()
        for store in {service.store, service.estimator.store if service.estimator else None}:
            if store is not None:
                store.close()
        event(logging.INFO, "stopped")


