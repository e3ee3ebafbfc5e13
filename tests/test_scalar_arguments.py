"""Scalar model arguments: a NumPy integer, or a concrete 0-d JAX integer, is a static
value, as a Python int is.

A plate size computed by NumPy (``J = g.max() + 1`` is an ``np.int64``) after a setup
with a Python int failed inside the guide's compiled programs (a raw
``TracerBoolConversionError``: the NumPy scalar was traced as data), where ``AutoNormal``
runs (found by the tenth hunt, 2026-12-01). A JAX integer (``jnp.asarray(20)`` as a
minibatch size, ``g.max() + 1`` on a JAX array) failed the same way, in both guides, at
``svi.init`` or at a later call (the eleventh hunt): inside ``jax.jit`` JAX stages even a
constant JAX array's comparisons, so it reaches the programs as a NumPy scalar."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import SVI, Predictive, Trace_ELBO

from numpyro_uha import UHAGuide, UHALocalGuide

Y = jnp.array([0.1, 0.9, 1.4, 0.3, 1.2])


def groups(J, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    with numpyro.plate("J", J):
        theta = numpyro.sample("theta", dist.Normal(mu, 1.0))
        numpyro.sample("y", dist.Normal(theta, 0.5), obs=y)


def test_a_numpy_integer_sizes_a_plate_as_a_python_int_does():
    guide = UHAGuide(groups, K=2, warm_start_steps=50)
    svi = SVI(groups, guide, optax.adam(5e-3), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), 5, Y)
    result = svi.run(
        jax.random.PRNGKey(1), 5, np.int64(5), Y, init_state=state, progress_bar=False
    )
    assert np.all(np.isfinite(np.asarray(result.losses)))
    key = jax.random.PRNGKey(2)
    python, *others = [
        guide.sample_posterior(key, result.params, J, Y, sample_shape=(4,))
        for J in (5, np.int64(5), np.int32(5), jnp.asarray(5))
    ]
    for draws in others:  # the same draws
        for name, value in python.items():
            np.testing.assert_array_equal(draws[name], value, err_msg=name)
    predicted = Predictive(
        groups, guide=guide, params=result.params, num_samples=3, return_sites=["theta"]
    )(key, np.int64(5), Y)
    assert predicted["theta"].shape == (3, 5)


def test_a_jax_integer_sizes_a_plate_at_setup_as_a_python_int_does():
    setups = {}
    for J in (5, jnp.asarray(5)):  # J = g.max() + 1 on a JAX array
        guide = UHAGuide(groups, K=2, warm_start_steps=50)
        svi = SVI(groups, guide, optax.adam(5e-3), Trace_ELBO())
        setups[type(J)] = svi.get_params(svi.init(jax.random.PRNGKey(0), J, Y))
    python, array = setups.values()
    assert python.keys() == array.keys()
    for name in python:
        np.testing.assert_array_equal(array[name], python[name], err_msg=name)


N_POINTS = 30
Y_POINTS = jnp.asarray(np.random.default_rng(1).normal(1.0, 1.0, N_POINTS), jnp.float32)


def points(y, batch):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    with numpyro.plate("points", N_POINTS, subsample_size=batch) as idx:
        z = numpyro.sample("z", dist.Normal(mu, 0.5))
        numpyro.sample("y", dist.Normal(z, 1.0), obs=y[idx])


def test_a_jax_integer_minibatch_size_trains_the_local_guide_as_a_python_int_does():
    svi = SVI(points, UHALocalGuide(points, K=2), optax.adam(1e-2), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), Y_POINTS, 10)
    losses = [float(svi.update(state, Y_POINTS, batch)[1]) for batch in (10, jnp.asarray(10))]
    assert np.isfinite(losses[0]) and losses[1] == losses[0]
