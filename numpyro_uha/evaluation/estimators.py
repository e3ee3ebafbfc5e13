"""log Z estimators built on the annealing chains: UHA, Hamiltonian AIS, the reverse bound.

Two layers with the same estimators:

* ``annealed_*`` functions take a ``logdensity_fn`` over a flat ``z`` and
  :class:`~numpyro_uha.core.AnnealingParams`: they work for any JAX log density;
* :func:`log_z`, :func:`hais` and :func:`sandwich` take a trained
  :class:`~numpyro_uha.UHAGuide`, its params and the model's arguments.

Every estimate is computed from independent chains, vectorized ``batch_size`` at a time
under one ``jit``. A NaN or -inf log weight (a diverged chain) is a zero weight, counted
in :attr:`LogZEstimate.num_nonfinite`; a +inf one raises :class:`FloatingPointError`.

Compilation: the ``annealed_*`` functions and :func:`hais_grid_search` take an arbitrary
``logdensity_fn`` and compile their chains anew on every call (seconds for a model of
moderate size). The guide-level functions compile once per guide and argument structure:
their forward chains are the guide's own compiled draws (as
:meth:`~numpyro_uha.UHAGuide.sample_posterior_with_log_weights` runs them), the reverse
chains a program kept per guide, both built from the model's arguments inside the ``jit``
and run in chunks of a fixed width, so a second call, or one with another number of
draws at an already used width, runs without compiling.
"""

from __future__ import annotations

from collections.abc import Mapping

import math
import warnings
import weakref
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_uha._divergence import UHAFitWarning
from numpyro_uha._keywords import check_model_keywords, model_of
from numpyro_uha.core import (
    AnnealingParams,
    annealed_sample,
    make_params,
    reverse_annealed_sample,
)
from numpyro_uha.core.batching import batched_map, reuse_width, signature_of
from numpyro_uha.core.sharding import gather, num_shards, put_global, shard_leading
from numpyro_uha.evaluation.logz import LogZEstimate, log_z_from_weights

__all__ = [
    "HAISResult",
    "HAISGridResult",
    "LogZSandwich",
    "annealed_log_z",
    "annealed_hais",
    "annealed_sandwich",
    "hais_grid_search",
    "log_z",
    "hais",
    "sandwich",
    "extrapolate",
]


class HAISResult(NamedTuple):
    """Hamiltonian AIS (Metropolis-corrected annealing) with given parameters.

    Attributes:
        log_z: :class:`LogZEstimate` of the HAIS log weights. ``exp`` of each weight is an
            unbiased estimate of Z, so ``log_z.iw`` is consistent and ``log_z.elbo`` is
            the (non-differentiable) HAIS lower bound the paper compares UHA against.
        acceptance_rate: fraction of accepted proposals at each transition, ``(K,)``.
        log_weights: the N log weights.
        params: the :class:`~numpyro_uha.core.AnnealingParams` used.
    """

    log_z: LogZEstimate
    acceptance_rate: np.ndarray
    log_weights: np.ndarray
    params: AnnealingParams

    @property
    def mean_acceptance(self) -> float:
        """Acceptance rate averaged over transitions."""
        return float(np.mean(self.acceptance_rate))

    def __str__(self) -> str:
        rates = self.acceptance_rate
        return (
            f"HAIS {self.log_z} | acceptance mean {rates.mean():.3f} "
            f"(min {rates.min():.3f}, max {rates.max():.3f})"
        )


class HAISGridResult(NamedTuple):
    """The paper's Hamiltonian AIS baseline: the best of a grid over (ε, η).

    Attributes:
        best: :class:`HAISResult` of the best grid point (highest ELBO), re-run on fresh
            chains so its estimate is not biased upwards by the selection.
        table: one dict per grid point with ``damping``, ``target_rejection``,
            ``step_size``, ``rejection`` (achieved in the pilot), ``elbo``, ``elbo_se``,
            ``iw``, ``iw_se`` from the selection run.
    """

    best: HAISResult
    table: list


