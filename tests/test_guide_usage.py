"""UHAGuide used the NumPyro way: constrained sites, plates, deterministic sites, SVI
variants, Predictive, sample shapes, chunked draws, median/quantiles, the current
call's data, model parameters, frozen groups and the parameter prefix.

Compilation dominates the cost of these tests, so the Gaussian model below is fitted
once per worker (module fixture) and reused wherever a test only needs *some* trained
parameters. K is 2 or 3 everywhere.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Predictive, Trace_ELBO

from numpyro_uha import GROUPS, UHAGuide
from numpyro_uha.core import AnnealingParams

# ----------------------------------------------------------------------------- models

N_OBS = 20
PRIOR_SD = 10.0
Y1 = 1.5 + jax.random.normal(jax.random.PRNGKey(42), (N_OBS,))


def normal_model(y=None, n=N_OBS):
    """Conjugate mean model plus an independent vector latent in a plate of size 3.

    mu | y ~ Normal(sum(y) / (n + 1/PRIOR_SD²), (n + 1/PRIOR_SD²)^-1/2); theta | y ~ N(0, 1).
    """
    mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD))
    with numpyro.plate("groups", 3):
        theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    numpyro.deterministic("total", mu + theta)
    with numpyro.plate("data", n):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def posterior_mu(y):
    """Exact posterior mean and standard deviation of mu in ``normal_model``."""
    precision = 1.0 / PRIOR_SD**2 + y.shape[0]
    return float(jnp.sum(y) / precision), precision**-0.5


def constrained_model(y):
    """One latent site per support: positive, simplex, interval, correlation Cholesky."""
    scale = numpyro.sample("scale", dist.HalfNormal(1.0))
    probs = numpyro.sample("probs", dist.Dirichlet(jnp.ones(3)))
    shift = numpyro.sample("shift", dist.Uniform(-1.0, 2.0))
    corr_chol = numpyro.sample("corr_chol", dist.LKJCholesky(3, 2.0))
    x = numpyro.sample("x", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    loc = numpyro.deterministic("loc", shift + probs * x.sum())
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(corr_chol @ loc, scale).to_event(1), obs=y)


def offset_model(y):
    """A model with its own learnable parameter: the data's offset from mu."""
    offset = numpyro.param("offset", 0.0)
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu + offset, 1.0), obs=y)


def make_svi(model, guide, lr=5e-3, loss=None):
    return SVI(model, guide, optax.adam(lr), loss or Trace_ELBO())


def init_params(model, guide, *args):
    svi = make_svi(model, guide)
    return svi, svi.get_params(svi.init(jax.random.PRNGKey(0), *args))


def assert_all_finite(tree):
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        assert bool(jnp.all(jnp.isfinite(leaf))), f"non-finite values at {path}"


# ---------------------------------------------------------------------- fitted guide


@pytest.fixture(scope="module")
def fitted():
    """UHAGuide(K=3) trained on (Y1,): q is warm-started to convergence (the posterior
    is Gaussian, so plain VI is essentially exact here), then 200 UHA steps."""
    guide = UHAGuide(
        normal_model, K=3, warm_start_steps=200, warm_start_learning_rate=0.05
    )
    svi = make_svi(normal_model, guide, lr=5e-3)
    result = svi.run(jax.random.PRNGKey(0), 200, Y1, progress_bar=False)
    assert_all_finite(result.params)
    return guide, result.params


# ------------------------------------------------------------------ constrained sites


