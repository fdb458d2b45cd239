"""The SQLite store: WAL, versioned schema, idempotent ingest, history by fingerprint keys."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from slurm_gpushare.daemon import store as storemod
from slurm_gpushare.daemon.store import SCHEMA_VERSION, Store, StoreError

KEY = {name: (c * 64) for name, c in (("exact", "a"), ("name", "b"), ("user", "c"),
                                       ("other", "d"))}


def summary(job_id="100", gpu=0, **extra):
    base = {"v": 1, "cluster": "c1", "job_id": job_id, "gpu_index": gpu, "gpu_model": "Tesla V100",
            "mem_total_mib": 16384.0, "duration_s": 60.0, "end_ts": float(job_id),
            "mgup_max": 80.0, "mgup_mean": 60.0, "mgmap_max_mib": 8000.0, "mgmap_max_pct": 48.8,
            "mgtsamp_max": 30.0, "mgtsamp_mean": 20.0, "shared": False, "coruns": [],
            "conditions": [], "keys": []}
    return base | extra


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "s.db") as s:
        yield s


def test_wal_and_schema_version(tmp_path, store):
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.schema_version == SCHEMA_VERSION
    store.close()
    with Store(tmp_path / "s.db") as again:  # reopening runs no migration twice
        assert again.schema_version == SCHEMA_VERSION


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "new.db"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="newer"):
        Store(path)


def test_migration_hook_runs_new_steps_once(tmp_path, monkeypatch):
    path = tmp_path / "m.db"
    Store(path).close()
    calls = []

    def v2(db):
        calls.append(1)
        db.execute("ALTER TABLE summaries ADD COLUMN extra TEXT")

    monkeypatch.setattr(storemod, "MIGRATIONS", storemod.MIGRATIONS + [v2])
    monkeypatch.setattr(storemod, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION + 1
    Store(path).close()
    assert calls == [1]


def test_ingest_is_idempotent(store):
    assert store.ingest_summary(summary()) is True
    assert store.ingest_summary(summary(mgup_max=99.0)) is False
    assert store.ingest_summary(summary(gpu=1)) is True
    rows = store.summaries("100", cluster="c1")
    assert [r["gpu_index"] for r in rows] == [0, 1]
    assert rows[0]["mgup_max"] == 80.0


def test_unknown_fields_are_dropped_and_bad_values_refused(store):
    store.ingest_summary(summary(script="#!/bin/sh\nsecret", job_name="n"))
    kept = store.summaries("100", cluster="c1")[0]
    assert "script" not in kept and "job_name" not in kept
    with pytest.raises(StoreError):
        store.ingest_summary(summary() | {"job_id": "12; DROP TABLE"})
    with pytest.raises(StoreError):
        store.ingest_summary(summary(job_id="7", keys=["not-a-key"]))
    with pytest.raises(StoreError):
        store.ingest_summary(summary(job_id="8", mgup_max="high"))


def test_history_most_specific_key_first(store):
    store.ingest_summary(summary("1", keys=[KEY["user"]]))
    store.ingest_summary(summary("2", keys=[KEY["name"], KEY["user"]]))
    store.ingest_summary(summary("3", keys=[KEY["exact"], KEY["name"], KEY["user"]]))
    store.ingest_summary(summary("4", keys=[KEY["exact"], KEY["name"], KEY["user"]]))
    store.ingest_summary(summary("5", keys=[KEY["other"]]))
    found = store.history([KEY["exact"], KEY["name"], KEY["user"]])
    assert [s["job_id"] for s in found] == ["4", "3", "2", "1"]
    assert [s["matched_key"] for s in found] == [0, 0, 1, 2]
    assert store.history([KEY["name"]], limit=1)[0]["job_id"] == "4"
    assert store.history(["e" * 64]) == []


def test_decision_linked_to_job_makes_history(store):
    assert store.record_decision({"decision_id": "abc", "action": "keep", "code": "default",
                                  "reason": "r", "keys": [KEY["exact"]]}) is True
    assert store.record_decision({"decision_id": "abc", "action": "keep", "code": "x"}) is False
    store.ingest_summary(summary("42"))
    assert store.history([KEY["exact"]]) == []
    assert store.link_decision("abc", "42", cluster="c1")
    assert [s["job_id"] for s in store.history([KEY["exact"]])] == ["42"]
    assert store.decisions()[0]["job_id"] == "42"
    assert not store.link_decision("missing", "42")


def test_coruns_from_both_sides_are_one_observation(store):
    store.ingest_summary(summary("10", shared=True, gpu_uuid="GPU-1",
                                 coruns=[{"job_id": "11", "overlap_s": 30.0},
                                         {"job_id": "other", "overlap_s": 5.0}]))
    store.ingest_summary(summary("11", shared=True, gpu_uuid="GPU-1",
                                 coruns=[{"job_id": "10", "overlap_s": 31.5}]))
    store.record_corun("11", "10", cluster="c1", gpu_uuid="GPU-1", class_a=2, class_b=0,
                       isd_a=0.3, isd_b=0.1, gpu_type="v100")
    obs = store.corun_observations()
    assert len(obs) == 1
    row = obs[0]
    assert (row["job_a"], row["job_b"], row["overlap_s"]) == ("10", "11", 31.5)
    # oriented to job_a = 10: its class and slowdown were given as the "b" side
    assert (row["class_a"], row["isd_a"], row["class_b"], row["isd_b"]) == (0, 0.1, 2, 0.3)


def test_concurrent_writers(tmp_path):
    path = tmp_path / "c.db"
    Store(path).close()
    errors = []

    def work(offset):
        try:
            with Store(path) as s:
                for i in range(40):
                    s.ingest_summary(summary(str(offset + i)))
                    s.ingest_summary(summary(str(i)))  # the same jobs from every writer
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(1000 * (n + 1),)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with Store(path) as s:
        assert len(s.all_summaries()) == 40 + 3 * 40
