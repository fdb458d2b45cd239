"""The store: job telemetry summaries, decisions and co-run observations in SQLite (WAL).

Ingest is idempotent: a summary is keyed by (cluster, job id, GPU index), so the same job
delivered twice (a retried delivery, a re-read spool file) is one record. The schema is
versioned (``PRAGMA user_version``); ``MIGRATIONS[i]`` takes a database from version ``i`` to
``i + 1`` and runs in one transaction, so a new column is one more function at the end.

Only the fields in ``telemetry.sampler.SUMMARY_FIELDS`` are kept, and the only free text they
may hold is checked against narrow patterns (ids, GPU model names, hex fingerprint keys): the
store has no place for a script, a job name or a model name.

Usage::

    store = Store("/var/lib/slurm-gpushare/gpushare.db")
    store.ingest_summary(summary)                    # True if new
    past = store.history(keys.as_list())             # most specific key's runs first
    store.record_decision(decision.to_dict() | {"keys": keys.as_list()})
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable

from slurm_gpushare.node.telemetry.sampler import SUMMARY_FIELDS, UNATTRIBUTED

_JOB_ID = re.compile(r"^[0-9]+([_+][0-9]+)?$")
_NAME = re.compile(r"^[A-Za-z0-9 ._:+/()\-]{0,128}$")
_KEY = re.compile(r"^[0-9a-f]{64}$")
_CONDITION = re.compile(r"^[a-z0-9:_\-]{1,64}$")
_CODE = re.compile(r"^[a-z0-9_\-]{0,64}$")


# The ``attribution`` of a summary made from Slurm's accounting (gres/gpumem), not by the
# node agent (``daemon/slurm_usage.py``).
SLURM_ACCOUNTING = "slurm-accounting"


class StoreError(ValueError):
    """A record the store refuses (malformed, or carrying text it must not keep)."""


def _v1(db: sqlite3.Connection) -> None:
    # One statement at a time: executescript() would COMMIT the migration's transaction.
    _execute_all(db, """
        CREATE TABLE summaries (
            cluster TEXT NOT NULL, job_id TEXT NOT NULL, gpu_index INTEGER NOT NULL,
            ingested_ts REAL NOT NULL, end_ts REAL, gpu_model TEXT, data TEXT NOT NULL,
            PRIMARY KEY (cluster, job_id, gpu_index));
        CREATE TABLE job_keys (
            cluster TEXT NOT NULL, job_id TEXT NOT NULL, key TEXT NOT NULL,
            PRIMARY KEY (cluster, job_id, key));
        CREATE INDEX job_keys_by_key ON job_keys (key);
        CREATE TABLE decisions (
            decision_id TEXT PRIMARY KEY, ts REAL NOT NULL, cluster TEXT NOT NULL DEFAULT '',
            job_id TEXT, action TEXT, code TEXT, data TEXT NOT NULL);
        CREATE TABLE coruns (
            cluster TEXT NOT NULL, job_a TEXT NOT NULL, job_b TEXT NOT NULL,
            gpu_uuid TEXT NOT NULL DEFAULT '', ts REAL NOT NULL, overlap_s REAL,
            gpu_type TEXT, class_a INTEGER, class_b INTEGER,
            isd_a REAL, isd_b REAL, ps REAL,
            PRIMARY KEY (cluster, job_a, job_b, gpu_uuid));
    """)


def _execute_all(db: sqlite3.Connection, script: str) -> None:
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def _v2(db: sqlite3.Connection) -> None:
    """An index under every hot query. ``recent_runs`` holds one row per (fingerprint key,
    summary) in end-time order, so a key's newest runs are read from the front of an index
    instead of sorting every run of a script resubmitted thousands of times."""
    _execute_all(db, """
        CREATE TABLE recent_runs (
            key TEXT NOT NULL, end_ts REAL NOT NULL, job_id TEXT NOT NULL,
            cluster TEXT NOT NULL, gpu_index INTEGER NOT NULL,
            PRIMARY KEY (key, end_ts, job_id, cluster, gpu_index)) WITHOUT ROWID;
        INSERT OR IGNORE INTO recent_runs (key, end_ts, job_id, cluster, gpu_index)
            SELECT k.key, coalesce(s.end_ts, 0), s.job_id, s.cluster, s.gpu_index
            FROM job_keys k JOIN summaries s ON s.cluster = k.cluster AND s.job_id = k.job_id;
        CREATE INDEX summaries_by_end ON summaries (end_ts);
        CREATE INDEX coruns_by_a ON coruns (job_a);
        CREATE INDEX coruns_by_b ON coruns (job_b);
        CREATE INDEX coruns_by_ts ON coruns (ts);
        CREATE INDEX decisions_by_ts ON decisions (ts);
    """)


def _v3(db: sqlite3.Connection) -> None:
    """Whether a co-run's two jobs belong to one user (1), to two (0), or it is not known
    (NULL, every co-run recorded before): a side's slowdown teaches how much its partner hurts
    only when its user is the partner's (``pairs.PairModel.learn``)."""
    db.execute("ALTER TABLE coruns ADD COLUMN same_user INTEGER")


