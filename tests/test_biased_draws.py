"""The draws' check against their own weights: where the self-normalized importance
weights move a latent coordinate's mean by more than ``SHIFT_BAD`` sds and by more than
``SHIFT_SE_BAD`` standard errors, ``sample_posterior`` says the draws are biased there
(k̂ can be fine: the weighted estimates correct what the draws miss); where they widen
or narrow its sd by more than a factor ``1 + SPREAD_BAD`` and ``SHIFT_SE_BAD`` standard
errors, that the draws are too narrow (too wide) there. The check on a
fitted guide is in test_fit_worse_than_start.py, beside the other fit warnings (one fit
for the module)."""

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_uha._weights import (
    SPREAD_BAD,
    check_values,
    draw_checks,
    summary_from_values,
    summary_values,
    weighted_shift,
    weighted_spread,
)

_weighted_shift = jax.jit(weighted_shift)
_weighted_spread = jax.jit(weighted_spread)


def misspread_coordinates(log_weights, finite, latent):
    return draw_checks(log_weights, finite, latent)[1]


def _gaussian_draws(key, n, offset):
    """n draws of z ~ N(offset, 1) (three coordinates, the others at offset 0) weighted
    towards N(0, 1): the exact shift of coordinate 0's mean is −offset sds."""
    z = jax.random.normal(key, (n, 3)) + jnp.array([offset, 0.0, 0.0])
    log_w = -0.5 * (z[:, 0] ** 2 - (z[:, 0] - offset) ** 2)
    return log_w, z


def test_the_shift_and_its_standard_error_are_right():
    """Over 2000 independent sets of 500 draws: the mean shift is the exact −0.5 sds
    within 4 of its standard errors, and the standard error the function reports is the
    spread of the differences of means across the sets (within 4 times the relative
    error of a standard deviation from 2000 sets, 1 / sqrt(2 · 1999)); an unshifted
    coordinate's shift is 0 within 4 standard errors. (Weighting by (w̃ − 1/n) alone,
    without the plain mean's own term, overstates the error by 17 %: caught.)"""
    reps, n, offset = 2000, 500, 0.5
    keys = jax.random.split(jax.random.PRNGKey(0), reps)
    log_w, z = jax.vmap(lambda k: _gaussian_draws(k, n, offset))(keys)
    finite = jnp.ones((reps, n), bool)
    shift, se = map(np.asarray, jax.vmap(_weighted_shift)(log_w, finite, z))
    mc = shift.std(0, ddof=1) / np.sqrt(reps)
    assert abs(shift[:, 0].mean() + offset) < 4 * mc[0]
    assert np.all(np.abs(shift[:, 1:].mean(0)) < 4 * mc[1:])
    # se is the difference of the means' error, in units of each set's sd (the
    # significance of the difference; the sd itself varies with the set)
    sd = np.asarray(z).std(axis=1, ddof=1)
    rel = 1 / np.sqrt(2 * (reps - 1))
    np.testing.assert_allclose((se * sd).mean(0), (shift * sd).std(0, ddof=1), rtol=4 * rel)


def test_nonfinite_draws_are_left_out():
    log_w, z = _gaussian_draws(jax.random.PRNGKey(1), 600, 0.5)
    finite = jnp.arange(600) < 400
    bad = (jnp.where(finite, log_w, jnp.nan), jnp.where(finite[:, None], z, jnp.inf))
    shift, se = _weighted_shift(*bad[:1], finite, bad[1])
    kept = _weighted_shift(log_w[:400], jnp.ones(400, bool), z[:400])
    np.testing.assert_allclose(shift, kept[0], rtol=1e-5)
    np.testing.assert_allclose(se, kept[1], rtol=1e-5)


