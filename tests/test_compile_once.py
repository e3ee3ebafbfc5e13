"""The guide-level estimators compile once per guide and argument shapes (issue 16, item 2).

``hais``, ``sandwich`` and ``log_z_bracket`` used to jit a closure over a fresh log density
on every call, so every call recompiled the chains (1.3 s on the GP zoo model, ~4 s on the
LKJ one, each time). Now their programs are kept per guide and built inside the jit from
the model's arguments: a second call with the same shapes compiles nothing, another
number of draws at an already used chunk width compiles no chain program, and the
estimates are, key by key, those of the functional (per-call compiling) layer.

Compilations are counted with JAX's ``/jax/core/compile/backend_compile_duration``
monitoring event (every XLA compilation, however small).
"""

import gc
import pickle
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import monitoring
from numpyro.infer import SVI, Trace_ELBO

from conjugate_model import Y, exact_draws, fit_guide, model
from numpyro_uha import UHAGuide
from numpyro_uha.guide import _chunk_bucket
from numpyro_uha.evaluation import (
    annealed_hais,
    annealed_sandwich,
    hais,
    log_z_bracket,
    log_z_bracket_from_draws,
    sandwich,
)
from numpyro_uha.evaluation import estimators

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CountCompiles:
    """Context manager: ``.count`` XLA compilations inside the block."""

    def __enter__(self):
        self.count = 0
        self._active = True

        def listener(event, duration, **kwargs):
            if self._active and event == COMPILE_EVENT:
                self.count += 1

        self._listener = listener
        monitoring.register_event_duration_secs_listener(listener)
        return self

    def __exit__(self, *exc):
        self._active = False  # inert even where it cannot be unregistered
        unregister = getattr(monitoring, "unregister_event_duration_listener", None) or getattr(
            monitoring, "_unregister_event_duration_listener_by_callback", None
        )
        if unregister is not None:
            unregister(self._listener)
        return False


def _chain_cache_sizes(guide):
    """Compiled variants of every chain program the guide-level estimators keep for
    ``guide``: the guide's own draws (forward chains), and the per-guide programs for
    the reverse chains and the bracket's log ratio (not the small conversion of
    posterior samples to latents, compiled per number of posterior draws)."""
    programs = list(guide._jitted_draws.values())
    programs += [
        program for (kind, *_), program in estimators._GUIDE_PROGRAMS.get(guide, {}).items()
        if kind != "latent"
    ]
    return sum(program._cache_size() for program in programs)


@pytest.fixture(scope="module")
def fitted():
    guide, params = fit_guide()
    draws = exact_draws(400, seed=3)
    samples = {name: np.asarray(value, np.float32) for name, value in draws.items()}
    return guide, params, samples


KEY = jax.random.PRNGKey(7)


def _twice(call):
    """(first result, second result, compilations in the second call)."""
    first = call()
    with CountCompiles() as counter:
        second = call()
    return first, second, counter.count


