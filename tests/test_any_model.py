"""Models that ordinary NumPyro users write, which used to fail at set-up (issue 14):
improper priors, ``scan``, ``block``, ``AutoGuideList``; and guide methods under
``jit``/``vmap``. Each test checks a value against an independent computation, not only
that the call runs."""

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax.scipy.stats import multivariate_normal
from numpyro import handlers
from numpyro.contrib.control_flow import scan
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoGuideList, AutoNormal

from numpyro_uha import UHAGuide

Y = jnp.array([0.1, 0.5, -0.3, 0.8, 1.0, 0.4])


def fit(model, guide, *args, steps=30, lr=1e-2):
    svi = SVI(model, guide, optax.adam(lr), Trace_ELBO())
    return svi.run(jax.random.PRNGKey(0), steps, *args, progress_bar=False)


def improper_model(y):
    mu = numpyro.sample("mu", dist.ImproperUniform(dist.constraints.real, (), ()))
    sigma = numpyro.sample("sigma", dist.ImproperUniform(dist.constraints.positive, (), ()))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def test_improper_flat_priors_set_up_and_give_the_likelihood_as_log_density():
    guide = UHAGuide(improper_model, K=2, warm_start_steps=20)
    result = fit(improper_model, guide, Y)
    assert np.all(np.isfinite(result.losses))
    logdensity = guide.get_logdensity_fn(result.params, Y)
    mu, log_sigma = 0.3, -0.2
    # flat priors: log p̄ = Σ log N(y | mu, sigma) + log |d sigma / d log sigma|
    expected = dist.Normal(mu, jnp.exp(log_sigma)).log_prob(Y).sum() + log_sigma
    np.testing.assert_allclose(logdensity(jnp.array([mu, log_sigma])), expected, rtol=1e-5)


def ar_scan(y):
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))

    def step(x_prev, y_t):
        x = numpyro.sample("x", dist.Normal(x_prev, sigma))
        numpyro.sample("y", dist.Normal(x, 0.5), obs=y_t)
        return x, x

    scan(step, 0.0, y)


def ar_vectorized(y):
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("t", y.shape[0]):
        eps = numpyro.sample("eps", dist.Normal(0.0, 1.0))
    x = jnp.cumsum(sigma * eps)
    numpyro.sample("y", dist.Normal(x, 0.5).to_event(1), obs=y)


def test_scan_model_trains_and_its_log_density_is_the_random_walks():
    guide = UHAGuide(ar_scan, K=2, warm_start_steps=20)
    result = fit(ar_scan, guide, Y)
    assert np.all(np.isfinite(result.losses))
    z = jnp.linspace(-0.5, 0.5, 1 + Y.shape[0])  # (log sigma, x_1..x_T)
    log_sigma, x = z[0], z[1:]
    sigma = jnp.exp(log_sigma)
    x_prev = jnp.concatenate([jnp.zeros(1), x[:-1]])
    expected = (
        dist.HalfNormal(1.0).log_prob(sigma) + log_sigma
        + dist.Normal(x_prev, sigma).log_prob(x).sum()
        + dist.Normal(x, 0.5).log_prob(Y).sum()
    )
    np.testing.assert_allclose(guide.get_logdensity_fn(result.params, Y)(z), expected, rtol=1e-5)
    draws = guide.sample_posterior(jax.random.PRNGKey(1), result.params, Y, sample_shape=(5,))
    assert draws["x"].shape == (5, Y.shape[0]) and np.all(np.isfinite(draws["x"]))


def two_means(y):
    # a and b are independent a posteriori, so a guide that splits them can be exact
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 2.0))
    with numpyro.plate("n", 3):
        numpyro.sample("ya", dist.Normal(a, 1.0), obs=y[:3])
        numpyro.sample("yb", dist.Normal(b, 1.0), obs=y[3:])


def log_z_two_means(y):
    # the observations of each mean are jointly Gaussian: N(0, prior variance · 11ᵀ + I)
    ones = jnp.ones((3, 3))
    return (
        multivariate_normal.logpdf(y[:3], jnp.zeros(3), 1.0 * ones + jnp.eye(3))
        + multivariate_normal.logpdf(y[3:], jnp.zeros(3), 4.0 * ones + jnp.eye(3))
    )


def test_uha_inside_autoguidelist_and_under_block_gives_a_valid_bound():
    guide = AutoGuideList(two_means)
    guide.append(AutoNormal(handlers.block(two_means, expose=["a"])))
    guide.append(UHAGuide(handlers.block(two_means, hide=["a"]), K=3, warm_start_steps=20))
    result = fit(two_means, guide, Y, steps=2000, lr=2e-2)
    assert np.all(np.isfinite(result.losses))
    elbo = Trace_ELBO(num_particles=4000).loss(jax.random.PRNGKey(3), result.params, two_means, guide, Y)
    # -loss is an ELBO: below log Z, and after training close to it (both parts of the
    # guide can be exact here)
    losses = jax.vmap(
        lambda k: Trace_ELBO().loss(k, result.params, two_means, guide, Y)
    )(jax.random.split(jax.random.PRNGKey(4), 4000))
    se = float(np.std(losses) / np.sqrt(losses.size))
    log_z = float(log_z_two_means(Y))
    assert -float(elbo) <= log_z + 4 * se
    assert -float(elbo) > log_z - 0.1, (float(elbo), log_z)


