"""Automatic non-centering (``UHAGuide(decenter="auto")``, ``numpyro_uha._decenter``).

Which sites are non-centered, that the guide still speaks the model's own sites to every
consumer (``sample_posterior``, ``Predictive``, ``latent_from_samples``, pickling, ``jit``),
that it fits a funnel a centered Gaussian start cannot, and clear errors. That the bound
stays exact (the Jacobian in the guide's log density) is checked draw by draw against
Trace_ELBO in ``tests/test_guide_weights.py`` (its model has a non-centered site).
"""

import pickle
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.contrib.control_flow import scan
from numpyro.infer import SVI, Predictive, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from benchmarks.user_models import informative_groups, poisson_intercepts
from numpyro_uha import UHAGuide
from numpyro_uha._decenter import find_decenterable


def funnel(n):
    v = numpyro.sample("v", dist.Normal(0.0, 3.0))
    numpyro.sample("x", dist.Normal(0.0, jnp.exp(v / 2)).expand([n]).to_event(1))


def groups(y):
    """A centered hierarchical model with sites that must not be non-centered beside
    the one that must: a Student-t group effect under a latent location and scale."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))  # constant loc and scale
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))  # positive support
    noise = numpyro.sample("noise", dist.HalfNormal(tau))  # latent scale, positive support
    with numpyro.plate("g", y.shape[0]):
        theta = numpyro.sample("theta", dist.StudentT(5.0, mu, tau))
        with numpyro.handlers.mask(mask=jnp.arange(y.shape[0]) < 2):
            numpyro.sample("masked", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, noise + 1.0), obs=y)


def random_walk_in_scan(y):
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    start = numpyro.sample("start", dist.Normal(0.0, sigma))

    def step(prev, y_t):
        h = numpyro.sample("h", dist.Normal(prev, sigma))
        numpyro.sample("obs", dist.Normal(h, 1.0), obs=y_t)
        return h, None

    scan(step, start, y)


Y = jnp.array([1.2, -0.3, 2.2, 0.7, 1.5])


def test_only_loc_scale_sites_whose_parameters_depend_on_latents_are_found():
    assert find_decenterable(funnel, (4,), {}) == ["x"]
    # mu: constant parameters; tau, noise: not real-supported; masked: masked out
    assert find_decenterable(groups, (Y,), {}) == ["theta"]


def test_sites_inside_scan_are_left_as_written():
    guide = UHAGuide(random_walk_in_scan, K=2, warm_start_steps=0)
    SVI(random_walk_in_scan, guide, optax.adam(1e-3), Trace_ELBO()).init(
        jax.random.PRNGKey(0), Y
    )
    assert guide.decentered_sites == ("start",)  # h is drawn inside scan
    with pytest.raises(ValueError, match=r"\['h'\].*scan"):
        explicit = UHAGuide(random_walk_in_scan, K=2, warm_start_steps=0, decenter=["h"])
        SVI(random_walk_in_scan, explicit, optax.adam(1e-3), Trace_ELBO()).init(
            jax.random.PRNGKey(0), Y
        )


def root_link(y):
    """Valid only where every ``a`` is positive: ``init_to_uniform``'s random points
    (the probe's) give a negative one almost surely, the median and the posterior not."""
    a = numpyro.sample("a", dist.Normal(3.0, 1.0).expand([8]).to_event(1))
    numpyro.sample("m", dist.Normal(jnp.mean(a), 1.0))
    numpyro.sample("y", dist.Normal(jnp.sqrt(a), 0.1), obs=y)


def test_auto_probes_a_model_whose_parameters_are_invalid_at_random_points():
    # an ODE model (Lotka-Volterra, a log of its states) failed at set-up this way with
    # NumPyro's validation error, where decenter=False and AutoNormal set up
    y = jnp.array([1.7, 1.9, 2.1, 1.6, 1.8, 2.0, 1.75, 1.85])
    guide = UHAGuide(
        root_link, K=2, warm_start_steps=0, init_loc_fn=numpyro.infer.init_to_median
    )
    SVI(root_link, guide, optax.adam(1e-3), Trace_ELBO()).init(jax.random.PRNGKey(0), y)
    assert guide.decentered_sites == ("m",)


def test_a_model_that_raises_at_a_probed_point_is_probed_at_another():
    calls = []

    def flaky(n):
        calls.append(None)
        if len(calls) == 1:
            raise FloatingPointError("a solver that gave up at this point")
        funnel(n)

    assert find_decenterable(flaky, (4,), {}) == ["x"]
    assert len(calls) == 3


def fit(model, guide, *args, steps=1500, lr=1e-2):
    svi = SVI(model, guide, optax.adam(lr), Trace_ELBO())
    return svi.run(jax.random.PRNGKey(0), steps, *args, progress_bar=False)


@pytest.fixture(scope="module")
def fitted_groups():
    guide = UHAGuide(groups, K=4, warm_start_steps=200, decenter=["theta"])
    result = fit(groups, guide, Y, steps=300)
    return guide, result.params


def test_the_guide_speaks_the_models_own_sites(fitted_groups):
    guide, params = fitted_groups
    assert guide.decentered_sites == ("theta",)
    draws = guide.sample_posterior_with_log_weights(
        jax.random.PRNGKey(1), params, Y, sample_shape=(64,)
    )
    assert set(draws.samples) == {"mu", "tau", "noise", "theta", "masked"}
    # the latent of a draw is its non-centered coordinates; mapping the model's values
    # back (theta~ = (theta - mu) / tau, read from the model) recovers it
    np.testing.assert_allclose(
        guide.latent_from_samples(draws.samples, Y), draws.latent, rtol=1e-4, atol=1e-4
    )
    # Predictive runs the guide's __call__ (the SVI path), which emits theta itself
    predictive = Predictive(
        groups, guide=guide, params=params, num_samples=16,
        return_sites=["mu", "tau", "theta"],
    )(jax.random.PRNGKey(2), Y)
    assert predictive["theta"].shape == (16, Y.shape[0])
    assert np.all(np.isfinite(predictive["theta"]))


def test_the_evaluation_layer_reads_reference_draws_by_the_models_own_sites(fitted_groups):
    """Reference draws of the model (NUTS's, or here the guide's own) hold ``theta``, not
    the non-centered ``theta_decentered`` the guide runs: compare_with_nuts and the
    estimators from posterior draws read them by the model's names (both failed on every
    non-centered guide, with a KeyError and a missing-site error)."""
    from numpyro_uha.evaluation import compare_with_nuts, log_z_bracket, sandwich

    guide, params = fitted_groups
    draws = guide.sample_posterior_with_log_weights(
        jax.random.PRNGKey(4), params, Y, sample_shape=(64,)
    )
    reference = {name: np.asarray(value) for name, value in draws.samples.items()}
    comparison = compare_with_nuts(
        guide, jax.random.PRNGKey(5), params, Y, mcmc_samples=reference, num_draws=64
    )
    assert {"mu", "tau", "noise", "theta", "masked"} <= set(comparison.summary.index)
    assert np.all(np.isfinite(comparison.table["nuts_mean"]))
    bounds = sandwich(guide, jax.random.PRNGKey(6), params, reference, Y, num_draws=32)
    assert np.isfinite(bounds.lower.elbo) and np.isfinite(bounds.upper)
    bracket = log_z_bracket(guide, jax.random.PRNGKey(7), params, reference, Y, num_q_draws=2000)
    assert np.isfinite(bracket.lower) and np.isfinite(bracket.upper)


def test_auto_finds_the_sites_under_a_jitted_svi_init():
    """``jax.jit(svi.init)``, the data traced: the sites are found as eagerly (the traced
    comparison of loc and scale raised TracerArrayConversionError), and training runs."""
    guide = UHAGuide(groups, K=2, warm_start_steps=20)
    svi = SVI(groups, guide, optax.adam(1e-2), Trace_ELBO())
    state = jax.jit(svi.init)(jax.random.PRNGKey(0), Y)
    assert guide.decentered_sites == ("theta",)
    _, loss = jax.jit(svi.update)(state, Y)
    assert np.isfinite(loss)


def test_pickled_and_jitted_guides_draw_the_same(fitted_groups):
    guide, params = fitted_groups
    key = jax.random.PRNGKey(3)
    eager = guide.sample_posterior(key, params, Y, sample_shape=(8,))
    jitted = jax.jit(lambda k: guide.sample_posterior(k, params, Y, sample_shape=(8,)))(key)
    loaded = pickle.loads(pickle.dumps(guide))
    again = loaded.sample_posterior(key, params, Y, sample_shape=(8,))
    assert loaded.decentered_sites == ("theta",)
    for name in eager:
        np.testing.assert_allclose(jitted[name], eager[name], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(again[name], eager[name], rtol=1e-5, atol=1e-5)


def test_a_guide_pickled_before_decenter_existed_stays_centered():
    """Saved fits from before this option have no ``decenter`` state: loaded, they keep
    the model's own coordinates (the ones they were trained in) and set up again."""
    guide = UHAGuide(groups, K=2, warm_start_steps=0, decenter=False)
    state = guide.__getstate__()
    for key in ("requested_decenter", "decentered_sites", "_user_model"):
        del state[key]
    old = UHAGuide.__new__(UHAGuide)
    old.__setstate__(state)
    SVI(groups, old, optax.adam(1e-3), Trace_ELBO()).init(jax.random.PRNGKey(0), Y)
    assert old.decentered_sites == () and "theta" in old.prototype_trace


@pytest.mark.parametrize("decenter", ["auto", pytest.param(False, marks=pytest.mark.slow)])
def test_a_funnel_is_fitted_non_centered(decenter):
    """Neal's funnel with no data: v ~ N(0, 3²), x | v ~ N(0, e^v I₄). Non-centered, the
    posterior is a standard Gaussian in (v, x~), so the fitted guide's draws of v must
    have sd 3 within 4 Monte Carlo standard errors (sd of a sample sd: sd / sqrt(2n));
    centered, a Gaussian start and short chains cannot (q's sd of v stays near 1).
    The centered case is the check that the test can fail. The learning rate decays
    (1e-2 to 1e-4): at a constant 1e-2 Adam's own jitter moved the fitted sd of v by up
    to ±0.2 with the seed, beyond the draws' Monte Carlo error the test is sized by."""
    guide = UHAGuide(funnel, K=8, warm_start_steps=300, decenter=decenter)
    result = fit(funnel, guide, 4, steps=1000, lr=optax.exponential_decay(1e-2, 1000, 0.01))
    n = 4000
    v = np.asarray(guide.sample_posterior(
        jax.random.PRNGKey(5), result.params, 4, sample_shape=(n,)
    )["v"])
    se = 3.0 / np.sqrt(2 * n)
    if decenter:
        assert abs(v.std() - 3.0) < 4 * se, (v.std(), se)
        assert abs(v.mean()) < 4 * 3.0 / np.sqrt(n)
    else:
        assert v.std() < 3.0 - 4 * se  # the failure non-centering fixes


def test_bad_decenter_arguments_are_named():
    with pytest.raises(ValueError, match="decenter must be 'auto'"):
        UHAGuide(funnel, decenter="yes")
    with pytest.raises(ValueError, match="decenter and init_from"):
        UHAGuide(funnel, decenter=["x"], init_from=(object(), {}))
    svi_init = lambda guide: SVI(groups, guide, optax.adam(1e-3), Trace_ELBO()).init(  # noqa: E731
        jax.random.PRNGKey(0), Y
    )
    with pytest.raises(ValueError, match="'nope', not a latent site"):
        svi_init(UHAGuide(groups, K=2, warm_start_steps=0, decenter=["nope"]))
    with pytest.raises(ValueError, match="'tau' has a HalfNormal distribution"):
        svi_init(UHAGuide(groups, K=2, warm_start_steps=0, decenter=["tau"]))
    off = UHAGuide(groups, K=2, warm_start_steps=0, decenter=False)
    svi_init(off)
    assert off.decentered_sites == ()


@pytest.fixture(scope="module")
def poisson_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(150, 2))
    y = rng.poisson(np.exp(0.3 + x @ np.array([0.5, -0.3]) + 0.7 * rng.normal(size=150)))
    return jnp.asarray(x), jnp.asarray(y.astype(np.float32))


def _init_trace(guide, args):
    return guide._trace_at_init(guide.model, args, {})


@pytest.mark.parametrize("init", [pytest.param("uniform", marks=pytest.mark.slow), "value"])
def test_the_non_centered_start_is_the_point_init_loc_fn_gives_the_model(poisson_data, init):
    """init_loc_fn gives x₀ for the site x as written, and the non-centered guide starts
    at x̃ = (x₀ − loc) / scale: the same x as the centered guide (init_to_uniform, with
    the same keys), and init_to_value keyed by x is honoured."""
    from numpyro.infer.initialization import init_to_uniform, init_to_value

    u0 = jnp.linspace(-1.0, 1.0, poisson_data[0].shape[0])
    init_loc_fn = init_to_uniform if init == "uniform" else init_to_value(values={"u": u0})
    traces = {}
    for decenter in ("auto", False):
        guide = UHAGuide(
            poisson_intercepts, K=2, decenter=decenter and ["u"], init_loc_fn=init_loc_fn,
            warm_start_steps=10,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # 10 steps do not converge
            numpyro.handlers.seed(guide, 0)(*poisson_data)
        traces[decenter] = _init_trace(guide, poisson_data)
    assert guide.decentered_sites == () and "u_decentered" in traces["auto"]
    np.testing.assert_allclose(traces["auto"]["u"]["value"], traces[False]["u"]["value"], rtol=1e-5, atol=1e-6)
    if init == "value":
        np.testing.assert_allclose(traces["auto"]["u"]["value"], u0, rtol=1e-5, atol=1e-6)


def test_a_non_centered_poisson_model_warm_starts_near_the_centered_one(poisson_data):
    """The symptom: drawn ±2 in the standardized coordinates, u = s · ũ reached ±15 inside
    exp(·), and the warm start kept an ELBO of −1.2e5 against −517 centered (300 groups).
    From the model's own initial point it starts within a few nats per group of it."""
    elbos = {}
    for decenter in ("auto", False):
        guide = UHAGuide(poisson_intercepts, K=2, decenter=decenter and ["u"])
        SVI(poisson_intercepts, guide, optax.adam(1e-3), Trace_ELBO()).init(
            jax.random.PRNGKey(0), *poisson_data
        )
        elbos[decenter] = guide._start_elbo[0]
    assert guide.decentered_sites == ()
    assert np.isfinite(elbos["auto"]) and elbos["auto"] > elbos[False] - 0.5 * 150


@pytest.mark.slow
def test_a_non_centered_guide_is_a_part_of_an_auto_guide_list(poisson_data):
    """NumPyro's AutoGuideList refuses a part whose prototype trace shows a deterministic
    site; the non-centered model's x = loc + scale · x̃ is one the user never wrote, so
    it is not shown, and the list trains and draws the model's own sites."""
    from numpyro.infer.autoguide import AutoGuideList

    def with_extra(x, y):
        # the other part's site is independent of UHA's a posteriori (a UHA part whose
        # sites depend on a hidden one is refused: tests/test_any_model.py)
        poisson_intercepts(x, y)
        extra = numpyro.sample("extra", dist.Normal(0.0, 1.0))
        numpyro.sample("y_extra", dist.Normal(extra, 1.0), obs=0.5)

    guides = AutoGuideList(with_extra)
    part = UHAGuide(numpyro.handlers.block(with_extra, hide=["extra"]), K=2, decenter=["u"])
    guides.append(part)
    guides.append(AutoNormal(numpyro.handlers.block(with_extra, expose=["extra"])))
    svi = SVI(with_extra, guides, optax.adam(1e-2), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), 5, *poisson_data, progress_bar=False)
    assert part.decentered_sites == ("u",)
    assert np.all(np.isfinite(np.asarray(result.losses)))
    draws = guides.sample_posterior(
        jax.random.PRNGKey(1), result.params, *poisson_data, sample_shape=(3,)
    )
    assert sorted(draws) == ["b0", "extra", "s", "u", "w"] and draws["u"].shape == (3, 150)


def test_auto_keeps_the_coordinates_whose_warm_start_fits_better():
    """decenter="auto" warm-starts both coordinate systems from the same point and keeps
    the higher start ELBO: informative groups stay as written (non-centered they lost
    13 nats to AutoNormal after 1000 steps), Neal's funnel with no data goes
    non-centered."""
    rng = np.random.default_rng(0)
    y = jnp.asarray(rng.normal(size=(30, 5)) + rng.normal(size=(30, 1)))
    elbos = {}
    for model, args in ((informative_groups, (y,)), (funnel, (4,))):
        guide = UHAGuide(model, K=2, warm_start_steps=300)
        SVI(model, guide, optax.adam(1e-3), Trace_ELBO()).init(jax.random.PRNGKey(0), *args)
        elbos[model.__name__] = guide.coordinate_elbos
        kept = "non_centered" if guide.decentered_sites else "as_written"
        assert guide._start_elbo == guide.coordinate_elbos[kept]
        assert max(guide.coordinate_elbos.values(), key=lambda e: e[0]) == guide._start_elbo
        expected = () if model is informative_groups else ("x",)
        assert guide.decentered_sites == expected, (model.__name__, guide.coordinate_elbos)
    groups_elbos = elbos["informative_groups"]
    margin = groups_elbos["as_written"][0] - groups_elbos["non_centered"][0]
    assert margin > 4 * np.hypot(groups_elbos["as_written"][1], groups_elbos["non_centered"][1])


# ----------------------------------------------------------- multivariate group effects
def correlated_effects(g, x, y, family="mvn"):
    """Varying intercepts and slopes with an LKJ correlation (the usual way to write
    correlated group effects): ``ab ~ MVN(mu, diag(tau) L)`` per group."""
    L = numpyro.sample("L", dist.LKJCholesky(2, 2.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0).expand([2]).to_event(1))
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0).expand([2]).to_event(1))
    fixed = numpyro.sample("fixed", dist.MultivariateNormal(jnp.zeros(2), jnp.eye(2)))
    scale_tril = tau[:, None] * L
    with numpyro.plate("groups", 4):
        if family == "mvn":
            ab = numpyro.sample("ab", dist.MultivariateNormal(mu, scale_tril=scale_tril))
        else:
            ab = numpyro.sample("ab", dist.MultivariateStudentT(5.0, mu, scale_tril))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    with numpyro.plate("n", x.shape[0]):
        mean = ab[g, 0] + ab[g, 1] * x + 0.1 * fixed.sum()
        numpyro.sample("y", dist.Normal(mean, s), obs=y)