def test_hais_compiles_once(fitted):
    guide, params, _ = fitted
    first, second, compiled = _twice(lambda: hais(guide, KEY, params, Y, num_draws=300))
    assert compiled == 0
    np.testing.assert_array_equal(second.log_weights, first.log_weights)
    np.testing.assert_array_equal(second.acceptance_rate, first.acceptance_rate)
    assert second.log_z == first.log_z

    # Another num_draws at the same chunk width (384): no chain program, the same chains.
    assert _chunk_bucket(270) == _chunk_bucket(300)
    size = _chain_cache_sizes(guide)
    other = hais(guide, KEY, params, Y, num_draws=270)
    assert _chain_cache_sizes(guide) == size
    np.testing.assert_array_equal(other.log_weights, first.log_weights[:270])

    # Key by key the chains of the functional layer on the guide's log density.
    core = annealed_hais(
        KEY, guide.get_logdensity_fn(params, Y), guide.get_annealing_params(params), 300,
        num_leapfrog_steps=guide.num_leapfrog_steps, integrator=guide.integrator,
    )
    np.testing.assert_allclose(first.log_weights, core.log_weights, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(first.acceptance_rate, core.acceptance_rate, atol=1.01 / 300)


@pytest.mark.parametrize("corrected", [False, True], ids=["uha", "hais"])
def test_sandwich_compiles_once(fitted, corrected):
    guide, params, samples = fitted
    first, second, compiled = _twice(
        lambda: sandwich(guide, KEY, params, samples, Y, num_draws=300, corrected=corrected)
    )
    assert compiled == 0
    assert second == first

    # Other numbers of forward (384 wide) and reverse (512 wide) chains at the same
    # widths: no chain program (only the small conversion of the new number of posterior
    # draws to latents).
    assert _chunk_bucket(280) == _chunk_bucket(300) and _chunk_bucket(390) == _chunk_bucket(400)
    size = _chain_cache_sizes(guide)
    fewer = {name: value[:390] for name, value in samples.items()}
    other = sandwich(guide, KEY, params, fewer, Y, num_draws=280, corrected=corrected)
    assert _chain_cache_sizes(guide) == size
    assert other.num_reverse == 390

    if not corrected:
        positions = guide.latent_from_samples(samples, Y, params=params)
        core = annealed_sandwich(
            KEY, guide.get_logdensity_fn(params, Y), guide.get_annealing_params(params),
            positions, num_draws=300, num_leapfrog_steps=guide.num_leapfrog_steps,
            integrator=guide.integrator, batch_size=guide.sample_batch_size,
        )
        for ours, theirs in [(first.lower.elbo, core.lower.elbo), (first.lower.iw, core.lower.iw),
                             (first.upper, core.upper), (first.upper_iw, core.upper_iw)]:
            np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_log_z_bracket_compiles_once(fitted):
    guide, params, samples = fitted
    first, second, compiled = _twice(
        lambda: log_z_bracket(guide, KEY, params, samples, Y, num_q_draws=3000, batch_size=1024)
    )
    assert compiled == 0
    assert second == first

    # Another number of draws from q̂ at the same width (1024): nothing new to compile.
    assert _chunk_bucket(2500) >= 1024
    with CountCompiles() as counter:
        log_z_bracket(guide, KEY, params, samples, Y, num_q_draws=2500, batch_size=1024)
    assert counter.count == 0

    positions = guide.latent_from_samples(samples, Y, params=params)
    core = log_z_bracket_from_draws(
        KEY, guide.get_logdensity_fn(params, Y), positions, num_q_draws=3000, batch_size=1024,
    )
    for field in ("lower", "upper", "q_elbo", "lower_se", "upper_se"):
        np.testing.assert_allclose(getattr(first, field), getattr(core, field), rtol=1e-5)


def test_programs_do_not_keep_the_guide_alive():
    """The per-guide programs hold the guide weakly: a guide goes with its programs, and
    pickles as before."""
    guide = UHAGuide(model, K=2, warm_start_steps=0)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), Y))
    samples = {name: jnp.asarray(value, jnp.float32) for name, value in exact_draws(40, 1).items()}
    log_z_bracket(guide, KEY, params, samples, Y, num_q_draws=64)
    assert guide in estimators._GUIDE_PROGRAMS
    restored = pickle.loads(pickle.dumps(guide))
    assert restored not in estimators._GUIDE_PROGRAMS
    ref = weakref.ref(guide)
    del guide, svi, restored
    gc.collect()
    assert ref() is None


def test_the_full_rank_scale_transform_runs_eagerly_as_one_program():
    """``svi.get_params`` (at the end of every ``svi.run``) applies each param's
    constraint transform eagerly: the full-rank q's scale transform (NumPyro's
    ``CorrCholeskyTransform`` inside) compiled each of its ~50 operations on its own
    (2 s on two CPU cores, the first time in a process); now one program, with the
    values of the same transform traced (inlined) under a caller's jit."""
    from numpyro_uha._precondition import _ScaleCorrCholeskyTransform

    d = 13  # a size no other test uses: nothing of it compiled before in this process
    # the warm start's Cholesky factor the transform whitens by (_precondition.py)
    a = jax.random.normal(jax.random.PRNGKey(1), (d, d))
    factor = jnp.linalg.cholesky(a @ a.T / d + jnp.diag(jnp.linspace(0.5, 2.0, d)))
    transform = _ScaleCorrCholeskyTransform(factor)
    x = 0.3 * jax.random.normal(jax.random.PRNGKey(0), (d * (d + 1) // 2,))
    with CountCompiles() as compiles:
        eager = transform(x)
    assert compiles.count <= 1
    inlined = jax.jit(lambda u: transform(u))(x)
    np.testing.assert_allclose(eager, inlined, rtol=1e-6, atol=1e-7)
    # and the inverse maps it back
    np.testing.assert_allclose(transform.inv(eager), x, rtol=1e-4, atol=1e-5)
