"""The rows samplers: B chains on a target that factorizes over rows, evaluated jointly.

Row i of ``annealed_sample_rows`` must be *exactly* ``annealed_sample`` with key i on row
i's target and row i's parameters (same random numbers, same arithmetic), for shared and
per-row parameters, both integrators, corrected or not, and the reverse sampler too.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_uha.core import (

    annealed_sample,
    annealed_sample_rows,
    hais_sample_rows,
    make_params,
    reverse_annealed_sample,
    reverse_annealed_sample_rows,
    uha_sample_rows,
)

from tests._compat import enable_x64

ROWS, DIM, K = 5, 3, 6
RNG = np.random.default_rng(0)
# Row i's target: a skewed, correlated, non-Gaussian density with its own data x_i.
X = jnp.asarray(RNG.normal(size=(ROWS, DIM)))
W = jnp.asarray(RNG.normal(size=(DIM, DIM)) * 0.5)


def row_logdensity(z, x):
    """log p̄_i(z) for one row (z, x of shape (d,))."""
    logits = W @ z + x
    return jnp.sum(-0.5 * z**2) + jnp.sum(x * logits - jnp.logaddexp(0.0, logits)) + jnp.sum(
        jnp.log1p(0.1 * jnp.tanh(z[0] * z[1]))
    )


def rows_logdensity(Z):
    """All rows at once, written for a batch (as a NumPyro plate evaluates them)."""
    logits = Z @ W.T + X
    return (
        jnp.sum(-0.5 * Z**2, axis=-1)
        + jnp.sum(X * logits - jnp.logaddexp(0.0, logits), axis=-1)
        + jnp.log1p(0.1 * jnp.tanh(Z[:, 0] * Z[:, 1]))
    )


def rows_params(per_row: bool):
    rng = np.random.default_rng(1)
    loc = rng.normal(size=(ROWS, DIM)) * 0.3
    scale = rng.uniform(0.5, 1.5, (ROWS, DIM))
    shape = (ROWS,) if per_row else ()
    betas = np.sort(rng.uniform(size=shape + (K,)), axis=-1)
    return make_params(
        loc,
        scale,
        betas=betas,
        step_size=rng.uniform(0.8, 2.0, shape + (K,)),  # large enough that some are rejected
        damping=rng.uniform(0.3, 0.95, shape),
        momentum_scale=rng.uniform(0.5, 2.0, shape + (DIM,)),
        bridge_loc_slope=rng.normal(size=shape + (DIM,)) * 0.3,
        bridge_log_scale_slope=rng.normal(size=shape + (DIM,)) * 0.3,
        drift_scale=jnp.asarray(rng.uniform(0.5, 2.0, shape + (DIM,))),
        force_limit=jnp.asarray(rng.uniform(2.0, 5.0, shape + (DIM,))),
    )


def row_of(params, i, per_row):
    """Row i's parameters, in the shapes ``annealed_sample`` takes."""
    take = lambda x: x[i]  # noqa: E731
    fields = params._asdict()
    out = {"loc": take(params.loc), "scale": take(params.scale)}
    for name, value in fields.items():
        if name in out:
            continue
        out[name] = take(value) if per_row and value is not None else value
    return type(params)(**out)


KEYS = jax.random.split(jax.random.PRNGKey(3), ROWS)


# Per-row parameters in every configuration; shared ones (the guide's default) once by
# default, the other three with `pytest -m slow` (each case compiles in float64).
_SHARED_SLOW = pytest.mark.slow
CASES = [
    (True, "velocity_verlet", False),
    (True, "velocity_verlet", True),
    pytest.param(True, "position_verlet", False, marks=pytest.mark.slow),
    pytest.param(True, "position_verlet", True, marks=pytest.mark.slow),
    (False, "position_verlet", False),
    pytest.param(False, "velocity_verlet", False, marks=_SHARED_SLOW),
    pytest.param(False, "velocity_verlet", True, marks=_SHARED_SLOW),
    pytest.param(False, "position_verlet", True, marks=_SHARED_SLOW),
]


@pytest.mark.parametrize("per_row, integrator, corrected", CASES)
def test_each_row_is_the_single_chain_with_its_key(per_row, integrator, corrected):
    # In float64: the corrected chains with large steps amplify float32 rounding (the joint
    # and the single evaluation round differently), which would hide a real difference.
    with enable_x64(True):
        _check_rows_equal_single(per_row, integrator, corrected)


