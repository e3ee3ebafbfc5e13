"""UHALocalGuide.global_log_z: importance weights of the global latents' draws.

Each draw θ_s of the global guide is weighted by p(θ_s) p(x_out | θ_s) Π_i p̂(x_i | θ_s)
/ q(θ_s), p̂ the mean of the chains' UHA weights of data point i given θ_s: an unbiased
estimate of p(x) per draw, whatever the parameters. The model here is a normal hierarchy
with an observed site outside the plate, whose log p(x) and posterior are computed by
quadrature; the plate (10 data points) is visited in minibatches of 4, the last one
padded. The parameters are set by hand (no training): the global guide at the exact
posterior's moments, each q_i at z_i's conditional posterior given them.
"""

from __future__ import annotations

import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoMultivariateNormal
from scipy.special import logsumexp
from scipy.stats import norm

from numpyro_uha import GlobalLogZ, UHAFitWarning, UHALocalGuide
from numpyro_uha.evaluation import importance_resample, weighted_moments

N, BATCH, NOISE = 10, 4, 0.5
_rng = np.random.default_rng(3)
Y = (_rng.normal(0.4, 0.8, N) + NOISE * _rng.normal(size=N)).astype(np.float32)
Y0 = np.float32(0.7)


def model(y, batch, y0):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    numpyro.sample("y0", dist.Normal(mu, 1.0), obs=y0)  # outside the plate
    with numpyro.plate("g", y.shape[0], subsample_size=batch) as idx:
        z = numpyro.sample("z", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(z, NOISE), obs=y[idx])


def _exact():
    """log p(y, y0) and the posterior moments of mu and log tau, by quadrature."""
    mu = np.linspace(-8.0, 8.0, 1601)[:, None]
    tau = np.linspace(1e-4, 6.0, 3000)[None, :]
    log_joint = (
        norm.logpdf(mu, 0, 2) + np.log(2) + norm.logpdf(tau, 0, 1) + norm.logpdf(Y0, mu, 1)
        + norm.logpdf(Y.astype(np.float64)[:, None, None], mu, np.sqrt(tau**2 + NOISE**2)).sum(0)
    )
    cell = (mu[1, 0] - mu[0, 0]) * (tau[0, 1] - tau[0, 0])
    log_z = logsumexp(log_joint) + np.log(cell)
    p = np.exp(log_joint - logsumexp(log_joint))

    def moments(x):
        mean = float(np.sum(p * x))
        return mean, float(np.sqrt(np.sum(p * x**2) - mean**2))

    return log_z, moments(mu + 0 * tau), moments(np.log(tau) + 0 * mu), moments(tau + 0 * mu)


EXACT_LOG_Z, MU, LOG_TAU, TAU = _exact()


def _setup(global_guide=None):
    guide = UHALocalGuide(model, K=4, global_guide=global_guide)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    params = dict(svi.get_params(svi.init(jax.random.PRNGKey(0), jnp.asarray(Y), BATCH, Y0)))
    # each q_i: z_i's conditional posterior at the globals' posterior means
    tau = np.exp(LOG_TAU[0])
    precision = 1 / NOISE**2 + 1 / tau**2
    loc = (Y / NOISE**2 + MU[0] / tau**2) / precision
    params["local_loc"] = jnp.asarray(loc[:, None], jnp.float32)
    params["local_scale"] = jnp.full((N, 1), precision**-0.5, jnp.float32)
    return guide, params


def _at_exact_moments(params, tau_shift=0.0, tau_sd=None):
    """AutoNormal's parameters at the exact posterior's moments of (mu, log tau); log
    tau's mean shifted by ``tau_shift`` and its sd set to ``tau_sd`` where given."""
    params = dict(params)
    params["mu_local_global_loc"] = jnp.asarray(MU[0], jnp.float32)
    params["mu_local_global_scale"] = jnp.asarray(MU[1], jnp.float32)
    params["tau_local_global_loc"] = jnp.asarray(LOG_TAU[0] + tau_shift, jnp.float32)
    params["tau_local_global_scale"] = jnp.asarray(
        LOG_TAU[1] if tau_sd is None else tau_sd, jnp.float32
    )
    return params


