"""Benchmark datasets (logistic regression, paper Section 5.2) and their standard model.

The five ``.npz`` files (``sonar``, ``ionosphere``, ``australian``, ``a1a``, ``madelon``)
ship with the package, in ``numpyro_uha/data`` (their origins and licences are in
``PROVENANCE.md`` beside them). :func:`load_logistic_regression` reads them from the first
of:

1. the ``data_dir`` argument;
2. the ``NUMPYRO_UHA_DATA_DIR`` environment variable;
3. the packaged copy, found with :mod:`importlib.resources` (nothing to configure, and
   independent of the working directory).

An override must hold the requested file: a missing one is an error, not a silent fall
back to the packaged copy.
"""

from __future__ import annotations

import os
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

__all__ = ["DATASETS", "resolve_data_dir", "load_logistic_regression", "logistic_regression_model"]

#: Dataset name → latent dimension d (features + intercept).
DATASETS = {"sonar": 61, "ionosphere": 35, "australian": 15, "a1a": 120, "madelon": 501}

#: The environment variable that overrides the packaged data directory.
DATA_DIR_ENV = "NUMPYRO_UHA_DATA_DIR"


def _packaged_data() -> Traversable:
    return resources.files("numpyro_uha") / "data"


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | Traversable:
    """The directory the datasets are read from (see the module docstring).

    ``data_dir`` if given, else ``$NUMPYRO_UHA_DATA_DIR`` if set and non-empty (both as a
    :class:`~pathlib.Path`), else the package's own ``data`` folder as an
    :mod:`importlib.resources` ``Traversable`` (a :class:`~pathlib.Path` for an ordinary
    installation); ``resolve_data_dir() / "sonar.npz"`` works in every case.
    """
    if data_dir is not None:
        return Path(data_dir)
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    return _packaged_data()


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
        if data_dir is not None:
            source = "data_dir="
        elif os.environ.get(DATA_DIR_ENV):
            source = f"the {DATA_DIR_ENV} environment variable"
        else:
            raise FileNotFoundError(
                f"Dataset file {path} not found: the package's own copy of {name}.npz is "
                "missing, so this installation is incomplete; reinstall numpyro-uha."
            )
        raise FileNotFoundError(
            f"Dataset file {path} not found (the data directory was set by {source}). "
            f"Put {name}.npz there, or drop the override to use the packaged copy, "
            "which is the default."
        )
    with path.open("rb") as file, np.load(file) as data:
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
