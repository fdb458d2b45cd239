"""Command line: ``slurm-gpushare <command>``.

Each concept's module defines its own click commands; this file only gathers them, so
subcommands live next to the code they drive. ``main(argv)`` is callable from tests: errors are
one line on stderr with a non-zero exit; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import click

from slurm_gpushare.core.errors import UserError

# Every module of this package defines a ``commands`` list of click commands/groups. A module is
# imported only when one of its commands runs (or for --help), so `serve` does not pay for
# scikit-learn. The name -> module index is read from the modules' source, never kept by hand.
_TOP_COMMAND = re.compile(r'^@click\.(?:command|group)\((?:"([\w-]+)")?.*?^def (\w+)\(', re.M | re.S)


def _command_index() -> dict[str, str]:
    index = {}
    for path in sorted(Path(__file__).parent.glob("[!_]*.py")):
        for name, function in _TOP_COMMAND.findall(path.read_text()):
            index[name or function.replace("_", "-")] = f"{__name__}.{path.stem}"
    return index


COMMAND_INDEX = _command_index()
COMMAND_MODULES = sorted(set(COMMAND_INDEX.values()))


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
    except UserError as exc:
        if debug:
            raise
        click.echo(f"slurm-gpushare: {exc}", err=True)
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
    """``gpushare-sbatch``: sbatch with --explain / --no-share (see slurm_gpushare.user.wrapper)."""
    module = importlib.import_module("slurm_gpushare.user.wrapper")
    return module.main(argv)


if __name__ == "__main__":
    sys.exit(main())