G_IDX = jnp.arange(12) % 4
X_CE = jnp.linspace(-1.0, 1.0, 12)
Y_CE = 1.0 - X_CE + 0.3 * jnp.asarray(np.random.default_rng(3).normal(size=12), jnp.float32)


@pytest.mark.parametrize("family", ["mvn", "mvt"])
def test_a_multivariate_group_effect_under_latent_loc_and_scale_tril_is_found(family):
    """ab's loc and scale_tril are latent: found; ``fixed``'s are constants: not; a
    constant loc under a latent scale_tril: found."""
    assert find_decenterable(correlated_effects, (G_IDX, X_CE, Y_CE, family), {}) == ["ab"]

    def scale_only():
        L = numpyro.sample("L", dist.LKJCholesky(3, 1.0))
        numpyro.sample("x", dist.MultivariateNormal(jnp.zeros(3), scale_tril=L))

    assert find_decenterable(scale_only, (), {}) == ["x"]


@pytest.mark.parametrize("family", ["mvn", "mvt"])
def test_the_multivariate_maps_are_inverse_with_the_log_det_per_element(family):
    """x = loc + scale_tril @ x̃ and back, for a batch of distributions, and the log
    scale the guide sums (per element, over the event) is log |det dx/dx̃|."""
    from numpyro_uha._decenter import _log_scale, from_standard, to_standard

    rng = np.random.default_rng(0)
    raw = rng.normal(size=(3, 3, 3))
    scale_tril = jnp.asarray(np.tril(raw) + np.eye(3)[None] * (2.0 + np.abs(raw)), jnp.float32)
    loc = jnp.asarray(rng.normal(size=3), jnp.float32)  # broadcast over the batch
    base = (dist.MultivariateNormal(loc, scale_tril=scale_tril) if family == "mvn"
            else dist.MultivariateStudentT(4.0, loc, scale_tril))
    noise = jnp.asarray(rng.normal(size=(3, 3)), jnp.float32)
    x = from_standard(base, noise)
    np.testing.assert_allclose(x, loc + np.einsum("bij,bj->bi", scale_tril, noise), rtol=1e-5)
    np.testing.assert_allclose(to_standard(base, x), noise, rtol=1e-4, atol=1e-5)
    for b in range(3):
        jac = jax.jacobian(lambda e: from_standard(base, e.reshape(3, 3))[b])(noise.reshape(-1))
        log_det = np.linalg.slogdet(np.asarray(jac[:, 3 * b: 3 * b + 3]))[1]
        np.testing.assert_allclose(np.sum(_log_scale(base)[b]), log_det, rtol=1e-5)


