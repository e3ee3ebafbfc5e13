"""Parameters that the optimizer sees in the posterior's own units.

An optimizer such as Adam moves every unconstrained parameter by about its learning rate
per step. For q's mean that is a step of 1e-2 in the model's coordinates, which is 50
posterior standard deviations for a coefficient known to ±2e-4 and a hundredth of one for
a coefficient with sd 100: the same learning rate is far too large for the first and far
too small for the second. So ``UHAGuide`` registers q's mean, scale and the bridge's mean
slope with constraints whose bijection standardizes them by the warm start's q,
N(m₀, s₀²):

* ``loc = m₀ + s₀ ⊙ u``;
* ``scale = s₀ ⊙ exp(u)`` (diagonal), or ``scale_tril = diag(s₀) · L(u)`` with ``L`` the
  ``scaled_unit_lower_cholesky`` bijection (full rank);
* ``bridge_loc_slope = s₀ ⊙ u``.

The values in ``params`` are unchanged (model units); only the optimizer's coordinates
differ, so every step moves them by about the learning rate *in posterior standard
deviations*, on every coordinate.
"""

from __future__ import annotations

import jax.numpy as jnp
from numpyro.distributions import constraints
from numpyro.distributions.transforms import (
    AffineTransform,
    ComposeTransform,
    ExpTransform,
    ScaledUnitLowerCholeskyTransform,
    Transform,
    biject_to,
)

__all__ = ["StandardizedReal", "StandardizedPositive", "StandardizedCholesky"]


class _Standardized(constraints.Constraint):
    """Base: a constraint carrying the reference location and scale (vectors)."""

    event_dim = 1

    def __init__(self, loc, scale):
        self.loc = jnp.asarray(loc)
        self.scale = jnp.asarray(scale)

    def tree_flatten(self):
        return (self.loc, self.scale), (("loc", "scale"), dict())

    def eq(self, other, static=False):
        return self is other


class StandardizedReal(_Standardized):
    """Real vectors; bijection ``u ↦ loc + scale ⊙ u``."""

    def __call__(self, x):
        return jnp.all(jnp.isfinite(x), axis=-1)

    def feasible_like(self, prototype):
        return jnp.broadcast_to(self.loc, jnp.shape(prototype))


class StandardizedPositive(_Standardized):
    """Positive vectors; bijection ``u ↦ scale ⊙ exp(u)`` (``loc`` unused)."""

    def __call__(self, x):
        return jnp.all((x > 0) & jnp.isfinite(x), axis=-1)

    def feasible_like(self, prototype):
        return jnp.broadcast_to(self.scale, jnp.shape(prototype))


class StandardizedCholesky(_Standardized):
    """Lower Cholesky factors; bijection ``u ↦ diag(scale) · L(u)`` (``loc`` unused)."""

    event_dim = 2

    def __call__(self, x):
        return constraints.lower_cholesky(x)

    def feasible_like(self, prototype):
        return jnp.broadcast_to(jnp.diag(self.scale), jnp.shape(prototype))


class _RowScaleTransform(Transform):
    """``L ↦ diag(scale) · L`` on matrices (keeps a lower Cholesky factor one)."""

    domain = constraints.lower_cholesky
    codomain = constraints.lower_cholesky

    def __init__(self, scale):
        self.scale = scale

    def __call__(self, x):
        return self.scale[:, None] * x

    def _inverse(self, y):
        return y / self.scale[:, None]

    def log_abs_det_jacobian(self, x, y, intermediates=None):
        n = jnp.shape(x)[-1]
        return jnp.sum(jnp.log(jnp.abs(self.scale)) * jnp.arange(n, 0, -1))

    def tree_flatten(self):
        return (self.scale,), (("scale",), dict())


@biject_to.register(StandardizedReal)
def _real(constraint):
    return AffineTransform(constraint.loc, constraint.scale, domain=constraints.real_vector)


@biject_to.register(StandardizedPositive)
def _positive(constraint):
    return ComposeTransform([
        ExpTransform(),
        AffineTransform(0.0, constraint.scale, domain=constraints.positive),
    ])


@biject_to.register(StandardizedCholesky)
def _cholesky(constraint):
    return ComposeTransform([
        ScaledUnitLowerCholeskyTransform(), _RowScaleTransform(constraint.scale),
    ])
