"""Divergence handling for ``UHAGuide`` training that behaves the same on every backend.

An uncorrected leapfrog can send a rare draw from q's tails to infinity even when the
step size suits the bulk of the posterior. Such a draw's weight is 0 in the limit (its
energy error drives the momentum-density ratio to 0), and its gradient carries no
information. So a diverging particle is *skipped*, training goes on, and what happened is
reported where values are concrete. Raising an exception inside a host callback is
undefined behaviour in JAX (on CPU a wrapped ``JaxRuntimeError``, on GPU logged and
lost), so nothing here raises inside a compiled computation. Four parts work together:

* **a gate** (:func:`gate`): an identity whose backward pass zeroes the gradient when it
  is not finite or when told to stop. On the guide's outputs it stops the gradient that
  flows back from a diverged particle; on the guide's parameter values it zeroes a
  gradient that is still not finite (NaN from a diverged trajectory can reach them
  through the leapfrog's own derivatives), so NaN never reaches the parameters: the
  step is skipped;
* **a latch**: a scalar ``numpyro.param`` (``{prefix}_diverged``, starting at 0) whose
  loss gradient is the fraction of particles with a non-finite log weight. The
  optimizer moves it away from 0 at the first divergence and it never comes back (its
  gradient is otherwise exactly 0), so the flag travels with the parameters and is seen
  wherever their values are concrete: ``svi.get_params`` (the end of ``svi.run``) and
  the guide's methods then warn (:class:`UHADivergenceWarning`) with the count;
* **a record**: a host callback, taken only on a diverging step (inside a ``lax.cond``),
  that stores the step size and the parameter values at the first divergence and counts
  the diverging steps. It never raises.

Whether the fit is usable is then decided by its draws: when more than a small fraction
of them diverge, the guide's draw methods raise :class:`UHADivergenceError` (a plain
``FloatingPointError``) holding the parameters of the first diverging training step.
"""

from __future__ import annotations

import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from numpyro.distributions import constraints
from numpyro.distributions.transforms import IdentityTransform, biject_to

# A leapfrog step whose energy error exceeds this many nats has diverged (as in NUTS);
# the core's deferred chains (annealed_sample's deferred_diagnostics) use the same rule.
from numpyro_uha.core.annealing import DIVERGENCE_ENERGY, divergence_rule

__all__ = [
    "UHADivergenceError",
    "UHADivergenceWarning",
    "UHANonfiniteDrawsWarning",
    "UHAFitWarning",
    "UHADrawsOffWarning",
    "UHAWorseThanStartWarning",
    "DivergenceRecord",
    "LatchConstraint",
    "LocalDivergenceRecord",
    "DIVERGENCE_ENERGY",
    "diverged",
    "chain_diverged",
    "gate",
    "finite_guard",
]


def diverged(log_weight, log_accept_ratio):
    """Whether a chain diverged (per chain, over the last axis of ``log_accept_ratio``):
    a non-finite log weight, or a leapfrog step whose energy error exceeds
    :data:`DIVERGENCE_ENERGY` nats (NUTS's rule). The weight is then e^-1000 of the
    others', nothing, while its gradient, through Jacobians grown exponentially along
    the trajectory, can be 1e16 or NaN and would swamp Adam's moment estimates for
    thousands of steps. No gradient. (``UHAGuide``'s training chains make the same flag
    themselves, checking step by step only the chains that are not calm:
    ``numpyro_uha.core.annealed_sample``'s ``deferred_diagnostics``.)"""
    stop = jax.lax.stop_gradient
    return divergence_rule(stop(log_weight), stop(log_accept_ratio), axis=-1)


def chain_diverged(log_weight, info):
    """Which chains diverged (no gradient): the chain's own flag ``info.diverged`` where
    it made one (``deferred_diagnostics``: uncorrected position Verlet), else
    :func:`diverged` from its per-transition energy errors."""
    if info.diverged is not None:
        return jax.lax.stop_gradient(info.diverged)
    return diverged(log_weight, info.log_accept_ratio)


