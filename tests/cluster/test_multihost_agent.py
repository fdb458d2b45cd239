"""Telemetry across hosts on the multi-host test cluster: a node's agent delivers to the daemon on
the controller over TCP (munge-sealed), and nothing is lost while the link is cut.

The network cut drops only the daemon's TCP port on one node (a firewall rule in
the node's namespace, ``devcluster/netns.py``): slurmd and slurmctld keep talking, so the node's
jobs run and finish while their summaries wait in the node's spool. Its figures are recorded in
``bench/results/multihost_network_cut.json`` (Slurm 22.05) and ``multihost_network_cut_24.11.json``.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import pytest

from test_cluster_history import unique_script

pytestmark = pytest.mark.cluster

RESULTS_DIR = Path(__file__).resolve().parents[2] / "bench" / "results"
# Every job of the cut test ends within this (the cut lasts until they have, and 60 s at least).
JOBS_TIMEOUT_S = 240


def ingested(cluster) -> dict[str, dict]:
    """The daemon's ``ingested`` log entries by job id (first one of each job)."""
    found: dict[str, dict] = {}
    for line in (cluster.log / "gpushare.log").read_text().splitlines():
        entry = json.loads(line)
        if entry.get("event") == "ingested":
            found.setdefault(entry["job_id"], entry)
    return found


def wait_ingested(cluster, job_ids, timeout: float) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while True:
        seen = ingested(cluster)
        if all(j in seen for j in job_ids) or time.monotonic() > deadline:
            return {j: seen[j] for j in job_ids if j in seen}
        time.sleep(0.25)


def spooled_jobs(cluster, node) -> set[str]:
    """Job ids with a summary in the node's spool (``<cluster>-<job>-<gpu>.json``)."""
    return {path.stem.split("-")[-2] for path in cluster.node_spool(node).glob("*.json")}


def wait_spooled(cluster, node, job_ids, timeout: float) -> set[str]:
    deadline = time.monotonic() + timeout
    while True:
        found = set(job_ids) & spooled_jobs(cluster, node)
        if len(found) == len(set(job_ids)) or time.monotonic() > deadline:
            return found
        time.sleep(0.25)


def agent_log_of(cluster, node, job_ids) -> list[str]:
    """The node agent's log lines about these jobs."""
    log = cluster.node_spool(node).parent / "agent.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [line for line in lines if any(f"job {j}:" in line for j in job_ids)]


def test_telemetry_from_node_a_shares_the_resubmission_on_node_b(multihost_cluster):
    cluster = multihost_cluster
    script = unique_script(cluster, work_s=2, util=5, mem_mib={"v100": 9000, "a100": 9700})
    first = cluster.sbatch("--gres=gpu:v100:1", "-w", "v100-1", script=script)
    assert cluster.job(first)["AdminComment"].endswith(":why=first-run")
    cluster.wait_completed(first)
    got = wait_ingested(cluster, [first], timeout=60)
    assert got and got[first]["linked"] and got[first]["peak_mib"] == 9000
    # Nothing waits in node A's spool: it went over the network (no daemon socket there).
    assert not list(cluster.node_spool("v100-1").glob("*.json"))
    again = cluster.sbatch("--gres=gpu:1", "-w", "v100-2", script=script)
    job = cluster.job(again)
    assert job["TresPerNode"].startswith(cluster.gres_prefix + "shard:"), job
    assert ":why=history-share" in job["AdminComment"]
    cluster.wait_completed(again)
    assert cluster.job(again)["NodeList"] == "v100-2"


