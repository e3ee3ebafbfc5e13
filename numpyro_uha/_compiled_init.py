"""NumPyro's initialization, compiled: what ``UHAGuide``'s ``svi.init`` waits for first.

Every AutoGuide's setup calls NumPyro's ``initialize_model``, whose
``find_valid_initial_params`` evaluates the model's potential energy and its gradient at
the initial point. For a single point (one PRNG key) NumPyro runs that evaluation op by
op, so that it need not compile it ("only helpful for single chain, where we can avoid
compiling body_fn in while_loop"); for a batch of keys it compiles it once, in a
``while_loop`` under ``lax.map``. On a 2-core CPU the op-by-op run is the slower of the
two: every primitive of the forward and backward pass is compiled on its own the first
time. ``AutoNormal``'s ``svi.init`` spent 3.5, 6.4 and 3.8 s of its 6.6, 10.5 and 6.9 s
there on a GP, an LKJ model and a hierarchical logistic regression; through the batched
path, with a batch of one key, 1.8, 1.4 and 1.3 s, with the same initial values (one
fresh process each; docs/benchmarks.md, "Start-up").

:func:`compiled_initialization` routes ``find_valid_initial_params`` through the batched
path for the duration of a ``with`` block: called with one raw key, it calls NumPyro's
own function with that key as a batch of one and returns the batch's only element, the
values' dict in the model's site order (the flat latent layout follows it). The random
numbers, and so the initial values, are those of the single-key path: NumPyro's
batched search starts from the same state, and its first iteration is the single-key
path's one attempt (the same values up to rounding: one unit in the last place where
XLA fuses the transforms differently). Where the batched path raises (e.g. a model with
Python control flow on latent values, which cannot be traced; such a model cannot be
trained under ``jit`` either), the single-key path runs instead, as without the block.
Typed keys and traced keys go to NumPyro's function unchanged. So does a search whose
program is large and made of few distinct operations (a model written as a Python loop
over many sites), which compiles more slowly than it runs op by op
(:func:`_compiling_pays`; a model of more than :data:`MAX_SITES` latent sites is not
traced to find out).

The batched search runs once, so its compile time is nearly all its cost: it is traced
to a jaxpr and compiled at XLA's lowest CPU optimization
(:func:`~numpyro_uha.core.warm_start.quick_compiler_options`), with the arrays the model
closes over (its data) passed as the program's arguments, not baked in as constants.
On seven models of the start-up benchmark (2-core CPU) that took 0.35 to 0.87 s to
compile, against 0.47 to 1.31 s for NumPyro's own path at the default level.
"""

from __future__ import annotations

import contextlib
import threading

import jax
import jax.numpy as jnp
from jax.extend.core import jaxprs_in_params
import numpyro.infer.util as _infer_util

from numpyro_uha.core.warm_start import _traced, quick_compiler_options

#: Serializes the swap of numpyro.infer.util.find_valid_initial_params.
_LOCK = threading.RLock()


def _is_raw_key(rng_key) -> bool:
    return (
        not isinstance(rng_key, jax.core.Tracer)
        and not jnp.issubdtype(jnp.result_type(rng_key), jax.dtypes.prng_key)
        and jnp.shape(rng_key) == (2,)
    )


def _batched(original):
    def find_valid_initial_params(rng_key, *args, **kwargs):
        if not _is_raw_key(rng_key) or len(kwargs.get("prototype_params") or ()) > MAX_SITES:
            return original(rng_key, *args, **kwargs)
        keys = jnp.asarray(rng_key)[None]
        try:
            # under the caller's jit (data traced) the program is traced into theirs
            found = _run_quick(lambda k: original(k, *args, **kwargs), keys)
        except Exception:  # noqa: BLE001 - not traceable: NumPyro's op-by-op path, below
            found = None
        if found is None:  # outside the handler: the model's own error is shown once
            return original(rng_key, *args, **kwargs)
        (params, potential, grad), is_valid = found
        first = lambda x: x[0]  # noqa: E731
        params, potential, grad = jax.tree.map(first, (params, potential, grad))
        # JAX returns dicts with sorted keys; the single-key path keeps the model's
        # order for the values (its gradient, from JAX too, is sorted either way), and
        # AutoContinuous's flat latent layout follows it
        params = _in_order(params, kwargs.get("prototype_params") or {})
        return (params, potential, grad), first(is_valid)

    find_valid_initial_params.uha_batched = True
    return find_valid_initial_params


