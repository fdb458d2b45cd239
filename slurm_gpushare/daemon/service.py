"""Request handling: turns one decoded request into one reply (op dispatch, decisions, the
record writer). Sockets live in ``server``; learning from telemetry in ``learning``."""

from __future__ import annotations

import logging
import collections
import os
import re
import pwd
import random
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Callable

from slurm_gpushare import PROTOCOL_VERSION, __version__
from slurm_gpushare.core.config import Config
from slurm_gpushare.core.policy import decide
from slurm_gpushare.core.tag import Tag
from slurm_gpushare.core.types import Decision, JobRequest
from slurm_gpushare.core.waiting import WaitingShare
from slurm_gpushare.daemon.fingerprint import Fingerprinter
from slurm_gpushare.daemon.learning import Learner
from slurm_gpushare.daemon.logs import event, log
from slurm_gpushare.daemon.protocol import (ProtocolError, check_rid, parse_request, reply_error,
                                            reply_ok)
from slurm_gpushare.daemon.store import Store, StoreError, clean_summary
from slurm_gpushare.daemon.validity import decision_problem
from slurm_gpushare.daemon.waiting import WaitingShares
from slurm_gpushare.predict.history import HistoryEstimator
from slurm_gpushare.predict.persist import load_classes_model, load_memory_model
from slurm_gpushare.slurm.jobs import lookup_job


_DECISION_ID = re.compile(r"[A-Za-z0-9_\-]{1,64}")

