"""Discrete latent sites, summed out by enumeration (numpyro_uha/_enumerate.py).

A two-component mixture with known weights and offsets and one continuous latent, the
common mean mu: its evidence and each assignment's posterior are one-dimensional
integrals over mu, computed here by quadrature (float64), so the guide's weights, its
draws of the assignments and its ELBO terms are checked against exact values.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Predictive, Trace_ELBO
from scipy.special import logsumexp
from scipy.stats import norm

from numpyro_uha import UHAGuide

from tests.test_guide_weights import elbo_terms_and_core_weights, trace_enum_terms

OFFSETS = np.array([-1.5, 1.5])
WEIGHTS = np.array([0.3, 0.7])
PRIOR_SD = 2.0
Y = jnp.asarray(
    np.random.default_rng(0).normal(size=12) + np.array([-1.0, 2.5, 0.3, 1.8, -2.2, 1.1] * 2),
    jnp.float32,
)


def mixture(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD))
    with numpyro.plate("data", y.shape[0]):
        c = numpyro.sample("c", dist.Categorical(jnp.asarray(WEIGHTS)),
                           infer={"enumerate": "parallel"})
        numpyro.sample("y", dist.Normal(mu + jnp.asarray(OFFSETS)[c], 1.0), obs=y)


def unmarked_mixture(y):
    """The same model with a Bernoulli assignment and no enumerate annotation (NumPyro's
    NUTS enumerates such a site anyway, and so does the guide)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD))
    with numpyro.plate("data", y.shape[0]):
        c = numpyro.sample("c", dist.Bernoulli(WEIGHTS[1]))
        numpyro.sample("y", dist.Normal(mu + jnp.asarray(OFFSETS)[c], 1.0), obs=y)


def exact(y):
    """log Z and p(c_i = 1 | y), by quadrature over mu."""
    y = np.asarray(y, np.float64)
    grid = np.linspace(-12.0, 12.0, 48001)
    # log p(y_i, c_i = k | mu) on the grid: (grid, data, component)
    joint = np.log(WEIGHTS) + norm.logpdf(y[None, :, None], grid[:, None, None] + OFFSETS, 1.0)
    per_point = logsumexp(joint, axis=2)
    log_post = norm.logpdf(grid, 0.0, PRIOR_SD) + per_point.sum(axis=1)
    dx = grid[1] - grid[0]
    log_z = logsumexp(log_post) + np.log(dx)
    post = np.exp(log_post - logsumexp(log_post))
    responsibility = np.exp(joint[:, :, 1] - per_point)
    return log_z, post @ responsibility


@pytest.fixture(scope="module")
def fitted():
    guide = UHAGuide(mixture, K=6)
    svi = SVI(mixture, guide, optax.adam(3e-3), Trace_ELBO())
    params = svi.run(jax.random.PRNGKey(0), 300, Y, progress_bar=False).params
    return guide, params


@pytest.mark.slow
def test_weights_estimate_the_exact_evidence_and_the_draws_the_assignments_posterior(fitted):
    """The importance weights' mean is the exact evidence (the chain's target sums the
    assignments out), and the draws' weighted assignments have the exact posterior
    p(c_i = 1 | y); tolerances from the weights' Monte Carlo standard errors."""
    guide, params = fitted
    draws = guide.sample_posterior_with_log_weights(
        jax.random.PRNGKey(1), params, Y, sample_shape=(4000,)
    )
    log_z, p_c = exact(Y)
    log_w = np.asarray(draws.log_weights, np.float64)
    w = np.exp(log_w - log_w.max())
    rel_se = w.std() / w.mean() / np.sqrt(w.size)
    estimate = np.log(w.mean()) + log_w.max()
    assert abs(estimate - log_z) < 4 * rel_se + 1e-3, (estimate, log_z, rel_se)
    assert draws.samples["c"].shape == (4000, Y.shape[0])
    normalized = w / w.sum()
    ess = 1.0 / np.sum(normalized**2)
    weighted = normalized @ np.asarray(draws.samples["c"], np.float64)
    se = np.sqrt(np.maximum(p_c * (1 - p_c), 1e-4) / ess)
    np.testing.assert_array_less(np.abs(weighted - p_c), 4 * se)
    assert np.ptp(p_c) > 0.5  # assignments that the data decide, both ways


