"""The daemon's fitted models, refit from the site's own history: ``slurm-gpushare models fit``.

The cross-type memory predictor starts from the packaged SchedTune measurements. Every job the
site ran on more than one GPU type adds what it measured: its peak per type, keyed by its
exact-script fingerprint (never by anything the job said about itself). The model is written
atomically under a file lock with its training metadata; the daemon loads it at start and on
SIGHUP.
"""

from __future__ import annotations

from pathlib import Path


from slurm_gpushare.core.config import Config
from slurm_gpushare.predict.history import PREALLOC_PCT

MEMORY_MODEL = "memory.pkl"
# `slurm-gpushare classes fit` writes here by default; the daemon loads it at start and on SIGHUP.
CLASSES_MODEL = "classes.json"


def model_path(config: Config) -> Path:
    return Path(config.daemon.state_dir) / "models" / MEMORY_MODEL


def site_observations(store):
    """Peaks per (job fingerprint, GPU model) from the store, as the predictor trains on them."""
    import pandas as pd

    from slurm_gpushare.core.gpus import default_catalogue

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

    from slurm_gpushare.predict.datasets import load_schedtune
    from slurm_gpushare.predict.memory import (CrossTypeMemoryPredictor, observations_from_schedtune,
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


def classes_model_path(config: Config) -> Path:
    return Path(config.daemon.state_dir) / CLASSES_MODEL


def load_classes_model(config: Config):
    """The site's interference classes (``classes fit``), or None (the packaged default)."""
    path = classes_model_path(config)
    if not path.exists():
        return None
    from slurm_gpushare.predict.classes import InterferenceClasses

    return InterferenceClasses.load(path)


def load_memory_model(config: Config):
    """The site's fitted predictor, or None (the daemon then uses the packaged default)."""
    path = model_path(config)
    if not path.exists():
        return None
    from slurm_gpushare.predict.memory import load_predictor

    predictor, _metadata = load_predictor(path)
    return predictor