def test_numpy_computes_what_the_device_program_does():
    """The formulas in NumPy (float64, a reference) give the numbers of the float32
    program the draws' checks run, non-finite draws left out alike."""
    log_w, z = _gaussian_draws(jax.random.PRNGKey(2), 700, 0.8)
    finite = jnp.arange(700) % 7 != 3
    log_w = jnp.where(finite, log_w, jnp.nan)
    on_device = _weighted_shift(log_w, finite, z)
    with np.errstate(invalid="ignore"):
        on_host = weighted_shift(
            np.asarray(log_w, np.float64), np.asarray(finite), np.asarray(z, np.float64), xp=np
        )
    np.testing.assert_allclose(on_host[0], on_device[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(on_host[1], on_device[1], rtol=1e-4)


def _bounded_weights(key, n, strength):
    """n draws of z ~ N(0, 1) (two coordinates) with log weights ``strength ·
    tanh(z_0² / 2)``: bounded weights (every moment finite, so the delta method's error
    is itself well estimated) that favour coordinate 0's tails, widening its sd."""
    z = jax.random.normal(key, (n, 2))
    return strength * jnp.tanh(z[:, 0] ** 2 / 2), z


def _exact_log_sd_ratio(strength):
    """The log sd of N(0, 1) reweighted by exp(strength · tanh(z² / 2)), over 1: by
    quadrature on a fine grid."""
    grid = np.linspace(-12.0, 12.0, 200_001)
    weight = np.exp(strength * np.tanh(grid**2 / 2) - grid**2 / 2)
    mean = (weight * grid).sum() / weight.sum()
    return 0.5 * np.log((weight * (grid - mean) ** 2).sum() / weight.sum())


def test_the_sd_ratio_and_its_standard_error_are_right():
    """Over 1000 independent sets of 4000 draws: the log sd ratio is the exact one (by
    quadrature) within 4 of its Monte Carlo errors (the estimator's O(1/n) bias, ~1 of
    them at this n, included), an unweighted coordinate's is 0 within 4, and the
    standard error the function reports is the spread of the estimates across the sets
    (within 4 times the relative error of a standard deviation from 1000 sets).
    (Without the plain variance's own term in the influence the error comes out 3-4
    times too large, without the sd's factor ½ twice; with the ratio's sign flipped the
    estimate is off: each caught.)"""
    reps, n, strength = 1000, 4000, 1.0
    keys = jax.random.split(jax.random.PRNGKey(0), reps)
    log_w, z = jax.vmap(lambda k: _bounded_weights(k, n, strength))(keys)
    log_ratio, se = map(
        np.asarray, jax.vmap(_weighted_spread)(log_w, jnp.ones((reps, n), bool), z)
    )
    mc = log_ratio.std(0, ddof=1) / np.sqrt(reps)
    assert abs(log_ratio[:, 0].mean() - _exact_log_sd_ratio(strength)) < 4 * mc[0]
    assert abs(log_ratio[:, 1].mean()) < 4 * mc[1]
    rel = 1 / np.sqrt(2 * (reps - 1))
    np.testing.assert_allclose(se.mean(0), log_ratio.std(0, ddof=1), rtol=4 * rel)


def test_too_narrow_and_too_wide_draws_are_flagged_and_exact_ones_are_not():
    """4000 draws: coordinate 0 from N(0, 0.75²) (too narrow) or N(0, 1.4²) (too wide),
    weighted towards N(0, 1); coordinates 1 and 2 exact draws of N(0, 1), their weights
    unrelated to them. The narrow coordinate is flagged with a positive log ratio (the
    weights widen it: exactly log(1 / 0.75)), the wide one with a negative one, the
    exact ones never; equal weights give exactly 0."""
    key = jax.random.PRNGKey(3)
    for sd, sign in ((0.75, 1.0), (1.4, -1.0)):
        z = jax.random.normal(key, (4000, 3)) * jnp.array([sd, 1.0, 1.0])
        log_w = -0.5 * z[:, 0] ** 2 * (1.0 - 1.0 / sd**2)
        log_ratio, se, flagged = misspread_coordinates(log_w, jnp.ones(4000, bool), z)
        assert list(flagged) == [0], (sd, log_ratio, se)
        assert np.sign(log_ratio[0]) == sign
        assert abs(log_ratio[0] - np.log(1.0 / sd)) < 4 * se[0]
        assert abs(log_ratio[0]) > np.log1p(SPREAD_BAD)
    z = jax.random.normal(key, (4000, 3))
    log_ratio, _, flagged = misspread_coordinates(jnp.zeros(4000), jnp.ones(4000, bool), z)
    assert flagged.size == 0 and np.all(log_ratio == 0.0)


def test_the_spread_on_the_host_is_the_device_programs():
    """The spread's formulas in NumPy (float64) give the float32 program's numbers, as
    the shift's, non-finite draws left out alike."""
    log_w, z = _bounded_weights(jax.random.PRNGKey(4), 700, 1.5)
    finite = jnp.arange(700) % 7 != 3
    log_w = jnp.where(finite, log_w, jnp.nan)
    on_device = _weighted_spread(log_w, finite, z)
    kept = _weighted_spread(log_w[np.asarray(finite)], jnp.ones(600, bool), z[np.asarray(finite)])
    with np.errstate(invalid="ignore"):
        on_host = weighted_spread(
            np.asarray(log_w, np.float64), np.asarray(finite), np.asarray(z, np.float64), xp=np
        )
    for got in (on_host, kept):
        np.testing.assert_allclose(got[0], on_device[0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[1], on_device[1], rtol=1e-4)


def test_the_checks_made_beside_the_weight_summary_are_the_first_draws_own():
    """The draws' program makes the checks beside the weight summary, over the first
    ``num_valid`` draws of a padded chunk (the rest are dropped): the same numbers as
    :func:`check_values` of those draws alone, the summary's own values unchanged; with
    the ``check`` flag off, zeros (the same program, the work skipped)."""
    log_w, z = _gaussian_draws(jax.random.PRNGKey(5), 1024, 0.6)
    finite = jnp.arange(1024) % 11 != 4
    log_w = jnp.where(finite, log_w, jnp.nan)
    program = jax.jit(summary_values, static_argnames="num_largest")
    n, largest = 1000, 24
    with_checks = summary_from_values(
        program(log_w, finite, -1.0, largest, num_valid=n, latent=z, check=True),
        n, largest, latent_dim=3,
    )
    alone = np.asarray(check_values(log_w[:n], finite[:n], z[:n]))
    np.testing.assert_allclose(with_checks.checks, alone, rtol=1e-5, atol=1e-6)
    plain = summary_from_values(program(log_w, finite, -1.0, largest, num_valid=n), n, largest)
    assert plain.checks is None
    assert with_checks._replace(checks=None, largest=None) == plain._replace(largest=None)
    np.testing.assert_array_equal(with_checks.largest, plain.largest)
    skipped = summary_from_values(
        program(log_w, finite, -1.0, largest, num_valid=n, latent=z, check=False),
        n, largest, latent_dim=3,
    )
    assert np.all(skipped.checks == 0.0)


def test_a_coordinate_far_from_zero_against_its_sd_keeps_its_precision():
    """10 000 float32 draws of 1000 ± 0.01 (a raw-scale intercept): the device program's
    shifts and sd ratios are the float64 ones (summed unshifted, the means came out a
    whole sd apart and the sds 0.1 of each other)."""
    rng = np.random.default_rng(0)
    z = (1000.0 + 0.01 * rng.normal(size=(10000, 2))).astype(np.float32)
    log_w = (0.3 * rng.normal(size=10000)).astype(np.float32)
    finite = np.ones(10000, bool)
    on_device = np.asarray(jax.jit(check_values)(log_w, finite, z))
    with np.errstate(invalid="ignore"):
        exact = check_values(log_w.astype(np.float64), finite, z.astype(np.float64), xp=np)
    np.testing.assert_allclose(on_device, exact, atol=2e-3)
    (_, _, biased), (_, _, misspread) = draw_checks(log_w, finite, z)
    assert biased.size == 0 and misspread.size == 0


def test_a_fitted_guide_far_from_zero_is_not_called_off():
    """A fitted guide whose posterior is 1000 ± 0.01 (y ~ N(mu, 0.1), 100 points near
    1000): 10 000 draws, in one chunk (the chain's program makes the checks) and in ten
    (the summary's program): no UHADrawsOffWarning (both gave one, "by +1.00 sds",
    before the draws were shifted by the first one)."""
    import warnings

    import numpyro
    import numpyro.distributions as dist
    import optax
    from numpyro.infer import SVI, Trace_ELBO

    from numpyro_uha import UHADrawsOffWarning, UHAGuide

    y = np.asarray(1000.0 + 0.1 * np.random.default_rng(0).normal(size=100), np.float32)

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(1000.0, 100.0))
        numpyro.sample("y", dist.Normal(mu, 0.1), obs=y)

    for batch in (16384, 1008):
        guide = UHAGuide(model, K=4, sample_batch_size=batch)
        svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
        params = svi.run(jax.random.PRNGKey(0), 300, y, progress_bar=False).params
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            draws = guide.sample_posterior(
                jax.random.PRNGKey(1), params, y, sample_shape=(10000,)
            )
        assert abs(float(np.mean(draws["mu"])) - float(np.mean(y))) < 0.01
        assert not [w for w in caught if issubclass(w.category, UHADrawsOffWarning)]
