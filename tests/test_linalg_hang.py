"""The warning for models that call LAPACK on a CPU with jaxlib 0.10, whose batched
LAPACK kernels can hang a program running several at once (``numpyro_uha._linalg_hang``).
The hang itself is not a test: it takes a wedged thread pool to show."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import UHAGuide, UHALinalgHangWarning
from numpyro_uha import _linalg_hang


def correlated_rows(y):
    """Rows under a MultivariateNormal whose covariance is latent (a Cholesky factor and
    triangular solves per call)."""
    scale = numpyro.sample("scale", dist.HalfNormal(1.0).expand([3]).to_event(1))
    rho = numpyro.sample("rho", dist.Uniform(-0.5, 0.5))
    cov = jnp.diag(scale**2) + rho * jnp.outer(scale, scale) * (1 - jnp.eye(3))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.MultivariateNormal(jnp.zeros(3), covariance_matrix=cov), obs=y)


def independent_rows(y):
    scale = numpyro.sample("scale", dist.HalfNormal(1.0).expand([3]).to_event(1))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(0.0, scale).to_event(1), obs=y)


Y = jnp.asarray(np.random.default_rng(0).normal(size=(20, 3)), jnp.float32)


def setup_warnings(model, monkeypatch, version):
    monkeypatch.setattr(_linalg_hang, "_warned", False)
    monkeypatch.setattr(_linalg_hang.jaxlib, "__version__", version)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guide = UHAGuide(model, K=2, warm_start_steps=50)
        SVI(model, guide, optax.adam(1e-3), Trace_ELBO()).init(jax.random.PRNGKey(0), Y)
    return [w for w in caught if issubclass(w.category, UHALinalgHangWarning)]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the warning is for CPU backends")
def test_a_model_calling_lapack_is_warned_about_on_jaxlib_0_10_only(monkeypatch):
    said = setup_warnings(correlated_rows, monkeypatch, "0.10.1")
    assert len(said) == 1
    text = str(said[0].message)
    assert "jaxlib 0.10.1" in text and "sample_batch_size" in text and "0.11" in text
    assert not setup_warnings(correlated_rows, monkeypatch, "0.11.2")
    assert not setup_warnings(correlated_rows, monkeypatch, "0.9.2")
    assert not setup_warnings(independent_rows, monkeypatch, "0.10.1")


def test_the_lapack_primitives_are_read_from_a_jaxpr():
    def solve(a, b):
        return jax.scipy.linalg.solve_triangular(jnp.linalg.cholesky(a), b, lower=True)

    text = str(jax.make_jaxpr(solve)(jnp.eye(3), jnp.ones(3)))
    assert _linalg_hang.LAPACK_PRIMITIVE.search(text) is not None
    plain = str(jax.make_jaxpr(lambda a, b: jnp.tanh(a @ b).sum())(jnp.eye(3), jnp.ones(3)))
    assert _linalg_hang.LAPACK_PRIMITIVE.search(plain) is None
    assert _linalg_hang.affected("0.10.0", "cpu") and not _linalg_hang.affected("0.10.1", "gpu")
