"""The request path does no writing: decisions and log lines are queued and written in
batches by their own threads; a script sent once travels as its digest afterwards."""

from __future__ import annotations

import json
import logging
import time

from slurm_gpushare.daemon.logs import BatchedHandler, JsonLogFormatter
from slurm_gpushare.daemon.protocol import request as request_once
from slurm_gpushare.daemon.service import Peer, RecordWriter
from slurm_gpushare.daemon.store import Store

JOB = {"uid": 1000, "user": "alice", "partition": "gpu", "tres_per_node": "gres:gpu:1",
       "min_nodes": 4294967294, "shared": 65534, "script": "#!/bin/sh\npython train.py\n"}


def test_decisions_are_written_in_batches_and_a_bad_one_loses_no_other(tmp_path):
    store = Store(tmp_path / "s.db")
    transactions = []
    record_decisions = store.record_decisions

    def counting(decisions):
        transactions.append(len(decisions))
        return record_decisions(decisions)

    store.record_decisions = counting
    writer = RecordWriter(store, interval_s=0.2)
    try:
        for n in range(200):
            writer.put_decision({"decision_id": f"d{n}", "action": "keep", "code": "default"})
        writer.put_decision({"decision_id": "bad", "action": "explode"})
        assert store.decision("d0") is None  # nothing written on the caller's thread
        writer.flush()
        assert all(store.decision(f"d{n}") for n in range(200))
        assert store.decision("bad") is None
        assert sum(transactions) == 201 and len(transactions) <= 3
    finally:
        writer.close()
        store.close()


def test_other_work_runs_after_the_decisions_queued_before_it(tmp_path):
    store = Store(tmp_path / "s.db")
    writer = RecordWriter(store, interval_s=0.2)
    seen = []
    try:
        writer.put_decision({"decision_id": "d1", "action": "keep", "code": "default"})
        writer.put(lambda: seen.append(store.decision("d1") is not None))
        writer.flush()
        assert seen == [True]
    finally:
        writer.close()
        store.close()


def test_log_lines_are_written_by_the_writer_thread_in_one_go(tmp_path):
    path = tmp_path / "daemon.log"
    target = logging.FileHandler(path)
    target.setFormatter(JsonLogFormatter())
    handler = BatchedHandler(target, interval_s=0.2)
    logger = logging.getLogger("test-batched")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        for n in range(50):
            logger.info("decision", extra={"fields": {"n": n}})
        assert path.read_text() == ""  # the caller wrote nothing
        deadline = time.monotonic() + 5
        while path.read_text().count("\n") < 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert path.read_text().count('"event": "decision"') == 50
        logger.warning("last words")
    finally:
        logger.removeHandler(handler)
        handler.close()  # writes what is still queued
    assert path.read_text().splitlines()[-1].startswith('{"ts"')
    assert '"event": "last words"' in path.read_text()


def test_the_reply_carries_the_digest_that_stands_for_the_script(daemon):
    first = request_once(daemon.socket, {"v": 1, "op": "decide", "job": JOB})
    digest = first["script_digest"]
    assert len(digest) == 64
    by_digest = {k: v for k, v in JOB.items() if k != "script"} | {"script_digest": digest}
    second = request_once(daemon.socket, {"v": 1, "op": "decide", "job": by_digest})
    assert second["ok"] and second["script_digest"] == digest
    daemon.service.records.flush()
    keys = [daemon.service.store.decision(r["decision"]["decision_id"])["keys"]
            for r in (first, second)]
    assert keys[0] == keys[1]  # the same history either way
    bad = request_once(daemon.socket, {"v": 1, "op": "decide",
                                       "job": by_digest | {"script_digest": "x" * 64}})
    # The request's own mistake: the job is kept as submitted, not a daemon failure.
    assert bad["ok"] and bad["decision"]["code"] == "bad-request"
    assert "script_digest" in bad["decision"]["reason"]
    unknown = request_once(daemon.socket, {"v": 1, "op": "decide",
                                           "job": by_digest | {"script_digest": "a" * 64}})
    assert unknown["decision"]["action"] == "keep" and "unknown script digest" in \
        unknown["decision"]["reason"]


def test_what_the_script_said_still_counts_when_it_travels_as_its_digest(daemon):
    """A script whose srun steps ask for GPUs is kept whole, also when resubmitted as its
    digest (the daemon remembers what it read in the text)."""
    job = JOB | {"batch": True, "script": "#!/bin/sh\nsrun --gres=gpu:1 python train.py\n"}
    first = request_once(daemon.socket, {"v": 1, "op": "decide", "job": job})
    assert first["decision"]["code"] == "steps-need-gpu"
    by_digest = {k: v for k, v in job.items() if k != "script"} | {
        "script_digest": first["script_digest"]}
    second = request_once(daemon.socket, {"v": 1, "op": "decide", "job": by_digest})
    assert second["decision"]["code"] == "steps-need-gpu"


