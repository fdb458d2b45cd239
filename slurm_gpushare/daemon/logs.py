"""The daemon's log: JSON lines (ts, level, event, structured fields), never scripts, names or
comments."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from slurm_gpushare.core.config import Config

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


def event(level: int, event: str, **fields) -> None:
    log.log(level, event, extra={"fields": fields})


