"""How the agent's deliveries reach the daemon, and how the node's spool drains by itself.

A delivery is a list of agent ops (a telemetry summary to ingest, a live overrun report). The
``Link`` sends them either to the daemon's Unix socket (the daemon on this host) or, when
``GPUSHARE_DAEMON_ADDRESS=HOST:PORT`` is set, to its TCP listener as one munge-sealed line
(``daemon/netlistener.py``): ``{"v": 1, "op": "deliver", "items": [...], "auth": ...}``.
Each item carries an id, the SHA-256 of the op itself: a retry of the same spooled summary has
the same id, so a daemon that handled it but whose ack was lost answers ``duplicate``.

What is not acknowledged stays in the node's spool (``<state_dir>/spool``, on the node's own
disk) and is retried by ``drain_loop``: one process per node (a lock file), started detached
by the agent as soon as something is spooled and at each prolog that finds the spool non-empty.
It retries with exponential backoff (1 s doubling to ``BACKOFF_CAP_S``, each wait jittered
between half and all of it, so that nodes cut off together do not return in step) and exits
when the spool is empty. A systemd timer would add a delay of its period to every return of
the network; the loop delivers within ``BACKOFF_CAP_S`` of it.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import time
from pathlib import Path
from typing import Any, Callable

from slurm_gpushare import PROTOCOL_VERSION
from slurm_gpushare.core.address import parse_address
from slurm_gpushare.daemon.protocol import request
from slurm_gpushare.slurm import munge

BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 15.0
# A drainer gives up after this long (the next prolog starts another).
DRAIN_MAX_S = 24 * 3600.0
# Spooled summaries sent in one sealed delivery (one munge credential for all of them).
BATCH = 32
LOCK_NAME = ".drain.lock"
REFUSED_DIR = "refused"


class DeliveryError(RuntimeError):
    """The daemon did not take the delivery (unreachable, or refused it whole)."""


def item_id(op: dict[str, Any]) -> str:
    """The id of one op: the digest of its content (a retry of the same op has the same id)."""
    return munge.digest({k: v for k, v in op.items() if k not in ("id", "v")})


# How long a delivery waits for the daemon's answer before the summary is spooled instead.
DEFAULT_TIMEOUT_S = 5.0


class Link:
    """The way to the daemon: its Unix socket, or its TCP listener when ``address`` is set."""

    def __init__(self, socket_path: str, address: str | None = None,
                 munge_socket: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.socket_path = socket_path
        self.address = parse_address(address) if address else None
        self.munge_socket = munge_socket or None
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        where = f"{self.address[0]}:{self.address[1]}" if self.address else self.socket_path
        return f"Link({where})"

    def send_one(self, op: dict[str, Any]) -> dict[str, Any]:
        """Deliver one op; its result (``ok`` true) or DeliveryError."""
        result = self.send([op])[0]
        if not result.get("ok"):
            raise DeliveryError(f"daemon refused the request: {result.get('error')}")
        return result

    def send(self, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Deliver ops; one result per op (``{"ok": true}`` or ``{"ok": false, "error"}``).
        Raises DeliveryError when nothing was acknowledged (every op may be retried)."""
        if self.address is None:
            return [self._send_local(op) for op in ops]
        items = [{**{k: v for k, v in op.items() if k != "v"}, "id": item_id(op)} for op in ops]
        try:
            sealed = munge.seal({"v": PROTOCOL_VERSION, "op": "deliver", "items": items},
                                socket=self.munge_socket)
        except munge.MungeError as exc:
            raise DeliveryError(f"cannot seal the delivery ({exc.reason})") from None
        reply = self._request(self.address, sealed)
        results = reply.get("results")
        if not isinstance(results, list) or len(results) != len(items):
            raise DeliveryError("daemon sent an unreadable reply")
        return [r if isinstance(r, dict) else {"ok": False, "error": "unreadable"}
                for r in results]

    def _send_local(self, op: dict[str, Any]) -> dict[str, Any]:
        return self._request(self.socket_path, {**op, "v": PROTOCOL_VERSION})

    def _request(self, where, message: dict[str, Any]) -> dict[str, Any]:
        try:
            reply = request(where, message, self.timeout_s)
        except OSError as exc:
            raise DeliveryError(
                f"daemon unreachable ({exc.strerror or type(exc).__name__})") from None
        except ValueError:
            raise DeliveryError("daemon sent an unreadable reply") from None
        if not isinstance(reply, dict):
            raise DeliveryError("daemon refused the request: no reply")
        if not reply.get("ok") and "results" not in reply and self.address is not None:
            raise DeliveryError(f"daemon refused the delivery: {reply.get('error')}")
        return reply


