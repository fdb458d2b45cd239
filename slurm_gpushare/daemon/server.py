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
from pathlib import Path
from typing import Any

from slurm_gpushare import __version__
from slurm_gpushare.core.config import Config, ConfigError, load_config
from slurm_gpushare.daemon.clusterview import SlurmClusterView
from slurm_gpushare.daemon.fingerprint import Fingerprinter
from slurm_gpushare.daemon.logs import event, log, setup_logging
from slurm_gpushare.daemon.protocol import reply_error
from slurm_gpushare.daemon.service import Peer, Service
from slurm_gpushare.daemon.store import Store
from slurm_gpushare.predict.persist import load_memory_model


class DaemonError(Exception):
    """The daemon cannot start (e.g. another one holds the socket)."""


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
            event(logging.WARNING, "peer-refused", uid=uid)
            self._send(reply_error("permission denied"))
            return
        peer = Peer(uid=uid, admin=admin)
        limit = server.service.config.daemon.max_request_bytes
        self.request.settimeout(server.service.config.daemon.idle_timeout_s)
        while not server.stopping.is_set():
            try:
                line = self.rfile.readline(limit + 1)
            except (socket.timeout, OSError):
                return
            if not line:
                return
            if len(line) > limit and not line.endswith(b"\n"):
                self._send(reply_error(f"request larger than {limit} bytes"))
                event(logging.WARNING, "oversized-request", uid=uid)
                return  # the rest of the line is unread: the stream cannot be resynchronised
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                server.service._count("errors")
                self._send(reply_error("request is not valid JSON"))
                continue
            try:
                reply = server.service.handle(message, peer)
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
    public query socket is 0666 and serves only Service.USER_OPS, for the caller's uid."""

    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 refuses (EAGAIN) a burst of connections.
    request_queue_size = 256

    def __init__(self, service: Service, *, public: bool = False,
                 stopping: threading.Event | None = None):
        self.service = service
        self.public = public
        self.stopping = stopping or threading.Event()
        path = service.config.daemon.query_socket if public else service.config.daemon.socket
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


def open_store(config: Config) -> Store:
    return Store(Path(config.daemon.state_dir) / "store.sqlite")


def serve(config_path: str | None) -> None:
    config = load_config(config_path)
    setup_logging(config)
    view = SlurmClusterView(config, interval_s=config.daemon.view_refresh_s)
    # Read the nodes once before the sockets open: until then every decision would keep its
    # job ("not-checkable"). A Slurm that does not answer only delays this by sinfo's timeout.
    try:
        view.refresh()
    except Exception:  # noqa: BLE001 -- the background refresh keeps trying
        log.exception("cluster-view-refresh-failed")
    view.start()
    service = Service(config, store=open_store(config), reader=open_store(config), view=view)
    stopping = threading.Event()
    servers = [DaemonServer(service, stopping=stopping)]
    if config.daemon.query_socket:
        servers.append(DaemonServer(service, public=True, stopping=stopping))

    def reload(_signum, _frame):
        try:
            new = load_config(config.path)
        except ConfigError as exc:
            event(logging.ERROR, "reload-failed", error=str(exc))
            return
        if (new.daemon.socket, new.daemon.query_socket, new.daemon.state_dir) != (
                service.config.daemon.socket, service.config.daemon.query_socket,
                service.config.daemon.state_dir):
            event(logging.WARNING, "reload-needs-restart",
                   detail="socket paths and state_dir change only on restart")
        setup_logging(new)
        service.config = new
        service.fingerprinter = Fingerprinter.from_file(new.daemon.secret_file)
        if service.estimator is not None:  # a model refit by `models fit`
            service.estimator.set_predictor(load_memory_model(new))
        event(logging.INFO, "reloaded", config=new.path)

    def stop(signum, _frame):
        event(logging.INFO, "stopping", signal=signal.Signals(signum).name)
        stopping.set()
        # shutdown() waits for serve_forever to return, so call it from other threads.
        for server in servers:
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGHUP, reload)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    event(logging.INFO, "started", version=__version__, socket=config.daemon.socket,
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
        service.records.close()
        for store in {service.store, service.estimator.store if service.estimator else None}:
            if store is not None:
                store.close()
        event(logging.INFO, "stopped")


