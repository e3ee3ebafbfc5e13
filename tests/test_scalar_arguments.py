"""Scalar model arguments: a NumPy integer is a static value, as a Python int is.

A plate size computed by NumPy (``J = g.max() + 1`` is an ``np.int64``) after a setup
with a Python int failed inside the guide's compiled programs (a raw
``TracerBoolConversionError``: the NumPy scalar was traced as data), where ``AutoNormal``
runs (found by the tenth hunt, 2026-12-01)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import SVI, Predictive, Trace_ELBO

from numpyro_uha import UHAGuide

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
    draws = {
        J: guide.sample_posterior(key, result.params, J, Y, sample_shape=(4,))
        for J in (5, np.int64(5), np.int32(5))
    }
    for J in (np.int64(5), np.int32(5)):  # the same program, the same draws
        for name, value in draws[5].items():
            np.testing.assert_array_equal(draws[J][name], value, err_msg=name)
    predicted = Predictive(
        groups, guide=guide, params=result.params, num_samples=3, return_sites=["theta"]
    )(key, np.int64(5), Y)
    assert predicted["theta"].shape == (3, 5)
