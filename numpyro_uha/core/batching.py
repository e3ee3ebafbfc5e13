"""Batched ``lax.map`` without a remainder batch (pure JAX)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def batched_map(f, xs, batch_size: int):
    """``jax.lax.map(f, xs, batch_size=...)`` in equal batches, one after another.

    ``lax.map`` with a ``batch_size`` that does not divide the leading length computes
    the remainder with a second ``vmap`` outside its ``scan``. XLA:CPU runs the two
    concurrently, and with jaxlib 0.10's batched LAPACK kernels (Cholesky, ...) each
    fans its batch out over the intra-op thread pool and then waits for it: with both
    waiting on pool threads, nothing is left to do the work, and the program hangs
    forever at 0 % CPU (e.g. 2000 draws = 1024 + 976 of a GP model on 2 cores).

    Here the ``n`` items are split into ``ceil(n / batch_size)`` batches of equal width
    ``ceil(n / num_batches)`` (at most ``batch_size``); the few missing items of the
    last batch are copies of the first ones, computed and dropped. So one ``scan``
    runs the batches in sequence and no batch runs beside another. Where
    ``batch_size`` divides ``n`` or ``n <= batch_size`` the computation is exactly
    ``lax.map``'s (its steps, written out here). ``f`` must be pure (the copies are
    computed).
    """
    n = jax.tree.leaves(xs)[0].shape[0]
    if n == 0:  # no batches: lax.map's empty outputs
        return jax.lax.map(f, xs)
    batch_size = max(1, min(int(batch_size), n))
    num_batches = -(-n // batch_size)
    width = -(-n // num_batches)
    pad = num_batches * width - n  # < num_batches <= n
    if pad:
        xs = jax.tree.map(lambda x: jnp.concatenate([x, x[:pad]]), xs)
    # lax.map(f, xs, batch_size=width)'s own steps, with the shapes spelled out: its
    # reshape of the outputs infers a dimension (-1), which fails for an output of size
    # 0 (a zero-size latent site: "integer modulo by zero")
    batches = jax.tree.map(lambda x: jnp.reshape(x, (num_batches, width) + x.shape[1:]), xs)
    ys = jax.lax.map(jax.vmap(f), batches)
    ys = jax.tree.map(lambda y: jnp.reshape(y, (num_batches * width,) + y.shape[2:]), ys)
    if pad:
        ys = jax.tree.map(lambda y: y[:n], ys)
    return ys
