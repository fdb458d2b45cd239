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


def test_a_later_run_of_the_same_job_replaces_the_earlier_one(store):
    # Slurm keeps a job's id when it is requeued (preemption, a node failure, a share the
    # product re-sized): the next run is what to learn from, not a duplicate of the first.
    first = summary(start_ts=1000.0, end_ts=1100.0, mgmap_max_mib=5000.0)
    assert store.ingest_summary(first) is True
    assert store.ingest_summary(summary(gpu=1, start_ts=1000.5, end_ts=1100.0)) is True
    again = summary(start_ts=1300.0, end_ts=1500.0, mgmap_max_mib=9000.0)
    assert store.ingest_summary(again) is True
    rows = store.summaries("100", cluster="c1")
    assert [(r["gpu_index"], r["mgmap_max_mib"]) for r in rows] == [(0, 9000.0)]
    assert store.ingest_summary(again) is False  # the spool delivering it twice
    # The earlier run's summaries arriving late (spooled while the daemon was away) are old.
    assert store.ingest_summary(summary(gpu=1, start_ts=1000.5, end_ts=1100.0)) is False
    assert [r["mgmap_max_mib"] for r in store.summaries("100", cluster="c1")] == [9000.0]


def test_a_later_run_under_the_id_is_history_only_under_its_own_decisions_keys(store):
    # Slurm hands out an id again once its counter wraps (MaxJobId) or its state was wiped:
    # the later run under that id must not become history of the script that ran before.
    for decision_id, key in (("old", KEY["exact"]), ("new", KEY["other"])):
        store.record_decision({"decision_id": decision_id, "action": "keep", "code": "default",
                               "reason": "r", "keys": [key]})
    store.ingest_summary(summary(start_ts=1000.0, end_ts=1100.0, mgmap_max_mib=5000.0))
    assert store.link_decision("old", "100", cluster="c1")
    store.ingest_summary(summary(start_ts=9000.0, end_ts=9100.0, mgmap_max_mib=900.0))
    assert store.history([KEY["exact"]]) == []  # not the old script's run
    assert store.link_decision("new", "100", cluster="c1")  # learning ties it to its decision
    assert [s["mgmap_max_mib"] for s in store.history([KEY["other"]])] == [900.0]
    assert store.history([KEY["exact"]]) == []
    # A requeue keeps the job's decision: the later run is history under the same keys.
    store.ingest_summary(summary(start_ts=9500.0, end_ts=9600.0, mgmap_max_mib=950.0))
    assert store.link_decision("new", "100", cluster="c1")
    assert [s["mgmap_max_mib"] for s in store.history([KEY["other"]])] == [950.0]


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


# -- scale: indexes, recent runs, retention ---------------------------------------------------

def test_every_hot_query_uses_an_index(store):
    """Each query on the decision or ingest path searches an index: no full scan, and no sort
    of all of a key's runs (the history query reads the newest runs off the index)."""
    for n in range(30):  # some rows, so the plans are the ones a real store gets
        store.ingest_summary(summary(str(n), keys=[KEY["exact"], KEY["user"]]))
        store.record_decision({"action": "keep", "code": "default", "job_id": str(n)})
        store.record_corun(str(n), str(n + 1))
    store._db.execute("ANALYZE")
    for name, (query, args) in storemod.HOT_QUERIES.items():
        plan = [row[3] for row in store._db.execute("EXPLAIN QUERY PLAN " + query, args)]
        steps = [p for p in plan if p.startswith(("SCAN", "SEARCH"))]
        assert steps and all("INDEX" in p or "PRIMARY KEY" in p for p in steps), (name, plan)
        if name in ("history", "decisions"):
            assert not any("TEMP B-TREE" in p for p in plan), (name, plan)


def _history_v1(db, key, limit=50):
    """The history query of schema version 1 (join and sort): the reference for recent_runs."""
    return [tuple(r) for r in db.execute(
        "SELECT s.cluster, s.job_id, s.gpu_index FROM job_keys k "
        "JOIN summaries s ON s.cluster = k.cluster AND s.job_id = k.job_id "
        "WHERE k.key = ? ORDER BY s.end_ts DESC, s.job_id DESC, s.gpu_index LIMIT ?",
        (key, limit))]


