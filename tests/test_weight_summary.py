"""The draws' weight checks read a summary of the log weights made on the device.

``sample_posterior`` and ``sample_posterior_with_log_weights`` judge their draws (Pareto
k̂, the ELBO's standard error, the worse-than-start test) from a few numbers computed in
one device program (``_weights.weight_summary``) instead of copying every log weight to
the host; k̂ comes from the M + 1 largest log weights alone (``_khat_from_largest``).
Checked here against ArviZ's ``psislw`` (the k̂ exactly) and NumPy (the statistics, to
float32 rounding), and end to end: the warnings name the same k̂ as ``psis_khat`` of the
returned weights, and point at the caller's line. Draws that fit in one chunk get the
summary from the chain's own program, over the first ``num_draws`` of the padded chunk:
checked against the summary of the weights the call returns. ``psis_khat_columns``, the
fit vectorized over many columns (``UHALocalGuide.log_z``'s data points), is ``psislw``'s
k̂ column by column to 1e-10.
"""

import math
import sys
import warnings

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import conjugate_model as cm
from numpyro_uha import UHAFitWarning
from numpyro_uha import guide as guide_module
from numpyro_uha import _weights as weights_module
from numpyro_uha._weights import (
    _khat_from_largest,
    check_values,
    psis_khat,
    psis_khat_columns,
    summary_from_values,
    summary_khat,
    summary_largest,
    tail_size,
    weight_summary,
)
from numpyro_uha.core import batching
from numpyro_uha.guide import _marginal_std


def _weight_sets():
    """Log weights of many sizes and tails: heavy (Student-t 1 and 2), light, ties, a
    share of -inf (zero weights), and the tiny sizes where ArviZ's tail has <= 4 draws."""
    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 10, 24, 25, 26, 30, 100, 225, 226, 1000, 4321, 10000):
        yield f"t2-{n}", rng.standard_t(2, n) * 3.0
        yield f"t1-{n}", rng.standard_t(1, n)
        yield f"normal-{n}", -50.0 + 0.3 * rng.standard_normal(n)
        ties = np.round(rng.standard_normal(n), 1)
        yield f"ties-{n}", ties
        zeros = rng.standard_t(3, n)
        zeros[rng.random(n) < 0.3] = -np.inf
        if np.isfinite(zeros).any():
            yield f"zero-weights-{n}", zeros


WEIGHT_SETS = list(_weight_sets())


@pytest.mark.parametrize("log_w", [w for _, w in WEIGHT_SETS], ids=[i for i, _ in WEIGHT_SETS])
def test_khat_from_the_largest_weights_is_arviz_psislw(log_w):
    want = float(az.psislw(log_w.copy(), reff=1.0)[1])
    if log_w.size > 2 and np.all(log_w[np.isfinite(log_w)] == log_w[0]):
        want = -np.inf  # psis_khat's own case: equal weights, no tail
    got = psis_khat(log_w)
    assert got == want or (np.isnan(want) and np.isnan(got)), (got, want)
    n = log_w.size
    largest = np.sort(log_w)[n - tail_size(n) - 1:]
    if largest.size == tail_size(n) + 1:
        got = _khat_from_largest(np.random.default_rng(1).permutation(largest), n)
        assert got == float(az.psislw(log_w.copy(), reff=1.0)[1]) or np.isnan(got)