@pytest.fixture(scope="module")
def fitted():
    guide, params = _setup()
    return guide, _at_exact_moments(params)


def _global_log_z(guide, params, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = guide.global_log_z(
            jax.random.PRNGKey(1), params, jnp.asarray(Y), BATCH, Y0, **kwargs
        )
    return result, [w for w in caught if issubclass(w.category, UHAFitWarning)]


def test_log_z_of_all_the_data_matches_quadrature(fitted):
    guide, params = fitted
    result, fit_warnings = _global_log_z(guide, params, num_draws=2000, num_samples=32)
    assert isinstance(result, GlobalLogZ)
    assert not fit_warnings and result.pareto_khat < 0.7
    # a consistent estimate, lower-biased by about se²/2 (1e-2 here): within 4 se
    assert 0 < result.chains_se <= result.se < 0.5
    assert abs(result.log_z - EXACT_LOG_Z) < 4 * result.se, (result.log_z, EXACT_LOG_Z, result.se)
    # a lower bound, below the estimate (Jensen, draw by draw and over the draws)
    assert result.elbo < result.log_z
    assert result.log_weights.shape == (2000,) and result.samples["tau"].shape == (2000,)
    # the weighted draws give the exact posterior mean of tau (a consistent estimate)
    mean, sd = weighted_moments(result)["tau"]
    se = sd / np.sqrt(result.ess)
    assert abs(mean - TAU[0]) < 4 * se, (mean, TAU[0], se)
    assert importance_resample(jax.random.PRNGKey(2), result, 50)["tau"].shape == (50,)


def test_hamiltonian_ais_chains_give_the_same_log_z(fitted):
    # corrected=True: each p̂(x_i | θ) from Metropolis-corrected chains, unbiased too
    guide, params = fitted
    result, _ = _global_log_z(guide, params, num_draws=2000, num_samples=32, corrected=True)
    assert abs(result.log_z - EXACT_LOG_Z) < 4 * result.se, (result.log_z, EXACT_LOG_Z, result.se)
    # the same keys, other chains (the flag reaches them): other weights
    uha, _ = _global_log_z(guide, params, num_draws=2000, num_samples=32)
    assert not np.allclose(result.log_weights, uha.log_weights)


def test_a_global_guide_with_correlations_gives_the_same_log_z():
    # AutoMultivariateNormal draws _auto_latent and puts each site's Jacobian in a Delta
    # site: the guide's density of θ is their sum, as for AutoNormal's sites
    guide, params = _setup(AutoMultivariateNormal)
    # the exact moments on the latent (mu, log tau), uncorrelated
    assert {n for n in params if "global" in n} == {"local_global_loc", "local_global_scale_tril"}
    params["local_global_loc"] = jnp.asarray([MU[0], LOG_TAU[0]], jnp.float32)
    params["local_global_scale_tril"] = jnp.diag(
        jnp.asarray([MU[1], LOG_TAU[1]], jnp.float32)
    )
    result, fit_warnings = _global_log_z(guide, params, num_draws=2000, num_samples=32)
    assert not fit_warnings
    assert abs(result.log_z - EXACT_LOG_Z) < 4 * result.se, (result.log_z, EXACT_LOG_Z, result.se)


def test_a_collapsed_group_scale_is_warned_about_and_the_weights_move_it_back(fitted):
    # the failure SVI's local bound can settle in: tau's guide 3 times too small and narrow
    guide, params = fitted
    collapsed = _at_exact_moments(params, tau_shift=-np.log(3.0), tau_sd=0.1)
    result, fit_warnings = _global_log_z(guide, collapsed, num_draws=2000)
    assert result.pareto_khat >= 0.7
    assert len(fit_warnings) == 1 and "decenter=True" in str(fit_warnings[0].message)
    assert fit_warnings[0].filename == __file__  # the line that called global_log_z
    guide_mean = float(np.mean(result.samples["tau"]))
    assert weighted_moments(result)["tau"][0] > guide_mean + 0.1
    # and its log p(x) is far below the good fit's (a worse proposal, lower-biased)
    good, _ = _global_log_z(guide, params, num_draws=2000)
    assert result.log_z < good.log_z - 4 * np.hypot(result.se, good.se)


@pytest.mark.parametrize(
    "khat, ess, expected",
    [(0.3, 3000.0, None), (0.9, 3000.0, "k̂ = 0.90 ≥ 0.7"), (0.3, 150.0, "under 5 %"),
     (float("inf"), 3000.0, None)],
)
def test_the_warning_rule_is_heavy_tails_or_few_effective_draws(khat, ess, expected):
    # k̂ alone misses a guide on the far side of a narrow posterior (short-tailed weights,
    # few effective: benchmarks.global_khat's poisson_mixed with decenter=True, one key
    # k̂ -0.29 with 164 of 4000 draws effective); an inf k̂ (too few draws) says nothing
    from numpyro_uha.local import _warn_if_globals_missed

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _warn_if_globals_missed(khat, ess, 4000)
    messages = [str(w.message) for w in caught if issubclass(w.category, UHAFitWarning)]
    if expected is None:
        assert not messages
    else:
        assert len(messages) == 1 and expected in messages[0] and "decenter=True" in messages[0]


def test_the_last_minibatch_is_padded_and_its_padding_dropped(fitted):
    # 10 data points in minibatches of 4 and of 5 (no padding): the same log p(x)
    guide, params = fitted
    by_four, _ = _global_log_z(guide, params, num_draws=500, num_samples=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UHAFitWarning)
        by_five = guide.global_log_z(
            jax.random.PRNGKey(1), params, jnp.asarray(Y), 5, Y0, num_draws=500, num_samples=32
        )
    assert abs(by_four.log_z - by_five.log_z) < 4 * np.hypot(by_four.se, by_five.se)


# slow: three set-ups and compiles (about 30 s alone on 2 cores); run with -m slow
@pytest.mark.slow
def test_the_chains_random_numbers_differ_between_minibatches():
    # the data points' estimates p̂(x_i | θ) must be independent for their product to
    # be unbiased. With the first minibatch's 4 points repeated 1, 2 and 3 times, every
    # draw's log weight is A_s + S1_s + S2_s (+ S3_s), A_s its prior over q and S_k the
    # k-th minibatch's log p̂ sum: the same chains' keys for every minibatch would make
    # S1 = S2 = S3 and so log w(12) - 2 log w(8) + log w(4) = 0 for every draw.
    log_w = []
    for copies in (1, 2, 3):
        y = np.tile(Y[:BATCH], copies)
        guide = UHALocalGuide(model, K=4)
        svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
        params = dict(svi.get_params(svi.init(jax.random.PRNGKey(0), jnp.asarray(y), BATCH, Y0)))
        params = _at_exact_moments(params)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UHAFitWarning)  # q_i at their initial values
            result = guide.global_log_z(
                jax.random.PRNGKey(1), params, jnp.asarray(y), BATCH, Y0, num_draws=50,
                num_samples=4,
            )
        log_w.append(result.log_weights)
    # the same θ_s in every call (same key, same global guide), so A_s cancels
    second_difference = log_w[2] - 2 * log_w[1] + log_w[0]
    assert np.all(np.isfinite(second_difference))
    assert np.std(second_difference) > 1e-2, second_difference[:5]


