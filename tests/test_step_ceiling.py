"""The stability ceiling holds the step sizes below it without taking their gradient
away (a clip did: a step that started above it never moved)."""

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
from numpyro_uha.core.parametrization import CEILING_KNEE
from numpyro_uha.guide import CEILING_START


@pytest.mark.parametrize("ceiling", [0.05, 0.4, 0.99])
def test_the_map_is_the_identity_below_its_knee_and_onto_the_ceiling_above(ceiling):
    eps_max = 1.0
    eps = jnp.linspace(1e-4, eps_max - 1e-4, 2001)
    out = step_sizes_under_ceiling(eps, ceiling, eps_max)
    knee = CEILING_KNEE * ceiling
    below = eps <= knee
    np.testing.assert_array_equal(out[below], eps[below])
    assert bool(jnp.all(jnp.diff(out) > 0))  # strictly increasing
    assert float(out[-1]) < ceiling and float(out[-1]) == pytest.approx(ceiling, abs=1e-3)
    # continuous at the knee, a positive slope everywhere
    grads = jax.vmap(jax.grad(lambda e: step_sizes_under_ceiling(e, ceiling, eps_max)))(eps)
    assert float(jnp.min(grads)) == pytest.approx((1 - CEILING_KNEE) * ceiling / (eps_max - knee))
    # homogeneous: scaling ε, c and ε_max together scales the result
    np.testing.assert_allclose(
        step_sizes_under_ceiling(0.5 * eps, 0.5 * ceiling, 0.5 * eps_max), 0.5 * out, rtol=1e-6
    )


@pytest.mark.parametrize("ceiling", [1.0, 3.0, jnp.inf])
def test_a_ceiling_at_or_above_the_largest_step_changes_nothing(ceiling):
    eps = jnp.linspace(1e-3, 0.999, 101)
    np.testing.assert_allclose(step_sizes_under_ceiling(eps, ceiling, 1.0), eps, rtol=1e-6)
    grads = jax.vmap(jax.grad(lambda e: step_sizes_under_ceiling(e, ceiling, 1.0)))(eps)
    np.testing.assert_allclose(grads, 1.0)


D, RHO = 4, 0.999
COV = RHO * np.ones((D, D)) + (1 - RHO) * np.eye(D)


def _correlated():
    z = numpyro.sample("z", dist.Normal(0.0, 10.0).expand([D]).to_event(1))
    numpyro.factor("g", dist.MultivariateNormal(jnp.zeros(D), jnp.asarray(COV)).log_prob(z))


@pytest.fixture(scope="module")
def setup():
    # the leapfrog's mass matrix is diagonal: on a correlation of 0.999 the ceiling is far
    # below the default first step of 0.25
    guide = UHAGuide(_correlated, K=4)
    svi = SVI(_correlated, guide, optax.adam(1e-3), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0))
    return guide, svi, state


def test_a_low_ceiling_starts_the_step_below_it_where_the_map_is_the_identity(setup):
    guide, svi, state = setup
    params = svi.get_params(state)
    ceiling = float(params["auto_stability_ceiling"])
    assert ceiling < 0.1
    steps = np.asarray(guide.get_annealing_params(params).step_sizes)
    np.testing.assert_allclose(steps, CEILING_START * ceiling, rtol=1e-5)
    assert CEILING_START <= CEILING_KNEE


def test_a_step_size_above_the_ceiling_still_gets_a_gradient(setup):
    guide, svi, state = setup
    params = dict(svi.get_params(state))
    ceiling = float(params["auto_stability_ceiling"])
    params["auto_step_size"] = jnp.asarray(0.8, jnp.float32)  # far above the ceiling
    steps = np.asarray(guide.get_annealing_params(params).step_sizes)
    assert np.all(steps < ceiling)

    def loss(step_size):
        p = dict(params, auto_step_size=step_size)
        return Trace_ELBO(num_particles=64).loss(jax.random.PRNGKey(1), {}, _correlated, guide_with(p))

    def guide_with(p):
        return numpyro.handlers.substitute(guide, data=p)

    grad = jax.grad(loss)(params["auto_step_size"])
    assert np.isfinite(float(grad)) and float(grad) != 0.0
