"""On a CPU the default ``sample_batch_size`` (1008 draws) is capped by the free RAM: a
GP's N × N kernel per draw made 1008 draws of a 1000-point GP plan 22 GiB, more than a
24 GiB machine has (a twelfth hunt). Here the free memory is set small instead of the
model large."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

import numpyro_uha.guide as guide_module
from numpyro_uha import UHAGuide

N = 60
_rng = np.random.default_rng(2)
X = np.sort(_rng.uniform(-3, 3, N)).astype(np.float32)
Y = (np.sin(2 * X) + 0.3 * _rng.normal(size=N)).astype(np.float32)


def gp(x, y):
    amp = numpyro.sample("amp", dist.LogNormal(0.0, 1.0))
    noise = numpyro.sample("noise", dist.LogNormal(-1.0, 1.0))
    length = numpyro.sample("length", dist.LogNormal(0.0, 1.0))
    d = (x[:, None] - x[None, :]) / length
    k = amp * jnp.exp(-0.5 * d**2) + (noise + 1e-6) * jnp.eye(x.shape[0])
    numpyro.sample("y", dist.MultivariateNormal(jnp.zeros(x.shape[0]), covariance_matrix=k), obs=y)


def _guide(monkeypatch, free):
    if jax.devices()[0].platform != "cpu":
        pytest.skip("the CPU's default")
    monkeypatch.setattr(guide_module, "_free_host_memory", free)
    guide = UHAGuide(gp, K=2, warm_start_steps=0)
    svi = SVI(gp, guide, optax.adam(1e-3), Trace_ELBO())
    return guide, svi.get_params(svi.init(jax.random.PRNGKey(0), X, Y))


def test_the_default_batch_fits_a_quarter_of_the_free_memory(monkeypatch):
    budget_bytes = 8e6  # a quarter: 2 MB, under what 1008 draws of this GP plan
    guide, params = _guide(monkeypatch, lambda: budget_bytes)
    batch = guide.sample_batch_size
    assert guide_module.CPU_BATCH_MIN <= batch < guide_module.CPU_BATCH_PER_DEVICE
    assert batch & (batch - 1) == 0  # a power of two
    # XLA's plan for the gradients of that many draws fits the budget; twice as many not
    def planned(width):
        lowered = jax.jit(jax.vmap(jax.grad(guide.get_logdensity_fn(params, X, Y)))).lower(
            jax.ShapeDtypeStruct((width, guide.latent_dim), jnp.float32)
        )
        memory = lowered.compile().memory_analysis()
        return memory.temp_size_in_bytes + memory.output_size_in_bytes

    assert planned(batch) <= guide_module.DRAW_MEMORY_SHARE * budget_bytes < planned(2 * batch)
    draws = guide.sample_posterior(jax.random.PRNGKey(1), params, X, Y, sample_shape=(300,))
    assert draws["amp"].shape == (300,) and np.all(np.isfinite(draws["amp"]))


@pytest.mark.parametrize("free", [lambda: 64e9, "unavailable"])
def test_with_memory_to_spare_or_no_figure_it_is_1008(monkeypatch, free):
    def unavailable():
        raise ValueError("no SC_AVPHYS_PAGES here")

    guide, _ = _guide(monkeypatch, unavailable if free == "unavailable" else free)
    assert guide.sample_batch_size == guide_module.CPU_BATCH_PER_DEVICE
