"""The daemon's log: JSON lines (ts, level, event, structured fields), never scripts, names or
comments."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from slurm_gpushare.core.config import Config

log = logging.getLogger("slurm_gpushare.daemon")


# Bounds of one log line: no field, and no line, can be made to fill the disk.
MAX_FIELD_CHARS = 512
MAX_LINE_CHARS = 8192


def _bounded(value):
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        return value[:MAX_FIELD_CHARS] + "...(truncated)"
    if isinstance(value, (list, tuple)) and len(value) > 32:
        return [_bounded(v) for v in value[:32]] + ["...(truncated)"]
    if isinstance(value, (list, tuple)):
        return [_bounded(v) for v in value]
    if isinstance(value, dict):
        return {str(k)[:64]: _bounded(v) for k, v in list(value.items())[:32]}
    return value


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ts, level, event, and the record's structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(record.created, 3), "level": record.levelname.lower(),
                 "event": record.getMessage()[:MAX_FIELD_CHARS]}
        entry.update({k: _bounded(v) for k, v in getattr(record, "fields", {}).items()})
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)[-4000:]
        line = json.dumps(entry, sort_keys=False, default=str)
        if len(line) > MAX_LINE_CHARS:
            line = json.dumps({"ts": entry["ts"], "level": entry["level"],
                               "event": entry["event"], "truncated": len(line)})
        return line


def setup_logging(config: Config) -> None:
    handler: logging.Handler
    if config.daemon.log_file:
        path = Path(config.daemon.log_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        # 0640: the log holds uids and accounts, not for every local user to read.
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640))
        os.chmod(path, 0o640)
        handler = logging.FileHandler(path)
    else:
        handler = logging.StreamHandler()
    handler.setFormatter(JsonLogFormatter())
    root = logging.getLogger("slurm_gpushare")
    root.handlers[:] = [handler]
    root.setLevel(config.daemon.log_level.upper())
    root.propagate = False


def event(level: int, event: str, **fields) -> None:
    log.log(level, event, extra={"fields": fields})


