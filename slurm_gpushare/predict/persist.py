"""Our fitted models on disk: where they live, how they are written (atomically, under a file
lock) and read back. The public data sets are read by ``datasets.py``, never here.

- the cross-type memory predictor (``models fit``: JSON, the fitted model with its training
  metadata; a ``memory.pkl`` written by earlier versions is still read when no JSON is there);
- the interference classes (``classes fit``) and the knowledge base: JSON;
- the packaged default fits (``data/models``: memory predictor, classes, run time) and pair prior
  (``data/interference/pair_prior.json``), regenerated with
  ``python -m slurm_gpushare.predict.persist``.

The cross-type memory predictor (``slurm-gpushare models fit``) starts from the packaged SchedTune measurements. Every job the
site ran on more than one GPU type adds what it measured: its peak per type, keyed by its
exact-script fingerprint (never by anything the job said about itself). The model is written
atomically under a file lock with its training metadata; the daemon loads it at start and on
SIGHUP. Every model the daemon loads is plain JSON read into the plain fitted models
(``memory.MemoryModel``, ``classes.ClassModel``, ...): the daemon never imports scikit-learn,
scipy or pandas, which only fitting needs.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import pickle
import sys
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from slurm_gpushare.core.config import Config
from slurm_gpushare.core.files import write_locked
from slurm_gpushare.predict.datasets import package_path
from slurm_gpushare.predict.history import PREALLOC_PCT

if TYPE_CHECKING:
    import pandas as pd

    from slurm_gpushare.predict.memory import MemoryModel

MEMORY_MODEL = "memory.json"
# What versions before the JSON model wrote (a pickle of the scikit-learn estimator): still read
# where no memory.json exists, so an upgrade keeps the site's fit until the next `models fit`.
LEGACY_MEMORY_MODEL = "memory.pkl"
# `slurm-gpushare classes fit` writes here by default; the daemon loads it at start and on SIGHUP.
CLASSES_MODEL = "classes.json"


def model_path(config: Config) -> Path:
    """Where ``models fit`` writes the site's memory model."""
    return Path(config.daemon.state_dir) / "models" / MEMORY_MODEL


def site_model_path(config: Config) -> Path | None:
    """The site's memory model the daemon loads: ``memory.json``, else an earlier version's
    ``memory.pkl``; None when there is neither (the packaged default is used)."""
    for path in (model_path(config), model_path(config).with_name(LEGACY_MEMORY_MODEL)):
        if path.exists():
            return path
    return None


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
    from slurm_gpushare.predict.estimators import CrossTypeMemoryPredictor
    from slurm_gpushare.predict.memory import observations_from_schedtune

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
    from slurm_gpushare.predict.classes import ClassModel

    return ClassModel.load(path)


def load_memory_model(config: Config) -> MemoryModel | None:
    """The site's fitted predictor, or None (the daemon then uses the packaged default)."""
    path = site_model_path(config)
    if path is None:
        return None
    predictor, _metadata = load_predictor(path)
    return predictor


