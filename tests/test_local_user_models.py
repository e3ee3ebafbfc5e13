"""UHALocalGuide on models and usages users write that the first tests did not cover:
a simplex local, a vector of globals in its own plate, a numpyro.factor in the plate,
Predictive without the data, NaN data, bad encoder outputs and indices, diverged draws,
and the Monte Carlo median and quantiles. Found by trying the guide as a new user would.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro import handlers
from numpyro.infer import SVI, Predictive, Trace_ELBO

from numpyro_uha import UHADivergenceWarning, UHAFitWarning, UHALocalGuide
from test_local import N, X, _narrow_setup, conjugate_model

ALPHA = jnp.array([1.0, 2.0, 0.5, 1.5])
COUNTS = jnp.asarray(
    np.random.default_rng(1).multinomial(12, [0.2, 0.3, 0.1, 0.4], size=30), jnp.float32
)


def dirichlet_multinomial(x, batch):
    with numpyro.plate("docs", x.shape[0], subsample_size=batch) as idx:
        theta = numpyro.sample("theta", dist.Dirichlet(ALPHA))
        numpyro.sample("x", dist.Multinomial(12, theta), obs=x[idx])


@pytest.mark.slow
def test_a_simplex_local_sets_up_and_its_weights_are_unbiased():
    """A Dirichlet per data point (q_i starts at the prior's median in unconstrained
    coordinates, a point of the simplex; a coordinate-wise median is not one, and the
    Multinomial refused it). E[w_i] = p(x_i), the Dirichlet-multinomial marginal, within
    the Monte Carlo error log_z reports (q wider than the posterior: finite variance)."""
    guide = UHALocalGuide(dirichlet_multinomial, K=3)
    svi = SVI(dirichlet_multinomial, guide, optax.adam(1e-2), Trace_ELBO())
    params = dict(svi.get_params(svi.init(jax.random.PRNGKey(0), COUNTS, 10)))
    params["local_scale"] = jnp.full_like(params["local_scale"], 2.0)
    idx = jnp.arange(6)
    est = guide.log_z(jax.random.PRNGKey(2), params, COUNTS, 6, num_samples=4000,
                      subsample_idx=idx)
    # the premise of a standard-error test: light-tailed weights (at sd 1, data point 0's
    # k̂ was 0.71 and its z-score -7.7 with another key)
    assert np.all(est.pareto_khat < 0.7), est.pareto_khat
    exact = dist.DirichletMultinomial(ALPHA, total_count=12).log_prob(COUNTS[idx])
    z = (est.log_z - np.asarray(exact)) / est.se
    assert np.all(np.abs(z) < 4), (est.log_z, exact, est.se)


def test_a_vector_of_globals_in_its_own_plate_the_size_of_the_minibatch():
    """beta lives in plate('features', 8), the minibatch has 8 data points too: beta is
    a global (its axis is the features plate's), not a local sampled outside the plate."""
    features = jnp.asarray(np.random.default_rng(0).normal(size=(40, 8)))
    y = features @ jnp.linspace(-1, 1, 8)

    def model(features, y, batch):
        with numpyro.plate("features", 8):
            beta = numpyro.sample("beta", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", 40, subsample_size=batch) as idx:
            u = numpyro.sample("u", dist.Normal(0.0, 0.1))
            numpyro.sample("y", dist.Normal(features[idx] @ beta + u, 1.0), obs=y[idx])

    guide = UHALocalGuide(model, K=2)
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), features, y, 8))
    assert params["local_loc"].shape == (40, 1)  # u is the only local


def test_a_factor_in_the_plate_is_not_the_encoders_input():
    seen = []

    def model(x, batch):
        with numpyro.plate("data", x.shape[0], subsample_size=batch) as idx:
            z = numpyro.sample("z", dist.Normal(0.0, 1.0))
            numpyro.factor("shrink", -0.1 * z**2)
            numpyro.sample("x", dist.Normal(z, 0.5), obs=x[idx])

    def encoder(x):
        seen.append(x)
        return x[:, None] * numpyro.param("w", jnp.ones(())), jnp.full((x.shape[0], 1), 0.5)

    guide = UHALocalGuide(model, K=2, encoder=encoder)
    SVI(model, guide, optax.adam(1e-2), Trace_ELBO()).init(jax.random.PRNGKey(0), X, 6)
    assert not isinstance(seen[0], dict) and seen[0].shape == (6,)


