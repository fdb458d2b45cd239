"""``serve``, ``ping`` and ``hook-config``: run and check the predictor daemon."""

from __future__ import annotations

import json
import time

import click

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


commands = [serve_command, ping_command, hook_config_command]
