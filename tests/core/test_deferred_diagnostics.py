"""``annealed_sample(..., deferred_diagnostics=True)``: the same chain, the same
per-transition diagnostics (evaluated after the chain), and a divergence flag equal to
the step-by-step rule (non-finite log weight, or a leapfrog energy error over
``DIVERGENCE_ENERGY`` nats) under ``vmap`` (a batch where some chains need the
step-by-step check and some do not), nested ``vmap``, ``jit`` and ``grad``; and the one
documented difference (a middle step's energy error that no kick felt and the weight
does not hold)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_uha.core import annealed_sample, annealed_sample_rows, make_params
from numpyro_uha.core.annealing import DIVERGENCE_ENERGY

from tests.core.test_annealing import gaussian_target, random_params

K = 8


def stepwise_rule(log_weight, info):
    """The rule the flag must equal, from the in-scan diagnostics."""
    return ~jnp.isfinite(log_weight) | jnp.any(
        jnp.abs(info.log_accept_ratio) > DIVERGENCE_ENERGY, axis=-1
    )


def draw(params, key, deferred, **kwargs):
    return annealed_sample(
        key, gaussian_target, params, integrator="position_verlet",
        deferred_diagnostics=deferred, **kwargs,
    )


@pytest.mark.parametrize(
    "param_kwargs,num_leapfrog_steps",
    [
        (dict(), 1),
        (dict(full_rank=True, drift=True), 1),
        (dict(drift=True, force_limit=0.5), 3),
    ],
    ids=["diag", "fullrank-drift", "force-limit-L3"],
)
def test_deferred_chain_and_diagnostics_equal_the_in_scan_ones(param_kwargs, num_leapfrog_steps):
    params = random_params(5, **param_kwargs)
    keys = jax.random.split(jax.random.PRNGKey(3), 16)

    def run(deferred):
        return jax.jit(jax.vmap(
            lambda k: draw(params, k, deferred, num_leapfrog_steps=num_leapfrog_steps)
        ))(keys)

    z, log_w, info = run(True)
    z_ref, log_w_ref, info_ref = run(False)
    np.testing.assert_array_equal(z, z_ref)
    np.testing.assert_allclose(log_w, log_w_ref, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(info.target_logdensity, info_ref.target_logdensity, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(info.log_accept_ratio, info_ref.log_accept_ratio, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(info.momentum_log_ratio, info_ref.momentum_log_ratio)
    assert info_ref.diverged is None
    np.testing.assert_array_equal(info.diverged, stepwise_rule(log_w_ref, info_ref))
    assert not np.any(info.diverged)  # calm chains: nothing is flagged

    def mean_log_w(p, deferred):
        return jnp.mean(jax.vmap(lambda k: draw(p, k, deferred)[1])(keys))

    grads = jax.jit(jax.grad(mean_log_w), static_argnums=1)(params, True)
    grads_ref = jax.jit(jax.grad(mean_log_w), static_argnums=1)(params, False)
    for g, g_ref in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
        np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-5)


def narrow_target(z):
    """N(0, 0.05²) × N(0, 1): a step above 0.1 is unstable in the first coordinate."""
    return -0.5 * (z[0] / 0.05) ** 2 - 0.5 * z[1] ** 2


def narrow_params(step_sizes):
    return make_params(
        jnp.zeros(2), jnp.ones(2), betas=jnp.linspace(0.1, 1.0, K), step_size=step_sizes,
        damping=0.9, momentum_scale=jnp.ones(2),
    )


# from calm (0.005) through the edge of stability to chains thrown to 1e37
STEP_SIZES = jnp.array([0.005, 0.02, 0.06, 0.08, 0.09, 0.1, 0.12, 0.2, 0.5, 1.0] * 3)


def narrow_draws(step_sizes, deferred, keys):
    return jax.vmap(
        lambda k, s: annealed_sample(
            k, narrow_target, narrow_params(s), integrator="position_verlet",
            deferred_diagnostics=deferred,
        )
    )(keys, step_sizes)


def test_flag_equals_the_stepwise_rule_in_a_mixed_batch():
    """One vmapped batch of calm, borderline and exploding chains: every chain's flag is
    the step-by-step rule's, whichever of them needed the step-by-step check."""
    keys = jax.random.split(jax.random.PRNGKey(0), STEP_SIZES.shape[0])
    steps = jnp.broadcast_to(STEP_SIZES[:, None], (STEP_SIZES.shape[0], K))
    _, log_w, info = jax.jit(narrow_draws, static_argnums=1)(steps, True, keys)
    _, log_w_ref, info_ref = jax.jit(narrow_draws, static_argnums=1)(steps, False, keys)
    expected = np.asarray(stepwise_rule(log_w_ref, info_ref))
    assert 0 < expected.sum() < expected.size  # a mixed batch
    assert np.any(expected & np.isfinite(np.asarray(log_w_ref)))  # finite, yet diverged
    np.testing.assert_array_equal(info.diverged, expected)
    # one chain at a time (no vmap: the plain cond)
    for i in (0, 7, 9):
        one = jax.jit(
            lambda k, s: annealed_sample(
                k, narrow_target, narrow_params(s), integrator="position_verlet",
                deferred_diagnostics=True,
            )[2].diverged
        )(keys[i], steps[i])
        assert bool(one) == bool(expected[i])
    # nested vmap: three groups of ten chains
    nested = jax.jit(jax.vmap(lambda k, s: narrow_draws(s, True, k)[2].diverged))(
        keys.reshape(3, 10, *keys.shape[1:]), steps.reshape(3, 10, K)
    )
    np.testing.assert_array_equal(np.asarray(nested).reshape(-1), expected)


