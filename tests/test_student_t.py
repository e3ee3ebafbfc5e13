"""On the paper's factorized Student-t target (log Z = 0) UHA's bound beats a Gaussian
guide's and tightens with K. Tolerances are Monte Carlo standard errors of the compared
ELBO estimates, computed here from the draws."""

import math

import jax
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_uha import UHAGuide
from numpyro_uha.evaluation import guide_log_weights, log_z_from_weights

# About 30 s (three fits of 4-particle SVI): run on demand with `pytest -m slow`; the
# benchmark `python -m benchmarks.student_t` measures the same at full size.
pytestmark = pytest.mark.slow

DIM = 10
NUM_DRAWS = 4000


def model():
    numpyro.sample("z", dist.StudentT(3.0, 0.0, 1.0).expand([DIM]).to_event(1))


def fitted_elbo(guide, steps, learning_rate):
    svi = SVI(model, guide, optax.adam(learning_rate), Trace_ELBO(num_particles=4, vectorize_particles=True))
    params = svi.run(jax.random.PRNGKey(0), steps, progress_bar=False).params
    return log_z_from_weights(guide_log_weights(jax.random.PRNGKey(1), model, guide, params, NUM_DRAWS))


@pytest.fixture(scope="module")
def elbos():
    return {
        "normal": fitted_elbo(AutoNormal(model), 2000, 1e-2),
        "uha4": fitted_elbo(UHAGuide(model, K=4), 500, 5e-3),
        "uha16": fitted_elbo(UHAGuide(model, K=16), 500, 5e-3),
    }


def _gap_is_significant(better, worse):
    se = math.hypot(better.elbo_se, worse.elbo_se)
    return better.elbo - worse.elbo > 3.0 * se, (better.elbo, worse.elbo, se)


def test_uha_beats_gaussian_guide(elbos):
    ok, detail = _gap_is_significant(elbos["uha4"], elbos["normal"])
    assert ok, detail


def test_uha_improves_with_K(elbos):
    ok, detail = _gap_is_significant(elbos["uha16"], elbos["uha4"])
    assert ok, detail


def test_bounds_stay_below_true_log_z(elbos):
    for est in elbos.values():
        assert est.elbo < 0.0 + 3.0 * est.elbo_se
