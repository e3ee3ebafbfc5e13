"""The warning for a fit that training made worse than the Gaussian q it started from.

UHA's bound with ε → 0 is q's ELBO, so a trained UHA whose draws' log weights lie below
the starting q's ELBO was made worse by training (at high learning rates the annealing
parameters can drift until the dynamics break down, and the draws are then far from the
posterior with no other sign). ``UHAGuide.warn_if_worse_than_start`` is unit-tested on
synthetic log weights (the statistics), then end to end: a trained guide on a conjugate
model does not warn, and the same guide with q moved far from the posterior warns from
``sample_posterior`` and from ``log_z``.
"""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import conjugate_model as cm
from numpyro_uha import UHADrawsOffWarning, UHAFitWarning, UHAGuide, UHAWorseThanStartWarning
from numpyro_uha._weights import SHIFT_BAD, SPREAD_BAD
from numpyro_uha.evaluation import log_z
from numpyro_uha.guide import _marginal_std

START = -40.0


@pytest.fixture(scope="module")
def fitted():
    return cm.fit_guide()


def exact_log_z():
    """log Z of the conjugate model: the mean's two coordinates are independent conjugate
    normals; tau's likelihood is flat and its prior integrates to 1."""
    n, s0, sigma = cm.N_OBS, cm.PRIOR_SD, cm.NOISE_SD
    y = np.asarray(cm.Y, np.float64)
    post_var = 1.0 / (1.0 / s0**2 + n / sigma**2)
    per_coordinate = (
        -n * math.log(sigma) - 0.5 * n * math.log(2 * math.pi) - (y**2).sum(0) / (2 * sigma**2)
        + 0.5 * math.log(post_var / s0**2) + 0.5 * post_var * (y.sum(0) / sigma**2) ** 2
    )
    return float(per_coordinate.sum())


def _bare_guide(start=(START, 0.05)):
    guide = UHAGuide(cm.model)
    guide._start_elbo = start
    return guide


def _warns(guide, log_w):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        returned = guide.warn_if_worse_than_start(log_w)
    fit = [w for w in caught if issubclass(w.category, UHAFitWarning)]
    assert returned == bool(fit)
    return fit


def _draws_and_fit_warnings(guide, params, num_draws):
    """``sample_posterior_with_log_weights``' draws (key 1, the conjugate data) and the
    messages of the ``UHAFitWarning``s it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        draws = guide.sample_posterior_with_log_weights(
            jax.random.PRNGKey(1), params, cm.Y, sample_shape=(num_draws,)
        )
    return draws, [str(w.message) for w in caught if issubclass(w.category, UHAFitWarning)]


def _sample_posterior_warnings(guide, params):
    """The warnings ``sample_posterior`` (key 1, 1000 draws, the conjugate data) gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guide.sample_posterior(jax.random.PRNGKey(1), params, cm.Y, sample_shape=(1000,))
    return caught


RNG = np.random.default_rng(0)


def test_no_warning_when_uha_improves_on_q():
    assert not _warns(_bare_guide(), START + 0.5 + RNG.standard_normal(2000))


def test_no_warning_within_the_noise():
    # 0.5 nat below with a standard error of 0.5: not significant, and under 1 nat
    assert not _warns(_bare_guide(), START - 0.5 + 20 * RNG.standard_normal(1600))


def test_warns_when_the_elbo_is_clearly_below_q():
    fit = _warns(_bare_guide(), START - 3.0 + RNG.standard_normal(2000))
    assert fit and "UHA ELBO" in str(fit[0].message) and "smaller learning rate" in str(fit[0].message)


def test_warns_when_most_log_weights_are_far_below_despite_huge_tails():
    # Training broke down: the mean's standard error (from a few enormous negative log
    # weights) hides the gap, the sign test does not.
    log_w = START - 3000.0 + 10.0 * RNG.standard_normal(2000)
    log_w[:5] = -1e18
    fit = _warns(_bare_guide(), log_w)
    assert fit and "100% of the log weights" in str(fit[0].message)


