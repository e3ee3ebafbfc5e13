"""Draws in equal batches: no lax.map remainder batch, and no hang.

``jax.lax.map(f, xs, batch_size=b)`` computes ``len(xs) % b`` items with a second vmap
outside its scan, which XLA:CPU runs beside the scan. With jaxlib 0.10's batched LAPACK
kernels (each fans its batch over the intra-op pool and waits for it) two concurrent
batched Choleskys can take every pool thread and wait forever: 2000 draws (1024 + 976)
of the GP zoo model hung at 0 % CPU on 2 cores. ``batched_map`` runs equal batches in
one scan instead.
"""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import UHAGuide
from numpyro_uha.core.batching import batched_map

try:  # jax.extend.core's from JAX 0.10 on (jax.core's alias was removed in 0.11)
    from jax.extend.core import jaxprs_in_params
except ImportError:
    jaxprs_in_params = jax.core.jaxprs_in_params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _f(x):
    return {"sq": x["a"] ** 2, "sum": x["a"] + x["b"].sum()}, None


@pytest.mark.parametrize("n, batch_size", [(1, 4), (4, 4), (5, 4), (20, 7), (2000, 1024), (12, 100)])
def test_batched_map_matches_vmap(n, batch_size):
    xs = {"a": jnp.arange(n, dtype=jnp.float32), "b": jnp.ones((n, 3))}
    out, none = batched_map(_f, xs, batch_size)
    want, _ = jax.vmap(_f)(xs)
    assert none is None
    for name in want:
        assert out[name].shape == want[name].shape
        np.testing.assert_array_equal(out[name], want[name])


@pytest.mark.parametrize("n, batch_size", [(10, 5), (10, 4), (3, 8), (0, 4)])
def test_batched_map_keeps_zero_size_outputs(n, batch_size):
    # lax.map(batch_size=) infers a reshaped dimension, which an output of size 0 (a
    # zero-size latent site's draws) cannot have: "integer modulo by zero"
    out = batched_map(lambda x: (jnp.zeros((0,)), x + 1.0), jnp.arange(n, dtype=jnp.float32), batch_size)
    assert out[0].shape == (n, 0)
    np.testing.assert_array_equal(out[1], np.arange(n) + 1.0)


def _zero_size_site_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    b = numpyro.sample("b", dist.Normal(jnp.zeros(0), 1.0).to_event(1))
    numpyro.sample("y", dist.Normal(mu + b.sum(), 1.0), obs=y)


def test_a_zero_size_latent_site_is_drawn():
    y = jnp.asarray([0.5, 1.2, -0.3, 0.8])
    guide = UHAGuide(_zero_size_site_model, K=2, warm_start_steps=0)
    svi = SVI(_zero_size_site_model, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), y))
    draws = guide.sample_posterior(jax.random.PRNGKey(1), params, y, sample_shape=(10,))
    assert draws["b"].shape == (10, 0) and draws["mu"].shape == (10,)
    assert guide.median(params, y)["b"].shape == (0,)