def test_users_cannot_pass_a_digest_for_a_script_they_did_not_send(daemon):
    digest = request_once(daemon.socket, {"v": 1, "op": "decide", "job": JOB})["script_digest"]
    job = {k: v for k, v in JOB.items() if k != "script"} | {"script_digest": digest}
    user = Peer(uid=1000, admin=False)
    reply = daemon.service.handle({"v": 1, "op": "explain", "job": job}, user)
    assert reply["ok"] and "script_digest" not in reply
    plain = daemon.service.handle({"v": 1, "op": "explain", "job": {
        k: v for k, v in job.items() if k != "script_digest"}}, user)["decision"]
    assert (reply["decision"]["code"], reply["decision"]["reason"]) == (plain["code"],
                                                                        plain["reason"])


def test_events_queue_without_a_log_record_and_are_written_bounded(tmp_path):
    """event() on the daemon's handler appends a tuple (no LogRecord, no formatting on the
    request path); the writer formats it like any other line, each field bounded."""
    from slurm_gpushare.core.config import parse_config
    from slurm_gpushare.daemon import logs

    path = tmp_path / "daemon.log"
    config = parse_config({"daemon": {"log_file": str(path), "log_level": "info"}})
    logs.setup_logging(config)
    handler = logs._batched
    try:
        logs.event(logging.INFO, "decision", id="d1", reason="x" * 5000, writes={"a": "b"})
        logs.event(logging.DEBUG, "noise", id="d2")  # below the level: not even queued
        assert [type(item) for item in handler.pending] == [tuple]
        handler.drain()
        entry = json.loads(path.read_text())
        assert entry["event"] == "decision" and entry["level"] == "info"
        assert entry["id"] == "d1" and entry["writes"] == {"a": "b"}
        assert entry["reason"].endswith("...(truncated)") and len(entry["reason"]) < 600
    finally:
        root = logging.getLogger("slurm_gpushare")
        root.handlers[:] = []
        handler.close()
        logs._batched = None


def test_the_hooks_brief_reply_carries_what_it_reads_and_nothing_else(daemon):
    full = request_once(daemon.socket, {"v": 1, "op": "decide", "rid": 1, "job": JOB})
    brief = request_once(daemon.socket, {"v": 1, "op": "decide", "rid": 2, "brief": True,
                                         "job": JOB})
    assert brief["ok"] and brief["rid"] == 2 and brief["script_digest"] == full["script_digest"]
    assert set(brief["decision"]) == {"action", "code", "decision_id", "writes"}
    assert brief["decision"]["writes"]["tres_per_node"] == full["decision"]["writes"][
        "tres_per_node"]
    assert brief["decision"]["action"] == full["decision"]["action"] == "share"
    assert {"reason", "details"} <= set(full["decision"])  # explain and old clients: all of it


def test_a_resubmission_on_the_same_snapshot_reuses_the_decision_under_its_own_id(
        tmp_path, monkeypatch):
    """Same request, same estimate, same snapshot, configuration and knowledge: the decision
    is reused (with the new id in its tag); anything else that changes decides again."""
    from conftest import make_config
    from slurm_gpushare.core.tag import Tag
    from slurm_gpushare.daemon import service as service_module
    from slurm_gpushare.daemon.clusterview import SlurmClusterView
    from slurm_gpushare.daemon.service import Service
    from slurm_gpushare.slurm import cmd

    sinfo = "n1|v100|gpu*|gpu:v100:2|mix\nn2|a100|gpu*|gpu:a100:2|mix\n"
    monkeypatch.setattr(cmd, "run", lambda argv, **_: cmd.Result(
        tuple(argv), 0, sinfo if argv[0] == "sinfo" else "", ""))
    config = make_config(tmp_path, keep_whole_when_idle=False)
    view = SlurmClusterView(config)
    assert view.refresh()
    service = Service(config, view=view)
    decided = []
    real_decide = service_module.decide
    monkeypatch.setattr(service_module, "decide",
                        lambda *a, **k: decided.append(1) or real_decide(*a, **k))
    view.claim_share = lambda *a, **k: None  # the ledger would change the snapshot each time

    def ask(**job):
        reply = service.handle({"v": 1, "op": "decide", "job": {**JOB, **job}})
        return reply["decision"]

    first, second = ask(), ask()
    assert len(decided) == 1
    assert first["action"] == second["action"] == "share"
    assert first["decision_id"] != second["decision_id"]
    for decision in (first, second):
        assert Tag.decode(decision["writes"]["admin_comment"]).decision_id == \
            decision["decision_id"]
    assert {**second, "decision_id": "", "writes": {**second["writes"], "admin_comment": ""}} \
        == {**first, "decision_id": "", "writes": {**first["writes"], "admin_comment": ""}}
    ask(user="bob", uid=1001)  # another user's request: its own decision
    assert len(decided) == 2
    assert view.refresh()  # a new snapshot
    ask()
    assert len(decided) == 3
    service.config = make_config(tmp_path, keep_whole_when_idle=False, default_share_gib=4)
    assert ask()["writes"]["tres_per_node"] == "gres:shard:4"  # a reload: decided again
    assert len(decided) == 4