# -- JSON models (interference classes, knowledge base) -------------------------------------
def save_json(path: str | os.PathLike, data: Mapping[str, Any]) -> None:
    """Write a model's dict as JSON atomically under ``<path>.lock`` (see core/files.py)."""
    write_locked(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def load_json(path: str | os.PathLike) -> dict[str, Any]:
    data = json.loads(Path(path).read_bytes().decode())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a model file (JSON {type(data).__name__}, not an object)")
    return data


# -- the site's memory predictor (JSON: the fitted model and its training metadata) -----------
MEMORY_FILE_FORMAT = "slurm-gpushare/site-memory-model/1"


def training_hash(X: pd.DataFrame) -> str:
    """sha256 of the training table in a canonical order."""
    canonical = X.sort_values(list(X.columns)).to_csv(index=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def save_predictor(predictor, path: str | os.PathLike, *,
                   training_data: pd.DataFrame | None = None,
                   metrics: Mapping[str, float] | None = None) -> dict:
    """Write ``predictor`` (a fitted ``CrossTypeMemoryPredictor`` or its ``MemoryModel``) with
    its metadata as one JSON file, atomically under a lock; return the metadata."""
    model = predictor.to_dict()  # raises NotFittedError for an unfitted estimator
    metadata = {
        "estimator": "CrossTypeMemoryPredictor",
        "params": model["params"],
        "trained_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "sklearn_version": getattr(sys.modules.get("sklearn"), "__version__", None),
        "data_sha256": training_hash(training_data) if training_data is not None else None,
        "n_rows": int(len(training_data)) if training_data is not None else None,
        "metrics": dict(metrics or {}),
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_json(path, {"format": MEMORY_FILE_FORMAT, "metadata": metadata, "model": model})
    return metadata


def load_predictor(path: str | os.PathLike) -> tuple[MemoryModel, dict]:
    """The fitted model and metadata written by ``save_predictor``; a ``.pkl`` is read as an
    earlier version's pickle (a trusted local file) without importing scikit-learn."""
    from slurm_gpushare.predict.memory import MemoryModel

    if Path(path).suffix == ".pkl":
        return _load_legacy_predictor(path)
    data = load_json(path)
    if data.get("format") != MEMORY_FILE_FORMAT:
        raise ValueError(f"{path}: not a site memory model (format {data.get('format')!r})")
    return MemoryModel.from_dict(data["model"]), data["metadata"]


class _LegacyEstimator:
    """Stands in for the scikit-learn estimator an earlier version pickled: unpickling fills
    its ``__dict__`` with the estimator's parameters and fitted attributes."""


# What an earlier version's pickled estimator holds besides plain data: its fitted transfers,
# numpy arrays and the GPU catalogue. Any other class is refused: unpickling one may run any
# code.
_LEGACY_CLASSES = {
    ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
    ("slurm_gpushare.core.gpus", "Catalogue"), ("slurm_gpushare.core.gpus", "GpuSpec"),
    ("slurm_gpushare.predict.memory", "PairTransfer"),
}


class _LegacyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) == ("slurm_gpushare.predict.memory", "CrossTypeMemoryPredictor"):
            return _LegacyEstimator
        if (module, name) in _LEGACY_CLASSES:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a memory model never holds {module}.{name}")


def _load_legacy_predictor(path: str | os.PathLike) -> tuple[MemoryModel, dict]:
    import io

    from slurm_gpushare.predict.memory import MemoryModel

    payload = _LegacyUnpickler(io.BytesIO(Path(path).read_bytes())).load()
    state = vars(payload["estimator"])
    params = {k: state[k] for k in ("coverage", "huber_delta", "min_jobs", "min_calibration",
                                    "n_folds", "max_sources", "same_type_margin",
                                    "unseen_type_margin", "random_state")}
    model = MemoryModel(params=params, types=state["types_"], pairs=state["pairs_"],
                        margins=state["margins_"], margin_by_count=state["margin_by_count_"],
                        n_jobs=state["n_jobs_"], catalogue=state.get("catalogue"))
    return model, payload["metadata"]


# -- the packaged default fits (data/models/*.json) ----------------------------------------
# What a site starts with before its own data, fitted on the packaged data sets. Stored so that
# a start reads them instead of fitting (seconds); a test checks each is the current fit.
PACKAGED_FITS = ("memory", "classes", "runtime", "kb-seed")


def packaged_fit_path(name: str) -> Path:
    return package_path("models", f"{name}.json")


@lru_cache(maxsize=len(PACKAGED_FITS))
def _packaged_fit_text(name: str) -> str:
    if name not in PACKAGED_FITS:
        raise ValueError(f"no packaged fit {name!r}")
    return packaged_fit_path(name).read_text()


def packaged_fit(name: str) -> dict[str, Any]:
    """The stored default fit ``name`` as a dict (a fresh copy each call)."""
    return json.loads(_packaged_fit_text(name))


def fresh_fit(name: str) -> dict[str, Any]:
    """The default fit ``name`` computed now from the packaged data."""
    if name == "memory":
        from slurm_gpushare.predict.memory import fit_default_predictor

        return fit_default_predictor().to_dict()
    if name == "classes":
        from slurm_gpushare.predict.classes import fit_default_classes

        return fit_default_classes().to_dict()
    if name == "kb-seed":
        from slurm_gpushare.predict.knowledge import fresh_seed_pairs

        return fresh_seed_pairs()
    if name == "runtime":
        from slurm_gpushare.predict.runtime import fit_default_runtime

        return fit_default_runtime().to_dict()
    raise ValueError(f"no packaged fit {name!r}")


# -- the packaged pair prior (data/interference/pair_prior.json) ----------------------------
PRIOR_FORMAT = "slurm-gpushare/pair-prior/3"  # 3: the prior saturates (fair shares)


def prior_path() -> Path:
    return package_path("interference", "pair_prior.json")


def fitted_prior() -> dict[str, Any]:
    """The prior fitted on every packaged data set, as stored in ``pair_prior.json``
    (regenerate with ``python -m slurm_gpushare.predict.persist``; a test checks it is current)."""
    from slurm_gpushare.predict.estimators import PairSpeedModel
    from slurm_gpushare.predict.pairs import PARAMETERS, training_sides

    model = PairSpeedModel().fit(training_sides())
    return {"format": PRIOR_FORMAT, "parameters": dict(zip(PARAMETERS, model.coef_.tolist())),
            "shrinkage": model.shrinkage_, "margin": model.margin_,
            "margin_learned": model.margin_learned_,
            "sides": model.n_train_,
            "data": sorted(set(training_sides()["group"]))}


@lru_cache(maxsize=1)
def stored_pair_prior() -> tuple[tuple[float, ...], float, float, float, int]:
    from slurm_gpushare.predict.pairs import PARAMETERS

    data = json.loads(prior_path().read_text())
    if data.get("format") != PRIOR_FORMAT:
        raise ValueError(f"not a pair prior (format {data.get('format')!r})")
    return (tuple(float(data["parameters"][p]) for p in PARAMETERS), float(data["shrinkage"]),
            float(data["margin"]), float(data["margin_learned"]), int(data["sides"]))


if __name__ == "__main__":
    prior_path().write_text(json.dumps(fitted_prior(), indent=1) + "\n")
    print(f"wrote {prior_path()}")
    for fit_name in PACKAGED_FITS:
        packaged_fit_path(fit_name).parent.mkdir(exist_ok=True)
        packaged_fit_path(fit_name).write_text(
            json.dumps(fresh_fit(fit_name), indent=1, sort_keys=True) + "\n")
        print(f"wrote {packaged_fit_path(fit_name)}")
