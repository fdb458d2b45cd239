"""``python -m devcluster demo``: an ordinary-sbatch workload on the local test cluster.

Brings the cluster up (idempotent), submits a mix of plain ``sbatch`` jobs as users write them,
watches where they run (node and GPU index, from ``scontrol show job -d``), and prints what the
hook decided, which jobs shared a GPU, and the accounting report for these jobs. Every saving
the demo prints is the report's own figure (docs/reports.md): it computes none of its own.
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

from slurm_gpushare.slurm.accounting import SACCT_FIELDS
from slurm_gpushare.slurm.jobs import gres_placements
from devcluster.cluster import TestCluster
from devcluster.fakegpu import work_per_type

@dataclass
class DemoJob:
    label: str
    args: tuple[str, ...]
    model: str = ""  # which training script (fake workload); "" for a plain sleep
    job_id: str = ""
    record: dict = field(default_factory=dict)
    placements: set = field(default_factory=set)  # (node, gpu index) seen while running
    start: float = 0.0
    end: float = 0.0


# Six training scripts: (seconds of work on a V100, GPU utilisation %, memory-access %, peak MiB
# per type). Their telemetry is what the predictor learns from; nothing else about them is read.
MODELS = {
    "resnet18": (14, 35, 15, {"v100": 3800, "a100": 4300}),
    "resnet50": (16, 55, 30, {"v100": 7400, "a100": 8100}),
    "bert-small": (14, 45, 25, {"v100": 5200, "a100": 5600}),
    "dcgan": (12, 30, 10, {"v100": 2100, "a100": 2500}),
    "vgg16": (16, 70, 40, {"v100": 10400, "a100": 11300}),
    "big-transformer": (14, 60, 35, {"v100": 15300, "a100": 21000}),
}
TODAY = [DemoJob(model, ("--gres=gpu:1",), model) for model in MODELS] + [
    DemoJob("new-script", ("--gres=gpu:1",), "new"),
    DemoJob("two-gpus", ("--gres=gpu:2",)),
    DemoJob("exclusive", ("--gres=gpu:1", "--exclusive")),
    DemoJob("opted-out", ("--gres=gpu:1", "--comment=gpushare=off")),
    DemoJob("no-share-part", ("--gres=gpu:1", "-p", "gpu-excl")),
    DemoJob("cpu-only", ()),
]


def _script(cluster: TestCluster, model: str) -> str:
    if model not in MODELS:
        return "#!/bin/sh\n# an ordinary batch job\nsleep 6\n"
    work, util, mem_util, mem = MODELS[model]
    # Less time on an A100, more on a T4 (fakegpu.TYPE_SPEED), as on real GPUs.
    shebang, rest = cluster.training_script(work_s=work_per_type(work), util=util,
                                            mem_util=mem_util, mem_mib=mem).split("\n", 1)
    return f"{shebang}\nMODEL={model}\n{rest}"  # the line makes each script its own


def _run_jobs(cluster: TestCluster, jobs: list[DemoJob], console: Console, what: str) -> None:
    for job in jobs:
        job.job_id = cluster.sbatch(*job.args, f"--job-name={job.label}",
                                    script=_script(cluster, job.model or job.label))
    pending = {job.job_id for job in jobs}
    deadline = time.monotonic() + 240
    with console.status(what):
        while pending and time.monotonic() < deadline:
            _placements(cluster, jobs)
            pending &= set(cluster.slurm("squeue", "-h", "-o", "%i", check=False).stdout.split())
            time.sleep(0.3)
    if pending:
        raise click.ClickException(f"jobs still queued after 240 s: {sorted(pending)}")
    fields = "JobID,State,Start,End,NodeList,AllocTRES,AdminComment"
    for job in jobs:
        job.record = cluster.sacct(job.job_id, fields)
        job.start, job.end = float(job.record["Start"]), float(job.record["End"])


def _wait_for_telemetry(cluster: TestCluster, jobs: list[DemoJob], timeout: float = 60) -> None:
    wanted = {job.job_id for job in jobs if job.model}
    deadline = time.monotonic() + timeout
    while wanted and time.monotonic() < deadline:
        for line in (cluster.log / "gpushare.log").read_text().splitlines():
            entry = json.loads(line)
            if entry.get("event") == "ingested" and entry.get("linked"):
                wanted.discard(entry.get("job_id"))
        time.sleep(0.3)


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
        for node, indexes in gres_placements(block):
            for index in indexes:
                job.placements.add((node, index))


def run_demo(console: Console) -> dict:
    cluster = TestCluster()
    started = time.monotonic()
    cluster.start()
    console.print(f"[bold]Local cluster up[/] in {time.monotonic() - started:.1f}s: "
                  "2 nodes x 2 v100 (16 GiB), 2 nodes x 2 a100 (80 GiB) shared by shards "
                  "(1 shard = 1 GiB), 1 node x 2 t4 (16 GiB) shared by MPS; "
                  "hook + predictor daemon + telemetry prolog/epilog on.")
    console.print(f"Slurm clients: export SLURM_CONF={cluster.slurm_conf}\n")

    # On a second demo run these scripts already have history, so even step 1 shares.
    profiling = [DemoJob(model, ("--gres=gpu:1",), model) for model in MODELS]
    console.print("[bold]1. Earlier runs[/]: each training script runs once as submitted; "
                  "new jobs get a whole GPU and the prolog/epilog records their telemetry.")
    _run_jobs(cluster, profiling, console, "first runs (profiled on whole GPUs)")
    for job in profiling:
        console.print(f"   {job.job_id} {job.label:16} -> {_outcome(job)}")
    _wait_for_telemetry(cluster, profiling)

    console.print("\n[bold]2. Today[/]: the same scripts submitted again with plain sbatch, "
                  "plus a new script and jobs that must be left alone.")
    jobs = [DemoJob(j.label, j.args, j.model) for j in TODAY]
    _run_jobs(cluster, jobs, console, "today's jobs running")
    _wait_for_telemetry(cluster, jobs)
    summary = summarise(console, jobs, _decisions(cluster))
    report = _report(cluster, profiling + jobs, console)
    summary["report"] = report["totals"]
    summary["verdict"] = report["verdict"]
    t = report["totals"]
    console.print(
        f"\n[bold]Savings[/] (the report's figures, docs/reports.md): "
        f"{_h(t['gpu_hours_saved'])} GPU-h saved ({_p(t['saved_fraction'])}) of "
        f"{_h(t['gpu_hours_exclusive'])} on whole GPUs; packing saving {_p(t['ps'])}; "
        f"median slowdown {_p(t['isd_median'])} over {t['isd_n']} jobs; "
        f"OOM {t['oom_shared']}.\n[bold]Verdict:[/] {report['verdict']}")
    console.print(
        "\nWhat if sharing were on for all of this history (each job's own telemetry):\n"
        f"  SLURM_CONF={cluster.slurm_conf} GPUSHARE_CONFIG={cluster.daemon_config} "
        f"slurm-gpushare simulate --trace sacct:{cluster.root / 'demo-sacct.psv'}", soft_wrap=True)
    return summary


def _h(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def _p(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def _outcome(job: DemoJob) -> str:
    alloc = ",".join(t for t in job.record.get("AllocTRES", "").split(",") if t.startswith("gres/"))
    why = job.record.get("AdminComment", "").rsplit("why=", 1)[-1] or "-"
    return f"{alloc or 'no GPU'} on {job.record.get('NodeList')} ({why})"


def _report(cluster: TestCluster, jobs: list[DemoJob], console: Console) -> dict:
    """The accounting report for these jobs: sacct joined with the daemon's store, exactly as
    ``slurm-gpushare report`` computes it."""
    from slurm_gpushare.slurm.accounting import (node_gpu_types_from_scontrol, parse_psv,
                                                 resolve_gpu_types)
    from slurm_gpushare.reports.savings import build_report
    from slurm_gpushare.cli.report import render_table
    from slurm_gpushare.daemon.store import Store

    ids = ",".join(job.job_id for job in jobs)
    psv = cluster.slurm("sacct", "-a", "-D", "-P", "-j", ids, "-o", ",".join(SACCT_FIELDS),
                        env={"SLURM_TIME_FORMAT": "%s"}).stdout
    (cluster.root / "demo-sacct.psv").write_text(psv)  # for `simulate --trace sacct:FILE`
    records = parse_psv(psv, progress=False)
    resolve_gpu_types(records, node_gpu_types_from_scontrol(
        cluster.slurm("scontrol", "-o", "show", "nodes").stdout))
    since = min(job.start for job in jobs) - 1
    until = max(job.end for job in jobs) + 1
    store = Store(cluster.root / "predictor" / "store.sqlite")
    try:
        report = build_report(records, since=since, until=until, by="gpu-type", store=store,
                              source="this demo's jobs")
    finally:
        store.close()
    console.print()
    render_table(report, console)
    return report


def summarise(console: Console, jobs: list[DemoJob], decisions: dict[str, dict]) -> dict:
    table = Table(title="What the hook did with today's ordinary sbatch jobs",
                  title_justify="left")
    for column in ("job", "sbatch options", "decision", "now runs as", "why"):
        table.add_column(column, overflow="fold")
    for job in jobs:
        tag = job.record.get("AdminComment", "")
        decision_id = tag.split("id=")[1].split(":")[0] if "id=" in tag else ""
        entry = decisions.get(decision_id, {})
        alloc = job.record.get("AllocTRES", "")
        gres = ",".join(t for t in alloc.split(",") if t.startswith("gres/")) or "no GPU"
        action = tag.split(":")[2] if tag.count(":") >= 2 else ""
        decided = (f"share: {entry.get('code')}" if action == "share" else
                   f"whole GPU: {entry.get('code')}" if action == "keep" else "left as submitted")
        table.add_row(f"{job.job_id} {job.label}", " ".join(job.args) or "(none)", decided,
                      f"{gres} on {job.record.get('NodeList')}", entry.get("reason", ""))
    console.print(table)

    # Where jobs ran: (node, GPU index) seen while they ran. What that saved is the report's.
    on_gpu = defaultdict(list)
    for job in jobs:
        for place in job.placements:
            on_gpu[place].append(job)
    gpus = Table(title="Who shared which GPU", title_justify="left")
    for column in ("node", "GPU", "jobs (seen there while running)"):
        gpus.add_column(column)
    for (node, index), members in sorted(on_gpu.items()):
        gpus.add_row(node, str(index), ", ".join(f"{j.job_id} {j.label}" for j in members))
    console.print(gpus)
    return {"jobs": len(jobs),
            "shared_jobs": sum(1 for j in jobs if ":share:" in j.record.get("AdminComment", "")),
            "gpus_with_several_jobs": sum(1 for m in on_gpu.values() if len(m) > 1)}


@click.command("demo")
@click.option("--json", "as_json", is_flag=True, help="Also print the summary as JSON.")
def demo_command(as_json: bool) -> None:
    """Run an ordinary-sbatch workload on the local test cluster and show the sharing."""
    console = Console(width=max(Console().width, 140))  # reasons are long; CI logs are not TTYs
    summary = run_demo(console)
    if as_json:
        click.echo(json.dumps(summary))



