"""The daemon's TCP listener: telemetry deliveries from agents on other hosts, sealed by munge.

On a multi-host site the agent on a compute node cannot reach the daemon's Unix socket; it
sends its deliveries here instead (``daemon.listen_tcp = "ADDR:PORT"``, off by default). The
network is never trusted: a request line is accepted only if it is

    {"v": 1, "op": "deliver", "items": [ITEM, ...], "auth": "MUNGE:..."}

whose munge credential the local munged decodes (right key, not expired, not replayed), made
by root or SlurmUser (the prolog/epilog identity; ``daemon.tcp_allowed_uids``), over the
SHA-256 of the rest of the message (``slurm/munge.py``). Each ITEM is an agent op with an
``id``: ``{"id": ..., "op": "ingest", "summary": {...}}`` or
``{"id": ..., "op": "overrun", "job_id": ..., "peak_mib": ..., "limit_mib": ...}``. Every
other op is refused, and a refused delivery gets an error reply and one JSON log line (the
peer, the reason; never the payload).

Deliveries are idempotent: the reply lists a result per item, and an item id that was already
handled is answered ``duplicate`` without being handled again (an agent that lost the ack
retries the same items). The ids are remembered in memory (the last ``REMEMBERED_IDS``);
summaries are also idempotent in the store, which keeps one per job and GPU across restarts.

The bounds are the Unix socket's: ``max_request_bytes``, ``max_connections`` (and at most
``CONNECTIONS_PER_HOST`` from one address), ``request_timeout_s`` for a whole request line; a
connection that sends nothing for ``IDLE_S`` is closed.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import socketserver
import threading
import time
from collections import OrderedDict
from typing import Any

from slurm_gpushare import PROTOCOL_VERSION
from slurm_gpushare.core.address import parse_address
from slurm_gpushare.daemon.logs import event, log
from slurm_gpushare.daemon.protocol import ProtocolError, decode_line, peek_op, peek_rid, \
    reply_error, reply_ok
from slurm_gpushare.daemon.server import ConnectionCaps, DaemonError, _Handler, _Oversized
from slurm_gpushare.daemon.service import LogBudget, Peer, Service
from slurm_gpushare.slurm import cmd, munge

# What the network may ask: the agent's own ops, nothing else.
NET_OPS = ("ingest", "overrun")
MAX_ITEMS = 256
CONNECTIONS_PER_HOST = 16
# An agent sends its delivery at once; a connection silent this long holds a slot for nothing.
IDLE_S = 10.0
REMEMBERED_IDS = 100_000
_ITEM_ID = re.compile(r"[0-9a-f]{16,64}")
# How long the SlurmUser looked up from slurmctld is trusted before it is asked again.
SLURM_USER_TTL_S = 600.0


def slurm_user_uid() -> int | None:
    """SlurmUser's uid as the running slurmctld reports it (``scontrol show config``)."""
    text = cmd.output(["scontrol", "show", "config"], timeout=10)
    match = re.search(r"^SlurmUser\s*=\s*\S*?\((\d+)\)", text or "", re.M)
    return int(match.group(1)) if match else None


class DeliveryIds:
    """Item ids already handled (bounded, oldest forgotten first)."""

    def __init__(self, limit: int = REMEMBERED_IDS):
        self.limit = limit
        self.ids: OrderedDict[str, None] = OrderedDict()
        self.lock = threading.Lock()

    def claim(self, item_id: str) -> bool:
        """True if the id is new (it is remembered from now on); False if already held."""
        with self.lock:
            if item_id in self.ids:
                return False
            self.ids[item_id] = None
            while len(self.ids) > self.limit:
                self.ids.popitem(last=False)
            return True

    def forget(self, item_id: str) -> None:
        """An item that failed: its retry must be handled."""
        with self.lock:
            self.ids.pop(item_id, None)


class _NetHandler(_Handler):
    """One TCP connection: delivery lines in, one reply line each (the Unix handler's reads)."""

    server: "NetListener"

    def handle(self) -> None:
        server = self.server
        host = self.client_address[0]
        self.buffer = b""
        while not server.stopping.is_set():
            daemon_config = server.service.config.daemon
            limit = daemon_config.max_request_bytes
            try:
                line = self._read_line(limit, IDLE_S, daemon_config.request_timeout_s)
            except _Oversized:
                self._send(server.refuse(host, "oversized", f"request larger than {limit} bytes",
                                         peek_rid(self.buffer[:4096])))
                return
            except (socket.timeout, OSError):
                return
            if line is None:
                return
            if line.strip() and not self._send(server.deliver(line, host)):
                return


