"""UHA vs NUTS moment comparison (numpyro_uha.evaluation.nuts).

One UHAGuide (K=4) is fitted once to the model with a closed-form posterior of
``conjugate_model.py``. NUTS runs once (500 warm-up, 1000 draws). Every
comparison uses N_DRAWS UHA draws, so the guide's draw function compiles once.

Tolerances come from the Monte Carlo standard errors of both sides: NUTS' from its
effective sample size, UHA's from its (independent, possibly weighted) draws.
"""

import math

import jax
import numpy as np
import numpyro
import pytest
from matplotlib.figure import Figure

from conjugate_model import Y, exact_draws, exact_moments, fit_guide
from numpyro_uha.evaluation.nuts import NUTSComparison, compare_with_nuts, plot_nuts_comparison

N_DRAWS = 4000
# Unweighted UHA draws follow the UHA approximation, not the posterior: after this short
# training (300 steps, K=4) its means are off by a few hundredths of a posterior sd
# (measured: ≲ 0.07 sd). Unweighted checks allow this much bias on top of the MC error.
BIAS_ALLOWANCE_SD = 0.1


@pytest.fixture(scope="module")
def fitted():
    return fit_guide()


@pytest.fixture(scope="module")
def comparison(fitted):
    """A real NUTS run against unweighted UHA draws."""
    guide, params = fitted
    return compare_with_nuts(
        guide, jax.random.PRNGKey(5), params, Y,
        num_warmup=500, num_samples=1000, num_draws=N_DRAWS,
    )


def combined_se(comp):
    return np.hypot(comp.table["nuts_se_of_mean"], comp.table["uha_se_of_mean"]).to_numpy()


def cov_se(samples, ess):
    """Elementwise MC standard error of the sample covariance of the flattened draws,
    sd((x_i - m_i)(x_j - m_j)) / sqrt(ESS)."""
    flat = np.concatenate([samples["mu"], samples["tau"][:, None]], axis=1)
    centered = flat - flat.mean(0)
    products = centered[:, :, None] * centered[:, None, :]
    return products.std(0) / np.sqrt(ess)


# ------------------------------------------------------------------- structure


def test_table_has_one_row_per_scalar(comparison):
    assert isinstance(comparison, NUTSComparison)
    table = comparison.table
    assert list(table["index"]) == ["mu[0]", "mu[1]", "tau"]
    assert list(table["site"]) == ["mu", "mu", "tau"]
    for column in (
        "nuts_mean", "nuts_std", "uha_mean", "uha_std", "mean_abs_error",
        "std_abs_error", "mean_error_in_sd", "nuts_se_of_mean", "uha_se_of_mean",
    ):
        assert np.all(np.isfinite(table[column])), column
    np.testing.assert_allclose(
        table["mean_abs_error"], np.abs(table["uha_mean"] - table["nuts_mean"])
    )
    np.testing.assert_allclose(
        table["mean_error_in_sd"], (table["uha_mean"] - table["nuts_mean"]) / table["nuts_std"]
    )
    assert list(comparison.summary.index) == ["mu", "tau"]
    assert list(comparison.summary["num_elements"]) == [2, 1]
    assert comparison.mean_mae == pytest.approx(table["mean_abs_error"].mean())
    assert comparison.std_mae == pytest.approx(table["std_abs_error"].mean())
    assert comparison.nuts_samples["mu"].shape == (1000, 2)
    assert comparison.uha_samples["mu"].shape == (N_DRAWS, 2)
    assert comparison.mcmc_se_of_mean["mu"].shape == (2,)
    assert comparison.mcmc_se_of_mean["tau"].shape == ()
    text = str(comparison)
    assert "mu[1]" in text and "covariance MAE" in text


# ------------------------------------------------------ accuracy vs closed form


def test_nuts_reference_matches_the_closed_form(comparison):
    """Validates the reference and its MC standard errors: NUTS' means lie within 4 of
    its own standard errors of the exact posterior means."""
    mean, _, _ = exact_moments()
    table = comparison.table
    np.testing.assert_array_less(
        np.abs(table["nuts_mean"] - mean), 4 * table["nuts_se_of_mean"]
    )