@pytest.fixture(scope="module")
def fitted():
    """A conjugate-model guide after 20 steps (shared: compiled once for the module)."""
    return _fit_conjugate()


def _fit_conjugate(steps=20, batch=6):
    guide = UHALocalGuide(conjugate_model, K=2)
    svi = SVI(conjugate_model, guide, optax.adam(1e-2), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), steps, X, N, batch, progress_bar=False)
    return guide, result.params


def test_clear_errors_for_bad_draw_arguments(fitted):
    guide, params = fitted
    key = jax.random.PRNGKey(1)
    with pytest.raises(ValueError, match=r"subsample_idx must index the 24 data points .*"
                       r"got values from 20 to 25"):
        guide.sample_posterior(key, params, X, N, 6, subsample_idx=jnp.arange(20, 26))
    with pytest.raises(ValueError, match=r"num_samples must be an integer >= 2"):
        guide.log_z(key, params, X, N, 6, num_samples=1, subsample_idx=jnp.arange(6),
                    global_values={"mu": 0.0})
    with pytest.raises(ValueError, match=r"global_values\['mu'\] must have the site's shape \(\)"):
        guide.log_z(key, params, X, N, 6, num_samples=8, subsample_idx=jnp.arange(6),
                    global_values={"mu": jnp.zeros(3)})
    # no model arguments (as AutoNormal's draw methods are often called): what to pass
    for call in (
        lambda: guide.sample_posterior(key, params, sample_shape=(2,)),
        lambda: guide.median(params, num_samples=2),
    ):
        with pytest.raises(TypeError, match=r"could not be run without arguments.*need the "
                           r"model's arguments.*The model said: .*missing"):
            call()


def test_predictive_without_the_data_says_how_to_draw_predictions():
    """The chains target p(x_i, z_i): without the data the guide cannot draw; the error
    names the site and the two-step route, which works."""
    def model(x, batch, y=None):
        a = numpyro.sample("a", dist.Normal(0.0, 2.0))
        with numpyro.plate("data", x.shape[0], subsample_size=batch) as idx:
            b = numpyro.sample("b", dist.Normal(0.0, 1.0))
            numpyro.sample("y", dist.Normal(a + x[idx] + b, 0.3),
                           obs=None if y is None else y[idx])

    x = X
    y = X * 2.0
    guide = UHALocalGuide(model, K=2)
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.run(jax.random.PRNGKey(0), 10, x, 6, y, progress_bar=False).params
    with pytest.raises(ValueError, match=r"site\(s\) \['y'\] .*not observed in this call"):
        Predictive(model, guide=guide, params=params, num_samples=5)(jax.random.PRNGKey(1), x, None)
    draws = guide.sample_posterior(jax.random.PRNGKey(1), params, x, None, y, sample_shape=(5,))
    predicted = Predictive(model, posterior_samples=draws)(jax.random.PRNGKey(2), x, None)
    assert predicted["y"].shape == (5, N) and np.all(np.isfinite(predicted["y"]))


def test_nan_data_and_a_bad_encoder_are_named(fitted):
    x = X.at[3].set(jnp.nan)
    guide, params = fitted
    with pytest.raises(ValueError, match=r"observed site 'x' has NaN or inf values for data "
                       r"point\(s\) \[3\]"):
        guide.sample_posterior(jax.random.PRNGKey(1), params, x, N, 6, subsample_idx=jnp.arange(6))
    # at set-up, where the first minibatch holds it
    with pytest.raises(ValueError, match=r"observed site 'x' has NaN or inf"):
        handlers.seed(UHALocalGuide(conjugate_model, K=2), 0)(x, N, N)

    def negative_scale(x):
        return jnp.zeros((x.shape[0], 1)), -0.5 * jnp.ones((x.shape[0], 1))

    guide = UHALocalGuide(conjugate_model, K=2, encoder=negative_scale)
    with pytest.raises(ValueError, match=r"encoder must return a finite loc and a positive"):
        handlers.seed(guide, 0)(X, N, 6)