def test_rounding_at_an_enormous_elbo_is_not_worse():
    """q stuck at a log density of -1.6e25: UHA's log weights of the same draws came out
    1.15e18 nats lower, single precision's rounding there (its spacing is 1.4e18), and
    the warning said training had made the fit worse. A gap of 0.06 % of the ELBO, far
    past the rounding, is still worse."""
    start = -1.5969903e25
    assert not _warns(_bare_guide((start, 0.0)), np.full(500, start - 1.15e18))
    fit = _warns(_bare_guide((start, 0.0)), np.full(500, start - 1e22))
    assert fit and "100% of the log weights" in str(fit[0].message)


def test_few_draws_or_no_start_are_not_judged():
    assert not _warns(_bare_guide(), START - 100.0 + RNG.standard_normal(50))
    assert not _warns(_bare_guide(start=None), START - 100.0 + RNG.standard_normal(2000))


def test_warm_start_scores_its_q(fitted):
    guide, _ = fitted
    start, se = guide._start_elbo
    assert np.isfinite(start) and 0 < se < 1
    # the warm start's q is close to the exact posterior: its ELBO is close to log Z
    assert exact_log_z() - 1.0 < start < exact_log_z() + 4 * se


def test_trained_guide_does_not_warn(fitted):
    guide, params = fitted
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guide.sample_posterior(jax.random.PRNGKey(1), params, cm.Y, sample_shape=(1000,))
    assert not [w for w in caught if issubclass(w.category, UHAFitWarning)]


def test_broken_fit_warns_from_sample_posterior_and_log_z(fitted):
    guide, params = fitted
    # q moved 30 posterior sds off: the UHA draws start far out and K = 4 steps do not
    # bring them back, so their log weights are far below the warm start's ELBO
    sd = _marginal_std(params["auto_scale_tril"])  # d = 3: full-rank q by default
    broken = dict(params, auto_loc=params["auto_loc"] + 30 * sd)
    with pytest.warns(UHAFitWarning, match="worse than the Gaussian q it started from"):
        guide.sample_posterior(jax.random.PRNGKey(1), broken, cm.Y, sample_shape=(1000,))
    with pytest.warns(UHAFitWarning, match="worse than the Gaussian q it started from"):
        log_z(guide, jax.random.PRNGKey(2), broken, cm.Y, num_draws=1000)


def test_draws_on_other_data_are_not_compared_with_q(fitted):
    """q's ELBO was measured on the data the guide was set up with: draws on other data
    (here the observations shifted by 10 prior sds, whose log weights are far lower for
    any q) are not judged against it, while the same call on the setup data is."""
    guide, params = fitted
    other = cm.Y + 10 * cm.PRIOR_SD
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        draws = guide.sample_posterior_with_log_weights(
            jax.random.PRNGKey(1), params, other, sample_shape=(500,)
        )
        log_z(guide, jax.random.PRNGKey(2), params, other, num_draws=500)
    # (log_z's k̂ warning is right there: q is far from that posterior)
    assert not [w for w in caught if "worse than the Gaussian q" in str(w.message)]
    low = np.asarray(draws.log_weights)
    assert guide._start_elbo[0] - np.median(low) > 100  # the weights alone would warn
    assert not guide.warn_if_worse_than_start(low, model_args=((other,), {}))
    with pytest.warns(UHAFitWarning):
        assert guide.warn_if_worse_than_start(low, model_args=((cm.Y,), {}))


def test_the_data_comparison_follows_data_changed_in_place_or_replaced(fitted):
    """Whether draws are on the setup data is remembered for the last arguments seen,
    by identity of their (immutable) JAX arrays only: a NumPy array changed in place,
    or another JAX array, is compared again."""
    guide, _ = fitted
    low = np.full(500, guide._start_elbo[0] - 100.0)
    same = jnp.asarray(cm.Y)
    other = same + 10 * cm.PRIOR_SD
    with pytest.warns(UHAFitWarning):
        assert guide.warn_if_worse_than_start(low, model_args=((same,), {}))
    with pytest.warns(UHAFitWarning):  # remembered
        assert guide.warn_if_worse_than_start(low, model_args=((same,), {}))
    assert not guide.warn_if_worse_than_start(low, model_args=((other,), {}))
    with pytest.warns(UHAFitWarning):
        assert guide.warn_if_worse_than_start(low, model_args=((same,), {}))
    host = np.array(cm.Y)
    with pytest.warns(UHAFitWarning):
        assert guide.warn_if_worse_than_start(low, model_args=((host,), {}))
    host += 10 * cm.PRIOR_SD
    assert not guide.warn_if_worse_than_start(low, model_args=((host,), {}))