def test_every_elbos_term_is_the_marginals_log_weight(fitted):
    """Draw by draw, Trace_ELBO's term for the guide's joint draw (z, c) is the core's
    log weight on the marginal target with the same chain key: the guide's density
    carries log p(c | z, x), so log p(x, z, c) - log p(c | z, x) = log p(x, z) whatever
    c is. TraceEnum_ELBO (which seeds the guide alike) gives the same terms."""
    guide, params = fitted
    terms, log_w, _ = elbo_terms_and_core_weights(
        guide, params, mixture, Y, num_keys=4, keys_drawn=2
    )
    enum_terms = trace_enum_terms(guide, params, mixture, Y, num_keys=4)
    np.testing.assert_allclose(terms, log_w, rtol=1e-5, atol=2e-3)
    np.testing.assert_allclose(enum_terms, log_w, rtol=1e-5, atol=2e-3)
    assert np.std(log_w) > 1e-3


@pytest.mark.slow
def test_an_unmarked_bernoulli_site_is_enumerated_too():
    """No enumerate annotation: the site is summed out all the same (NumPyro's NUTS does
    the same), and the draws' assignments are Bernoulli values."""
    guide = UHAGuide(unmarked_mixture, K=2, warm_start_steps=50)
    svi = SVI(unmarked_mixture, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), Y))
    log_z = exact(Y)[0]
    value = guide.get_logdensity_fn(params, Y)(jnp.array([0.4]))
    grid_value = (
        norm.logpdf(0.4, 0.0, PRIOR_SD)
        + logsumexp(np.log(WEIGHTS) + norm.logpdf(np.asarray(Y)[:, None], 0.4 + OFFSETS), axis=1).sum()
    )
    np.testing.assert_allclose(float(value), grid_value, rtol=1e-5)
    draws = guide.sample_posterior(jax.random.PRNGKey(1), params, Y, sample_shape=(5,))
    assert set(np.unique(np.asarray(draws["c"]))) <= {0, 1}
    assert np.isfinite(log_z)


def poisson_latent(y):
    k = numpyro.sample("k", dist.Poisson(3.0))
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Normal(mu + k, 1.0).expand([y.shape[0]]).to_event(1), obs=y)


def sequential_site(y):
    k = numpyro.sample("k", dist.Bernoulli(0.5), infer={"enumerate": "sequential"})
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Normal(mu + k, 1.0).expand([y.shape[0]]).to_event(1), obs=y)


def markov_chain(y):
    from numpyro.contrib.funsor import markov

    loc = numpyro.sample("loc", dist.Normal(0.0, 1.0))
    x = 0
    for t in markov(range(y.shape[0])):
        x = numpyro.sample(f"x_{t}", dist.Bernoulli(jnp.where(x == 1, 0.9, 0.1)))
        numpyro.sample(f"y_{t}", dist.Normal(loc * x, 1.0), obs=y[t])


