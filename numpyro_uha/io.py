"""Save a fitted guide, its parameters and the SVI state to disk, and read them back.

A fit is written as one pickle (with ``cloudpickle``, so models defined in a script or a
notebook travel by value) holding the guide, its ``params`` and optionally the SVI state,
with every array moved to the host as NumPy. Read back in a new process it gives the
same draws for the same key, and training continues exactly where it stopped::

    save_fit("fit.pkl", guide, result.params, result.state)
    ...
    guide, params, state = load_fit("fit.pkl")
    draws = guide.sample_posterior(key, params, *args, sample_shape=(1000,))
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    svi.init(key, *args)  # sets up SVI's parameter transforms; the guide is not refitted
    result = svi.run(key, num_steps, *args, init_state=state)

The optimizer and loss are not saved: build the same ones again. Pickling the guide
alone (``pickle.dumps(guide)``) also works at any point; it holds the initial values
and set-up, not the trained ``params``.
"""

from __future__ import annotations

import os
import pickle

import jax
import numpy as np

__all__ = ["save_fit", "load_fit"]

_FORMAT = "numpyro-uha-fit/1"


class _KeyData:
    """A typed PRNG key array, stored as its raw data and implementation name."""

    def __init__(self, key):
        self.data = np.asarray(jax.random.key_data(key))
        self.impl = str(jax.random.key_impl(key))

    def restore(self):
        return jax.random.wrap_key_data(self.data, impl=self.impl)


class _WeakScalar:
    """A weakly typed scalar (e.g. NumPyro's optimizer step counter): stored as a Python
    number so that it comes back weakly typed, and the resumed update compiles to the
    same program as the uninterrupted one. It comes back in the loading process's
    precision (``jax_enable_x64`` on: 64 bits; off: 32), as that process's own run would
    hold it, whichever precision saved it."""

    def __init__(self, x):
        self.value = np.asarray(jax.device_get(x)).item()
        self.dtype = np.dtype(x.dtype)  # the saving process's, for the record

    def restore(self):
        import jax.numpy as jnp

        return jnp.asarray(self.value)


def _to_host(tree):
    def leaf(x):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return _KeyData(x)
        if isinstance(x, jax.Array) and x.weak_type and x.ndim == 0:
            return _WeakScalar(x)
        if isinstance(x, (jax.Array, np.ndarray, np.generic)):
            return np.asarray(jax.device_get(x))
        return x

    return jax.tree.map(leaf, tree)


def _from_host(tree):
    special = (_KeyData, _WeakScalar)
    return jax.tree.map(
        lambda x: x.restore() if isinstance(x, special) else x,
        tree,
        is_leaf=lambda x: isinstance(x, special),
    )


def _pickler():
    try:
        import cloudpickle
    except ImportError:  # pragma: no cover - cloudpickle is a dependency
        return pickle
    return cloudpickle


def save_fit(path: str | os.PathLike, guide, params=None, svi_state=None, **extra) -> None:
    """Write ``guide``, ``params`` and ``svi_state`` (any may be omitted) to ``path``.

    ``extra`` keyword values (e.g. the losses, or the model arguments) are stored too and
    come back in :func:`load_fit`'s ``extra`` mapping when asked for.
    """
    if params is not None and not isinstance(params, dict):
        raise TypeError(f"params must be the dict from svi.get_params/svi.run, got {type(params).__name__}.")
    payload = {
        "format": _FORMAT,
        "guide": guide,
        "params": _to_host(params),
        "svi_state": _to_host(svi_state),
        "extra": _to_host(extra),
    }
    data = _pickler().dumps(payload)
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def load_fit(path: str | os.PathLike, *, with_extra: bool = False):
    """Read a fit written by :func:`save_fit`: ``(guide, params, svi_state)``.

    With ``with_extra=True`` a fourth element holds the ``extra`` values. Loading a
    pickle runs code from it: load only files you trust.
    """
    with open(path, "rb") as f:
        payload = pickle.load(f)
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
        raise ValueError(f"{os.fspath(path)!r} is not a fit written by numpyro_uha.save_fit.")
    out = (payload["guide"], _from_host(payload["params"]), _from_host(payload["svi_state"]))
    return out + (_from_host(payload["extra"]),) if with_extra else out
