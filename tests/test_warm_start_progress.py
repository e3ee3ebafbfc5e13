"""A long warm start shows a progress bar over its steps; a short one, or
``progress_bar=False``, prints nothing."""

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
import tqdm
from numpyro.infer import SVI, Trace_ELBO

import numpyro_uha.guide as guide_module
from numpyro_uha import UHAGuide
from numpyro_uha.core.warm_start import warm_start


def _model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


Y = np.asarray(np.random.default_rng(0).normal(1.0, 2.0, size=30), np.float32)


def _init(guide):
    svi = SVI(_model, guide, optax.adam(1e-3), Trace_ELBO())
    return svi.init(jax.random.PRNGKey(0), Y)


def test_the_callback_counts_every_step_and_changes_nothing():
    def logdensity(z):
        return -0.5 * jax.numpy.sum((z - 1.0) ** 2 / jax.numpy.arange(1.0, 4.0))

    seen = []
    args = (jax.random.PRNGKey(1), logdensity, np.zeros(3, np.float32), 1.0)
    # a Gaussian: the Laplace check would skip the VI steps this test counts
    with_hook = warm_start(*args, num_steps=50, callback=seen.append, laplace_tolerance=None)
    without = warm_start(*args, num_steps=50, laplace_tolerance=None)
    assert seen == list(range(1, 51))
    np.testing.assert_array_equal(with_hook.loc, without.loc)
    np.testing.assert_array_equal(with_hook.losses, without.losses)


@pytest.mark.parametrize("progress_bar", [True, False])
def test_a_warm_start_longer_than_the_delay_shows_its_bar(monkeypatch, capsys, progress_bar):
    monkeypatch.setattr(guide_module, "PROGRESS_DELAY", 0.0)
    monkeypatch.setattr(guide_module, "PROGRESS_MIN_TOTAL", 0.0)
    closed_at = []

    class Recording(tqdm.tqdm):
        def close(self):
            closed_at.append(self.n)
            super().close()

    monkeypatch.setattr(guide_module.tqdm, "tqdm", Recording)
    _init(UHAGuide(_model, K=4, warm_start_steps=200, progress_bar=progress_bar))
    err = capsys.readouterr().err
    if progress_bar:
        assert "UHAGuide warm start" in err
        assert closed_at and set(closed_at) == {200}  # every step counted
    else:
        assert "warm start" not in err
        assert closed_at == []


@pytest.mark.parametrize("run_bar", [True, False])
def test_svi_runs_progress_bar_reaches_the_warm_starts(monkeypatch, capsys, run_bar):
    # svi.run sets the guide up (svi.init) under its own progress_bar: False silences both
    monkeypatch.setattr(guide_module, "PROGRESS_DELAY", 0.0)
    monkeypatch.setattr(guide_module, "PROGRESS_MIN_TOTAL", 0.0)
    guide = UHAGuide(_model, K=4, warm_start_steps=200)
    svi = SVI(_model, guide, optax.adam(1e-3), Trace_ELBO())
    svi.run(jax.random.PRNGKey(0), 2, Y, progress_bar=run_bar)
    assert ("UHAGuide warm start" in capsys.readouterr().err) == run_bar


def test_a_short_warm_start_prints_nothing(capsys):
    _init(UHAGuide(_model, K=4, warm_start_steps=200))
    assert "warm start" not in capsys.readouterr().err


def test_progress_bar_must_be_a_bool():
    with pytest.raises(TypeError, match="progress_bar"):
        UHAGuide(_model, progress_bar="yes")
