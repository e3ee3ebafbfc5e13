"""``UHAGuide``'s warm start skips its VI where the Laplace approximation is already the
posterior (``numpyro_uha.core.warm_start.laplace_close``), and runs it elsewhere.

* a posterior that is Gaussian in the unconstrained space (conjugate normal means, a
  log-normal scale the data ignore): no VI step runs, the start's ELBO is log Z itself
  (every log weight equal), and nothing warns;
* a skewed posterior (a Poisson rate from three counts): the VI runs all its steps.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import SVI, Trace_ELBO

import conjugate_model as cm
import numpyro_uha.guide as guide_module
from numpyro_uha import UHAGuide
from test_fit_worse_than_start import exact_log_z


def _setup(monkeypatch, model, *args, **options):
    fits = []
    real = guide_module.warm_start

    def recording(*a, **k):
        fit = real(*a, **k)
        if k.get("vi_iterations") is None:  # not the background rehearsal
            fits.append(fit)
        return fit

    monkeypatch.setattr(guide_module, "warm_start", recording)
    guide = UHAGuide(model, K=4, **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SVI(model, guide, optax.adam(1e-3), Trace_ELBO()).init(jax.random.PRNGKey(0), *args)
    (fit,) = fits
    return guide, fit, caught


def test_a_gaussian_posterior_starts_at_its_laplace_approximation(monkeypatch):
    guide, fit, caught = _setup(monkeypatch, cm.model, cm.Y, warm_start_steps=500)
    assert np.asarray(fit.losses).shape == (0,) and int(fit.start) == 2
    elbo, se = guide._start_elbo
    # q is the posterior: every log weight is log Z (float32 rounding of terms near -60)
    assert abs(float(elbo) - exact_log_z()) < 1e-3 and float(se) < 1e-4
    assert not [w for w in caught if issubclass(w.category, (RuntimeWarning, UserWarning))
                and "UHAGuide" in str(w.message)]


def _poisson(counts):
    rate = numpyro.sample("rate", dist.Gamma(1.0, 1.0))
    with numpyro.plate("obs", counts.shape[0]):
        numpyro.sample("counts", dist.Poisson(rate), obs=counts)


def test_a_skewed_posterior_runs_the_vi(monkeypatch):
    _, fit, _ = _setup(monkeypatch, _poisson, jnp.asarray([0.0, 2.0, 1.0]), warm_start_steps=300)
    assert np.asarray(fit.losses).shape == (300,)
