"""The warm start's further VI rounds (``VI_MAX_ROUNDS``): a rule that asks for one
where a start was still falling over the last round's second half and could pass the
best start, and a centred Poisson GLMM on which one round leaves the fit far short
(its mode search ends in the spike where the group scale goes to 0)."""

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from numpyro_uha.core.warm_start import (
    VI_ROUND_MIN_FALL,
    VI_ROUND_PASS_MARGIN,
    _worth_another_round,
    rows_oracle,
    warm_start,
)

STEPS, DIM = 1000, 10


def _losses(*curves, noise=0.5, seed=0):
    """(steps, starts) losses: each curve from its first value to its last, linear over
    the round, plus Gaussian noise of sd ``noise``."""
    rng = np.random.default_rng(seed)
    cols = [np.linspace(a, b, STEPS) + noise * rng.normal(size=STEPS) for a, b in curves]
    return np.stack(cols, axis=1)


def _scales(*log_scales):
    return np.exp(np.asarray(log_scales, np.float64))[:, None] * np.ones((1, DIM))


def test_the_best_start_still_falling_gets_another_round():
    losses = _losses((200.0, 100.0), (300.0, 300.0), (300.0, 300.0))
    assert _worth_another_round(losses, _scales(0, 0, 0))


def test_flat_fits_get_none():
    losses = _losses((100.0, 100.0), (300.0, 300.0), (120.0, 120.0))
    assert not _worth_another_round(losses, _scales(0, 0, 0))


def test_a_fall_below_the_minimum_gets_none():
    drop = 1.5 * VI_ROUND_MIN_FALL  # over the round: about half of it in its second half
    losses = _losses((100.0 + drop, 100.0), (300.0, 300.0), (300.0, 300.0), noise=0.01)
    assert not _worth_another_round(losses, _scales(0, 0, 0))
    losses = _losses((100.0 + 4 * drop, 100.0), (300.0, 300.0), (300.0, 300.0), noise=0.01)
    assert _worth_another_round(losses, _scales(0, 0, 0))


def test_a_worse_start_gets_a_round_only_where_it_could_pass_the_best():
    # start 1 falls by about 40 over the second half: from 110, half of that passes 100 ...
    assert _worth_another_round(_losses((100.0, 100.0), (200.0, 110.0), (300.0, 300.0)), _scales(0, 0, 0))
    # ... from 130 only a whole one would (a round spent for nothing, on the zoo) ...
    assert not _worth_another_round(_losses((100.0, 100.0), (210.0, 130.0), (300.0, 300.0)), _scales(0, 0, 0))
    # ... and from 330 not even that
    assert not _worth_another_round(_losses((100.0, 100.0), (400.0, 330.0), (300.0, 300.0)), _scales(0, 0, 0))
    # a start just behind, whose half fall would pass the best by less than the minimum
    # (the zoo's GP: 0.2 nats behind, falling 2.5): no round
    assert not _worth_another_round(_losses((100.0, 100.0), (105.0, 100.2), (300.0, 300.0), noise=0.05), _scales(0, 0, 0))


def test_a_worse_start_must_pass_the_best_by_the_margin():
    # start 1 ends 0.5 behind; over the second half it falls by about 0.475 of its range
    def passes_by(first):
        return 0.5 * 0.475 * (first - 100.5) - 0.5

    # passes by about 1.76 nats: above the minimum fall, below the margin
    assert VI_ROUND_MIN_FALL < passes_by(110.0) < VI_ROUND_PASS_MARGIN
    assert not _worth_another_round(_losses((100.0, 100.0), (110.0, 100.5), (300.0, 300.0), noise=0.05), _scales(0, 0, 0))
    # by about 2.9: a round
    assert passes_by(115.0) > VI_ROUND_PASS_MARGIN
    assert _worth_another_round(_losses((100.0, 100.0), (115.0, 100.5), (300.0, 300.0), noise=0.05), _scales(0, 0, 0))


def test_the_losses_are_compared_in_the_models_coordinates():
    # start 1's u-coordinate losses lack its -Σ log s = 50: in the model's coordinates
    # it ends at 105 + 50 = 155 and cannot pass start 0 at 100
    log_s = -50.0 / DIM
    losses = _losses((100.0, 100.0), (150.0, 105.0), (300.0, 300.0))
    assert not _worth_another_round(losses, _scales(0, log_s, 0))
    assert _worth_another_round(losses, _scales(0, 0, 0))


def test_non_finite_losses_get_none():
    losses = _losses((200.0, 100.0), (300.0, 300.0), (300.0, 300.0))
    losses[:, :] = np.nan
    assert not _worth_another_round(losses, _scales(0, 0, 0))


def _centred_glmm(num_groups=300, per_group=5):
    rng = np.random.default_rng(0)
    g = np.repeat(np.arange(num_groups), per_group)
    y = jnp.asarray(rng.poisson(np.exp(0.5 + 0.5 * rng.normal(size=num_groups)[g])), jnp.float32)
    g = jnp.asarray(g)

    def logdensity(z):
        b0, log_s, u = z[0], z[1], z[2:]
        s = jnp.exp(log_s)
        lp = -0.5 * (b0 / 2.0) ** 2 - 0.5 * s**2 + log_s  # HalfNormal(1) on s, its Jacobian
        lp += jnp.sum(-0.5 * (u / s) ** 2 - log_s)  # u ~ N(0, s), centred
        eta = b0 + u[g]
        return lp + jnp.sum(y * eta - jnp.exp(eta))

    init = jnp.asarray(np.random.default_rng(1).uniform(-2, 2, size=num_groups + 2), jnp.float32)
    return logdensity, init


def test_more_rounds_lift_a_centred_glmm_out_of_its_collapsed_fit():
    logdensity, init = _centred_glmm()
    oracle = rows_oracle(logdensity)
    one = warm_start(jax.random.PRNGKey(0), None, init, 1.0, oracle=oracle, max_rounds=1)
    more = warm_start(jax.random.PRNGKey(0), None, init, 1.0, oracle=oracle)
    assert one.losses.shape[0] == 1000
    assert more.losses.shape[0] > 1000
    w1, w2 = np.asarray(one.log_weights, np.float64), np.asarray(more.log_weights, np.float64)
    gain = w2.mean() - w1.mean()
    se = np.sqrt(w1.var() / w1.size + w2.var() / w2.size)
    # measured: -804 after one round, -628 after three (1 000 steps each)
    assert gain > 10 * se and gain > 50.0
    # the group scale (truth 0.5) is no longer shrunk towards 0
    assert float(jnp.exp(more.loc[1])) == pytest.approx(0.5, abs=0.1)