def backoff_s(attempt: int, rand: Callable[[], float] = random.random) -> float:
    """The wait before retry ``attempt`` (0, 1, ...): 1 s doubling up to BACKOFF_CAP_S,
    jittered between half and all of it."""
    ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** min(attempt, 30))
    return ceiling * (0.5 + 0.5 * rand())


def ingest_op(summary: dict[str, Any]) -> dict[str, Any]:
    return {"op": "ingest", "summary": summary}


def drain_once(directory: Path, link: Link, batch: int = BATCH) -> tuple[int, int, int]:
    """Send every spooled summary once (``batch`` to a delivery). Returns (sent, refused,
    left): acknowledged ones are removed; unreadable ones and ones the daemon refused for
    their content go to ``refused/`` for a person (retrying cannot help); others stay. Raises
    DeliveryError, leaving the rest, as soon as the daemon cannot be reached."""
    sent = refused = 0
    paths = sorted(directory.glob("*.json")) if directory.is_dir() else []
    for start in range(0, len(paths), batch):
        chunk, ops = [], []
        for path in paths[start:start + batch]:
            try:
                ops.append(ingest_op(json.loads(path.read_text())))
                chunk.append(path)
            except FileNotFoundError:
                continue  # another drain took it
            except (OSError, ValueError):
                _set_aside(path)
                refused += 1
        if not ops:
            continue
        results = link.send(ops)
        for path, result in zip(chunk, results):
            if result.get("ok"):
                path.unlink(missing_ok=True)
                sent += 1
            elif str(result.get("error", "")).startswith("summary refused"):
                _set_aside(path)
                refused += 1
    left = len(list(directory.glob("*.json"))) if directory.is_dir() else 0
    return sent, refused, left


def _set_aside(path: Path) -> None:
    target = path.parent / REFUSED_DIR
    try:
        target.mkdir(exist_ok=True)
        path.replace(target / path.name)
    except OSError:
        pass


def drain_loop(directory: str | os.PathLike, link: Link, *, log: Callable[[str], None],
               max_s: float = DRAIN_MAX_S, sleep: Callable[[float], None] = time.sleep,
               rand: Callable[[], float] = random.random) -> tuple[int, int] | None:
    """Drain the spool until it is empty, retrying with backoff; one drainer per spool (a lock
    file): returns None at once if another holds it, else (sent, refused)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lock = os.open(directory / LOCK_NAME, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return None
        deadline = time.monotonic() + max_s
        sent = refused = attempt = 0
        while True:
            try:
                done, bad, left = drain_once(directory, link)
                sent, refused = sent + done, refused + bad
                if not left:
                    break
                if done or bad:
                    attempt = 0
                    continue
                raise DeliveryError(f"the daemon kept {left} summaries for later")
            except DeliveryError as exc:
                wait = backoff_s(attempt)
                attempt += 1
                if time.monotonic() + wait > deadline:
                    log(f"spool drain gave up for now: {exc}")
                    break
                if attempt in (1, 5) or attempt % 50 == 0:
                    log(f"spool drain: {exc}; retry {attempt} in {wait:.1f}s")
                sleep(wait)
        return sent, refused
    finally:
        os.close(lock)