# the Student-t case runs with -m slow (15 s); its standardization is checked in the
# default suite by the init_to_value test and the maps' test
@pytest.mark.parametrize("family", ["mvn", pytest.param("mvt", marks=pytest.mark.slow)])
def test_a_non_centered_multivariate_site_keeps_trace_elbo_the_core_weight(family):
    """Decentered ab (ab = mu + diag(tau) L ab~): Trace_ELBO on the model as written is
    the core's log weight draw by draw, so the guide's density for ab carries
    -log |det diag(tau) L| (dropping it or taking log tau alone moves the ELBO)."""
    from tests.test_guide_weights import elbo_terms_and_core_weights, perturbed_params

    args = (G_IDX, X_CE, Y_CE, family)
    guide = UHAGuide(correlated_effects, K=3, warm_start_steps=0, decenter=["ab"])
    svi = SVI(correlated_effects, guide, optax.adam(1e-3), Trace_ELBO())
    params = perturbed_params(guide, svi.get_params(svi.init(jax.random.PRNGKey(0), *args)), 1)
    assert guide.decentered_sites == ("ab",)
    elbo, log_w, _ = elbo_terms_and_core_weights(guide, params, correlated_effects, *args)
    np.testing.assert_allclose(elbo, log_w, rtol=1e-5, atol=2e-3)
    assert np.std(log_w) > 0.1
    draws = guide.sample_posterior(jax.random.PRNGKey(1), params, *args, sample_shape=(8,))
    assert draws["ab"].shape == (8, 4, 2) and "ab_decentered" not in draws
    # the draws' ab map back to the latent the chain ran (ab~ = (diag(tau) L)^-1 (ab - mu))
    with_w = guide.sample_posterior_with_log_weights(
        jax.random.PRNGKey(1), params, *args, sample_shape=(8,)
    )
    np.testing.assert_allclose(
        guide.latent_from_samples(with_w.samples, *args), with_w.latent, rtol=1e-3, atol=1e-4
    )


