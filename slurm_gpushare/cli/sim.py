"""``slurm-gpushare simulate``: replay a trace under each policy and report."""

from __future__ import annotations

from pathlib import Path

import click

from slurm_gpushare.cli._params import FiniteFloatRange

from slurm_gpushare.sim.cluster import ClusterSpecError, load_cluster
from slurm_gpushare.sim.engine import EngineOptions
from slurm_gpushare.sim.run import default_data_dir, expand_policies, load_workload, run_policies
from slurm_gpushare.sim.site import cluster_from_scontrol, human_hours, human_seconds
from slurm_gpushare.sim.site import verdict as site_verdict
from slurm_gpushare.sim.traces import TraceError, load_sacct
from slurm_gpushare.sim.workload import WorkloadOptions, build_workload


@click.command()
@click.option("--trace", required=True, help="philly, openb or sacct:FILE (sacct -P or --json export).")
@click.option("--cluster", "cluster_spec", default=None,
              help="Cluster spec: a .toml file or a built-in name (philly, openb, local). "
                   "Default for sacct:FILE: this Slurm cluster's GPU nodes (scontrol).")
@click.option("--store", "store_path", type=click.Path(dir_okay=False), default=None,
              help="sacct:FILE only: the daemon's store, for each job's own telemetry "
                   "(default: the one the config names, if any).")
@click.option("--policy", "policies", multiple=True, default=("all",), show_default=True,
              help="all, or policy names (repeat or comma-separate).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of every random draw.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write summary.csv/json, relative.csv, jobs.csv.gz and PNG plots here.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N jobs.")
# 0.001 already spreads Philly's 109 days over 300 years; far below, arrivals (submit / load)
# overflow to infinity and no job runs.
@click.option("--load", type=FiniteFloatRange(min=0.001), default=1.0, show_default=True,
              help="Arrival-rate factor (2 = jobs arrive twice as fast).")
@click.option("--interference", type=click.Choice(["gavel", "alnair"]), default="gavel",
              show_default=True, help="Ground truth for co-run speeds.")
@click.option("--knowledge", type=click.Choice(["gavel", "kb"]), default="gavel", show_default=True,
              help="What sharing policies know about class pairs.")
@click.option("--max-jobs-per-gpu", type=click.IntRange(min=1), default=None,
              help="Co-location cap (default: the cluster spec's).")
@click.option("--shard-mib", type=click.IntRange(min=64, max=16384), default=1024,
              show_default=True, help="The site's shard size ([shares] shard_mib): every "
              "sharing policy rounds its shares up to whole shards.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Public data sets (default: $GPUSHARE_DATA or ../shared/data).")