def _columns(n, seed=0):
    """A fixed-seed (n, 16) matrix of log weights, a tail of its own in each column:
    light, heavy (Pareto k = 0.8, Student-t 2 and 1: the last so heavy that few weights
    lie within exp(-708) of the largest), nearly equal, equal, ties, one weight far
    above the rest, -inf shares (zero weights), and -inf all but 1, 3, 30 and 14 (fewer
    finite weights than the tail, ``tail_size(n) + 1``, so the fit takes those above
    exp(-708) times the largest: 12 of the 14)."""
    rng = np.random.default_rng(seed)
    columns = [
        rng.standard_normal(n) * 2.0, -50.0 + 0.3 * rng.standard_normal(n),
        np.log1p(rng.pareto(1 / 0.8, n)), rng.standard_t(2, n) * 3.0, rng.standard_t(1, n),
        1e-12 * rng.standard_normal(n), np.full(n, 1.5), np.round(rng.standard_normal(n), 1),
        np.round(rng.exponential(size=n), 2), np.r_[rng.standard_normal(n - 1), 40.0],
    ]
    for share in (0.3, 0.9):
        zeros = rng.standard_t(3, n)
        zeros[rng.random(n) < share] = -np.inf
        zeros[0] = 0.0
        columns.append(zeros)
    for num_finite in (3, min(30, n - 1)):
        few = np.full(n, -np.inf)
        few[rng.permutation(n)[:num_finite]] = rng.standard_normal(num_finite)
        columns.append(few)
    columns.append(np.r_[np.full(n - 1, -np.inf), 2.0])  # one finite: no tail
    columns.append(np.r_[np.full(n - 3, -800.0), 0.0, -1.0, -2.0])  # 2 above exp(-708)
    far = np.full(n, -np.inf)  # 12 finite weights above exp(-708) of the largest, 2 below
    far[:14] = np.r_[rng.standard_normal(12), -720.0 + rng.standard_normal(2)]
    columns.append(far)
    return np.stack(columns, axis=1)


@pytest.mark.parametrize("n", [20, 25, 26, 1000, 4321, 10000])
def test_khat_of_many_columns_is_arviz_psislw_column_by_column(n):
    """psis_khat_columns, one vectorized fit over the columns (no ArviZ), is psislw's k̂
    of each column to rounding, and -inf where psis_khat has it (equal weights);
    below 25 draws (too few for the tail) it is psis_khat column by column. At 10000
    draws some candidates' weights overflow in psislw's fit (a RuntimeWarning there):
    they weigh nothing in either."""
    log_w = _columns(n)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = psis_khat_columns(log_w)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.asarray(az.psislw(log_w.T.copy(), reff=1.0)[1], np.float64)
    want[6] = -np.inf  # psis_khat's own case: equal weights, no tail
    assert got.shape == (log_w.shape[1],)
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite], want[~finite])
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-10, atol=0)
    if n == 1000:
        # the cases are there: finite fits, and too few weights for one
        assert np.isinf(want[[4, 12, 14, 15]]).all()
        assert np.isfinite(want[[0, 1, 2, 3, 5, 7, 8, 9, 10, 11, 13, 16]]).all()


def test_khat_of_many_columns_is_the_same_in_any_chunks(monkeypatch):
    log_w = _columns(300, seed=1)
    whole = psis_khat_columns(log_w)
    monkeypatch.setattr(weights_module, "KHAT_COLUMNS_BYTES", 1)  # one column a chunk
    np.testing.assert_array_equal(psis_khat_columns(log_w), whole)
    monkeypatch.setattr(weights_module, "KHAT_COLUMNS_BYTES", 3 * 8 * 40000)  # a few
    np.testing.assert_array_equal(psis_khat_columns(log_w), whole)


