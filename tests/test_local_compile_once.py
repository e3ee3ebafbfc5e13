"""UHALocalGuide's draws and log Z compile once per chunk width (issue 16, item 2).

A second call with the same shapes compiles nothing (NumPyro's own eager subsampling,
which compiles a new program at every call, is not run to read the plate's sizes), and
another ``sample_shape`` or ``num_samples`` runs the chain program of its chunk width:
draw i comes from key i of the split, whatever the count, as in one program under jit.
"""

import jax
import jax.numpy as jnp
import numpy as np

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
