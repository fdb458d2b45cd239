"""``slurm-gpushare simulate``: replay a trace under each policy and report."""

from __future__ import annotations

from pathlib import Path

import click

from slurm_gpushare.sim.cluster import ClusterSpecError, load_cluster
from slurm_gpushare.sim.engine import EngineOptions
from slurm_gpushare.sim.run import default_data_dir, expand_policies, load_workload, run_policies
from slurm_gpushare.sim.traces import TraceError
from slurm_gpushare.sim.workload import WorkloadOptions


@click.command()
@click.option("--trace", required=True, help="philly, openb or sacct:FILE (sacct -P or --json export).")
@click.option("--cluster", "cluster_spec", required=True,
              help="Cluster spec: a .toml file or a built-in name (philly, openb, local).")
@click.option("--policy", "policies", multiple=True, default=("all",), show_default=True,
              help="all, or policy names (repeat or comma-separate).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every random draw.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write summary.csv/json, relative.csv, jobs.csv.gz and PNG plots here.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N jobs.")
@click.option("--load", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Arrival-rate factor (2 = jobs arrive twice as fast).")
@click.option("--interference", type=click.Choice(["gavel", "alnair"]), default="gavel",
              show_default=True, help="Ground truth for co-run speeds.")
@click.option("--knowledge", type=click.Choice(["gavel", "kb"]), default="gavel", show_default=True,
              help="What sharing policies know about class pairs.")
@click.option("--max-jobs-per-gpu", type=click.IntRange(min=1), default=None,
              help="Co-location cap (default: the cluster spec's).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Public data sets (default: $GPUSHARE_DATA or ../shared/data).")
@click.option("--gpu-time-budget", "gpu_time_budget", type=click.FloatRange(min=0), default=0.0,
              show_default=True, help="The gpushare policy's [policy] gpu_time_budget_pct "
              "(0: shares sized by memory only).")
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def simulate(trace, cluster_spec, policies, seed, out_dir, limit, load, interference, knowledge,
             max_jobs_per_gpu, data_dir, gpu_time_budget, no_plots, as_json):
    """Replay a trace on a simulated cluster under each policy; figures vs slurm-default."""
    from slurm_gpushare.sim import report  # noqa: PLC0415 -- keeps ``slurm-gpushare --help`` fast

    data_dir = data_dir or default_data_dir()
    try:
        names = expand_policies(policies)
        cluster = load_cluster(cluster_spec)
        work = load_workload(trace, cluster, data_dir,
                             WorkloadOptions(seed=seed, load=load, limit=limit))
    except (ValueError, TraceError, ClusterSpecError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    if not len(work):
        raise click.ClickException("the trace holds no GPU jobs")
    options = EngineOptions(max_jobs_per_gpu=max_jobs_per_gpu)
    quiet = as_json
    from rich.progress import Progress  # noqa: PLC0415

    with Progress(transient=True, disable=quiet or len(work) < 5000) as bar:
        def progress(name):
            task = bar.add_task(name, total=len(work))
            return lambda n: bar.advance(task, n)

        try:
            outcome = run_policies(cluster, work, names, data_dir=data_dir, seed=seed,
                                   interference=interference, knowledge=knowledge,
                                   options=options, progress=progress,
                                   gpu_time_budget_pct=gpu_time_budget)
        except ImportError as exc:
            raise click.ClickException(f"--knowledge kb needs the knowledge base module: {exc}") from None
    meta = {"trace": trace, "cluster": cluster.summary(), "policies": names, "seed": seed,
            "load": load, "limit": limit, "jobs": len(work), "interference": interference,
            "knowledge": knowledge, "gpu_time_budget_pct": gpu_time_budget}
    if as_json:
        import json  # noqa: PLC0415

        click.echo(json.dumps({"meta": meta, "summary": report._records(outcome.summary),
                               "relative": report._records(outcome.relative)}, indent=2))
    else:
        report.print_tables(outcome.summary, outcome.relative,
                            title=f"{trace} on {cluster.summary()} ({len(work)} jobs, seed {seed})")
    if out_dir:
        paths = report.write_files(out_dir, outcome.summary, outcome.relative, outcome.jobs, meta)
        if not no_plots:
            paths += report.write_plots(out_dir, outcome.jobs, outcome.timelines)
        if not quiet:
            click.echo(f"wrote {', '.join(str(p) for p in paths)}")


commands = [simulate]
