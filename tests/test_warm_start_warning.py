"""The warm start's "not converged" warning says by how much its loss was still falling."""

import re
import warnings

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import UHAGuide
from numpyro_uha.core.warm_start import loss_decrease


def _hierarchical(g, y, num_groups):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("groups", num_groups):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
    with numpyro.plate("obs", g.shape[0]):
        numpyro.sample("y", dist.Normal(theta[g], sigma), obs=y)


def test_loss_decrease_is_the_difference_of_the_last_two_tenths_and_its_se():
    rng = np.random.default_rng(0)
    losses = rng.normal(size=200) + np.linspace(3.0, 0.0, 200)
    diff, se = loss_decrease(losses)
    before, last = losses[160:180], losses[180:]
    assert diff == pytest.approx(before.mean() - last.mean())
    assert se == pytest.approx(np.sqrt(before.var() / 20 + last.var() / 20))
    assert loss_decrease(losses[:19]) is None


def test_an_unconverged_warm_start_warns_with_the_decrease_of_its_own_losses():
    rng = np.random.default_rng(3)
    g = np.repeat(np.arange(60), 5)
    y = np.asarray((1.0 + 0.5 * rng.normal(size=60))[g] + rng.normal(size=300), np.float32)
    # 400 steps on a centered hierarchical model: the plain start is still descending
    guide = UHAGuide(_hierarchical, K=4, warm_start_steps=400, decenter=False)
    svi = SVI(_hierarchical, guide, optax.adam(1e-3), Trace_ELBO())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        svi.init(jax.random.PRNGKey(0), g, y, 60)
    fit = guide.warm_start_result
    assert not bool(fit.converged)
    messages = [str(w.message) for w in caught if "had not converged" in str(w.message)]
    assert len(messages) == 1
    found = re.search(r"fell by (\S+) ± (\S+) nats", messages[0])
    diff, se = loss_decrease(np.asarray(fit.losses))
    assert diff > 2 * se
    assert float(found.group(1)) == pytest.approx(diff, rel=5e-3)
    assert float(found.group(2)) == pytest.approx(se, rel=5e-2)
