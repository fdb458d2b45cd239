"""Commands for the people who submit jobs and the admins who set sharing up.

``slurm-gpushare sbatch`` (the same as ``gpushare-sbatch``), ``explain``, ``check-config`` and
``gen-config``; the code lives in ``wrapper``, ``explain`` and ``configcheck``.
"""

from __future__ import annotations

import sys

import click

from . import wrapper
from .configcheck import check_config_command, gen_config_command
from .explain import explain_command


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


commands = [sbatch_command, explain_command, check_config_command, gen_config_command]