class LogZSandwich(NamedTuple):
    """Lower and upper stochastic bounds on log Z from the same annealing parameters.

    Attributes:
        lower: :class:`LogZEstimate` of forward chains started from q: ``lower.elbo`` and
            ``lower.iw`` are lower bounds in expectation.
        upper: mean of the reverse-chain log weights, an upper bound on log Z in
            expectation *if the starting draws are exact posterior draws*.
        upper_se: its Monte Carlo standard error.
        upper_iw: −log mean(1/w) of the reverse weights, a tighter upper bound under the
            same assumption (Jensen on the unbiased estimate of 1/Z).
        upper_iw_se: delta-method standard error of ``upper_iw``.
        num_reverse: number of reverse chains (posterior draws used).
        num_reverse_nonfinite: reverse chains whose log weight is NaN or ±inf
            (diverged). The upper bounds are over the others only, so they may be too
            low where it is not 0 (a :class:`~numpyro_uha.UHAFitWarning` says so).
    """

    lower: LogZEstimate
    upper: float
    upper_se: float
    upper_iw: float
    upper_iw_se: float
    num_reverse: int
    num_reverse_nonfinite: int = 0

    @property
    def gap(self) -> float:
        """``upper_iw - lower.iw``: the width of the sandwich (≥ 0 in expectation)."""
        return self.upper_iw - self.lower.iw

    def __str__(self) -> str:
        return (
            f"log Z in [{self.lower.iw:.4f} ± {self.lower.iw_se:.4f}, "
            f"{self.upper_iw:.4f} ± {self.upper_iw_se:.4f}] (IW bounds); "
            f"ELBO {self.lower.elbo:.4f} ± {self.lower.elbo_se:.4f}, "
            f"reverse bound {self.upper:.4f} ± {self.upper_se:.4f}"
            + (f" | {self.num_reverse_nonfinite} of {self.num_reverse} reverse chains "
               "diverged (left out of the upper bounds)" if self.num_reverse_nonfinite else "")
        )


# ------------------------------------------------------------------ chains
def _chain_runner(
    logdensity_fn, num_draws, *, corrected, reverse, num_leapfrog_steps, batch_size,
    integrator="velocity_verlet",
):
    """A jitted ``run(rng_key, params, positions) -> (log_w, accepted, final_z)``.

    ``params`` is traced, so one compilation serves every parameter value (grid search).
    """

    def run(rng_key, params, positions):
        keys = jax.random.split(rng_key, num_draws)

        def one(inputs):
            key, position = inputs
            if reverse:
                z, log_w, info = reverse_annealed_sample(
                    key, logdensity_fn, params, position,
                    num_leapfrog_steps=num_leapfrog_steps, corrected=corrected,
                    integrator=integrator,
                )
            else:
                z, log_w, info = annealed_sample(
                    key, logdensity_fn, params,
                    num_leapfrog_steps=num_leapfrog_steps, corrected=corrected,
                    integrator=integrator,
                )
            return log_w, info.accepted, z

        return batched_map(one, (keys, positions), batch_size)

    return jax.jit(run)


def _check_num_draws(num_draws):
    if isinstance(num_draws, bool) or not isinstance(num_draws, (int, np.integer)) or num_draws < 2:
        raise ValueError(f"num_draws must be an integer ≥ 2, got {num_draws!r}.")
    return int(num_draws)


def _forward(
    rng_key, logdensity_fn, params, num_draws, corrected, num_leapfrog_steps, batch_size,
    integrator,
):
    num_draws = _check_num_draws(num_draws)
    run = _chain_runner(
        logdensity_fn, num_draws, corrected=corrected, reverse=False,
        num_leapfrog_steps=num_leapfrog_steps, batch_size=batch_size, integrator=integrator,
    )
    log_w, accepted, _ = run(rng_key, params, jnp.zeros(num_draws))
    return np.asarray(log_w, np.float64), np.asarray(accepted)


def annealed_log_z(
    rng_key,
    logdensity_fn: Callable,
    params: AnnealingParams,
    num_draws: int = 1000,
    *,
    corrected: bool = False,
    num_leapfrog_steps: int = 1,
    batch_size: int = 1024,
    integrator: str = "velocity_verlet",
) -> LogZEstimate:
    """ELBO and importance-weighted log Z, with standard errors, from ``num_draws`` chains.

    Compiles its chains on every call (``logdensity_fn`` is an arbitrary callable); a
    trained guide's estimators (:func:`log_z`, :func:`hais`, :func:`sandwich`) compile once
    per guide and argument shapes.

    Args:
        rng_key: JAX PRNG key.
        logdensity_fn: z ↦ log p̄(z) over a flat ``z``.
        params: :class:`~numpyro_uha.core.AnnealingParams` (e.g. from
            ``guide.get_annealing_params(params)`` or :func:`~numpyro_uha.core.make_params`).
        num_draws: independent chains (≥ 2).
        corrected: use Hamiltonian AIS weights instead of UHA's (see :func:`annealed_hais`
            for acceptance rates).
        num_leapfrog_steps: L per transition.
        batch_size: chains computed together.
        integrator: ``"velocity_verlet"`` (the paper's leapfrog) or ``"position_verlet"``
            (:class:`~numpyro_uha.UHAGuide`'s default); see
            :func:`~numpyro_uha.core.annealed_sample`.
    """
    log_w, _ = _forward(
        rng_key, logdensity_fn, params, num_draws, corrected, num_leapfrog_steps, batch_size,
        integrator,
    )
    return log_z_from_weights(log_w, int(params.betas.shape[0]))