def _check_rows_equal_single(per_row, integrator, corrected):
    params = rows_params(per_row)
    z, log_w, info = jax.jit(
        lambda: annealed_sample_rows(
            KEYS, rows_logdensity, params, corrected=corrected, integrator=integrator,
            num_leapfrog_steps=2,
        )
    )()
    assert z.shape == (ROWS, DIM) and log_w.shape == (ROWS,)
    assert info.log_weight_increments.shape == (ROWS, K)
    for i in range(ROWS):
        zi, wi, info_i = annealed_sample(
            KEYS[i], lambda v: row_logdensity(v, X[i]), row_of(params, i, per_row),
            corrected=corrected, integrator=integrator, num_leapfrog_steps=2,
        )
        assert z.dtype == jnp.float64
        np.testing.assert_allclose(z[i], zi, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(log_w[i], wi, rtol=1e-10, atol=1e-10)
        np.testing.assert_array_equal(info.accepted[i], info_i.accepted)
        np.testing.assert_allclose(
            info.momentum_log_ratio[i], info_i.momentum_log_ratio, rtol=1e-10, atol=1e-10
        )
    if corrected:  # the test covers both branches of the Metropolis step
        assert 0 < float(jnp.mean(info.accepted)) < 1


@pytest.mark.parametrize("per_row", [pytest.param(False, marks=pytest.mark.slow), True])
def test_reverse_rows_are_the_single_reverse_chains(per_row):
    with enable_x64(True):
        _check_reverse_rows(per_row)


def _check_reverse_rows(per_row):
    params = rows_params(per_row)
    start = jnp.asarray(np.random.default_rng(4).normal(size=(ROWS, DIM)))
    z, log_w, _ = reverse_annealed_sample_rows(
        KEYS, rows_logdensity, params, start, corrected=True
    )
    for i in range(ROWS):
        zi, wi, _ = reverse_annealed_sample(
            KEYS[i], lambda v: row_logdensity(v, X[i]), row_of(params, i, per_row), start[i],
            corrected=True,
        )
        np.testing.assert_allclose(z[i], zi, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(log_w[i], wi, rtol=1e-10, atol=1e-10)


def test_rows_gradients_are_the_single_chains_gradients():
    """Reparameterization gradients of Σ_i log w_i w.r.t. shared parameters equal the sum
    of the single chains' gradients (the joint evaluation leaks nothing across rows)."""
    params = rows_params(per_row=False)

    def rows_total(step_sizes, loc):
        p = params._replace(step_sizes=step_sizes, loc=loc)
        return jnp.sum(uha_sample_rows(KEYS, rows_logdensity, p)[1])

    def singles_total(step_sizes, loc):
        p = params._replace(step_sizes=step_sizes, loc=loc)

        def single(key, x, loc_i, scale_i):
            row = p._replace(loc=loc_i, scale=scale_i)
            return annealed_sample(key, lambda v: row_logdensity(v, x), row)[1]

        # each row's own single-chain sampler, vectorized over rows by vmap
        return jnp.sum(jax.vmap(single)(KEYS, X, p.loc, p.scale))

    g_rows = jax.grad(rows_total, argnums=(0, 1))(params.step_sizes, params.loc)
    g_single = jax.grad(singles_total, argnums=(0, 1))(params.step_sizes, params.loc)
    for a, b in zip(g_rows, g_single):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_hais_rows_stops_gradients():
    params = rows_params(per_row=False)
    g = jax.grad(lambda s: jnp.sum(hais_sample_rows(KEYS, rows_logdensity, params._replace(step_sizes=s))[1]))(
        params.step_sizes
    )
    assert np.all(np.asarray(g) == 0)


def test_rows_errors_name_the_problem():
    params = rows_params(per_row=False)
    with pytest.raises(ValueError, match=r"mean-field q per row"):
        annealed_sample_rows(KEYS, rows_logdensity, params._replace(scale=params.scale[0]))
    with pytest.raises(ValueError, match=r"4 keys for 5 rows"):
        annealed_sample_rows(KEYS[:4], rows_logdensity, params)