def masked_labels(y):
    """Labels observed where the mask is set (obs_mask on a discrete site)."""
    loc = numpyro.sample("loc", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        c = numpyro.sample(
            "c", dist.Bernoulli(0.5), obs=jnp.zeros(y.shape[0], jnp.int32),
            obs_mask=jnp.arange(y.shape[0]) < 1, infer={"enumerate": "parallel"},
        )
        numpyro.sample("y", dist.Normal(loc * c, 1.0), obs=y)


@pytest.mark.parametrize(
    "model, match",
    [
        (poisson_latent, r"'k' has a discrete distribution \(Poisson\) without finite support"),
        (sequential_site, r"'k' is marked infer=\{'enumerate': 'sequential'\}"),
    ],
    ids=["infinite-support", "sequential"],
)
def test_discrete_sites_it_cannot_sum_out_get_a_clear_error(model, match):
    guide = UHAGuide(model, K=2, warm_start_steps=0)
    with pytest.raises(ValueError, match=match):
        numpyro.handlers.seed(guide, 0)(jnp.zeros(3))


@pytest.mark.parametrize(
    "model, match",
    [
        (masked_labels, r"\['c_unobserved'\] come from obs_mask on a discrete site"),
        # 33 s; the obs-mask case runs the same prior draws by default
        pytest.param(markov_chain, r"needs an array of .* elements", marks=pytest.mark.slow),
    ],
    ids=["obs-mask", "markov-chain"],
)
def test_discrete_sites_it_cannot_draw_exactly_are_drawn_from_their_prior_with_a_warning(
    model, match
):
    """Summed out of the target all the same; the guide's draws of them are prior draws
    (tests/test_hidden_markov.py checks the bound and the draws), and it says why."""
    y = jnp.zeros(30 if model is markov_chain else 3)  # 2^30 table entries
    guide = UHAGuide(model, K=2, warm_start_steps=0)
    with pytest.warns(UserWarning, match=r"cannot draw them from their conditional.*" + match):
        numpyro.handlers.seed(guide, 0)(y)


def continuous_latent_in_scan_beside_a_discrete_one(y):
    """A continuous latent drawn at every step of a ``scan`` beside an enumerated state
    (NumPyro's capture-recapture example, model_2): NumPyro's enumeration fails on it with
    a bare AssertionError, in NUTS too."""
    from numpyro.contrib.control_flow import scan

    def step(z, y_t):
        phi = numpyro.sample("phi", dist.Uniform(0.0, 1.0))
        with numpyro.plate("animals", y.shape[0], dim=-1):
            z = numpyro.sample("z", dist.Bernoulli(phi * z + 0.05),
                               infer={"enumerate": "parallel"})
            numpyro.sample("y", dist.Bernoulli(0.9 * z + 0.05), obs=y_t)
        return z, None

    scan(step, jnp.ones(y.shape[0], jnp.int32), y.T)


def test_an_assertion_inside_numpyros_enumeration_is_named_as_numpyros():
    y = jnp.ones((4, 3))
    guide = UHAGuide(continuous_latent_in_scan_beside_a_discrete_one, K=2, warm_start_steps=0)
    with pytest.raises(ValueError) as raised:
        numpyro.handlers.seed(guide, 0)(y)
    message = str(raised.value)
    assert "NumPyro's enumeration failed inside NumPyro (AssertionError" in message
    assert "numpyro/contrib/funsor/" in message and "['z']" in message
    assert "inside numpyro.contrib.control_flow.scan" in message
    assert isinstance(raised.value.__cause__, AssertionError)


def test_a_warning_raised_as_an_error_does_not_change_which_sites_are_drawn(monkeypatch):
    """NumPyro's infer_discrete warns on some models (float64 requests on the annotation
    example's MACE model); with that warning turned into an error (``-W error``) the
    guide's check of its sampler took it for a failure and drew the sites from their
    prior. A warning from infer_discrete's first use (the guide's check) stands in for it
    here; the draws' own calls do not warn."""
    import numpyro.contrib.funsor as contrib_funsor

    original = contrib_funsor.infer_discrete
    calls = []

    def warning_infer_discrete(*args, **kwargs):
        if not calls:
            calls.append(1)
            warnings.warn("infer_discrete test warning", UserWarning)
        return original(*args, **kwargs)

    monkeypatch.setattr(contrib_funsor, "infer_discrete", warning_infer_discrete)
    y = jnp.zeros(3)
    guide = UHAGuide(mixture, K=2, warm_start_steps=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("error", message="infer_discrete test warning")
        numpyro.handlers.seed(guide, 0)(y)
    assert not [w for w in caught if "cannot draw them from their conditional" in str(w.message)]


def test_without_funsor_the_error_says_what_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "funsor", None)  # import funsor raises ImportError
    guide = UHAGuide(mixture, K=2, warm_start_steps=0)
    with pytest.raises(ImportError, match=r"\['c'\] are discrete.*numpyro-uha\[enum\]"):
        numpyro.handlers.seed(guide, 0)(Y)


def test_reference_draws_without_the_discrete_sites_map_to_the_chains_latent(fitted):
    """NUTS's draws of an enumerated model hold the continuous sites only: they map to
    the guide's flat latent (for sandwich and log_z_bracket) all the same."""
    guide, params = fitted
    draws = guide.sample_posterior_with_log_weights(
        jax.random.PRNGKey(3), params, Y, sample_shape=(6,)
    )
    latent = guide.latent_from_samples({"mu": draws.samples["mu"]}, Y)
    np.testing.assert_allclose(latent, draws.latent, rtol=1e-5, atol=1e-6)


IDX = jnp.array([0, 0, 1, 1, 2, 2])


def switch_on_the_group_mean(y):
    c = numpyro.sample("c", dist.Bernoulli(0.5))
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    with numpyro.plate("groups", 3):
        a = numpyro.sample("a", dist.Normal(mu + 2.0 * c, tau))
    with numpyro.plate("data", 6):
        numpyro.sample("y", dist.Normal(a[IDX], 1.0), obs=y)


def switch_on_the_data(y):
    c = numpyro.sample("c", dist.Bernoulli(0.5))
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    with numpyro.plate("groups", 3):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    with numpyro.plate("data", 6):
        numpyro.sample("y", dist.Normal(a[IDX] + 2.0 * c, 1.0), obs=y)


Y6 = jnp.array([0.5, 1.9, 2.4, 1.7, -0.3, 0.8])


def test_a_site_whose_loc_moves_with_a_discrete_site_is_not_non_centered():
    """Non-centered, a's value would be loc(c) + scale · ã and move with the summed-out
    c: "auto" leaves it as written (and an explicit request is refused); a site that
    does not depend on c is non-centered as before."""
    kept = UHAGuide(switch_on_the_group_mean, K=2, warm_start_steps=0)
    numpyro.handlers.seed(kept, 0)(Y6)
    assert kept.decentered_sites == ()
    with pytest.raises(ValueError, match=r"\['a'\] have a loc or scale that depends on"):
        numpyro.handlers.seed(
            UHAGuide(switch_on_the_group_mean, K=2, warm_start_steps=0, decenter=["a"]), 0
        )(Y6)
    moved = UHAGuide(switch_on_the_data, K=2, warm_start_steps=0)
    numpyro.handlers.seed(moved, 0)(Y6)
    assert moved.decentered_sites == ("a",)


def test_a_non_centered_site_beside_a_discrete_one_keeps_the_elbo_term_the_log_weight():
    """ã non-centered and c drawn by the guide: Trace_ELBO's term on the model as written
    is still the core's log weight, draw by draw."""
    guide = UHAGuide(switch_on_the_data, K=3, warm_start_steps=0)
    svi = SVI(switch_on_the_data, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), Y6))
    assert guide.decentered_sites == ("a",)
    terms, log_w, _ = elbo_terms_and_core_weights(
        guide, params, switch_on_the_data, Y6, num_keys=4, keys_drawn=2
    )
    np.testing.assert_allclose(terms, log_w, rtol=1e-5, atol=2e-3)
    assert np.std(log_w) > 1e-2