def annealed_hais(
    rng_key,
    logdensity_fn: Callable,
    params: AnnealingParams,
    num_draws: int = 1000,
    *,
    num_leapfrog_steps: int = 1,
    batch_size: int = 1024,
    integrator: str = "velocity_verlet",
) -> HAISResult:
    """Hamiltonian AIS (paper Algorithms 1 and 6) with the given parameters.

    The same schedule, bridges, integrator, step sizes, damping and momentum as UHA, with
    a Metropolis accept/reject step closing each transition. Its weights are unbiased for
    Z but not differentiable, so these parameters are *not* tuned for it: pass a UHA
    guide's (via :func:`hais`) to see what correction costs, or use
    :func:`hais_grid_search` for the paper's tuned baseline. With
    ``integrator="position_verlet"`` the accept/reject step needs the target's value at
    the end of every transition, one more evaluation each than UHA makes.

    Compiles its chains on every call (``logdensity_fn`` is an arbitrary callable); a
    trained guide's estimators (:func:`log_z`, :func:`hais`, :func:`sandwich`) compile once
    per guide and argument shapes.
    """
    params = jax.tree.map(jnp.asarray, params)
    log_w, accepted = _forward(
        rng_key, logdensity_fn, params, num_draws, True, num_leapfrog_steps, batch_size,
        integrator,
    )
    return HAISResult(
        log_z=log_z_from_weights(log_w, int(params.betas.shape[0])),
        acceptance_rate=accepted.mean(axis=0),
        log_weights=log_w,
        params=params,
    )


def hais_grid_search(
    rng_key,
    logdensity_fn: Callable,
    loc,
    scale,
    num_transitions: int,
    *,
    dampings=(0.5, 0.9, 0.99),
    rejection_rates=(0.05, 0.25, 0.5),
    num_draws: int = 1000,
    num_pilot: int = 256,
    momentum_scale=None,
    num_leapfrog_steps: int = 1,
    batch_size: int = 1024,
) -> HAISGridResult:
    """The paper's Hamiltonian AIS baseline (Section 5, "Baselines").

    q = N(``loc``, ``scale``) (e.g. a plain-VI fit), the linear schedule, one step size ε
    for every transition and, by default, a standard Gaussian momentum. For every damping
    η in ``dampings`` and every target rejection rate r in ``rejection_rates``, ε is set by
    bisection on log ε so that the mean rejection rate of ``num_pilot`` pilot chains is r
    (common random numbers across the bisection); each of the grid points is then scored
    by the ELBO of ``num_draws`` chains, and the best is re-run on fresh chains.

    Compiles the pilot and scoring chains once per call (every grid point and bisection
    step reuses them) and the final run once more.
    """
    num_transitions = int(num_transitions)
    if num_transitions < 1:
        raise ValueError(f"num_transitions must be ≥ 1, got {num_transitions}.")
    bad = [r for r in rejection_rates if not 0 < r < 1]
    if bad:
        raise ValueError(f"rejection_rates must lie in (0, 1), got {bad}.")
    bad = [eta for eta in dampings if not 0 <= eta < 1]
    if bad:
        raise ValueError(f"dampings (η) must lie in [0, 1), got {bad}.")
    num_draws = _check_num_draws(num_draws)
    key_pilot, key_score, key_final = jax.random.split(rng_key, 3)
    base = make_params(loc, scale, num_transitions=num_transitions, momentum_scale=momentum_scale)
    options = dict(corrected=True, reverse=False, num_leapfrog_steps=num_leapfrog_steps, batch_size=batch_size)
    pilot = _chain_runner(logdensity_fn, num_pilot, **options)
    score = _chain_runner(logdensity_fn, num_draws, **options)

    def with_eps(eta, eps):
        return base._replace(
            damping=jnp.asarray(eta, base.loc.dtype),
            step_sizes=jnp.full_like(base.betas, eps),
        )

    def rejection(eta, log_eps):
        _, accepted, _ = pilot(key_pilot, with_eps(eta, math.exp(log_eps)), jnp.zeros(num_pilot))
        return 1.0 - float(np.mean(accepted))

    table = []
    for eta in dampings:
        for target in rejection_rates:
            lo, hi = math.log(1e-4), math.log(10.0)
            if rejection(eta, hi) < target:
                lo = hi
            elif rejection(eta, lo) > target:
                hi = lo
            for _ in range(14 if lo < hi else 0):
                mid = 0.5 * (lo + hi)
                if rejection(eta, mid) < target:
                    lo = mid
                else:
                    hi = mid
            eps = math.exp(0.5 * (lo + hi))
            log_w, _, _ = score(key_score, with_eps(eta, eps), jnp.zeros(num_draws))
            log_w = np.asarray(log_w, np.float64)
            finite = bool(np.all(np.isfinite(log_w)))
            est = log_z_from_weights(log_w, num_transitions) if finite else None
            table.append(dict(
                damping=float(eta),
                target_rejection=float(target),
                step_size=eps,
                rejection=rejection(eta, math.log(eps)),
                elbo=est.elbo if finite else -math.inf,
                elbo_se=est.elbo_se if finite else math.inf,
                iw=est.iw if finite else -math.inf,
                iw_se=est.iw_se if finite else math.inf,
            ))
    best_row = max(table, key=lambda row: row["elbo"])
    if not math.isfinite(best_row["elbo"]):
        raise FloatingPointError("hais_grid_search: every grid point gave non-finite log weights.")
    best = annealed_hais(
        key_final, logdensity_fn, with_eps(best_row["damping"], best_row["step_size"]),
        num_draws, num_leapfrog_steps=num_leapfrog_steps, batch_size=batch_size,
    )
    return HAISGridResult(best=best, table=table)


