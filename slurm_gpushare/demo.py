"""``slurm-gpushare demo``: an ordinary-sbatch workload on the local test cluster.

Brings the cluster up (idempotent), submits a mix of plain ``sbatch`` jobs as users write them,
watches where they run (node and GPU index, from ``scontrol show job -d``), and prints what the
hook decided, which jobs shared a GPU, and what sharing saved in GPU time.
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field

import click
from rich.console import Console
from rich.table import Table

from .testcluster import TestCluster

TRAIN = "#!/bin/sh\n# an ordinary training script\nsleep {seconds}\n"


@dataclass
class DemoJob:
    label: str
    args: tuple[str, ...]
    seconds: int
    job_id: str = ""
    record: dict = field(default_factory=dict)
    placements: set = field(default_factory=set)  # (node, gpu index) seen while running
    start: float = 0.0
    end: float = 0.0


WORKLOAD = [
    DemoJob("train-1", ("--gres=gpu:1",), 12),
    DemoJob("train-2", ("--gres=gpu:1",), 12),
    DemoJob("train-3", ("--gres=gpu:1",), 10),
    DemoJob("train-4", ("--gres=gpu:1",), 10),
    DemoJob("big-model", ("--gres=gpu:1", "--comment=gpushare:mem=30G"), 10),
    DemoJob("a100-only", ("--gres=gpu:a100:1",), 8),
    DemoJob("gpus-flag", ("--gpus=1",), 8),
    DemoJob("two-gpus", ("--gres=gpu:2",), 6),
    DemoJob("exclusive", ("--gres=gpu:1", "--exclusive"), 6),
    DemoJob("opted-out", ("--gres=gpu:1", "--comment=gpushare=off"), 6),
    DemoJob("no-share-part", ("--gres=gpu:1", "-p", "gpu-excl"), 6),
    DemoJob("cpu-only", (), 4),
]


def _decisions(cluster: TestCluster) -> dict[str, dict]:
    path = cluster.log / "gpushare.log"
    decisions = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        entry = json.loads(line)
        if entry.get("event") == "decision":
            decisions[entry["id"]] = entry
    return decisions


def _placements(cluster: TestCluster, jobs: list[DemoJob]) -> None:
    detail = cluster.slurm("scontrol", "show", "job", "-d", check=False).stdout
    by_id = {job.job_id: job for job in jobs}
    for block in detail.split("\n\n"):
        match = re.search(r"JobId=(\d+)", block)
        if not match or match.group(1) not in by_id:
            continue
        job = by_id[match.group(1)]
        for node, kind, indexes in re.findall(r"Nodes=(\S+) .*?GRES=(gpu|shard)[^(]*\(IDX:([\d,\-]+)\)",
                                               block):
            for index in _expand(indexes):
                job.placements.add((node, index))


def _expand(indexes: str) -> list[int]:
    out = []
    for part in indexes.split(","):
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return out


def run_demo(console: Console) -> dict:
    cluster = TestCluster()
    started = time.monotonic()
    cluster.start()
    console.print(f"[bold]Local cluster up[/] in {time.monotonic() - started:.1f}s: "
                  "2 nodes x 2 v100 (16 GiB), 2 nodes x 2 a100 (80 GiB); "
                  "1 shard = 1 GiB; hook + predictor daemon on.")
    console.print(f"Slurm clients: export SLURM_CONF={cluster.slurm_conf}\n")

    jobs = [DemoJob(j.label, j.args, j.seconds) for j in WORKLOAD]
    for job in jobs:
        job.job_id = cluster.sbatch(*job.args, f"--job-name={job.label}",
                                    script=TRAIN.format(seconds=job.seconds))
    console.print(f"Submitted {len(jobs)} ordinary sbatch jobs: "
                  + ", ".join(f"{j.job_id}" for j in jobs))

    deadline = time.monotonic() + 180
    pending = {job.job_id for job in jobs}
    with console.status("waiting for the jobs to finish"):
        while pending and time.monotonic() < deadline:
            _placements(cluster, jobs)
            out = cluster.slurm("squeue", "-h", "-o", "%i", check=False).stdout.split()
            pending &= set(out)
            time.sleep(0.5)
    if pending:
        raise click.ClickException(f"jobs still queued after 180 s: {sorted(pending)}")

    fields = "JobID,State,Start,End,NodeList,AllocTRES,AdminComment"
    for job in jobs:
        job.record = cluster.sacct(job.job_id, fields)
        job.start, job.end = float(job.record["Start"]), float(job.record["End"])
    decisions = _decisions(cluster)
    return summarise(console, jobs, decisions)


def summarise(console: Console, jobs: list[DemoJob], decisions: dict[str, dict]) -> dict:
    table = Table(title="What the hook did with each ordinary sbatch", title_justify="left")
    for column in ("job", "sbatch options", "decision", "now runs as", "why"):
        table.add_column(column, overflow="fold")
    for job in jobs:
        tag = job.record.get("AdminComment", "")
        decision_id = tag.split("id=")[1].split(":")[0] if "id=" in tag else ""
        entry = decisions.get(decision_id, {})
        alloc = job.record.get("AllocTRES", "")
        gres = ",".join(t for t in alloc.split(",") if t.startswith("gres/")) or "no GPU"
        decided = f"share: {entry.get('code')}" if tag else "kept as submitted"
        table.add_row(f"{job.job_id} {job.label}", " ".join(job.args) or "(none)", decided,
                      f"{gres} on {job.record.get('NodeList')}", entry.get("reason", ""))
    console.print(table)

    # Co-location: jobs seen on the same (node, GPU index) with overlapping run times.
    on_gpu = defaultdict(list)
    for job in jobs:
        for place in job.placements:
            on_gpu[place].append(job)
    gpus = Table(title="Who shared which GPU", title_justify="left")
    for column in ("node", "GPU", "jobs (overlapping run time)", "busy s", "job s"):
        gpus.add_column(column)
    exclusive_gpu_s = sum((j.end - j.start) * max(len(j.placements), 1)
                          for j in jobs if j.placements)
    used_gpu_s = 0.0
    shared_groups = 0
    for (node, index), members in sorted(on_gpu.items()):
        intervals = sorted((j.start, j.end) for j in members)
        busy, cursor = 0.0, None
        for start, end in intervals:  # union of busy time on this GPU
            if cursor is None or start > cursor:
                busy += end - start
                cursor = end
            elif end > cursor:
                busy += end - cursor
                cursor = end
        used_gpu_s += busy
        overlapping = len(members) > 1 and busy < sum(e - s for s, e in intervals)
        shared_groups += overlapping
        gpus.add_row(node, str(index), ", ".join(f"{j.job_id} {j.label}" for j in members),
                     f"{busy:.0f}", f"{sum(e - s for s, e in intervals):.0f}")
    console.print(gpus)
    saved = exclusive_gpu_s - used_gpu_s
    summary = {
        "jobs": len(jobs),
        "shared_jobs": sum(1 for j in jobs if j.record.get("AdminComment")),
        "gpus_with_co_runners": shared_groups,
        "gpu_seconds_exclusive": round(exclusive_gpu_s, 1),
        "gpu_seconds_used": round(used_gpu_s, 1),
        "gpu_seconds_saved": round(saved, 1),
    }
    console.print(
        f"[bold]Savings[/]: {summary['shared_jobs']} of {len(jobs)} jobs ran as shares; "
        f"{shared_groups} GPU(s) ran several jobs at once. GPU time {used_gpu_s:.0f} s "
        f"instead of {exclusive_gpu_s:.0f} s with whole GPUs: {saved:.0f} GPU-s saved "
        f"({saved / exclusive_gpu_s:.0%})." if exclusive_gpu_s else "no GPU jobs ran")
    return summary


@click.command("demo")
@click.option("--json", "as_json", is_flag=True, help="Also print the summary as JSON.")
def demo_command(as_json: bool) -> None:
    """Run an ordinary-sbatch workload on the local test cluster and show the sharing."""
    console = Console(width=max(Console().width, 140))  # reasons are long; CI logs are not TTYs
    summary = run_demo(console)
    if as_json:
        click.echo(json.dumps(summary))


commands = [demo_command]
