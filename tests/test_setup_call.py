"""The setup call (the guide's first call, inside ``svi.init``): NumPyro replays the
model eagerly at its values with validation on (NumPyro's default), so the guide emits
NumPyro's initial point there, as ``AutoNormal``'s setup draw sits near it, not a draw
from the fitted q. (The case that raised: ``benchmarks.user_models``' GP classifier with
``decenter=False``, whose fitted length scale gives kernels that are not numerically
positive definite in float32; ``svi.init`` raised for one key in six in a plain
process, none under pytest's workers, so it is not a test here.)"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from numpyro_uha import UHAGuide


def regression(x, y):
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    numpyro.sample("y", dist.Normal(b * x, s), obs=y)


X = jnp.linspace(-1.0, 1.0, 20)
Y = 3.0 * X + 0.1 * jnp.asarray(np.random.default_rng(0).normal(size=20), jnp.float32)


def test_the_setup_call_emits_numpyros_initial_point():
    """b's posterior is near 3 (sd 0.02) and q is fitted there by the warm start; the
    setup call's b is the initial point's (init_to_uniform: within ±2), the same for
    every key."""
    for seed in (0, 1):
        guide = UHAGuide(regression, K=2)
        trace = numpyro.handlers.trace(numpyro.handlers.seed(guide, seed)).get_trace(X, Y)
        init = guide._unpack_and_constrain(guide._init_latent, {})
        np.testing.assert_allclose(trace["b"]["value"], init["b"], rtol=1e-6)
        np.testing.assert_allclose(trace["s"]["value"], init["s"], rtol=1e-6)
        assert abs(float(trace["b"]["value"])) <= 2.0
        # q itself is at the posterior, far from there
        assert abs(float(guide._init_values["loc"][0]) - 3.0) < 0.2