def annealed_sandwich(
    rng_key,
    logdensity_fn: Callable,
    params: AnnealingParams,
    posterior_positions,
    *,
    num_draws: int | None = None,
    corrected: bool = False,
    num_leapfrog_steps: int = 1,
    batch_size: int = 1024,
    integrator: str = "velocity_verlet",
) -> LogZSandwich:
    """Bracket log Z between forward (from q) and reverse (from the posterior) chains.

    The reverse chains (Grosse et al., 2015, "Sandwiching the marginal likelihood using
    bidirectional Monte Carlo") start at ``posterior_positions``, run the annealing
    backwards to q (:func:`~numpyro_uha.core.reverse_annealed_sample`), and their weights
    give stochastic *upper* bounds on log Z.

    **Assumption**: the rows of ``posterior_positions`` (shape ``(N, d)``, in the same
    space as ``logdensity_fn``) are exact, independent posterior draws. Long, converged
    NUTS runs come close; with biased or correlated draws the "upper" bound can fall
    below log Z, and a crossing of the bounds is the symptom.

    Compiles its chains on every call (``logdensity_fn`` is an arbitrary callable); a
    trained guide's estimators (:func:`log_z`, :func:`hais`, :func:`sandwich`) compile once
    per guide and argument shapes.

    Args:
        num_draws: forward chains for the lower bound (default: as many as positions).
        corrected: bracket with the Hamiltonian AIS weights instead of UHA's.
        integrator: ``"velocity_verlet"`` (the paper's leapfrog) or ``"position_verlet"``
            (:class:`~numpyro_uha.UHAGuide`'s default); see
            :func:`~numpyro_uha.core.annealed_sample`.
    """
    positions = jnp.asarray(posterior_positions)
    if positions.ndim != 2 or positions.shape[1] != params.loc.shape[-1]:
        raise ValueError(
            f"posterior_positions must have shape (N, {params.loc.shape[-1]}), got {positions.shape}."
        )
    num_reverse = _check_num_draws(positions.shape[0])
    if not bool(jnp.all(jnp.isfinite(positions))):
        raise ValueError("posterior_positions contain NaN or inf values.")
    num_draws = num_reverse if num_draws is None else num_draws
    key_forward, key_reverse = jax.random.split(rng_key)
    log_w, _ = _forward(
        key_forward, logdensity_fn, params, num_draws, corrected, num_leapfrog_steps, batch_size,
        integrator,
    )
    num_transitions = int(params.betas.shape[0])
    lower = log_z_from_weights(log_w, num_transitions)
    run = _chain_runner(
        logdensity_fn, num_reverse, corrected=corrected, reverse=True,
        num_leapfrog_steps=num_leapfrog_steps, batch_size=batch_size, integrator=integrator,
    )
    reverse_log_w, _, _ = run(key_reverse, params, positions.astype(params.loc.dtype))
    reverse_log_w = np.asarray(reverse_log_w, np.float64)
    return _sandwich_result(lower, reverse_log_w, num_transitions)


