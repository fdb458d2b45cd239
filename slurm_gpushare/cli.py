"""Command line: ``slurm-gpushare <command>``.

Each concept's module defines its own click commands; this file only gathers them, so
subcommands live next to the code they drive. ``main(argv)`` is callable from tests: errors are
one line on stderr with a non-zero exit; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import importlib
import sys

import click

# Modules that define a ``commands`` list of click commands/groups. A module is imported only
# when one of its commands runs (or for --help), so `serve` does not pay for scikit-learn.
COMMAND_MODULES = [
    "slurm_gpushare.daemon",
    "slurm_gpushare.testcluster",
    "slurm_gpushare.demo",
    "slurm_gpushare.memory_eval",
    "slurm_gpushare.models",
    "slurm_gpushare.kb_cli",
    "slurm_gpushare.report_cli",
    "slurm_gpushare.user_cli",
    "slurm_gpushare.sim.cli",
]
# Command name -> module, for the lazy lookup; commands not listed are found by importing all.
COMMAND_INDEX = {
    "serve": "slurm_gpushare.daemon",
    "ping": "slurm_gpushare.daemon",
    "hook-config": "slurm_gpushare.daemon",
    "cluster": "slurm_gpushare.testcluster",
    "demo": "slurm_gpushare.demo",
    "sbatch": "slurm_gpushare.user_cli",
    "explain": "slurm_gpushare.user_cli",
    "check-config": "slurm_gpushare.user_cli",
    "gen-config": "slurm_gpushare.user_cli",
    "report": "slurm_gpushare.report_cli",
    "memory": "slurm_gpushare.memory_eval",
    "classes": "slurm_gpushare.kb_cli",
    "kb": "slurm_gpushare.kb_cli",
    "models": "slurm_gpushare.models",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def _from_module(self, module_name: str, name: str | None = None):
        module = importlib.import_module(module_name)
        for command in getattr(module, "commands", []):
            if name is None or command.name == name:
                yield command

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = set(super().list_commands(ctx))
        for module_name in COMMAND_MODULES:
            names.update(c.name for c in self._from_module(module_name))
        return sorted(names)

    def get_command(self, ctx: click.Context, cmd_name: str):
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        modules = [COMMAND_INDEX[cmd_name]] if cmd_name in COMMAND_INDEX else COMMAND_MODULES
        for module_name in modules:
            for command in self._from_module(module_name, cmd_name):
                return command
        return None


class UserError(click.ClickException):
    """An error the user can fix; printed as one line."""


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.version_option(package_name="slurm-gpushare")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Safe GPU sharing for ordinary sbatch jobs on heterogeneous Slurm clusters."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status instead of exiting."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        # In this mode click returns the exit code of ctx.exit(n) / Exit(n) instead of raising.
        status = cli.main(args=argv, prog_name="slurm-gpushare", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        if debug:
            raise
        click.echo(f"slurm-gpushare: {exc.format_message()}", err=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 -- the CLI's one-line error contract
        if debug:
            raise
        click.echo(f"slurm-gpushare: error: {exc} (run with --debug for the traceback)", err=True)
        return 1
    return status if isinstance(status, int) else 0


def sbatch_main(argv: list[str] | None = None) -> int:
    """``gpushare-sbatch``: sbatch with --explain / --no-share (see slurm_gpushare.wrapper)."""
    module = importlib.import_module("slurm_gpushare.wrapper")
    return module.main(argv)


if __name__ == "__main__":
    sys.exit(main())