def test_heavy_tailed_weights_leave_out_the_draws_bias_check(fitted):
    """q shrunk to 0.3 of its sds and moved 2 sds: k̂ ≥ 0.7, and the weights would call
    mu's draws biased (they did with the check run at any k̂), but weights that heavy
    cannot say by how much: only the k̂ warning speaks."""
    from numpyro_uha.evaluation import psis_khat

    guide, params = fitted
    sd = _marginal_std(params["auto_scale_tril"])
    off = dict(
        params, auto_scale_tril=0.3 * params["auto_scale_tril"],
        auto_loc=params["auto_loc"].at[0].add(2 * sd[0]),
    )
    draws, fit = _draws_and_fit_warnings(guide, off, 2000)
    assert psis_khat(draws.log_weights) >= 0.7
    assert any("Pareto k̂" in m for m in fit), fit
    assert not [m for m in fit if "the draws are biased" in m], fit


def test_heavy_tailed_weights_warn_from_sample_posterior(fitted):
    """q shrunk to 0.1 of its sds: the weights of a too-narrow proposal are heavy-tailed
    (for a Gaussian, tail index 1 - 0.1² = 0.99), and sample_posterior says so by PSIS k̂,
    as log_z does; with fewer than KHAT_MIN_DRAWS draws it does not judge."""
    from numpyro_uha.evaluation import psis_khat
    from numpyro_uha.guide import KHAT_MIN_DRAWS

    guide, params = fitted
    narrow = dict(params, auto_scale_tril=0.1 * params["auto_scale_tril"])
    draws, fit = _draws_and_fit_warnings(guide, narrow, 2000)
    khat = psis_khat(draws.log_weights)
    assert khat >= 0.7
    assert any(f"Pareto k̂ = {khat:.2f}" in m and "may be off" in m for m in fit), fit
    with pytest.warns(UHAFitWarning, match="Pareto k̂"):
        guide.sample_posterior(jax.random.PRNGKey(1), narrow, cm.Y, sample_shape=(2000,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guide.sample_posterior(
            jax.random.PRNGKey(1), narrow, cm.Y, sample_shape=(KHAT_MIN_DRAWS - 1,)
        )
    assert not [w for w in caught if "Pareto" in str(w.message)]


def test_draws_the_weights_move_are_called_biased(fitted):
    """q's mean of mu[0] moved 0.6 of its sd off the fitted one: K = 4 steps bring the
    draws only part of the way back, the weights the rest (0.46 ± 0.03 sds); q's ELBO is
    barely worse, so no other check speaks. The fitted params themselves: no warning
    (test_trained_guide_does_not_warn)."""
    guide, params = fitted
    caught = _sample_posterior_warnings(guide, cm.mean_moved(params))
    (warning,) = [w for w in caught if issubclass(w.category, UHAFitWarning)]
    message = str(warning.message)
    assert "the draws are biased there" in message
    assert "site(s) ['mu']" in message and "most: 'mu' at 0, by -0." in message
    assert f"more than {SHIFT_BAD:g}" in message


def test_draws_narrower_than_their_weights_say_are_called_too_narrow(fitted):
    """q's sd of mu[0] shrunk to 0.6 of the fitted one: K = 4 steps widen the draws only
    part of the way, the weights say by how much more (weighted sd 1.5 times the draws'),
    with k̂ still below 0.7 and the mean where it was: before the spread check no warning
    spoke (the draws' intervals silently too short). Named by site and coordinate, and
    alone (the mean is not called biased)."""
    from numpyro_uha.evaluation import psis_khat

    guide, params = fitted
    narrow = dict(params, auto_scale_tril=params["auto_scale_tril"].at[0].multiply(0.6))
    draws, fit = _draws_and_fit_warnings(guide, narrow, 1000)
    assert psis_khat(draws.log_weights) < 0.7
    (message,) = fit
    assert "the draws are too narrow there" in message
    assert "widen the spread of site(s) ['mu']" in message and "most: 'mu' at 0:" in message
    assert f"more than a factor {1 + SPREAD_BAD:g}" in message


def test_draws_wider_than_their_weights_say_are_called_too_wide(fitted):
    """q's sd of mu[1] widened 1.6-fold (and mu[0]'s shrunk to 0.6): the weights narrow
    mu[1]'s spread (weighted sd 0.71 times the draws'), with k̂ below 0.7; the warning
    says which way: too wide there."""
    from numpyro_uha.evaluation import psis_khat

    guide, params = fitted
    draws, fit = _draws_and_fit_warnings(guide, cm.narrow_and_wide(params), 1000)
    assert psis_khat(draws.log_weights) < 0.7
    wide = [m for m in fit if "the draws are too wide there" in m]
    assert len(wide) == 1, fit
    assert "narrow the spread of site(s) ['mu']" in wide[0] and "most: 'mu' at 1:" in wide[0]


def test_the_checks_say_the_same_in_one_chunk_or_several(fitted):
    """The draws' checks are made beside the weight summary: in the chain's own program
    where the draws fit one chunk (1000 at the CPU's 1008), in the summary's program
    over the joined draws where they do not (256 at a time: four chunks). The same
    draws (each draw's key is the same whatever the width), the same warnings."""
    guide, params = fitted
    both = cm.narrow_and_wide(params)
    assert guide.sample_batch_size >= 1000
    _, one_chunk = _draws_and_fit_warnings(guide, both, 1000)
    saved = guide._sample_batch_size
    guide.sample_batch_size = 256
    try:
        _, chunked = _draws_and_fit_warnings(guide, both, 1000)
    finally:
        guide.sample_batch_size = saved
    assert any("too wide there" in m for m in one_chunk), one_chunk
    assert chunked == one_chunk


def test_each_check_has_its_own_kind_of_fit_warning(fitted):
    """The worse-than-start check warns as UHAWorseThanStartWarning, the mean and spread
    checks as UHADrawsOffWarning, both kinds of UHAFitWarning (what filtered for that
    still sees them); a user who filters the draws' checks out keeps the others."""
    fit = _warns(_bare_guide(), START - 3.0 + RNG.standard_normal(2000))
    assert [w.category for w in fit] == [UHAWorseThanStartWarning]
    guide, params = fitted
    moved = cm.mean_moved(params)
    (off,) = [
        w for w in _sample_posterior_warnings(guide, moved)
        if issubclass(w.category, UHAFitWarning)
    ]
    assert off.category is UHADrawsOffWarning
    assert (off.message.check, off.message.sites) == ("biased", ("mu",))
    caught = _sample_posterior_warnings(guide, cm.narrow_and_wide(params))
    spread = [w for w in caught if "the draws are too" in str(w.message)]
    assert spread and all(w.category is UHADrawsOffWarning for w in spread)
    # the warning says which check and which sites, for code to read
    assert {w.message.check for w in spread} >= {"too_wide"}
    assert all(w.message.sites == ("mu",) for w in spread)
    assert all(f"too {w.message.check[4:]} there" in str(w.message) for w in spread)
    sd = _marginal_std(params["auto_scale_tril"])
    broken = dict(params, auto_loc=params["auto_loc"] + 8 * sd)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=UHADrawsOffWarning)
        guide.sample_posterior(jax.random.PRNGKey(1), moved, cm.Y, sample_shape=(1000,))
        guide.sample_posterior(jax.random.PRNGKey(1), broken, cm.Y, sample_shape=(1000,))
    kinds = {w.category for w in caught}
    assert UHADrawsOffWarning not in kinds
    assert UHAFitWarning in kinds and UHAWorseThanStartWarning in kinds