def mixture_bounded_by_a_latent(y):
    """x's support, (0, b), moves with the latent b; each point's sign is summed out."""
    b = numpyro.sample("b", dist.Exponential(0.5))
    x = numpyro.sample("x", dist.Uniform(0.0, b))
    with numpyro.plate("data", y.shape[0]):
        c = numpyro.sample("c", dist.Bernoulli(0.4), infer={"enumerate": "parallel"})
        numpyro.sample("y", dist.Normal(jnp.where(c == 1, x, -x), 1.0), obs=y)


def test_the_discrete_draw_conditions_on_x_in_the_support_the_model_draws():
    """p(c | z, x) at the chain's end is evaluated at x mapped through (0, b) for the
    drawn b, as the chain's target and the emitted x are: the ELBO term stays the
    marginal's log weight."""
    guide = UHAGuide(mixture_bounded_by_a_latent, K=3, warm_start_steps=0, decenter=False)
    svi = SVI(mixture_bounded_by_a_latent, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), Y6))
    params = {**params, "auto_loc": params["auto_loc"] + jnp.array([1.0, 0.5])}  # b far from 1
    terms, log_w, _ = elbo_terms_and_core_weights(
        guide, params, mixture_bounded_by_a_latent, Y6, num_keys=4, keys_drawn=2
    )
    np.testing.assert_allclose(terms, log_w, rtol=1e-5, atol=2e-3)
    assert np.std(log_w) > 1e-2


