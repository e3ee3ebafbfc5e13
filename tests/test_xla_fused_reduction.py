"""The installed XLA computes a reduction over a fused stack right (jaxlib 0.10.2 on CPU
did not, silently).

Found with a Beta regression: NumPyro's ``Beta.log_prob`` stacks (y, 1 - y) and the two
concentrations and reduces over them (a Dirichlet); jitted and vmapped over 500 draws of
120 data points, every draw past the first 2**16 stacked entries came out hundreds of nats
off, so ``log_z`` reported an IW log Z of 740 for a posterior whose log joint is 93, and
UHA's draws were weighted by those numbers. jax/jaxlib 0.7.0, 0.8.3, 0.9.2, 0.10.0 and
0.10.1 compute it right; ``pyproject.toml`` excludes 0.10.2. The check is the bug's own
pattern in plain JAX, and the model that found it through ``log_z``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.scipy.special import gammaln
from numpyro.infer.autoguide import AutoNormal

RNG = np.random.default_rng(0)
Y = jnp.asarray(RNG.uniform(0.01, 0.99, 120), jnp.float32)
NUM = 500  # 500 × 120 × 2 stacked entries: past 2**16


def stacked(m, p):
    c = jnp.stack([m * p, (1 - m) * p], -1)
    v = jnp.stack([Y, 1 - Y], -1)
    return (jnp.sum(jnp.log(v) * (c - 1.0), -1) - jnp.sum(gammaln(c), -1)).sum()


def test_a_jitted_vmapped_reduction_over_a_stack_is_the_eager_one():
    phi = jnp.asarray(RNG.uniform(14, 22, NUM), jnp.float32)
    mu = jnp.asarray(RNG.uniform(0.2, 0.9, (NUM, Y.shape[0])), jnp.float32)
    jitted = np.asarray(jax.jit(jax.vmap(stacked))(mu, phi))
    eager = np.asarray(jax.vmap(stacked)(mu, phi))
    # float32 sums of ~240 terms of size ~40: agree to well under 0.1
    wrong = np.flatnonzero(np.abs(jitted - eager) > 0.1)
    assert wrong.size == 0, (
        f"jax/jaxlib {jax.__version__}: {wrong.size} of {NUM} rows differ under jit "
        f"(first {wrong[0]}, by {np.abs(jitted - eager).max():.1f}); this XLA miscompiles "
        "fused reductions: install another jaxlib (see pyproject.toml)"
    )


def beta_regression(x, y):
    a = numpyro.sample("a", dist.Normal(0.0, 2.0))
    b = numpyro.sample("b", dist.Normal(0.0, 2.0))
    phi = numpyro.sample("phi", dist.Gamma(2.0, 0.1))
    mu = jax.nn.sigmoid(a + b * x)
    with numpyro.plate("n", x.shape[0]):
        numpyro.sample("y", dist.Beta(mu * phi, (1 - mu) * phi), obs=y)


def test_log_weights_of_a_beta_regression_are_those_computed_one_by_one():
    """``guide_log_weights`` (jitted, vmapped over draws) against the same keys one at a
    time, at a q near the posterior: the same log weights."""
    from numpyro.infer import Trace_ELBO

    from numpyro_uha.evaluation import guide_log_weights

    x = jnp.asarray(RNG.normal(size=120), jnp.float32)
    guide = AutoNormal(beta_regression)
    params = {
        "a_auto_loc": jnp.asarray(0.28), "a_auto_scale": jnp.asarray(0.045),
        "b_auto_loc": jnp.asarray(0.88), "b_auto_scale": jnp.asarray(0.055),
        "phi_auto_loc": jnp.asarray(2.86), "phi_auto_scale": jnp.asarray(0.125),
    }
    numpyro.handlers.seed(guide, 0)(x, Y)  # set up first: both paths then draw alike
    key = jax.random.PRNGKey(3)
    batched = guide_log_weights(key, beta_regression, guide, params, NUM, x, Y)
    keys = jax.random.split(key, NUM)[-20:]  # the last draws: past 2**16 entries
    one = jax.jit(lambda k: -Trace_ELBO().loss(k, params, beta_regression, guide, x, Y))
    single = np.array([float(one(k)) for k in keys])
    np.testing.assert_allclose(batched[-20:], single, rtol=1e-4, atol=1e-2)