@pytest.mark.parametrize("family", ["mvn", "mvt"])
def test_a_non_centered_multivariate_site_starts_where_init_to_value_puts_it(family):
    """init_to_value keyed by ab: the non-centered guide starts at
    ab~ = (diag(tau) L)^-1 (ab0 - mu), i.e. at ab0 itself."""
    from numpyro.infer.initialization import init_to_value

    args = (G_IDX, X_CE, Y_CE, family)
    ab0 = jnp.asarray(np.random.default_rng(5).normal(size=(4, 2)), jnp.float32)
    guide = UHAGuide(
        correlated_effects, K=2, decenter=["ab"], warm_start_steps=0,
        init_loc_fn=init_to_value(values={"ab": ab0}),
    )
    numpyro.handlers.seed(guide, 0)(*args)
    trace = _init_trace(guide, args)
    assert "ab_decentered" in trace
    np.testing.assert_allclose(trace["ab"]["value"], ab0, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------ Gaussian random walks
def random_walk_volatility(r):
    """Stochastic volatility as NumPyro's example writes it: a log-volatility path
    ``s ~ GaussianRandomWalk(sigma)`` under a latent step size."""
    sigma = numpyro.sample("sigma", dist.Exponential(10.0))
    s = numpyro.sample("s", dist.GaussianRandomWalk(scale=sigma, num_steps=r.shape[0]))
    fixed = numpyro.sample("fixed", dist.GaussianRandomWalk(scale=0.5, num_steps=3))
    numpyro.sample("r", dist.Normal(0.1 * fixed.sum(), jnp.exp(s)), obs=r)


RETURNS = jnp.asarray(np.random.default_rng(4).standard_t(5, size=10) * 0.3, jnp.float32)


def test_a_random_walk_is_not_found_automatically_and_its_maps_are_inverse():
    """"auto" leaves random walks as written (only named ones are non-centered; see
    NOT_AUTOMATIC). x = scale · cumsum(x̃) and back for a batch of walks, and the log
    scale the guide sums per element is log |det dx/dx̃|."""
    from numpyro_uha._decenter import _log_scale, from_standard, to_standard

    assert find_decenterable(random_walk_volatility, (RETURNS,), {}) == []
    scale = jnp.asarray([0.3, 2.0], jnp.float32)
    base = dist.GaussianRandomWalk(scale=scale, num_steps=4)
    noise = jnp.asarray(np.random.default_rng(0).normal(size=(2, 4)), jnp.float32)
    x = from_standard(base, noise)
    np.testing.assert_allclose(x, scale[:, None] * np.cumsum(noise, -1), rtol=1e-5)
    np.testing.assert_allclose(to_standard(base, x), noise, rtol=1e-4, atol=1e-5)
    # the walk's density is the standardized steps' over the Jacobian
    np.testing.assert_allclose(
        base.log_prob(x),
        dist.Normal(0.0, 1.0).log_prob(noise).sum(-1) - _log_scale(base).sum(-1),
        rtol=1e-5,
    )
    for b in range(2):
        jac = jax.jacobian(lambda e: from_standard(base, e.reshape(2, 4))[b])(noise.reshape(-1))
        log_det = np.linalg.slogdet(np.asarray(jac[:, 4 * b: 4 * b + 4]))[1]
        np.testing.assert_allclose(np.sum(_log_scale(base)[b]), log_det, rtol=1e-5)


def test_a_non_centered_random_walk_keeps_trace_elbo_the_core_weight():
    """Decentered s (s = sigma · cumsum(s~)): Trace_ELBO on the model as written is the
    core's log weight draw by draw (the guide's density for s carries -T log sigma), and
    the draws map back to the latent the chain ran."""
    from tests.test_guide_weights import elbo_terms_and_core_weights, perturbed_params

    guide = UHAGuide(random_walk_volatility, K=3, warm_start_steps=0, decenter=["s"])
    svi = SVI(random_walk_volatility, guide, optax.adam(1e-3), Trace_ELBO())
    params = perturbed_params(guide, svi.get_params(svi.init(jax.random.PRNGKey(0), RETURNS)), 1)
    assert guide.decentered_sites == ("s",)
    elbo, log_w, _ = elbo_terms_and_core_weights(guide, params, random_walk_volatility, RETURNS)
    np.testing.assert_allclose(elbo, log_w, rtol=1e-5, atol=2e-3)
    assert np.std(log_w) > 0.1
    with_w = guide.sample_posterior_with_log_weights(
        jax.random.PRNGKey(1), params, RETURNS, sample_shape=(8,)
    )
    assert with_w.samples["s"].shape == (8, 10) and "s_decentered" not in with_w.samples
    np.testing.assert_allclose(
        guide.latent_from_samples(with_w.samples, RETURNS), with_w.latent, rtol=1e-3, atol=1e-4
    )


def _school(y):
    """A centered hierarchy: theta's loc and scale are latent, so "auto" decenters it."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    with numpyro.plate("J", y.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, 0.8), obs=y)


def _two_scoped_schools(y):
    """The same sub-model twice, under two scopes (one with its own divider, one nested)."""
    numpyro.handlers.scope(_school, prefix="a")(y)
    with numpyro.handlers.scope(prefix="outer"):
        numpyro.handlers.scope(_school, prefix="b", divider=".")(y + 1.0)


@pytest.mark.parametrize(
    "model, expected",
    [
        (numpyro.handlers.scope(_school, prefix="m"), ("m/theta",)),
        (_two_scoped_schools, ("a/theta", "outer/b.theta")),
    ],
    ids=["scope", "two-scopes"],
)
def test_sites_under_scope_are_non_centered_under_their_scoped_names(model, expected):
    """A hierarchy under numpyro.handlers.scope: the non-centered site is x's scoped name
    plus the suffix (the reparam's own sample went through the scope again, named
    m/m/theta_decentered, and svi.init raised that m/theta was unobserved); Trace_ELBO's
    term is the core's weight and the draws hold the model's scoped sites."""
    from tests.test_guide_weights import elbo_terms_and_core_weights, perturbed_params

    guide = UHAGuide(model, K=3, warm_start_steps=0)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    params = perturbed_params(guide, svi.get_params(svi.init(jax.random.PRNGKey(0), Y)), 1)
    assert guide.decentered_sites == expected
    assert {name + "_decentered" for name in expected} <= set(guide.prototype_trace)
    elbo, log_w, _ = elbo_terms_and_core_weights(guide, params, model, Y)
    np.testing.assert_allclose(elbo, log_w, rtol=1e-5, atol=2e-3)
    draws = guide.sample_posterior(jax.random.PRNGKey(1), params, Y, sample_shape=(4,))
    assert all(draws[name].shape == (4, Y.shape[0]) for name in expected)
    assert not any(name.endswith("_decentered") for name in draws)


def test_an_unscoped_decenter_name_points_to_the_scoped_site():
    """decenter=["theta"] on a model under scope(prefix="m"): the error names the model's
    latent sites and suggests 'm/theta' (a misspelling gets the closest name)."""
    model = numpyro.handlers.scope(_school, prefix="m")
    svi_init = lambda guide: SVI(model, guide, optax.adam(1e-3), Trace_ELBO()).init(  # noqa: E731
        jax.random.PRNGKey(0), Y
    )
    with pytest.raises(ValueError, match=r"'theta', not a latent site.*Did you mean 'm/theta'\?"):
        svi_init(UHAGuide(model, K=2, warm_start_steps=0, decenter=["theta"]))
    with pytest.raises(ValueError, match=r"Did you mean 'm/theta'\?"):
        svi_init(UHAGuide(model, K=2, warm_start_steps=0, decenter=["m/thetta"]))
    with pytest.raises(ValueError, match=r"'nope', not a latent site[^?]*$"):
        svi_init(UHAGuide(model, K=2, warm_start_steps=0, decenter=["nope"]))


def _scale_only():
    L = numpyro.sample("L", dist.LKJCholesky(3, 1.0))
    numpyro.sample("x", dist.MultivariateNormal(jnp.zeros(3), scale_tril=L))


def _data_loc(x, y):
    """A latent whose loc is computed from the data only (not found) beside one whose
    scale is latent (found): the data enter the compiled probe as inputs."""
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    z = numpyro.sample("z", dist.Normal(2.0 * x, 1.0).to_event(1))
    w = numpyro.sample("w", dist.Normal(0.0, s).expand([x.shape[0]]).to_event(1))
    numpyro.sample("y", dist.Normal(z + w, 0.5).to_event(1), obs=y)


_PROBED = [
    (funnel, (4,)), (groups, (Y,)), (random_walk_in_scan, (Y,)),
    (correlated_effects, (G_IDX, X_CE, Y_CE, "mvn")), (_scale_only, ()),
    (random_walk_volatility, (RETURNS,)), (_data_loc, (X_CE, Y_CE)),
]


@pytest.mark.parametrize("model, args", _PROBED, ids=lambda v: getattr(v, "__name__", ""))
def test_the_compiled_probe_finds_what_the_point_by_point_probe_finds(model, args, monkeypatch):
    """find_decenterable compares the two probe points in one compiled program (the
    op-by-op traces compiled about 20 programs, 1-2 s); the same sites as point by point,
    and the compiled program alone decides (the point-by-point traces not needed)."""
    from numpyro_uha import _decenter

    compiled = find_decenterable(model, args, {})
    with monkeypatch.context() as m:
        m.setattr(_decenter, "_compiled_comparison", _raise)
        assert find_decenterable(model, args, {}) == compiled  # point by point
    monkeypatch.setattr(_decenter, "_two_traces", _raise)
    assert find_decenterable(model, args, {}) == compiled
    if model is _data_loc:
        assert compiled == ["w"]


def _raise(*args, **kwargs):
    raise AssertionError("not to be called here")


def test_a_model_with_python_control_flow_on_a_latent_is_probed_point_by_point():
    def branchy(n):
        s = numpyro.sample("s", dist.HalfNormal(1.0))
        if float(s) > 1e6:  # a Python check on a latent's value: cannot be traced at once
            raise ValueError("unreachable")
        numpyro.sample("x", dist.Normal(0.0, s).expand([n]).to_event(1))

    assert find_decenterable(branchy, (3,), {}) == ["x"]


# ------------------------------------------- correlated priors with fixed parameters
T_GP = 24
_T = np.arange(T_GP)
GP_TRIL = jnp.asarray(np.linalg.cholesky(
    np.exp(-0.5 * ((_T[:, None] - _T[None, :]) / 3.0) ** 2) + 1e-3 * np.eye(T_GP)
), jnp.float32)
Y_GP = jnp.asarray(
    np.sin(2 * np.pi * _T / T_GP) + 0.4 * np.random.default_rng(6).normal(size=T_GP), jnp.float32
)


def latent_gp(y, tril=GP_TRIL):
    """A latent Gaussian process under a fixed squared-exponential kernel, scaled by a
    latent amplitude: its prior's parameters are constants, but its coordinates are
    nearly functions of their neighbours."""
    amp = numpyro.sample("amp", dist.HalfNormal(2.0))
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(y.shape[0]), scale_tril=tril))
    numpyro.sample("y", dist.Normal(amp * f, 0.4), obs=y)


def test_strongly_correlated_reads_the_conditional_variances():
    from numpyro_uha._decenter import CORRELATED_CONDITIONAL_VARIANCE, strongly_correlated

    assert strongly_correlated(GP_TRIL)
    assert not strongly_correlated(jnp.eye(5))
    assert not strongly_correlated(jnp.diag(jnp.array([1e-3, 1.0, 1e3])))  # scales alone
    # two coordinates of correlation r keep 1 - r² of the second's variance
    for r, expected in ((0.9, False), (0.96, True)):
        tril = np.linalg.cholesky(np.array([[1.0, r], [r, 1.0]]))
        assert (1 - r**2 < CORRELATED_CONDITIONAL_VARIANCE) == expected
        assert strongly_correlated(tril) == expected
        # batched: any member
        assert strongly_correlated(np.stack([np.eye(2), tril])) == expected


def test_auto_finds_a_fixed_but_strongly_correlated_prior():
    """f's parameters are constants (no funnel), but its prior is a smooth field: found;
    the same site under a weakly correlated fixed prior is not (nor is
    correlated_effects' identity ``fixed``)."""
    assert find_decenterable(latent_gp, (Y_GP,), {}) == ["f"]
    mild = jnp.asarray(np.linalg.cholesky(0.3 * np.ones((T_GP, T_GP)) + 0.7 * np.eye(T_GP)), jnp.float32)
    assert find_decenterable(latent_gp, (Y_GP, mild), {}) == []


@pytest.mark.parametrize("init", ["uniform", "value"])
def test_a_smooth_fields_non_centered_start_is_drawn_in_its_own_coordinates(init):
    """init_to_uniform's independent ±2 for f would be x̃ = L⁻¹ f₀, far out in the prior's
    tails: x̃ is drawn itself (|x̃| ≤ 2); a value the user gives f is kept."""
    from numpyro.infer.initialization import init_to_value

    f0 = jnp.asarray(np.random.default_rng(7).uniform(-2, 2, size=T_GP), jnp.float32)
    kwargs = {} if init == "uniform" else {"init_loc_fn": init_to_value(values={"f": f0})}
    guide = UHAGuide(latent_gp, K=2, decenter=["f"], warm_start_steps=0, **kwargs)
    numpyro.handlers.seed(guide, 0)(Y_GP)
    trace = _init_trace(guide, (Y_GP,))
    if init == "uniform":
        assert float(jnp.max(jnp.abs(trace["f_decentered"]["value"]))) <= 2.0
    else:
        np.testing.assert_allclose(trace["f"]["value"], f0, rtol=1e-3, atol=1e-3)
        # the mapped start is far out: what the uniform case avoids
        assert float(jnp.max(jnp.abs(trace["f_decentered"]["value"]))) > 10.0


def test_a_latent_gp_under_a_fixed_kernel_starts_non_centered():
    """decenter="auto" warm-starts both coordinate systems and keeps the non-centered
    one, many standard errors above the model's own (measured on a 32-point version:
    −22.32 against −32.23)."""
    guide = UHAGuide(latent_gp, K=2)
    svi = SVI(latent_gp, guide, optax.adam(1e-3), Trace_ELBO())
    svi.init(jax.random.PRNGKey(0), Y_GP)
    assert guide.decentered_sites == ("f",)
    (as_written, se_w), (non_centered, se_n) = (
        guide.coordinate_elbos["as_written"], guide.coordinate_elbos["non_centered"]
    )
    assert non_centered - as_written > max(10 * np.hypot(se_w, se_n), 2.0)