@click.option("--gpu-time-budget", "gpu_time_budget", type=FiniteFloatRange(0, 100), default=0.0,
              show_default=True, help="The gpushare policy's [policy] gpu_time_budget_pct "
              "(0: shares sized by memory only).")
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def simulate(trace, cluster_spec, store_path, policies, seed, out_dir, limit, load, interference,
             knowledge, max_jobs_per_gpu, shard_mib, data_dir, gpu_time_budget, no_plots,
             as_json):
    """Replay a trace on a simulated cluster under each policy; figures vs slurm-default."""
    from slurm_gpushare.sim import report  # noqa: PLC0415 -- keeps ``slurm-gpushare --help`` fast

    data_dir = data_dir or default_data_dir()
    site = trace.startswith("sacct:")
    frame = None
    try:
        names = expand_policies(policies)
        if cluster_spec is None and not site:
            raise click.UsageError("--cluster is required (except for sacct:FILE traces)")
        if site:  # the site's own history (with its jobs' own telemetry), read before scontrol
            frame = load_sacct(trace[len("sacct:"):], store=_open_store(store_path))
        cluster = load_cluster(cluster_spec) if cluster_spec else site_cluster()
        options = WorkloadOptions(seed=seed, load=load, limit=limit)
        work = (build_workload(frame, cluster, data_dir, options, name=trace) if site
                else load_workload(trace, cluster, data_dir, options))
    except (ValueError, TraceError, ClusterSpecError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    if not len(work):
        raise click.ClickException("the trace holds no GPU jobs")
    options = EngineOptions(max_jobs_per_gpu=max_jobs_per_gpu, share_unit_mib=shard_mib)
    quiet = as_json
    from rich.progress import Progress  # noqa: PLC0415

    with Progress(transient=True, disable=quiet or len(work) < 5000) as bar:
        def progress(name):
            task = bar.add_task(name, total=len(work))
            return lambda n: bar.advance(task, n)

        outcome = run_policies(cluster, work, names, data_dir=data_dir, seed=seed,
                               interference=interference, knowledge=knowledge,
                               options=options, progress=progress,
                               gpu_time_budget_pct=gpu_time_budget)
    meta = {"trace": trace, "cluster": cluster.summary(), "policies": names, "seed": seed,
            "load": load, "limit": limit, "jobs": len(work), "interference": interference,
            "knowledge": knowledge, "gpu_time_budget_pct": gpu_time_budget,
            "shard_mib": shard_mib}
    site_doc = {}
    if frame is not None:
        partitions = sorted({p for p in frame.partition if p})
        site_doc = {"verdict": site_verdict(outcome.summary, partitions),
                    "inputs": frame[["job_id", "store_id", "memory_from", "runtime_from"]]
                    .to_dict("records")}
    if as_json:
        import json  # noqa: PLC0415

        click.echo(json.dumps({"meta": meta, "summary": report._records(outcome.summary),
                               "relative": report._records(outcome.relative), **site_doc},
                              indent=2))
    elif frame is not None:
        print_site(frame, outcome.summary, site_doc["verdict"],
                   title=f"{trace} on {cluster.summary()} ({len(work)} jobs, seed {seed})")
    else:
        report.print_tables(outcome.summary, outcome.relative,
                            title=f"{trace} on {cluster.summary()} ({len(work)} jobs, seed {seed})")
    if out_dir:
        paths = report.write_files(out_dir, outcome.summary, outcome.relative, outcome.jobs, meta)
        if not no_plots:
            paths += report.write_plots(out_dir, outcome.jobs, outcome.timelines)
        if not quiet:
            click.echo(f"wrote {', '.join(str(p) for p in paths)}")


def site_cluster():
    """This Slurm cluster's GPU nodes as a simulator cluster (types' profiles: built-in)."""
    import tomllib  # noqa: PLC0415
    from importlib import resources  # noqa: PLC0415

    from slurm_gpushare.sim.cluster import parse_cluster  # noqa: PLC0415
    from slurm_gpushare.slurm import cmd  # noqa: PLC0415

    profiles = {}
    root = resources.files("slurm_gpushare") / "data" / "clusters"
    for spec in sorted(p for p in root.iterdir() if p.name.endswith(".toml")):
        profiles.update(tomllib.loads(spec.read_text()).get("gpu_types", {}))
    text = cmd.output(["scontrol", "-o", "show", "nodes"])
    if text is None:
        raise ClusterSpecError("scontrol cannot show this cluster's nodes: pass --cluster")
    return parse_cluster(cluster_from_scontrol(text, profiles), "this cluster")


def _open_store(store_path):
    from slurm_gpushare.cli.report import store_path_from_config  # noqa: PLC0415
    from slurm_gpushare.daemon.store import Store, StoreError  # noqa: PLC0415

    if not store_path:
        store_path, _ = store_path_from_config(None)
        if not store_path:
            return None  # each job's inputs then say "public data"
    if not Path(store_path).is_file():
        raise click.ClickException(f"no store at {store_path}")
    try:
        return Store(store_path, readonly=True)
    except (StoreError, OSError) as exc:
        raise click.ClickException(f"cannot open the store {store_path}: {exc}")


def print_site(frame, summary, verdict: str, title: str) -> None:
    """The what-if on a site's history, readable at 80 columns: policies, inputs, verdict."""
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    console = Console()
    table = Table(title=title, title_justify="left")
    for label in ("policy", "GPU-h", "avg JCT", "p95 JCT", "avg queue", "shared", "OOM"):
        table.add_column(label, justify="left" if label == "policy" else "right")
    for row in summary.to_dict("records"):
        table.add_row(row["policy"], human_hours(row["gpu_hours"]),
                      human_seconds(row["jct_mean_s"]), human_seconds(row["jct_p95_s"]),
                      human_seconds(row["queue_mean_s"]), f"{row['shared_jobs']:.0%}",
                      str(int(row["oom_kills"])))
    console.print(table)
    counts = frame.groupby(["memory_from", "runtime_from"]).size()
    inputs = Table(title="Where each job's inputs came from (speed on other types and "
                         "class: public data, Gavel)", title_justify="left")
    for label in ("memory from", "run time alone from", "jobs"):
        inputs.add_column(label, justify="right" if label == "jobs" else "left")
    for (memory, runtime), n in counts.items():
        inputs.add_row(memory, runtime, str(n))
    console.print(inputs)
    console.print("Per job: --json (inputs).")
    console.print(f"[bold]Verdict:[/] {verdict}")


commands = [simulate]
