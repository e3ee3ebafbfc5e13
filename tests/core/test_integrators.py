"""The leapfrog map must be volume preserving and self-inverse under a momentum flip,
the two properties Theorem 1 needs for the UHA weight to be exact."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_uha.core import IntegratorState, leapfrog

DIM = 3
MOMENTUM_SCALE = jnp.array([0.7, 1.3, 2.0])
BETA = 0.4


def target(z):
    # A non-Gaussian (quartic) target so that the leapfrog map is genuinely nonlinear.
    return -0.5 * jnp.sum(z**2) - 0.1 * jnp.sum(z**4) + 0.3 * z[0] * z[1]


def bridge_grad(z, grad_target):
    return (1 - BETA) * (-(z - 0.5) / 1.5**2) + BETA * grad_target


def flow(z_and_rho, num_steps):
    z, rho = z_and_rho[:DIM], z_and_rho[DIM:]
    value, grad = jax.value_and_grad(target)(z)
    out = leapfrog(
        IntegratorState(z, rho, value, grad), 0.3, MOMENTUM_SCALE,
        jax.value_and_grad(target), bridge_grad, num_steps,
    )
    return jnp.concatenate([out.position, out.momentum])


POINTS = [np.array([0.3, -1.2, 0.8, 0.5, 0.1, -2.0]), np.array([1.5, 0.2, -0.4, -1.0, 1.3, 0.4])]


@pytest.mark.parametrize("num_steps", [1, 4])
@pytest.mark.parametrize("point", POINTS, ids=["a", "b"])
def test_leapfrog_has_unit_jacobian(point, num_steps):
    jacobian = jax.jacfwd(lambda x: flow(x, num_steps))(jnp.asarray(point))
    assert abs(float(jnp.linalg.det(jacobian)) - 1.0) < 1e-4


@pytest.mark.parametrize("num_steps", [1, 4])
@pytest.mark.parametrize("point", POINTS, ids=["a", "b"])
def test_leapfrog_is_reversible_under_momentum_flip(point, num_steps):
    start = jnp.asarray(point, dtype=jnp.float32)
    forward = flow(start, num_steps)
    flipped = forward.at[DIM:].multiply(-1.0)
    back = flow(flipped, num_steps)
    np.testing.assert_allclose(back[:DIM], start[:DIM], atol=1e-5)
    np.testing.assert_allclose(-back[DIM:], start[DIM:], atol=1e-5)
    # ... and it moved somewhere, so the check is not vacuous.
    assert float(jnp.max(jnp.abs(forward - start))) > 0.05


def test_cached_gradient_is_the_gradient_at_the_new_position():
    start = jnp.asarray(POINTS[0])
    z, rho = start[:DIM], start[DIM:]
    value, grad = jax.value_and_grad(target)(z)
    out = leapfrog(
        IntegratorState(z, rho, value, grad), 0.3, MOMENTUM_SCALE,
        jax.value_and_grad(target), bridge_grad, 2,
    )
    np.testing.assert_allclose(out.target_logdensity, target(out.position), rtol=1e-6)
    np.testing.assert_allclose(out.target_grad, jax.grad(target)(out.position), rtol=1e-5)