def test_history_reads_the_same_runs_as_a_full_sort(store):
    import random

    rng = random.Random(7)
    keys = [KEY["exact"], KEY["name"], KEY["other"]]
    for n in range(400):
        job = str(1000 + n)
        linked = rng.sample(keys, rng.randint(0, 2))
        end = rng.choice([None, float(rng.randint(0, 50))])  # ties and missing end times
        if rng.random() < 0.5:  # keys at ingest, or linked later by the decision
            store.ingest_summary(summary(job, keys=linked, end_ts=end))
        else:
            store.record_decision({"decision_id": f"d{n}", "action": "keep", "code": "x",
                                   "keys": linked})
            store.ingest_summary(summary(job, end_ts=end, gpu=n % 2))
            store.link_decision(f"d{n}", job, cluster="c1")
    for key in keys:
        expected = _history_v1(store._db, key)
        got = [(s["cluster"], s["job_id"], s["gpu_index"]) for s in store.history([key])]
        # same runs, same order up to ties in (end_ts, job_id)
        assert got == expected


def test_version_1_store_is_migrated_with_its_history(tmp_path, monkeypatch):
    path = tmp_path / "old.db"
    monkeypatch.setattr(storemod, "MIGRATIONS", storemod.MIGRATIONS[:1])
    monkeypatch.setattr(storemod, "SCHEMA_VERSION", 1)
    with Store(path) as old:  # rows as version 1 wrote them
        for job in ("5", "6"):
            old._db.execute("INSERT INTO summaries VALUES ('c1', ?, 0, 0, ?, 'Tesla V100', ?)",
                            (job, float(job), '{"job_id": "%s", "gpu_index": 0}' % job))
            old._db.execute("INSERT INTO job_keys VALUES ('c1', ?, ?)", (job, KEY["exact"]))
    monkeypatch.undo()
    with Store(path) as new:
        assert new.schema_version == SCHEMA_VERSION
        assert [s["job_id"] for s in new.history([KEY["exact"]])] == ["6", "5"]


def test_version_2_co_runs_are_kept_with_their_users_unknown(tmp_path, monkeypatch):
    path = tmp_path / "v2.db"
    monkeypatch.setattr(storemod, "MIGRATIONS", storemod.MIGRATIONS[:2])
    monkeypatch.setattr(storemod, "SCHEMA_VERSION", 2)
    with Store(path) as old:  # a co-run as version 2 wrote it
        old._db.execute("INSERT INTO coruns (cluster, job_a, job_b, ts, isd_a) "
                        "VALUES ('c1', '5', '6', 1.0, 0.3)")
    monkeypatch.undo()
    with Store(path) as new:
        [row] = new.corun_observations()
        assert row["isd_a"] == 0.3 and row["same_user"] is None
        new.record_corun("5", "6", cluster="c1", isd_b=0.1, same_user=True)
        new.record_corun("5", "6", cluster="c1", isd_b=0.2)  # a later report keeps what is known
        [row] = new.corun_observations()
        assert (row["isd_a"], row["isd_b"], row["same_user"]) == (0.3, 0.2, 1)


def test_compact_forgets_old_runs_only(store):
    for n, end in ((1, 100.0), (2, 200.0), (3, 10_000_000.0)):
        store.ingest_summary(summary(str(n), end_ts=end, keys=[KEY["exact"]]))
    store.record_corun("1", "3", cluster="c1")
    assert store.compact(0) == 0  # 0 keeps everything
    removed = store.compact(1.0, now=10_000_000.0 + 3600, batch=1)
    assert removed == 2
    assert [s["job_id"] for s in store.history([KEY["exact"]])] == ["3"]
    assert store.summaries("1", cluster="c1") == [] and store.keys_of_job("1", "c1") == []
    assert store.keys_of_job("3", "c1") == [KEY["exact"]]
    left = store._db.execute("SELECT count(*) FROM recent_runs").fetchone()[0]
    assert left == 1


def test_estimates_are_forgotten_per_key(store):
    """A learned run makes stale only the estimates that read its keys."""
    from slurm_gpushare.core.config import parse_config
    from slurm_gpushare.predict.history import HistoryEstimator

    reads = []

    class Counting:
        def history(self, keys, limit=50):
            reads.append(tuple(keys))
            return store.history(keys, limit)

    estimator = HistoryEstimator(Counting())
    config = parse_config({"gpu_types": {"v100": {"memory_gib": 16}}})
    v100 = "Tesla V100-SXM2-16GB"
    store.ingest_summary(summary("1", keys=[KEY["exact"]], gpu_model=v100))
    store.ingest_summary(summary("2", keys=[KEY["other"]], gpu_model=v100))
    first = estimator.estimate([KEY["exact"]], config)
    estimator.estimate([KEY["other"]], config)
    assert estimator.estimate([KEY["exact"]], config) is first and len(reads) == 2
    store.ingest_summary(summary("3", keys=[KEY["exact"]], gpu_model=v100,
                                 mgmap_max_mib=12000.0))
    estimator.invalidate_keys([KEY["exact"]])
    estimator.estimate([KEY["other"]], config)  # still cached
    assert len(reads) == 2
    again = estimator.estimate([KEY["exact"]], config)
    assert len(reads) == 3 and again != first
