"""annealing_diagnostics and plot_annealing: the split of each log weight into its
annealing part and its energy part, checked where the split is known exactly (q set to
the posterior: the annealing part is log Z for every draw), and the figure's contract."""

import math

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_uha import UHAGuide
from numpyro_uha.evaluation import (
    AnnealingDiagnostics,
    annealing_diagnostics,
    plot_annealing,
    psis_khat,
)
from tests import conjugate_model as cm

matplotlib.use("Agg")

NUM_DRAWS = 2000


def exact_log_z():
    """log p(y) of the conjugate model (tau's prior integrates to 1), in float64."""
    y = np.asarray(cm.Y, np.float64)
    n, s2, v2 = y.shape[0], cm.PRIOR_SD**2, cm.NOISE_SD**2
    total = 0.0
    for column in y.T:  # each coordinate: y_i = mu + noise, mu ~ N(0, s2)
        total += (
            -0.5 * n * math.log(2 * math.pi * v2)
            - 0.5 * math.log(1 + n * s2 / v2)
            - 0.5 / v2 * (np.sum(column**2) - s2 * np.sum(column) ** 2 / (v2 + n * s2))
        )
    return total


@pytest.fixture(scope="module")
def exact_q():
    """A UHAGuide(K=4) whose q is the exact posterior in the unconstrained space (mu's
    conjugate normal, log tau's N(0, TAU_S)), the other parameters at their initial
    values; and params with every step size four times larger."""
    guide = UHAGuide(cm.model, K=4, warm_start_steps=0)
    svi = SVI(cm.model, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), cm.Y))
    mean, sd, _ = cm.exact_moments()
    params = dict(
        params,
        auto_loc=jnp.asarray([mean[0], mean[1], 0.0], jnp.float32),
        auto_scale_tril=jnp.diag(jnp.asarray([sd[0], sd[1], cm.TAU_S], jnp.float32)),
    )
    larger = dict(params, auto_step_size=params["auto_step_size"] * 4.0)
    return guide, params, larger


def test_with_q_the_posterior_the_annealing_part_is_log_z(exact_q):
    """q = p̄ / Z: every bridge is the posterior, so each draw's annealing part is
    log Z exactly (float32 rounding), all of log w's spread is the energy part, and
    E[exp(energy part)] = E[w] / Z = 1 within 4 Monte Carlo standard errors."""
    guide, params, _ = exact_q
    d = annealing_diagnostics(guide, jax.random.PRNGKey(1), params, cm.Y, num_draws=NUM_DRAWS)
    assert isinstance(d, AnnealingDiagnostics)
    log_z = exact_log_z()
    np.testing.assert_allclose(d.annealing_part, log_z, atol=2e-4)
    assert d.energy_part.std() > 10 * d.annealing_part.std()
    assert d.energy_part.std() > 1e-3  # the steps are not infinitesimal: a real check
    np.testing.assert_allclose(d.annealing_part + d.energy_part, d.log_weights, atol=1e-9)
    ratio = np.exp(d.energy_part)
    se = ratio.std() / math.sqrt(ratio.size)
    assert abs(ratio.mean() - 1.0) < 4 * se, (ratio.mean(), se)


def test_the_summaries_are_those_of_the_guides_draws(exact_q):
    """The same draws as sample_posterior_with_log_weights with the key; the learned
    schedule; k̂ and the ESS of those weights; the acceptance a Metropolis test would
    give is min(1, exp(−ΔH)), in [0, 1]; the energy quantiles are ordered."""
    guide, params, _ = exact_q
    key = jax.random.PRNGKey(2)
    d = annealing_diagnostics(guide, key, params, cm.Y, num_draws=500)
    draws = guide.sample_posterior_with_log_weights(key, params, cm.Y, sample_shape=(500,))
    np.testing.assert_array_equal(d.log_weights, np.asarray(draws.log_weights, np.float64))
    annealing = guide.get_annealing_params(params)
    np.testing.assert_array_equal(d.betas, annealing.betas)
    np.testing.assert_array_equal(d.step_sizes, annealing.step_sizes)
    assert d.elbo == pytest.approx(float(np.mean(d.log_weights)))
    assert d.khat == pytest.approx(psis_khat(draws.log_weights), abs=1e-6)
    w = np.exp(d.log_weights - d.log_weights.max())
    assert d.ess == pytest.approx(w.sum() ** 2 / np.sum(w**2))
    lar = np.asarray(draws.info.log_accept_ratio, np.float64)
    np.testing.assert_allclose(d.acceptance, np.exp(np.minimum(lar, 0)).mean(0), rtol=1e-12)
    assert np.all((0 <= d.acceptance) & (d.acceptance <= 1))
    assert np.all(np.diff(d.energy_error, axis=1) >= 0)
    assert d.energy_error.shape == (4, 3) and d.num_dropped == 0


