"""UHALocalGuide: local latent variables, data subsampling, amortization (issue 15).

Statistical checks use fixed seeds and tolerances from the Monte Carlo standard errors
they compute.
"""

import math
import warnings
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro import handlers
from numpyro.infer import SVI, Predictive, Trace_ELBO

from numpyro_uha import UHADivergenceWarning, UHALocalGuide
from numpyro_uha.core import annealed_sample

N = 24
SIGMA = 0.5  # observation noise
X = jnp.asarray(np.random.default_rng(0).normal(size=N) * 1.5)


def conjugate_model(x, num_data, batch, mu=None):
    """z_i ~ N(mu, 1), x_i ~ N(z_i, σ²): p(x_i | mu) = N(x_i; mu, 1 + σ²)."""
    if mu is None:
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", num_data, subsample_size=batch) as idx:
        z = numpyro.sample("z", dist.Normal(mu, 1.0))
        numpyro.sample("x", dist.Normal(z, SIGMA), obs=x[idx])


def exact_log_marginal(x, mu):
    return jax.scipy.stats.norm.logpdf(x, mu, math.sqrt(1 + SIGMA**2))


def perturbed_params(model, guide, seed=0, *args):
    """The guide's initial params, moved to arbitrary values (q wider than the posterior,
    so that weights have finite variance)."""
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    params = dict(svi.get_params(svi.init(jax.random.PRNGKey(seed), *args)))
    rng = np.random.default_rng(seed)
    params["local_loc"] = jnp.asarray(rng.normal(size=params["local_loc"].shape) * 0.5)
    params["local_scale"] = jnp.asarray(rng.uniform(0.9, 1.3, params["local_scale"].shape))
    params["local_step_size"] = jnp.asarray(0.15)  # in (0, max_step_size = 0.2)
    params["local_beta_logits"] = jnp.asarray(rng.normal(size=params["local_beta_logits"].shape) * 0.3)
    return params


def _all_rows(guide, params, args, key):
    """One draw of every data point's chain with ``key`` (no subsampling: args' batch is
    N), and what a single-chain run of row i needs: ``(draws, log_w, keys, annealing)``
    with ``keys[i]`` row i's key and ``annealing`` the rows' parameters."""
    idx = jnp.arange(N)
    draws, log_w = guide._draws(key, params, args, {}, (), idx)
    # the guide's first random key is the rows' key (no global, no subsample draw)
    draw_key = jax.random.split(key, 1)[0]
    rows_key = handlers.seed(lambda: numpyro.prng_key(), draw_key)()
    keys = jax.random.split(rows_key, N)
    annealing = guide.get_annealing_params(params, *args, subsample_idx=idx)
    return draws, log_w, keys, annealing