@pytest.mark.parametrize(
    "base_dist",
    [
        pytest.param("diagonal", id="diagonal", marks=pytest.mark.slow),
        pytest.param("cholesky", id="cholesky"),
    ],
)
def test_constrained_sites_stay_in_support(base_dist):
    y = jnp.array([[0.3, -0.2, 0.5], [0.1, 0.4, -0.3], [0.6, 0.0, 0.2]])
    # no warm start: the supports do not depend on q, and compiling it for this model
    # is slow
    guide = UHAGuide(constrained_model, K=2, warm_start_steps=0, base_dist=base_dist)
    _, params = init_params(constrained_model, guide, y)
    # 1 (scale) + 2 (3-simplex) + 1 (interval) + 3 (3x3 corr. Cholesky) + 2 (x)
    assert guide.latent_dim == 9
    assert ("auto_scale_tril" in params) == (base_dist == "cholesky")

    draws = guide.sample_posterior(jax.random.PRNGKey(1), params, y, sample_shape=(50,))
    assert set(draws) == {"scale", "probs", "shift", "corr_chol", "x", "loc"}
    assert_all_finite(draws)

    assert draws["scale"].shape == (50,)
    assert bool(jnp.all(draws["scale"] > 0))

    assert draws["probs"].shape == (50, 3)
    assert bool(jnp.all(draws["probs"] >= 0))
    np.testing.assert_allclose(draws["probs"].sum(-1), 1.0, atol=1e-5)

    assert draws["shift"].shape == (50,)
    assert bool(jnp.all((draws["shift"] > -1.0) & (draws["shift"] < 2.0)))

    chol = draws["corr_chol"]
    assert chol.shape == (50, 3, 3)
    np.testing.assert_array_equal(jnp.triu(chol, k=1), 0.0)
    assert bool(jnp.all(jnp.diagonal(chol, axis1=-2, axis2=-1) > 0))
    np.testing.assert_allclose(jnp.linalg.norm(chol, axis=-1), 1.0, atol=1e-5)

    assert draws["x"].shape == (50, 2)
    # the deterministic site is recomputed from the constrained draws
    assert draws["loc"].shape == (50, 3)
    np.testing.assert_allclose(
        draws["loc"],
        draws["shift"][:, None] + draws["probs"] * draws["x"].sum(-1, keepdims=True),
        rtol=1e-5,
        atol=1e-5,
    )


# --------------------------------------------------------- plates and deterministic


def test_plate_latent_and_deterministic_site_shapes(fitted):
    guide, params = fitted
    assert guide.latent_dim == 4  # mu + theta (plate of size 3)
    draws = guide.sample_posterior(jax.random.PRNGKey(1), params, Y1, sample_shape=(2, 3))
    assert set(draws) == {"mu", "theta", "total"}
    assert draws["mu"].shape == (2, 3)
    assert draws["theta"].shape == (2, 3, 3)
    assert draws["total"].shape == (2, 3, 3)
    np.testing.assert_allclose(
        draws["total"], draws["mu"][..., None] + draws["theta"], rtol=1e-6
    )


# ------------------------------------------------------------------------- Predictive


def test_predictive_with_guide_shapes(fitted):
    guide, params = fitted
    predictive = Predictive(
        normal_model,
        guide=guide,
        params=params,
        num_samples=7,
        return_sites=["mu", "theta", "total", "y"],
    )
    out = predictive(jax.random.PRNGKey(2), Y1)
    assert out["mu"].shape == (7,)
    assert out["theta"].shape == (7, 3)
    assert out["total"].shape == (7, 3)
    assert out["y"].shape == (7, N_OBS)  # the observed values (numpyro's semantics)
    assert_all_finite(out)
    np.testing.assert_allclose(out["total"], out["mu"][:, None] + out["theta"], rtol=1e-6)


@pytest.mark.parametrize("parallel", [False, True])
def test_predictive_without_the_data_predicts_from_the_training_posterior(fitted, parallel):
    """NumPyro's idiom Predictive(model, guide=guide, params=params, num_samples=n)(key,
    new inputs), y left out: the guide's chains run on the data it was set up with (the
    latent draws are those of the call given y, to the bit, with the same key), and the
    model runs at the call's arguments: y has the new size and is drawn around mu (its
    mean over the draws within 4 Monte Carlo standard errors of mu's)."""
    guide, params = fitted
    sites = ["mu", "theta", "total", "y"]
    predictive = Predictive(
        normal_model, guide=guide, params=params, num_samples=400, return_sites=sites,
        parallel=parallel,
    )
    key = jax.random.PRNGKey(2)
    given = predictive(key, Y1)
    np.testing.assert_array_equal(given["y"][0], Y1)  # observed: the data
    for args in [(), (None, 7)]:  # the training size, then 7 new points
        predicted = predictive(key, *args)
        for name in ("mu", "theta", "total"):
            np.testing.assert_array_equal(predicted[name], given[name])
        n = args[1] if args else N_OBS
        assert predicted["y"].shape == (400, n)
        residual = np.asarray(predicted["y"] - predicted["mu"][:, None]).reshape(-1)
        se = residual.std() / math.sqrt(residual.size)  # unit noise: independent entries
        assert abs(residual.mean()) < 4 * se, (residual.mean(), se)
        assert abs(residual.std() - 1.0) < 0.1  # y's noise sd is 1


def test_predictive_with_some_data_or_training_without_it_is_refused(fitted):
    """Only a values-only call that leaves out every observed site draws from the setup's
    data; training without y still names the site."""
    guide, params = fitted
    svi = make_svi(normal_model, guide, lr=5e-3)
    state = svi.init(jax.random.PRNGKey(0), Y1)
    with pytest.raises(ValueError, match=r"\['y'\] are unobserved in this call"):
        svi.update(state)