@pytest.mark.parametrize("call", ["predictive", "svi_update"])
def test_nan_data_in_a_call_of_the_guide_are_named(fitted, call):
    """After a fit on finite data, Predictive (NaN predictions, silently) and svi.update
    (a NaN loss, silently) on data with a NaN name the data point."""
    guide, params = fitted
    x = X.at[3].set(jnp.nan)
    with pytest.raises(ValueError, match=r"observed site 'x' has NaN or inf values for data "
                       r"point\(s\) \[3\]"):
        if call == "predictive":
            Predictive(conjugate_model, guide=guide, params=params, num_samples=2)(
                jax.random.PRNGKey(1), x, N, N
            )
        else:
            svi = SVI(conjugate_model, guide, optax.adam(1e-2), Trace_ELBO())
            svi.update(svi.init(jax.random.PRNGKey(0), X, N, 6), x, N, 6)

def test_draws_of_diverged_chains_are_flagged_with_their_data_points():
    """Data point 0's chain diverges (the divergence tests' set-up): sample_posterior
    says so and names it; the others are not named."""
    guide, svi, state, args = _narrow_setup(2e-3)
    params = svi.get_params(state)
    with pytest.warns(UHADivergenceWarning, match=r"at data point\(s\) \[0\]: their draws"):
        guide.sample_posterior(jax.random.PRNGKey(1), params, *args, sample_shape=(4,))
    guide, svi, state, args = _narrow_setup(0.5)  # nothing diverges
    with warnings.catch_warnings():
        warnings.simplefilter("error", UHADivergenceWarning)
        guide.sample_posterior(jax.random.PRNGKey(1), svi.get_params(state), *args,
                               sample_shape=(4,))


def test_median_and_quantiles_are_those_of_the_draws(fitted):
    guide, params = fitted
    idx = jnp.arange(6)
    key = jax.random.PRNGKey(5)
    draws = guide.sample_posterior(key, params, X, N, 6, sample_shape=(200,), subsample_idx=idx)
    median = guide.median(params, X, N, 6, num_samples=200, rng_key=key, subsample_idx=idx)
    quantiles = guide.quantiles(params, [0.1, 0.9], X, N, 6, num_samples=200, rng_key=key,
                                subsample_idx=idx)
    for name in ("mu", "z"):
        np.testing.assert_allclose(median[name], np.median(draws[name], 0), rtol=1e-6)
        np.testing.assert_allclose(
            quantiles[name], np.quantile(draws[name], [0.1, 0.9], axis=0), rtol=1e-5, atol=1e-6
        )
    assert median["z"].shape == (6,)


def _pushed(name, unconstrained_value, **options):
    """A fresh guide's parameter ``local_<name>``: its initial value, and its value with the
    optimizer's (unconstrained) value set to ``unconstrained_value``."""
    guide = UHALocalGuide(conjugate_model, K=2, **options)
    svi = SVI(conjugate_model, guide, optax.adam(1e-2), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), X, N, 6)
    unconstrained = dict(svi.optim.get_params(state.optim_state))
    unconstrained[f"local_{name}"] = jnp.full_like(unconstrained[f"local_{name}"], unconstrained_value)
    return (np.asarray(svi.get_params(state)[f"local_{name}"]),
            np.asarray(svi.constrain_fn(unconstrained)[f"local_{name}"]))


def test_a_floor_on_the_momentum_scales_holds_wherever_the_optimizer_takes_them():
    """min_momentum_scale: however far the optimizer pushes Σ's sds down (here to
    exp(-30) in unconstrained space), they stay above the floor, so no coordinate's step
    ε / m_j exceeds max_step_size / floor; without it they go to ~0. Bad values refused."""
    floor = 0.25
    scales = {}
    for option in (None, floor):
        initial, scales[option] = _pushed("momentum_scale", -30.0, min_momentum_scale=option)
        assert np.all(initial == 1.0)
    assert np.all(scales[None] < 1e-6)
    assert np.all(scales[floor] >= floor) and np.all(scales[floor] < floor + 1e-6)
    for bad in (0.0, 1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="min_momentum_scale"):
            UHALocalGuide(conjugate_model, K=2, min_momentum_scale=bad)


def test_a_cap_on_the_damping_holds_wherever_the_optimizer_takes_it():
    """max_damping: however far the optimizer pushes η up (to +30 in unconstrained
    space), it stays below the cap, so the momentum is refreshed at every transition;
    without it η goes to ~1. Bad values, and an init_damping at or over the cap, refused."""
    cap = 0.8
    etas = {}
    for option in (1.0, cap):
        initial, eta = _pushed("damping", 30.0, max_damping=option, init_damping=0.5)
        assert np.allclose(initial, 0.5)
        etas[option] = float(eta)
    assert etas[1.0] > 1 - 1e-6
    assert cap - 1e-6 < etas[cap] <= cap
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="max_damping"):
            UHALocalGuide(conjugate_model, K=2, max_damping=bad)
    with pytest.raises(ValueError, match="init_damping"):
        UHALocalGuide(conjugate_model, K=2, max_damping=0.8, init_damping=0.9)


