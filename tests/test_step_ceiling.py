"""The stability ceiling holds the step sizes below it without taking away the gradient
that brings a step back under it (a plain clip did: a step that started above the
ceiling never moved)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import UHAGuide
from numpyro_uha.core import step_sizes_under_ceiling


def test_the_value_is_the_clip_and_only_a_push_downward_passes_above_the_ceiling():
    eps = jnp.array([0.01, 0.04, 0.05, 0.2, 0.8])
    ceiling = jnp.asarray(0.05)
    np.testing.assert_array_equal(step_sizes_under_ceiling(eps, ceiling), jnp.minimum(eps, ceiling))
    _, vjp = jax.vjp(step_sizes_under_ceiling, eps, ceiling)
    for g in (1.0, -1.0):
        d_eps, d_ceiling = vjp(jnp.full(5, g))
        below = np.asarray(eps < ceiling)
        # below the ceiling: the clip's own gradient, whatever its sign
        np.testing.assert_array_equal(np.asarray(d_eps)[below], g)
        # at or above it: a cotangent asking for a smaller step (g > 0) reaches ε, one
        # asking for a larger step does not
        np.testing.assert_array_equal(np.asarray(d_eps)[~below], max(g, 0.0))
        # the ceiling gets the clip's gradient: the cotangents of the steps it holds
        assert float(d_ceiling) == pytest.approx(g * np.sum(~below))


def test_gradient_descent_brings_a_step_above_the_ceiling_under_it():
    # loss = (min(ε, c) - 0.01)²: the best step is under the ceiling
    ceiling = 0.05

    def loss(eps):
        return (step_sizes_under_ceiling(eps, ceiling) - 0.01) ** 2

    eps = jnp.asarray(0.5)
    for _ in range(200):
        eps = eps - 0.25 * jax.grad(loss)(eps)
    assert float(eps) == pytest.approx(0.01, abs=1e-3)
    # where the loss wants a larger step the ceiling holds and ε does not drift
    assert float(jax.grad(lambda e: -step_sizes_under_ceiling(e, ceiling))(0.5)) == 0.0


Y = jnp.array([28.0, 8, -3, 7, -1, 1, 18, 12])
SIGMA = jnp.array([15.0, 10, 16, 11, 9, 11, 10, 18])


def _centred_schools():
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("J", 8):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, SIGMA), obs=Y)


@pytest.fixture(scope="module")
def setup():
    # the centred eight schools: where tau is small (q's tail, widened) the curvature of
    # theta's prior is far above q's, and the ceiling (0.06 in q's sds) is far below the
    # default first step of 0.25. (A posterior correlated near ±1 has a low ceiling with a
    # diagonal mass too, but there the chain moves in q's whitened coordinates, where that
    # ceiling is 1.5: dense_mass="auto".)
    guide = UHAGuide(_centred_schools, K=4)
    svi = SVI(_centred_schools, guide, optax.adam(1e-3), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0))
    return guide, svi, state


def test_a_low_ceiling_stores_the_first_step_at_the_ceiling_not_above_it(setup):
    guide, svi, state = setup
    params = svi.get_params(state)
    ceiling = float(params["auto_stability_ceiling"])
    assert ceiling < 0.1
    assert float(params["auto_step_size"]) == pytest.approx(ceiling, rel=1e-5)
    steps = np.asarray(guide.get_annealing_params(params).step_sizes)
    np.testing.assert_allclose(steps, ceiling, rtol=1e-5)


def test_a_step_size_above_the_ceiling_still_gets_a_gradient(setup):
    guide, svi, state = setup
    params = dict(svi.get_params(state))
    ceiling = float(params["auto_stability_ceiling"])
    params["auto_step_size"] = jnp.asarray(0.8, jnp.float32)  # far above the ceiling
    steps = np.asarray(guide.get_annealing_params(params).step_sizes)
    np.testing.assert_allclose(steps, ceiling, rtol=1e-5)

    def loss(step_size):
        p = dict(params, auto_step_size=step_size)
        guide_with = numpyro.handlers.substitute(guide, data=p)
        return Trace_ELBO(num_particles=64).loss(
            jax.random.PRNGKey(1), {}, _centred_schools, guide_with
        )

    # at the ceiling on this posterior the loss grows with the step: the push reaches ε
    grad = jax.grad(loss)(params["auto_step_size"])
    assert np.isfinite(float(grad)) and float(grad) > 0.0


def test_steps_and_ceiling_broadcast_and_their_gradients_keep_their_shapes():
    def total(eps, ceiling):
        return jnp.sum(step_sizes_under_ceiling(eps, ceiling))

    # one step under two ceilings: above the first, under the second
    d_eps, d_ceiling = jax.grad(total, argnums=(0, 1))(jnp.asarray(0.1), jnp.array([0.05, 0.2]))
    assert d_eps.shape == () and float(d_eps) == 2.0  # pushed down at one, free at the other
    np.testing.assert_array_equal(d_ceiling, [1.0, 0.0])
    # a scalar ceiling over a vector of steps: its gradient sums over the steps it holds
    d_ceiling = jax.grad(total, argnums=1)(jnp.array([0.01, 0.2, 0.8]), jnp.asarray(0.05))
    assert d_ceiling.shape == () and float(d_ceiling) == 2.0
