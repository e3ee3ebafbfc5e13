import math

import numpy as np
import pytest

from numpyro_uha.evaluation import log_z_from_weights


def test_log_z_estimates_match_lognormal_weights():
    """log w ~ N(μ, s²): E[log w] = μ and log E[w] = μ + s²/2, known exactly."""
    rng = np.random.default_rng(0)
    mu, s = -1.3, 0.5
    est = log_z_from_weights(rng.normal(mu, s, size=200_000), num_transitions=8)
    assert abs(est.elbo - mu) < 4 * est.elbo_se
    assert abs(est.iw - (mu + s**2 / 2)) < 4 * est.iw_se
    expected_ess = 200_000 / math.exp(s**2)  # (E w)² / E w² for lognormal weights
    assert abs(est.ess - expected_ess) / expected_ess < 0.05
    assert est.num_draws == 200_000 and est.num_transitions == 8
    assert "ELBO" in str(est)


def test_iw_is_never_below_elbo():
    rng = np.random.default_rng(1)
    est = log_z_from_weights(rng.standard_t(3, size=1000))
    assert est.iw >= est.elbo


def test_plus_infinity_weight_is_reported():
    with pytest.raises(FloatingPointError, match="\\+inf"):
        log_z_from_weights(np.array([0.0, np.inf, 1.0]))


def test_nan_and_minus_infinity_weights_are_zero_weights():
    # a diverged draw (NaN) and a zero weight (-inf) count in N but add nothing; the
    # ELBO, -inf over all draws, is reported over the finite ones with the count
    for bad in [np.nan, -np.inf]:
        est = log_z_from_weights(np.array([0.0, bad, 0.0]))
        assert est.iw == pytest.approx(math.log(2 / 3))
        assert est.elbo == 0.0 and est.elbo_se == 0.0 and est.num_nonfinite == 1
        assert "1 of 3 draws diverged" in str(est)
