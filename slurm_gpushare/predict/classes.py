"""Interference classes: K-means over standardised (MGUP, MGMAP, MGTSAMP), as in Ray et al.

A job's class summarises how hard it presses on a GPU from telemetry alone: max GPU
utilisation % (MGUP), max GPU memory allocated % (MGMAP) and max % of time spent accessing
memory (MGTSAMP). The features are standardised (zero mean, unit variance) so that no unit
dominates the distances.

Choosing k (the elbow): the distortion (K-means inertia: sum of squared distances to the
nearest centroid) is computed for k = 1..k_max. The *kneedle* rule (Satopaa et al. 2011) scales
k and distortion to [0, 1] and picks the k where the curve lies farthest below the straight line
joining its first and last points -- the point of maximum curvature of a decreasing convex
curve. The max-second-difference rule (largest drop in the drop) is reported beside it, and the
silhouette score of the chosen k (in standardised space) is reported as a separate check.

Class ids are canonical: clusters are numbered by ascending centroid intensity (the sum of the
standardised centroid coordinates), so class 0 is the lightest whatever K-means' own labels
were, and refitting on the same data gives the same ids.

The estimator follows scikit-learn's conventions (keyword-only ``__init__`` that only stores,
fitted attributes ending in ``_``, ``check_is_fitted``) and is saved as JSON, written
atomically under a file lock (never a pickle).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClusterMixin
from sklearn.cluster import KMeans
from sklearn.metrics import silhouette_score
from sklearn.utils.validation import check_array, check_is_fitted
from threadpoolctl import threadpool_limits

from slurm_gpushare.predict.datasets import load_alnair
from slurm_gpushare.predict.persist import load_json, packaged_fit, save_json

FEATURES = ("MGUP", "MGMAP", "MGTSAMP")
MODEL_FORMAT = "slurm-gpushare/interference-classes/1"


# -- the elbow -----------------------------------------------------------------------------
def kneedle(ks, distortions) -> int:
    """k at the knee of a decreasing convex curve (kneedle); the first k if the curve is flat."""
    ks = np.asarray(ks, dtype=float)
    d = np.asarray(distortions, dtype=float)
    if len(ks) < 3 or d[0] == d[-1]:
        return int(ks[0])
    x = (ks - ks[0]) / (ks[-1] - ks[0])
    y = (d - d.min()) / (d.max() - d.min())
    gap = (1.0 - y) - x  # how far the flipped curve lies above the diagonal
    return int(ks[int(np.argmax(gap))])


def max_second_difference(ks, distortions) -> int:
    """k where the decrease of distortion slows down the most."""
    d = np.asarray(distortions, dtype=float)
    if len(d) < 3:
        return int(ks[0])
    second = d[:-2] - 2 * d[1:-1] + d[2:]
    return int(ks[1 + int(np.argmax(second))])


def feature_matrix(data) -> np.ndarray:
    """(n, 3) array of MGUP, MGMAP, MGTSAMP from a DataFrame (paper or summary column names)
    or an array-like."""
    if isinstance(data, pd.DataFrame):
        lower = {c.lower(): c for c in data.columns}
        aliases = {"MGUP": ("mgup", "mgup_max"), "MGMAP": ("mgmap", "mgmap_max_pct"),
                   "MGTSAMP": ("mgtsamp", "magtsamp", "mgtsamp_max")}
        columns = []
        for feature in FEATURES:
            found = next((lower[a] for a in aliases[feature] if a in lower), None)
            if found is None:
                raise ValueError(f"missing column {feature} (or {', '.join(aliases[feature])})")
            columns.append(found)
        data = data[columns].to_numpy(dtype=float)
    return check_array(data, dtype=float, ensure_min_features=3)


class InterferenceClasses(ClusterMixin, BaseEstimator):
    """K-means interference classes with k chosen by the elbow (kneedle).

    Parameters: ``n_clusters`` (None: choose by the elbow), ``k_max`` (largest k tried),
    ``n_init``, ``random_state``. Fitted: ``k_``, ``centers_`` (standardised),
    ``centroids_`` (original units), ``mean_``, ``scale_``, ``distortions_``, ``silhouette_``,
    ``k_second_difference_``, ``labels_`` (not kept by ``save``), ``n_samples_``,
    ``n_features_in_``.
    """

    def __init__(self, *, n_clusters: int | None = None, k_max: int = 10, n_init: int = 10,
                 random_state: int | None = 0):
        self.n_clusters = n_clusters
        self.k_max = k_max
        self.n_init = n_init
        self.random_state = random_state

    def fit(self, X, y=None) -> "InterferenceClasses":
        X = feature_matrix(X)
        if len(X) < 3:
            raise ValueError("need at least 3 jobs to find classes")
        self.mean_ = X.mean(axis=0)
        scale = X.std(axis=0)
        self.scale_ = np.where(scale > 0, scale, 1.0)
        Z = (X - self.mean_) / self.scale_
        k_max = max(1, min(self.k_max, len(np.unique(Z, axis=0))))
        ks = list(range(1, k_max + 1))
        # One thread: on a few hundred rows OpenMP start-up costs more than the work.
        with threadpool_limits(1, user_api="openmp"):
            fits = {k: KMeans(n_clusters=k, n_init=self.n_init,
                              random_state=self.random_state).fit(Z) for k in ks}
        self.distortions_ = {k: float(fits[k].inertia_) for k in ks}
        self.k_knee_ = kneedle(ks, [self.distortions_[k] for k in ks])
        self.k_second_difference_ = max_second_difference(ks, [self.distortions_[k] for k in ks])
        k = self.n_clusters or self.k_knee_
        if k not in fits:
            with threadpool_limits(1, user_api="openmp"):
                fits[k] = KMeans(n_clusters=k, n_init=self.n_init,
                                 random_state=self.random_state).fit(Z)
        centers = fits[k].cluster_centers_
        order = np.lexsort((centers[:, 0], centers.sum(axis=1)))  # lightest first
        self.centers_ = centers[order]
        self.k_ = int(k)
        self.n_features_in_ = X.shape[1]
        self.labels_ = self._assign(Z)
        self.n_samples_ = int(len(Z))
        self.silhouette_ = (float(silhouette_score(Z, self.labels_))
                            if 1 < k < len(Z) and len(set(self.labels_)) > 1 else None)
        return self

    @property
    def centroids_(self) -> np.ndarray:
        check_is_fitted(self, "centers_")
        return self.centers_ * self.scale_ + self.mean_

    def _assign(self, Z: np.ndarray) -> np.ndarray:
        dist = ((Z[:, None, :] - self.centers_[None, :, :]) ** 2).sum(axis=2)
        return dist.argmin(axis=1)

    def predict(self, X) -> np.ndarray:
        check_is_fitted(self, "centers_")
        X = feature_matrix(X)
        return self._assign((X - self.mean_) / self.scale_)

    def predict_one(self, mgup: float, mgmap_pct: float, mgtsamp: float) -> int:
        """``predict`` for one job, without the input checks' cost (on every cold decision)."""
        check_is_fitted(self, "centers_")
        x = np.array([mgup, mgmap_pct, mgtsamp], dtype=float)
        if not np.isfinite(x).all():
            raise ValueError("features must be finite numbers")
        return int(self._assign(((x - self.mean_) / self.scale_)[None, :])[0])

    def transform(self, X) -> np.ndarray:
        """Distances (standardised units) to each class centre."""
        check_is_fitted(self, "centers_")
        Z = (feature_matrix(X) - self.mean_) / self.scale_
        return np.sqrt(((Z[:, None, :] - self.centers_[None, :, :]) ** 2).sum(axis=2))

    def digest(self) -> str:
        """Short identity of the fitted classes (a knowledge base keyed by them records it)."""
        import hashlib

        check_is_fitted(self, "centers_")
        text = json.dumps(np.round(self.centroids_, 4).tolist())
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # -- persistence ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        check_is_fitted(self, "centers_")
        return {
            "format": MODEL_FORMAT, "params": self.get_params(), "features": list(FEATURES),
            "k": self.k_, "mean": self.mean_.tolist(), "scale": self.scale_.tolist(),
            "centers": self.centers_.tolist(), "centroids": self.centroids_.tolist(),
            "distortions": {str(k): v for k, v in self.distortions_.items()},
            "k_knee": self.k_knee_, "k_second_difference": self.k_second_difference_,
            "silhouette": self.silhouette_, "n_samples": self.n_samples_,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "InterferenceClasses":
        if data.get("format") != MODEL_FORMAT:
            raise ValueError(f"not an interference-classes model (format {data.get('format')!r})")
        model = cls(**data["params"])
        model.k_ = int(data["k"])
        model.mean_ = np.asarray(data["mean"], dtype=float)
        model.scale_ = np.asarray(data["scale"], dtype=float)
        model.centers_ = np.asarray(data["centers"], dtype=float)
        model.distortions_ = {int(k): float(v) for k, v in data["distortions"].items()}
        model.k_knee_ = int(data["k_knee"])
        model.k_second_difference_ = int(data["k_second_difference"])
        model.silhouette_ = data["silhouette"]
        model.n_features_in_ = len(FEATURES)
        model.n_samples_ = int(data.get("n_samples", 0))
        return model

    def save(self, path: str | os.PathLike) -> None:
        save_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "InterferenceClasses":
        return cls.from_dict(load_json(path))




def default_classes() -> InterferenceClasses:
    """Classes fitted on the paper's 175 records: what a site starts with before its own data,
    as stored in the package (``persist.packaged_fit``); each call returns a fresh copy."""
    return InterferenceClasses.from_dict(packaged_fit("classes"))


def fit_default_classes() -> InterferenceClasses:
    """What ``default_classes`` holds, fitted afresh (``persist`` stores it)."""
    return InterferenceClasses().fit(load_alnair("records"))