def _sandwich_result(lower, reverse_log_w, num_transitions) -> LogZSandwich:
    """The bracket from the forward chains' summary and the reverse chains' log weights:
    -log w estimates -log Z from below, so the lower-bound summary of the negated weights
    gives the upper bounds."""
    flipped = log_z_from_weights(-reverse_log_w, num_transitions)
    num_reverse = int(reverse_log_w.shape[0])
    if flipped.num_nonfinite:
        # a diverged reverse chain's weight is unknown, not zero: leaving it out can
        # only lower the upper bounds' estimates
        warnings.warn(
            f"sandwich: {flipped.num_nonfinite} of {num_reverse} reverse chains diverged "
            "(a NaN or infinite log weight); the upper bounds are over the others only "
            "and may be too low. The step sizes are too large for the posterior's "
            "narrowest direction (a guide's: lower max_step_size and refit).",
            UHAFitWarning, stacklevel=3,
        )
    return LogZSandwich(
        lower=lower,
        upper=-flipped.elbo,
        upper_se=flipped.elbo_se,
        upper_iw=-flipped.iw,
        upper_iw_se=flipped.iw_se,
        num_reverse=num_reverse,
        num_reverse_nonfinite=flipped.num_nonfinite,
    )


# ------------------------------------------------------------ guide level
#: Compiled programs of the guide-level estimators, per guide (weakly: they go with the
#: guide, which needs no attribute for them and pickles as before), then per
#: ``(kind, argument structure, static options)``. Each builds the model's log density
#: inside the ``jit`` from the array leaves of the model's arguments and the params, so
#: one compilation serves every call with the same shapes.
_GUIDE_PROGRAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _guide_program(guide, kind: str, spec, build, **static):
    """The jitted program ``build(guide_ref, spec, **static)`` of ``guide``, built once.

    The program holds the guide by a weak reference (a strong one, in a value of the
    weak dictionary, would keep the guide alive forever). ``num_leapfrog_steps`` and
    ``integrator`` are read when the program is traced, so they are part of the key.
    """
    programs = _GUIDE_PROGRAMS.setdefault(guide, {})
    key = (kind, spec, guide.num_leapfrog_steps, guide.integrator, tuple(sorted(static.items())))
    program = programs.get(key)
    if program is None:
        program = programs[key] = build(weakref.ref(guide), spec, **static)
    return program


def _check_guide(guide):
    from numpyro_uha.guide import UHAGuide

    if not isinstance(guide, UHAGuide):
        from numpyro_uha.local import UHALocalGuide

        hint = ""
        if isinstance(guide, UHALocalGuide):
            hint = (
                " A UHALocalGuide estimates per data point: its own log_z and "
                "log_weights (corrected=True for Hamiltonian AIS); for all the data, "
                "its global_log_z (log p(x), with weights of the globals' draws) and "
                "the whole model's bound numpyro_uha.evaluation.minibatch_bound."
            )
        raise TypeError(f"expected a UHAGuide, got {type(guide).__name__}.{hint}")
    guide._require_setup()


def _build_latent(guide_ref, spec):
    """jit of :meth:`~numpyro_uha.UHAGuide.latent_from_samples` for arguments ``spec``."""
    from numpyro_uha.guide import _merge_static

    def run(samples, model_params, arrays):
        args, kwargs = _merge_static(arrays, spec)
        return guide_ref().latent_from_samples(samples, *args, params=model_params, **kwargs)

    return jax.jit(run)


def _build_reverse(guide_ref, spec, corrected, sharding=None):
    """jit of ``(rng_key, index, positions, params, arrays) -> log w`` of the reverse
    chains started at ``positions`` (one chunk, all of them vectorized together), chain
    ``index[j]`` with the key ``fold_in(rng_key, index[j])``.

    Under JAX's default partitionable threefry that key is ``split(rng_key, n)[index[j]]``
    for any ``n`` above the index: the chains of :func:`annealed_sandwich`, key by key.
    The keys are derived inside the program, as the one-off chain runner splits them: with
    the keys an input instead, XLA:CPU ran two batched triangular solves of the LKJ zoo
    model concurrently, and jaxlib 0.10's LAPACK kernels, each waiting on the intra-op
    pool the other occupies, hung at 0 % CPU (2 cores; see
    :func:`~numpyro_uha.core.batching.batched_map`). With ``sharding``, the chains of the
    chunk are split over its devices (see :func:`_rows_on_devices`).
    """
    from numpyro_uha.guide import _merge_static

    def run(rng_key, index, positions, params, arrays):
        index, positions = shard_leading((index, positions), sharding)
        guide = guide_ref()
        args, kwargs = _merge_static(arrays, spec)
        annealing = guide.get_annealing_params(params)
        logdensity_fn = guide._make_logdensity(args, kwargs, guide._model_params_in(params))
        keys = jax.vmap(lambda i: jax.random.fold_in(rng_key, i))(index)

        def one(inputs):
            key, position = inputs
            _, log_w, _ = reverse_annealed_sample(
                key, logdensity_fn, annealing, position,
                num_leapfrog_steps=guide.num_leapfrog_steps, corrected=corrected,
                integrator=guide.integrator,
            )
            return log_w

        return shard_leading(batched_map(one, (keys, positions), index.shape[0]), sharding)

    return jax.jit(run)


