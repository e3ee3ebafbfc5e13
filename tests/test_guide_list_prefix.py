"""Two guides of one AutoGuideList with the same prefix are refused (they would share
``auto_loc``, ``auto_scale``, … without a word and fit the wrong posterior), whichever
runs first; with distinct prefixes the list fits each part's exact posterior."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro import handlers
from numpyro.infer import SVI, Predictive, Trace_ELBO
from numpyro.infer.autoguide import AutoDiagonalNormal, AutoGuideList

from numpyro_uha import UHAGuide


def _model():
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    numpyro.sample("ya", dist.Normal(a, 1.0).expand([3]).to_event(1), obs=jnp.full(3, 3.0))
    numpyro.sample("yb", dist.Normal(b, 1.0).expand([3]).to_event(1), obs=jnp.full(3, -3.0))


def _uha(prefix="auto"):
    return UHAGuide(handlers.block(_model, hide=["b"]), K=4, warm_start_steps=100,
                    base_dist="diagonal", prefix=prefix)


def _other(kind, prefix="auto"):
    part = handlers.block(_model, expose=["b"])
    if kind == "uha":
        return UHAGuide(part, K=4, warm_start_steps=100, base_dist="diagonal", prefix=prefix)
    return AutoDiagonalNormal(part, prefix=prefix)


@pytest.mark.parametrize("uha_first", [True, False])
@pytest.mark.parametrize("other", ["diagonal", "uha"])
def test_a_shared_prefix_is_refused_whichever_guide_runs_first(uha_first, other):
    guides = [_uha(), _other(other)]
    guide = AutoGuideList(_model)
    for g in guides if uha_first else guides[::-1]:
        guide.append(g)
    svi = SVI(_model, guide, optax.adam(1e-2), Trace_ELBO())
    # two UHAGuides also clash on their factor site, _auto_uha_factor
    with pytest.raises((ValueError, AssertionError), match="_auto_(latent|uha_factor)"):
        svi.init(jax.random.PRNGKey(0))


def test_distinct_prefixes_fit_each_parts_exact_posterior():
    guide = AutoGuideList(_model)
    guide.append(_uha(prefix="uha"))
    guide.append(_other("diagonal"))
    svi = SVI(_model, guide, optax.adam(1e-2), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), 1000, progress_bar=False)
    draws = guide.sample_posterior(jax.random.PRNGKey(1), result.params, sample_shape=(4000,))
    # exact posteriors: a ~ N(2.25, 0.5²), b ~ N(-2.25, 0.5²); tolerance 5 MC SEs of a
    # mean (sd 0.5, 4000 draws) plus what the fits' own error allows (0.05)
    tol = 5 * 0.5 / np.sqrt(4000) + 0.05
    assert abs(float(draws["a"].mean()) - 2.25) < tol
    assert abs(float(draws["b"].mean()) + 2.25) < tol
    predictive = Predictive(_model, guide=guide, params=result.params, num_samples=10)
    out = predictive(jax.random.PRNGKey(2))
    assert set(out) == {"ya", "yb"}  # NumPyro's Predictive: the sites the guide did not draw