class UHANonfiniteDrawsWarning(RuntimeWarning):
    """Some posterior draws diverged (non-finite log weight or latent) and were dropped
    (``sample_posterior(..., nonfinite="drop")``) or given zero weight."""


class UHAFitWarning(RuntimeWarning):
    """The importance weights of the draws say the approximation is poor: Pareto k̂ ≥ 0.7,
    an ELBO whose Monte Carlo standard error exceeds 1 nat (both checked by the guide's
    draws, from 200 draws up, and by the evaluation layer), or (from the guide's draws
    and ``log_z``) a bound below the ELBO of the Gaussian q training started from
    (:meth:`~numpyro_uha.UHAGuide.warn_if_worse_than_start`)."""


class UHADrawsOffWarning(UHAFitWarning):
    """The draws' own means or spreads are off what their importance weights estimate,
    beyond the weights' noise, where Pareto k̂ (< 0.7) says those weighted estimates can
    be trusted: the weights move a latent coordinate's mean by more than 0.25 of its sd
    ("the draws are biased there"), or widen or narrow its sd by more than a factor 1.25
    ("too narrow" / "too wide there"). Weighted moments or importance-resampled draws
    correct for it; the unweighted draws (``sample_posterior``, ``Predictive``) do not.
    A kind of :class:`UHAFitWarning`: filter it on its own with
    ``warnings.filterwarnings(..., category=UHADrawsOffWarning)``.

    Attributes (of the warning, ``caught.message`` in ``warnings.catch_warnings(record=
    True)``'s list):
        check: ``"biased"`` (the mean), ``"too_narrow"`` or ``"too_wide"`` (the sd).
        sites: the model sites flagged, worst first.
    """

    def __init__(self, message, check=None, sites=()):
        super().__init__(message)
        self.check = check
        self.sites = tuple(sites)


class UHAWorseThanStartWarning(UHAFitWarning):
    """Training made the approximation worse than the Gaussian q it started from: over
    the draws at these params, the UHA ELBO lies clearly below q's (by more than 1 nat
    and 4 standard errors), or most log weights lie far below it
    (:meth:`~numpyro_uha.UHAGuide.warn_if_worse_than_start`). Usually a learning rate
    too high for the annealing parameters. A kind of :class:`UHAFitWarning`."""


class UHAImproperPosteriorWarning(UHAFitWarning):
    """The model's log density does not change along some latent coordinates (found at
    setup: its gradient there is exactly zero at q's mean and at draws from q), so the
    posterior is improper in them (flat over the whole real line): no guide fits it, the
    ELBO and log Z grow without bound as q widens, and only the other coordinates'
    draws mean anything. Typical causes: the entries of an ``obs_mask`` site's
    ``<name>_unobserved`` latent where the data are observed (NumPyro masks their
    density out), or a latent with an improper prior (``ImproperUniform``) that nothing
    else depends on. A flat prior on an unbounded support other than the real line
    (positive, bounded on one side, ordered) is found the same way with the log |det J|
    of its map to the support left out: its density is flat in the site's own value,
    not in the unconstrained coordinates."""


class UHASupportWarning(UHAFitWarning):
    """The model's log density is −inf at points near q (found at setup, at q's mean and
    at draws from q) although every latent site's value there is inside its declared
    support: some site (usually the likelihood) rules those points out, so the
    posterior's support is narrower than the latent sites declare. Observations
    ``y ~ Uniform(0, theta)`` bound ``theta`` below by ``max(y)``, for example. A
    Gaussian q (this guide's start, like ``AutoNormal``'s) puts mass there, so the
    chains that reach it diverge, and plain VI's ELBO is −inf. Declare the bound in the
    model, so that every unconstrained value is possible: e.g.
    ``theta = y.max() + numpyro.sample("excess", dist.HalfNormal(...))``, or a prior
    whose support starts there."""