def _rows_on_devices(program, sharding):
    """``program(rows, *rest)`` returning a host array, with the arrays of the tuple ``rows``
    (one row per chain or draw) split over ``sharding``'s devices, as the guide's draws
    are; ``rest`` must already be replicated on its mesh (``guide._on_mesh``). A chunk whose rows
    do not split evenly is filled up with copies of its first rows (computed and dropped).
    Without ``sharding``: ``program`` as it is."""
    if sharding is None:
        return lambda rows, *rest: np.asarray(program(*rows, *rest))
    shards = num_shards(sharding)

    def run(rows, *rest):
        rows = [np.asarray(r) for r in rows]
        n = rows[0].shape[0]
        pad = -n % shards
        if pad:
            rows = [np.concatenate([r, np.resize(r, (pad,) + r.shape[1:])]) for r in rows]
        return gather(program(*(put_global(r, sharding) for r in rows), *rest))[:n]

    return run



def _chain_keys(rng_key, num, params, arrays):
    """``jax.random.split(rng_key, num)``, as a host array where it can be (see
    :func:`numpyro_uha.guide._host_keys`: a key split compiled per chunk width, not per
    ``num``, under JAX's default partitionable threefry)."""
    from numpyro_uha.guide import _host_keys

    keys = _host_keys(rng_key, num, params, arrays)
    return jax.random.split(rng_key, num) if keys is None else keys


def _chunk_width(num, batch_size):
    """The width the guide's draws use for ``num`` draws at most ``batch_size`` at a time
    (:func:`numpyro_uha.guide._chunk_bucket`: one compiled program per width, whatever
    ``num``)."""
    from numpyro_uha.guide import _chunk_bucket

    return min(int(batch_size), _chunk_bucket(num))


