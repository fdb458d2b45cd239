#!/usr/bin/env python3
"""The fault and attack suite: every attack of issue 13 replayed on the real local cluster.

Real slurmctld with the real hook, the real daemon over its sockets; attackers are another
local user (uid 65534, through ``setpriv``) where the attack is a user's, root where it is a
fault of the daemon. Loopback only, bounded in count and time. For each attack it prints one
row: jobs submitted / accepted / rewritten / rejected / half-applied, the share rate of the
*other* users' jobs submitted during the attack, the daemon's peak RSS and threads, and
lost summaries; the JSON goes to ``--out``.

    GPUSHARE_CLUSTER_DIR=... .venv/bin/python bench/attacks.py [--rounds 3] [--jobs 30]
        [--only NAME ...] [--out bench/results/attacks.json]

A "victim" job is an ordinary ``sbatch --hold --gres=gpu:1 --comment=gpushare:mem=4G`` of
root: with the daemon healthy it is always turned into a share, so its share rate during an
attack is what the attack cost other users. Held jobs never run; all are cancelled.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devcluster.cluster import TestCluster  # noqa: E402

ATTACKER = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
VICTIM_ARGS = ["--hold", "--gres=gpu:1", "--comment=gpushare:mem=4G", "-p", "gpu"]


# -- measuring ------------------------------------------------------------------------------
class DaemonWatch:
    """Samples the daemon's RSS and threads every 0.1 s while an attack runs."""

    def __init__(self, cluster: TestCluster):
        self.cluster = cluster
        self.rss_kib: list[int] = []
        self.threads: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> tuple[int, int] | None:
        pid = self.cluster.daemon_pid()
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except (OSError, TypeError):
            return None
        values = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        return int(values["VmRSS"].split()[0]), int(values["Threads"])

    def _run(self):
        while not self._stop.is_set():
            got = self.sample()
            if got:
                self.rss_kib.append(got[0])
                self.threads.append(got[1])
            self._stop.wait(0.1)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        return {"rss_mib_max": round(max(self.rss_kib, default=0) / 1024, 1),
                "threads_max": max(self.threads, default=0)}


def submit_victims(cluster: TestCluster, count: int, pause_s: float = 0.0) -> list[dict]:
    """Submit ``count`` ordinary GPU jobs of root; one dict per submission."""
    out = []
    for _ in range(count):
        started = time.perf_counter()
        result = cluster.slurm("sbatch", "--parsable", "-o", "/dev/null", *VICTIM_ARGS,
                               input="#!/bin/sh\ntrue\n", check=False, timeout=60)
        out.append({"ok": result.returncode == 0,
                    "job_id": result.stdout.strip().split(";")[0] if result.returncode == 0
                    else "", "latency_s": time.perf_counter() - started,
                    "error": result.stderr.strip()[:200]})
        time.sleep(pause_s)
    return out


def job_table(cluster: TestCluster) -> dict[str, dict[str, str]]:
    out = cluster.slurm("scontrol", "-o", "show", "job", check=False, timeout=60).stdout
    jobs = {}
    for line in out.splitlines():
        fields = {}
        for token in line.split():
            if "=" in token:
                key, value = token.split("=", 1)
                fields.setdefault(key, value)
        if "JobId" in fields:
            jobs[fields["JobId"]] = fields
    return jobs


