"""The packaged default fits: stored, current, and what a start uses instead of fitting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cached_json

from slurm_gpushare.predict.memory import CrossTypeMemoryPredictor, default_predictor
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
from slurm_gpushare.core.config import parse_config
from slurm_gpushare.daemon.server import open_store
from slurm_gpushare.daemon.service import Service
from slurm_gpushare.predict.classes import InterferenceClasses
from slurm_gpushare.predict.memory import CrossTypeMemoryPredictor

def refuse(*args, **kwargs):
    raise AssertionError("the start path fitted a model")

CrossTypeMemoryPredictor.fit = InterferenceClasses.fit = refuse
tmp = Path(sys.argv[1])
config = parse_config({
    "daemon": {"socket": str(tmp / "d.sock"), "secret_file": str(tmp / "secret"),
               "query_socket": str(tmp / "q.sock"), "state_dir": str(tmp / "state")},
    "policy": {"sharing_partitions": ["gpu"]},
    "gpu_types": {"v100": {"memory_gib": 16, "model": "V100-16GB"}}})
service = Service(config, store=open_store(config), reader=open_store(config))
assert service.estimator.predictor.pairs_ and service.estimator.classes.k_ == 3
print(" ".join(m for m in ("pandas", "scipy", "sklearn") if m in sys.modules))
"""


def test_the_daemon_start_path_fits_no_default_model(tmp_path):
    """Service + estimator construction (what ``serve`` does before it answers) reads the
    packaged fits: a fit there would cost seconds at every start."""
    done = subprocess.run([sys.executable, "-c", START_PATH, str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
