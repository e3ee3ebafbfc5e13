"""Batched ``lax.map`` without a remainder batch, and the chunk widths programs reuse
(pure JAX)."""

from __future__ import annotations

import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np


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


#: A chunk width already run by a program is reused for fewer items, instead of
#: compiling the narrower width they would get, where it is at most this many times that
#: width: after 1000 draws (CPU chunks of 1008), 64 to 1008 draws run in the same
#: program; at most 16 times the work of the narrower width, for a compilation (seconds,
#: where running a chunk of a cheap model takes milliseconds).
REUSE_WIDTH_RATIO = 16

_USED_WIDTHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_USED_LOCK = threading.Lock()


def aval_key(leaf) -> tuple:
    """(shape, dtype, weak type) of an argument, as :func:`jax.typeof` gives them, read
    directly from arrays and NumPy scalars (``jax.typeof`` took a fifth of a step's
    dispatch on a NumPy scalar); other leaves (Python numbers) through ``jax.typeof``."""
    if isinstance(leaf, jax.Array):
        return leaf.shape, leaf.dtype, leaf.weak_type
    if isinstance(leaf, (np.ndarray, np.generic)):  # float64 is float32 without x64
        return leaf.shape, jax.dtypes.canonicalize_dtype(leaf.dtype), False
    aval = jax.typeof(leaf)
    return aval.shape, aval.dtype, aval.weak_type


def signature_of(tree) -> tuple:
    """A hashable stand-in for the argument types a ``jax.jit`` program compiles
    ``tree`` for: its structure and each leaf's :func:`aval_key`."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple(map(aval_key, leaves))


def reuse_width(program, signature, width: int, cap: int) -> int:
    """The chunk width to run ``program`` (a ``jax.jit`` function) at, for items that
    would get ``width`` (at most ``cap`` at a time): the narrowest width in
    ``[width, min(cap, REUSE_WIDTH_RATIO · width)]`` it already ran at with the same
    ``signature`` (hashable: the static arguments and argument shapes it compiles for,
    e.g. :func:`signature_of`), else ``width`` itself, which is recorded. Items that need
    the whole ``cap`` (``width >= cap``: several chunks, most of them full whatever
    their width) take the narrowest already run in ``[cap / 2, cap]``: 3000 draws after
    500 run in six chunks of 512 rather than compile 1008.

    A width is recorded only where none lay in the range, so it lies outside every
    earlier choice's range: the same count keeps its width from call to call (the same
    results, not only the same distribution), whatever is asked later. The record lives
    as long as ``program``: a rebuilt program starts empty.
    """
    low = width if width < cap else -(-cap // 2)
    with _USED_LOCK:
        used = _USED_WIDTHS.setdefault(program, {}).setdefault(signature, set())
        fits = [w for w in used if low <= w <= min(cap, REUSE_WIDTH_RATIO * width)]
        if fits:
            return min(fits)
        used.add(width)
        return width