# ---------------------------------------------------------------------- sample shapes

SAMPLE_SHAPES = [
    pytest.param((), id="scalar"),
    pytest.param((5,), id="vector-5"),
    pytest.param((2, 3), id="matrix-2x3"),
]


@pytest.mark.parametrize("sample_shape", SAMPLE_SHAPES)
def test_sample_shapes(fitted, sample_shape):
    guide, params = fitted
    key = jax.random.PRNGKey(3)
    out = guide.sample_posterior_with_log_weights(key, params, Y1, sample_shape=sample_shape)
    assert set(out.samples) == {"mu", "theta", "total"}
    assert out.samples["mu"].shape == sample_shape
    assert out.samples["theta"].shape == sample_shape + (3,)
    assert out.samples["total"].shape == sample_shape + (3,)
    assert out.log_weights.shape == sample_shape
    assert out.latent.shape == sample_shape + (guide.latent_dim,)
    assert out.info.target_logdensity.shape == sample_shape + (guide.K,)
    assert_all_finite((out.log_weights, out.latent, out.samples))
    # mu is the first (unconstrained, real) coordinate of the latent vector
    np.testing.assert_allclose(out.latent[..., 0], out.samples["mu"], rtol=1e-6)
    if sample_shape == (2, 3):  # sample_posterior's (2, 3) draws are compiled anyway
        draws = guide.sample_posterior(key, params, Y1, sample_shape=sample_shape)
        for name, value in draws.items():
            np.testing.assert_allclose(value, out.samples[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sample_shape", [(0,), (0, 3), (2, 0)])
def test_no_draws_give_empty_arrays(fitted, sample_shape):
    """A zero in sample_shape gives empty arrays of the draws' shapes (as AutoNormal's
    sample_posterior does), concrete and inside jax.jit, not a division by zero."""
    guide, params = fitted
    key = jax.random.PRNGKey(4)
    draws = guide.sample_posterior_with_log_weights(key, params, Y1, sample_shape=sample_shape)
    assert draws.samples["mu"].shape == sample_shape
    assert draws.samples["theta"].shape == sample_shape + (3,)
    assert draws.log_weights.shape == sample_shape
    jitted = jax.jit(lambda k, p: guide.sample_posterior(k, p, Y1, sample_shape=sample_shape))
    assert jitted(key, params)["theta"].shape == sample_shape + (3,)


def test_draws_in_chunks_match_one_batch(fitted):
    guide, params = fitted
    chunked = UHAGuide(normal_model, K=3, warm_start_steps=0, sample_batch_size=7)
    init_params(normal_model, chunked, Y1)  # sets the guide up; its own params are unused
    key = jax.random.PRNGKey(4)
    # 20 draws, at most 7 at a time: three batches of 7, the last padded by one copy.
    # Full float32 matmuls: a GPU's default (TF32 on NVIDIA's Ampere and later) rounds to
    # ~5e-4 by a kernel chosen per batch width, which K steps carry into the draws.
    with jax.default_matmul_precision("float32"):
        small = chunked.sample_posterior(key, params, Y1, sample_shape=(20,))
        whole = guide.sample_posterior(key, params, Y1, sample_shape=(20,))
    assert small["mu"].shape == (20,)
    assert small["theta"].shape == (20, 3)
    assert_all_finite(small)
    # every draw depends on its own key only, so chunking must not change it
    for name in whole:
        np.testing.assert_allclose(small[name], whole[name], rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------- median/quantiles


def test_median_defaults_to_first_call_arguments(fitted):
    guide, params = fitted
    median = guide.median(params)
    assert set(median) == {"mu", "theta", "total"}  # latent and deterministic sites
    assert median["mu"].shape == ()
    assert median["theta"].shape == (3,)
    assert median["total"].shape == (3,)
    explicit = guide.median(params, Y1)
    for name in median:
        np.testing.assert_allclose(median[name], explicit[name])


def test_quantiles_shapes_and_order(fitted):
    guide, params = fitted
    quantiles = guide.quantiles(params, [0.1, 0.5, 0.9], Y1)
    assert set(quantiles) == {"mu", "theta", "total"}
    assert quantiles["mu"].shape == (3,)
    assert quantiles["theta"].shape == (3, 3)
    assert quantiles["total"].shape == (3, 3)
    for value in quantiles.values():
        assert bool(jnp.all(value[0] < value[1])) and bool(jnp.all(value[1] < value[2]))
    # the 0.5 quantile is the median (same default key and number of draws)
    median = guide.median(params, Y1)
    np.testing.assert_allclose(quantiles["mu"][1], median["mu"], rtol=1e-6)


# ---------------------------------------------------------- the current call's data


def test_posterior_mean_matches_analytic_on_training_data(fitted):
    guide, params = fitted
    num_draws = 1000
    mu = guide.sample_posterior(
        jax.random.PRNGKey(5), params, Y1, sample_shape=(num_draws,)
    )["mu"]
    mean, sd = posterior_mu(Y1)
    standard_error = float(jnp.std(mu)) / math.sqrt(num_draws)
    # 5 standard errors of Monte Carlo noise, plus 0.25 posterior sd of bias: q comes
    # from a finite stochastic plain-VI run and K = 3 uncorrected transitions only
    # shrink, not remove, q's error (UHA is not exact for finite K).
    assert abs(float(jnp.mean(mu)) - mean) < 5 * standard_error + 0.25 * sd
    # the spread is the posterior's up to the same kind of approximation error
    assert 0.6 * sd < float(jnp.std(mu)) < 1.4 * sd


def test_logdensity_uses_the_current_call_data(fitted):
    guide, params = fitted
    y2 = Y1 + 5.0
    z = jnp.array([0.7, -0.3, 0.2, 1.1])  # (mu, theta_1..3), all unconstrained

    def exact(y):
        return (
            dist.Normal(0.0, PRIOR_SD).log_prob(z[0])
            + dist.Normal(0.0, 1.0).log_prob(z[1:]).sum()
            + dist.Normal(z[0], 1.0).log_prob(y).sum()
        )

    for y in (Y1, y2):
        np.testing.assert_allclose(guide.get_logdensity_fn(params, y)(z), exact(y), rtol=1e-5)


def test_draws_follow_the_current_call_data(fitted):
    """Training used Y1; draws for Y1 + 5 must be pulled towards the new posterior.

    The guide's q (and its warm start) stay fitted to Y1, and K = 3 transitions move a
    draw only part of the way to a posterior 22 sds away, so the draws' mean lands
    between the two posteriors, not on the new one (a guide that froze the training
    data, like numpyro's AutoDAIS, would not move at all).
    """
    guide, params = fitted
    y2 = Y1 + 5.0
    num_draws = 1000
    key = jax.random.PRNGKey(5)
    mu1 = guide.sample_posterior(key, params, Y1, sample_shape=(num_draws,))["mu"]
    mu2 = guide.sample_posterior(key, params, y2, sample_shape=(num_draws,))["mu"]
    mean1, _ = posterior_mu(Y1)
    mean2, sd = posterior_mu(y2)
    # Same keys, so the differences are paired (for this linear-Gaussian target they are
    # in fact the same for every draw): the draws moved up by more than 1 posterior sd...
    diff = mu2 - mu1
    paired_se = float(jnp.std(diff)) / math.sqrt(num_draws)
    assert float(jnp.mean(diff)) > max(10 * paired_se, sd)
    # ...but not beyond the new posterior
    se2 = float(jnp.std(mu2)) / math.sqrt(num_draws)
    assert mean1 < float(jnp.mean(mu2)) < mean2 + 5 * se2


# ----------------------------------------------------------------- model parameters


def test_model_param_learned_with_vectorized_particles_and_progress_bar():
    y = 3.0 + jax.random.normal(jax.random.PRNGKey(7), (N_OBS,))
    guide = UHAGuide(offset_model, K=2, warm_start_steps=0)
    svi = make_svi(
        offset_model,
        guide,
        lr=0.05,
        loss=Trace_ELBO(num_particles=3, vectorize_particles=True),
    )
    result = svi.run(jax.random.PRNGKey(0), 100, y, progress_bar=True)
    assert result.losses.shape == (100,)
    assert_all_finite(result.losses)
    assert_all_finite(result.params)
    assert "offset" in result.params
    assert {"auto_loc", "auto_step_size"} <= set(result.params)
    # mu ~ N(0, 1) and the data sit at 3: the likelihood pushes the offset up from 0
    assert float(result.params["offset"]) > 0.2
    # get_logdensity_fn picks up the learned offset from params
    z = jnp.zeros(1)
    expected = dist.Normal(0.0, 1.0).log_prob(0.0) + dist.Normal(
        result.params["offset"], 1.0
    ).log_prob(y).sum()
    np.testing.assert_allclose(
        guide.get_logdensity_fn(result.params, y)(z), expected, rtol=1e-5
    )


# --------------------------------------------------------------------------- frozen


def test_frozen_groups_are_params_that_do_not_move_and_jitted_updates_train():
    guide = UHAGuide(normal_model, K=2, warm_start_steps=50, frozen=("q", "schedule"))
    svi = make_svi(normal_model, guide, lr=1e-2)
    state = svi.init(jax.random.PRNGKey(0), Y1)
    before = svi.get_params(state)
    annealing_before = guide.get_annealing_params(before)
    update = jax.jit(svi.update)
    for _ in range(5):
        state, loss = update(state, Y1)
        assert bool(jnp.isfinite(loss))
    params = svi.get_params(state)
    assert set(params) == set(before)
    # frozen groups are in params (the whole fit), with their values unchanged
    for name in ("auto_loc", guide._param_name("scale"), "auto_beta_logits"):
        np.testing.assert_array_equal(params[name], before[name])
    assert_all_finite(params)
    assert not np.allclose(params["auto_step_size"], before["auto_step_size"])

    annealing = guide.get_annealing_params(params)
    assert isinstance(annealing, AnnealingParams)
    # d = 4: a full-rank q by default (base_dist="auto")
    assert annealing.loc.shape == (4,) and annealing.scale.shape == (4, 4)
    assert annealing.step_sizes.shape == (2,)
    assert_all_finite(annealing)
    # frozen groups keep their initial values: q and the linear schedule
    np.testing.assert_allclose(annealing.loc, annealing_before.loc, rtol=1e-6)
    np.testing.assert_allclose(annealing.scale, guide.initial_q[1], rtol=1e-6)
    np.testing.assert_allclose(annealing.betas, [1 / 3, 2 / 3], rtol=1e-6)


def test_a_rebuilt_guide_uses_the_frozen_values_it_was_trained_with():
    # Frozen q comes from the setup (its warm start): a guide rebuilt and set up
    # otherwise (here without a warm start; on this Gaussian posterior the warm start
    # lands on the same q whatever the key) must still use the trained fit's q when
    # given its params.
    guide = UHAGuide(normal_model, K=2, warm_start_steps=50, frozen=("q",))
    svi = make_svi(normal_model, guide, lr=1e-2)
    result = svi.run(jax.random.PRNGKey(0), 5, Y1, progress_bar=False)
    rebuilt = UHAGuide(normal_model, K=2, warm_start_steps=0, frozen=("q",))
    make_svi(normal_model, rebuilt).init(jax.random.PRNGKey(7), Y1)
    assert not np.allclose(rebuilt.initial_q[0], guide.initial_q[0])
    key = jax.random.PRNGKey(3)
    a = guide.sample_posterior_with_log_weights(key, result.params, Y1, sample_shape=(8,))
    b = rebuilt.sample_posterior_with_log_weights(key, result.params, Y1, sample_shape=(8,))
    np.testing.assert_array_equal(a.log_weights, b.log_weights)


def test_everything_frozen_still_runs():
    guide = UHAGuide(normal_model, K=2, warm_start_steps=0, frozen=tuple(GROUPS))
    svi = make_svi(normal_model, guide)
    state = svi.init(jax.random.PRNGKey(0), Y1)
    before = svi.get_params(state)
    result = svi.run(jax.random.PRNGKey(0), 10, Y1, progress_bar=False)
    # nothing to learn: every group keeps its value, but the loss is still estimated
    for name, value in before.items():
        np.testing.assert_array_equal(result.params[name], value)
    assert result.losses.shape == (10,)
    assert_all_finite(result.losses)
    annealing = guide.get_annealing_params(result.params)
    assert isinstance(annealing, AnnealingParams)
    np.testing.assert_allclose(annealing.step_sizes, [0.25, 0.25], rtol=1e-6)
    np.testing.assert_allclose(annealing.damping, 0.9, rtol=1e-6)
    draws = guide.sample_posterior(jax.random.PRNGKey(1), result.params, Y1, sample_shape=(4,))
    assert draws["theta"].shape == (4, 3)
    assert_all_finite(draws)


# --------------------------------------------------------------------------- prefix


@pytest.mark.parametrize(
    "base_dist, scale_name",
    [
        pytest.param("diagonal", "custom_scale", id="diagonal"),
        pytest.param("cholesky", "custom_scale_tril", id="cholesky"),
    ],
)
def test_prefix_renames_params(base_dist, scale_name):
    guide = UHAGuide(normal_model, K=2, warm_start_steps=0, prefix="custom", base_dist=base_dist)
    _, params = init_params(normal_model, guide, Y1)
    expected = {
        "custom_" + short if short != "scale" else scale_name
        for group in GROUPS.values()
        for short in group
    } | {"custom_diverged"}
    assert set(params) == expected
    assert not any(name.startswith("auto_") for name in params)
    assert isinstance(guide.get_annealing_params(params), AnnealingParams)
