"""Commands for the people who submit jobs.

``slurm-gpushare sbatch`` (the same as ``gpushare-sbatch``) and ``explain``; the code lives in
``user.wrapper`` and ``user.explain``.
"""

from __future__ import annotations

import json
import sys

import click

from slurm_gpushare.user import wrapper
from slurm_gpushare.user.explain import explain_job, format_report


@click.command("sbatch", add_help_option=False,
               context_settings={"ignore_unknown_options": True,
                                 "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def sbatch_command(args: tuple[str, ...]) -> None:
    """sbatch, plus --explain and --no-share (same as gpushare-sbatch).

    Every argument goes to sbatch unchanged (`slurm-gpushare sbatch --help` is sbatch's help);
    the exit status is sbatch's.
    """
    status = wrapper.run(list(args))
    if status:
        # SystemExit rather than click's Exit: the caller gets sbatch's own status, with no
        # message of ours added (click's Exit is turned into a return value by main()).
        sys.exit(status)


@click.command("explain")
@click.argument("job_id")
@click.option("--socket", "socket_path", help="Query socket (default: daemon.query_socket from "
                                              "the config, or $GPUSHARE_QUERY_SOCKET).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def explain_command(job_id: str, socket_path: str | None, as_json: bool) -> None:
    """Show what slurm-gpushare decided for a job, why, and how it went."""
    report = explain_job(job_id, socket_path)
    click.echo(json.dumps(report, indent=2, sort_keys=True) if as_json else format_report(report))


commands = [sbatch_command, explain_command]