def test_a_chain_calm_at_its_end_but_thrown_before_is_flagged():
    """Unstable steps, then a last step of size 0 (its energy error is exactly 0): the
    kinetic increments of the middle steps send the chain to the step-by-step check."""
    keys = jax.random.split(jax.random.PRNGKey(1), 8)
    steps = jnp.broadcast_to(jnp.array([0.5] * (K - 1) + [0.0]), (8, K))
    _, log_w, info = jax.jit(narrow_draws, static_argnums=1)(steps, True, keys)
    _, log_w_ref, info_ref = jax.jit(narrow_draws, static_argnums=1)(steps, False, keys)
    assert np.all(np.asarray(info_ref.log_accept_ratio)[:, -1] == 0.0)
    assert np.all(np.isfinite(np.asarray(log_w_ref)))
    expected = np.asarray(stepwise_rule(log_w_ref, info_ref))
    assert expected.all()
    np.testing.assert_array_equal(info.diverged, expected)


CLIFF = 1e5


def cliff_target(z):
    """N(0, 1)², less CLIFF nats where z[0] > 0.5: a step there has no gradient at all."""
    return -0.5 * jnp.sum(z**2) - CLIFF * (z[0] > 0.5)


def cliff_draws(step_sizes, deferred, keys):
    params = make_params(
        jnp.zeros(2), jnp.ones(2), betas=jnp.linspace(0.1, 1.0, K), step_size=step_sizes,
        damping=0.9, momentum_scale=jnp.ones(2),
    )
    return jax.vmap(
        lambda k: annealed_sample(
            k, cliff_target, params, integrator="position_verlet",
            deferred_diagnostics=deferred,
        )
    )(keys)


def test_a_cliff_crossed_by_the_last_step_is_flagged():
    """No kick feels the cliff (its gradient is 0): only the last step's energy error
    (the last position's log p̄, which the weight holds) shows it."""
    keys = jax.random.split(jax.random.PRNGKey(2), 64)
    steps = jnp.array([0.0] * (K - 1) + [1.0])
    _, log_w, info = jax.jit(cliff_draws, static_argnums=1)(steps, True, keys)
    _, log_w_ref, info_ref = jax.jit(cliff_draws, static_argnums=1)(steps, False, keys)
    assert np.all(np.abs(np.asarray(info_ref.momentum_log_ratio)) < 100)
    expected = np.asarray(stepwise_rule(log_w_ref, info_ref))
    assert 0 < expected.sum() < expected.size
    np.testing.assert_array_equal(info.diverged, expected)


