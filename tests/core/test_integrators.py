"""The leapfrog map, in both orders and with any drift scale, must be volume preserving
and self-inverse under a momentum flip, the two properties Theorem 1 needs for the UHA
weight to be exact."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_uha.core import IntegratorState, drift_kick_drift, leapfrog

DIM = 3
MOMENTUM_SCALE = jnp.array([0.7, 1.3, 2.0])
BETA = 0.4


def target(z):
    # A non-Gaussian (quartic) target so that the leapfrog map is genuinely nonlinear.
    return -0.5 * jnp.sum(z**2) - 0.1 * jnp.sum(z**4) + 0.3 * z[0] * z[1]


def bridge_grad(z, grad_target):
    return (1 - BETA) * (-(z - 0.5) / 1.5**2) + BETA * grad_target


DRIFT_SCALE = jnp.array([1.6, 0.5, 1.1])


def flow(z_and_rho, num_steps, order="velocity", drift_scale=None):
    z, rho = z_and_rho[:DIM], z_and_rho[DIM:]
    if order == "position":
        z, rho = drift_kick_drift(
            z, rho, 0.3, MOMENTUM_SCALE, jax.grad(target), bridge_grad, num_steps, drift_scale
        )
        return jnp.concatenate([z, rho])
    value, grad = jax.value_and_grad(target)(z)
    out = leapfrog(
        IntegratorState(z, rho, value, grad), 0.3, MOMENTUM_SCALE,
        jax.value_and_grad(target), bridge_grad, num_steps, drift_scale,
    )
    return jnp.concatenate([out.position, out.momentum])


VARIANTS = pytest.mark.parametrize(
    "order,drift_scale",
    [("velocity", None), ("velocity", DRIFT_SCALE), ("position", None), ("position", DRIFT_SCALE)],
    ids=["velocity", "velocity-drift", "position", "position-drift"],
)


POINTS = [np.array([0.3, -1.2, 0.8, 0.5, 0.1, -2.0]), np.array([1.5, 0.2, -0.4, -1.0, 1.3, 0.4])]


@VARIANTS
@pytest.mark.parametrize("num_steps", [1, 4])
@pytest.mark.parametrize("point", POINTS, ids=["a", "b"])
def test_leapfrog_has_unit_jacobian(point, num_steps, order, drift_scale):
    jacobian = jax.jacfwd(lambda x: flow(x, num_steps, order, drift_scale))(jnp.asarray(point))
    assert abs(float(jnp.linalg.det(jacobian)) - 1.0) < 1e-4


@VARIANTS
@pytest.mark.parametrize("num_steps", [1, 4])
@pytest.mark.parametrize("point", POINTS, ids=["a", "b"])
def test_leapfrog_is_reversible_under_momentum_flip(point, num_steps, order, drift_scale):
    start = jnp.asarray(point, dtype=jnp.float32)
    forward = flow(start, num_steps, order, drift_scale)
    flipped = forward.at[DIM:].multiply(-1.0)
    back = flow(flipped, num_steps, order, drift_scale)
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


def test_drift_scale_is_a_per_coordinate_step():
    """With a constant gradient g, one step moves ρ by exactly ε δ g and z by
    ε δ Σ⁻¹ (ρ + ε δ g / 2): δ scales the kick as well as the drift, in both orders."""
    z, rho = jnp.zeros(DIM), jnp.array([1.0, -2.0, 0.5])
    g = jnp.array([0.4, 1.0, -0.7])
    constant = lambda x, grad_target: g
    step = 0.3 * DRIFT_SCALE
    for order in ("velocity", "position"):
        if order == "position":
            z_new, rho_new = drift_kick_drift(
                z, rho, 0.3, MOMENTUM_SCALE, jax.grad(target), constant, 1, DRIFT_SCALE
            )
        else:
            out = leapfrog(
                IntegratorState(z, rho, 0.0, jnp.zeros(DIM)), 0.3, MOMENTUM_SCALE,
                jax.value_and_grad(target), constant, 1, DRIFT_SCALE,
            )
            z_new, rho_new = out.position, out.momentum
        np.testing.assert_allclose(rho_new, rho + step * g, rtol=1e-6)
        np.testing.assert_allclose(
            z_new, step * (rho + 0.5 * step * g) / MOMENTUM_SCALE**2, rtol=1e-6
        )


@pytest.mark.parametrize("order", ["velocity", "position"])
def test_drift_scale_is_a_time_change_per_coordinate(order):
    """On a separable target, coordinate i with (ε, δ_i) follows exactly the path it
    follows with (ε δ_i, 1): a per-coordinate step, not a change of mass."""
    separable = lambda z: -0.5 * jnp.sum(z**2) - 0.1 * jnp.sum(z**4)
    grad = lambda z, grad_target: grad_target
    start = jnp.asarray(POINTS[1])

    def run(step_size, drift_scale):
        z, rho = start[:DIM], start[DIM:]
        if order == "position":
            return drift_kick_drift(
                z, rho, step_size, MOMENTUM_SCALE, jax.grad(separable), grad, 3, drift_scale
            )
        value, g = jax.value_and_grad(separable)(z)
        out = leapfrog(
            IntegratorState(z, rho, value, g), step_size, MOMENTUM_SCALE,
            jax.value_and_grad(separable), grad, 3, drift_scale,
        )
        return out.position, out.momentum

    z_scaled, rho_scaled = run(0.2, DRIFT_SCALE)
    for i in range(DIM):
        z_i, rho_i = run(0.2 * float(DRIFT_SCALE[i]), None)
        np.testing.assert_allclose(z_scaled[i], z_i[i], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rho_scaled[i], rho_i[i], rtol=1e-5, atol=1e-6)
