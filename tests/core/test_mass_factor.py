"""``AnnealingParams.mass_factor``: the chain moves in u = P⁻¹ z (a dense mass matrix).

The statistical checks (E[w] = Z with a mass factor, forward and Metropolis-corrected)
are cases of ``test_annealing.test_weight_is_unbiased_for_z``. Here: the chain is exactly
the one run by hand on the pulled-back target and Gaussians (so the mass factor's
transposes, its lower triangle and the bridges' mapping are what they should be), the
identity factor changes nothing, and the bad shapes are refused.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.linalg import solve_triangular

from numpyro_uha.core import (
    annealed_sample,
    annealed_sample_rows,
    make_params,
    reverse_annealed_sample,
)
from tests.core.test_annealing import DIM, gaussian_target, random_params

INTEGRATORS = ["velocity_verlet", "position_verlet"]


def _by_hand(params):
    """The same chain written without a mass factor: target u ↦ log p̄(P u), q and the
    bridge's mean slope mapped by P⁻¹ (P = the factor's lower triangle), the rest as given
    (they are u's already, the bridge's log-scale slope too: it scales u's rows)."""
    factor = np.tril(np.asarray(params.mass_factor))
    solve = lambda b: solve_triangular(factor, b, lower=True)  # noqa: E731
    scale = params.scale if params.scale.ndim == 2 else jnp.diag(params.scale)
    u_params = params._replace(
        loc=solve(params.loc),
        scale=solve(jnp.tril(scale)),
        bridge_loc_slope=solve(params.bridge_loc_slope),
        mass_factor=None,
    )
    log_det = float(np.sum(np.log(np.abs(np.diag(factor)))))
    return factor, u_params, (lambda u: gaussian_target(factor @ u)), log_det


@pytest.mark.parametrize("integrator", INTEGRATORS)
@pytest.mark.parametrize("corrected", [False, True], ids=["uha", "hais"])
@pytest.mark.parametrize("full_rank", [False, True], ids=["diag-q", "full-rank-q"])
def test_the_chain_is_the_one_in_u_by_hand(integrator, corrected, full_rank):
    params = random_params(5, full_rank=full_rank, mass=True, drift=True, force_limit=0.5)
    factor, u_params, u_target, log_det = _by_hand(params)
    keys = jax.random.split(jax.random.PRNGKey(3), 16)
    options = dict(integrator=integrator, corrected=corrected)
    z, log_w, info = jax.vmap(lambda k: annealed_sample(k, gaussian_target, params, **options))(keys)
    u, log_w_u, info_u = jax.vmap(lambda k: annealed_sample(k, u_target, u_params, **options))(keys)
    np.testing.assert_allclose(z, u @ factor.T, rtol=1e-4, atol=1e-4)
    # q's density in u is q's in z times |P|; the target is not rescaled
    np.testing.assert_allclose(log_w, log_w_u + log_det, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(info.initial_position, info_u.initial_position @ factor.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(info.log_q_initial, info_u.log_q_initial - log_det, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(info.target_logdensity, info_u.target_logdensity, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(info.log_accept_ratio, info_u.log_accept_ratio, rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(info.accepted, info_u.accepted)


@pytest.mark.parametrize("integrator", INTEGRATORS)
def test_the_reverse_chain_is_the_one_in_u_by_hand(integrator):
    params = random_params(6, full_rank=True, mass=True, drift=True)
    factor, u_params, u_target, log_det = _by_hand(params)
    position = jnp.array([0.2, -0.4, 1.1, 0.3])
    key = jax.random.PRNGKey(4)
    z1, log_w, info = reverse_annealed_sample(
        key, gaussian_target, params, position, integrator=integrator
    )
    u1, log_w_u, _ = reverse_annealed_sample(
        key, u_target, u_params, solve_triangular(factor, position, lower=True),
        integrator=integrator,
    )
    np.testing.assert_allclose(z1, factor @ u1, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(info.initial_position, z1)
    np.testing.assert_allclose(log_w, log_w_u + log_det, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("integrator", INTEGRATORS)
def test_an_identity_factor_changes_nothing(integrator):
    params = random_params(8, full_rank=True, drift=True, force_limit=0.5)
    key = jax.random.PRNGKey(5)
    plain = annealed_sample(key, gaussian_target, params, integrator=integrator)
    eye = annealed_sample(
        key, gaussian_target, params._replace(mass_factor=jnp.eye(DIM)), integrator=integrator
    )
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(eye)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_dense_mass_moves_along_a_correlated_target_where_a_diagonal_one_cannot():
    """On a Gaussian target with correlation 0.999, q = the target and the same step
    size, the chain with P = the target's Cholesky factor keeps the bound at log Z (its
    leapfrog is stable: ε · 1 < 2), the diagonal chain of unit mass breaks down (ε ·
    sqrt(λ_max) ≫ 2 in the narrow direction)."""
    cov = np.array([[1.0, 0.999], [0.999, 1.0]])
    chol = np.linalg.cholesky(cov)
    prec = np.linalg.inv(cov)

    def target(z):
        return -0.5 * z @ prec @ z  # log Z = log(2π) + ½ log det cov

    log_z = float(np.log(2 * np.pi) + 0.5 * np.linalg.slogdet(cov)[1])
    base = make_params(
        jnp.zeros(2), chol, num_transitions=8, step_size=0.5, damping=0.5,
        momentum_scale=jnp.ones(2),
    )
    keys = jax.random.split(jax.random.PRNGKey(0), 400)
    dense = jax.vmap(lambda k: annealed_sample(k, target, base._replace(mass_factor=chol))[1])(keys)
    diagonal = jax.vmap(lambda k: annealed_sample(k, target, base)[1])(keys)
    dense, diagonal = np.asarray(dense, np.float64), np.asarray(diagonal, np.float64)
    # (the dense chain's mean is 0.005 below log Z, its weights' sd 0.09: 400 draws)
    assert abs(dense.mean() - log_z) < 4 * dense.std() / np.sqrt(dense.size) + 0.01
    assert np.median(diagonal) < log_z - 100.0  # NaN (diverged) sorts last


def test_bad_mass_factors_are_refused_by_name():
    with pytest.raises(ValueError, match="mass_factor must be a lower-triangular matrix of shape"):
        make_params(jnp.zeros(3), jnp.ones(3), num_transitions=2, mass_factor=jnp.ones(3))
    params = make_params(
        jnp.zeros((2, 3)), jnp.ones((2, 3)), num_transitions=2,
    )._replace(mass_factor=jnp.eye(3))
    with pytest.raises(ValueError, match="mass_factor is for single chains"):
        annealed_sample_rows(
            jax.random.split(jax.random.PRNGKey(0), 2), lambda z: -0.5 * jnp.sum(z**2, -1),
            params,
        )


@pytest.mark.parametrize("integrator", INTEGRATORS)
def test_a_diagonal_factor_is_the_chain_in_z_with_the_momentum_scaled(integrator):
    """P = diag(p): u = z / p, so the chain with momentum scales m and force limit F (u's)
    is the chain in z with momentum scales m / p and force limit F / p: a diagonal mass
    factor only rescales the coordinates."""
    params = random_params(9, full_rank=True, drift=True, force_limit=0.5)
    p = jnp.array([0.5, 2.0, 1.3, 0.8])
    in_u = params._replace(
        mass_factor=jnp.diag(p), force_limit=params.force_limit * p,
        # the bridge's log-scale slopes scale the rows of P⁻¹ L in u, those of L in z:
        # the same matrix for a diagonal P
    )
    in_z = params._replace(momentum_scale=params.momentum_scale / p)
    key = jax.random.PRNGKey(6)
    z_u, log_w_u, _ = annealed_sample(key, gaussian_target, in_u, integrator=integrator)
    z_z, log_w_z, _ = annealed_sample(key, gaussian_target, in_z, integrator=integrator)
    np.testing.assert_allclose(z_u, z_z, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(log_w_u, log_w_z, rtol=1e-4, atol=1e-4)