def test_unweighted_uha_means_are_close_to_nuts(comparison):
    _, sd, _ = exact_moments()
    error = comparison.table["mean_abs_error"].to_numpy()
    tolerance = 4 * combined_se(comparison) + BIAS_ALLOWANCE_SD * sd
    np.testing.assert_array_less(error, tolerance)
    assert np.all(np.abs(comparison.table["mean_error_in_sd"]) < 0.25)


def test_weighted_uha_means_match_nuts_within_monte_carlo_error(fitted, comparison):
    """Self-normalized importance weighting removes UHA's bias: only MC error is left."""
    guide, params = fitted
    weighted = compare_with_nuts(
        guide, jax.random.PRNGKey(5), params, Y,
        mcmc_samples=comparison.nuts_samples, num_draws=N_DRAWS, weighted=True,
    )
    assert weighted.weighted
    # the UHA moments are the self-normalized weighted ones
    log_w = weighted.uha_log_weights
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    flat = np.concatenate(
        [weighted.uha_samples["mu"], weighted.uha_samples["tau"][:, None]], axis=1
    )
    np.testing.assert_allclose(weighted.table["uha_mean"], w @ flat, rtol=1e-6)
    error = weighted.table["mean_abs_error"].to_numpy()
    np.testing.assert_array_less(error, 4 * combined_se(weighted))


def cov_tolerance(comp):
    """4 MC standard errors per covariance entry (NUTS' from its smallest ESS, UHA's from
    its independent draws), averaged over the entries, plus the unweighted-UHA bias
    allowance: BIAS_ALLOWANCE_SD relative error in each sd is ≈ 2·BIAS_ALLOWANCE_SD·var
    on the diagonal."""
    _, _, exact_cov = exact_moments()
    table = comp.table
    nuts_ess = np.min((table["nuts_std"] / table["nuts_se_of_mean"]) ** 2)
    se = np.hypot(cov_se(comp.nuts_samples, nuts_ess), cov_se(comp.uha_samples, N_DRAWS))
    allowance = 2 * BIAS_ALLOWANCE_SD * np.diag(exact_cov)
    return np.mean(4 * se) + np.sum(allowance) / exact_cov.size


def test_covariance_mae_is_within_monte_carlo_error(comparison):
    assert 0 < comparison.cov_mae < cov_tolerance(comparison)


def test_covariance_mae_detects_a_wrong_covariance(fitted, comparison):
    """The tolerance above is tight enough to catch a reference whose tau is twice as
    spread out (its variance 4x, an error of ≈ 1.1 on one of 9 entries)."""
    guide, params = fitted
    wrong = dict(comparison.nuts_samples)
    tau = wrong["tau"]
    wrong["tau"] = tau.mean() + 2 * (tau - tau.mean())
    comp = compare_with_nuts(
        guide, jax.random.PRNGKey(5), params, Y, mcmc_samples=wrong, num_draws=N_DRAWS
    )
    assert comp.cov_mae > cov_tolerance(comp)
    assert comp.summary.loc["tau", "std_abs_error"] > 0.4


# -------------------------------------------------------------- given samples


def test_given_samples_skip_nuts(fitted, monkeypatch):
    guide, params = fitted

    def no_mcmc(*args, **kwargs):
        raise AssertionError("NUTS must not run when mcmc_samples is given")

    monkeypatch.setattr(numpyro.infer, "MCMC", no_mcmc)
    reference = exact_draws(N_DRAWS, seed=0)
    comp = compare_with_nuts(
        guide, jax.random.PRNGKey(6), params, Y,
        mcmc_samples=reference, num_draws=N_DRAWS, weighted=True,
    )
    np.testing.assert_array_equal(comp.nuts_samples["mu"], reference["mu"])
    # independent reference draws: ESS ≈ number of draws, so se ≈ sd / sqrt(n)
    iid_se = comp.table["nuts_std"] / math.sqrt(N_DRAWS)
    np.testing.assert_allclose(comp.table["nuts_se_of_mean"], iid_se, rtol=0.15)
    np.testing.assert_array_less(comp.table["mean_abs_error"], 4 * combined_se(comp))