# MIGRATIONS[i] upgrades schema version i to i + 1. Append, never edit, once released.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1, _v2, _v3]
SCHEMA_VERSION = len(MIGRATIONS)


class Store:
    """One SQLite database; safe to share between threads of one process."""

    def __init__(self, path: str | os.PathLike, *, readonly: bool = False):
        """``readonly``: a reader beside the daemon (reports): never creates, migrates or
        writes, and never waits for the daemon's transactions (WAL)."""
        self.path = Path(path)
        self._lock = threading.RLock()
        if readonly:
            if not self.path.exists():
                raise StoreError(f"{self.path}: no such store")
            self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10.0,
                                       isolation_level=None, check_same_thread=False)
            self._db.row_factory = sqlite3.Row
            try:
                version = self.schema_version
            except sqlite3.DatabaseError as exc:
                self._db.close()
                raise StoreError(f"{self.path}: not a slurm-gpushare store ({exc})") from None
            if version != SCHEMA_VERSION:
                self._db.close()
                raise StoreError(f"{self.path}: schema version {version}, this program "
                                 f"reads {SCHEMA_VERSION}")
            return
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.exists():
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
        self._db = sqlite3.connect(str(path), timeout=10.0, isolation_level=None,
                                   check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL: consistent after a crash, no fsync per record (a power cut may lose
        # the last few records, never corrupt the store).
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=10000")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._migrate()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    def _migrate(self) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                version = self.schema_version
                if version > SCHEMA_VERSION:
                    raise StoreError(f"{self.path}: schema version {version} is newer than "
                                     f"this program's ({SCHEMA_VERSION})")
                for step in MIGRATIONS[version:]:
                    step(self._db)
                self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _tx(self):
        return _Transaction(self._db, self._lock)

    # -- summaries ------------------------------------------------------------------------
    def ingest_summary(self, summary: dict[str, Any]) -> bool:
        """Keep one job-and-GPU summary; True if new, False if already held (then a no-op).

        A summary made from Slurm's own GPU accounting (``attribution`` SLURM_ACCOUNTING)
        only fills in for a job with no summary at all; the node agent's summary of the same
        job, when it comes later, replaces it (it measured more).

        A job keeps its id when Slurm requeues it (preemption, node failure, a share re-sized
        on overrun), and an id comes back once Slurm's counter wraps: a summary of a run that
        started after the held one ended replaces it (and is history only once its decision is
        linked), and one of a run that ended before the held one started is old news."""
        clean = clean_summary(summary)
        with self._tx() as db:
            held = db.execute("SELECT gpu_index, data FROM summaries WHERE cluster = ? AND "
                              "job_id = ?", (clean["cluster"], clean["job_id"])).fetchall()
            if held and clean.get("attribution") == SLURM_ACCOUNTING:
                return False
            olds = [(row["gpu_index"], json.loads(row["data"])) for row in held]
            if any(_later_run(old, clean) for _, old in olds):
                return False
            earlier = {index for index, old in olds if _later_run(clean, old)}
            for index, old in olds:
                if index in earlier or old.get("attribution") == SLURM_ACCOUNTING:
                    for table in ("summaries", "recent_runs"):
                        db.execute(f"DELETE FROM {table} WHERE cluster = ? AND job_id = ? "
                                   "AND gpu_index = ?", (clean["cluster"], clean["job_id"], index))
            if earlier:
                # A requeue, or an id Slurm handed out again (its counter wrapped, or its state
                # was wiped): the run becomes history under the keys of its own decision, which
                # learning links, never under those of whatever ran under the id before.
                db.execute("DELETE FROM job_keys WHERE cluster = ? AND job_id = ?",
                           (clean["cluster"], clean["job_id"]))
            cur = db.execute(
                "INSERT OR IGNORE INTO summaries (cluster, job_id, gpu_index, ingested_ts, "
                "end_ts, gpu_model, data) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (clean["cluster"], clean["job_id"], clean["gpu_index"], time.time(),
                 clean.get("end_ts"), clean.get("gpu_model"), json.dumps(clean, sort_keys=True)))
            new = cur.rowcount == 1
            if new:
                self._link(db, clean["cluster"], clean["job_id"], clean.get("keys", []))
                db.execute(  # keys linked before the summary came (at submit or by decision)
                    "INSERT OR IGNORE INTO recent_runs (key, end_ts, job_id, cluster, gpu_index) "
                    "SELECT key, ?, job_id, cluster, ? FROM job_keys "
                    "WHERE cluster = ? AND job_id = ?",
                    (clean.get("end_ts") or 0, clean["gpu_index"], clean["cluster"],
                     clean["job_id"]))
                for corun in clean.get("coruns", []):
                    if corun["job_id"] != UNATTRIBUTED:
                        self._corun(db, clean["cluster"], clean["job_id"], corun["job_id"],
                                    gpu_uuid=clean.get("gpu_uuid") or "",
                                    overlap_s=corun.get("overlap_s"))
        return new

    def summaries(self, job_id: str, cluster: str = "") -> list[dict[str, Any]]:
        rows = self._db.execute(SUMMARIES_QUERY, (cluster, str(job_id))).fetchall()
        return [json.loads(r["data"]) for r in rows]

    def all_summaries(self) -> list[dict[str, Any]]:
        """Every summary held (e.g. to refit the classes on the site's own jobs)."""
        rows = self._db.execute("SELECT data FROM summaries ORDER BY ingested_ts").fetchall()
        return [json.loads(r["data"]) for r in rows]

    def link_keys(self, job_id: str, keys: Iterable[str], cluster: str = "") -> None:
        """Attach fingerprint keys to a job (e.g. once its decision is matched to its id)."""
        keys = [_check_key(k) for k in keys]
        with self._tx() as db:
            self._link(db, cluster, _check_job(job_id), keys)

    @staticmethod
    def _link(db, cluster: str, job_id: str, keys: Iterable[str]) -> None:
        keys = list(keys)
        db.executemany("INSERT OR IGNORE INTO job_keys (cluster, job_id, key) VALUES (?, ?, ?)",
                       [(cluster, job_id, k) for k in keys])
        db.executemany(  # summaries already held for the job become history under the key
            "INSERT OR IGNORE INTO recent_runs (key, end_ts, job_id, cluster, gpu_index) "
            "SELECT ?, coalesce(end_ts, 0), job_id, cluster, gpu_index FROM summaries "
            "WHERE cluster = ? AND job_id = ?", [(k, cluster, job_id) for k in keys])

    def history(self, fingerprint_keys: list[str], limit: int = 50) -> list[dict[str, Any]]:
        """Past summaries of jobs sharing a fingerprint key, most specific key first.

        ``fingerprint_keys`` in order of specificity (``JobKeys.as_list()``). Within a key,
        newest first. Each summary gains ``matched_key``: the index of the key that found it.
        """
        out, seen = [], set()
        for rank, key in enumerate(fingerprint_keys):
            if not key:
                continue
            rows = self._db.execute(HISTORY_QUERY, (key, limit)).fetchall()
            for row in rows:
                ident = (row["cluster"], row["job_id"], row["gpu_index"])
                if ident in seen:
                    continue
                seen.add(ident)
                summary = json.loads(row["data"])
                summary["matched_key"] = rank
                out.append(summary)
            if len(out) >= limit:
                break
        return out[:limit]

    # -- decisions ------------------------------------------------------------------------
    def record_decision(self, decision: dict[str, Any]) -> bool:
        """Keep a decision (``Decision.to_dict()`` plus optional job_id, cluster, keys,
        job_class); idempotent by ``decision_id`` (one is made if missing). True if new."""
        clean = clean_decision(decision)
        with self._tx() as db:
            return self._insert_decision(db, clean)

    def record_decisions(self, decisions: list[dict[str, Any]]) -> int:
        """``record_decision`` for many, in one transaction; a refused record is skipped (and
        raised after the others are kept). Returns how many were new."""
        cleaned, refused = [], None
        for decision in decisions:
            try:
                cleaned.append(clean_decision(decision))
            except StoreError as exc:
                refused = exc
        with self._tx() as db:
            new = sum(self._insert_decision(db, clean) for clean in cleaned)
        if refused is not None:
            raise refused
        return new

    def _insert_decision(self, db, clean: dict[str, Any]) -> bool:
        cur = db.execute(
            "INSERT OR IGNORE INTO decisions (decision_id, ts, cluster, job_id, action, code, "
            "data) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (clean["decision_id"], clean["ts"], clean["cluster"], clean.get("job_id"),
             clean["action"], clean["code"], json.dumps(clean, sort_keys=True)))
        if cur.rowcount == 1 and clean.get("job_id"):
            self._link(db, clean["cluster"], clean["job_id"], clean.get("keys", []))
        return cur.rowcount == 1

    def link_decision(self, decision_id: str, job_id: str, cluster: str = "") -> bool:
        """Tie a decision made at submit time to the job id Slurm gave the job; links its
        fingerprint keys to the job so the job's telemetry becomes history. False if unknown."""
        job_id = _check_job(job_id)
        with self._tx() as db:
            row = db.execute("SELECT data FROM decisions WHERE decision_id = ?",
                             (decision_id,)).fetchone()
            if row is None:
                return False
            data = json.loads(row["data"])
            data["job_id"], data["cluster"] = job_id, cluster
            db.execute("UPDATE decisions SET job_id = ?, cluster = ?, data = ? "
                       "WHERE decision_id = ?",
                       (job_id, cluster, json.dumps(data, sort_keys=True), decision_id))
            self._link(db, cluster, job_id, data.get("keys", []))
            return True

    def decision(self, decision_id: str) -> dict[str, Any] | None:
        """One decision record by id, or None."""
        row = self._db.execute(DECISION_QUERY, (decision_id,)).fetchone()
        return json.loads(row["data"]) if row else None

    def keys_of_job(self, job_id: str, cluster: str = "") -> list[str]:
        """Fingerprint keys linked to a job (under its cluster or the one-cluster ""), in the
        order they were linked."""
        rows = self._db.execute(KEYS_OF_JOB_QUERY, (job_id, cluster)).fetchall()
        return list(dict.fromkeys(r["key"] for r in rows))

    def decisions(self, limit: int = 100) -> list[dict[str, Any]]:
        rows = self._db.execute(DECISIONS_QUERY, (limit,)).fetchall()
        return [json.loads(r["data"]) for r in rows]

    # -- co-runs --------------------------------------------------------------------------
    def record_corun(self, job_a: str, job_b: str, *, cluster: str = "", gpu_uuid: str = "",
                     overlap_s: float | None = None, gpu_type: str | None = None,
                     class_a: int | None = None, class_b: int | None = None,
                     isd_a: float | None = None, isd_b: float | None = None,
                     ps: float | None = None, same_user: bool | None = None) -> None:
        """Record (or complete) one observation of two jobs sharing a GPU. Known values are
        kept when a later call leaves them None; the overlap is the larger one reported."""
        with self._tx() as db:
            self._corun(db, cluster, _check_job(job_a), _check_job(job_b), gpu_uuid=gpu_uuid,
                        overlap_s=overlap_s, gpu_type=gpu_type, class_a=class_a,
                        class_b=class_b, isd_a=isd_a, isd_b=isd_b, ps=ps, same_user=same_user)

    @staticmethod
    def _corun(db, cluster, job_a, job_b, *, gpu_uuid="", overlap_s=None, gpu_type=None,
               class_a=None, class_b=None, isd_a=None, isd_b=None, ps=None,
               same_user=None) -> None:
        if gpu_type is not None:
            _check_name(gpu_type, "gpu_type")
        _check_name(gpu_uuid or "", "gpu_uuid")
        if _job_order(job_b) < _job_order(job_a):  # one row per unordered pair
            job_a, job_b, class_a, class_b, isd_a, isd_b = job_b, job_a, class_b, class_a, isd_b, isd_a
        db.execute(
            "INSERT INTO coruns (cluster, job_a, job_b, gpu_uuid, ts, overlap_s, gpu_type, "
            "class_a, class_b, isd_a, isd_b, ps, same_user) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (cluster, job_a, job_b, gpu_uuid) DO UPDATE SET "
            "overlap_s = max(coalesce(overlap_s, 0), coalesce(excluded.overlap_s, 0)), "
            "gpu_type = coalesce(excluded.gpu_type, gpu_type), "
            "class_a = coalesce(excluded.class_a, class_a), "
            "class_b = coalesce(excluded.class_b, class_b), "
            "isd_a = coalesce(excluded.isd_a, isd_a), isd_b = coalesce(excluded.isd_b, isd_b), "
            "ps = coalesce(excluded.ps, ps), "
            "same_user = coalesce(excluded.same_user, same_user)",
            (cluster, job_a, job_b, gpu_uuid, time.time(), overlap_s, gpu_type, class_a,
             class_b, isd_a, isd_b, ps, None if same_user is None else int(same_user)))

    def coruns_of(self, job_id: str) -> list[dict[str, Any]]:
        """Co-run observations that involve one job, oriented so that side "a" is the job."""
        job_id = _check_job(job_id)
        rows = self._db.execute(CORUNS_OF_QUERY, (job_id, job_id))
        out = []
        for row in map(dict, rows.fetchall()):
            if row["job_b"] == job_id:
                for a, b in (("job_a", "job_b"), ("class_a", "class_b"), ("isd_a", "isd_b")):
                    row[a], row[b] = row[b], row[a]
            out.append(row)
        return out

    def corun_observations(self) -> list[dict[str, Any]]:
        rows = self._db.execute("SELECT cluster, job_a, job_b, gpu_uuid, ts, overlap_s, "
                                "gpu_type, class_a, class_b, isd_a, isd_b, ps, same_user "
                                "FROM coruns ORDER BY ts").fetchall()
        return [dict(r) for r in rows]


    # -- retention ------------------------------------------------------------------------
    def compact(self, retention_days: float, *, now: float | None = None,
                batch: int = 5000) -> int:
        """Forget runs that ended (decisions, co-runs made) more than ``retention_days`` ago;
        0 keeps everything. Deletes in small transactions so decisions' reads and the writer
        never wait long; SQLite reuses the freed pages for new records. Returns the summaries
        removed."""
        if retention_days <= 0:
            return 0
        cutoff = (now if now is not None else time.time()) - retention_days * 86400
        removed = 0
        while True:
            with self._tx() as db:
                old = db.execute("SELECT cluster, job_id, gpu_index, end_ts FROM summaries "
                                 "WHERE end_ts < ? LIMIT ?", (cutoff, batch)).fetchall()
                for row in old:
                    db.execute("DELETE FROM summaries WHERE cluster = ? AND job_id = ? "
                               "AND gpu_index = ?", (row[0], row[1], row[2]))
                    keys = [k[0] for k in db.execute(
                        "SELECT key FROM job_keys WHERE cluster = ? AND job_id = ?",
                        (row[0], row[1]))]
                    db.executemany("DELETE FROM recent_runs WHERE key = ? AND end_ts = ? AND "
                                   "job_id = ? AND cluster = ? AND gpu_index = ?",
                                   [(k, row[3], row[1], row[0], row[2]) for k in keys])
                    if db.execute("SELECT 1 FROM summaries WHERE cluster = ? AND job_id = ?",
                                  (row[0], row[1])).fetchone() is None:
                        db.execute("DELETE FROM job_keys WHERE cluster = ? AND job_id = ?",
                                   (row[0], row[1]))
            removed += len(old)
            if len(old) < batch:
                break
        with self._tx() as db:
            db.execute("DELETE FROM decisions WHERE ts < ?", (cutoff,))
            db.execute("DELETE FROM coruns WHERE ts < ?", (cutoff,))
        return removed