def _mean_and_points(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    with numpyro.plate("n", y.shape[0], subsample_size=4) as i:
        z = numpyro.sample("z", dist.Normal(mu, 1.0))
        numpyro.sample("y", dist.Normal(z, 1.0), obs=y[i])


@pytest.mark.parametrize("name, value", [("local_damping", 1.5), ("local_step_size", -0.1)])
def test_a_hand_set_param_outside_its_constraint_is_named(name, value):
    y = jnp.linspace(-1.0, 2.0, 10)
    guide = UHALocalGuide(_mean_and_points, K=2)
    svi = SVI(_mean_and_points, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), y))
    bad = dict(params, **{name: jnp.full_like(params[name], value)})
    match = f"UHALocalGuide: params\\['{name}'\\] has a value {value:g} outside"
    with pytest.raises(ValueError, match=match):
        svi.run(jax.random.PRNGKey(1), 2, y, progress_bar=False, init_params=bad)
    with pytest.raises(ValueError, match=match):  # the draws' program is traced: on the host
        guide.sample_posterior(jax.random.PRNGKey(1), bad, y, sample_shape=(3,), subsample_idx=jnp.arange(4))
    # a value on its bound, as float32 rounds it (0.7 is 0.69999999), passes
    floor = UHALocalGuide(_mean_and_points, K=2, min_momentum_scale=0.7)
    svi = SVI(_mean_and_points, floor, optax.adam(1e-2), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), y))
    on_floor = dict(params, local_momentum_scale=jnp.full_like(params["local_momentum_scale"], 0.7))
    floor.sample_posterior(jax.random.PRNGKey(1), on_floor, y, sample_shape=(3,), subsample_idx=jnp.arange(4))


def _points_with_a_local_that_can_be_observed(y, theta=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    with numpyro.plate("n", y.shape[0], subsample_size=4) as i:
        z = numpyro.sample("z", dist.Normal(mu, 1.0), obs=None if theta is None else theta[i])
        numpyro.sample("y", dist.Normal(z, 1.0), obs=y[i])


def test_a_local_latent_at_setup_observed_now_is_refused_not_ignored():
    # before: the local draws were bit-identical with and without theta given
    y = jnp.linspace(-1.0, 2.0, 10)
    model = _points_with_a_local_that_can_be_observed
    guide = UHALocalGuide(model, K=2)
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), y)
    params = svi.get_params(state)
    theta = jnp.full(10, 5.0)
    for call in (
        lambda: guide.sample_posterior(jax.random.PRNGKey(1), params, y, theta, sample_shape=(3,)),
        lambda: svi.update(state, y, theta),
    ):
        with pytest.raises(ValueError, match=r"site\(s\) \['z'\] are observed \(or gone\)"):
            call()


def _wide_prior_narrow_noise(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("n", y.shape[0], subsample_size=4) as i:
        z = numpyro.sample("z", dist.Normal(mu, 10.0))
        numpyro.sample("y", dist.Normal(z, 0.01), obs=y[i])


def test_a_tail_too_far_out_for_khat_is_warned_by_its_effective_sample_size():
    # untrained q_i a thousand times wider than z_i's posterior: each point's weights
    # span thousands of nats (ESS 1 of 200); at the last two points so few weights are
    # above the float underflow that k̂ comes out inf ("too few draws") and was not counted
    y = jnp.linspace(-3.0, 3.0, 10)
    guide = UHALocalGuide(_wide_prior_narrow_noise, K=2)
    svi = SVI(_wide_prior_narrow_noise, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), y))
    with pytest.warns(UHAFitWarning) as caught:
        result = guide.log_z(
            jax.random.PRNGKey(2), params, y, num_samples=200, subsample_idx=jnp.arange(6, 10),
            global_values={"mu": 0.0},
        )
    assert np.isinf(result.pareto_khat[2:]).all() and (result.ess < 10).all()
    message = next(str(w.message) for w in caught if "effective sample size" in str(w.message))
    assert "under 5 % of the chains (the same) at 4 data point(s) [6, 7, 8, 9]" in message