def test_bad_calls_are_refused_with_the_reason(fitted):
    guide, params = fitted
    with pytest.raises(ValueError, match="num_samples"):
        guide.global_log_z(jax.random.PRNGKey(1), params, jnp.asarray(Y), BATCH, Y0, num_samples=1)
    with pytest.raises(TypeError, match="outside jax.jit"):
        jax.jit(
            lambda key: guide.global_log_z(key, params, jnp.asarray(Y), BATCH, Y0).log_z
        )(jax.random.PRNGKey(1))

    def no_globals(y, batch):
        with numpyro.plate("g", y.shape[0], subsample_size=batch) as idx:
            z = numpyro.sample("z", dist.Normal(0.0, 1.0))
            numpyro.sample("y", dist.Normal(z, NOISE), obs=y[idx])

    local_only = UHALocalGuide(no_globals, K=2)
    svi = SVI(no_globals, local_only, optax.adam(1e-3), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), jnp.asarray(Y), BATCH)
    with pytest.raises(ValueError, match="no global latent sites"):
        local_only.global_log_z(jax.random.PRNGKey(1), svi.get_params(state), jnp.asarray(Y), BATCH)


def test_a_point_mass_global_guide_is_refused():
    # AutoDelta's draws are all the same value and log q = 0: the weights would be the
    # joint density at one point, not an estimate of p(x)
    from numpyro.infer.autoguide import AutoDelta

    guide = UHALocalGuide(model, K=2, global_guide=AutoDelta)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), jnp.asarray(Y), BATCH, Y0))
    with pytest.raises(ValueError, match=r"same value of \['mu', 'tau'\]: a point mass"):
        guide.global_log_z(jax.random.PRNGKey(1), params, jnp.asarray(Y), BATCH, Y0, num_draws=10)


