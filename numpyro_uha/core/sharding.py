"""Sharding UHA's independent chains over devices with JAX's own tools.

UHA's work is embarrassingly parallel over chains: the particles of a training step and
the draws of a sampler or estimator are independent given the parameters. So the one
thing to shard is their leading axis, over a :class:`jax.sharding.Mesh`, with the
parameters and data replicated; XLA's SPMD partitioner does the rest inside ``jit``
(the mean of a loss over particles becomes an all-reduce).

- :func:`shard_particles` is a ``vectorize_particles`` callable for NumPyro's ELBOs:
  ``Trace_ELBO(num_particles=64, vectorize_particles=shard_particles(mesh))``.
- :class:`~numpyro_uha.UHAGuide` takes ``sharding=`` (a mesh, or a ``NamedSharding`` of
  the leading axis) for its draws and for every estimator of the evaluation layer.

Keys are split **before** sharding, on the host, so draw ``i`` uses the same key on one
device or eight and the results do not depend on the device count. Across processes
(``jax.distributed.initialize``) every process passes the same key and parameters; the
arrays are assembled with :func:`jax.make_array_from_callback` and the draws are
gathered back to every process.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = ["leading_axis_sharding", "shard_particles", "shard_leading", "gather"]


def leading_axis_sharding(mesh_or_sharding) -> NamedSharding | None:
    """A :class:`~jax.sharding.NamedSharding` that splits an array's leading axis.

    A :class:`~jax.sharding.Mesh` splits it over all of the mesh's axes (in order); a
    ``NamedSharding`` is returned as it is, and must split the leading axis only.
    ``None`` gives ``None`` (no sharding).
    """
    if mesh_or_sharding is None:
        return None
    if isinstance(mesh_or_sharding, Mesh):
        names = tuple(mesh_or_sharding.axis_names)
        return NamedSharding(
            _auto(mesh_or_sharding), PartitionSpec(names if len(names) > 1 else names[0])
        )
    if isinstance(mesh_or_sharding, NamedSharding):
        spec = tuple(mesh_or_sharding.spec)
        if len(spec) > 1 and any(s is not None for s in spec[1:]):
            raise ValueError(
                "sharding must split the leading (draw/particle) axis only, e.g. "
                f"NamedSharding(mesh, PartitionSpec('draws')); got spec {mesh_or_sharding.spec}."
            )
        return NamedSharding(_auto(mesh_or_sharding.mesh), mesh_or_sharding.spec)
    raise TypeError(
        "sharding must be a jax.sharding.Mesh or a jax.sharding.NamedSharding of the "
        f"leading axis, got {type(mesh_or_sharding).__name__}."
    )


def _auto(mesh: Mesh) -> Mesh:
    """``mesh`` with every axis of type ``Auto``: the chains' computation is partitioned
    by XLA from the placement of their keys (``jax.make_mesh`` gives ``Explicit`` axes
    by default, whose shardings would have to be carried through every operation)."""
    auto = getattr(jax.sharding, "AxisType", None)
    if auto is None:
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(auto.Auto,) * len(mesh.axis_names))


def num_shards(sharding: NamedSharding | None) -> int:
    """How many pieces ``sharding`` cuts the leading axis into (1 for ``None``)."""
    if sharding is None:
        return 1
    spec = tuple(sharding.spec)
    if not spec or spec[0] is None:
        return 1
    names = spec[0] if isinstance(spec[0], tuple) else (spec[0],)
    return int(np.prod([sharding.mesh.shape[n] for n in names]))


def replicated(sharding: NamedSharding) -> NamedSharding:
    """The fully replicated sharding on ``sharding``'s mesh (parameters, data)."""
    return NamedSharding(sharding.mesh, PartitionSpec())


def _check_divides(n: int, sharding: NamedSharding, what: str) -> None:
    shards = num_shards(sharding)
    if n % shards:
        raise ValueError(
            f"{what} ({n}) must be a multiple of the number of devices the leading axis is "
            f"sharded over ({shards})."
        )


def shard_leading(x, sharding: NamedSharding | None):
    """Constrain (under ``jit``) the leading axis of every leaf of ``x`` to ``sharding``."""
    if sharding is None:
        return x
    return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, sharding), x)


def shard_particles(mesh_or_sharding) -> Callable:
    """A ``vectorize_particles`` callable for NumPyro's ELBOs that shards the particles.

    ``Trace_ELBO(num_particles=P, vectorize_particles=shard_particles(mesh))`` computes
    exactly what ``vectorize_particles=True`` computes (the same ``P`` keys, split from
    the step's key before sharding, the same per-particle ELBOs), with the particle axis
    split over the mesh's devices: each device runs ``P / n`` particles and the loss's
    mean over particles is an all-reduce. ``P`` must be a multiple of ``n``.
    """
    sharding = leading_axis_sharding(mesh_or_sharding)

    def vectorize(fn, keys):
        _check_divides(keys.shape[0], sharding, "num_particles")
        keys = shard_leading(keys, sharding)
        return shard_leading(jax.vmap(fn)(keys), sharding)

    return vectorize


def put_global(x, sharding: NamedSharding):
    """``x`` (a host array, the same on every process) as a global array with
    ``sharding``: works within one process and across processes."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def gather(x) -> np.ndarray:
    """A host copy of the global array ``x`` on every process (``np.asarray`` where this
    process holds all of it)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
