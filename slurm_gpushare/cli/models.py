"""``models fit|show``: refit the memory predictor from the site's history."""

from __future__ import annotations
import json
import pickle
from pathlib import Path
import click
from slurm_gpushare.core.config import ConfigError, load_config
from slurm_gpushare.predict.persist import fit_memory_model, model_path


@click.group("models")
def models_group() -> None:
    """The daemon's fitted models: refit from the store, show what is in use."""


@models_group.command("fit")
@click.option("--config", "config_path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
def fit_command(config_path: str | None, as_json: bool) -> None:
    """Refit the memory predictor on SchedTune plus the site's history; reload the daemon after."""
    from slurm_gpushare.daemon.store import Store, StoreError

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    store_path = Path(config.daemon.state_dir) / "store.sqlite"
    if not store_path.exists():
        raise click.ClickException(f"no store at {store_path}: has the daemon run yet?")
    try:
        store = Store(store_path, readonly=True)  # fitting only reads; the daemon writes
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    with store:
        metadata = fit_memory_model(config, store)
    if as_json:
        click.echo(json.dumps(metadata, default=str))
        return
    metrics = metadata.get("metrics", {})
    click.echo(f"memory model written to {model_path(config)}: "
               f"{int(metrics.get('schedtune_rows', 0))} SchedTune rows + "
               f"{int(metrics.get('site_rows', 0))} site rows from "
               f"{int(metrics.get('site_jobs', 0))} jobs seen on several GPU types; "
               "reload the daemon (SIGHUP) to use it")


@models_group.command("show")
@click.option("--config", "config_path", type=click.Path(dir_okay=False))
def show_command(config_path: str | None) -> None:
    """Which memory model the daemon would load, with its training metadata."""
    from slurm_gpushare.predict.persist import load_predictor, site_model_path

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    path = site_model_path(config)
    if path is None:
        click.echo(f"no site model at {model_path(config)}: the packaged SchedTune-fitted "
                   "default is used")
        return
    try:
        _predictor, metadata = load_predictor(path)
    except (OSError, ValueError, KeyError, pickle.UnpicklingError) as exc:
        raise click.ClickException(f"cannot read {path}: {exc}") from None
    click.echo(json.dumps({"path": str(path), **metadata}, indent=2, default=str))


commands = [models_group]
