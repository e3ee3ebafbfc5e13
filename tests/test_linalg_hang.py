"""jaxlib 0.10's batched CPU LAPACK kernels can hang a program running several at once
(``numpyro_uha._linalg_hang``): ``import numpyro_uha`` adds XLA's flag that avoids it,
and the guide warns about models that call LAPACK where the flag is not in effect. The
hang is shown in a subprocess (two vmapped triangular solves of 40 000 systems: it hung
every time on a 2-core machine without the flag; on more cores it may not hang at all,
and the test then passes either way)."""

import os
import subprocess
import sys
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


def setup_warnings(model, monkeypatch, version, flags=""):
    monkeypatch.setattr(_linalg_hang, "_warned", False)
    monkeypatch.setattr(_linalg_hang, "_flags_in_effect", flags)
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
    # every LAPACK call it makes (the hang was in a triangular solve), and the flag
    assert "triangular_solve" in text and _linalg_hang.FLAG in text
    assert not setup_warnings(correlated_rows, monkeypatch, "0.11.2")
    assert not setup_warnings(correlated_rows, monkeypatch, "0.9.2")
    assert not setup_warnings(independent_rows, monkeypatch, "0.10.1")
    # with the flag in effect (added at import, or the user's) there is nothing to say
    assert not setup_warnings(correlated_rows, monkeypatch, "0.10.1", _linalg_hang.FLAG)
    on = _linalg_hang.FLAG.replace("false", "true")
    assert len(setup_warnings(correlated_rows, monkeypatch, "0.10.1", f"{_linalg_hang.FLAG} {on}")) == 1


def test_the_flag_is_added_only_where_it_can_act(monkeypatch):
    monkeypatch.setattr(_linalg_hang, "_backends_started", lambda: False)
    monkeypatch.setattr(_linalg_hang.jaxlib, "__version__", "0.10.1")
    env = {"XLA_FLAGS": "--xla_backend_optimization_level=0"}
    assert _linalg_hang.avoid_hang(env)
    assert env["XLA_FLAGS"] == f"--xla_backend_optimization_level=0 {_linalg_hang.FLAG}"
    assert _linalg_hang.avoid_hang(env := {}) and env["XLA_FLAGS"] == _linalg_hang.FLAG
    # the user's own setting of it is kept
    on = {"XLA_FLAGS": _linalg_hang.FLAG.replace("false", "true")}
    assert not _linalg_hang.avoid_hang(on) and "true" in on["XLA_FLAGS"]
    # opted out
    assert not _linalg_hang.avoid_hang(env := {_linalg_hang.OPT_OUT: "1"}) and "XLA_FLAGS" not in env
    assert _linalg_hang.avoid_hang({_linalg_hang.OPT_OUT: "0"})
    # JAX already started (too late to act), or cannot tell
    for started in (True, None):
        monkeypatch.setattr(_linalg_hang, "_backends_started", lambda s=started: s)
        assert not _linalg_hang.avoid_hang(env := {}) and "XLA_FLAGS" not in env
    # another jaxlib: not needed (and another XLA may not know the flag)
    monkeypatch.setattr(_linalg_hang, "_backends_started", lambda: False)
    monkeypatch.setattr(_linalg_hang.jaxlib, "__version__", "0.11.2")
    assert not _linalg_hang.avoid_hang(env := {}) and "XLA_FLAGS" not in env


_HANG = r"""
import numpyro_uha  # first, as a user's script would: it sets XLA_FLAGS
import os, sys
import jax, jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

def f(L1, b1, L2, b2):
    s1 = jax.vmap(lambda L, b: solve_triangular(L, b, lower=True))(L1, b1)
    s2 = jax.vmap(lambda L, b: solve_triangular(L, b, lower=True))(L2, b2)
    return s1.sum() + s2.sum()

B = 40000
k = jax.random.split(jax.random.PRNGKey(0), 4)
L1 = jnp.tril(jax.random.normal(k[0], (B, 8, 8))) + 8 * jnp.eye(8)
L2 = jnp.tril(jax.random.normal(k[1], (B, 8, 8))) + 8 * jnp.eye(8)
b1, b2 = jax.random.normal(k[2], (B, 8, 4)), jax.random.normal(k[3], (B, 8, 4))
jf = jax.jit(f)
for i in range(30):
    jf(L1 + i, b1, L2, b2).block_until_ready()
print("ran", os.environ.get("XLA_FLAGS", ""))
"""


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the hang is jaxlib 0.10's CPU one")
def test_two_batched_solves_at_once_run_after_import_numpyro_uha():
    env = {k: v for k, v in os.environ.items() if k != _linalg_hang.OPT_OUT}
    env["JAX_PLATFORMS"] = "cpu"
    try:
        run = subprocess.run([sys.executable, "-c", _HANG], env=env, capture_output=True,
                             text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("two batched triangular solves at once hung (killed after 120 s)")
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("ran")
    if _linalg_hang.affected(backend="cpu"):
        assert _linalg_hang.FLAG in run.stdout


def test_the_lapack_primitives_are_read_from_a_jaxpr():
    def solve(a, b):
        return jax.scipy.linalg.solve_triangular(jnp.linalg.cholesky(a), b, lower=True)

    text = str(jax.make_jaxpr(solve)(jnp.eye(3), jnp.ones(3)))
    assert _linalg_hang.LAPACK_PRIMITIVE.search(text) is not None
    plain = str(jax.make_jaxpr(lambda a, b: jnp.tanh(a @ b).sum())(jnp.eye(3), jnp.ones(3)))
    assert _linalg_hang.LAPACK_PRIMITIVE.search(plain) is None
    assert _linalg_hang.affected("0.10.0", "cpu") and not _linalg_hang.affected("0.10.1", "gpu")