def _in_chunks(fn, num, width, *columns):
    """``fn`` over the first ``num`` rows of ``columns`` in chunks of ``width`` rows.

    As the guide's draws do: the last chunk is filled up with copies of the first rows
    (computed and dropped), so every chunk has the same shape and ``fn`` compiles once per
    width. Returns the results joined on the host (NumPy), ``num`` rows.
    """
    num_chunks = -(-num // width)
    index = np.arange(num_chunks * width) % num
    out = [
        np.asarray(fn(*(column[index[i * width:(i + 1) * width]] for column in columns)))
        for i in range(num_chunks)
    ]
    return np.concatenate(out)[:num]


def _guide_positions(guide, params, posterior_samples, args, kwargs):
    """``posterior_samples`` (constrained, one leading draw dimension) as flat latent
    positions of shape ``(N, d)`` on the host, converted by a program compiled once per
    guide, argument structure and shapes. Also returns the split ``(arrays, spec)`` of
    ``(args, kwargs)``."""
    from numpyro_uha.guide import _split_static

    _check_guide(guide)
    if not isinstance(posterior_samples, Mapping):
        raise TypeError(
            "posterior_samples must be a dict {site name: draws} (e.g. mcmc.get_samples()), "
            f"got {type(posterior_samples).__name__}; the model's arguments come after it "
            "(sandwich(guide, key, params, posterior_samples, *args))."
        )
    arrays, spec = _split_static((args, kwargs), guide._hold_data)
    # Latent sites only (other keys, e.g. deterministic sites, play no part), as arrays:
    # latent_from_samples names missing ones.
    # by the model's own names (``x`` for a non-centered ``x_decentered``), as reference
    # draws of the model hold them
    own = [guide._model_site(name) for name in guide._init_locs]
    samples = {name: jnp.asarray(posterior_samples[name]) for name in own if name in posterior_samples}
    to_latent = _guide_program(guide, "latent", spec, _build_latent)
    positions = np.asarray(to_latent(samples, guide._model_params_in(params), arrays))
    if positions.ndim != 2:
        raise ValueError(
            "posterior_samples must have exactly one leading draw dimension; got latent "
            f"shape {positions.shape}. Flatten chains first (mcmc.get_samples() does)."
        )
    return positions, arrays, spec


def _checked_log_weights(guide, draws, args, kwargs):
    """The draws' log weights on the host; where some are not finite because the data
    are not (NaN or inf observed values, not masked out), an error naming them, not
    diverged draws blamed on the step size."""
    log_w = np.asarray(draws.log_weights, np.float64)
    bad = int(np.sum(~np.isfinite(log_w)))
    if bad:
        guide._raise_if_data_nonfinite(bad, log_w.size, args, kwargs)
    return log_w


def log_z(guide, rng_key, params, *args, num_draws: int = 1000, batch_size: int | None = None, **kwargs) -> LogZEstimate:
    """log Z estimates of a trained :class:`~numpyro_uha.UHAGuide` or any NumPyro AutoGuide.

    For a :class:`~numpyro_uha.UHALocalGuide`, log p(x_i) per data point and summed
    (:meth:`~numpyro_uha.UHALocalGuide.log_z`, a :class:`~numpyro_uha.local.LocalLogZ`);
    log p(x) of all the data is its :meth:`~numpyro_uha.UHALocalGuide.global_log_z`.

    For a UHAGuide, runs ``num_draws`` UHA chains on the model with ``*args, **kwargs``
    (the data it was trained on). For any other AutoGuide (``AutoNormal``,
    ``AutoMultivariateNormal``, ``AutoDAIS``, ...), draws ``num_draws`` times from the
    guide and takes log w = log p(x, z) - log q(z) of each draw
    (:func:`~numpyro_uha.evaluation.guide_log_weights`; for AutoDAIS its own annealed
    weight). Either way it returns the ELBO (mean log weight) and the importance-weighted
    bound log (1/N) Σ w_i, each with a standard error, the effective sample size of the
    weights, N and K (``None`` for a guide without one). A hand-written guide function has
    no model attached: use ``log_z_from_weights(guide_log_weights(key, model, guide, params,
    num_draws, *args))`` for it.

    Example::

        est = log_z(guide, random.PRNGKey(1), svi_result.params, X, y, num_draws=10_000)
        print(est)  # ELBO -111.8 ± 0.02 | IW log Z -108.9 ± 0.05 | ESS ...

    For a UHAGuide the chains are the guide's own compiled draws
    (:meth:`~numpyro_uha.UHAGuide.sample_posterior_with_log_weights`, key by key the same
    chains, at most ``batch_size`` at a time, by default the guide's
    ``sample_batch_size``): a second call, or one with another ``num_draws``, does not
    recompile.

    Diverged draws (NaN or -inf log weight) count as zero weights
    (``num_nonfinite``; see :class:`LogZEstimate`). A
    :class:`~numpyro_uha.UHAFitWarning` is emitted when the weights say the fit is poor:
    Pareto k̂ ≥ 0.7 (:func:`psis_khat`; not where no weight exceeds twice the mean
    and none diverged: then the tail fit is noise), an ELBO standard error above 1 nat
    (``ELBO_SE_BAD``), more than 10 % diverged draws, or a bound below the ELBO of the
    Gaussian q training started from (:meth:`~numpyro_uha.UHAGuide.warn_if_worse_than_start`).

    Raises:
        TypeError: if ``guide`` is not a NumPyro AutoGuide.
    """
    from numpyro_uha.evaluation.logz import _autoguide_log_z
    from numpyro_uha.guide import UHAGuide
    from numpyro_uha.local import UHALocalGuide

    if isinstance(guide, UHALocalGuide):
        # per data point (and summed): subsample_idx= picks the data points (its own
        # options and the model's keywords are checked there)
        return guide.log_z(rng_key, params, *args, num_samples=num_draws, **kwargs)
    check_model_keywords(model_of(guide), kwargs, log_z)
    if not isinstance(guide, UHAGuide):
        return _autoguide_log_z(
            guide, rng_key, params, *args, num_draws=num_draws,
            batch_size=batch_size or 1000, **kwargs,
        )
    from numpyro_uha._weights import _warn_if_poor_fit

    num_draws = _check_num_draws(num_draws)
    # The guide's own draws (the same chains, key by key): compiled once per chunk width,
    # so a second call, or one with another num_draws, does not recompile.
    draws = guide._draws(
        rng_key, params, args, kwargs, (num_draws,), with_info=False, nonfinite="keep",
        with_samples=False, batch_size=batch_size,
    )
    log_w = _checked_log_weights(guide, draws, args, kwargs)
    num_steps = int(guide.get_annealing_params(params).betas.shape[0])
    estimate = log_z_from_weights(log_w, num_steps)
    _warn_if_poor_fit(log_w, "log_z")
    guide.warn_if_worse_than_start(log_w, model_args=(args, kwargs), stacklevel=2)
    return estimate


def hais(guide, rng_key, params, *args, num_draws: int = 1000, batch_size: int | None = None, **kwargs) -> HAISResult:
    """Hamiltonian AIS with a trained guide's parameters (schedule, ε, η, Σ, q, bridges).

    Returns a :class:`HAISResult` with per-transition acceptance rates. UHA's parameters
    were tuned for the uncorrected dynamics: a low acceptance rate says UHA relies on
    steps an exact sampler would reject (large ε), which its own weights account for.

    The chains are the guide's own compiled draws with the Metropolis correction (key by
    key the chains of :func:`annealed_hais` on ``guide.get_logdensity_fn(params, *args)``),
    at most ``batch_size`` at a time (by default the guide's ``sample_batch_size``): a
    second call, or one with another ``num_draws`` at an already used chunk width, does
    not recompile.
    """
    check_model_keywords(model_of(guide), kwargs, hais)
    _check_guide(guide)
    num_draws = _check_num_draws(num_draws)
    draws = guide._draws(
        rng_key, params, args, kwargs, (num_draws,), corrected=True, with_info=True,
        nonfinite="keep", with_samples=False, batch_size=batch_size,
    )
    annealing = guide.get_annealing_params(params)
    log_w = _checked_log_weights(guide, draws, args, kwargs)
    return HAISResult(
        log_z=log_z_from_weights(log_w, int(annealing.betas.shape[0])),
        acceptance_rate=np.asarray(draws.info.accepted).mean(axis=0),
        log_weights=log_w,
        params=annealing,
    )


def sandwich(
    guide,
    rng_key,
    params,
    posterior_samples: dict,
    *args,
    num_draws: int | None = None,
    corrected: bool = False,
    batch_size: int | None = None,
    **kwargs,
) -> LogZSandwich:
    """[lower, upper] bounds on log Z from a trained guide and exact posterior draws.

    ``posterior_samples`` maps every latent site to constrained values with one leading
    draw dimension, e.g. ``mcmc.get_samples()`` from a long NUTS run. The upper bound
    assumes these are exact posterior draws (see :func:`annealed_sandwich`, whose chains
    these are, key by key, on ``guide.get_logdensity_fn(params, *args)``).

    The forward chains are the guide's own compiled draws (those of :func:`log_z` with
    the same key, for ``corrected=False``), the reverse chains a program kept per guide;
    both run at most ``batch_size`` chains at a time (by default the guide's
    ``sample_batch_size``) in chunks of a fixed width, so a second call with the same
    shapes, or one with other numbers of draws at already used widths, does not
    recompile them.
    """
    check_model_keywords(model_of(guide), kwargs, sandwich)
    positions, arrays, spec = _guide_positions(guide, params, posterior_samples, args, kwargs)
    num_reverse = _check_num_draws(positions.shape[0])
    if not np.all(np.isfinite(positions)):
        raise ValueError("posterior_samples contain NaN or inf values (or map to them).")
    num_draws = _check_num_draws(num_reverse if num_draws is None else num_draws)
    if batch_size is None:  # anything else is checked by the forward draws, below
        batch_size = guide.sample_batch_size
    key_forward, key_reverse = jax.random.split(rng_key)
    draws = guide._draws(
        key_forward, params, args, kwargs, (num_draws,), corrected=corrected, with_info=False,
        nonfinite="keep", with_samples=False, batch_size=batch_size,
    )
    annealing = guide.get_annealing_params(params)
    num_transitions = int(annealing.betas.shape[0])
    lower = log_z_from_weights(_checked_log_weights(guide, draws, args, kwargs), num_transitions)

    from numpyro_uha.guide import _on_mesh

    # the reverse chains split over the guide's devices as its draws are (keys derived
    # from the chains' indices, so the result does not depend on the device count)
    sharding = guide.sharding
    program = _guide_program(
        guide, "reverse", spec, _build_reverse, corrected=bool(corrected), sharding=sharding
    )
    key_reverse, params, arrays = _on_mesh(sharding, (key_reverse, params, arrays))
    reverse = _rows_on_devices(
        lambda index, starts, *rest: program(key_reverse, index, starts, *rest), sharding
    )
    width = _chunk_width(num_reverse, batch_size)
    width = -(-width // num_shards(sharding)) * num_shards(sharding)  # whole shards
    # a wider width this program already ran at (up to REUSE_WIDTH_RATIO times) rather
    # than a new compilation; the chains' keys come from their indices, whatever the width
    width = reuse_width(
        program, (sharding, positions.shape[1:], signature_of((params, arrays))),
        width, max(batch_size, width),
    )
    reverse_log_w = _in_chunks(
        lambda index, starts: reverse((index, starts), params, arrays),
        num_reverse, width, np.arange(num_reverse, dtype=np.uint32),
        positions.astype(np.dtype(annealing.loc.dtype)),
    ).astype(np.float64)
    return _sandwich_result(lower, reverse_log_w, num_transitions)


def extrapolate(guide, params, K: int):
    """Appendix D: a guide and params with ``K`` transitions from ones tuned at another K.

    See :meth:`numpyro_uha.UHAGuide.extrapolate`. Typical use: train at K = 64, then
    estimate log Z at K = 256::

        guide256, params256 = extrapolate(guide, result.params, 256)
        print(log_z(guide256, key, params256, X, y))
    """
    return guide.extrapolate(params, K)