class UHADivergenceError(FloatingPointError):
    """Training (or a draw) produced a non-finite UHA log weight.

    Attributes:
        params: the guide's parameter values (constrained, as in ``svi.get_params``) at
            the first diverging step, before its update: the last finite fit. ``None``
            where no such record exists (e.g. a fit loaded from disk after it diverged).
    """

    def __init__(self, message, params=None):
        super().__init__(message)
        self.params = params


class UHADivergenceWarning(RuntimeWarning):
    """Some training steps were skipped because a particle's trajectory diverged."""


class DivergenceRecord:
    """What the host learned about diverging training steps. Picklable."""

    def __init__(self):
        self.count = 0
        self.step_size = None
        self.fraction = None
        self.params = None
        self._lock = threading.Lock()

    def __getstate__(self):
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def reset(self):
        with self._lock:
            self.count, self.step_size, self.fraction, self.params = 0, None, None, None

    def record(self, fraction, step_size, params):
        with self._lock:
            self.count += 1
            if self.params is None:
                self.fraction = float(np.max(np.asarray(fraction)))
                self.step_size = float(np.asarray(step_size).ravel()[0])
                self.params = {
                    name: jax.tree.map(np.asarray, value) for name, value in params.items()
                }

    def _detail(self):
        if self.params is None:
            return (
                "The latch parameter says so, but this process holds no record of the "
                "steps (e.g. the fit was loaded from disk)."
            )
        return (
            f"{self.count} training step(s) had a non-finite log weight (a trajectory "
            f"diverged); at the first, {100 * self.fraction:.0f} % of the particles diverged "
            f"with ε(β_1) = {self.step_size:.4g}. Those particles were skipped (no gradient "
            "from them) and training went on; the parameters that first diverging step "
            "started from are in `guide.last_finite_params`."
        )

    def warning(self, where: str) -> str:
        return (
            f"UHAGuide: divergences during training (found {where}). {self._detail()} "
            "A few skipped steps are harmless; if the draws diverge too, or the fit ended "
            "worse than the warm start (sample_posterior says both), use a smaller "
            "learning rate or max_step_size."
        )

    def error(self, what: str, cause: str | None = None) -> UHADivergenceError:
        """The error for a fit whose draws diverge (``what`` says how many); ``cause``,
        where the guide knows one that no step size fixes, replaces the advice."""
        detail = self._detail() if self.count else ""
        if cause is not None:
            return UHADivergenceError(f"UHAGuide: {what}. {cause} {detail}", params=self.params)
        return UHADivergenceError(
            f"UHAGuide: {what}: the Hamiltonian dynamics diverge at these parameters. "
            f"{detail} What to change: a smaller learning "
            "rate, a smaller max_step_size (the leapfrog step ε is capped by it); then "
            "resume from the first diverging step's parameters with "
            "svi.run(..., init_params=err.params) where they exist.",
            params=self.params,
        )


class LocalDivergenceRecord(DivergenceRecord):
    """``UHALocalGuide``'s record: its latch says that some data points' chains diverged
    in training; nothing is recorded on the host (no callback in its training step)."""

    def warning(self, where: str) -> str:
        return (
            f"UHALocalGuide: some data points' chains diverged during training (found "
            f"{where}): their log weight was not finite, or a leapfrog step's energy error "
            f"exceeded {DIVERGENCE_ENERGY:g} nats. Those chains were skipped (no gradient "
            "through them; their q_i got the gradient of their plain ELBO term) and "
            "training went on; they show as spikes in the losses. Occasional spikes are "
            "harmless; frequent ones mean a step size too large for some data points' "
            "posteriors: use a smaller max_step_size or learning rate for the annealing "
            "parameters. A log density that is not finite at every draw (NaN or inf in "
            "the data) shows the same way: the draw methods (sample_posterior, log_z) check "
            "the minibatch's data and name such data points."
        )


