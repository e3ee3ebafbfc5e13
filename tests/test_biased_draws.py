"""The draws' check against their own weights: where the self-normalized importance
weights move a latent coordinate's mean by more than ``SHIFT_BAD`` sds and by more than
``SHIFT_SE_BAD`` standard errors, ``sample_posterior`` says the draws are biased there
(k̂ can be fine: the weighted estimates correct what the draws miss). The check on a
fitted guide is in test_fit_worse_than_start.py, beside the other fit warnings (one fit
for the module)."""

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_uha._weights import _weighted_shift, weighted_shift


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
    """Up to SHIFT_HOST_MAX values the check runs in NumPy (no program per shape): the
    same numbers as the jitted program, non-finite draws left out alike."""
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