def test_a_cliff_crossed_before_the_last_step_is_not_flagged():
    """The documented difference from the step-by-step rule: a chain whose kicks stay
    calm, whose last step is calm, and whose weight is finite is not checked step by
    step. Here it crosses the cliff in its first step and stays beyond: an intermediate
    energy error of 1e4 nats, which neither the weight (it holds the last position's
    log p̄ only) nor its gradient (no kick felt the cliff) depends on."""
    keys = jax.random.split(jax.random.PRNGKey(2), 64)
    steps = jnp.array([1.0] + [0.0] * (K - 1))
    _, log_w, info = jax.jit(cliff_draws, static_argnums=1)(steps, True, keys)
    _, log_w_ref, info_ref = jax.jit(cliff_draws, static_argnums=1)(steps, False, keys)
    crossed = np.asarray(stepwise_rule(log_w_ref, info_ref))
    assert crossed.any()
    assert not np.any(np.asarray(info.diverged))
    np.testing.assert_allclose(log_w, log_w_ref, rtol=1e-6)
    assert np.all(np.isfinite(np.asarray(log_w)))


def test_rows_flags_equal_the_stepwise_rule():
    """One chain per row (local latents), each row with its own step sizes: the rows'
    flags are the step-by-step rule's, calm rows included (they are checked with the
    others once one row is not calm)."""
    num_rows = STEP_SIZES.shape[0]
    keys = jax.random.split(jax.random.PRNGKey(4), num_rows)
    params = make_params(
        jnp.zeros((num_rows, 2)), jnp.ones((num_rows, 2)), betas=jnp.linspace(0.1, 1.0, K),
        damping=0.9, momentum_scale=jnp.ones(2),
    )._replace(step_sizes=jnp.broadcast_to(STEP_SIZES[:, None], (num_rows, K)))

    def rows_target(Z):
        return -0.5 * (Z[:, 0] / 0.05) ** 2 - 0.5 * Z[:, 1] ** 2

    def run(deferred):
        return jax.jit(
            lambda: annealed_sample_rows(
                keys, rows_target, params, integrator="position_verlet",
                deferred_diagnostics=deferred,
            )
        )()

    z, log_w, info = run(True)
    z_ref, log_w_ref, info_ref = run(False)
    np.testing.assert_array_equal(z, z_ref)
    np.testing.assert_allclose(info.log_accept_ratio, info_ref.log_accept_ratio, rtol=1e-5)
    expected = np.asarray(stepwise_rule(log_w_ref, info_ref))
    assert 0 < expected.sum() < expected.size
    np.testing.assert_array_equal(info.diverged, expected)


def test_a_target_closing_over_traced_integer_data():
    """The model's data enter through the target's closure, traced where the caller jits
    over them: integer arrays (indices, counts) included, as ``jax.jit(svi.update)``
    with a group index among its arguments has them."""
    keys = jax.random.split(jax.random.PRNGKey(5), 6)

    @jax.jit
    def flags(index, scales, steps):
        def target(z):  # coordinate i has sd scales[index[i]]
            return -0.5 * jnp.sum((z / scales[index]) ** 2)

        def chunk(_, inputs):  # in a loop, as the draw methods run chunks of draws
            return None, jax.vmap(
                lambda k, s: annealed_sample(
                    k, target, narrow_params(s), integrator="position_verlet",
                    deferred_diagnostics=True,
                )[2].diverged
            )(*inputs)

        return jax.lax.scan(chunk, None, (keys.reshape(2, 3, -1), steps.reshape(2, 3, K)))[1]

    steps = jnp.broadcast_to(jnp.array([0.01, 0.01, 0.5, 0.5, 0.01, 1.0])[:, None], (6, K))
    result = np.asarray(flags(jnp.array([1, 0], jnp.int32), jnp.array([1.0, 0.05]), steps))
    np.testing.assert_array_equal(result.reshape(-1), [False, False, True, True, False, True])