def test_khat_of_many_columns_takes_psis_khat_where_the_fit_leaves_the_numbers():
    """Tail weights within rounding of the cutoff (their excess over it is 0): ArviZ's
    fit divides by zero; such a column is psis_khat's, its warnings included."""
    n = 1000
    degenerate = np.full(n, -5.0)
    degenerate[:tail_size(n)] = np.linspace(-3e-300, 0.0, tail_size(n))
    degenerate[tail_size(n)] = -4e-300
    log_w = np.stack([np.random.default_rng(2).standard_normal(n), degenerate], axis=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        want = psis_khat(degenerate)
    with warnings.catch_warnings(record=True) as caught_columns:
        warnings.simplefilter("always")
        got = psis_khat_columns(log_w)
    assert caught and [str(w.message) for w in caught_columns] == [str(w.message) for w in caught]
    assert got[1] == want or (np.isnan(got[1]) and np.isnan(want))
    assert got[0] == pytest.approx(psis_khat(log_w[:, 0]), rel=1e-12)


def test_khat_of_many_columns_refuses_as_psis_khat():
    log_w = _columns(100)
    for bad in (np.nan, np.inf):
        broken = log_w.copy()
        broken[5, 3] = broken[7, 9] = broken[8, 9] = bad  # 1 and 2 of them
        with pytest.raises(FloatingPointError) as raised:
            psis_khat_columns(broken)
        with pytest.raises(FloatingPointError) as expected:
            psis_khat(broken[:, 3])  # the first column that has one
        assert str(raised.value) == str(expected.value)
    broken = log_w.copy()
    broken[:, 4] = -np.inf
    with pytest.raises(FloatingPointError, match=r"psis_khat: all 100 log weights are -inf"):
        psis_khat_columns(broken)
    with pytest.raises(ValueError, match=r"psis_khat: log_weights is empty"):
        psis_khat_columns(np.zeros((0, 3)))
    with pytest.raises(ValueError, match=r"must be 2-D"):
        psis_khat_columns(log_w[:, 0])
    assert psis_khat_columns(np.zeros((10, 0))).shape == (0,)
    # one draw: psis_khat's equal weights
    np.testing.assert_array_equal(psis_khat_columns([[0.5, -1.0]]), [-np.inf, -np.inf])


@pytest.mark.parametrize("log_w", [w for i, w in WEIGHT_SETS if int(i.split("-")[-1]) >= 24],
                         ids=[i for i, _ in WEIGHT_SETS if int(i.split("-")[-1]) >= 24])
def test_device_summary_matches_numpy(log_w):
    lw = jnp.asarray(log_w, jnp.float32)
    finite = jnp.isfinite(lw)
    host = np.asarray(lw, np.float64)
    ok = np.isfinite(host)
    threshold = float(np.median(host[ok]))
    s = weight_summary(lw, finite, threshold=threshold, khat=True)
    kept = host[ok]
    assert s.num_finite == kept.size
    scale = np.abs(kept).max() + 1.0  # float32 sums: errors relative to the largest value
    assert abs(s.mean - kept.mean()) < 1e-5 * scale
    assert abs(s.var - kept.var(ddof=1)) < 1e-4 * (kept.var(ddof=1) + scale * 1e-2)
    assert np.isnan(s.median)  # not computed on the device (the warning takes it from the weights)
    assert s.num_below == np.sum(kept < np.float32(threshold))
    assert (s.low, s.high) == (kept.min(), kept.max())
    # k̂ of the weights with the non-finite ones at -inf, as psis_khat gives it
    want = psis_khat(np.where(ok, host, -np.inf))
    got = summary_khat(s, log_w.size)
    assert got == want or (np.isnan(want) and np.isnan(got)), (got, want)


def test_the_device_summary_of_enormous_float32_log_weights_has_a_finite_variance():
    # log weights near -1.6e25 (a degenerate fit far out in a tail) differ by 1e20-odd:
    # the squares of their deviations overflow float32, their variance does not overflow
    # float64; the ELBO's se and the warning's "std of log w" are finite
    rng = np.random.default_rng(0)
    lw = jnp.asarray(-1.6e25 + 3e20 * rng.standard_normal(500), jnp.float32)
    kept = np.asarray(lw, np.float64)
    s = weight_summary(lw, jnp.isfinite(lw), khat=True)
    assert np.isfinite(s.var)
    assert abs(s.var - kept.var(ddof=1)) < 1e-4 * kept.var(ddof=1)
    assert abs(s.mean - kept.mean()) < 1e-6 * abs(kept.mean())


@pytest.fixture(scope="module")
def fitted():
    return cm.fit_guide()


def test_draws_warn_with_the_khat_of_their_own_weights_at_the_callers_line(fitted):
    """q moved off the posterior: sample_posterior_with_log_weights warns that the fit is
    worse than its start and that the weights are heavy-tailed, with the k̂ and the ELBO's
    standard error of the very log weights it returns, at this line."""
    guide, params = fitted
    sd = _marginal_std(params["auto_scale_tril"])
    broken = dict(params, auto_loc=params["auto_loc"] + 8 * sd)
    KEY = jax.random.PRNGKey(3)  # noqa: N806
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        draws = guide.sample_posterior_with_log_weights(KEY, broken, cm.Y, sample_shape=(1000,))
        line = sys._getframe().f_lineno - 1
    fit = [w for w in caught if issubclass(w.category, UHAFitWarning)]
    assert {(w.filename, w.lineno) for w in fit} == {(__file__, line)}, [(w.filename, w.lineno) for w in fit]
    log_w = np.asarray(draws.log_weights, np.float64)
    poor = [w for w in fit if "importance weights say" in str(w.message)]
    worse = [w for w in fit if "worse than the Gaussian q" in str(w.message)]
    assert len(poor) == 1 and len(worse) == 1, [str(w.message) for w in fit]
    khat = psis_khat(log_w)
    assert khat >= 0.7 and f"Pareto k̂ = {khat:.2f}" in str(poor[0].message)
    elbo, se = log_w.mean(), log_w.std(ddof=1) / np.sqrt(log_w.size)
    # the ELBO's standard error is named where it exceeds 1 nat, and only there
    assert (f"standard error is {se:.2f} nats" in str(poor[0].message)) == (se > 1.0)
    assert ("standard error" in str(poor[0].message)) == (se > 1.0)
    assert f"is {elbo:.4g} ± {se:.2g}" in str(worse[0].message)
    assert f"median {np.median(log_w):.4g}" in str(worse[0].message)


def test_the_sign_test_counts_the_weights_below_q_elbo_minus_one(fitted):
    """With q's ELBO placed 1 nat above the draws' 80th percentile, 80 % of their log
    weights lie more than 1 nat below it: the warning says so."""
    guide, params = fitted
    key = jax.random.PRNGKey(5)
    log_w = np.asarray(guide.sample_posterior_with_log_weights(
        key, params, cm.Y, sample_shape=(1000,)).log_weights, np.float64)
    saved, start = guide._start_elbo, float(np.quantile(log_w, 0.8)) + 1.0
    guide._start_elbo = (start, 1e-3)
    try:
        with pytest.warns(UHAFitWarning, match="worse than the Gaussian q") as caught:
            guide.sample_posterior(key, params, cm.Y, sample_shape=(1000,))
    finally:
        guide._start_elbo = saved
    below = np.mean(log_w < start - 1.0)
    assert 0.79 <= below <= 0.81
    assert any(f"{below:.0%} of the log weights" in str(w.message) for w in caught)


@pytest.mark.parametrize("n", [300, 1000])
def test_the_chains_own_summary_is_that_of_the_returned_weights(fitted, n):
    """One chunk (n below the CPU's 1008-draw batch, padded to 384 and 1008): the
    summary made in the draw program covers the n returned draws, not the padding; so
    do the draws' mean and spread checks made beside it."""
    guide, params = fitted
    key = jax.random.PRNGKey(7)
    draws = guide.sample_posterior_with_log_weights(key, params, cm.Y, sample_shape=(n,),
                                                    nonfinite="keep")
    lw = draws.log_weights
    threshold = float(np.median(np.asarray(lw)))  # half below: the count is exercised
    arrays, spec = guide_module._split_static(((cm.Y,), {}))
    # the width the call ran at: its own bucket, or a wider one this guide's program
    # already ran at (reuse_width: 300 draws after 1000 run at 1008)
    used = batching._USED_WIDTHS[guide._jitted_draws[spec]].values()
    width = min(w for widths in used for w in widths if w >= n)
    assert width in (guide_module._chunk_bucket(n), guide.sample_batch_size)
    assert width > n  # padded
    out = guide._jitted_draws[spec](
        key, params=params, arrays=arrays, spec=spec, corrected=False, with_info=True,
        with_samples=True, sharding=None, batch_size=width, split=True,
        num_valid=np.int32(n), threshold=threshold, check=np.bool_(True), offset=np.uint32(0),
    )
    assert np.array_equal(np.asarray(out[1][:n]), np.asarray(lw))  # the same draws
    got = summary_from_values(out[-1], n, summary_largest(n), guide.latent_dim)
    np.testing.assert_allclose(
        got.checks, check_values(lw, jnp.isfinite(lw), draws.latent), rtol=1e-5, atol=1e-6
    )
    want = weight_summary(lw, jnp.isfinite(lw), threshold=threshold, khat=True)
    assert (got.num_finite, got.num_below, got.low, got.high) == (
        want.num_finite, want.num_below, want.low, want.high)
    assert np.array_equal(got.largest, want.largest)
    assert got.mean == pytest.approx(want.mean, rel=1e-6)
    assert got.var == pytest.approx(want.var, rel=1e-5)
    assert summary_khat(got, n) == psis_khat(np.asarray(lw, np.float64))


def test_the_summary_of_joined_chunks_is_that_of_the_returned_weights(fitted, monkeypatch):
    """Several chunks (600 and 700 draws at width 256: three each): the weight summary
    and the draws' checks are taken over the joined chunks with their padding masked
    out, so they are those of the returned draws; and a new draw count with the same
    chunk count compiles no new summary program."""
    guide, params = fitted
    monkeypatch.setattr(guide, "sample_batch_size", 256)
    taken = []

    def spy(*args, **kwargs):
        summary = weight_summary(*args, **kwargs)
        taken.append(summary)
        return summary

    monkeypatch.setattr(guide_module, "weight_summary", spy)
    compiled = []
    for n in (600, 700):
        before = weights_module._weight_summary._cache_size()
        draws = guide.sample_posterior_with_log_weights(
            jax.random.PRNGKey(8), params, cm.Y, sample_shape=(n,)
        )
        compiled.append(weights_module._weight_summary._cache_size() - before)
        lw = draws.log_weights
        assert lw.shape == (n,) and draws.num_dropped == 0
        got = taken[-1]
        want = weight_summary(lw, jnp.isfinite(lw), khat=True, latent=draws.latent)
        assert (got.num_finite, got.low, got.high) == (want.num_finite, want.low, want.high)
        assert np.array_equal(got.largest, want.largest)
        assert got.mean == pytest.approx(want.mean, rel=1e-6)
        assert got.var == pytest.approx(want.var, rel=1e-5)
        np.testing.assert_allclose(got.checks, want.checks, rtol=1e-4, atol=1e-6)
    assert len(taken) == 2
    assert compiled[1] == 0, compiled  # (the first call may compile it)


def _squeezed_heavy_tail(spread):
    """Log weights whose tail has a Pareto shape (k = 1) but whose largest lies
    ``spread`` nats above their mean: within a factor e^spread of it."""
    w = np.random.default_rng(0).pareto(1.0, 500)
    lw = w / w.max()
    return spread * lw / (lw.max() - lw.mean())


def test_a_high_khat_of_nearly_equal_weights_is_not_a_poor_fit():
    """k̂ fitted to weights within a factor of two of their mean is noise (k̂ = 3.15 at an
    ESS of 494.9 of 500 on a near-Gaussian posterior): no warning. The same tail spread
    over 3 nats (a weight 20 times the mean) is warned, and so is any diverged draw."""
    from numpyro_uha._weights import _warn_if_poor_fit

    for spread, warned in ((0.3, False), (0.6, False), (3.0, True)):
        lw = _squeezed_heavy_tail(spread)
        assert psis_khat(lw) >= 0.7
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _warn_if_poor_fit(lw, "here")
        assert any("Pareto k̂" in str(w.message) for w in caught) == warned, spread
    with_a_diverged = np.concatenate([_squeezed_heavy_tail(0.3)[:-1], [-np.inf]])
    assert psis_khat(with_a_diverged) >= 0.7
    with pytest.warns(UHAFitWarning, match="Pareto k̂"):
        _warn_if_poor_fit(with_a_diverged, "here")


def test_the_draws_do_not_take_a_high_khat_of_nearly_equal_weights_for_a_poor_fit(
    fitted, monkeypatch
):
    """The draw methods' own check (from the weights' device summary): a k̂ of 3 on the
    fitted conjugate model's nearly equal weights warns of nothing."""
    guide, params = fitted
    monkeypatch.setattr(guide_module, "summary_khat", lambda summary, n, exact=True: 3.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        draws = guide.sample_posterior_with_log_weights(
            jax.random.PRNGKey(3), params, cm.Y, sample_shape=(500,)
        )
    log_w = np.asarray(draws.log_weights, np.float64)
    assert log_w.max() - log_w.mean() < np.log(2.0)  # the case this is about
    assert not [w for w in caught if issubclass(w.category, UHAFitWarning)]


def test_khat_counts_element_by_element_is_its_rule_set_by_set():
    """khat_counts over arrays (UHALocalGuide.log_z's data points at once) gives, entry
    by entry, its answer for one set of weights: k̂ ≥ 0.7 and finite counts, unless every
    draw is finite and the spread is at most log 2 (unknown spread: NaN or None)."""
    from numpyro_uha._weights import BOUNDED_LOG_SPREAD, khat_counts

    size = 100
    khat = np.array([0.8, 0.8, 0.8, 0.8, 0.5, np.inf, -np.inf, 0.8, 0.7])
    num_finite = np.array([100, 99, 100, 100, 100, 100, 100, 100, 100])
    spread = np.array([0.1, 0.1, 2.0, np.nan, 0.1, 2.0, 2.0, BOUNDED_LOG_SPREAD, 1.0])
    want = np.array([False, True, True, True, False, False, False, False, True])
    got = khat_counts(khat, num_finite, size, spread)
    np.testing.assert_array_equal(got, want)
    for k, f, s, w in zip(khat, num_finite, spread, want):
        one = khat_counts(float(k), int(f), size, None if np.isnan(s) else float(s))
        assert one is bool(w)


def _float32_sets():
    for name, lw in WEIGHT_SETS:
        lw = np.asarray(lw, np.float32)  # the device's weights (the host fits them in float64)
        if np.isfinite(lw).any():
            yield name, lw


def test_the_device_khat_is_the_hosts_to_float32_rounding():
    """k̂ fitted on the device with the summary (``khat_values``, float32) against
    ``psis_khat`` of the same weights in float64, over every weight set: within half of
    ``KHAT_DEVICE_MARGIN`` (relative, for |k̂| > 1), the band where the draws refit on
    the host (seen: 8.4e-6 on a CPU, 1.4e-5 on an H200), inf where the host's is (a tail
    of 4 weights or fewer), and left
    to the host (NaN) only where the tail reaches 80 nats below the largest weight
    (float32's exp underflows there; the Cauchy sets)."""
    compared = 0
    for name, lw in _float32_sets():
        summary = weight_summary(jnp.asarray(lw), jnp.isfinite(lw), khat=True)
        want = psis_khat(lw.astype(np.float64))
        top = np.sort(lw)[::-1][:summary_largest(lw.size)]
        if np.isnan(summary.khat):
            assert top[-1] - top[0] <= -80.0, (name, want)
        elif np.isinf(summary.khat):
            assert summary.khat == want, name
        else:
            compared += 1
            tolerance = 0.5 * weights_module.KHAT_DEVICE_MARGIN * max(1.0, abs(want))
            assert abs(summary.khat - want) <= tolerance, (name, summary.khat, want)
    assert compared > 30  # the fit itself, not only its edge cases


def test_the_device_khat_counts_only_the_first_num_valid_weights():
    """Padding after ``num_valid`` weights (the chain's last chunk) leaves k̂ the valid
    weights' own: the tail size, the cutoff and the candidates all follow the traced
    count, not the padded size."""
    rng = np.random.default_rng(5)
    for n in (300, 1000, 10000):
        lw = rng.standard_t(4, n).astype(np.float32)
        padded = np.concatenate([lw, rng.normal(size=n // 3).astype(np.float32) + 50.0])
        summary = weight_summary(
            jnp.asarray(padded), jnp.ones(padded.size, bool), khat=True, num_valid=n
        )
        want = psis_khat(lw.astype(np.float64))
        tolerance = 0.5 * weights_module.KHAT_DEVICE_MARGIN * max(1.0, abs(want))
        assert abs(summary.khat - want) <= tolerance, (n, summary.khat, want)


def test_the_summary_is_one_array_whose_counts_are_exact_past_float32s_integers():
    """One copy to the host: the summary is one array, the counts carried as their bits
    (2^24 + 1 draws: float32 would round the count to 2^24)."""
    n = 2**24 + 1
    values = weights_module._weight_summary(
        jnp.zeros(n), jnp.ones(n, bool), np.float32(1.0), num_largest=0, num_valid=None,
    )
    assert isinstance(values, jax.Array) and values.dtype == jnp.float32
    summary = summary_from_values(values, n, 0)
    assert (summary.num_finite, summary.num_below) == (n, n)


def test_inexact_khat_is_the_devices_except_near_a_verdict_or_a_rounding_boundary():
    """``summary_khat(exact=False)`` takes the device's k̂ where it is clear of
    ``KHAT_BAD`` and of the two-decimal rounding boundaries, and fits on the host (the
    exact k̂) within ``KHAT_DEVICE_MARGIN`` of them or where the device gave NaN."""
    lw = np.random.default_rng(2).standard_t(2, 4000) * 3.0
    summary = weight_summary(jnp.asarray(lw, jnp.float32), jnp.ones(lw.size, bool), khat=True)
    exact = psis_khat(np.asarray(lw, np.float32).astype(np.float64))
    assert summary_khat(summary, lw.size) == exact
    margin = weights_module.KHAT_DEVICE_MARGIN
    for device, decides in [
        (1.2345678, True), (0.61, True), (math.inf, True),
        (0.7 + 0.5 * margin, False), (0.7 - 0.5 * margin, False),
        (1.235 + 0.5 * margin, False), (0.125 - 0.5 * margin, False), (math.nan, False),
    ]:
        got = summary_khat(summary._replace(khat=device), lw.size, exact=False)
        assert got == (device if decides else exact), (device, got)


def test_the_draws_judge_by_the_devices_khat_without_a_host_fit(fitted, monkeypatch):
    """sample_posterior's k̂ check reads the device's fit, with no fit on the host where
    that k̂ is clear of the boundaries (on a CPU it is, here: k̂ 4.44), and prints the k̂
    ``psis_khat`` gives its weights."""
    guide, params = fitted
    sd = _marginal_std(params["auto_scale_tril"])
    broken = dict(params, auto_loc=params["auto_loc"] + 8 * sd)
    fits, summaries = [], []
    host_fit, khat_of = weights_module._khat_from_largest, guide_module.summary_khat
    monkeypatch.setattr(weights_module, "_khat_from_largest",
                        lambda *a: fits.append(1) or host_fit(*a))
    monkeypatch.setattr(guide_module, "summary_khat",
                        lambda summary, *a, **k: summaries.append(summary) or khat_of(summary, *a, **k))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        draws = guide.sample_posterior_with_log_weights(
            jax.random.PRNGKey(3), broken, cm.Y, sample_shape=(1000,)
        )
    (summary,) = summaries
    decides = weights_module._device_khat_decides(summary.khat)
    assert decides or jax.default_backend() != "cpu"
    assert bool(fits) == (not decides), (summary.khat, fits)
    khat = psis_khat(np.asarray(draws.log_weights, np.float64))
    poor = [w for w in caught if "importance weights say" in str(w.message)]
    assert len(poor) == 1 and f"Pareto k̂ = {khat:.2f}" in str(poor[0].message)


@pytest.mark.parametrize("to_host", [False, True])
def test_the_chain_writes_its_summary_to_host_memory_where_asked(fitted, monkeypatch, to_host):
    """``SUMMARY_IN_HOST_MEMORY``: sample_posterior's chain program (traced anew here)
    is asked to, and then marks its summary for the host's memory (the result's memory
    kind ``pinned_host``), and only its summary; "auto" does so on a GPU only. The draws
    are the same either way."""
    guide, params = fitted
    key = jax.random.PRNGKey(4)
    before = guide.sample_posterior(key, params, cm.Y, sample_shape=(300,), nonfinite="keep")
    monkeypatch.setattr(guide_module, "SUMMARY_IN_HOST_MEMORY", to_host)
    monkeypatch.setattr(guide, "_jitted_draws", {})  # programs traced anew
    asked = []
    draw_impl = type(guide)._draw_impl

    def recording(self, *a, **k):
        asked.append(k.get("summary_to_host"))
        return draw_impl(self, *a, **k)

    monkeypatch.setattr(type(guide), "_draw_impl", recording)
    draws = guide.sample_posterior(key, params, cm.Y, sample_shape=(300,), nonfinite="keep")
    assert asked == [to_host]
    for a, b in zip(jax.tree.leaves(draws), jax.tree.leaves(before)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    arrays, spec = guide_module._split_static(((cm.Y,), {}))
    lowered = guide._jitted_draws[spec].lower(
        key, params=params, arrays=arrays, spec=spec, corrected=False, with_info=True,
        with_samples=True, sharding=None, batch_size=guide_module._chunk_bucket(300),
        split=True, num_valid=np.int32(300), threshold=-np.inf, check=np.bool_(False),
        offset=np.uint32(0), summary_to_host=to_host,
    ).as_text()
    main = next(line for line in lowered.splitlines() if "func.func public @main" in line)
    assert main.count('memory_kind = "pinned_host"') == int(to_host)
    monkeypatch.setattr(guide_module, "SUMMARY_IN_HOST_MEMORY", "auto")
    assert guide_module._summary_in_host_memory() == (jax.default_backend() == "gpu")