class NetListener(socketserver.ThreadingMixIn, socketserver.TCPServer, ConnectionCaps):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, service: Service, address: str, *,
                 stopping: threading.Event | None = None):
        self.service = service
        self.stopping = stopping or threading.Event()
        self.ids = DeliveryIds()
        ConnectionCaps.__init__(self)  # keyed by peer address
        self._log_budget = LogBudget(per_second=20)
        self._slurm_user: tuple[float, int | None] = (-SLURM_USER_TTL_S, None)
        host, port = parse_address(address, any_port=True)
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            super().__init__((host, port), _NetHandler)
        except OSError as exc:
            raise DaemonError(f"cannot listen on {address}: {exc.strerror or exc}") from None

    @property
    def port(self) -> int:
        return self.server_address[1]

    # -- who may deliver --------------------------------------------------------------------
    def allowed_uids(self) -> set[int]:
        configured = self.service.config.daemon.tcp_allowed_uids
        if configured:
            return set(configured)
        looked_up, uid = self._slurm_user
        if time.monotonic() - looked_up >= SLURM_USER_TTL_S:
            uid = slurm_user_uid()
            self._slurm_user = (time.monotonic(), uid)
        # Without an answer from slurmctld: the daemon's own uid (SlurmUser under the unit).
        return {0, os.getuid() if uid is None else uid}

    # -- admission ----------------------------------------------------------------------------
    def process_request(self, request, client_address) -> None:
        self.admit(request, client_address, client_address[0],
                   self.service.config.daemon.max_connections, CONNECTIONS_PER_HOST)

    def _serve_connection(self, request, client_address, host: str) -> None:
        try:
            _NetHandler(request, client_address, self, uid=-1)
        except Exception:  # noqa: BLE001
            log.exception("connection-error", extra={"fields": {"peer": host}})
        finally:
            self.shutdown_request(request)
            self.release(host)

    # -- deliveries ---------------------------------------------------------------------------
    def refuse(self, host: str, reason: str, error: str, rid=None, uid: int | None = None
               ) -> dict[str, Any]:
        """The reply to a refused delivery, and its log line (bounded: a flood of forgeries
        must not fill the disk)."""
        self.service._count(f"net-refused:{reason}")
        if self._log_budget.allow():
            event(logging.WARNING, "delivery-refused", peer=host, reason=reason,
                  error=error[:200], uid=uid, suppressed=self._log_budget.take_suppressed())
        return reply_error(f"delivery refused: {error[:200]}") | {"rid": rid}

    def deliver(self, line: bytes, host: str) -> dict[str, Any]:
        rid = peek_rid(line)
        if peek_op(line) != "deliver":
            return self.refuse(host, "op-refused", "only munge-sealed deliveries are taken "
                                                   "here", rid)
        try:
            message = decode_line(line)
            if not isinstance(message, dict) or message.get("v") != PROTOCOL_VERSION:
                raise ProtocolError("not a version 1 request object")
        except ProtocolError as exc:
            return self.refuse(host, "bad-request", str(exc), rid)
        try:
            credential = munge.verify(message, self.allowed_uids(),
                                      socket=self.service.config.daemon.munge_socket or None)
        except munge.MungeError as exc:
            return self.refuse(host, exc.reason, str(exc), rid)
        items = message.get("items")
        if not isinstance(items, list) or not 0 < len(items) <= MAX_ITEMS:
            return self.refuse(host, "bad-request", f"items must be 1 to {MAX_ITEMS} ops", rid,
                               credential.uid)
        peer = Peer(uid=credential.uid, admin=True)
        results = [self._item(item, peer, host) for item in items]
        self.service._count("net-deliveries")
        return reply_ok(results=results) | {"rid": rid}

    def _item(self, item: Any, peer: Peer, host: str) -> dict[str, Any]:
        item_id = item.get("id") if isinstance(item, dict) else None
        if not isinstance(item_id, str) or not _ITEM_ID.fullmatch(item_id):
            return {"id": None, "ok": False, "error": "item needs an id (16 to 64 hex digits)"}
        if item.get("op") not in NET_OPS:
            self.service._count("net-refused:op-refused")
            return {"id": item_id, "ok": False,
                    "error": f"op {str(item.get('op'))[:16]!r} is not taken over the network"}
        if not self.ids.claim(item_id):
            self.service._count("net-duplicates")
            return {"id": item_id, "ok": True, "duplicate": True}
        op_message = {k: v for k, v in item.items() if k != "id"} | {"v": PROTOCOL_VERSION}
        reply = self.service.handle(op_message, peer)
        if reply.get("ok"):
            return {"id": item_id, "ok": True}
        self.ids.forget(item_id)
        return {"id": item_id, "ok": False, "error": str(reply.get("error"))[:200]}