class RecordWriter:
    """Runs store writes on its own thread, so SQLite never delays a reply. A request only
    appends to a queue, waking no thread; the writer takes what has gathered every
    ``interval_s`` and writes all the decisions among it in one transaction."""

    def __init__(self, store: Store | None, *, interval_s: float = 0.05,
                 max_pending: int = 100_000):
        self.store = store
        self.interval_s = interval_s
        self.max_pending = max_pending
        self.pending: collections.deque = collections.deque()
        self._busy = False  # the writer holds items it took from the queue
        self._wake = threading.Event()
        self._closing = False
        self.thread = threading.Thread(target=self._run, name="record-writer", daemon=True)
        self.thread.start()

    def put(self, work: Callable[..., Any], *args) -> None:
        """Run ``work(*args)`` on the writer thread (dropped, with a log line, if backed up)."""
        self._queue(work, args)

    def put_decision(self, record: dict[str, Any]) -> None:
        """Keep a decision (``Store.record_decision``), batched with the others."""
        self._queue(None, (record,))

    def _queue(self, work, args) -> None:
        if self.store is None:
            return
        if len(self.pending) >= self.max_pending:
            event(logging.WARNING, "record-dropped",
                  work=getattr(work, "__name__", "record_decision"))
            return
        self.pending.append((work, args))

    def _run(self) -> None:
        while not self._closing:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            self._drain()
        self._drain()

    def _drain(self) -> None:
        self._busy = True
        try:
            self._write_all()
        finally:
            self._busy = False

    def _write_all(self) -> None:
        while self.pending:
            batch = []
            while self.pending and len(batch) < 1000:
                batch.append(self.pending.popleft())
            decisions = [args[0] for work, args in batch if work is None]
            if decisions:  # first: work after them (an ingest) may link to one of them
                try:
                    self.store.record_decisions(decisions)
                except Exception:  # noqa: BLE001 -- a bad record must not stop the writer
                    log.exception("record-failed", extra={"fields": {"work": "record_decision"}})
            for work, args in batch:
                if work is None:
                    continue
                try:
                    work(*args)
                except Exception:  # noqa: BLE001 -- a bad record must not stop the writer
                    log.exception("record-failed",
                                  extra={"fields": {"work": getattr(work, "__name__", "?")}})

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until everything queued so far is written (at most ``timeout`` seconds: what
        a stopping daemon still owes its store is worth the wait; on a starved 2-core machine
        ten seconds ran out before four records were written)."""
        deadline = time.monotonic() + timeout
        self._wake.set()
        while (self.pending or self._busy) and time.monotonic() < deadline:
            time.sleep(0.002)

    def close(self) -> None:
        self.flush()
        self._closing = True
        self._wake.set()
        self.thread.join(5)


class LogBudget:
    """At most ``per_second`` log lines a second; counts what it suppressed."""

    def __init__(self, per_second: int):
        self.per_second = per_second
        self._second = 0
        self._used = 0
        self._suppressed = 0
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            now = int(time.monotonic())
            if now != self._second:
                self._second, self._used = now, 0
            if self._used < self.per_second:
                self._used += 1
                return True
            self._suppressed += 1
            return False

    def take_suppressed(self) -> int:
        with self._lock:
            taken, self._suppressed = self._suppressed, 0
            return taken


def refused_keep(reason: str, code: str = "bad-request") -> Decision:
    """The answer to a decide that cannot be decided: the job stays exactly as submitted."""
    return Decision(action="keep", code=code, reason=reason)


class ScriptMemory:
    """What the daemon read in scripts it has seen, by digest: the hook sends a script it sent
    before as its digest only, and the decision still needs what the text said (whether its
    srun steps ask for GPUs). Bounded, newest kept; larger than the hook's own table (1,024)
    so a digest the hook holds is known here; one that is not is refused (the job is kept)."""

    def __init__(self, size: int = 8192):
        self.size = size
        self._steps: OrderedDict[str, bool] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, digest: str, steps_ask_gpus: bool) -> None:
        with self._lock:
            self._steps[digest] = steps_ask_gpus
            self._steps.move_to_end(digest)
            while len(self._steps) > self.size:
                self._steps.popitem(last=False)

    def steps(self, digest: str) -> bool:
        """What the script behind ``digest`` said; a digest not seen is refused."""
        with self._lock:
            steps = self._steps.get(digest)
            if steps is None:
                raise ProtocolError("unknown script digest: the hook must send the script")
            self._steps.move_to_end(digest)
        return steps


class DecisionMemo:
    """Decisions already made on the current basis -- the view's snapshot and reservations
    and the configuration, all compared by identity -- keyed by the request (every field of
    it, the submitting user's included) and the estimate object it was decided with. A
    resubmission of the same job while nothing it depends on changed (arrays, sweeps, a burst
    of one script) gets the same decision under its own id without deciding again. Forgotten
    whenever the basis changes (a refresh, a claimed share, a reload); bounded. Only jobs
    without a pair profile are memoised (a pair predictor is made per request)."""

    SIZE = 4096

    def __init__(self) -> None:
        self._basis: tuple = ()
        self._entries: dict = {}
        self._lock = threading.Lock()

    def get(self, basis: tuple, request: JobRequest, estimate) -> tuple | None:
        with self._lock:
            if not _same(basis, self._basis):
                return None
            found = self._entries.get(request)
        if found is None or found[0] is not estimate:
            return None
        return found[1], found[2]

    def put(self, basis: tuple, request: JobRequest, estimate, decision: Decision,
            problem: str | None) -> None:
        # Kept only where the id can be swapped: decisions their tag names by their id.
        if Tag.with_id(decision.writes.get("admin_comment", ""), decision.decision_id,
                       decision.decision_id) is None:
            return
        with self._lock:
            if not _same(basis, self._basis) or len(self._entries) >= self.SIZE:
                self._basis, self._entries = basis, {}
            self._entries[request] = (estimate, decision, problem)


def _same(basis: tuple, other: tuple) -> bool:
    return len(basis) == len(other) and all(a is b for a, b in zip(basis, other))


def with_decision_id(decision: Decision, decision_id: str) -> Decision:
    """A memoised decision under a new id (DecisionMemo keeps only tagged decisions)."""
    comment = Tag.with_id(decision.writes["admin_comment"], decision.decision_id, decision_id)
    return replace(decision, decision_id=decision_id,
                   writes=dict(decision.writes, admin_comment=comment))


@dataclass(frozen=True)
class Peer:
    uid: int
    admin: bool  # root, the daemon's user or an allowed uid (slurmctld, prolog/epilog)


class Service:
    """Turns requests into replies. Holds the configuration; swapped whole on reload."""

    # Ops a non-admin peer may use (on the query socket); everything else is admin-only.
    USER_OPS = {"ping", "explain", "job"}

    def __init__(self, config: Config, *, fingerprinter: Fingerprinter | None = None,
                 store: Store | None = None, reader: Store | None = None, view=None):
        self.config = config
        self.fingerprinter = fingerprinter or Fingerprinter.from_file(config.daemon.secret_file)
        self.store = store
        self.records = RecordWriter(store)
        self.estimator = None
        self.learner: Learner | None = None
        self.pairing = None  # the pair predictor for node exclusion (daemon.pairing)
        self.view = view
        # Shares waiting in Slurm's queue follow the cluster (exclusions lifted, types added).
        self.waiting = WaitingShares()
        if hasattr(view, "after_refresh"):
            view.after_refresh.append(self.waiting.review)
        if store is not None:
            # Decisions read history through their own connection: in WAL mode a reader sees
            # the last committed state and never waits for the writer thread's transactions.
            self.estimator = HistoryEstimator(reader or store,
                                              predictor=load_memory_model(config),
                                              classes=load_classes_model(config))
            self.estimator.estimate([], config)  # warm-up: first calls pay for imports
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._error_log = LogBudget(per_second=5)
        self._scripts = ScriptMemory()
        self._decisions = DecisionMemo()
        if store is not None:
            from slurm_gpushare.daemon.pairing import Pairing

            from slurm_gpushare.predict.history import config_type_of

            # Runs' GPU types by the configuration in force (a reload may add types).
            self.pairing = Pairing(reader or store,
                                   type_of=lambda model: config_type_of(model, self.config)
                                   ).load()
            self.learner = Learner(store, self.estimator, count=self._count,
                                   pairing=self.pairing)

    @property
    def digest(self) -> Callable[[str, str], str]:
        return self.fingerprinter.digest

    def handle(self, message: Any, peer: Peer | None = None) -> dict[str, Any]:
        """One reply for one decoded request; every reply carries the request's ``rid``.

        A ``decide`` that cannot be decided because of the request itself (malformed, out of
        range) is answered as a ``keep`` with the reason: it is that job's problem, not the
        daemon's, so the hook must not count it against the daemon's health."""
        peer = peer or Peer(uid=os.getuid(), admin=True)
        rid = check_rid(message.get("rid")) if isinstance(message, dict) else None
        op = message.get("op") if isinstance(message, dict) else None
        try:
            reply = self._handle(message, peer)
        except ProtocolError as exc:
            versioned = isinstance(message, dict) and message.get("v") == PROTOCOL_VERSION
            reply = self.refusal(op if versioned else None, str(exc), peer)
        except Exception as exc:  # noqa: BLE001 -- a bug must cost one reply, not the daemon
            self._count("internal-errors")
            log.exception("internal-error", extra={"fields": {"uid": peer.uid, "op": str(op)[:16]}})
            reply = (reply_ok(refused_keep(f"daemon error: {type(exc).__name__}",
                                           code="daemon-error"))
                     if op == "decide" else reply_error(f"internal error: {type(exc).__name__}"))
        reply["rid"] = rid
        return reply

    def refusal(self, op: Any, error: str, peer: Peer) -> dict[str, Any]:
        """The reply to a request that is the client's mistake: for ``decide`` a keep (the job
        stays as submitted), else an error. Logged at most a few lines a second (a flood must
        not fill the disk), never with a traceback."""
        self._count("errors")
        if self._error_log.allow():
            event(logging.WARNING, "bad-request", error=error[:200], uid=peer.uid,
                  suppressed=self._error_log.take_suppressed())
        if op == "decide":
            return reply_ok(refused_keep(f"request refused: {error[:200]}"))
        return reply_error(error[:200])

    def _count(self, key: str) -> None:
        with self._lock:
            self.counters[key] += 1

    def _handle(self, message: Any, peer: Peer) -> dict[str, Any]:
        config = self.config  # one consistent config for the whole request, even across reload
        if not isinstance(message, dict):
            raise ProtocolError("request must be a JSON object")
        if message.get("v") != PROTOCOL_VERSION:
            raise ProtocolError(f"unsupported protocol version {str(message.get('v'))[:16]!r} "
                                f"(daemon speaks {PROTOCOL_VERSION})")
        op = message.get("op")
        if not isinstance(op, str):
            raise ProtocolError("op must be a string")
        if not peer.admin and op not in self.USER_OPS:
            self._count("refused")
            return reply_error(f"op {op[:16]!r} is not available on this socket")
        if op == "ingest":
            return self._ingest(message)
        if op == "overrun":
            return self._overrun(message)
        if op == "job":
            return self._job(message, peer)
        if not peer.admin and isinstance(message.get("job"), dict):
            # Digests stand in for scripts only from the hook (admin socket).
            message = {**message, "job": {k: v for k, v in message["job"].items()
                                          if k != "script_digest"}}
        job = message.get("job")
        digest_only = isinstance(job, dict) and not job.get("script") and bool(
            job.get("script_digest"))
        op, request = parse_request(message, opt_out_token=config.policy.opt_out_token,
                                    mem_hint_token=config.policy.mem_hint_token,
                                    digest=self.digest,
                                    script_steps=self._scripts.steps if peer.admin else None)
        if request is not None and request.script_digest and peer.admin and not digest_only:
            self._scripts.remember(request.script_digest, request.steps_ask_gpus)
        if op == "ping":
            with self._lock:
                counters = dict(self.counters)
            problem = self._self_test(config)
            if problem:
                return reply_error(f"daemon cannot decide: {problem}") | {
                    "version": __version__, "counters": counters}
            health = getattr(self.view, "health", None)
            return reply_ok(version=__version__, counters=counters,
                            **({"view": health()} if health else {}))
        deadline = message.get("deadline")
        brief = op == "decide" and message.get("brief") is True
        if op == "decide" and isinstance(deadline, (int, float)) and time.time() > deadline:
            # The hook gave up on this request long ago (it sat in the socket's backlog while
            # the daemon was stopped) and let the job through as submitted: decide nothing and
            # record nothing, or a decision row would describe a job that ran unchanged.
            self._count("expired")
            return reply_ok(refused_keep("request arrived after the hook's deadline",
                                         code="expired"), brief=brief)
        if not peer.admin:
            # A user may ask what would happen to a job of theirs, never of someone else's.
            request = replace(request, uid=peer.uid, user=_user_name(peer.uid))
        started = time.perf_counter()
        decision_id = f"{_ids.getrandbits(32):08x}"
        keys = self.fingerprinter.keys_from_digests(
            request.user or str(request.uid), request.script_digest, request.name_digest,
            request.args_digest)
        estimate, history = None, "no store"
        if self.estimator is not None:
            estimate, history = self.estimator.estimate(keys.sizing_keys(), config,
                                                        request.mem_hint_mib)
        # Decisions read the pair predictor only: the job's own profile and corrections, which
        # another user's co-runs cannot teach (PairModel.learn). The classes' knowledge base
        # learns class pairs from every user's co-runs: only `kb show` and the reports read it.
        # A job without a profile has no class either: it is placed with no pair judgement.
        knowledge = None
        if self.pairing is not None and estimate is not None:
            knowledge = self.pairing.compatibility(keys.sizing_keys(), config.policy.pair_margin)
        nodes = self.view.nodes() if self.view is not None else ()
        # Everything a decision reads besides the request and its estimate (a pair predictor
        # is made per request: those decisions are not memoised).
        basis = ((nodes, getattr(self.view, "reservations", lambda: None)(), config)
                 if op == "decide" and knowledge is None else None)
        memoised = self._decisions.get(basis, request, estimate) if basis else None
        if memoised is not None:
            decision, problem = memoised
            decision = with_decision_id(decision, decision_id)
        else:
            decision = decide(request, config, estimate=estimate, view=self.view,
                              knowledge=knowledge, decision_id=decision_id)
            problem = decision_problem(decision, request, config, nodes)
            if basis:
                self._decisions.put(basis, request, estimate, decision, problem)
        if problem is not None:
            # The configuration does not match the cluster: Slurm would reject this share.
            self._count("invalid-decisions")
            if self._error_log.allow():
                event(logging.ERROR, "invalid-decision", id=decision_id, problem=problem)
            decision = refused_keep(f"no valid share for this cluster: {problem}",
                                    code="invalid-decision")
        elapsed_us = int((time.perf_counter() - started) * 1e6)
        self._count(f"{op}:{decision.action}")
        event(logging.INFO, "decision" if op == "decide" else "explain",
               id=decision_id, action=decision.action, code=decision.code,
               reason=decision.reason, uid=request.uid, account=request.account,
               partition=request.partition, share_gib=decision.share_gib,
               gpu_types=list(decision.gpu_types), writes=dict(decision.writes),
               job_class=estimate.job_class if estimate else None, history=history,
               decide_us=elapsed_us)
        if op == "decide" and decision.code == "idle-gpu" and hasattr(self.view, "claim_idle"):
            self.view.claim_idle(decision.details.get("idle_types", ()),
                                 decision.details.get("tasks", 1))
        if op == "decide" and decision.action == "share" and hasattr(self.view, "claim_share"):
            # Until the view shows it running, the next decisions count it where it will go.
            if self.pairing is not None:
                self.pairing.remember(decision_id, keys.as_list())
            partitions = tuple(p for p in request.partition.split(",") if p)
            self.view.claim_share(decision_id, decision.gpu_types,
                                  decision.details.get("units", 1), partitions,
                                  decision.details.get("excluded_nodes", ()),
                                  decision.details.get("job_class"),
                                  decision.details.get("room_now"))
            away = tuple(decision.details.get("excluded_nodes") or ())
            later = decision.details.get("later_types") or ()
            self.waiting.add(WaitingShare(  # kept only where a review could change it
                decision_id, decision.admin_comment, decision.writes.get("features", ""),
                types=tuple(g for g in map(config.gpu_type, decision.gpu_types) if g),
                later=tuple(g for g in map(config.gpu_type, later) if g),
                user_exc_nodes=request.exc_nodes, away=away, blockers=None,
                partitions=partitions, units=decision.details.get("units", 1),
                job_class=decision.details.get("job_class"), knowledge=knowledge,
                array=bool(request.array), seen_on=nodes, user_req_nodes=request.req_nodes))
        if op == "decide" and problem is None:
            self.records.put_decision({
                **decision.to_dict(), "ts": time.time(), "uid": request.uid,
                "account": request.account, "partition": request.partition,
                "keys": keys.as_list(),
                "job_class": estimate.job_class if estimate else None})
            if request.script_digest:  # the hook sends it instead of the script next time
                return reply_ok(decision, brief=brief, script_digest=request.script_digest)
        return reply_ok(decision, brief=brief)

    def _self_test(self, config: Config) -> str | None:
        """Decide a plain one-GPU job end to end (history lookup, policy, validity) without
        recording it; the reason it fails, or None. ``ping`` answers with it, so a daemon
        that answers pings but cannot decide is reported as broken."""
        try:
            request = JobRequest(uid=os.getuid(), user="gpushare-self-test",
                                 partition=next(iter(config.policy.sharing_partitions), ""),
                                 tres_per_node="gres:gpu:1")
            estimate = (self.estimator.estimate([], config)[0]
                        if self.estimator is not None else None)
            decision = decide(request, config, estimate=estimate, view=self.view)
            decision_problem(decision, request, config,
                             self.view.nodes() if self.view is not None else ())
        except Exception as exc:  # noqa: BLE001 -- any failure here is the answer
            return f"{type(exc).__name__}: {str(exc)[:200]}"
        if not self.records.thread.is_alive():
            return "the record writer has stopped"
        return None

    def _ingest(self, message: dict[str, Any]) -> dict[str, Any]:
        """A job's telemetry summary from the prolog/epilog agent. It is checked and committed
        before the reply: an acknowledged summary survives a crash (the agent spools what is
        not acknowledged). Learning from it happens later, on the writer thread."""
        try:
            summary = clean_summary(message.get("summary"))
        except StoreError as exc:
            raise ProtocolError(f"summary refused: {exc}") from None
        # Summaries made from Slurm's accounting name the job's decision (its tag's id): long
        # after the job ended, slurmctld no longer knows the job to tie the two.
        decision_id = message.get("decision_id")
        if decision_id is not None and not (isinstance(decision_id, str)
                                            and _DECISION_ID.fullmatch(decision_id)):
            raise ProtocolError("bad decision_id")
        if self.learner is not None:
            new = self.store.ingest_summary(summary)
            if new and decision_id:
                self.store.link_decision(decision_id, summary["job_id"], summary["cluster"])
            if new:
                self.records.put(self.learner.learn, summary, self.config)
        self._count("ingest")
        return reply_ok()

    def _overrun(self, message: dict[str, Any]) -> dict[str, Any]:
        """A running share above its memory, reported live by its collector."""
        job_id = message.get("job_id")
        if not isinstance(job_id, str) or not job_id.replace("_", "").isdigit():
            raise ProtocolError("overrun needs a job_id")
        peak = message.get("peak_mib")
        if isinstance(peak, bool) or not isinstance(peak, (int, float)) or not 0 < peak < 2**40:
            raise ProtocolError("overrun needs peak_mib")
        action = self.config.policy.on_share_exceeded
        self._count("share-overrun")
        event(logging.WARNING, "share-overrun", job_id=job_id, peak_mib=message.get("peak_mib"),
               limit_mib=message.get("limit_mib"), action=action)
        if action == "requeue":
            if self.learner is not None:
                self.records.put(self.learner.requeue, job_id, float(peak), self.config)
        return reply_ok(action=action)

    def _job(self, message: dict[str, Any], peer: Peer) -> dict[str, Any]:
        """The decision recorded for one job; owners and admins only."""
        job_id = str(message.get("job_id", ""))
        try:
            job = lookup_job(job_id)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        if job is None:
            return reply_error(f"job {job_id} not found")
        if not peer.admin and job.uid != peer.uid:
            return reply_error("permission denied: not your job")
        record, co_runners, telemetry = None, [], []
        if self.store is not None and job.decision_id:
            self.records.flush(2)
            self.store.link_decision(job.decision_id, job_id, self.config.daemon.cluster_name)
            record = self.store.decision(job.decision_id)
            co_runners = [{"job_id": c["job_b"], "class": c["class_b"],
                           "overlap_s": c["overlap_s"], "isd": c["isd_a"]}
                          for c in self.store.coruns_of(job_id)]
            telemetry = [{k: s.get(k) for k in ("gpu_index", "gpu_model", "mgmap_max_mib",
                                                "mgup_max", "mgtsamp_max", "duration_s")}
                         for s in self.store.summaries(job_id)]
        return reply_ok(job={"job_id": job_id, "state": job.state, "nodes": job.nodes,
                             "admin_comment": job.admin_comment, "uid": job.uid},
                        record=record, co_runners=co_runners, telemetry=telemetry)


# Decision ids: random, unique in practice, not secret; seeded once from the OS (a system call
# per request costs more than the rest of a cached decision).
_ids = random.Random(os.urandom(16))


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