def _choleskys(jaxpr, in_scan=False):
    """(inside a scan?, operand shape) of every Cholesky in ``jaxpr``, nested ones too."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "cholesky":
            found.append((in_scan, eqn.invars[0].aval.shape))
        for sub in jaxprs_in_params(eqn.params):
            found += _choleskys(sub, in_scan or eqn.primitive.name == "scan")
    return found


@pytest.mark.parametrize("n, batch_size, width", [(2000, 1024, 1000), (1100, 1024, 550), (3000, 1024, 1000),
                                                  (2048, 1024, 1024), (1024, 1024, 1024), (500, 1024, 500)])
def test_batched_map_has_one_scan_and_no_remainder(n, batch_size, width):
    """Every Cholesky has the one batch width and sits in the one scan: nothing runs
    beside it (lax.map's remainder would: 2000 = 1024 + 976)."""
    def f(x):
        return jnp.linalg.cholesky(jnp.eye(3) * (1.0 + x**2))[0, 0]

    jaxpr = jax.make_jaxpr(lambda xs: batched_map(f, xs, batch_size))(jnp.zeros(n)).jaxpr
    assert [eqn.primitive.name for eqn in jaxpr.eqns].count("scan") == 1
    assert _choleskys(jaxpr) == [(True, (width, 3, 3))]


_GP_DRAWS = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np, numpyro, numpyro.distributions as dist
    from numpyro_uha import UHAGuide

    def gp(x, y):
        amplitude = numpyro.sample("amplitude", dist.LogNormal(0.0, 1.0))
        lengthscale = numpyro.sample("lengthscale", dist.LogNormal(0.0, 1.0))
        noise = numpyro.sample("noise", dist.LogNormal(-1.0, 1.0))
        d2 = (x[:, None] - x[None, :]) ** 2
        k = amplitude**2 * jnp.exp(-0.5 * d2 / lengthscale**2) + (noise**2 + 1e-6) * jnp.eye(20)
        numpyro.sample("y", dist.MultivariateNormal(jnp.zeros(20), covariance_matrix=k), obs=y)

    x = jnp.linspace(-3.0, 3.0, 20)
    y = jnp.sin(x)
    guide = UHAGuide(gp, K=8, warm_start_steps=0)
    with numpyro.handlers.seed(rng_seed=0):
        guide(x, y)
    params = {k: v["value"] for k, v in numpyro.handlers.trace(
        numpyro.handlers.seed(guide, 0)).get_trace(x, y).items() if v["type"] == "param"}
    out = guide.sample_posterior_with_log_weights(
        jax.random.PRNGKey(1), params, x, y, sample_shape=(2000,))
    assert out.log_weights.shape == (2000,)
    print("ok", np.isfinite(np.asarray(out.log_weights)).mean())
    """
)


@pytest.mark.slow
def test_gp_draws_with_a_remainder_do_not_hang():
    """2000 draws at sample_batch_size=1024 of a Cholesky model; hung before the fix
    (where XLA:CPU has at least two threads; with one it cannot happen)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        proc = subprocess.run([sys.executable, "-c", _GP_DRAWS], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("2000 UHAGuide draws of a GP model hung (lax.map remainder + batched LAPACK)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ok" in proc.stdout


def _tiny_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def test_a_new_sample_shape_reuses_the_compiled_draws():
    """Draws run in chunks of a fixed width (powers of two up to sample_batch_size, or
    a wider one already compiled), so a new sample_shape compiles no new chain; draw i
    is the same whatever the number of draws (its key is key i of the split)."""
    y = jnp.linspace(-1.0, 2.0, 10)
    guide = UHAGuide(_tiny_model, K=2, warm_start_steps=0, sample_batch_size=256)
    svi = SVI(_tiny_model, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), y))
    key = jax.random.PRNGKey(1)
    first = guide.sample_posterior(key, params, y, sample_shape=(600,))
    (compiled,) = guide._jitted_draws.values()
    size = compiled._cache_size()
    for n in (257, 1000, 300):  # all at the full width, 256
        draws = guide.sample_posterior(key, params, y, sample_shape=(n,))
        assert draws["mu"].shape == (n,)
        np.testing.assert_allclose(draws["mu"][:257], first["mu"][:257], rtol=1e-6)
    assert compiled._cache_size() == size
    # fewer draws than a width already compiled, up to REUSE_WIDTH_RATIO (16) times
    # fewer: that width again (37 draws would get 64 of their own)
    small = guide.sample_posterior(key, params, y, sample_shape=(37,))
    np.testing.assert_allclose(small["mu"], first["mu"][:37], rtol=1e-6)
    assert compiled._cache_size() == size
    guide.sample_posterior(key, params, y, sample_shape=(3000,))
    assert compiled._cache_size() == size  # 12 chunks of 256: the same program
    guide.sample_batch_size = 4096
    wide = guide.sample_posterior(key, params, y, sample_shape=(3000,))  # 3072: one more
    np.testing.assert_allclose(wide["mu"][:600], first["mu"], rtol=1e-6)
    assert compiled._cache_size() == size + 1
    for n in (10, 300, 1000):  # 256, 3072, 3072 again: nothing new
        draws = guide.sample_posterior(key, params, y, sample_shape=(n,))
        np.testing.assert_allclose(draws["mu"], wide["mu"][:n], rtol=1e-6)
    assert compiled._cache_size() == size + 1

    # Only up to 16 times wider: a fresh guide's 3072 is not reused for 10 draws (64)
    guide = UHAGuide(_tiny_model, K=2, warm_start_steps=0, sample_batch_size=4096)
    svi = SVI(_tiny_model, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), y))
    guide.sample_posterior(key, params, y, sample_shape=(3000,))
    (compiled,) = guide._jitted_draws.values()
    assert compiled._cache_size() == 1
    guide.sample_posterior(key, params, y, sample_shape=(10,))  # 64: 3072 is 48 times
    assert compiled._cache_size() == 2
    for n in (50, 64, 200, 1000):  # 64, 64, 3072 (12 times 256) and 3072: nothing new
        draws = guide.sample_posterior(key, params, y, sample_shape=(n,))
        np.testing.assert_allclose(draws["mu"], wide["mu"][:n], rtol=1e-6)
    assert compiled._cache_size() == 2
    # several chunks at a cap of 6000: 3072 (at least half the cap) again, not 6000
    guide.sample_batch_size = 6000
    many = guide.sample_posterior(key, params, y, sample_shape=(10_000,))
    assert compiled._cache_size() == 2
    np.testing.assert_allclose(many["mu"][:3000], wide["mu"], rtol=1e-6)