@pytest.mark.one_version  # the agent's spool and resend; jobs ending on 24.11: the tests beside it
def test_twenty_jobs_finish_during_a_60s_cut_and_their_telemetry_arrives_after(multihost_cluster):
    """The cut lasts 60 s, or until the 20 jobs have ended where they take longer (a starved
    machine): what is checked is that they run and that no summary is lost, not their speed."""
    cluster = multihost_cluster
    node, cut_s, jobs = "v100-1", 60.0, 20
    port = cluster.ports["gpushare_tcp"]
    cluster.network.cut(node, port)
    cut_at = time.monotonic()
    job_ids: list[str] = []
    submit_s: list[float] = []
    try:
        for _ in range(jobs):
            # Shares sized by a memory hint (6 GiB): four at a time on the node's two GPUs, in
            # five waves, so a 2-core machine runs them all well within the cut. 4 s each: a
            # share's collector on 22.05 asks slurmctld for its GPU (no GPU variables for
            # shards), which it cannot once the job has ended.
            script = unique_script(cluster, work_s=4, util=20, mem_mib={"v100": 5000})
            started = time.monotonic()
            job_ids.append(cluster.sbatch("--gres=gpu:1", "--comment=gpushare:mem=6G",
                                          "-p", "gpu-v100", "-w", node, script=script))
            submit_s.append(time.monotonic() - started)
        for job_id in job_ids:  # jobs are unaffected: all finish while the cut lasts
            cluster.wait_completed(job_id, timeout=JOBS_TIMEOUT_S)  # and COMPLETED
        finished_in_cut = time.monotonic() - cut_at
        assert not set(job_ids) & set(ingested(cluster))  # nothing got through the cut
        time.sleep(max(0.0, cut_s - (time.monotonic() - cut_at)))
        # A collector spools once its delivery times out (5 s): the last jobs' summaries may
        # still be on their way, so the cut lasts until they are spooled (30 s more at most).
        spooled_ids = wait_spooled(cluster, node, job_ids, timeout=30)
        spooled = len(spooled_ids)
    finally:
        cluster.network.restore(node)
    restored_at = time.time()
    got = wait_ingested(cluster, job_ids, timeout=60)
    delays = sorted(got[j]["ts"] - restored_at for j in got)
    result = {
        "what": "20 jobs finish on one node while its link to the daemon's TCP port is cut for 60 s",
        "command": "python -m pytest tests/cluster/test_multihost_agent.py -k cut"
                   + (f" (GPUSHARE_SLURM={cluster.slurm_version})" if cluster.slurm_root else ""),
        "slurm": cluster.slurm_version,
        "host": platform.node(), "jobs": jobs, "cut_s": cut_s,
        "jobs_finished_during_cut_s": round(finished_in_cut, 1),
        "spooled_at_restore": spooled, "delivered": len(got), "lost": jobs - len(got),
        "delivery_after_restore_s": {"p50": round(statistics.median(delays), 2) if delays else None,
                                     "max": round(max(delays), 2) if delays else None},
        "sbatch_s_during_cut": {"p50": round(statistics.median(submit_s), 3),
                                "max": round(max(submit_s), 3)},
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    name = "multihost_network_cut" + ("" if cluster.slurm_version == "22.05"
                                      else f"_{cluster.slurm_version}")
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    # Every summary waited in the node's spool; if not, what the node's agent said of the others.
    assert spooled >= jobs, agent_log_of(cluster, node, set(job_ids) - spooled_ids)
    assert len(got) == jobs, result  # 0 lost
    assert max(delays) <= 30, result  # all within 30 s of the network's return


def test_a_share_above_its_memory_is_reported_live_over_the_network(multihost_cluster):
    # The single-host test, on hosts of their own: the collector's live report and the summary
    # reach the daemon only through its TCP listener.
    from test_cluster_history import test_a_job_above_its_share_is_reported

    test_a_job_above_its_share_is_reported(multihost_cluster)


def test_a_share_above_its_memory_is_requeued_over_the_network(multihost_cluster):
    from test_cluster_history import test_a_job_above_its_share_is_requeued_when_admins_choose_so

    test_a_job_above_its_share_is_requeued_when_admins_choose_so(multihost_cluster)


def test_forged_deliveries_to_the_listener_are_refused_and_logged(multihost_cluster):
    import socket

    from slurm_gpushare.node import delivery
    from slurm_gpushare.slurm import munge

    cluster = multihost_cluster
    host, port = cluster.daemon_tcp.rsplit(":", 1)
    op = {"op": "ingest", "summary": {"job_id": "999999", "gpu_index": 0, "cluster": "x"}}
    message = {"v": 1, "op": "deliver", "items": [{**op, "id": delivery.item_id(op)}]}

    def send(sealed: dict) -> dict:
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(json.dumps(sealed).encode() + b"\n")
            return json.loads(sock.makefile().readline())

    good = munge.seal(message, socket=str(cluster.munge_socket))
    send(good)  # the first use: accepted or refused for its content, never for its credential
    forged = {"non-Slurm uid": munge.seal(message, socket=str(cluster.munge_socket), uid=4242),
              "replayed": good, "unsealed": message}
    replies = {name: send(sealed) for name, sealed in forged.items()}
    assert all(not r["ok"] and r["error"].startswith("delivery refused") for r in
               replies.values()), replies
    deadline = time.monotonic() + 20  # the log is written in batches
    while True:
        reasons = sorted(json.loads(line)["reason"] for line in
                         (cluster.log / "gpushare.log").read_text().splitlines()
                         if '"delivery-refused"' in line)
        if len(reasons) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert {"uid-refused", "cred-replayed", "bad-cred"} <= set(reasons), reasons