class OpByOpCheaper(Exception):
    """Raised by :func:`_run_quick` where running the program op by op costs less than
    compiling it (:func:`_compiling_pays`); the caller runs it op by op."""


#: Above this many latent sites NumPyro's search runs op by op, untraced: such models are
#: mostly one site written many times (a Python loop), whose program compiles more slowly
#: than it runs op by op (:func:`_compiling_pays`), and tracing it only to find that out
#: took 3.4 s for a random walk of 60 sites (2-core CPU).
MAX_SITES = 24

#: Compiling a program at XLA's lowest CPU optimization cost about 0.3 s plus 1.0 to 1.4
#: ms per equation; op by op, each distinct operation compiles on its own the first time,
#: 30 to 50 ms (2-core CPU; NumPyro's initial-point search on 6 zoo models and on random
#: walks of 10, 30 and 60 sites written as a Python loop). In units of one operation's
#: own compile:
_FIXED_COST, _EQUATION_COST = 8.0, 0.035


def _size(jaxpr, seen: set) -> int:
    """The equations of ``jaxpr`` and of the jaxprs inside it (loop and branch bodies),
    with each distinct operation (primitive, argument and result types) added to
    ``seen``."""
    total = 0
    for eqn in jaxpr.eqns:
        total += 1
        seen.add((
            eqn.primitive.name,
            tuple(str(getattr(v, "aval", v)) for v in eqn.invars),
            tuple(str(v.aval) for v in eqn.outvars),
        ))
        for sub in jaxprs_in_params(eqn.params):
            total += _size(sub, seen)
    return total


def _compiling_pays(jaxpr) -> bool:
    """Whether compiling ``jaxpr`` at the lowest optimization costs less than running it
    op by op, from its size: a model written as a Python loop over 60 sites made a
    program of 5 540 equations of 43 distinct operations, 7.8 s to compile against 1.4 s
    op by op; a hierarchical logistic regression, 354 of 127, 0.96 s against 5.9 s."""
    seen: set = set()
    total = _size(jaxpr, seen)
    return _FIXED_COST + _EQUATION_COST * total < len(seen)


def _run_quick(fn, *operands):
    """``fn(*operands)``, compiled once at XLA's lowest CPU optimization: traced to a
    jaxpr, whose constants (the arrays ``fn`` closes over) enter the program as arguments.
    Raises :class:`OpByOpCheaper` where the program is large and made of few distinct
    operations (:func:`_compiling_pays`), with concrete inputs (traced, the program is
    part of the caller's, which compiles it anyway)."""
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(*operands)
    if not _traced((closed.consts, operands)) and not _compiling_pays(closed.jaxpr):
        raise OpByOpCheaper

    def quick_init(consts, *operands):
        return jax.core.eval_jaxpr(closed.jaxpr, consts, *operands)

    # the jaxpr takes the operands' leaves (a list of arrays is one operand of several)
    flat = jax.jit(quick_init, compiler_options=quick_compiler_options())(
        closed.consts, *jax.tree.leaves(operands)
    )
    return jax.tree.unflatten(jax.tree.structure(shape), flat)


def _in_order(tree, order):
    """A dict ``tree`` with the keys of ``order`` first, in that order."""
    if not isinstance(tree, dict):
        return tree
    return {**{k: tree[k] for k in order if k in tree}, **tree}


@contextlib.contextmanager
def compiled_initialization():
    """Within the block, NumPyro's ``initialize_model`` finds its initial point through
    its compiled (batched) path; see the module docstring."""
    with _LOCK:
        original = _infer_util.find_valid_initial_params
        if getattr(original, "uha_batched", False):  # nested: already routed
            yield
            return
        _infer_util.find_valid_initial_params = _batched(original)
        try:
            yield
        finally:
            _infer_util.find_valid_initial_params = original