def test_log_z_reuses_the_compiled_draws_and_matches_the_chain_runner():
    """log_z of a UHAGuide runs the guide's compiled draws (no new program for a second
    call or another num_draws at full width) and gives the very estimate of the
    one-off chain runner it used before, at any batch_size."""
    from numpyro_uha.evaluation import log_z, log_z_from_weights
    from numpyro_uha.evaluation.estimators import _forward

    y = jnp.linspace(-1.0, 2.0, 10)
    guide = UHAGuide(_tiny_model, K=3, warm_start_steps=0, sample_batch_size=256)
    svi = SVI(_tiny_model, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), y))
    key = jax.random.PRNGKey(2)
    first = log_z(guide, key, params, y, num_draws=600)
    (compiled,) = guide._jitted_draws.values()
    size = compiled._cache_size()
    again = log_z(guide, key, params, y, num_draws=600)
    log_z(guide, key, params, y, num_draws=900)
    assert compiled._cache_size() == size
    assert again.elbo == first.elbo and again.iw == first.iw
    runner_log_w, _ = _forward(
        key, guide.get_logdensity_fn(params, y), guide.get_annealing_params(params), 600,
        False, guide.num_leapfrog_steps, 100, guide.integrator,
    )
    runner = log_z_from_weights(runner_log_w, guide.K)
    for estimate in (first, log_z(guide, key, params, y, num_draws=600, batch_size=100)):
        np.testing.assert_allclose(runner.elbo, estimate.elbo, rtol=1e-6)
        np.testing.assert_allclose(runner.iw, estimate.iw, rtol=1e-6)
        np.testing.assert_allclose(runner.elbo_se, estimate.elbo_se, rtol=1e-5)


def test_chunk_keys_from_an_offset_are_the_split_keys():
    """A chunk's keys, made in the chain's program from the raw key and the chunk's
    offset, are those of jax.random.split at any offset; where fold_in is not the split
    (JAX's older threefry), the guide does not use them."""
    from numpyro_uha.guide import _fold_in_splits, _keys_from

    key = jax.random.PRNGKey(42)
    split = np.asarray(jax.random.split(key, 2000))
    for offset, num in ((0, 64), (1008, 992), (777, 5)):
        np.testing.assert_array_equal(np.asarray(_keys_from(key, offset, num)),
                                      split[offset:offset + num])
    assert _fold_in_splits(key)
    previous = jax.config.jax_threefry_partitionable
    try:
        jax.config.update("jax_threefry_partitionable", not previous)
        assert _fold_in_splits(key) == bool(np.array_equal(
            np.asarray(jax.random.split(key, 7))[3:], np.asarray(_keys_from(key, 3, 4))))
        assert not _fold_in_splits(key)
    finally:
        jax.config.update("jax_threefry_partitionable", previous)