def test_a_model_that_does_not_broadcast_under_enumeration_gets_a_hint():
    """A batch declared by .expand().to_event() instead of a plate cannot take the
    enumeration dimension (NumPyro's NUTS raises the same): the error says why."""
    def unplated(y):
        k = numpyro.sample("k", dist.Bernoulli(0.5))
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(mu * k, 1.0).expand([y.shape[0]]).to_event(1), obs=y)

    guide = UHAGuide(unplated, K=2, warm_start_steps=0)
    with pytest.raises(ValueError, match=r"enumerated, as NumPyro's NUTS.*numpyro.plate"):
        numpyro.handlers.seed(guide, 0)(Y6)

    # the hint for a scope's plates is not given where no scope renames them
    with pytest.raises(ValueError) as info:
        numpyro.handlers.seed(guide, 0)(Y6)
    assert "numpyro.handlers.scope" not in str(info.value)


def test_a_mixture_whose_plates_a_scope_renames_gets_the_scope_hint():
    """Under numpyro.handlers.scope the plate 'data' is renamed 'm/data', which
    enumeration's plate dimensions do not follow (NumPyro's NUTS raises too): the error
    names the scope and hide_types=['plate'], with which the guide sets up."""
    scoped = numpyro.handlers.scope(mixture, prefix="m")
    with pytest.raises(ValueError, match=r"scope \(prefix 'm'\).*hide_types=\['plate'\]"):
        numpyro.handlers.seed(UHAGuide(scoped, K=2, warm_start_steps=0), 0)(Y6)
    fixed = numpyro.handlers.scope(mixture, prefix="m", hide_types=["plate"])
    guide = UHAGuide(fixed, K=2, warm_start_steps=0)
    SVI(fixed, guide, optax.adam(1e-3), Trace_ELBO()).init(jax.random.PRNGKey(0), Y6)
    assert "m/mu" in guide.prototype_trace


def mixture_with_a_deterministic_mean(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD))
    with numpyro.plate("data", y.shape[0]):
        c = numpyro.sample("c", dist.Categorical(jnp.asarray(WEIGHTS)),
                           infer={"enumerate": "parallel"})
        mean = numpyro.deterministic("mean", mu + jnp.asarray(OFFSETS)[c])
        numpyro.sample("y", dist.Normal(mean, 1.0), obs=y)


@pytest.mark.parametrize("model", [mixture, mixture_with_a_deterministic_mean])
def test_the_exports_log_likelihood_sums_each_points_assignment_out(model):
    """ArviZ export: log p(y_i | mu) = log Σ_k w_k N(y_i; mu + a_k, 1) at each draw's mu
    (not log N(y_i; mu + a_{c_i}, 1) at the drawn c_i), also where the mean passes
    through a deterministic site (held at its drawn value, it would not follow c)."""
    from numpyro_uha.evaluation import to_inference_data

    guide = UHAGuide(model, K=2, warm_start_steps=50)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), Y))
    idata = to_inference_data(guide, jax.random.PRNGKey(2), params, Y, num_samples=20)
    assert idata.posterior["c"].shape == (1, 20, Y.shape[0])
    mu = np.asarray(idata.posterior["mu"]).reshape(-1)
    expected = logsumexp(
        np.log(WEIGHTS) + norm.logpdf(
            np.asarray(Y, np.float64)[None, :, None], mu[:, None, None] + OFFSETS, 1.0
        ),
        axis=2,
    )
    np.testing.assert_allclose(
        np.asarray(idata.log_likelihood["y"]).reshape(20, -1), expected, rtol=1e-5, atol=1e-4
    )


@pytest.mark.slow
def test_a_shared_discrete_site_is_held_at_its_draw_in_the_log_likelihood():
    """A global switch c (shared by all points) is a parameter to LOO: the pointwise
    log-likelihood conditions on its drawn value."""
    from numpyro_uha.evaluation import to_inference_data

    guide = UHAGuide(switch_on_the_data, K=2, warm_start_steps=50)
    svi = SVI(switch_on_the_data, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), Y6))
    idata = to_inference_data(guide, jax.random.PRNGKey(2), params, Y6, num_samples=20)
    a = np.asarray(idata.posterior["a"]).reshape(20, 3)
    c = np.asarray(idata.posterior["c"]).reshape(20)
    expected = norm.logpdf(np.asarray(Y6)[None], a[:, np.asarray(IDX)] + 2.0 * c[:, None], 1.0)
    np.testing.assert_allclose(
        np.asarray(idata.log_likelihood["y"]).reshape(20, -1), expected, rtol=1e-5, atol=1e-4
    )


