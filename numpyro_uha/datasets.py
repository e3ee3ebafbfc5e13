"""Benchmark datasets (logistic regression, paper Section 5.2) and their standard model.

The ``.npz`` files (``sonar``, ``ionosphere``, ``australian``, ``a1a``, ``madelon``) are
not shipped with the package: they are read from a data directory, in this order:

1. the ``data_dir`` argument;
2. the ``NUMPYRO_UHA_DATA_DIR`` environment variable;
3. ``../shared/data`` relative to the current directory or any directory above it, then
   to the installed package's parent.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

__all__ = ["DATASETS", "resolve_data_dir", "load_logistic_regression", "logistic_regression_model"]

#: Dataset name → latent dimension d (features + intercept).
DATASETS = {"sonar": 61, "ionosphere": 35, "australian": 15, "a1a": 120, "madelon": 501}


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The directory the datasets are read from (see the module docstring)."""
    if data_dir is not None:
        return Path(data_dir)
    if os.environ.get("NUMPYRO_UHA_DATA_DIR"):
        return Path(os.environ["NUMPYRO_UHA_DATA_DIR"])
    cwd = Path.cwd().resolve()
    for base in (cwd, *cwd.parents, Path(__file__).resolve().parents[1]):
        candidate = base.parent / "shared" / "data"
        if candidate.is_dir():
            return candidate
    return Path.cwd().parent / "shared" / "data"


def load_logistic_regression(name: str, data_dir: str | os.PathLike | None = None):
    """``(X, y)`` for the standard Bayesian logistic regression on dataset ``name``.

    Every column of X is standardized (a zero-variance column is left unscaled) and a
    column of ones is prepended, so ``X`` has ``DATASETS[name]`` columns; labels in
    {-1, +1} become ``y`` in {0, 1}. Both are float32 JAX arrays.
    """
    if name not in DATASETS:
        raise ValueError(f"Unknown dataset {name!r}; expected one of {sorted(DATASETS)}.")
    path = resolve_data_dir(data_dir) / f"{name}.npz"
    if not path.is_file():
        raise FileNotFoundError(
            f"Dataset file {path} not found. Put {name}.npz there or point "
            "NUMPYRO_UHA_DATA_DIR (or data_dir=) at the directory holding it."
        )
    with np.load(path) as data:
        X = np.asarray(data["X"], np.float64)
        labels = np.asarray(data["Y"], np.float64).ravel()
    std = X.std(axis=0)
    X = (X - X.mean(axis=0)) / np.where(std > 0, std, 1.0)
    X = np.concatenate([np.ones((X.shape[0], 1)), X], axis=1)
    return jnp.asarray(X, jnp.float32), jnp.asarray((labels + 1) / 2, jnp.float32)


def logistic_regression_model(X, y=None):
    """w ~ N(0, I_d); y_n ~ Bernoulli(logits = X_n · w). Latent site ``"w"``."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)
