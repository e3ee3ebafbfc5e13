"""``numpyro_uha.evaluation.log_z`` on NumPyro guides other than UHAGuide.

The model is the conjugate one of ``conjugate_model.py``. For ``AutoNormal`` its ELBO has
a closed form (Gaussian expectations of the Gaussian log densities, with ``tau`` scored in
its unconstrained log space), and the exact log Z is a Gaussian marginal likelihood, so
the estimates are checked against exact values; AutoDAIS (whose log weight is its own annealed
one) is checked against NumPyro's own ``Trace_ELBO`` on independent draws. Tolerances are 4 Monte Carlo standard errors.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDAIS, AutoNormal
from scipy.stats import multivariate_normal

from conjugate_model import N_OBS, NOISE_SD, PRIOR_SD, TAU_S, Y, model
from numpyro_uha.evaluation import log_z

NUM_DRAWS = 4000


def set_up(guide):
    """The guide's initial params (training would only add compilation time: every check
    below holds for any parameter values)."""
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    return svi.get_params(svi.init(jax.random.PRNGKey(0), Y))


@pytest.fixture(scope="module")
def auto_normal():
    guide = AutoNormal(model)
    params = set_up(guide)
    assert set(params) == {"mu_auto_loc", "mu_auto_scale", "tau_auto_loc", "tau_auto_scale"}
    # near the posterior (mean ≈ Y's mean, sd ≈ 0.22; tau's log ~ N(0, 0.5)), not at it
    mean = np.asarray(Y).mean(axis=0)
    params = {
        "mu_auto_loc": jnp.asarray(mean + 0.1),
        "mu_auto_scale": jnp.asarray([0.3, 0.15]),
        "tau_auto_loc": jnp.asarray(0.2),
        "tau_auto_scale": jnp.asarray(0.4),
    }
    return guide, params


def exact_log_z():
    """log p(y): per coordinate, y[:, d] ~ N(0, NOISE_SD² I + PRIOR_SD² 11ᵀ); tau's prior
    integrates to 1 (the likelihood ignores it)."""
    cov = NOISE_SD**2 * np.eye(N_OBS) + PRIOR_SD**2 * np.ones((N_OBS, N_OBS))
    y = np.asarray(Y, np.float64)
    return sum(multivariate_normal(np.zeros(N_OBS), cov).logpdf(y[:, d]) for d in range(2))


def expected_normal_log_density(loc, scale, mean, sd):
    """E[log N(x; mean, sd)] for x ~ N(loc, scale²)."""
    return -0.5 * math.log(2 * math.pi * sd**2) - ((loc - mean) ** 2 + scale**2) / (2 * sd**2)


def auto_normal_elbo(params):
    """The closed-form ELBO of AutoNormal on the conjugate model.

    q(mu) = N(m, s²) per coordinate; q(u) = N(m_u, s_u²) for u = log tau. In u, the
    LogNormal(0, TAU_S) prior with its Jacobian is N(u; 0, TAU_S), so
    ELBO = E log p(y | mu) + E log p(mu) + E log N(u; 0, TAU_S) + H(q(mu)) + H(q(u)).
    """
    m = np.asarray(params["mu_auto_loc"], np.float64)
    s = np.asarray(params["mu_auto_scale"], np.float64)
    m_u = float(params["tau_auto_loc"])
    s_u = float(params["tau_auto_scale"])
    y = np.asarray(Y, np.float64)
    likelihood = np.sum(expected_normal_log_density(m[None], s[None], y, NOISE_SD))
    prior_mu = np.sum(expected_normal_log_density(m, s, 0.0, PRIOR_SD))
    prior_u = expected_normal_log_density(m_u, s_u, 0.0, TAU_S)
    entropy = np.sum(0.5 * np.log(2 * math.pi * math.e * s**2)) + 0.5 * math.log(
        2 * math.pi * math.e * s_u**2
    )
    return float(likelihood + prior_mu + prior_u + entropy)


def trace_elbo(guide, params, seed, num_particles=NUM_DRAWS):
    """-Trace_ELBO loss averaged over ``num_particles`` draws, computed by NumPyro."""
    loss = Trace_ELBO(num_particles=num_particles).loss
    return -float(jax.jit(lambda key: loss(key, params, model, guide, Y))(jax.random.PRNGKey(seed)))


def test_auto_normal_elbo_matches_the_closed_form_and_trace_elbo(auto_normal):
    guide, params = auto_normal
    estimate = log_z(guide, jax.random.PRNGKey(1), params, Y, num_draws=NUM_DRAWS)
    assert estimate.num_draws == NUM_DRAWS and estimate.num_transitions is None
    assert estimate.elbo_se > 0
    exact_elbo = auto_normal_elbo(params)
    assert abs(estimate.elbo - exact_elbo) < 4 * estimate.elbo_se
    # NumPyro's Trace_ELBO on other draws: an independent estimate of the same mean, with
    # the same per-draw spread, so the difference has sd ≈ √2 · elbo_se
    assert abs(estimate.elbo - trace_elbo(guide, params, 2)) < 4 * math.sqrt(2) * estimate.elbo_se
    # both bounds lie below log Z (the IW bound within its error)
    log_z_exact = exact_log_z()
    assert exact_elbo < log_z_exact
    assert estimate.iw < log_z_exact + 4 * estimate.iw_se
    # q is not the posterior, so the ELBO is many standard errors below log Z
    assert log_z_exact - exact_elbo > 4 * estimate.elbo_se


# The untrained AutoDAIS has heavy-tailed weights (k̂ ≈ 1.7): log_z rightly warns.
@pytest.mark.filterwarnings("ignore::numpyro_uha.UHAFitWarning")
def test_auto_dais_log_z_is_its_own_annealed_elbo():
    guide = AutoDAIS(model, K=2)
    params = set_up(guide)
    estimate = log_z(guide, jax.random.PRNGKey(1), params, Y, num_draws=NUM_DRAWS)
    assert estimate.num_transitions == 2
    assert abs(estimate.elbo - trace_elbo(guide, params, 2)) < 4 * math.sqrt(2) * estimate.elbo_se
    # a lower bound (untrained, its weights are too uneven for the IW estimate's error bar)
    assert estimate.elbo < exact_log_z() - 4 * estimate.elbo_se


def test_log_z_rejects_what_is_not_a_trained_numpyro_guide(auto_normal):
    guide, params = auto_normal
    key = jax.random.PRNGKey(0)
    with pytest.raises(TypeError, match="expected a NumPyro guide.*got dict"):
        log_z({"loc": 0.0}, key, params, Y)

    def my_guide(y):
        pass

    with pytest.raises(TypeError, match="'my_guide' is not a NumPyro AutoGuide.*guide_log_weights"):
        log_z(my_guide, key, params, Y)
    with pytest.raises(RuntimeError, match="AutoNormal has not been set up"):
        log_z(AutoNormal(model), key, params, Y)
    partial = {name: value for name, value in params.items() if name != "tau_auto_scale"}
    with pytest.raises(ValueError, match="tau_auto_scale"):
        log_z(guide, key, partial, Y)
    with pytest.raises(ValueError, match="num_draws"):
        log_z(guide, key, params, Y, num_draws=1)


def test_a_poor_numpyro_guide_is_advised_without_uhas_knobs(auto_normal):
    """A poor AutoNormal fit (q far narrower than the posterior) warns with advice for
    such a guide, not UHAGuide's "larger K" and "max_step_size", which it lacks."""
    from numpyro_uha import UHAFitWarning

    guide, params = auto_normal
    narrow = dict(params, mu_auto_scale=jnp.asarray([0.02, 0.02]))
    with pytest.warns(UHAFitWarning, match="poor") as record:
        log_z(guide, jax.random.PRNGKey(3), narrow, Y, num_draws=500)
    message = " ".join(str(w.message) for w in record if issubclass(w.category, UHAFitWarning))
    assert "larger K" not in message and "max_step_size" not in message
    assert "UHAGuide" in message
