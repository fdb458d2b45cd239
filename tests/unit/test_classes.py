"""Interference classes: the elbow rule, the estimator's conventions, persistence, and the
reproduction of Ray et al.'s clustering."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from slurm_gpushare.predict.classes import kneedle, max_second_difference
from slurm_gpushare.predict.estimators import InterferenceClasses
from slurm_gpushare.predict.evaluate import reproduce_alnair


def blobs(seed=0, n=40):
    rng = np.random.default_rng(seed)
    centres = np.array([[90, 60, 55], [10, 8, 3], [55, 45, 25]])  # heavy, light, medium
    X = np.vstack([c + rng.normal(0, 3, size=(n, 3)) for c in centres])
    return pd.DataFrame(X, columns=["MGUP", "MGMAP", "MGTSAMP"])


def test_kneedle_and_second_difference_find_the_bend():
    ks = list(range(1, 9))
    curve = [100, 40, 12, 10, 8.5, 7.5, 6.8, 6.2]  # bends at k = 3
    assert kneedle(ks, curve) == 3
    assert max_second_difference(ks, curve) == 2
    assert kneedle(ks, [5.0] * 8) == 1  # flat: no structure, one class


def test_three_blobs_three_classes_lightest_first():
    model = InterferenceClasses().fit(blobs())
    assert model.k_ == 3
    centroids = model.centroids_
    assert list(np.argsort(centroids[:, 0])) == [0, 1, 2]  # numbered light -> heavy
    assert model.silhouette_ > 0.7
    assert model.predict_one(92, 58, 50) == 2 and model.predict_one(5, 5, 1) == 0
    # canonical ids: a refit on shuffled rows and another seed gives the same classes
    other = InterferenceClasses(random_state=7).fit(blobs().sample(frac=1, random_state=3))
    assert np.allclose(np.sort(other.centroids_, axis=0), np.sort(centroids, axis=0), atol=1e-6)
    assert (other.predict(blobs()) == model.predict(blobs())).all()


def test_sklearn_conventions():
    with pytest.raises(TypeError):
        InterferenceClasses(3)  # keyword-only
    model = InterferenceClasses(n_clusters=2, random_state=1)
    assert model.get_params()["n_clusters"] == 2 and not hasattr(model, "k_")
    with pytest.raises(NotFittedError):
        model.predict([[1, 2, 3]])
    fitted = model.fit(blobs())
    assert fitted.k_ == 2 and clone(fitted).get_params() == model.get_params()
    assert not hasattr(clone(fitted), "centers_")
    with pytest.raises(ValueError, match="MGTSAMP"):
        InterferenceClasses().fit(pd.DataFrame({"MGUP": [1, 2, 3], "MGMAP": [1, 2, 3]}))


def test_summary_column_names_are_accepted():
    frame = blobs().rename(columns={"MGUP": "mgup_max", "MGMAP": "mgmap_max_pct",
                                    "MGTSAMP": "mgtsamp_max"})
    assert InterferenceClasses().fit(frame).k_ == 3


def test_save_load_round_trip_is_atomic(tmp_path):
    model = InterferenceClasses().fit(blobs())
    path = tmp_path / "m" / "classes.json"
    model.save(path)
    loaded = InterferenceClasses.load(path)
    X = blobs(seed=5)
    assert (loaded.predict(X) == model.predict(X)).all()
    assert loaded.digest() == model.digest() and loaded.k_ == model.k_
    assert sorted(p.name for p in path.parent.iterdir()) == ["classes.json", "classes.json.lock"]
    assert json.loads(path.read_text())["format"].startswith("slurm-gpushare/")
    path.write_text('{"format": "something else"}')
    with pytest.raises(ValueError):
        InterferenceClasses.load(path)


def test_alnair_reproduction():
    result = reproduce_alnair()
    assert result["k"] == result["paper_k"] == 3
    assert len(result["jobs"]) == 12
    table = result["contingency"]["table"]
    assert sum(v for row in table.values() for v in row.values()) == 12
    # the classes recover most of the paper's grouping (ids differ: ours are ordered by load)
    assert result["matched_fraction"] >= 0.75 and result["adjusted_rand"] > 0.4
    assert 0 < result["silhouette"] < 1
    mgup = [c["MGUP"] for c in result["centroids"]]
    assert mgup == sorted(mgup)
