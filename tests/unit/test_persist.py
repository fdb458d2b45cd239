"""The packaged default fits: stored, current, and what a start uses instead of fitting."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import cached_json

from slurm_gpushare.predict.estimators import CrossTypeMemoryPredictor
from slurm_gpushare.predict.memory import default_predictor
from slurm_gpushare.predict.persist import PACKAGED_FITS, fresh_fit, packaged_fit

REPO = Path(__file__).resolve().parents[2]


def assert_close(stored, fresh, where="fit"):
    """Equal structure and strings; numbers equal to 1e-9 (another platform's last bits)."""
    if isinstance(fresh, dict):
        assert sorted(stored) == sorted(fresh), where
        for key in fresh:
            assert_close(stored[key], fresh[key], f"{where}.{key}")
    elif isinstance(fresh, list):
        assert len(stored) == len(fresh), where
        for i, (s, f) in enumerate(zip(stored, fresh)):
            assert_close(s, f, f"{where}[{i}]")
    elif isinstance(fresh, float):
        assert stored == pytest.approx(fresh, rel=1e-9, abs=1e-12), where
    else:
        assert stored == fresh, where


@pytest.mark.parametrize("name", PACKAGED_FITS)
def test_the_packaged_fit_is_the_fit_of_the_packaged_data(name):
    """Stale after a change to the estimator or the data: run
    ``python -m slurm_gpushare.predict.persist`` and commit the files it writes."""
    assert_close(packaged_fit(name), cached_json(f"fit-{name}", lambda: fresh_fit(name)), name)


def test_the_memory_predictor_round_trips_and_predicts_the_same():
    stored = default_predictor()
    again = CrossTypeMemoryPredictor.from_dict(json.loads(json.dumps(stored.to_dict())))
    for observed in ({"V100-16GB": 4000.0}, {"K80": 9000.0, "RTX3090": 9500.0}, {"T4": 3000.0}):
        for target in ("RTX3070", "A100-80GB", "K80"):
            assert again.predict_peak(observed, target) == stored.predict_peak(observed, target)
    with pytest.raises(ValueError, match="not a memory predictor"):
        CrossTypeMemoryPredictor.from_dict({"format": "other"})


START_PATH = """
import sys
from pathlib import Path
from slurm_gpushare.cli import main  # the `serve` command's module, as `python -m` loads it
from slurm_gpushare.core.config import parse_config
from slurm_gpushare.daemon.server import DaemonServer, open_store
from slurm_gpushare.daemon.service import Service
from slurm_gpushare.predict.classes import ClassModel
from slurm_gpushare.predict.memory import MemoryModel
from slurm_gpushare.predict.pairs import PairModel
from slurm_gpushare.predict.runtime import RuntimeModel

tmp = Path(sys.argv[1])
config = parse_config({
    "daemon": {"socket": str(tmp / "d.sock"), "secret_file": str(tmp / "secret"),
               "query_socket": str(tmp / "q.sock"), "state_dir": str(tmp / "state")},
    "policy": {"sharing_partitions": ["gpu"]},
    "gpu_types": {"v100": {"memory_gib": 16, "model": "V100-16GB"}}})
service = Service(config, store=open_store(config), reader=open_store(config))
servers = [DaemonServer(service), DaemonServer(service, public=True)]
estimator = service.estimator
assert type(estimator.predictor) is MemoryModel and type(estimator.classes) is ClassModel
assert type(estimator.runtime) is RuntimeModel and type(service.pairing.model) is PairModel
assert estimator.predictor.pairs and estimator.classes.k == (2 if len(sys.argv) > 2 else 3)
for server in servers:
    server.server_close()
print(" ".join(m for m in ("pandas", "scipy", "sklearn") if m in sys.modules))
"""


def _start_path(tmp_path, *args) -> str:
    done = subprocess.run([sys.executable, "-c", START_PATH, str(tmp_path), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_daemon_start_path_needs_no_sklearn_scipy_or_pandas(tmp_path):
    """What ``serve`` builds before it answers (service, estimator, knowledge base, pair model,
    servers) from the packaged fits: plain models, numpy only. scikit-learn, scipy and pandas
    are what fitting needs; importing them would cost the daemon seconds at every start (and
    none of them loaded also means nothing was fitted)."""
    assert _start_path(tmp_path) == ""


def test_the_site_fits_load_without_sklearn_scipy_or_pandas(tmp_path):
    """The same with the site's own fits in the state directory (``models fit``,
    ``classes fit``: JSON)."""
    from slurm_gpushare.predict.estimators import InterferenceClasses
    from slurm_gpushare.predict.persist import save_predictor

    state = tmp_path / "state"
    save_predictor(CrossTypeMemoryPredictor.from_dict(packaged_fit("memory")),
                   state / "models" / "memory.json")
    records = pd.DataFrame(np.random.default_rng(0).uniform(0, 100, (40, 3)),
                           columns=["MGUP", "MGMAP", "MGTSAMP"])
    InterferenceClasses(n_clusters=2).fit(records).save(state / "classes.json")
    assert _start_path(tmp_path, "site") == ""


# -- one prediction implementation: the estimators' fits predict what the plain models do ------
MEMORY_TARGETS = ("K80", "RTX2070S", "RTX3070", "V100-16GB", "RTX3090", "A100-80GB", "T4")
RUNTIME_TARGETS = ("K80", "P100", "V100-16GB", "A100-80GB", "T4")


def _predictions(name: str, model) -> list:
    """What ``model`` (a fitted estimator or the plain model it produces) predicts on the
    packaged data it was fitted on, as JSON-able values."""
    from slurm_gpushare.predict.datasets import load_alnair, load_gavel_isolated, load_schedtune
    from slurm_gpushare.predict.memory import observations_from_schedtune
    from slurm_gpushare.predict.pairs import data_sets

    out = []
    if name == "memory":
        wide = observations_from_schedtune(load_schedtune()).pivot_table(
            index="job", columns="gpu", values="peak_mib", aggfunc="max")
        for _, row in wide.iterrows():
            seen = {gpu: float(peak) for gpu, peak in row.items() if peak == peak}
            for observed in [{g: p} for g, p in seen.items()] + [seen]:
                for target in MEMORY_TARGETS:
                    p = model.predict_peak(observed, target)
                    out.append([p.model, p.mean_mib, p.margin, p.basis])
    elif name == "classes":
        records = load_alnair("records")
        out = [model.predict(records).tolist(), model.transform(records).tolist(),
               [model.predict_one(*r) for r in records[["MGUP", "MGMAP", "MGTSAMP"]].to_numpy()],
               model.digest()]
    elif name == "runtime":
        wide = load_gavel_isolated().pivot_table(index="job", columns="gpu", values="throughput")
        for _, row in wide.iterrows():
            for gpu, tput in row.items():
                if tput == tput:
                    out.append(model.predict_all({gpu: 3600.0 / tput}, RUNTIME_TARGETS))
    elif name == "pairs":
        for _, pairs, profiles in data_sets():
            keys = sorted(profiles)
            for learned in (False, True):
                fresh = model.fitted_copy()
                if learned:
                    fresh.learn(pairs, profiles)
                for a, b in itertools.combinations_with_replacement(keys, 2):
                    group = [profiles[a], profiles[b]]
                    out.append([fresh.predict_isd(group, [a, b]), fresh.safe_speeds(group, [a, b]),
                                fresh.recommend(group, [a, b])])
    return out


def _fitted(name: str):
    from slurm_gpushare.predict.classes import fit_default_classes
    from slurm_gpushare.predict.estimators import PairSpeedModel
    from slurm_gpushare.predict.memory import fit_default_predictor
    from slurm_gpushare.predict.pairs import training_sides
    from slurm_gpushare.predict.runtime import fit_default_runtime

    return {"memory": fit_default_predictor, "classes": fit_default_classes,
            "runtime": fit_default_runtime,
            "pairs": lambda: PairSpeedModel().fit(training_sides())}[name]()


def _plain(name: str):
    from slurm_gpushare.predict.classes import default_classes
    from slurm_gpushare.predict.memory import default_predictor
    from slurm_gpushare.predict.pairs import default_model
    from slurm_gpushare.predict.runtime import default_runtime

    return {"memory": default_predictor, "classes": default_classes, "runtime": default_runtime,
            "pairs": default_model}[name]()


@pytest.mark.parametrize("name", ["memory", "classes", "runtime", "pairs"])
def test_the_fitted_estimator_predicts_exactly_what_the_packaged_plain_model_does(name):
    """A fresh scikit-learn fit on the packaged data and the plain model the daemon reads from
    the packaged JSON give identical predictions (exact floats) on that data. The fit's
    predictions are cached by code and data (``cached_json``): a change to either refits."""
    fitted = cached_json(f"predictions-{name}", lambda: _predictions(name, _fitted(name)))
    plain = json.loads(json.dumps(_predictions(name, _plain(name))))
    assert len(plain) > 20 or name == "classes"
    assert plain == fitted