def test_missing_site_is_named(fitted):
    guide, params = fitted
    reference = exact_draws(100, seed=1)
    del reference["tau"]
    with pytest.raises(ValueError, match="tau"):
        compare_with_nuts(
            guide, jax.random.PRNGKey(6), params, Y, mcmc_samples=reference, num_draws=N_DRAWS
        )


def test_shape_mismatch_is_named(fitted):
    guide, params = fitted
    reference = exact_draws(100, seed=1)
    reference["mu"] = reference["mu"][:, :1]
    with pytest.raises(ValueError, match="'mu'"):
        compare_with_nuts(
            guide, jax.random.PRNGKey(6), params, Y, mcmc_samples=reference, num_draws=N_DRAWS
        )
    reference = exact_draws(100, seed=1)
    reference["tau"] = reference["tau"][:50]
    with pytest.raises(ValueError, match="'tau'"):
        compare_with_nuts(
            guide, jax.random.PRNGKey(6), params, Y, mcmc_samples=reference, num_draws=N_DRAWS
        )


# ----------------------------------------------------------------------- plot


def test_plot_returns_a_figure_with_two_panels(comparison):
    fig = plot_nuts_comparison(comparison)
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 2
    assert "MAE" in fig.axes[0].get_title() and "MAE" in fig.axes[1].get_title()
    # given axes are drawn on; max_elements limits the points and says so
    other = Figure()
    axes = other.subplots(1, 2)
    assert plot_nuts_comparison(comparison, ax=axes, max_elements=2) is other
    assert "first 2 of 3" in axes[0].get_title()
    with pytest.raises(ValueError, match="two"):
        plot_nuts_comparison(comparison, ax=axes[0])


# -------------------------------------------------- elements the support holds fixed


def test_an_lkj_factors_fixed_entries_are_compared_as_equal_not_inf_or_nan():
    import warnings

    import jax.numpy as jnp
    import numpyro.distributions as dist
    import optax
    from numpyro.infer import SVI, Trace_ELBO

    from numpyro_uha import UHAFitWarning, UHAGuide

    data = np.asarray(np.random.default_rng(0).normal(size=(30, 2)), np.float32)

    def model(y):
        L = numpyro.sample("L", dist.LKJCholesky(2, 2.0))
        numpyro.sample("y", dist.MultivariateNormal(jnp.zeros(2), scale_tril=L), obs=y)

    guide = UHAGuide(model, K=2, warm_start_steps=200)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), data))
    # a reference with L[0,0] = 1 and L[0,1] = 0 in every draw, as NUTS' are
    reference = guide.sample_posterior(jax.random.PRNGKey(1), params, data, sample_shape=(400,))
    reference = {"L": np.asarray(reference["L"]).copy()}
    reference["L"][:, 0, 0], reference["L"][:, 0, 1] = 1.0, 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no 0 / 0 from the fixed entries
        warnings.simplefilter("ignore", UHAFitWarning)  # a short fit's k̂: not this test's
        comp = compare_with_nuts(
            guide, jax.random.PRNGKey(2), params, data, mcmc_samples=reference, num_draws=400
        )
    table = comp.table.set_index("index")
    assert table.loc["L[0,0]", "mean_error_in_sd"] == 0.0
    assert table.loc["L[0,1]", "mean_error_in_sd"] == 0.0
    assert table.loc["L[0,0]", "nuts_se_of_mean"] == 0.0
    assert np.all(np.isfinite(table["mean_error_in_sd"]))
    assert np.isfinite(comp.summary.loc["L", "max_abs_mean_error_in_sd"])
    # a free entry keeps its ordinary ratio
    free = table.loc["L[1,0]"]
    expected = (free["uha_mean"] - free["nuts_mean"]) / free["nuts_std"]
    assert free["mean_error_in_sd"] == pytest.approx(expected)
