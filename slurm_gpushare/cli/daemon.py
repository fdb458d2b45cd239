"""``serve``, ``ping``, ``hook-config`` and ``import-usage``: run, check and feed the predictor
daemon."""

from __future__ import annotations

import json
import time

import click

from slurm_gpushare.cli._params import FiniteFloatRange
from slurm_gpushare.core.config import ConfigError, load_config
from slurm_gpushare.core.files import replace_atomically
from slurm_gpushare.daemon.protocol import request
from slurm_gpushare.daemon.server import DaemonError, serve


@click.command("serve")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="TOML configuration (default: $GPUSHARE_CONFIG or /etc/slurm-gpushare/gpushare.toml).")
def serve_command(config_path: str | None) -> None:
    """Run the predictor daemon in the foreground."""
    try:
        serve(config_path)
    except (ConfigError, DaemonError) as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot serve: {exc}") from None


@click.command("ping")
@click.option("--config", "config_path", type=click.Path(dir_okay=False))
@click.option("--socket", "socket_path", help="Daemon socket (default: from the config).")
@click.option("--json", "as_json", is_flag=True)
def ping_command(config_path: str | None, socket_path: str | None, as_json: bool) -> None:
    """Check that the daemon answers; print its version and counters."""
    if not socket_path:
        socket_path = load_config(config_path).daemon.socket
    try:
        started = time.perf_counter()
        reply = request(socket_path, {"v": 1, "op": "ping"})
        elapsed = (time.perf_counter() - started) * 1000
    except OSError as exc:
        raise click.ClickException(f"daemon not reachable on {socket_path}: {exc.strerror or exc}")
    except ValueError:
        raise click.ClickException(f"daemon on {socket_path} sent an unreadable reply") from None
    if as_json:
        click.echo(json.dumps({**reply, "round_trip_ms": round(elapsed, 3)}))
    if not isinstance(reply, dict) or reply.get("ok") is not True:
        error = reply.get("error") if isinstance(reply, dict) else "no reply"
        raise click.ClickException(f"daemon on {socket_path} answers but fails: {error}")
    if not as_json:
        click.echo(f"daemon {reply.get('version')} on {socket_path}: {elapsed:.2f} ms; "
                   f"counters {reply.get('counters')}")
        view = reply.get("view")
        if isinstance(view, dict):
            read = view.get("refreshed_at")
            age = f"read {time.time() - read:.1f} s ago" if read else "not read from Slurm yet"
            click.echo(f"cluster view: {view.get('usable')} of {view.get('nodes')} GPU nodes "
                       f"take jobs; {age}")


@click.command("hook-config")
@click.option("--config", "config_path", type=click.Path(dir_okay=False))
@click.option("--output", "-o", type=click.Path(dir_okay=False), default="-",
              help="Where to write gpushare_hook.json (default: stdout).")
def hook_config_command(config_path: str | None, output: str) -> None:
    """Write the hook's settings (gpushare_hook.json) from the daemon's TOML."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    text = json.dumps(config.hook_settings(), indent=2) + "\n"
    if output == "-":
        click.echo(text, nl=False)
    else:
        replace_atomically(output, text.encode())





@click.command("import-usage")
@click.option("--config", "config_path", type=click.Path(dir_okay=False))
@click.option("--since", default="-1d", show_default=True,
              help="Jobs that ended since: now, -12h, -1d, an ISO date or epoch seconds.")
@click.option("--min-age", "min_age_s", type=FiniteFloatRange(min=0), default=None,
              help="Seconds a job must have ended ago, leaving its agent time to deliver "
                   "(default 900).")
@click.option("--sacct-file", type=click.Path(exists=True, dir_okay=False),
              help="Read a recorded `sacct -P -o ...` output instead of running sacct.")
@click.option("--dry-run", is_flag=True, help="Count what would be sent; send nothing.")
def import_usage_command(config_path, since, min_age_s, sacct_file, dry_run) -> None:
    """Fill in job history from Slurm's own GPU accounting (gres/gpumem, Slurm 23.02+ with
    AutoDetect=nvml) where the node agent left no summary. Run it as root or SlurmUser, e.g.
    from a timer; repeating a window is harmless."""
    from slurm_gpushare.cli.report import parse_when
    from slurm_gpushare.daemon.slurm_usage import DEFAULT_MIN_AGE_S, summaries_from_accounting
    from slurm_gpushare.slurm.accounting import AccountingError, ingest

    config = load_config(config_path)
    now = time.time()
    start = parse_when(since, now, "--since")
    if start > now:
        raise click.BadParameter(f"{since!r} is in the future", param_hint="'--since'")
    try:
        jobs = ingest(start, now, sacct_file=sacct_file, progress=False).jobs
    except AccountingError as exc:
        raise click.ClickException(str(exc)) from None
    summaries = summaries_from_accounting(
        jobs, config, now=now, min_age_s=DEFAULT_MIN_AGE_S if min_age_s is None else min_age_s)
    measured = sum(1 for j in jobs if j.gpu_mem_peak_mib is not None)
    if dry_run:
        click.echo(f"{len(jobs)} jobs, {measured} with Slurm's GPU accounting, "
                   f"{len(summaries)} to send")
        return
    decisions = {j.raw_id or j.job_id: j.decision_id for j in jobs if j.decision_id}
    new = 0
    for summary in summaries:
        message = {"v": 1, "op": "ingest", "summary": summary}
        if summary["job_id"] in decisions:  # ties the run to its script's fingerprint keys
            message["decision_id"] = decisions[summary["job_id"]]
        try:
            reply = request(config.daemon.socket, message, timeout=10)
        except (OSError, ValueError) as exc:
            raise click.ClickException(f"daemon not reachable on {config.daemon.socket}: "
                                       f"{exc}; {new} sent before") from None
        if not isinstance(reply, dict) or reply.get("ok") is not True:
            error = reply.get("error") if isinstance(reply, dict) else "no reply"
            raise click.ClickException(f"daemon refused a summary: {error}; {new} sent before")
        new += 1
    kept = len(jobs) - measured
    click.echo(f"{len(jobs)} jobs, {measured} with Slurm's GPU accounting: sent {new} "
               f"(single-GPU, finished, on a configured GPU type); {kept} had none")
commands = [serve_command, ping_command, hook_config_command, import_usage_command]