# The hot queries, named so a test can check each one's plan uses an index.
HISTORY_QUERY = (
    "SELECT s.cluster, s.job_id, s.gpu_index, s.data FROM recent_runs r "
    "JOIN summaries s ON s.cluster = r.cluster AND s.job_id = r.job_id "
    "AND s.gpu_index = r.gpu_index "
    "WHERE r.key = ? ORDER BY r.end_ts DESC, r.job_id DESC LIMIT ?")
DECISIONS_QUERY = "SELECT data FROM decisions ORDER BY ts DESC LIMIT ?"
CORUNS_OF_QUERY = (
    "SELECT cluster, job_a, job_b, gpu_uuid, ts, overlap_s, gpu_type, class_a, class_b, "
    "isd_a, isd_b, ps, same_user FROM coruns WHERE job_a = ? OR job_b = ? ORDER BY ts")
SUMMARIES_QUERY = ("SELECT data FROM summaries WHERE cluster = ? AND job_id = ? "
                   "ORDER BY gpu_index")
DECISION_QUERY = "SELECT data FROM decisions WHERE decision_id = ?"
KEYS_OF_JOB_QUERY = ("SELECT key FROM job_keys WHERE job_id = ? AND cluster IN (?, '') "
                     "ORDER BY rowid")
HOT_QUERIES = {
    "history": (HISTORY_QUERY, ("0" * 64, 50)),
    "decisions": (DECISIONS_QUERY, (100,)),
    "coruns_of": (CORUNS_OF_QUERY, ("1", "1")),
    "summaries": (SUMMARIES_QUERY, ("", "1")),
    "decision": (DECISION_QUERY, ("x",)),
    "keys_of_job": (KEYS_OF_JOB_QUERY, ("1", "")),
}