def padded_mixture(y, keep):
    """``mixture`` with padding: the points where ``keep`` is False are masked out, their
    assignments too."""
    mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD))
    with numpyro.plate("data", y.shape[0]), numpyro.handlers.mask(mask=keep):
        c = numpyro.sample("c", dist.Categorical(jnp.asarray(WEIGHTS)))
        numpyro.sample("y", dist.Normal(mu + jnp.asarray(OFFSETS)[c], 1.0), obs=y)


def test_padding_changes_neither_the_target_nor_the_kept_points_log_likelihood():
    """Masked-out assignments count nothing (summed out, each would count log 2): the
    padded model's target is the unpadded one's at every z, its ELBO terms are the
    weights, and the export's pointwise log-likelihood is the unpadded model's at the kept
    points and 0 at the padding."""
    from numpyro_uha.evaluation import to_inference_data

    padded_y = jnp.concatenate([Y, jnp.full(4, 9.0)])
    keep = jnp.arange(padded_y.shape[0]) < Y.shape[0]
    guide = UHAGuide(padded_mixture, K=2, warm_start_steps=0)
    svi = SVI(padded_mixture, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), padded_y, keep))
    target = guide.get_logdensity_fn(params, padded_y, keep)
    for mu in [-0.5, 0.4, 1.3]:
        by_hand = norm.logpdf(mu, 0.0, PRIOR_SD) + logsumexp(
            np.log(WEIGHTS) + norm.logpdf(np.asarray(Y)[:, None], mu + OFFSETS), axis=1
        ).sum()
        np.testing.assert_allclose(float(target(jnp.array([mu]))), by_hand, rtol=1e-5)
    terms, log_w, _ = elbo_terms_and_core_weights(
        guide, params, padded_mixture, padded_y, keep, num_keys=3, keys_drawn=2
    )
    np.testing.assert_allclose(terms, log_w, rtol=1e-5, atol=2e-3)
    idata = to_inference_data(guide, jax.random.PRNGKey(2), params, padded_y, keep,
                              num_samples=10)
    mu = np.asarray(idata.posterior["mu"]).reshape(-1)
    expected = logsumexp(
        np.log(WEIGHTS) + norm.logpdf(
            np.asarray(Y, np.float64)[None, :, None], mu[:, None, None] + OFFSETS, 1.0
        ),
        axis=2,
    )
    pointwise = np.asarray(idata.log_likelihood["y"]).reshape(10, -1)
    np.testing.assert_allclose(pointwise[:, : Y.shape[0]], expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(pointwise[:, Y.shape[0]:], 0.0, atol=1e-6)


def _sized_mixture(y=None, n=None):
    """``mixture`` whose size can be given without data (Predictive at new points)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD))
    with numpyro.plate("data", y.shape[0] if y is not None else n):
        c = numpyro.sample("c", dist.Categorical(jnp.asarray(WEIGHTS)),
                           infer={"enumerate": "parallel"})
        numpyro.sample("y", dist.Normal(mu + jnp.asarray(OFFSETS)[c], 1.0), obs=y)


def test_predictive_without_data_draws_the_assignments_of_the_training_posterior():
    """Predictive without y: at the training size the assignments (and mu) are those of
    the call given y, with the same key; at another size the assignments, one per data
    point, have no posterior from this guide, and the error names c and both shapes
    (not a broadcasting error from inside the model)."""
    guide = UHAGuide(_sized_mixture, K=2, warm_start_steps=0)
    svi = SVI(_sized_mixture, guide, optax.adam(1e-2), Trace_ELBO())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Trace_ELBO and discrete sites
        params = svi.get_params(svi.init(jax.random.PRNGKey(0), Y))
    predictive = Predictive(
        _sized_mixture, guide=guide, params=params, num_samples=8, return_sites=["mu", "c", "y"]
    )
    given = predictive(jax.random.PRNGKey(1), Y)
    withheld = predictive(jax.random.PRNGKey(1), None, Y.shape[0])
    for name in ("mu", "c"):
        np.testing.assert_array_equal(withheld[name], given[name])
    assert not np.array_equal(withheld["y"], given["y"])  # drawn, not the data
    with pytest.raises(ValueError, match=r"'c' \(5,\) instead of \(12,\)"):
        predictive(jax.random.PRNGKey(1), None, 5)