class LatchConstraint(constraints.Constraint):
    """The real line, for the latch parameter; its transform checks concrete values.

    ``svi.get_params`` constrains every parameter with ``biject_to(constraint)``; for
    this constraint that is the identity, except that a concrete latch away from 0
    warns (:class:`UHADivergenceWarning`). Inside ``jit`` (``svi.update``) it is a no-op.
    """

    event_dim = 0

    def __init__(self, record: DivergenceRecord):
        self.record = record

    def __call__(self, x):
        return jnp.isfinite(x)

    def feasible_like(self, prototype):
        return jnp.zeros_like(prototype)

    def tree_flatten(self):
        return (), ((), {"record": self.record})

    def eq(self, other, static=False):
        return self is other


class _LatchTransform(IdentityTransform):
    def __init__(self, record):
        self.record = record

    def __call__(self, x):
        check_latch(
            x, self.record, "by svi.get_params, e.g. at the end of svi.run", or_recorded=True
        )
        return x

    def tree_flatten(self):
        return (), ((), {"record": self.record})


@biject_to.register(LatchConstraint)
def _latch_transform(constraint):
    return _LatchTransform(constraint.record)


def check_latch(
    latch, record: DivergenceRecord, where: str, reset_if_clear=False, or_recorded=False
):
    """Warn (:class:`UHADivergenceWarning`) if a *concrete* latch value is not 0, or
    (``or_recorded``) if the record counted diverging steps although the latch is 0: an
    optimizer that did not move it (``numpyro.optim.Minimize``, whose line search
    rejects the NaN points; a frozen latch; ``stable_update`` skipping the steps).

    With ``reset_if_clear``, a concrete latch at 0 (a fresh ``svi.init``, or a fit that
    never diverged) clears the record of an earlier run.
    """
    if isinstance(latch, jax.core.Tracer):
        return
    if np.any(np.asarray(latch) != 0) or (or_recorded and record.count > 0):
        warnings.warn(record.warning(where), UHADivergenceWarning, stacklevel=3)
    if reset_if_clear:
        record.reset()


# ------------------------------------------------------------------------------ gate


@jax.custom_vjp
def gate(tree, stop):
    """Identity on ``tree``; its gradient is zeroed where not finite or when ``stop``."""
    return tree


def _gate_fwd(tree, stop):
    return tree, stop


def _gate_bwd(stop, cotangent):
    leaves = jax.tree.leaves(cotangent)
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in leaves])) if leaves else True
    keep = jnp.logical_and(finite, jnp.logical_not(stop))
    return jax.tree.map(lambda c: jnp.where(keep, c, jnp.zeros_like(c)), cotangent), None


gate.defvjp(_gate_fwd, _gate_bwd)


# ----------------------------------------------------------------------- record guard


def _guard(record, log_weight, step_size, params):
    def report(lw, eps, values):
        fraction = jnp.mean(~jnp.isfinite(lw))

        def on_host(fraction, eps, values):
            record.record(fraction, eps, values)
            return np.zeros((), np.asarray(fraction).dtype)

        return jax.pure_callback(
            on_host, jax.ShapeDtypeStruct((), lw.dtype), fraction.astype(lw.dtype), eps, values
        )

    return jax.lax.cond(
        jnp.any(~jnp.isfinite(log_weight)),
        report,
        lambda lw, eps, values: jnp.zeros((), lw.dtype),
        log_weight,
        step_size,
        params,
    )


def finite_guard(record: DivergenceRecord, log_weight, step_size, params):
    """0.0, after recording on the host (never raising) if ``log_weight`` is not finite.

    The host is only called on a diverging step: under ``vmap`` over particles the test
    is reduced over the batch first, so the branch predicate stays unbatched and the
    callback stays in a ``cond`` branch that a healthy step never takes.
    """

    @custom_vmap
    def unbatched(lw, eps, values):
        return _guard(record, lw, eps, values)

    @unbatched.def_vmap
    def batched(axis_size, in_batched, lw, eps, values):
        eps = eps if not in_batched[1] else eps[0]
        values = jax.tree.map(
            lambda v, b: v[0] if b else v, values, in_batched[2]
        )
        return _guard(record, lw, eps, values), False

    stop = jax.lax.stop_gradient
    return unbatched(stop(log_weight), stop(step_size), jax.tree.map(stop, params))