def test_guide_methods_under_jit_and_vmap_match_eager_calls():
    guide = UHAGuide(two_means, K=2, warm_start_steps=20)
    result = fit(two_means, guide, Y)
    key = jax.random.PRNGKey(5)
    # first calls under jit, on a fresh copy (nothing about the data remembered yet):
    # everything closed over (key, params, data), the key, the params, the data traced
    fresh = [pickle.loads(pickle.dumps(guide)) for _ in range(4)]
    first = [
        jax.jit(lambda: fresh[3].sample_posterior(key, result.params, Y, sample_shape=(10,)))(),
        jax.jit(lambda k: fresh[0].sample_posterior(k, result.params, Y, sample_shape=(10,)))(key),
        jax.jit(lambda p, k: fresh[1].sample_posterior(k, p, Y, sample_shape=(10,)))(result.params, key),
        jax.jit(lambda y, k: fresh[2].sample_posterior(k, result.params, y, sample_shape=(10,)))(Y, key),
    ]
    eager = guide.sample_posterior(key, result.params, Y, sample_shape=(10,))
    for draws in first:
        for name in eager:
            np.testing.assert_allclose(draws[name], eager[name], rtol=1e-5, atol=1e-6)
    jitted = jax.jit(lambda k: guide.sample_posterior(k, result.params, Y, sample_shape=(10,)))(key)
    traced_params = jax.jit(lambda p, k: guide.sample_posterior(k, p, Y, sample_shape=(10,)))(result.params, key)
    for draws in (jitted, traced_params):
        for name in eager:
            np.testing.assert_allclose(draws[name], eager[name], rtol=1e-5, atol=1e-6)
    keys = jax.random.split(key, 3)
    batched = jax.vmap(lambda k: guide.sample_posterior(k, result.params, Y, sample_shape=(4,)))(keys)
    for i in range(3):
        single = guide.sample_posterior(keys[i], result.params, Y, sample_shape=(4,))
        np.testing.assert_allclose(batched["a"][i], single["a"], rtol=1e-5, atol=1e-6)


def dependent_support(obs):
    x = numpyro.sample("x", dist.LogNormal(0.0, 1.0))
    y = numpyro.sample("y", dist.Uniform(0.0, x))  # support depends on the latent x
    numpyro.sample("o", dist.Normal(y, 0.5), obs=obs)


def test_a_support_that_depends_on_another_latent_holds_at_every_draw():
    guide = UHAGuide(dependent_support, K=4, warm_start_steps=100)
    result = fit(dependent_support, guide, 0.7, steps=200)
    draws = guide.sample_posterior(jax.random.PRNGKey(1), result.params, 0.7, sample_shape=(2000,))
    assert np.all(draws["y"] > 0) and np.all(draws["y"] < draws["x"])
    # the log density uses each draw's own x for y's transform: y = x · sigmoid(u)
    log_x, u = 0.4, -0.3
    x = jnp.exp(log_x)
    y = x * jax.nn.sigmoid(u)
    expected = (
        dist.LogNormal(0.0, 1.0).log_prob(x) + log_x
        - jnp.log(x) + jnp.log(x * jax.nn.sigmoid(u) * (1 - jax.nn.sigmoid(u)))
        + dist.Normal(y, 0.5).log_prob(0.7)
    )
    logdensity = guide.get_logdensity_fn(result.params, 0.7)
    np.testing.assert_allclose(logdensity(jnp.array([log_x, u])), expected, rtol=1e-5)


class _Options:
    """A model argument that is neither an array nor hashable (a settings object)."""

    __hash__ = None

    def __init__(self, scale):
        self.scale = scale


def _model_with_options(y, options):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    numpyro.sample("y", dist.Normal(mu, options.scale), obs=y)


def test_an_unhashable_model_argument_trains():
    """The guide's setup and chain run as programs compiled per argument structure; an
    argument that structure cannot hash runs them uncompiled instead of failing (svi.init
    raised TypeError when the setup program was cached by it)."""
    y = np.random.default_rng(0).normal(2.0, 1.0, 20).astype(np.float32)
    # (uncompiled, every operation runs on its own: a few steps show it trains)
    guide = UHAGuide(_model_with_options, K=2, warm_start_steps=10)
    svi = SVI(_model_with_options, guide, optax.adam(1e-2), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), 3, y, _Options(1.0), progress_bar=False)
    assert np.all(np.isfinite(np.asarray(result.losses)))
    assert guide._start_elbo is not None


def _pytree_param_model(y):
    # random_flax_module / flax_module keep a network's parameters as one param site
    # holding a dict ("<name>$params")
    net = numpyro.param("net$params", {"w": jnp.ones(2), "b": jnp.zeros(())})
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    numpyro.sample("y", dist.Normal(mu + jnp.sum(net["w"]) + net["b"], 1.0), obs=y)


def test_a_pytree_valued_model_param_trains_draws_and_is_checked_for_nan():
    from numpyro_uha._divergence import DivergenceRecord

    guide = UHAGuide(_pytree_param_model, K=2, warm_start_steps=10)
    result = fit(_pytree_param_model, guide, Y, steps=20)
    params = result.params
    assert set(params["net$params"]) == {"w", "b"}
    draws = guide.sample_posterior(jax.random.PRNGKey(1), params, Y, sample_shape=(50,))
    assert draws["mu"].shape == (50,) and np.all(np.isfinite(draws["mu"]))
    bad = {**params, "net$params": {**params["net$params"], "w": jnp.array([1.0, jnp.nan])}}
    with pytest.raises(FloatingPointError, match=r"net\$params"):
        guide.sample_posterior(jax.random.PRNGKey(1), bad, Y, sample_shape=(50,))
    # the last finite fit of a diverging step keeps the pytree (host copies of its leaves)
    record = DivergenceRecord()
    record.record(0.5, 0.1, params)
    kept = record.params["net$params"]
    assert isinstance(kept, dict) and isinstance(kept["w"], np.ndarray)
    np.testing.assert_array_equal(kept["w"], params["net$params"]["w"])
