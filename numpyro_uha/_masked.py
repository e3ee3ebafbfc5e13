"""Latent entries that a model masks out and that nothing in it depends on.

NumPyro's ``obs_mask`` imputes missing observations through a latent site
``"<name>_unobserved"`` of the data's full shape, masked out
(:func:`numpyro.handlers.mask`) where the data are observed; padded (ragged) data are
often modelled the same way, with a latent and its likelihood both under a mask that is
``False`` at the padding. The log density does not depend on such entries at all, so the
posterior is flat, hence improper, along them: a guide's q widens there without end and
the ELBO and log Z grow with it (NUTS wanders there too).

Where every unconstrained coordinate of a masked-out entry is flat (the setup's probe,
:func:`numpyro_uha.guide._probe_near_q`), the guide *completes* the entry: its
unconstrained coordinates count with a standard normal density, independent of
everything else (:func:`completion_log_density`). The completed density integrates to
the model's over them, so the posterior of every other latent and the normalizing
constant, log Z, are the model's own, and the posterior is proper; a Gaussian q fits the
completed coordinates exactly, so they cost the bound nothing. (Their own distribution
given the other latents would do too, but couples them to those latents: on an
``obs_mask`` regression the imputed site's mean came out 12 % narrower.) Their draws
mean nothing to the model, which ignores them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions.distribution import (
    ExpandedDistribution,
    Independent,
    MaskedDistribution,
)


def _batch_mask(fn, xp=jnp):
    """The mask of ``fn`` over its batch shape (``True``: counted) from its
    :class:`~numpyro.distributions.MaskedDistribution` wrappers (:func:`numpyro.handlers.mask`
    and ``.mask()`` wrap a site's distribution so), through expansions and
    ``to_event`` (an event counts where any of its parts does). ``xp``: ``jax.numpy``
    (traced masks) or ``numpy`` (concrete ones, at setup: no device operations)."""
    if isinstance(fn, MaskedDistribution):
        return _batch_mask(fn.base_dist, xp) & xp.broadcast_to(
            xp.asarray(fn._mask, bool), fn.batch_shape
        )
    if isinstance(fn, ExpandedDistribution):
        return xp.broadcast_to(_batch_mask(fn.base_dist, xp), fn.batch_shape)
    if isinstance(fn, Independent):
        dims = tuple(range(-fn.reinterpreted_batch_ndims, 0))
        inner = _batch_mask(fn.base_dist, xp)
        return inner.any(axis=dims) if dims else inner
    return xp.ones(fn.batch_shape, bool)


def has_mask(fn) -> bool:
    """Whether ``fn`` holds a :class:`~numpyro.distributions.MaskedDistribution`
    (through expansions and ``to_event``)."""
    while True:
        if isinstance(fn, MaskedDistribution):
            return True
        if not isinstance(fn, (ExpandedDistribution, Independent)):
            return False
        fn = fn.base_dist


def masked_out_entries(trace) -> dict:
    """``{site: bool array over the site's batch shape}``, ``True`` where a latent
    sample site's mask (:func:`numpyro.handlers.mask`, ``obs_mask``, ``.mask()``) leaves
    the entry out; only sites with a concrete mask that leaves some entry out."""
    out = {}
    for name, site in trace.items():
        if site["type"] != "sample" or site["is_observed"]:
            continue
        value = site["value"]
        batch_shape = np.shape(value)[: np.ndim(value) - site["fn"].event_dim]
        try:  # a traced mask; a site drawn with a sample_shape (more batch dims)
            mask = np.broadcast_to(_batch_mask(site["fn"], np), batch_shape)
        except (jax.errors.TracerArrayConversionError, ValueError):
            continue
        if not mask.all():
            out[name] = ~mask
    return out


def completable(masked: dict, flat, index: dict) -> dict:
    """The entries of ``masked`` (:func:`masked_out_entries`) all of whose unconstrained
    coordinates are ``flat`` (a bool mask over the flat latent vector; ``index``: each
    site's flat positions, shaped as its unconstrained value)."""
    if flat is None:
        return {}
    out = {}
    for name, left_out in masked.items():
        if name not in index:
            continue
        positions = np.rint(np.asarray(index[name])).astype(int)
        entries = flat[positions.reshape(-1)].reshape(left_out.shape + (-1,)).all(-1)
        entries = entries & left_out
        if entries.any():
            out[name] = entries
    return out


def completed_coordinates(entries: dict, index: dict, dim: int):
    """The flat latent coordinates of the ``entries`` (:func:`completable`): a bool
    mask of length ``dim``; ``None`` where there are none."""
    if not entries:
        return None
    coords = np.zeros(dim, bool)
    for name, entry in entries.items():
        positions = np.rint(np.asarray(index[name])).astype(int)
        coords[positions.reshape(entry.shape + (-1,))[entry].reshape(-1)] = True
    return coords


def current_coordinates(entries: dict, trace, index: dict, dim: int):
    """The ``entries`` (completed at setup) that the model masks out in ``trace`` (a
    trace of this call's model, its masks possibly traced): ``(coords, entries)``, the
    flat coordinates (a bool JAX array of length ``dim``) and ``{site: bool array}``.
    Draws on other data (another ``obs_mask``) complete only what is masked out there."""
    coords = jnp.zeros(dim, bool)
    now = {}
    for name, entry in entries.items():
        site = trace[name]
        left_out = ~jnp.broadcast_to(_batch_mask(site["fn"]), entry.shape)
        now[name] = entry & left_out
        positions = np.rint(np.asarray(index[name])).astype(int)
        positions = positions.reshape(entry.shape + (-1,))
        coords = coords.at[positions.reshape(-1)].set(
            jnp.broadcast_to(now[name][..., None], positions.shape).reshape(-1)
        )
    return coords, now


def completion_log_density(z, coords):
    """Σ log N(z_i; 0, 1) over the ``coords`` (a bool mask) of the unconstrained ``z``
    (trailing axis): the density the completed entries count with."""
    terms = -0.5 * z**2 - 0.5 * np.log(2 * np.pi)
    return jnp.sum(jnp.where(coords, terms, 0.0), axis=-1)
