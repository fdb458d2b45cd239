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

The fit is ``estimators.InterferenceClasses`` (scikit-learn's conventions and K-means); what it
produces, and what the daemon loads, is ``ClassModel`` here (numpy only), saved as JSON written
atomically under a file lock (never a pickle).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from slurm_gpushare.predict.datasets import load_alnair
from slurm_gpushare.predict.persist import load_json, packaged_fit, save_json

if TYPE_CHECKING:
    from slurm_gpushare.predict.estimators import InterferenceClasses

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
    or an array-like, checked: at least one row, finite numbers."""
    if hasattr(data, "columns"):  # a DataFrame, told apart without importing pandas
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
    try:
        X = np.asarray(data, dtype=float)
    except (TypeError, ValueError):
        raise ValueError("features must be numbers") from None
    if X.ndim != 2 or X.shape[1] != len(FEATURES) or X.shape[0] == 0:
        raise ValueError(f"expected rows of {', '.join(FEATURES)}; got shape {X.shape}")
    if not np.isfinite(X).all():
        raise ValueError("features must be finite numbers")
    return X


class ClassModel:
    """Fitted interference classes as plain data, numpy only: what the daemon loads
    (``estimators.InterferenceClasses.fit`` produces it and predicts through it).

    ``centers`` are in standardised units (``(x - mean) / scale``), lightest class first;
    ``params`` are the estimator's; the rest describes the fit (``distortions`` per k, the
    knee and second-difference choices, the silhouette, the number of records).
    """

    def __init__(self, *, params: dict[str, Any], mean, scale, centers,
                 distortions: dict[int, float], k_knee: int, k_second_difference: int,
                 silhouette: float | None, n_samples: int):
        self.params = dict(params)
        self.mean = np.asarray(mean, dtype=float)
        self.scale = np.asarray(scale, dtype=float)
        self.centers = np.asarray(centers, dtype=float)
        self.distortions = dict(distortions)
        self.k_knee = int(k_knee)
        self.k_second_difference = int(k_second_difference)
        self.silhouette = silhouette
        self.n_samples = int(n_samples)

    @property
    def k(self) -> int:
        return len(self.centers)

    @property
    def centroids(self) -> np.ndarray:
        """Class centres in the features' own units."""
        return self.centers * self.scale + self.mean

    def assign(self, Z: np.ndarray) -> np.ndarray:
        """Nearest class of each standardised row."""
        dist = ((Z[:, None, :] - self.centers[None, :, :]) ** 2).sum(axis=2)
        return dist.argmin(axis=1)

    def predict(self, X) -> np.ndarray:
        return self.assign((feature_matrix(X) - self.mean) / self.scale)

    def predict_one(self, mgup: float, mgmap_pct: float, mgtsamp: float) -> int:
        """``predict`` for one job, without the input checks' cost (on every cold decision)."""
        x = np.array([mgup, mgmap_pct, mgtsamp], dtype=float)
        if not np.isfinite(x).all():
            raise ValueError("features must be finite numbers")
        return int(self.assign(((x - self.mean) / self.scale)[None, :])[0])

    def transform(self, X) -> np.ndarray:
        """Distances (standardised units) to each class centre."""
        Z = (feature_matrix(X) - self.mean) / self.scale
        return np.sqrt(((Z[:, None, :] - self.centers[None, :, :]) ** 2).sum(axis=2))

    def digest(self) -> str:
        """Short identity of the fitted classes (a knowledge base keyed by them records it)."""
        text = json.dumps(np.round(self.centroids, 4).tolist())
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # -- persistence ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": MODEL_FORMAT, "params": dict(self.params), "features": list(FEATURES),
            "k": self.k, "mean": self.mean.tolist(), "scale": self.scale.tolist(),
            "centers": self.centers.tolist(), "centroids": self.centroids.tolist(),
            "distortions": {str(k): v for k, v in self.distortions.items()},
            "k_knee": self.k_knee, "k_second_difference": self.k_second_difference,
            "silhouette": self.silhouette, "n_samples": self.n_samples,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ClassModel":
        if not isinstance(data, dict) or data.get("format") != MODEL_FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"not an interference-classes model (format {found!r})")
        model = cls(params=data["params"], mean=data["mean"], scale=data["scale"],
                    centers=data["centers"],
                    distortions={int(k): float(v) for k, v in data["distortions"].items()},
                    k_knee=data["k_knee"], k_second_difference=data["k_second_difference"],
                    silhouette=data["silhouette"], n_samples=data.get("n_samples", 0))
        if model.k != int(data["k"]) or model.centers.shape[1:] != (len(FEATURES),):
            raise ValueError("interference-classes model: centers do not match k and features")
        return model

    def save(self, path: str | os.PathLike) -> None:
        save_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ClassModel":
        return cls.from_dict(load_json(path))


def default_classes() -> ClassModel:
    """Classes fitted on the paper's 175 records: what a site starts with before its own data,
    as stored in the package (``persist.packaged_fit``); each call returns a fresh copy."""
    return ClassModel.from_dict(packaged_fit("classes"))


def fit_default_classes() -> InterferenceClasses:
    """What ``default_classes`` holds, fitted afresh (``persist`` stores it)."""
    from slurm_gpushare.predict.estimators import InterferenceClasses

    return InterferenceClasses().fit(load_alnair("records"))
