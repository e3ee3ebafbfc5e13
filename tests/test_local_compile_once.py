"""UHALocalGuide's draws and log Z compile once per chunk width (issue 16, item 2).

A second call with the same shapes compiles nothing (NumPyro's own eager subsampling,
which compiles a new program at every call, is not run to read the plate's sizes), and
another ``sample_shape`` or ``num_samples`` runs the chain program of its chunk width:
draw i comes from key i of the split, whatever the count, as in one program under jit.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import UHALocalGuide, local
from test_compile_once import CountCompiles
from test_local import N, X, conjugate_model, perturbed_params

B = 8
ARGS = (X, N, B)
IDX = jnp.arange(3, 3 + B)
KEY = jax.random.PRNGKey(3)


def _guide_and_params():
    guide = UHALocalGuide(conjugate_model, K=2)
    return guide, perturbed_params(conjugate_model, guide, 0, *ARGS)


def _draw(guide, params, shape):
    return guide.sample_posterior(KEY, params, *ARGS, sample_shape=shape, subsample_idx=IDX)


def test_a_repeated_call_compiles_nothing_and_a_new_count_no_new_chain():
    guide, params = _guide_and_params()
    first = _draw(guide, params, (100,))
    with CountCompiles() as again:
        second = _draw(guide, params, (100,))
    assert again.count == 0
    np.testing.assert_array_equal(second["z"], first["z"])

    # 120 draws: the same chunk width (128), so the same chain program
    programs = set(guide._jitted)
    with CountCompiles() as new_count:
        more = _draw(guide, params, (120,))
    assert set(guide._jitted) == programs
    assert new_count.count <= 2  # a key split and a join, not the chain
    np.testing.assert_array_equal(more["z"][:100], first["z"])

    # log_z: a repeated call compiles nothing either
    guide.log_z(KEY, params, *ARGS, num_samples=50, subsample_idx=IDX, global_values={"mu": 0.3})
    with CountCompiles() as log_z_again:
        guide.log_z(KEY, params, *ARGS, num_samples=50, subsample_idx=IDX,
                    global_values={"mu": 0.3})
    assert log_z_again.count == 0


def test_draw_i_is_key_is_draw_whatever_the_width_and_under_jit(monkeypatch):
    guide, params = _guide_and_params()
    few = _draw(guide, params, (100,))  # one chunk of 128
    many = _draw(guide, params, (4, 75))  # one chunk of 384, reshaped
    for name in ("z", "mu"):
        np.testing.assert_allclose(
            np.reshape(many[name], (300,) + many[name].shape[2:])[:100], few[name],
            rtol=1e-5, atol=1e-6,
        )
    traced = jax.jit(lambda key, p: guide.sample_posterior(
        key, p, *ARGS, sample_shape=(100,), subsample_idx=IDX))(KEY, params)
    for name in ("z", "mu"):
        np.testing.assert_allclose(traced[name], few[name], rtol=1e-5, atol=1e-6)

    # at most 64 draws of the 8 data points at once: two chunks, the second padded
    monkeypatch.setattr(local, "DRAW_ROWS", 64 * B)
    chunked = _draw(guide, params, (100,))
    for name in ("z", "mu"):
        np.testing.assert_allclose(chunked[name], few[name], rtol=1e-5, atol=1e-6)


def _encoder_fn(x):
    """A fixed (parameter-free) encoder: q_i centred at its data point."""
    x = jnp.reshape(x, (-1, 1))
    return x, jnp.full_like(x, 0.5)


def _positive_local(y):
    with numpyro.plate("data", y.shape[0]):
        rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
        numpyro.sample("y", dist.Poisson(rate), obs=y)


@pytest.mark.parametrize(
    "model, arrays, static, options",
    [
        (conjugate_model, (X,), (N, B), {}),  # a global and a minibatch
        pytest.param(
            conjugate_model, (X,), (N, B), {"per_data_point": True, "precondition": True},
            marks=pytest.mark.slow,
        ),
        (conjugate_model, (X,), (N, B), {"encoder": _encoder_fn}),
        (_positive_local, (jnp.arange(6.0),), (), {}),  # no global, a constrained local
        # sites found on traced data (also tests/test_decenter.py, under jit)
        pytest.param(conjugate_model, (X,), (N, B), {"decenter": True}, marks=pytest.mark.slow),
    ],
    ids=["minibatch", "per-data-point", "encoder", "no-global", "decentered"],
)
def test_svi_init_under_jit_is_the_eager_init(model, arrays, static, options):
    """``jax.jit(svi.init)``, as NumPyro's users write it (sizes closed over): the
    guide's setup runs on traced data; the state is the eager one's and the jitted
    training step runs from it."""
    guide = UHALocalGuide(model, K=2, **options)
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    key = jax.random.PRNGKey(0)
    traced = jax.jit(lambda k, *a: svi.init(k, *a, *static))(key, *arrays)
    eager_guide = UHALocalGuide(model, K=2, **options)
    eager_svi = SVI(model, eager_guide, optax.adam(1e-2), Trace_ELBO())
    eager = eager_svi.init(key, *arrays, *static)
    got, want = svi.get_params(traced), eager_svi.get_params(eager)
    assert guide.decentered_sites == eager_guide.decentered_sites
    assert guide.decentered_sites == (("z",) if options.get("decenter") else ())
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6, err_msg=name)
    _, loss = jax.jit(lambda st, *a: svi.update(st, *a, *static))(traced, *arrays)
    np.testing.assert_allclose(loss, eager_svi.evaluate(eager, *arrays, *static), rtol=1e-5)


def test_fewer_draws_reuse_a_wider_chain_already_compiled():
    """Fewer draws than a width already compiled (up to 16 times fewer) run in that
    width's program: 20 draws after 300 (width 384) compile no chain of 64."""
    guide, params = _guide_and_params()
    many = _draw(guide, params, (300,))
    programs = set(guide._jitted)
    few = _draw(guide, params, (20,))
    assert set(guide._jitted) == programs
    np.testing.assert_array_equal(few["z"], many["z"][:20])
