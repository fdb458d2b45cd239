"""The daemon's log: JSON lines (ts, level, event, structured fields), never scripts, names or
comments. Lines are formatted and written by a writer thread in batches: a request only
appends its record to a queue, without waking any thread, so the log never delays a reply."""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from pathlib import Path

from slurm_gpushare.core.config import Config

log = logging.getLogger("slurm_gpushare.daemon")


# Bounds of one log line: no field, and no line, can be made to fill the disk.
MAX_FIELD_CHARS = 512
MAX_LINE_CHARS = 8192


_PLAIN = (int, float, bool, type(None))


def _bounded(value):
    if type(value) in _PLAIN or (type(value) is str and len(value) <= MAX_FIELD_CHARS):
        return value  # most fields: nothing to bound
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        return value[:MAX_FIELD_CHARS] + "...(truncated)"
    if isinstance(value, (list, tuple)) and len(value) > 32:
        return [_bounded(v) for v in value[:32]] + ["...(truncated)"]
    if isinstance(value, (list, tuple)):
        return [_bounded(v) for v in value]
    if isinstance(value, dict):
        return {str(k)[:64]: _bounded(v) for k, v in list(value.items())[:32]}
    return value


_ENCODER = json.JSONEncoder(default=str)  # one for all lines (json.dumps builds one per call)


def json_line(ts: float, level: str, name: str, fields: dict, error: str | None = None) -> str:
    """One log line: ts, level, event, the structured fields (each bounded), an error."""
    entry = {"ts": round(ts, 3), "level": level, "event": name[:MAX_FIELD_CHARS]}
    entry.update({k: _bounded(v) for k, v in fields.items()})
    if error:
        entry["error"] = error[-4000:]
    line = _ENCODER.encode(entry)
    if len(line) > MAX_LINE_CHARS:
        line = json.dumps({"ts": entry["ts"], "level": entry["level"],
                           "event": entry["event"], "truncated": len(line)})
    return line


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ts, level, event, and the record's structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        return json_line(record.created, record.levelname.lower(), record.getMessage(),
                         getattr(record, "fields", {}),
                         self.formatException(record.exc_info) if record.exc_info else None)


class BatchedHandler(logging.Handler):
    """Queues records; a writer thread writes what has gathered every ``interval_s`` (and at
    close) to ``target``, in one write and one flush."""

    def __init__(self, target: logging.StreamHandler, *, interval_s: float = 0.2,
                 max_pending: int = 100_000):
        super().__init__()
        self.target = target
        self.interval_s = interval_s
        self.max_pending = max_pending
        self.pending: collections.deque[logging.LogRecord] = collections.deque()
        self.dropped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    def handle(self, record: logging.LogRecord) -> bool:
        # No handler lock and no wake-up: deque.append is atomic.
        if len(self.pending) < self.max_pending:
            self.pending.append(record)
        else:
            self.dropped += 1
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.handle(record)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.drain()

    def drain(self) -> None:
        lines = []
        while True:
            try:  # the writer thread and a flush (at exit) may drain at once
                record = self.pending.popleft()
            except IndexError:
                break
            try:
                if isinstance(record, tuple):  # queued by event(): (ts, level, name, fields)
                    ts, level, name, fields = record
                    lines.append(json_line(ts, logging.getLevelName(level).lower(), name,
                                           fields) + "\n")
                else:
                    lines.append(self.target.format(record) + "\n")
            except Exception:  # noqa: BLE001 -- one bad record must not stop the log
                if not isinstance(record, tuple):
                    self.target.handleError(record)
        if self.dropped:
            lines.append(json.dumps({"ts": round(time.time(), 3), "level": "warning",
                                     "event": "log-dropped", "count": self.dropped}) + "\n")
            self.dropped = 0
        if lines:
            with self.target.lock:
                self.target.stream.write("".join(lines))
                self.target.flush()

    def flush(self) -> None:
        self.drain()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5)
        self.drain()
        self.target.close()
        super().close()


def setup_logging(config: Config) -> None:
    target: logging.StreamHandler
    if config.daemon.log_file:
        path = Path(config.daemon.log_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        # 0640: the log holds uids and accounts, not for every local user to read.
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640))
        os.chmod(path, 0o640)
        target = logging.FileHandler(path)
    else:
        target = logging.StreamHandler()
    target.setFormatter(JsonLogFormatter())
    global _batched
    root = logging.getLogger("slurm_gpushare")
    _batched = BatchedHandler(target)
    old, root.handlers[:] = list(root.handlers), [_batched]
    for handler in old:  # a reload: write out what the old handler still holds
        handler.close()
    root.setLevel(config.daemon.log_level.upper())
    root.propagate = False


# The daemon's handler once setup_logging installed it: event() queues to it directly.
_batched: BatchedHandler | None = None


def event(level: int, event: str, **fields) -> None:
    """Log one structured event. With the daemon's batched handler in place, a request only
    appends a tuple to its queue: the LogRecord and the formatting cost nothing on the
    request path (the writer thread formats)."""
    if not log.isEnabledFor(level):
        return
    handler = _batched
    if handler is not None and log.handlers == [] and log.parent.handlers == [handler]:
        handler.handle((time.time(), level, event, fields))
        return
    log.log(level, event, extra={"fields": fields})