def classify(cluster: TestCluster, submissions: list[dict]) -> dict:
    """Accepted, rewritten and half-applied among the submissions (read back from slurmctld)."""
    jobs = job_table(cluster)
    accepted = [s for s in submissions if s["ok"]]
    rewritten = half = 0
    for sub in accepted:
        job = jobs.get(sub["job_id"], {})
        tres, comment = job.get("TresPerNode", ""), job.get("AdminComment", "")
        shared = "shard" in tres or "mps" in tres
        tagged_share = comment.startswith("gpushare:v1:share:")
        features_added = job.get("Features", "(null)") not in ("(null)", "")
        if shared and tagged_share and "gpu:" not in tres:
            rewritten += 1
        elif shared or tagged_share or features_added:
            half += 1  # some of a decision written, not all of it
    ids = [s["job_id"] for s in accepted]
    for start in range(0, len(ids), 200):
        cluster.slurm("scancel", *ids[start:start + 200], check=False)
    latencies = sorted(s["latency_s"] for s in submissions)
    return {"submitted": len(submissions), "accepted": len(accepted), "rewritten": rewritten,
            "rejected": len(submissions) - len(accepted), "half_applied": half,
            "share_rate": round(rewritten / len(accepted), 3) if accepted else 0.0,
            "sbatch_p50_ms": round(1000 * latencies[len(latencies) // 2], 1) if latencies else None,
            "sbatch_max_ms": round(1000 * latencies[-1], 1) if latencies else None,
            "errors": sorted({s["error"] for s in submissions if not s["ok"]})[:3]}


def log_lines(cluster: TestCluster) -> list[str]:
    try:
        return (cluster.log / "gpushare.log").read_text(errors="replace").splitlines()
    except OSError:
        return []


def tracebacks_since(cluster: TestCluster, start_line: int) -> int:
    return sum("Traceback" in line for line in log_lines(cluster)[start_line:])


def in_background(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


# -- the attacks ----------------------------------------------------------------------------
def provoke_errors(cluster: TestCluster, jobs: int, burst: int = 3) -> dict:
    """A user provokes refusals at will: bursts of ``burst`` submissions with an impossible
    constraint (Slurm rejects them anyway) or a 400-digit memory hint, each burst followed by
    ``burst`` ordinary jobs of another user."""
    bad = (["-C", "a100=x"], ["--comment=gpushare:mem=" + "9" * 400 + "G"])
    attacker_submissions = 0
    victims: list[dict] = []
    with DaemonWatch(cluster) as watch:
        while len(victims) < jobs:
            for i in range(burst):
                subprocess.run([*ATTACKER, "sbatch", "--hold", "--gres=gpu:1", "-p", "gpu",
                                "-o", "/dev/null", *bad[(len(victims) // burst) % 2]],
                               input="#!/bin/sh\ntrue\n", env=cluster.env(),
                               capture_output=True, text=True, cwd="/tmp")
                attacker_submissions += 1
            victims += submit_victims(cluster, min(burst, jobs - len(victims)))
    cluster.slurm("scancel", "-u", "nobody", check=False)  # the attacker's accepted jobs
    return {**classify(cluster, victims), **watch.summary(),
            "attacker_submissions": attacker_submissions}


FLOOD_CODE = r"""
import json, os, socket, sys, threading, time
path, seconds = sys.argv[1], float(sys.argv[2])
end = time.monotonic() + seconds
held, stats = [], {"connections": 0, "refused": 0, "lines": 0}
def conn():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(2); s.connect(path); return s
def hold():   # open connections and never speak
    while time.monotonic() < end and len(held) < 400:
        try: held.append(conn()); stats["connections"] += 1
        except OSError: stats["refused"] += 1; time.sleep(0.01)
def junk():   # full lines of junk, deep nesting, oversized, admin ops, NaN
    payloads = [b"x" * 60000, b"[" * 5000 + b"]" * 5000, b'{"v":1,"op":[]}',
                b'{"v":1,"op":"ingest","summary":{}}', b'{"v":1,"op":"explain","job":{"uid":NaN}}',
                b'{"v":1,"op":"ping"}', b"y" * 200000]
    while time.monotonic() < end:
        try:
            s = conn()
            for p in payloads:
                s.sendall(p + b"\n"); stats["lines"] += 1
                s.recv(65536)
            s.close()
        except OSError:
            time.sleep(0.01)
def slow():   # a trickle, one byte at a time
    while time.monotonic() < end:
        try:
            s = conn()
            while time.monotonic() < end:
                s.sendall(b"{"); time.sleep(0.2)
        except OSError:
            time.sleep(0.05)
threads = [threading.Thread(target=f) for f in (hold, junk, junk, slow, slow)]
[t.start() for t in threads]; [t.join() for t in threads]
print(json.dumps(stats))
"""


def query_flood(cluster: TestCluster, jobs: int) -> dict:
    """Any local user floods the 0666 query socket: idle connections, junk, deep nesting,
    oversized lines, slow senders."""
    query = str(cluster.run / "gpushare-query.sock")
    log_before = (cluster.log / "gpushare.log").stat().st_size
    with DaemonWatch(cluster) as watch:
        flood = subprocess.Popen([*ATTACKER, sys.executable, "-c", FLOOD_CODE, query, "20"],
                                 stdout=subprocess.PIPE, text=True, cwd="/tmp")
        time.sleep(1.0)
        victims = submit_victims(cluster, jobs, pause_s=0.1)
        out, _ = flood.communicate(timeout=60)
    grown = (cluster.log / "gpushare.log").stat().st_size - log_before
    return {**classify(cluster, victims), **watch.summary(),
            "log_growth_kib": round(grown / 1024, 1), "attacker": json.loads(out or "{}")}


def fuzz_requests(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    job = {"uid": 0, "user": "root", "partition": "gpu", "tres_per_node": "gres:gpu:1",
           "min_nodes": 4294967294, "shared": 65534}
    values = [None, True, -1, 0, 2**64, 1.5, "x" * 3000, [], {}, [[[]]], "gres:gpu:0",
              "gres:shard:99999", "\u0000", "gpushare:mem=" + "9" * 400 + "G"]
    raw_numbers = [b"1e400", b"-1e400", b"NaN", b"Infinity", b"-Infinity", b"9" * 400, b"1e-400"]
    out = []
    for i in range(count):
        kind = rng.randrange(7)
        if kind == 0:  # a field of the job replaced
            mutated = dict(job)
            mutated[rng.choice(list(job) + ["time_limit", "comment", "features"])] = rng.choice(values)
            message = {"v": 1, "op": rng.choice(["decide", "explain"]), "rid": i, "job": mutated}
            out.append(json.dumps(message).encode())
        elif kind == 1:  # a non-finite or huge number where a number goes
            field = rng.choice(["uid", "time_limit", "min_nodes", "shared", "num_tasks"])
            out.append(b'{"v":1,"op":"decide","rid":%d,"job":{"partition":"gpu",'
                       b'"tres_per_node":"gres:gpu:1","%s":%s}}'
                       % (i, field.encode(), rng.choice(raw_numbers)))
        elif kind == 2:  # top-level fields of the wrong type
            out.append(json.dumps({"v": rng.choice([1, 2, "1", None]), "op": rng.choice(
                ["decide", "ping", "ingest", "overrun", "job", "explain", 5, [], None]),
                "rid": rng.choice([i, -i, "r%d" % i, [i], 1.5]),
                rng.choice(["job", "summary", "job_id"]): rng.choice(values)}).encode())
        elif kind == 3:  # malformed summaries
            summary = {"job_id": rng.choice(["1", "x", -1, None, "1" * 50]),
                       "gpu_index": rng.choice([0, -1, 1e300, "0", None]),
                       rng.choice(["keys", "coruns", "mgmap_max_mib", "samples"]):
                           rng.choice(values)}
            out.append(json.dumps({"v": 1, "op": "ingest", "rid": i, "summary": summary}).encode())
        elif kind == 4:  # deep nesting
            depth = rng.choice([9, 100, 5000])
            out.append(b'{"v":1,"op":"decide","rid":%d,"job":' % i + b"[" * depth + b"]" * depth
                       + b"}")
        elif kind == 5:  # random bytes
            out.append(bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 200)))
                       .replace(b"\n", b" "))
        else:  # a truncated valid request
            text = json.dumps({"v": 1, "op": "decide", "rid": i, "job": job}).encode()
            out.append(text[:rng.randrange(1, len(text))])
    return out


def protocol_fuzz(cluster: TestCluster, requests: int, seed: int = 13) -> dict:
    """``requests`` malformed requests on the main (admin) socket, one connection reused
    while the daemon keeps it."""
    lines = fuzz_requests(requests, seed)
    start_line = len(log_lines(cluster))
    watch = DaemonWatch(cluster)
    rss_before = watch.sample()[0]
    answered = without_rid = reconnects = 0
    sock = None
    for i, line in enumerate(lines):
        if sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5)
            sock.connect(str(cluster.daemon_socket))
            reader = sock.makefile("rb")
            reconnects += 1
        try:
            sock.sendall(line + b"\n")
            reply = reader.readline()
        except OSError:
            reply = b""
        if not reply:
            sock.close()
            sock = None
            continue
        answered += 1
        try:
            without_rid += "rid" not in json.loads(reply)
        except ValueError:
            without_rid += 1
    if sock is not None:
        sock.close()
    time.sleep(1.0)
    rss_after = watch.sample()[0]
    return {"requests": requests, "answered": answered, "replies_without_rid": without_rid,
            "connections": reconnects, "tracebacks": tracebacks_since(cluster, start_line),
            "rss_mib_before": round(rss_before / 1024, 1),
            "rss_mib_after": round(rss_after / 1024, 1),
            "rss_change_pct": round(100 * (rss_after - rss_before) / rss_before, 1)}


def daemon_slow(cluster: TestCluster, jobs: int) -> dict:
    """The daemon answers, but slowly: stopped 40 ms of every 50 (SIGSTOP/SIGCONT)."""
    pid = cluster.daemon_pid()
    stop = threading.Event()

    def throttle():
        while not stop.is_set():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.04)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.01)

    thread = in_background(throttle)
    try:
        victims = submit_victims(cluster, jobs)
    finally:
        stop.set()
        thread.join()
        os.kill(pid, signal.SIGCONT)
    result = classify(cluster, victims)
    result["breaker_opened"] = any("daemon slow" in line or "asks failed" in line
                                   or "failures in a row" in line for line in _ctld_log(cluster))
    cluster.wait_hook()
    return result


def daemon_hung(cluster: TestCluster, jobs: int) -> dict:
    """The daemon accepts connections and never answers (SIGSTOP) while jobs come in; the
    requests left in its socket are answered when it resumes, too late to matter: no decision
    row may be left for a job that went through unchanged."""
    store = cluster.root / "predictor" / "store.sqlite"
    rows_before = _decision_rows(store)
    pid = cluster.daemon_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        victims = submit_victims(cluster, jobs)
    finally:
        os.kill(pid, signal.SIGCONT)
    time.sleep(3.0)  # let it drain what queued up
    result = classify(cluster, victims)
    result["phantom_decision_rows"] = _decision_rows(store) - rows_before - result["rewritten"]
    cluster.wait_hook()
    return result


def huge_reply(cluster: TestCluster, jobs: int, mib: int = 256) -> dict:
    """Something on the daemon's socket answers every request with a ``mib`` MiB line."""
    cluster.stop_daemon()
    path = str(cluster.daemon_socket)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    line = b'{"v":1,"ok":true,"pad":"' + b"x" * (mib << 20) + b'"}\n'
    stop = threading.Event()

    def answer(conn):
        try:
            conn.recv(65536)
            conn.settimeout(5)
            conn.sendall(line)
        except OSError:
            pass
        finally:
            conn.close()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            in_background(answer, conn)

    thread = in_background(serve)
    try:
        victims = submit_victims(cluster, jobs)
    finally:
        stop.set()
        thread.join()
        server.close()
        os.unlink(path)
        cluster.start_daemon()
    result = classify(cluster, victims)
    result["reply_mib"] = mib
    cluster.wait_hook()
    return result


def bad_reload(cluster: TestCluster, jobs: int) -> dict:
    """A GPU type's feature misspelt in the TOML, applied with SIGHUP."""
    config = cluster.daemon_config
    original = config.read_text()
    start_line = len(log_lines(cluster))
    config.write_text(original.replace('feature = "a100"', 'feature = "a1OO"'))
    try:
        os.kill(cluster.daemon_pid(), signal.SIGHUP)
        time.sleep(1.0)
        victims = submit_victims(cluster, jobs)
    finally:
        config.write_text(original)
    refused = any('"reload-refused"' in line for line in log_lines(cluster)[start_line:])
    return {**classify(cluster, victims), "reload_refused": refused}


def daemon_kill_during_ingest(cluster: TestCluster, summaries: int = 200) -> dict:
    """``summaries`` finishing jobs deliver their summaries (the agents' own delivery: send,
    else spool) from 8 threads; the daemon is killed -9 in the middle and restarted; each
    node's next contact drains its spool. Lost = delivered nowhere (not stored, not spooled)."""
    from slurm_gpushare.daemon.store import Store
    from slurm_gpushare.node import agent

    cluster_tag = f"attack{int(time.time())}"
    spool = cluster.root / "attack-spool"
    deliver = agent.default_deliver(str(cluster.daemon_socket), spool, timeout_s=2.0)
    jobs = [{"job_id": str(9_000_000 + i), "gpu_index": 0, "cluster": cluster_tag,
             "samples": 10, "mgmap_max_mib": 1000.0 + i} for i in range(summaries)]
    outcomes: list[str] = []
    lock = threading.Lock()

    def worker(part):
        for summary in part:
            try:
                outcome = deliver(dict(summary))
            except Exception as exc:  # noqa: BLE001 -- counted as lost
                outcome = f"error {type(exc).__name__}"
            with lock:
                outcomes.append(outcome)

    threads = [in_background(worker, jobs[i::8]) for i in range(8)]
    while len(outcomes) < summaries // 2:
        time.sleep(0.005)
    os.kill(cluster.daemon_pid(), signal.SIGKILL)
    for thread in threads:
        thread.join()
    cluster.start_daemon()
    # The next finishing job on this node: its delivery drains the spool.
    deliver({"job_id": "9999999", "gpu_index": 0, "cluster": cluster_tag, "samples": 1})
    with Store(cluster.root / "predictor" / "store.sqlite", readonly=True) as store:
        stored = {s["job_id"] for s in store.all_summaries() if s.get("cluster") == cluster_tag}
    left_in_spool = len(list(spool.glob("*.json")))
    lost = sum(1 for job in jobs if job["job_id"] not in stored) - left_in_spool
    return {"summaries": summaries, "acknowledged": sum(o.startswith("sent") for o in outcomes),
            "spooled": sum(o == "spooled" for o in outcomes), "stored": len(stored - {"9999999"}),
            "left_in_spool": left_in_spool, "lost_summaries": lost}


def _decision_rows(store_path: Path) -> int:
    from slurm_gpushare.daemon.store import Store

    with Store(store_path, readonly=True) as store:
        return len(store.decisions(limit=1_000_000))


def _ctld_log(cluster: TestCluster) -> list[str]:
    try:
        return (cluster.log / "slurmctld.log").read_text(errors="replace").splitlines()[-2000:]
    except OSError:
        return []


ATTACKS = {
    "provoke-errors": lambda c, a: provoke_errors(c, a.jobs),
    "query-flood": lambda c, a: query_flood(c, a.jobs),
    "protocol-fuzz": lambda c, a: protocol_fuzz(c, a.fuzz),
    "daemon-slow": lambda c, a: daemon_slow(c, a.jobs),
    "daemon-hung": lambda c, a: daemon_hung(c, min(a.jobs, 10)),
    "huge-reply": lambda c, a: huge_reply(c, min(a.jobs, 10), a.reply_mib),
    "bad-reload": lambda c, a: bad_reload(c, a.jobs),
    "kill-9-ingest": lambda c, a: daemon_kill_during_ingest(c, a.summaries),
}

COLUMNS = ("submitted", "accepted", "rewritten", "rejected", "half_applied", "share_rate",
           "sbatch_p50_ms", "sbatch_max_ms", "rss_mib_max", "threads_max", "lost_summaries", "tracebacks",
           "rss_change_pct")


def table(rounds: list[dict[str, dict]]) -> str:
    """One row per attack; a cell is the value, or min-max over the rounds where they differ."""
    def cell(values):
        values = [v for v in values if v is not None]
        if not values:
            return "-"
        low, high = min(values), max(values)
        return str(low) if low == high else f"{low}-{high}"

    rows = [("attack",) + COLUMNS]
    for name in rounds[0]:
        rows.append((name,) + tuple(cell([r[name].get(c) for r in rounds]) for c in COLUMNS))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows)