def test_larger_steps_show_larger_energy_errors(exact_q):
    """Step sizes four times larger: a larger median |ΔH| at every transition, a lower
    acceptance, and a wider energy part."""
    guide, params, larger = exact_q
    key = jax.random.PRNGKey(3)
    small = annealing_diagnostics(guide, key, params, cm.Y, num_draws=500)
    large = annealing_diagnostics(guide, key, larger, cm.Y, num_draws=500)
    assert np.all(large.energy_error[:, 1] > small.energy_error[:, 1])
    assert large.acceptance.mean() < small.acceptance.mean()
    assert large.energy_part.std() > small.energy_part.std()


def test_the_figure_has_a_panel_per_question(exact_q):
    guide, params, _ = exact_q
    d = annealing_diagnostics(guide, jax.random.PRNGKey(1), params, cm.Y, num_draws=200)
    fig = plot_annealing(d)
    assert len(fig.axes) == 5  # four panels, the schedule's step sizes on a twin axis
    titles = [a.get_title() for a in fig.axes]
    assert any(f"k̂ {d.khat:.2f}" in t for t in titles)
    assert any("where log w varies" in t for t in titles)
    losses = np.linspace(10.0, 1.0, 300)
    fig = plot_annealing(d, losses=losses)
    assert any(a.get_title() == "training" for a in fig.axes)
    from matplotlib.figure import Figure

    axes = Figure().subplots(2, 2)
    assert plot_annealing(d, ax=axes) is axes[0, 0].figure


def test_bad_input_is_named(exact_q):
    guide, params, _ = exact_q
    with pytest.raises(TypeError, match="UHAGuide, got AutoNormal"):
        annealing_diagnostics(AutoNormal(cm.model), jax.random.PRNGKey(0), {}, cm.Y)
    with pytest.raises(ValueError, match="num_draws"):
        annealing_diagnostics(guide, jax.random.PRNGKey(0), params, cm.Y, num_draws=1)
    d = annealing_diagnostics(guide, jax.random.PRNGKey(1), params, cm.Y, num_draws=50)
    with pytest.raises(TypeError, match="AnnealingDiagnostics"):
        plot_annealing({"khat": 0.1})
    from matplotlib.figure import Figure

    with pytest.raises(ValueError, match="ax must be 5 matplotlib Axes"):
        plot_annealing(d, ax=Figure().subplots(2, 2), losses=[1.0, 0.5])
    with pytest.raises(ValueError, match="losses must be a non-empty"):
        plot_annealing(d, losses=[])


def test_a_poor_fit_warns_at_the_callers_line(exact_q):
    """q five times too narrow: the weights' k̂ is bad, and the warning names
    annealing_diagnostics and points at the line that called it."""
    from numpyro_uha import UHAFitWarning

    guide, params, _ = exact_q
    narrow = dict(params, auto_scale_tril=params["auto_scale_tril"] * 0.2)
    with pytest.warns(UHAFitWarning) as caught:
        d = annealing_diagnostics(guide, jax.random.PRNGKey(4), narrow, cm.Y, num_draws=500)
    ours = [w for w in caught if "annealing_diagnostics" in str(w.message)]
    assert ours and all(w.filename == __file__ for w in ours)
    assert d.khat >= 0.7