class _Transaction:
    def __init__(self, db: sqlite3.Connection, lock: threading.RLock):
        self.db, self.lock = db, lock

    def __enter__(self) -> sqlite3.Connection:
        self.lock.acquire()
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")
        finally:
            self.lock.release()


def _job_order(job_id: str) -> tuple[int, str]:
    head = re.match(r"\d+", job_id)
    return (int(head.group()) if head else 0, job_id)


def _check_job(job_id) -> str:
    job_id = str(job_id)
    if not _JOB_ID.match(job_id):
        raise StoreError(f"bad job id {job_id[:20]!r}")
    return job_id


def _check_key(key) -> str:
    if not isinstance(key, str) or not _KEY.match(key):
        raise StoreError("fingerprint keys must be 64 hex digits")
    return key


def _check_name(value, what: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise StoreError(f"bad {what}")
    return value


def _number(value, what: str):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise StoreError(f"{what} must be a number")
    # Telemetry is counts, sizes, percentages and times: finite and never negative.
    if not math.isfinite(value) or not 0 <= value < 2**53:
        raise StoreError(f"{what} is out of range")
    return value


# GPU indices a node may have (NVML's device index).
MAX_GPU_INDEX = 1023


def _later_run(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether summary ``a`` is of a run of the job that started after ``b``'s run ended."""
    start, end = a.get("start_ts"), b.get("end_ts")
    return start is not None and end is not None and start > end


def clean_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary reduced to ``SUMMARY_FIELDS`` with every field checked; raises StoreError."""
    if not isinstance(summary, dict):
        raise StoreError("a summary must be an object")
    try:
        out = _clean_summary(summary)
    except (TypeError, KeyError, AttributeError):
        raise StoreError("a summary field has the wrong shape") from None
    if not 0 <= out["gpu_index"] <= MAX_GPU_INDEX:
        raise StoreError("gpu_index is out of range")
    return out


def _clean_summary(summary: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in SUMMARY_FIELDS:
        if name not in summary:
            continue
        value = summary[name]
        if name == "job_id":
            value = _check_job(value)
        elif name in ("cluster", "gpu_uuid", "gpu_model", "attribution"):
            value = _check_name(value, name) if value is not None else None
        elif name == "keys":
            if not isinstance(value or [], list):
                raise StoreError("keys must be a list")
            value = [_check_key(k) for k in value or []]
        elif name == "conditions":
            value = [c for c in value or [] if isinstance(c, str) and _CONDITION.match(c)]
        elif name == "coruns":
            if not isinstance(value or [], list):
                raise StoreError("coruns must be a list")
            value = [{"job_id": c["job_id"] if c["job_id"] == UNATTRIBUTED
                      else _check_job(c["job_id"]),
                      "overlap_s": _number(c.get("overlap_s"), "overlap_s")}
                     for c in value or []]
        elif name == "shared":
            value = bool(value)
        elif name in ("gpu_index", "samples", "v"):
            value = int(_number(value, name) or 0)
        else:
            value = _number(value, name)
        out[name] = value
    if "job_id" not in out or "gpu_index" not in out:
        raise StoreError("a summary needs job_id and gpu_index")
    out.setdefault("cluster", "")
    out["cluster"] = out["cluster"] or ""
    return out


_DECISION_TEXT = ("reason", "detail")


def clean_decision(decision: dict[str, Any]) -> dict[str, Any]:
    """A decision reduced to what the store keeps. The reason is the product's own sentence."""
    if not isinstance(decision, dict):
        raise StoreError("a decision must be an object")
    action = decision.get("action")
    if action not in ("keep", "share"):
        raise StoreError("decision action must be keep or share")
    out: dict[str, Any] = {
        "decision_id": _check_name(str(decision.get("decision_id") or uuid.uuid4().hex),
                                   "decision_id"),
        "ts": float(_number(decision.get("ts"), "ts") or time.time()),
        "cluster": _check_name(decision.get("cluster") or "", "cluster"),
        "action": action,
        "code": decision.get("code") or "",
        "share_gib": _number(decision.get("share_gib"), "share_gib"),
        "gpu_types": [_check_name(t, "gpu type") for t in decision.get("gpu_types") or []],
        "job_class": _number(decision.get("job_class"), "job_class"),
        "keys": [_check_key(k) for k in decision.get("keys") or []],
    }
    if not _CODE.match(out["code"]):
        raise StoreError("bad decision code")
    for name in _DECISION_TEXT:
        if decision.get(name) is not None:
            out[name] = str(decision[name])[:500]
    if decision.get("job_id"):
        out["job_id"] = _check_job(decision["job_id"])
    details = decision.get("details") or {}
    if isinstance(details, dict) and details.get("source") in ("history", "hint", "default"):
        out["source"] = details["source"]
    for name in ("memory_mib", "runtime_s"):  # per GPU type: what the report checks
        per_type = details.get(name) if isinstance(details, dict) else None
        if isinstance(per_type, dict):
            out[name] = {_check_name(t, "gpu type"): _number(v, name)
                         for t, v in list(per_type.items())[:32]}
    return out