def test_params_that_are_not_the_fits_are_refused(fitted):
    # an empty or partial dict ran on the initial values; data past the fitted points
    # gave NaN rows, reported as divergences ("lower the step size")
    guide, params = fitted
    y, call = jnp.asarray(Y), partial(guide.global_log_z, jax.random.PRNGKey(1), num_draws=10)
    with pytest.raises(ValueError, match=r"lacks the guide's parameter\(s\) \['local_beta_logits'"):
        call({}, y, BATCH, Y0)
    with pytest.raises(ValueError, match=r"global guide's parameter\(s\) \['tau_local_global_loc'\]"):
        call({k: v for k, v in params.items() if k != "tau_local_global_loc"}, y, BATCH, Y0)
    longer = jnp.concatenate([y, y[:5]])
    with pytest.raises(ValueError, match="has 15 data points in this call, but the per-data-point"):
        call(params, longer, BATCH, Y0)
    with pytest.raises(ValueError, match="has 15 data points"):  # the draw methods too
        guide.sample_posterior(jax.random.PRNGKey(1), params, longer, BATCH, Y0,
                               subsample_idx=jnp.arange(10, 14))


def _hand(y, batch, y0, returns=True):
    m = numpyro.param("m_loc", 0.0)
    t = numpyro.param("t_loc", 0.0)
    mu = numpyro.sample("mu", dist.Normal(m, 0.3))
    tau = numpyro.sample("tau", dist.LogNormal(t, 0.3))
    return {"mu": mu, "tau": tau} if returns else None


def test_a_hand_written_global_guide_gets_clear_errors():
    # a plain guide function was called as a factory (a bare "missing argument"
    # TypeError), and one that returned None failed with "'NoneType' object is not
    # subscriptable"
    def init(global_guide):
        guide = UHALocalGuide(model, K=2, global_guide=global_guide)
        svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
        return guide, svi.get_params(svi.init(jax.random.PRNGKey(0), jnp.asarray(Y), BATCH, Y0))

    with pytest.raises(TypeError, match="goes in as global_guide=lambda model: _hand"):
        init(_hand)
    with pytest.raises(TypeError, match=r"must return a dict .*\['mu', 'tau'\].* it returned NoneType"):
        init(lambda m: partial(_hand, returns=False))
    guide, params = init(lambda m: _hand)
    assert {"m_loc", "t_loc"} <= set(params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UHAFitWarning)
        result = guide.global_log_z(jax.random.PRNGKey(1), params, jnp.asarray(Y), BATCH, Y0,
                                    num_draws=50)
    assert np.isfinite(result.log_z)


def test_the_result_prints_its_estimate_and_diagnostics(fitted):
    guide, params = fitted
    result, _ = _global_log_z(guide, params, num_draws=100)
    text = str(result)
    assert text.startswith(f"log p(x) {result.log_z:.2f} ± {result.se:.2f}")
    assert f"Pareto k̂ {result.pareto_khat:.2f}, ESS" in text and "of 100 draws" in text


def _squeezed_heavy_tail(spread, size=4000):
    """Log weights with a Pareto-shaped tail (k = 1) whose largest lies ``spread`` nats
    above their mean: all within a factor e^spread of it."""
    w = np.random.default_rng(0).pareto(1.0, size)
    return spread * w / (w.max() - w.mean())