def test_each_data_point_chain_is_the_single_chain_with_its_key():
    """Data point i's chain inside the guide is core.annealed_sample with key i on
    log p(x_i, z_i | mu) alone (written here per point, independently of the model)."""
    mu = 0.4
    model = handlers.condition(conjugate_model, {"mu": mu})
    guide = UHALocalGuide(model, K=5, integrator="velocity_verlet", precondition=False)
    args = (X, N, N)
    params = perturbed_params(model, guide, 0, *args)
    draws, log_w, keys, annealing = _all_rows(guide, params, args, jax.random.PRNGKey(7))
    for i in [0, 5, 17]:
        def single(z, i=i):
            return (
                jax.scipy.stats.norm.logpdf(z[0], mu, 1.0)
                + jax.scipy.stats.norm.logpdf(X[i], z[0], SIGMA)
            )
        row = annealing._replace(loc=annealing.loc[i], scale=annealing.scale[i])
        z_i, w_i, _ = annealed_sample(keys[i], single, row, integrator="velocity_verlet")
        np.testing.assert_allclose(draws["z"][i], z_i[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(log_w[i], w_i, rtol=1e-5, atol=1e-5)


def test_a_preconditioned_chain_is_the_chain_in_q_standardized_coordinates():
    """precondition=True: data point i's chain is core.annealed_sample on its target in
    u = (z - μ_i) / σ_i (log p̄(μ_i + σ_i u) + Σ log σ_i, from N(0, I)) with Σ's
    momentum scales as given, mapped back: the same draws and the same log weights."""
    mu = 0.4
    model = handlers.condition(conjugate_model, {"mu": mu})
    guide = UHALocalGuide(model, K=5, integrator="velocity_verlet", precondition=True)
    args = (X, N, N)
    params = perturbed_params(model, guide, 0, *args)
    # q's sds far from 1 and Σ's not 1, so Σ / σ_i differs from Σ, Σ σ_i and σ_i
    params["local_scale"] = jnp.asarray(np.random.default_rng(5).uniform(0.2, 3.0, (N, 1)))
    params["local_momentum_scale"] = jnp.asarray([0.7])
    draws, log_w, keys, annealing = _all_rows(guide, params, args, jax.random.PRNGKey(7))
    for i in [0, 5, 17]:
        loc, scale = annealing.loc[i], annealing.scale[i]

        def standardized(u, i=i, loc=loc, scale=scale):
            z = loc[0] + scale[0] * u[0]
            return (
                jax.scipy.stats.norm.logpdf(z, mu, 1.0)
                + jax.scipy.stats.norm.logpdf(X[i], z, SIGMA)
                + jnp.log(scale[0])
            )
        row = annealing._replace(
            loc=jnp.zeros(1), scale=jnp.ones(1), momentum_scale=params["local_momentum_scale"],
        )
        u_i, w_i, _ = annealed_sample(keys[i], standardized, row, integrator="velocity_verlet")
        np.testing.assert_allclose(draws["z"][i], loc[0] + scale[0] * u_i[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(log_w[i], w_i, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precondition", [pytest.param(False, marks=pytest.mark.slow), True])
def test_weights_are_unbiased_with_subsampling(precondition):
    """E[w_i] = p(x_i | mu) for each data point of a minibatch (B = 6 of 24)."""
    mu, batch = -0.3, 6
    model = handlers.condition(conjugate_model, {"mu": mu})
    guide = UHALocalGuide(model, K=4, precondition=precondition)
    args = (X, N, batch)
    params = perturbed_params(model, guide, 1, *args)
    idx = jnp.asarray([3, 11, 0, 20, 7, 15])
    log_w = np.asarray(
        guide.log_weights(jax.random.PRNGKey(3), params, *args, num_samples=4000, subsample_idx=idx),
        np.float64,
    )
    assert log_w.shape == (4000, batch)
    ratio = np.exp(log_w - np.asarray(exact_log_marginal(X[idx], mu))[None])
    mean, se = ratio.mean(0), ratio.std(0, ddof=1) / math.sqrt(ratio.shape[0])
    # Bonferroni over the 6 data points at a two-sided 1e-3 level per test
    z = (mean - 1.0) / se
    assert np.all(np.abs(z) < 4.0), (mean, se)
    # and the bound is below log p(x_i) (Jensen), by more than its error
    gap = np.asarray(exact_log_marginal(X[idx], mu)) - log_w.mean(0)
    assert np.all(gap > -4 * log_w.std(0) / math.sqrt(log_w.shape[0]))


def test_minibatch_bound_is_unbiased():
    """The average of the minibatch loss over a partition of the data into minibatches
    equals the full-batch loss (fixed params, global mu drawn by the global guide)."""
    guide = UHALocalGuide(conjugate_model, K=3)
    params = perturbed_params(conjugate_model, guide, 2, X, N, N)
    elbo = Trace_ELBO()
    num_keys = 600

    def losses(batch, idx):
        def one(key):
            model = handlers.substitute(conjugate_model, data={"data": idx})
            g = handlers.substitute(guide, data={"data": idx})
            return elbo.loss(key, params, model, g, X, N, batch)
        return np.asarray(jax.vmap(one)(jax.random.split(jax.random.PRNGKey(batch), num_keys)))

    full = losses(N, jnp.arange(N))
    parts = [losses(6, jnp.arange(k, k + 6)) for k in range(0, N, 6)]
    mini = np.mean(parts, axis=0)  # one draw per key of the partition's average
    diff = full.mean() - mini.mean()
    se = math.sqrt(full.var(ddof=1) / num_keys + mini.var(ddof=1) / num_keys)
    assert abs(diff) < 4 * se, (full.mean(), mini.mean(), se)
    # the minibatch loss is not the full-data loss with the scale dropped
    assert abs(full.mean() - np.mean(parts[0]) * 6 / N) > 4 * se


COUNTS = jnp.asarray(np.random.default_rng(1).poisson(3.0, size=N).astype(np.float32))


def gamma_poisson(counts, num_data, batch):
    """z_i ~ Gamma(2, 0.5) (positive: the Jacobian matters), x_i ~ Poisson(z_i):
    p(x_i) is negative binomial."""
    with numpyro.plate("data", num_data, subsample_size=batch) as idx:
        z = numpyro.sample("z", dist.Gamma(2.0, 0.5))
        numpyro.sample("x", dist.Poisson(z), obs=counts[idx])


def gamma_poisson_log_marginal(x, a=2.0, b=0.5):
    p = b / (1 + b)
    return (
        jax.scipy.special.gammaln(x + a) - jax.scipy.special.gammaln(a)
        - jax.scipy.special.gammaln(x + 1) + a * jnp.log(p) + x * jnp.log1p(-p)
    )


@pytest.mark.slow
def test_weights_are_unbiased_on_a_constrained_local():
    batch = 6
    guide = UHALocalGuide(gamma_poisson, K=4)
    svi = SVI(gamma_poisson, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.run(jax.random.PRNGKey(0), 300, COUNTS, N, batch, progress_bar=False).params
    idx = jnp.asarray([1, 4, 9, 13, 18, 22])
    log_w = np.asarray(
        guide.log_weights(jax.random.PRNGKey(5), params, COUNTS, N, batch, num_samples=4000,
                          subsample_idx=idx),
        np.float64,
    )
    ratio = np.exp(log_w - np.asarray(gamma_poisson_log_marginal(COUNTS[idx]))[None])
    mean, se = ratio.mean(0), ratio.std(0, ddof=1) / math.sqrt(ratio.shape[0])
    assert np.all(np.abs(mean - 1.0) < 4.0 * se), (mean, se)
    from numpyro_uha.evaluation import log_z

    estimate = log_z(guide, jax.random.PRNGKey(6), params, COUNTS, N, batch, num_draws=4000,
                     subsample_idx=idx)
    exact = np.asarray(gamma_poisson_log_marginal(COUNTS[idx]))
    assert np.all(np.abs(estimate.log_z - exact) < 4 * estimate.se + 1e-3)
    assert abs(estimate.total - exact.sum()) < 4 * estimate.total_se + 1e-3
    # the bound is below, the importance-weighted estimate above it
    assert np.all(estimate.elbo <= estimate.log_z + 1e-9)
    assert np.all(estimate.num_nonfinite == 0) and estimate.num_samples == 4000


def gamma_poisson_empirical(counts, num_data, batch):
    """gamma_poisson with the prior's rate read from the data in Python (NumPy on the
    data's values), which cannot run with the data traced."""
    rate = 2.0 / float(np.mean(np.asarray(counts)))
    with numpyro.plate("data", num_data, subsample_size=batch) as idx:
        z = numpyro.sample("z", dist.Gamma(2.0, rate))
        numpyro.sample("x", dist.Poisson(z), obs=counts[idx])


def test_a_model_that_reads_its_datas_values_trains_and_its_log_z_is_exact():
    """The guide's programs take the data as arguments; a model whose Python code reads
    their values (here NumPy's mean) failed at svi.init with a TracerArrayConversionError.
    Such a model runs with the data held as the programs' constants, and log p(x_i) is
    the exact one within its standard errors."""
    batch = 6
    guide = UHALocalGuide(gamma_poisson_empirical, K=4)
    svi = SVI(gamma_poisson_empirical, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.run(jax.random.PRNGKey(0), 300, COUNTS, N, batch, progress_bar=False).params
    assert guide._hold_data
    from numpyro_uha.evaluation import log_z

    idx = jnp.asarray([1, 4, 9, 13, 18, 22])
    estimate = log_z(guide, jax.random.PRNGKey(6), params, COUNTS, N, batch, num_draws=4000,
                     subsample_idx=idx)
    rate = 2.0 / float(np.mean(np.asarray(COUNTS)))
    exact = np.asarray(gamma_poisson_log_marginal(COUNTS[idx], b=rate))
    assert np.all(np.abs(estimate.log_z - exact) < 4 * estimate.se + 1e-3)
    draws = guide.sample_posterior(jax.random.PRNGKey(7), params, COUNTS, N, batch,
                                   sample_shape=(3,), subsample_idx=idx)
    assert draws["z"].shape == (3, 6) and np.all(draws["z"] > 0)


def test_trace_graph_elbo_gets_trace_elbos_gradient():
    """Each chain's log density beyond the model's is a guide site in the plate; NumPyro's
    TraceGraph_ELBO stopped its gradient (a numpyro.factor's Unit has no reparameterized
    sampler). With the same key, both ELBOs' values and gradients agree."""
    from numpyro.infer import TraceGraph_ELBO

    batch = 6
    guide = UHALocalGuide(gamma_poisson, K=2)
    params = perturbed_params(gamma_poisson, guide, 0, COUNTS, N, batch)
    key = jax.random.PRNGKey(3)

    def loss_and_grad(elbo):
        return jax.value_and_grad(
            lambda p: elbo.loss(key, p, gamma_poisson, guide, COUNTS, N, batch)
        )(params)

    value, grad = loss_and_grad(Trace_ELBO())
    other_value, other_grad = loss_and_grad(TraceGraph_ELBO())
    np.testing.assert_allclose(other_value, value, rtol=1e-6)
    for name in grad:
        np.testing.assert_allclose(other_grad[name], grad[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)


@pytest.mark.parametrize(
    "model, data",
    [(gamma_poisson, COUNTS), pytest.param(conjugate_model, X, marks=pytest.mark.slow)],
)
def test_the_loss_is_minus_the_scaled_sum_of_the_chains_log_weights(model, data):
    """Trace_ELBO's loss with the guide is exactly -(N/B) Σ_i log w_i (plus the global
    terms): the guide's factor and Delta sites make each point's ELBO its UHA weight."""
    batch = 6
    observed_global = 0.0 if model is gamma_poisson else float(jax.scipy.stats.norm.logpdf(0.2))
    model = handlers.condition(model, {"mu": 0.2}) if model is conjugate_model else model
    guide = UHALocalGuide(model, K=3)
    params = SVI(model, guide, optax.adam(1e-2), Trace_ELBO()).run(
        jax.random.PRNGKey(0), 20, data, N, batch, progress_bar=False
    ).params
    idx = jnp.asarray([0, 2, 5, 8, 9, 23])
    key = jax.random.PRNGKey(11)
    sub = {"data": idx}
    guide_key = jax.random.split(key)[1]  # Trace_ELBO seeds the guide with this
    _, log_w, _ = handlers.seed(
        handlers.substitute(lambda: guide._body((data, N, batch), {}), data={**params, **sub}),
        guide_key,
    )()
    loss = Trace_ELBO().loss(
        key, params, handlers.substitute(model, data=sub),
        handlers.substitute(guide, data=sub), data, N, batch,
    )
    # the conditioned global mu's prior term enters the model's log density too
    np.testing.assert_allclose(
        loss, -(N / batch) * float(jnp.sum(log_w)) - observed_global, rtol=1e-5
    )


def _encoder(x):
    w = numpyro.param("enc_w", jnp.full((1, 2), 0.1))
    b = numpyro.param("enc_b", jnp.zeros(2))
    h = x[:, None] @ w + b
    return h[:, :1], jax.nn.softplus(h[:, 1:]) + 0.1


def test_log_z_given_global_values_is_that_of_the_model_conditioned_on_them():
    """With global latents, log_weights/log_z at global_values= run the chains of
    log p(x_i, z_i | mu): the same weights as the guide of the model conditioned on mu,
    key for key, and log_z within its standard errors of the exact log p(x_i | mu)."""
    mu, batch = 0.4, 8
    conditioned = handlers.condition(conjugate_model, {"mu": mu})
    plain_guide = UHALocalGuide(conditioned, K=4)
    params = perturbed_params(conditioned, plain_guide, 0, X, N, batch)
    guide = UHALocalGuide(conjugate_model, K=4)
    SVI(conjugate_model, guide, optax.adam(1e-3), Trace_ELBO()).init(
        jax.random.PRNGKey(0), X, N, batch
    )
    idx = jnp.arange(5, 13)
    key = jax.random.PRNGKey(3)
    expected = plain_guide.log_weights(key, params, X, N, batch, num_samples=400, subsample_idx=idx)
    given = guide.log_weights(
        key, params, X, N, batch, num_samples=400, subsample_idx=idx, global_values={"mu": mu}
    )
    np.testing.assert_allclose(given, expected, rtol=1e-6, atol=1e-5)
    result = guide.log_z(
        key, params, X, N, batch, num_samples=400, subsample_idx=idx, global_values={"mu": mu}
    )
    exact = np.asarray(exact_log_marginal(X[idx], mu))
    assert np.all(np.abs(result.log_z - exact) < 4 * result.se + 1e-3)
    np.testing.assert_allclose(result.total, exact.sum(), atol=4 * result.total_se)
    with pytest.raises(ValueError, match=r"pass global_values="):
        guide.log_z(key, params, X, N, batch, num_samples=4, subsample_idx=idx)
    with pytest.raises(ValueError, match=r"lacks the global latent site\(s\) \['mu'\]"):
        guide.log_z(key, params, X, N, batch, num_samples=4, subsample_idx=idx, global_values={})


def test_gradients_reach_the_encoder_and_svi_trains():
    batch = 8
    guide = UHALocalGuide(conjugate_model, K=4, encoder=_encoder)
    svi = SVI(conjugate_model, guide, optax.adam(1e-2), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), X, N, batch)
    params = svi.get_params(state)
    assert "local_loc" not in params and "enc_w" in params

    def loss(p):
        return Trace_ELBO().loss(jax.random.PRNGKey(4), p, conjugate_model, guide, X, N, batch)

    grads = jax.grad(loss)(params)
    for name in ("enc_w", "enc_b", "local_step_size", "mu_local_global_loc"):
        g = np.asarray(grads[name])
        assert np.all(np.isfinite(g)) and np.any(g != 0), name
    result = svi.run(jax.random.PRNGKey(1), 400, X, N, batch, progress_bar=False)
    assert np.all(np.isfinite(result.losses))
    assert np.mean(result.losses[-50:]) < np.mean(result.losses[:50])


def test_sample_posterior_and_predictive():
    batch = 8
    guide = UHALocalGuide(conjugate_model, K=3)
    svi = SVI(conjugate_model, guide, optax.adam(1e-2), Trace_ELBO())
    # the draws' shapes and errors need parameters, not a trained fit
    result = SimpleNamespace(params=svi.get_params(svi.init(jax.random.PRNGKey(0), X, N, batch)))
    idx = jnp.arange(8, 16)
    draws = guide.sample_posterior(
        jax.random.PRNGKey(1), result.params, X, N, batch, sample_shape=(7,), subsample_idx=idx
    )
    assert draws["z"].shape == (7, batch) and draws["mu"].shape == (7,)
    for empty in ((0,), (2, 0)):  # no draws: empty arrays of the draws' shapes
        draws = guide.sample_posterior(jax.random.PRNGKey(1), result.params, X, N, batch,
                                       sample_shape=empty, subsample_idx=idx)
        assert draws["z"].shape == empty + (batch,) and draws["mu"].shape == empty
    with pytest.raises(ValueError, match=r"subsample_idx="):
        guide.sample_posterior(jax.random.PRNGKey(1), result.params, X, N, batch)
    with pytest.raises(ValueError, match=r"shape \(8,\)"):
        guide.sample_posterior(
            jax.random.PRNGKey(1), result.params, X, N, batch, subsample_idx=jnp.arange(3)
        )
    pred = Predictive(
        conjugate_model, guide=guide, params=result.params, num_samples=5,
        return_sites=["z", "x"],
    )(
        jax.random.PRNGKey(2), X, N, batch
    )
    assert pred["z"].shape == (5, batch) and pred["x"].shape == (5, batch)
    # full data: no subsample_idx needed
    full = guide.sample_posterior(jax.random.PRNGKey(1), result.params, X, N, N)
    assert full["z"].shape == (N,)


def batch_model(x_batch, num_data):
    """A VAE-shaped model: passed its minibatch, the plate sized by the data set."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", num_data, subsample_size=x_batch.shape[0]):
        z = numpyro.sample("z", dist.Normal(mu, 1.0))
        numpyro.sample("x", dist.Normal(z, SIGMA), obs=x_batch)


def test_an_amortized_guide_on_a_minibatch_model_draws_without_subsample_idx():
    """Encoder + shared parameters + a model passed its minibatch: the plate's indices
    change nothing, so draws need no subsample_idx (and equal those with any indices).
    A model that indexes its data with the plate still needs them."""
    batch = 6
    guide = UHALocalGuide(batch_model, K=3, encoder=_encoder)
    svi = SVI(batch_model, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X[:batch], N))
    key = jax.random.PRNGKey(1)
    plain = guide.sample_posterior(key, params, X[:batch], N, sample_shape=(4,))
    given = guide.sample_posterior(
        key, params, X[:batch], N, sample_shape=(4,), subsample_idx=jnp.arange(10, 16)
    )
    assert plain["z"].shape == (4, batch)
    np.testing.assert_array_equal(plain["z"], given["z"])
    assert guide.log_weights(key, params, X[:batch], N, num_samples=3).shape == (3, batch)
    indexing = UHALocalGuide(conjugate_model, K=3, encoder=_encoder)
    svi = SVI(conjugate_model, indexing, optax.adam(1e-2), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, N, batch))
    with pytest.raises(ValueError, match=r"pass subsample_idx="):
        indexing.sample_posterior(key, params, X, N, batch, sample_shape=(4,))


def test_per_data_point_parameters():
    guide = UHALocalGuide(conjugate_model, K=3, per_data_point=True)
    svi = SVI(conjugate_model, guide, optax.adam(1e-2), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), X, N, 6)
    before = svi.get_params(state)
    assert before["local_step_size"].shape == (N,)
    assert before["local_beta_logits"].shape == (N, 4)
    state, loss = svi.update(state, X, N, 6)
    assert np.isfinite(float(loss))
    # only the minibatch's entries move at a step
    moved = np.asarray(svi.get_params(state)["local_step_size"] != before["local_step_size"])
    assert moved.sum() == 6
    # and those are the minibatch's data points: the loss's gradient, with the plate's
    # indices fixed, is non-zero exactly at them (for q's and the annealing parameters)
    idx = jnp.asarray([17, 2, 9, 23, 0, 11])
    fixed = lambda fn: handlers.substitute(fn, data={"data": idx})  # noqa: E731
    unconstrained = svi.optim.get_params(state.optim_state)
    grads = jax.grad(
        lambda p: Trace_ELBO().loss(
            jax.random.PRNGKey(1), p, fixed(conjugate_model), fixed(guide), X, N, 6
        )
    )(svi.constrain_fn(unconstrained))
    for name in ("local_step_size", "local_damping", "local_loc", "local_scale"):
        nonzero = np.flatnonzero(np.any(np.reshape(grads[name], (N, -1)) != 0, axis=1))
        np.testing.assert_array_equal(nonzero, np.sort(idx), err_msg=name)


def _features_model(dim):
    """z_i ~ N(mu, 1), four features y_ij ~ N(z_i, 1), the data plate at ``dim``."""
    inner = -1 if dim == -2 else None

    def model(y, batch):
        mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
        with numpyro.plate("data", y.shape[0], subsample_size=batch, dim=dim):
            rows = numpyro.subsample(y, event_dim=0 if inner else 1)
            z = numpyro.sample("z", dist.Normal(mu, 1.0))
            if inner:
                with numpyro.plate("features", y.shape[1], dim=inner):
                    numpyro.sample("y", dist.Normal(z, 1.0), obs=rows)
            else:
                numpyro.sample("y", dist.Normal(z[..., None], 1.0).to_event(1), obs=rows)

    return model


# shared annealing parameters (False, 19 s) with -m slow; per data point, the layout
# that moves with the plate's dim, stays in the default suite
@pytest.mark.parametrize("per_data_point", [pytest.param(False, marks=pytest.mark.slow), True])
def test_a_data_plate_at_dim_minus_two_fits_as_at_dim_minus_one(per_data_point):
    """The same model written with the data plate at dim=-2 (and a feature plate at -1)
    and at dim=-1: same parameters, losses and draws (z with the model's shapes)."""
    y = jnp.asarray(np.random.default_rng(3).normal(size=(20, 4)) + 1.0)
    results = []
    for dim in (-1, -2):
        model = _features_model(dim)
        guide = UHALocalGuide(model, K=3, per_data_point=per_data_point)
        svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
        run = svi.run(jax.random.PRNGKey(0), 20, y, 5, progress_bar=False)
        draws = guide.sample_posterior(
            jax.random.PRNGKey(1), run.params, y, 5, sample_shape=(3,),
            subsample_idx=jnp.arange(2, 7),
        )
        results.append((run, draws))
    (run1, draws1), (run2, draws2) = results
    assert draws2["z"].shape == (3, 5, 1) and draws1["z"].shape == (3, 5)
    np.testing.assert_allclose(run2.losses, run1.losses, rtol=1e-5)
    for name, value in run1.params.items():
        np.testing.assert_allclose(run2.params[name], value, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(draws2["z"][..., 0], draws1["z"], rtol=1e-5, atol=1e-6)
    assert np.isfinite(np.asarray(run2.losses)).all()


def two_plates(x):
    with numpyro.plate("a", 10, subsample_size=2):
        numpyro.sample("u", dist.Normal(0, 1))
    with numpyro.plate("b", 10, subsample_size=3):
        numpyro.sample("v", dist.Normal(0, 1))


def discrete_local(x):
    with numpyro.plate("data", 10, subsample_size=2):
        c = numpyro.sample("c", dist.Bernoulli(0.5))
        numpyro.sample("x", dist.Normal(c, 1), obs=jnp.zeros(2))


def local_outside(x):
    z = numpyro.sample("z", dist.Normal(0, 1).expand([2]))
    with numpyro.plate("data", 10, subsample_size=2):
        w = numpyro.sample("w", dist.Normal(0, 1))
        numpyro.sample("x", dist.Normal(z + w, 1), obs=jnp.zeros(2))


def no_local(x):
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    with numpyro.plate("data", 10, subsample_size=2):
        numpyro.sample("x", dist.Normal(mu, 1), obs=jnp.zeros(2))


@pytest.mark.parametrize(
    "model, message",
    [
        (two_plates, r"subsamples 2 plates \['a', 'b'\]"),
        (discrete_local, r"local site 'c' is discrete"),
        (local_outside, r"latent site 'z' has the minibatch's size"),
        (no_local, r"plate 'data' has no latent sample sites"),
    ],
)
def test_clear_errors(model, message):
    guide = UHALocalGuide(model, K=2)
    with pytest.raises(ValueError, match=message):
        handlers.seed(guide, 0)(None)


def indexed_groups(group, y):
    """Group effects in one plate, observations in another indexing them: the
    likelihood is outside the plate of locals."""
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    with numpyro.plate("groups", 4):
        a = numpyro.sample("a", dist.Normal(mu, 1))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(a[group], 1), obs=y)


def global_after_locals(group, y):
    with numpyro.plate("groups", 4):
        a = numpyro.sample("a", dist.Normal(0, 1))
        numpyro.sample("y", dist.Normal(a, 1), obs=y[:4])
    numpyro.sample("total", dist.Normal(jnp.sum(a), 1))


def factor_outside(group, y):
    with numpyro.plate("groups", 4):
        a = numpyro.sample("a", dist.Normal(0, 1))
        numpyro.sample("y", dist.Normal(a, 1), obs=y[:4])
    numpyro.factor("sum_to_zero", -10.0 * jnp.sum(a) ** 2)


def global_after_plate_alone(group, y):
    """Sampled after the plate but independent of its locals: accepted."""
    with numpyro.plate("groups", 4):
        a = numpyro.sample("a", dist.Normal(0, 1))
        numpyro.sample("y", dist.Normal(a, 1), obs=y[:4])
    s = numpyro.sample("s", dist.HalfNormal(1))
    numpyro.sample("y_rest", dist.Normal(0, s).expand([y.shape[0] - 4]).to_event(1), obs=y[4:])


@pytest.mark.parametrize(
    "model, dependent",
    [(indexed_groups, "'y'"), (global_after_locals, "'total'"), (factor_outside, "'sum_to_zero'")],
)
def test_sites_outside_the_plate_that_depend_on_its_locals_are_refused(model, dependent):
    """Each chain targets the sites inside the plate: a term of the locals outside it
    would be silently missing from the chains and log_z."""
    group = jnp.arange(12) % 4
    y = jnp.linspace(-1.0, 1.0, 12)
    guide = UHALocalGuide(model, K=2, subsample_plate="groups")
    with pytest.raises(ValueError, match=rf"site\(s\) \[{dependent}\] outside the plate 'groups' depend on its local latent\(s\) \['a'\]"):
        handlers.seed(guide, 0)(group, y)
    if model is indexed_groups:  # the same data, the likelihood inside the plate: accepted
        accepted = UHALocalGuide(global_after_plate_alone, K=2, subsample_plate="groups")
        handlers.seed(accepted, 0)(group, y)


@pytest.mark.parametrize("form", ["class", "instance", "factory"])
def test_a_uha_global_guide_is_refused_with_the_reason(form):
    """A UHAGuide for the globals would anneal to their prior (the likelihood is in the
    hidden sites): refused, as a class, an instance or a factory's output."""
    from numpyro_uha import UHAGuide

    hidden = handlers.block(conjugate_model, hide=["z", "x"])
    choice = {
        "class": UHAGuide,
        "instance": UHAGuide(hidden, K=2),
        "factory": lambda model: UHAGuide(model, K=2),
    }[form]
    with pytest.raises(TypeError, match=r"global_guide=UHAGuide .*anneal to the global latents' prior"):
        guide = UHALocalGuide(conjugate_model, K=2, global_guide=choice)
        handlers.seed(guide, 0)(X, N, 6)


def test_encoder_shape_error_names_the_shapes():
    def bad_encoder(x):
        return jnp.zeros((x.shape[0], 3)), jnp.ones((x.shape[0], 3))

    guide = UHALocalGuide(conjugate_model, K=2, encoder=bad_encoder)
    with pytest.raises(ValueError, match=r"shape \(6, 1\).*got \(6, 3\)"):
        handlers.seed(guide, 0)(X, N, 6)


@pytest.mark.slow
@pytest.mark.parametrize("precondition", [False, True])
def test_hierarchical_model_with_many_groups_matches_the_exact_posterior(precondition):
    """1000 groups, subsample 64: the global mean's and the groups' posterior means and
    sds against the exact (conjugate) posterior, within 0.2 sd and 20 % (every group;
    the Monte Carlo error of 2000 draws is inside these)."""
    groups, per_group, tau, sigma, batch = 1000, 3, 0.8, 1.0, 64
    rng = np.random.default_rng(5)
    true_z = 1.0 + tau * rng.normal(size=groups)
    y = jnp.asarray(true_z[:, None] + sigma * rng.normal(size=(groups, per_group)))

    def model(y, batch):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        with numpyro.plate("groups", groups, subsample_size=batch) as idx:
            z = numpyro.sample("z", dist.Normal(mu, tau))
            with numpyro.plate("obs", per_group, dim=-2):
                numpyro.sample("y", dist.Normal(z, sigma), obs=y[idx].T)

    # exact posterior: y_g-bar | mu ~ N(mu, tau² + σ²/n); z_g | mu, y ~ Gaussian
    ybar = np.asarray(y.mean(1))
    v = tau**2 + sigma**2 / per_group
    post_prec = 1 / 25 + groups / v
    mu_mean, mu_var = (ybar.sum() / v) / post_prec, 1 / post_prec
    shrink = (sigma**2 / per_group) / v  # weight of mu in E[z_g | mu, y]
    z_mean = shrink * mu_mean + (1 - shrink) * ybar
    z_var = (tau**2 * sigma**2 / per_group) / v + shrink**2 * mu_var

    guide = UHALocalGuide(model, K=4, init_scale=0.5, precondition=precondition)
    # Stochastic (minibatch) gradients: a decaying learning rate (Robbins-Monro), as for
    # any subsampled SVI; at a constant 1e-2 the global mean wandered by
    # ~1.4 posterior sd (measured).
    steps = 20000  # at 6000 q(mu)'s sd was still 29 % too wide (converging: 3 % at 20000)
    schedule = optax.exponential_decay(1e-2, steps, 0.01)
    svi = SVI(model, guide, optax.adam(schedule), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), steps, y, batch, progress_bar=False)
    idx_all = jnp.arange(groups)
    num_draws = 2000  # the MC error of a mean is 0.022 sd, its max over 1000 groups ~0.08
    zs, mus = [], []
    for k in range(0, groups, batch * 5):
        sel = idx_all[k:k + batch * 5]
        if sel.shape[0] < batch * 5:
            sel = jnp.concatenate([sel, idx_all[: batch * 5 - sel.shape[0]]])
        d = guide.sample_posterior(
            jax.random.PRNGKey(k), result.params, y, batch * 5, sample_shape=(num_draws,),
            subsample_idx=sel,
        )
        zs.append((np.asarray(sel), np.asarray(d["z"])))
        mus.append(np.asarray(d["mu"]))
    mu_draws = np.concatenate(mus)
    z_means, z_sds = np.zeros(groups), np.zeros(groups)
    for sel, d in zs:
        z_means[sel] = d.mean(0)
        z_sds[sel] = d.std(0)
    err = np.abs(z_means - z_mean) / np.sqrt(z_var)
    ratio = z_sds / np.sqrt(z_var)
    assert abs(mu_draws.mean() - mu_mean) < 0.2 * math.sqrt(mu_var)
    assert abs(mu_draws.std() / math.sqrt(mu_var) - 1) < 0.2
    assert np.max(err) < 0.2, np.max(err)
    assert np.all(np.abs(ratio - 1) < 0.2), (ratio.min(), ratio.max())


def _narrow_model(x, s, num_data, batch):
    """z_i ~ N(0, 1), x_i ~ N(z_i, s_i²): data point i's posterior sd is about s_i, so a
    leapfrog step far above s_i diverges for that data point alone."""
    with numpyro.plate("data", num_data, subsample_size=batch) as idx:
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
        numpyro.sample("x", dist.Normal(z, s[idx]), obs=x[idx])


def _narrow_setup(s0, per_data_point=False, lr=1e-3):
    """``(guide, svi, state, args)`` on 8 data points, data point 0's posterior sd about
    ``s0``, the others' 0.5."""
    n = 8
    x = jnp.asarray(np.random.default_rng(0).normal(size=n))
    s = jnp.full(n, 0.5).at[0].set(s0)
    # not preconditioned: ε starts at 0.02 in the model's units, whatever q_i's scale
    guide = UHALocalGuide(_narrow_model, K=4, per_data_point=per_data_point, precondition=False)
    args = (x, s, n, n)
    svi = SVI(_narrow_model, guide, optax.adam(lr), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), *args)
    return guide, svi, state, args


@pytest.mark.slow
def test_preconditioned_steps_follow_each_data_points_q():
    """The divergence tests' set-up (data point 0's posterior sd 0.002, the others' 0.5,
    ε = 0.02) with precondition=True: each chain steps in units of its own
    q_i's sd, so data point 0's chain runs (not preconditioned, it diverges: the tests
    below), and trains: its q narrows, every chain finite and its bound near log p(x_0)."""
    n = 8
    x = jnp.asarray(np.random.default_rng(0).normal(size=n))
    s = jnp.full(n, 0.5).at[0].set(2e-3)
    args = (x, s, n, n)
    idx = jnp.arange(n)
    key = jax.random.PRNGKey(1)
    for precondition in (False, True):
        guide = UHALocalGuide(_narrow_model, K=4, precondition=precondition)
        svi = SVI(_narrow_model, guide, optax.adam(2e-2), Trace_ELBO())
        state = svi.init(jax.random.PRNGKey(0), *args)
        log_w = np.asarray(guide.log_weights(key, svi.get_params(state), *args, num_samples=8,
                                             subsample_idx=idx))
        assert (np.all(log_w[:, 0] < -1e4)) == (not precondition), precondition
    update = jax.jit(lambda state: svi.update(state, *args))
    for _ in range(500):
        state, _ = update(state)
    params = svi.get_params(state)
    log_w = np.asarray(guide.log_weights(key, params, *args, num_samples=64, subsample_idx=idx))
    assert np.all(np.isfinite(log_w)) and log_w[:, 0].mean() > -20
    assert float(params["local_scale"][0, 0]) < 0.5 * guide.init_scale  # narrowing (from 0.1)


def _step_backoff_removed(guide):
    """The guide as it would be without the back-off term (for comparing loss values)."""
    import numpyro_uha.local as local_module

    def run(*args, **kwargs):
        original = local_module._step_backoff
        local_module._step_backoff = lambda values: 0.0
        try:
            return guide(*args, **kwargs)
        finally:
            local_module._step_backoff = original

    return run


def _start_elbo_gradient(guide, params, args, key, i):
    """The gradient in (q_i's loc, q_i's scale) of minus data point i's plain ELBO term
    log p(x_i, z_1) − log q_i(z_1) at its chain's start z_1 = loc + scale · e under the
    key ``Trace_ELBO().loss(key, ...)`` gives the guide (written out per point here)."""
    x, s = args[0], args[1]
    guide_key = jax.random.split(key)[1]  # Trace_ELBO seeds the guide with this
    rows_key = handlers.seed(lambda: numpyro.prng_key(), guide_key)()
    keys = jax.random.split(rows_key, args[2])
    annealing = guide.get_annealing_params(params, *args, subsample_idx=jnp.arange(args[2]))
    row = annealing._replace(loc=annealing.loc[i], scale=annealing.scale[i])

    def target(z):
        return jax.scipy.stats.norm.logpdf(z[0], 0.0, 1.0) + jax.scipy.stats.norm.logpdf(
            x[i], z[0], s[i])

    _, log_w, info = annealed_sample(keys[i], target, row, integrator=guide.integrator)
    noise = (info.initial_position - row.loc) / row.scale

    def minus_elbo(loc, scale):
        z = loc + scale * noise
        return -(target(z) - jnp.sum(jax.scipy.stats.norm.logpdf(z, loc, scale)))

    return log_w, jax.grad(minus_elbo, (0, 1))(row.loc, row.scale)


def test_a_diverged_chain_gives_no_gradient_and_its_loss_shows():
    """Data point 0's chain diverges (ε = 0.02 against a posterior sd of 0.002: energy
    errors of 1e15 nats, finite): its gradient, 1e16 and more, is skipped; the training
    gradient is then exactly that of the loss with data point 0 masked out, plus the
    back-off's and, for q_0, the gradient of data point 0's plain ELBO term at its
    chain's start (so a q_i whose chain diverges still moves); the loss still shows the
    divergence."""
    guide, svi, state, args = _narrow_setup(2e-3)
    params = svi.get_params(state)
    key = jax.random.PRNGKey(1)
    log_w = guide.log_weights(key, params, *args, num_samples=4, subsample_idx=jnp.arange(8))
    assert np.all(np.asarray(log_w[:, 0]) < -1e6) and np.all(np.asarray(log_w[:, 1:]) > -100)

    def loss(p, model, guide):
        return Trace_ELBO().loss(key, p, model, guide, *args)

    grads = jax.grad(loss)(params, _narrow_model, guide)
    keep = jnp.arange(8) != 0
    masked = jax.grad(loss)(
        params, handlers.mask(_narrow_model, mask=keep), handlers.mask(guide, mask=keep)
    )
    assert grads.keys() == masked.keys()
    # the latch's loss gradient: (N/B) × the number of diverged chains (1, N = B)
    assert float(grads.pop("local_diverged")) == 1.0
    assert float(masked.pop("local_diverged")) == 0.0
    # and the back-off: gradient 1 in the diverged chain's log per-coordinate step
    # log ε + mean_j log(δ_j / m_j), nothing else (shared parameters; N = B)
    d = params["local_drift_scale"].shape[-1]
    backoff = {
        "local_step_size": 1.0 / params["local_step_size"],
        "local_drift_scale": 1.0 / (d * params["local_drift_scale"]),
        "local_momentum_scale": -1.0 / (d * params["local_momentum_scale"]),
    }
    # q_0's plain ELBO gradient at its chain's start (the same noise as the guide's)
    _, (loc_grad, scale_grad) = _start_elbo_gradient(guide, params, args, key, 0)
    fallback = {
        "local_loc": jnp.zeros_like(params["local_loc"]).at[0].set(loc_grad),
        "local_scale": jnp.zeros_like(params["local_scale"]).at[0].set(scale_grad),
    }
    assert float(jnp.abs(loc_grad).sum() + jnp.abs(scale_grad).sum()) > 0
    for name in grads:
        assert np.all(np.isfinite(np.asarray(grads[name]))), name
        expected = masked[name] + backoff.get(name, 0.0) + fallback.get(name, 0.0)
        np.testing.assert_allclose(grads[name], expected, rtol=1e-5, atol=1e-5, err_msg=name)
    assert float(loss(params, _narrow_model, guide)) > 1e6  # the divergence is not hidden
    # chains that did not diverge get no back-off: with data point 0 masked out, the
    # gradient is that of the guide without it
    no_backoff = _step_backoff_removed(guide)
    masked_plain = jax.grad(loss)(
        params, handlers.mask(_narrow_model, mask=keep), handlers.mask(no_backoff, mask=keep)
    )
    masked_plain.pop("local_diverged")
    for name in masked:
        np.testing.assert_allclose(masked[name], masked_plain[name], rtol=1e-6, err_msg=name)
    # the back-off adds nothing to the loss's value
    np.testing.assert_allclose(
        float(loss(params, _narrow_model, guide)), float(loss(params, _narrow_model, no_backoff)),
        rtol=1e-6,
    )
    # and the latch reports it where the parameters are concrete
    state, _ = jax.jit(lambda state: svi.update(state, *args))(state)
    with pytest.warns(UHADivergenceWarning, match="UHALocalGuide: some data points' chains"):
        svi.get_params(state)


def test_training_without_divergences_leaves_the_latch_at_zero():
    guide, svi, state, args = _narrow_setup(0.5)  # every data point alike, no divergence
    state, _ = jax.jit(lambda state: svi.update(state, *args))(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UHADivergenceWarning)
        params = svi.get_params(state)
    assert float(params["local_diverged"]) == 0.0


def test_a_nonfinite_chain_skips_the_step_and_training_goes_on():
    """Data point 0's chain overflows (NaN through the leapfrog's derivatives): the
    chains' parameters skip that step (zero gradient) instead of turning NaN, but for
    the back-off, which lowers the leapfrog step (ε, δ down, Σ up)."""
    guide, svi, state, args = _narrow_setup(1e-7)
    params = svi.get_params(state)
    log_w = guide.log_weights(
        jax.random.PRNGKey(1), params, *args, num_samples=2, subsample_idx=jnp.arange(8)
    )
    assert not np.all(np.isfinite(np.asarray(log_w[:, 0])))  # the set-up: it overflows
    update = jax.jit(lambda state: svi.update(state, *args))  # sizes stay static
    for _ in range(3):
        state, _ = update(state)
    with pytest.warns(UHADivergenceWarning):
        after = svi.get_params(state)
    assert float(after.pop("local_diverged")) != 0.0  # the latch moved
    lowered = {"local_step_size": -1, "local_drift_scale": -1, "local_momentum_scale": 1}
    for name, value in after.items():
        assert np.all(np.isfinite(np.asarray(value))), name
        if name in lowered:  # backed off, every coordinate
            moved = np.sign(np.asarray(value) - np.asarray(params[name]))
            assert np.all(moved == lowered[name]), name
        else:
            np.testing.assert_array_equal(value, params[name], err_msg=name)  # skipped


def test_a_q_far_from_its_posterior_moves_toward_it_while_its_chain_diverges():
    """Data point 0's posterior is at ≈ 20 with sd 0.02, q_0 starts at the prior's median 0:
    the force there (≈ 5e4) makes its chain diverge, whatever the step, so no gradient
    comes through the chain. q_0 gets its plain ELBO term's gradient instead and moves
    toward its posterior at Adam's pace (at most ≈ 0.05 per step here); without it, q_0
    stayed at ≈ 0.2 (no gradient ever reached it)."""
    n, steps, lr = 8, 100, 5e-2
    x = jnp.asarray(np.random.default_rng(0).normal(size=n)).at[0].set(20.0)
    s = jnp.full(n, 0.5).at[0].set(0.02)
    args = (x, s, n, n)
    guide = UHALocalGuide(_narrow_model, K=4, precondition=False)
    svi = SVI(_narrow_model, guide, optax.adam(lr), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), *args)
    start = float(svi.get_params(state)["local_loc"][0, 0])
    update = jax.jit(lambda state: svi.update(state, *args))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UHADivergenceWarning)
        for _ in range(steps):
            state, _ = update(state)
        params = svi.get_params(state)
    assert float(params["local_diverged"]) != 0.0  # the set-up: its chain diverged
    moved = float(params["local_loc"][0, 0]) - start
    assert moved > 0.5 * steps * lr, moved  # more than half of Adam's largest move


def test_a_data_point_whose_own_step_diverges_backs_off_and_recovers():
    """Per-data-point parameters: data point 0's posterior sd is 0.005 and its leapfrog
    step 0.02, over the stability limit 2 × 0.005, so its chain diverges and gives no
    gradient through the chain. The back-off lowers its own step until the chain runs;
    then it trains (without the back-off it would stay diverged: no gradient ever reaches
    its step). While it diverges q_0 gets its plain ELBO term's gradient, large for so
    narrow a posterior, which Adam's second moments keep for a while: recovery takes
    about 300 steps here (about 100 without that gradient)."""
    guide, svi, state, args = _narrow_setup(5e-3, per_data_point=True, lr=5e-2)
    key = jax.random.PRNGKey(1)
    idx = jnp.arange(args[2])
    start = svi.get_params(state)
    log_w = guide.log_weights(key, start, *args, num_samples=8, subsample_idx=idx)
    assert np.all(np.asarray(log_w[:, 0]) < -1e4)  # the set-up: it diverges
    update = jax.jit(lambda state: svi.update(state, *args))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UHADivergenceWarning)
        for _ in range(300):
            state, _ = update(state)
        params = svi.get_params(state)
    log_w = np.asarray(guide.log_weights(key, params, *args, num_samples=64, subsample_idx=idx))
    assert np.all(np.isfinite(log_w)) and log_w[:, 0].mean() > -20
    # its own per-coordinate step came under the stability limit, and q_0 narrowed
    step = params["local_step_size"][0] * params["local_drift_scale"][0, 0] / params[
        "local_momentum_scale"][0, 0]
    assert float(step) < 2 * 5e-3
    assert float(params["local_scale"][0, 0]) < 0.5 * float(start["local_scale"][0, 0])


@pytest.mark.parametrize("per_data_point", [True, False])
def test_the_divergence_warning_of_the_draws_advises_by_parametrization(per_data_point):
    """Data point 0's chain diverges at the start (its posterior sd 0.005, its step
    0.02): the draws name it and advise what helps; per data point, training on seldom
    does (see the test above), so that advice is not given there."""
    guide, svi, state, args = _narrow_setup(5e-3, per_data_point=per_data_point)
    params = svi.get_params(state)
    with pytest.warns(UHADivergenceWarning, match=r"at data point\(s\) \[0\]") as caught:
        guide.sample_posterior(jax.random.PRNGKey(1), params, *args, sample_shape=(4,))
    message = str(caught[0].message)
    assert ("precondition=True (steps in q_i's units)" in message) == per_data_point
    assert ("Train longer" in message) != per_data_point


def test_a_fitted_guide_with_global_latents_pickles_and_draws_the_same():
    """The global guide is fit on the model with the plate's sites hidden; that hidden
    model must pickle (NumPyro's ``block`` keeps a lambda), and the unpickled guide draws
    exactly what the original draws."""
    import pickle

    guide = UHALocalGuide(conjugate_model, K=3)
    args = (X, N, 6)
    svi = SVI(conjugate_model, guide, optax.adam(1e-2), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), 20, *args, progress_bar=False)
    idx = jnp.arange(6)
    key = jax.random.PRNGKey(4)
    before = guide.sample_posterior(key, result.params, *args, sample_shape=(5,), subsample_idx=idx)
    copy = pickle.loads(pickle.dumps(guide))
    after = copy.sample_posterior(key, result.params, *args, sample_shape=(5,), subsample_idx=idx)
    assert set(before) == set(after) >= {"mu", "z"}
    for name in before:
        np.testing.assert_array_equal(before[name], after[name], err_msg=name)


def _minibatch_passed(y_batch, num_data):
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    with numpyro.plate("data", num_data, subsample_size=y_batch.shape[0]):
        z = numpyro.sample("z", dist.Normal(mu, 1))
        numpyro.sample("y", dist.Normal(z, 1), obs=y_batch)


def _minibatch_indexed(y, batch):
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    with numpyro.plate("data", y.shape[0], subsample_size=batch) as idx:
        z = numpyro.sample("z", dist.Normal(mu, 1))
        numpyro.sample("y", dist.Normal(z, 1), obs=y[idx])


@pytest.mark.slow
def test_per_data_point_q_on_data_that_ignore_the_plates_indices_warns():
    """q_i is picked by the plate's indices: a model passed its minibatch (the indices
    unused) would train q_i on other data points' data. An encoder, or data indexed by
    the plate, are fine."""
    y = jnp.asarray(np.random.default_rng(0).normal(size=50))

    def setup_warnings(model, *args, **guide_kwargs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            handlers.seed(UHALocalGuide(model, K=2, **guide_kwargs), 0)(*args)
        return [str(w.message) for w in caught if "whichever data points" in str(w.message)]

    (message,) = setup_warnings(_minibatch_passed, y[:10], 50)
    assert "observed site(s) ['y'] of the plate 'data'" in message
    assert setup_warnings(_minibatch_indexed, y, 10) == []

    def encoder(y_batch):
        return jnp.zeros((y_batch.shape[0], 1)), jnp.ones((y_batch.shape[0], 1))

    assert setup_warnings(_minibatch_passed, y[:10], 50, encoder=encoder) == []


CENSOR = jnp.linspace(-1.0, 1.5, N)  # each data point's own lower bound
X_CENSORED = CENSOR + jnp.asarray(np.abs(np.random.default_rng(2).normal(size=N)), jnp.float32)


def censored(x, bound, num_data, batch):
    """z_i ~ N(0, 1) truncated to (c_i, ∞), c_i the data point's own bound."""
    with numpyro.plate("data", num_data, subsample_size=batch) as idx:
        z = numpyro.sample("z", dist.TruncatedNormal(0.0, 1.0, low=bound[idx]))
        numpyro.sample("x", dist.Normal(z, SIGMA), obs=x[idx])


@pytest.mark.parametrize(
    "setup", [pytest.param("minibatch", marks=pytest.mark.slow), "other bounds"]
)
def test_a_local_support_bounded_by_its_data_point_is_read_at_each_call(setup):
    """Set up on a minibatch of 6 (or on all 24 with other bounds), run on all 24: data
    point i's chain is core.annealed_sample on its own target in u = log(z_i − c_i)
    (c_i its own bound, not the setup's), and its draw is c_i + exp(u)."""
    guide = UHALocalGuide(censored, K=5, integrator="velocity_verlet", precondition=False)
    setup_args = (
        (X_CENSORED, CENSOR, N, 6) if setup == "minibatch" else (X_CENSORED, CENSOR - 0.7, N, N)
    )
    params = perturbed_params(censored, guide, 0, *setup_args)
    draws, log_w, keys, annealing = _all_rows(
        guide, params, (X_CENSORED, CENSOR, N, N), jax.random.PRNGKey(7)
    )
    for i in [0, 5, 17, 23]:
        def single(u, i=i):
            z = CENSOR[i] + jnp.exp(u[0])
            return (
                dist.TruncatedNormal(0.0, 1.0, low=CENSOR[i]).log_prob(z)
                + dist.Normal(z, SIGMA).log_prob(X_CENSORED[i]) + u[0]
            )
        row = annealing._replace(loc=annealing.loc[i], scale=annealing.scale[i])
        u_i, w_i, _ = annealed_sample(keys[i], single, row, integrator="velocity_verlet")
        np.testing.assert_allclose(draws["z"][i], CENSOR[i] + jnp.exp(u_i[0]), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(log_w[i], w_i, rtol=1e-5, atol=1e-4)


def bounded_by_a_global(x, num_data, batch):
    """z_i ~ Uniform(0, b), b a global latent."""
    b = numpyro.sample("b", dist.Exponential(0.3))
    with numpyro.plate("data", num_data, subsample_size=batch) as idx:
        z = numpyro.sample("z", dist.Uniform(0.0, b))
        numpyro.sample("x", dist.Normal(z, SIGMA), obs=x[idx])


def test_a_local_support_bounded_by_a_global_latent_moves_with_its_value():
    """The chains' target at b = 6 maps u to z = b · sigmoid(u) with that b's Jacobian,
    and every draw of z lies in (0, b) for the b drawn with it."""
    x = jnp.abs(X) + 0.5
    guide = UHALocalGuide(bounded_by_a_global, K=3)
    params = perturbed_params(bounded_by_a_global, guide, 0, x, N, 6)
    idx = jnp.arange(6)
    logdensity = guide.get_logdensity_fn(
        params, x, N, 6, subsample_idx=idx, global_values={"b": jnp.asarray(6.0)}
    )
    u = jnp.linspace(-2.0, 2.0, 6)[:, None]
    z = 6.0 * jax.nn.sigmoid(u[:, 0])
    expected = (
        dist.Uniform(0.0, 6.0).log_prob(z) + dist.Normal(z, SIGMA).log_prob(x[idx])
        + jnp.log(6.0) + jax.nn.log_sigmoid(u[:, 0]) + jax.nn.log_sigmoid(-u[:, 0])
    )
    np.testing.assert_allclose(logdensity(u), expected, rtol=1e-5, atol=1e-5)
    draws = guide.sample_posterior(jax.random.PRNGKey(1), params, x, N, N, sample_shape=(200,))
    assert np.std(draws["b"]) > 0.02
    assert np.all((draws["z"] > 0) & (draws["z"] < draws["b"][:, None]))


def test_log_z_names_the_data_points_whose_weights_are_heavy_tailed():
    """q_i far narrower than its posterior, off its mean, at data points 3 and 11 only:
    their weights are heavy-tailed (Pareto k̂ ≥ 0.7) and log_z warns naming them, in
    the minibatch's terms (the data points' indices); the others' k̂ stay below 0.7."""
    from numpyro_uha import UHAFitWarning

    model = handlers.condition(conjugate_model, {"mu": 0.4})
    guide = UHALocalGuide(model, K=4)
    params = perturbed_params(model, guide, 0, X, N, 6)
    params["local_scale"] = jnp.ones_like(params["local_scale"]).at[jnp.array([3, 11])].set(0.03)
    params["local_loc"] = params["local_loc"].at[jnp.array([3, 11])].add(1.5)
    idx = jnp.asarray([0, 3, 7, 11, 15, 20])
    with pytest.warns(UHAFitWarning, match=r"at 2 data point\(s\) \[3, 11\]"):
        est = guide.log_z(jax.random.PRNGKey(4), params, X, N, 6, num_samples=2000,
                          subsample_idx=idx)
    heavy = np.asarray(est.pareto_khat) >= 0.7
    np.testing.assert_array_equal(heavy, [False, True, False, True, False, False])
    assert "Pareto k̂ ≥ 0.7 at 2" in str(est)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UHAFitWarning)  # a fit whose weights are fine: silent
        params["local_scale"] = jnp.ones_like(params["local_scale"])
        params["local_loc"] = params["local_loc"].at[jnp.array([3, 11])].add(-1.5)
        guide.log_z(jax.random.PRNGKey(4), params, X, N, 6, num_samples=2000, subsample_idx=idx)
