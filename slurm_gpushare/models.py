"""The daemon's fitted models, refit from the site's own history: ``slurm-gpushare models fit``.

The cross-type memory predictor starts from the packaged SchedTune measurements. Every job the
site ran on more than one GPU type adds what it measured: its peak per type, keyed by its
exact-script fingerprint (never by anything the job said about itself). The model is written
atomically under a file lock with its training metadata; the daemon loads it at start and on
SIGHUP.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from .config import Config, ConfigError, load_config

MEMORY_MODEL = "memory.pkl"
# A peak at this share of the GPU is a pre-allocating framework, not a measurement of need.
PREALLOC_PCT = 95.0


def model_path(config: Config) -> Path:
    return Path(config.daemon.state_dir) / "models" / MEMORY_MODEL


def site_observations(store):
    """Peaks per (job fingerprint, GPU model) from the store, as the predictor trains on them."""
    import pandas as pd

    from .gpus import default_catalogue

    catalogue = default_catalogue()
    rows = []
    for record in store.decisions(limit=10**9):
        keys, job_id = record.get("keys") or [], record.get("job_id")
        if not keys or not job_id:
            continue
        for summary in store.summaries(job_id, record.get("cluster", "")):
            peak, pct = summary.get("mgmap_max_mib"), summary.get("mgmap_max_pct")
            if not peak or peak <= 0 or (pct is not None and pct >= PREALLOC_PCT):
                continue
            try:
                model = catalogue.lookup(summary.get("gpu_model") or "").model
            except KeyError:
                continue
            rows.append({"job": f"site:{keys[0]}", "group": f"site:{keys[0]}", "gpu": model,
                         "peak_mib": float(peak)})
    frame = pd.DataFrame(rows, columns=["job", "group", "gpu", "peak_mib"])
    # Several runs of one job on one type: their largest peak (what a share must hold).
    return frame.groupby(["job", "group", "gpu"], as_index=False)["peak_mib"].max()


def fit_memory_model(config: Config, store) -> dict:
    """Fit on SchedTune + the site's multi-type jobs, save, and return the metadata."""
    import pandas as pd

    from .memory import (CrossTypeMemoryPredictor, load_schedtune, observations_from_schedtune,
                         save_predictor)

    site = site_observations(store)
    multi = site.groupby("job")["gpu"].nunique()
    site = site[site.job.isin(multi[multi >= 2].index)]
    base = observations_from_schedtune(load_schedtune())
    data = pd.concat([base, site], ignore_index=True)
    predictor = CrossTypeMemoryPredictor().fit(data)
    metadata = save_predictor(predictor, model_path(config), training_data=data,
                              metrics={"schedtune_rows": float(len(base)),
                                       "site_rows": float(len(site)),
                                       "site_jobs": float(site.job.nunique())})
    return metadata


def load_memory_model(config: Config):
    """The site's fitted predictor, or None (the daemon then uses the packaged default)."""
    path = model_path(config)
    if not path.exists():
        return None
    from .memory import load_predictor

    predictor, _metadata = load_predictor(path)
    return predictor


@click.group("models")
def models_group() -> None:
    """The daemon's fitted models: refit from the store, show what is in use."""


@models_group.command("fit")
@click.option("--config", "config_path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
def fit_command(config_path: str | None, as_json: bool) -> None:
    """Refit the memory predictor on SchedTune plus the site's history; reload the daemon after."""
    from .store import Store

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    store_path = Path(config.daemon.state_dir) / "store.sqlite"
    if not store_path.exists():
        raise click.ClickException(f"no store at {store_path}: has the daemon run yet?")
    with Store(store_path) as store:
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
    from .memory import load_predictor

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    path = model_path(config)
    if not path.exists():
        click.echo(f"no site model at {path}: the packaged SchedTune-fitted default is used")
        return
    _predictor, metadata = load_predictor(path)
    click.echo(json.dumps(metadata, indent=2, default=str))


commands = [models_group]