@pytest.mark.parametrize("spread, warned", [(0.3, False), (3.0, True)])
def test_a_high_khat_of_nearly_equal_global_weights_is_not_a_miss(spread, warned):
    # the rule of log_z and the draws (_weights.khat_counts): k̂ fitted to weights within
    # a factor of two of their mean is noise; a tail over 3 nats is not
    from numpyro_uha._weights import psis_khat
    from numpyro_uha.local import _warn_if_globals_missed

    log_w = _squeezed_heavy_tail(spread)
    khat = psis_khat(log_w)
    assert khat >= 0.7
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _warn_if_globals_missed(khat, 3000.0, log_w.size, log_w)
    messages = [str(w.message) for w in caught if issubclass(w.category, UHAFitWarning)]
    assert bool(messages) == warned
    if warned:
        assert f"k̂ = {khat:.2f}" in messages[0]


@pytest.mark.parametrize("narrow, warned", [(1.0, False), (0.2, True)])
def test_per_point_log_z_takes_a_high_khat_of_nearly_equal_weights_for_noise(
    narrow, warned, monkeypatch
):
    # each q_i at z_i's exact conditional: its chains' weights lie within 0.15 nats of
    # their mean, so a k̂ of 3 there is noise; q_i five times too narrow has a real tail
    import numpyro_uha.local as local_module

    guide, params = _setup()
    params["local_scale"] = params["local_scale"] * narrow
    monkeypatch.setattr(
        local_module, "psis_khat_columns", lambda log_w: np.full(log_w.shape[1], 3.0)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = guide.log_z(
            jax.random.PRNGKey(1), params, jnp.asarray(Y), BATCH, Y0, num_samples=200,
            subsample_idx=jnp.arange(4), global_values={"mu": MU[0], "tau": TAU[0]},
        )
    messages = [str(w.message) for w in caught if issubclass(w.category, UHAFitWarning)]
    assert np.all(result.pareto_khat == 3.0)
    assert bool(messages) == warned
    if warned:
        assert "Pareto k̂ ≥ 0.7" in messages[0]
        assert "at 4 data point(s) [0, 1, 2, 3]" in messages[0]


def _point_by_point(guide, log_w, idx):
    """UHALocalGuide.log_z's fields and warnings as it computed them before it took the
    data points together: log_z_from_weights, psis_khat and _khat_counts_of column by
    column."""
    from numpyro_uha.evaluation import log_z_from_weights
    from numpyro_uha._weights import psis_khat
    from numpyro_uha.local import _khat_counts_of, _warn_if_points_fit_poorly

    log_w = np.asarray(log_w, np.float64)
    per_point = [log_z_from_weights(log_w[:, i], guide.K) for i in range(log_w.shape[1])]
    fields = {
        name: np.array([getattr(e, name) for e in per_point])
        for name in ("iw", "iw_se", "elbo", "elbo_se", "ess", "num_nonfinite")
    }
    fields["pareto_khat"] = np.array(
        [psis_khat(np.where(np.isnan(w), -np.inf, w)) for w in log_w.T]
    )
    heavy = np.array([_khat_counts_of(k, w) for k, w in zip(fields["pareto_khat"], log_w.T)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _warn_if_points_fit_poorly(
            heavy, fields["num_nonfinite"], log_w.shape[0], np.asarray(idx),
            guide.per_data_point, fields["ess"],
        )
    return fields, [str(w.message) for w in caught]


@pytest.fixture(scope="module")
def per_point():
    """The guide, its parameters, and log_z's arguments for the per-point tests (one
    compilation for them all)."""
    guide, params = _setup()
    call = dict(num_samples=300, subsample_idx=jnp.arange(BATCH),
                global_values={"mu": MU[0], "tau": TAU[0]})
    return guide, params, (jnp.asarray(Y), BATCH, Y0), call


@pytest.mark.parametrize("narrow", [1.0, 0.2])
def test_per_point_log_z_is_log_z_from_weights_and_psis_khat_point_by_point(
    narrow, per_point
):
    """log_z takes its data points' columns of log weights together: the same floats and
    the same warning as log_z_from_weights, psis_khat and _khat_counts_of column by
    column on the weights log_weights gives with the same key."""
    guide, params, args, call = per_point
    params = dict(params)
    params["local_scale"] = params["local_scale"] * narrow  # 0.2: heavy tails, a warning
    key = jax.random.PRNGKey(2)
    log_w = guide.log_weights(key, params, *args, **call)
    want, want_messages = _point_by_point(guide, log_w, call["subsample_idx"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = guide.log_z(key, params, *args, **call)
    assert [str(w.message) for w in caught if issubclass(w.category, UHAFitWarning)] \
        == want_messages
    assert bool(want_messages) == (narrow < 1)
    for name in ("iw", "iw_se", "elbo", "elbo_se", "ess"):
        got = getattr(result, "log_z" if name == "iw" else "se" if name == "iw_se" else name)
        np.testing.assert_array_equal(got, want[name], err_msg=name)
    np.testing.assert_array_equal(result.num_nonfinite, want["num_nonfinite"])
    np.testing.assert_allclose(result.pareto_khat, want["pareto_khat"], rtol=1e-12, atol=0)
    assert result.total == float(want["iw"].sum())


def test_per_point_log_z_of_diverged_draws_is_log_z_from_weights_point_by_point(
    per_point, monkeypatch
):
    """The columns with a diverged draw (NaN or -inf: a zero weight) and the others in
    chunks, finite ones between diverged ones: the same floats, warning and errors as
    log_z_from_weights, psis_khat and _khat_counts_of column by column."""
    import numpyro_uha.evaluation.logz as logz_module

    guide, params, args, call = per_point
    key = jax.random.PRNGKey(3)
    clean = np.asarray(guide.log_weights(key, params, *args, **call), np.float64)[:40]
    # 12 points (the 4 columns thrice), a draw of a point's chain NaN or -inf in some
    rng = np.random.default_rng(0)
    log_w = np.concatenate([clean, clean + 0.5, clean - 1.0], axis=1)
    log_w[rng.permutation(40)[:2], 1] = np.nan
    log_w[rng.permutation(40)[:6], 4] = -np.inf  # > 10 % diverged: warned
    log_w[3, 9] = -np.inf
    log_w[4:, 7] = -np.inf  # 4 finite weights: too few for k̂'s fit (inf, not heavy)
    idx = np.arange(12)
    monkeypatch.setattr(logz_module, "LOG_Z_COLUMNS_CHUNK", 2 * 40)  # two points a chunk
    monkeypatch.setattr(guide, "log_weights", lambda *a, **k: log_w.copy())
    want, want_messages = _point_by_point(guide, log_w, idx)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = guide.log_z(key, params, *args, num_samples=40, subsample_idx=idx,
                             global_values=call["global_values"])
    assert [str(w.message) for w in caught if issubclass(w.category, UHAFitWarning)] \
        == want_messages
    assert "more than 10 % of the chains diverged" in want_messages[0]
    np.testing.assert_array_equal(result.num_nonfinite, [0, 2, 0, 0, 6, 0, 0, 36, 0, 1, 0, 0])
    assert result.pareto_khat[7] == np.inf
    for name, got in [("iw", result.log_z), ("iw_se", result.se), ("elbo", result.elbo),
                      ("elbo_se", result.elbo_se), ("ess", result.ess)]:
        np.testing.assert_array_equal(got, want[name], err_msg=name)
    np.testing.assert_allclose(result.pareto_khat, want["pareto_khat"], rtol=1e-12, atol=0)
    # a point with fewer than two finite weights, or a +inf one: log_z_from_weights'
    # error, of the first such point
    from numpyro_uha.evaluation import log_z_from_weights

    for bad_at, value in [(7, -np.inf), (5, np.inf)]:
        broken = log_w.copy()
        broken[:, 10] = np.nan
        broken[1:, bad_at] = value
        monkeypatch.setattr(guide, "log_weights", lambda *a, **k: broken.copy())
        with pytest.raises(FloatingPointError) as expected:
            for i in range(12):
                log_z_from_weights(broken[:, i], guide.K)
        with pytest.raises(FloatingPointError) as raised:
            guide.log_z(key, params, *args, num_samples=40, subsample_idx=idx,
                        global_values=call["global_values"])
        assert str(raised.value) == str(expected.value)
