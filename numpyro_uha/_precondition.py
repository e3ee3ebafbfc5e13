"""Parameters that the optimizer sees in the posterior's own units.

An optimizer such as Adam moves every unconstrained parameter by about its learning rate
per step. For q's mean that is a step of 1e-2 in the model's coordinates, which is 50
posterior standard deviations for a coefficient known to ±2e-4 and a hundredth of one for
a coefficient with sd 100: the same learning rate is far too large for the first and far
too small for the second. So ``UHAGuide`` registers q's mean, scale and the bridge's mean
slope with constraints whose bijection standardizes them by the warm start's q,
N(m₀, s₀²):

* ``loc = m₀ + s₀ ⊙ u``;
* ``scale = s₀ ⊙ exp(u)`` (diagonal);
* ``bridge_loc_slope = s₀ ⊙ u``.

A full-rank q is standardized by its start's whole Cholesky factor L₀ (q₀ = N(m₀, L₀L₀ᵀ)),
not by its marginal sds: ``loc = m₀ + L₀ u``, ``bridge_loc_slope = L₀ u`` and
``scale_tril = L₀ · diag(exp(u_s)) · C(c u_c)`` with ``C`` the Cholesky factor of a
correlation matrix (NumPyro's ``CorrCholeskyTransform``) and c = :data:`CORRELATION_UNIT`.
In the coordinates L₀ whitens, the start is N(0, I), the marginal sds are exp(u_s) and
the correlations stay in (−1, 1). Why whitened: where the posterior's correlations are
near ±1 (a regression on raw, collinear columns: conditional sds 10⁻⁴ of the marginal
ones), a step of the learning rate in marginal-sd units crosses the ridge by ten of its
widths: on a 4-dimensional Gaussian with correlations 0.9999, 500 steps of Adam 1e-2
took UHA's bound from −9.1 to −13.2 in marginal-sd units and to −7.1 whitened (log Z =
0; with the force limit of ``guide._force_sds`` as well, from −0.9 to −0.3). On a
diamonds-like regression (1 000 rows, float64, log Z = −326.65 by quadrature) the bound
was −395 and −618 after 2 000 steps of Adam 1e-3 and 1e-2 before both fixes, −327.12
and −327.53 after (its start q: −326.87). In whitened units the steps are the same size
along the ridge and across it. With a diagonal L₀ = diag(s₀) this is
the marginal-sd parameterization the mean-field q has. Why not the Cholesky factor's
entries (NumPyro's ``scaled_unit_lower_cholesky``): each row's marginal variance is the
sum of its squared entries, so gradient noise on the off-diagonal entries inflates the
marginal sds of the later coordinates step after step (non-centered eight schools at
Adam 1e-2: q's sds grew 2.5-fold in 8000 steps and the draws then diverged). The
correlation coordinates move in steps of a tenth: their gradients are weak next to
their noise once q is near the warm start, and in unit steps Adam random-walked them
into spurious correlations that broke training down at Adam 1e-2 (the zoo's
hierarchical logistic regression and the hold-out set's nested-plates model, d = 10 and
28: losses from 130 to 10¹¹ and from 85 to 900 after 3000-8000 steps; with steps of a
tenth both trained to the end, to a loss as low or lower).

The values in ``params`` are unchanged (model units); only the optimizer's coordinates
differ, so every step moves them by about the learning rate *in posterior standard
deviations*, on every coordinate (for a full-rank q: along every principal direction of
its start).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg  # noqa: F401 - jax.scipy.linalg.solve_triangular
from numpyro.distributions import constraints
from numpyro.distributions.transforms import (
    AffineTransform,
    ComposeTransform,
    CorrCholeskyTransform,
    ExpTransform,
    Transform,
    biject_to,
)

from numpyro_uha.core.warm_start import small_jit

__all__ = ["CORRELATION_UNIT", "StandardizedReal", "StandardizedPositive", "StandardizedCholesky"]

#: A full-rank q's correlation coordinates are ``CORRELATION_UNIT`` times the optimizer's
#: (see the module docstring).
CORRELATION_UNIT = 0.1


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
    """Real vectors; bijection ``u ↦ loc + scale ⊙ u``, or ``u ↦ loc + scale · u`` where
    ``scale`` is a lower Cholesky factor (a full-rank q's: whitened coordinates)."""

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
    """Lower Cholesky factors; bijection ``u ↦ L₀ · diag(exp(u_s)) · C(c u_c)``, L₀ =
    ``scale`` (a lower Cholesky factor; a vector s₀ stands for diag(s₀)), C a
    correlation matrix's Cholesky factor and c = CORRELATION_UNIT (``loc`` unused)."""

    event_dim = 2

    def __init__(self, loc, scale):
        scale = jnp.asarray(scale)
        super().__init__(loc, jnp.diag(scale) if scale.ndim == 1 else scale)

    def __call__(self, x):
        return constraints.lower_cholesky(x)

    def feasible_like(self, prototype):
        return jnp.broadcast_to(self.scale, jnp.shape(prototype))


def _check_width(x, width: int, *, last: int = 1) -> None:
    """A clear error where a parameter of q's reaches this guide's transform with another
    latent size (trailing ``last`` axes of width ``width``, read at trace time): an SVI
    state or params of another model (NumPyro's own error was a broadcasting one)."""
    shape = jnp.shape(x)
    if len(shape) < last or any(n != width for n in shape[len(shape) - last:]):
        raise ValueError(
            f"UHAGuide: a parameter of q with shape {tuple(shape)} reached a guide whose "
            f"model has {width} unconstrained latent coordinates: these params (or this "
            "SVI state) are another guide's or another model's. Pass this guide's fitted "
            "params (svi.get_params(state)), or set up a new fit for the changed model."
        )


class _CheckedAffine(AffineTransform):
    """NumPyro's ``AffineTransform`` on a q parameter (a latent-size vector), refusing
    another latent size with a clear error (:func:`_check_width`)."""

    def __call__(self, x):
        _check_width(x, jnp.shape(self.scale)[-1])
        return super().__call__(x)

    def _inverse(self, y):
        _check_width(y, jnp.shape(self.scale)[-1])
        return super()._inverse(y)


class _FactorAffine(Transform):
    """``u ↦ loc + L₀ u`` on a q parameter (a latent-size vector), L₀ = ``factor`` a lower
    Cholesky factor; another latent size is refused with a clear error
    (:func:`_check_width`)."""

    domain = constraints.real_vector
    codomain = constraints.real_vector

    def __init__(self, loc, factor):
        self.loc = loc
        self.factor = factor

    def __call__(self, x):
        _check_width(x, jnp.shape(self.factor)[-1])
        return _factor_forward(x, self.loc, self.factor, host=True)

    def _inverse(self, y):
        _check_width(y, jnp.shape(self.factor)[-1])
        return _factor_inverse(y, self.loc, self.factor, host=True)

    def log_abs_det_jacobian(self, x, y, intermediates=None):
        raise NotImplementedError(
            "_FactorAffine parameterizes a guide parameter; it has no density Jacobian."
        )

    def tree_flatten(self):
        return (self.loc, self.factor), (("loc", "factor"), dict())


def _solve_lower(factor, y):
    """L₀⁻¹ y for y of shape (..., d) or (..., d, k) (``vector``: the former)."""
    return jax.scipy.linalg.solve_triangular(
        jnp.broadcast_to(factor, jnp.shape(y)[:-2] + jnp.shape(factor)), y, lower=True
    )


@small_jit()  # compiled once per machine (see core/executables.py)
def _factor_forward(x, loc, factor):
    return loc + jnp.einsum("ij,...j->...i", factor, x)


@small_jit()  # compiled once per machine (see core/executables.py)
def _factor_inverse(y, loc, factor):
    return _solve_lower(factor, (y - loc)[..., None])[..., 0]


class _ScaleCorrCholeskyTransform(Transform):
    """``u = (u_s, u_c) ↦ L₀ · diag(exp(u_s)) · C(c u_c)``, c = CORRELATION_UNIT: a real
    vector of length d(d+1)/2 to a lower Cholesky factor; L₀ = ``scale`` (d × d, the
    warm start's factor), ``C`` NumPyro's ``CorrCholeskyTransform`` (unit rows). In the
    coordinates L₀ whitens, q's marginal sds are ``exp(u_s)``; with a diagonal L₀ =
    diag(s₀), q's marginal sds are ``s₀ ⊙ exp(u_s)``."""

    domain = constraints.real_vector
    codomain = constraints.lower_cholesky

    def __init__(self, scale):
        self.scale = scale

    @property
    def _dim(self):
        return jnp.shape(self.scale)[-1]

    def __call__(self, x):
        # one compiled program, as _inverse: run eagerly (svi.get_params, at the end of
        # every svi.run) its operations were compiled one by one (53 programs, ~2 s on
        # two CPU cores at d = 3, the first time in a process)
        d = self._dim
        _check_width(x, d * (d + 1) // 2)
        return _scale_corr_forward(x, self.scale, host=True)

    def _inverse(self, y):
        # one compiled program: run eagerly (SVI.init inverts the initial value) its
        # operations would each be compiled on their own (~1 s on two CPU cores)
        # (traced, under the caller's transform, the step is inlined: see small_jit)
        _check_width(y, self._dim, last=2)
        return _scale_corr_inverse(y, self.scale, host=True)

    def log_abs_det_jacobian(self, x, y, intermediates=None):
        raise NotImplementedError(
            "_ScaleCorrCholeskyTransform parameterizes a guide parameter; it has no "
            "density Jacobian."
        )

    def forward_shape(self, shape):
        return shape[:-1] + (self._dim, self._dim)

    def inverse_shape(self, shape):
        return shape[:-2] + (self._dim * (self._dim + 1) // 2,)

    def tree_flatten(self):
        return (self.scale,), (("scale",), dict())


@small_jit()  # compiled once per machine (see core/executables.py)
def _scale_corr_forward(x, scale):
    d = jnp.shape(scale)[-1]
    sds = jnp.exp(x[..., :d])
    whitened = sds[..., :, None] * CorrCholeskyTransform()(CORRELATION_UNIT * x[..., d:])
    return jnp.matmul(scale, whitened)


@small_jit()  # compiled once per machine (see core/executables.py)
def _scale_corr_inverse(y, scale):
    whitened = _solve_lower(scale, y)
    sds = jnp.sqrt(jnp.sum(whitened**2, axis=-1))
    u_c = CorrCholeskyTransform().inv(whitened / sds[..., :, None])
    return jnp.concatenate([jnp.log(sds), u_c / CORRELATION_UNIT], axis=-1)


@biject_to.register(StandardizedReal)
def _real(constraint):
    if jnp.ndim(constraint.scale) == 2:  # a full-rank q's factor: whitened coordinates
        return _FactorAffine(constraint.loc, constraint.scale)
    return _CheckedAffine(constraint.loc, constraint.scale, domain=constraints.real_vector)


@biject_to.register(StandardizedPositive)
def _positive(constraint):
    return ComposeTransform([
        ExpTransform(),
        _CheckedAffine(0.0, constraint.scale, domain=constraints.positive),
    ])


@biject_to.register(StandardizedCholesky)
def _cholesky(constraint):
    return _ScaleCorrCholeskyTransform(constraint.scale)