def run_round(cluster: TestCluster, args, seed: int) -> dict[str, dict]:
    results = {}
    baseline = DaemonWatch(cluster).sample()
    results["baseline"] = {**classify(cluster, submit_victims(cluster, args.jobs)),
                           "rss_mib_max": round(baseline[0] / 1024, 1),
                           "threads_max": baseline[1]}
    for name in args.only or ATTACKS:
        started = time.monotonic()
        results[name] = (protocol_fuzz(cluster, args.fuzz, seed) if name == "protocol-fuzz"
                         else ATTACKS[name](cluster, args))
        results[name]["seconds"] = round(time.monotonic() - started, 1)
        print(f"round seed={seed} {name}: {json.dumps(results[name])}", flush=True)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30, help="victim jobs per attack")
    parser.add_argument("--fuzz", type=int, default=10_000, help="fuzzed requests")
    parser.add_argument("--summaries", type=int, default=200)
    parser.add_argument("--reply-mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=1, help="repeat everything (fuzz seeds 13, 14, ...)")
    parser.add_argument("--only", nargs="*", choices=sorted(ATTACKS))
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "attacks.json"))
    args = parser.parse_args(argv)
    cluster = TestCluster()
    cluster.start()
    rounds = [run_round(cluster, args, 13 + i) for i in range(args.rounds)]
    print()
    print(table(rounds))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                    time.gmtime()),
                                          "args": vars(args), "rounds": rounds}, indent=2)
                              + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
