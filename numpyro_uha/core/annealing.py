"""Uncorrected Hamiltonian Annealing (UHA) and its Metropolis-corrected twin (HAIS).

One draw runs K annealing transitions (paper Algorithms 3-4, with Algorithm 5's
estimator). Transition m targets the bridging density

    π_m(z) = q_ψ(β_m)(z)^(1-β_m) · p̄(z)^(β_m),        0 < β_1 < ... < β_K < 1,

and consists of a partial momentum refresh ρ' = η ρ + sqrt(1-η²) ξ, ξ ~ N(0, Σ),
followed by L leapfrog steps of size ε_m (velocity Verlet, kick-drift-kick, or position
Verlet, drift-kick-drift: ``integrator``; see ``integrators.py``). The momentum flip of
Algorithm 3 step 3 undoes the flip that makes the leapfrog self-inverse, so neither is
carried out.

With K transitions there are K bridging densities, the paper's "K" (bridging densities
plus one) is K + 1, and L = 1 costs K + 1 target gradients with velocity Verlet, or K
gradients and K + 1 values with position Verlet.

The UHA log weight (paper eq. 13) is

    log w = log p̄(z_{K+1}) - log q(z_1) + Σ_m [log S(ρ_{m+1}) - log S(ρ'_m)],

an unbiased estimate of Z after exponentiation for *any* parameter values, and a
reparameterized, differentiable lower bound on log Z in expectation.

With ``corrected=True`` each transition ends with the Metropolis accept/reject step of
Algorithm 1 and the weight is the Hamiltonian AIS weight (Algorithm 6),

    log w = log p̄(z_{K+1}) - log q(z_1) + Σ_m [log π_m(z_m) - log π_m(z_{m+1})],

which is also unbiased but not differentiable.
"""

from __future__ import annotations

import operator
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.scipy.linalg import solve_triangular

from numpyro_uha.core.gaussian import (
    bridge_gaussian_parts,
    gaussian_logpdf,
    gaussian_logpdf_of_draw,
    gaussian_sample,
)
from numpyro_uha.core.integrators import (
    IntegratorState,
    drift_kick_drift,
    kinetic_log_density,
    leapfrog,
)

__all__ = [
    "AnnealingParams",
    "AnnealingInfo",
    "make_params",
    "annealed_sample",
    "uha_sample",
    "hais_sample",
    "reverse_annealed_sample",
    "annealed_sample_rows",
    "reverse_annealed_sample_rows",
    "uha_sample_rows",
    "hais_sample_rows",
]

LogDensityFn = Callable[[jax.Array], jax.Array]

#: The leapfrog orders ``annealed_sample`` can use.
INTEGRATORS = ("velocity_verlet", "position_verlet")

#: A leapfrog step whose energy error exceeds this many nats has diverged (NUTS's rule).
DIVERGENCE_ENERGY = 1000.0

#: With ``deferred_diagnostics``, a chain is checked step by step against
#: ``DIVERGENCE_ENERGY`` only where some transition's kinetic increment exceeds
#: this many nats, or its last transition's energy error exceeds DIVERGENCE_ENERGY, or
#: its log weight is not finite (see :func:`annealed_sample`).
KINETIC_SCREEN = 100.0


def divergence_rule(log_weight, log_accept_ratio, axis=-1):
    """NUTS's rule per chain: a non-finite log weight, or a leapfrog step (along
    ``axis`` of ``log_accept_ratio``) whose energy error exceeds ``DIVERGENCE_ENERGY``."""
    return ~jnp.isfinite(log_weight) | jnp.any(
        jnp.abs(log_accept_ratio) > DIVERGENCE_ENERGY, axis=axis
    )


class AnnealingParams(NamedTuple):
    """Every quantity that defines the annealed proposal, as constrained values.

    Taking q's parameters as plain inputs lets an encoder produce them (amortized use,
    one chain per data point under ``vmap``).

    Attributes:
        loc: μ, mean of the initial Gaussian q, shape ``(d,)``.
        scale: q's standard deviations (shape ``(d,)``) or lower-triangular Cholesky
            factor of its covariance (shape ``(d, d)``; entries above the diagonal are
            ignored, by the draws and the densities alike, so training the whole matrix
            keeps the weights valid).
        betas: β_1..β_K, the bridging coefficients, strictly increasing in (0, 1),
            shape ``(K,)``; β_0 = 0 and β_{K+1} = 1 are implicit.
        step_sizes: ε_m used in transition m, positive, shape ``(K,)``.
        damping: η in [0, 1), momentum persistence of the partial refresh.
        momentum_scale: sqrt(diag Σ), the momentum distribution's scales, shape ``(d,)``.
        bridge_loc_slope: ψ's mean slope; q_ψ(β) has mean ``loc + β · bridge_loc_slope``.
        bridge_log_scale_slope: ψ's scale slope; q_ψ(β) has scale
            ``exp(β · bridge_log_scale_slope) · scale``.
        drift_scale: δ, positive, shape ``(d,)``: a per-coordinate factor on the step
            size, so coordinate i drifts and is kicked with the step ε_m δ_i
            (z += ε δ Σ⁻¹ ρ, ρ += ε δ ∇ log π_m); the leapfrog then still conserves the
            energy −log π_m + ½ ρᵀ Σ⁻¹ ρ that the weight and the Metropolis test use, to
            second order (see ``integrators.py``). ``None`` (the default) means 1.
        force_limit: L, positive, shape ``(d,)``, or ``None`` (the default: no limit).
            The kick uses the force L ⊙ tanh(∇ log π_m / L) instead of ∇ log π_m: equal
            to it where |∇ log π_m| ≪ L, bounded by L everywhere. A kick by *any* force
            that depends on the position only is a shear, so the leapfrog keeps its unit
            Jacobian and reversibility, and the UHA weight (which uses no bridging
            density) stays exact: the bound and E[w] = Z hold for every L. What L buys:
            a draw in q's far tails, where the gradient is huge (an exp link, a
            hierarchical scale near 0), can no longer be thrown to infinity in a few
            steps; its momentum grows at most linearly and its weight is finite (and
            small), so training sees it instead of a NaN.
        mass_factor: P, a lower-triangular ``(d, d)`` matrix (entries above the diagonal
            are ignored), or ``None`` (the default: the chain moves in z itself). The
            chain then moves in the coordinates u = P⁻¹ z: the momentum, its refresh,
            ``momentum_scale``, ``drift_scale``, ``force_limit`` and the step sizes are
            those of u, and the target and the bridges are pulled back to u exactly
            (log p̄(P u), and q mapped by P⁻¹), so that the draws, q and the log weight
            are those of z. This is the leapfrog with the dense mass
            matrix M = P⁻ᵀ diag(momentum_scale²) P⁻¹: with P a Cholesky factor of
            the posterior's covariance (e.g. q's), every direction moves at the same
            speed, where a diagonal mass on a posterior correlated near ±1 needs steps
            as small as its narrowest direction. The bridge q_ψ(β) is then defined in
            u: mean P⁻¹ (loc + β · bridge_loc_slope), Cholesky factor
            diag(exp(β · bridge_log_scale_slope)) · P⁻¹ L (u's rows scaled, not z's: on
            a posterior correlated near ±1, scaling a row of z's factor by 1 % moves the
            bridge off the ridge by many of its widths). Single chains only (not
            ``*_rows``).
    """

    loc: jax.Array
    scale: jax.Array
    betas: jax.Array
    step_sizes: jax.Array
    damping: jax.Array
    momentum_scale: jax.Array
    bridge_loc_slope: jax.Array
    bridge_log_scale_slope: jax.Array
    drift_scale: jax.Array | None = None
    force_limit: jax.Array | None = None
    mass_factor: jax.Array | None = None


class AnnealingInfo(NamedTuple):
    """Per-draw diagnostics. Arrays with a leading ``K`` are per transition.

    Attributes:
        initial_position: z_1 ~ q.
        log_q_initial: log q(z_1).
        target_logdensity: log p̄(z_{m+1}) after transition m, shape ``(K,)``.
        momentum_log_ratio: log S(ρ_{m+1}) - log S(ρ'_m), the UHA increments, ``(K,)``.
        log_accept_ratio: log π_m(z'', ρ'') - log π_m(z_m, ρ'_m), the energy error of the
            leapfrog proposal; exp(min(0, ·)) is the acceptance probability the
            Metropolis-corrected transition would have, ``(K,)``.
        accepted: whether the proposal was taken (always True when uncorrected), ``(K,)``.
        log_weight_increments: the terms summed into the log weight, ``(K,)``.
        diverged: whether the chain diverged (its log weight is not finite, or some
            leapfrog step's energy error exceeds ``DIVERGENCE_ENERGY`` nats), no
            gradient; computed by ``deferred_diagnostics`` chains only, else ``None``.
    """

    initial_position: jax.Array
    log_q_initial: jax.Array
    target_logdensity: jax.Array
    momentum_log_ratio: jax.Array
    log_accept_ratio: jax.Array
    accepted: jax.Array
    log_weight_increments: jax.Array
    diverged: jax.Array | None = None


def make_params(
    loc: jax.Array,
    scale: jax.Array,
    *,
    num_transitions: int | None = None,
    betas: jax.Array | None = None,
    step_size: float | jax.Array = 0.1,
    damping: float | jax.Array = 0.9,
    momentum_scale: jax.Array | None = None,
    bridge_loc_slope: jax.Array | None = None,
    bridge_log_scale_slope: jax.Array | None = None,
    drift_scale: jax.Array | None = None,
    force_limit: jax.Array | None = None,
    mass_factor: jax.Array | None = None,
) -> AnnealingParams:
    """Build :class:`AnnealingParams` with the plain defaults filled in.

    Defaults: linear schedule β_m = m / (K + 1), identity momentum covariance, no
    bridge slopes (q_ψ(β) = q) and no drift scale (δ = 1). A scalar ``step_size`` is used
    for every transition.
    """
    loc = jnp.asarray(loc)
    loc = loc.astype(jnp.result_type(float, loc.dtype))  # integers and lists: floats
    if loc.ndim < 1:
        raise ValueError(f"make_params: loc must have shape (d,) (or (B, d)), got {loc.shape}.")
    dim = loc.shape[-1]
    if betas is None:
        if num_transitions is None:
            raise ValueError("make_params needs either `betas` or `num_transitions`.")
        try:  # a Python, NumPy or concrete JAX integer
            count = None if isinstance(num_transitions, bool) else operator.index(num_transitions)
        except TypeError:
            count = None
        if count is None or count < 0:
            raise ValueError(
                f"make_params: num_transitions must be an integer ≥ 0, got {num_transitions!r}."
            )
        num_transitions = count
        betas = jnp.arange(1, num_transitions + 1) / (num_transitions + 1)
    betas = jnp.asarray(betas, dtype=loc.dtype)
    zeros = jnp.zeros(dim, loc.dtype)
    scale = jnp.asarray(scale, loc.dtype)
    if scale.ndim < 1 or scale.shape[-1] != dim:
        raise ValueError(
            f"make_params: scale must have shape (d,) (sds) or (d, d) (a lower Cholesky "
            f"factor) with d = {dim} (loc's), got {scale.shape}."
        )

    def vector(name, value, default):
        # the model's dtype (a float64 NumPy array under x64 would change a float32
        # chain's carried types); d entries, named where not
        if value is None:
            return default
        value = jnp.asarray(value, loc.dtype)
        if value.ndim == 0:  # one value for every coordinate
            value = jnp.broadcast_to(value, (dim,))
        if value.shape[-1] != dim:
            raise ValueError(
                f"make_params: {name} must have {dim} entries (loc's d) on its last axis, "
                f"got shape {value.shape}."
            )
        return value

    damping = jnp.asarray(damping, loc.dtype)
    if not isinstance(damping, jax.core.Tracer) and not np.all(
        (np.asarray(damping) >= 0) & (np.asarray(damping) <= 1)
    ):
        raise ValueError(f"make_params: damping (η) must be in [0, 1], got {damping}.")
    if mass_factor is not None:
        mass_factor = jnp.asarray(mass_factor, loc.dtype)
        if mass_factor.shape != (dim, dim):
            raise ValueError(
                f"make_params: mass_factor must be a lower-triangular matrix of shape "
                f"({dim}, {dim}) (loc's d), got shape {mass_factor.shape}."
            )
    return AnnealingParams(
        loc=loc,
        scale=scale,
        betas=betas,
        step_sizes=jnp.broadcast_to(jnp.asarray(step_size, loc.dtype), betas.shape),
        damping=damping,
        momentum_scale=vector("momentum_scale", momentum_scale, jnp.ones(dim, loc.dtype)),
        bridge_loc_slope=vector("bridge_loc_slope", bridge_loc_slope, zeros),
        bridge_log_scale_slope=vector("bridge_log_scale_slope", bridge_log_scale_slope, zeros),
        drift_scale=vector("drift_scale", drift_scale, None),
        force_limit=vector("force_limit", force_limit, None),
        mass_factor=mass_factor,
    )


def annealed_sample(
    rng_key: jax.Array,
    logdensity_fn: LogDensityFn,
    params: AnnealingParams,
    *,
    num_leapfrog_steps: int = 1,
    corrected: bool = False,
    remat: bool = False,
    integrator: str = "velocity_verlet",
    deferred_diagnostics: bool = False,
) -> tuple[jax.Array, jax.Array, AnnealingInfo]:
    """One annealed draw: ``(z_{K+1}, log w, info)``.

    Args:
        rng_key: JAX PRNG key.
        logdensity_fn: z ↦ log p̄(z) for a flat ``z`` of shape ``(d,)``.
        params: :class:`AnnealingParams`.
        num_leapfrog_steps: L, leapfrog steps per transition (static). L = 1 is
            under-damped Langevin dynamics, the paper's setting.
        corrected: add the Metropolis accept/reject step (Hamiltonian AIS) and use its
            weight. The result is then not differentiable in the parameters: JAX
            still returns a gradient (through the accepted moves, not the accept/reject
            choice), which is not the weight's; do not train on it (:func:`hais_sample`
            stops it).
        remat: rematerialize each transition in the backward pass (``jax.checkpoint``),
            so reverse-mode memory no longer grows with the model's intermediates times
            K; costs about one extra forward pass.
        integrator: ``"velocity_verlet"`` (kick-drift-kick) or ``"position_verlet"``
            (drift-kick-drift), see ``integrators.py``. Both give a valid weight.
        deferred_diagnostics: for position Verlet without correction, whose
            transitions need no value of log p̄: evaluate the per-transition
            ``info.target_logdensity`` (and the ``log_accept_ratio`` made from it) after
            the chain, one position after another (``jax.lax.map``), and fill
            ``info.diverged`` at the cost of one more evaluation of log p̄ where the
            chain is calm. A chain is checked step by step only where a transition's
            kinetic increment |log S(ρ'') − log S(ρ')| exceeds ``KINETIC_SCREEN``
            (100) nats, its last transition's energy error exceeds
            ``DIVERGENCE_ENERGY`` or its log weight is not finite: the weight and its
            gradient depend on the chain through the kicks (the kinetic increments) and
            the last position's log p̄ only, so a blow-up that could reach them shows
            there. Under ``jax.vmap`` the step-by-step check runs for every chain of the
            batch where one chain needs it (and for none otherwise). Where nothing reads
            the per-transition values (training), XLA drops them and a calm chain costs
            K target gradients and two values. No effect with velocity Verlet or
            ``corrected`` (their transitions evaluate log p̄ anyway). Keeps the K
            positions of the chain (K·d numbers; with ``remat``, whose memory they
            would grow by about a sixth on madelon, leave it off).

    Returns:
        The final position, the log importance weight and :class:`AnnealingInfo`.
        The function is pure and safe under ``jit``, ``vmap`` and ``grad``.
    """
    dim, num_transitions = params.loc.shape[-1], params.betas.shape[-1]
    noise = _forward_noise(rng_key, dim, num_transitions, params.loc.dtype)
    return _forward(
        noise, logdensity_fn, params, num_leapfrog_steps, corrected, remat, integrator,
        deferred=deferred_diagnostics,
    )


def annealed_sample_rows(
    rng_keys: jax.Array,
    logdensity_fn: LogDensityFn,
    params: AnnealingParams,
    *,
    num_leapfrog_steps: int = 1,
    corrected: bool = False,
    remat: bool = False,
    integrator: str = "velocity_verlet",
    deferred_diagnostics: bool = False,
) -> tuple[jax.Array, jax.Array, AnnealingInfo]:
    """B independent annealed draws, one per row, for a target that factorizes over rows.

    For local latent variables: row i is data point i's latent z_i, its target is
    log p̄_i(z_i) (e.g. log p(x_i, z_i | globals)), and ``logdensity_fn`` evaluates all of
    them at once, ``Z ↦ (log p̄_1(Z[0]), ..., log p̄_B(Z[B-1]))``, so that a model that is
    written for a batch (a NumPyro plate) is evaluated once per step, not once per row.
    Row i's chain is exactly :func:`annealed_sample` with key ``rng_keys[i]`` on
    ``log p̄_i`` and the parameters' row i (same random numbers, same arithmetic).

    Args:
        rng_keys: one PRNG key per row, shape ``(B,)`` (typed keys) or ``(B, 2)``.
        logdensity_fn: ``(B, d) ↦ (B,)``; value ``i`` may depend on row ``i`` only (the
            gradient of the sum is taken as the rows' gradients, which is only right
            then).
        params: :class:`AnnealingParams` with a mean-field q: ``loc`` and ``scale`` of
            shape ``(B, d)``; every other field either shared by the rows (the shape
            :func:`annealed_sample` takes) or per row, with a leading ``B`` axis
            (``betas``/``step_sizes`` ``(B, K)``, ``damping`` ``(B,)``, vectors
            ``(B, d)``).
        num_leapfrog_steps: as in :func:`annealed_sample`.
        corrected: as in :func:`annealed_sample`.
        remat: as in :func:`annealed_sample`.
        integrator: as in :func:`annealed_sample`.
        deferred_diagnostics: as in :func:`annealed_sample`; ``info.diverged`` is then
            one flag per row, and the rows are checked step by step (all of them, one
            transition at a time) where one row is not calm.

    Returns:
        ``(Z_{K+1}, log w, info)`` with a leading ``B`` axis on every array (``info``'s
        per-transition arrays are ``(B, K)``): the rows' log weights, not their sum.
    """
    params = _rows_params(params, rng_keys)
    dim, num_transitions = params.loc.shape[-1], params.betas.shape[-1]
    noise = jax.vmap(lambda key: _forward_noise(key, dim, num_transitions, params.loc.dtype))(
        rng_keys
    )
    z, log_weight, info = _forward(
        _steps_first(noise), logdensity_fn, params, num_leapfrog_steps, corrected, remat,
        integrator, deferred=deferred_diagnostics,
    )
    return z, log_weight, _rows_info(info)


def _rows_params(params, rng_keys):
    """Check a rows call's parameters; per-row schedules move their K axis first."""
    num_rows = jnp.shape(rng_keys)[0]
    if jnp.ndim(params.scale) != 2 or jnp.shape(params.scale) != jnp.shape(params.loc):
        raise ValueError(
            "annealed_sample_rows needs a mean-field q per row: loc and scale of shape (B, d), "
            f"got loc {jnp.shape(params.loc)} and scale {jnp.shape(params.scale)}."
        )
    if params.mass_factor is not None:
        raise ValueError(
            "annealed_sample_rows: mass_factor is for single chains (a full-rank q); the "
            "rows' chains take a diagonal momentum_scale per row instead."
        )
    if params.loc.shape[0] != num_rows:
        raise ValueError(
            f"annealed_sample_rows: {num_rows} keys for {params.loc.shape[0]} rows of loc."
        )
    damping = jnp.asarray(params.damping)
    if damping.ndim == 1:  # one η per row, broadcast against the rows' momenta
        damping = damping[:, None]
    return params._replace(damping=damping)


def _steps_first(noise):
    """Per-row noises ``(B, K, ...)`` → ``(K, B, ...)`` for the scan over transitions."""
    *first, refresh, uniforms = noise
    return (*first, jnp.swapaxes(refresh, 0, 1), jnp.swapaxes(uniforms, 0, 1))


def _rows_info(info):
    """``AnnealingInfo`` with per-transition arrays ``(K, B)`` → ``(B, K)``."""
    return AnnealingInfo(
        info.initial_position, info.log_q_initial,
        *(jnp.swapaxes(x, 0, 1) for x in info[2:7]), info.diverged,
    )


def _forward_noise(rng_key, dim, num_transitions, dtype):
    """Every random number of one forward chain, from its key (the streams never change)."""
    _, key_momentum, key_refresh, key_accept = jax.random.split(rng_key, 4)
    return (
        _start_noise(rng_key, dim, dtype),
        *_transition_noise(key_momentum, key_refresh, key_accept, dim, num_transitions, dtype),
    )


def _start_noise(rng_key, dim, dtype):
    """The noise of a chain's start z₁ = loc + scale · noise, from the chain's key (the
    first of its four streams)."""
    return jax.random.normal(jax.random.split(rng_key, 4)[0], (dim,), dtype)


def _transition_noise(key_momentum, key_refresh, key_accept, dim, num_transitions, dtype):
    """The first momentum's noise, the K refresh noises and the K Metropolis uniforms.

    The refresh noises of all K transitions are drawn at once: in a rough (noisy) CPU
    timing one vectorized draw was cheaper than K small ones inside the loop; it costs K·d
    floats per chain, no more than the residuals reverse mode keeps anyway.
    """
    return (
        jax.random.normal(key_momentum, (dim,), dtype),
        jax.random.normal(key_refresh, (num_transitions, dim), dtype),
        jax.random.uniform(key_accept, (num_transitions,), dtype),
    )


def _forward(
    noise, logdensity_fn, params, num_leapfrog_steps, corrected, remat, integrator,
    deferred=False,
):
    """The forward chain from its random numbers; every array may carry leading row axes.

    ``deferred``: see ``annealed_sample``'s ``deferred_diagnostics``."""
    init_noise, momentum_noise, refresh_noises, uniforms = noise
    loc, scale = params.loc, params.scale
    z_init = gaussian_sample(init_noise, loc, scale)
    log_q_initial = gaussian_logpdf_of_draw(init_noise, loc, scale)
    check_integrator(integrator)
    deferred = deferred and integrator == "position_verlet" and not corrected
    # with a mass factor P the chain moves u = P⁻¹ z (its target log p̄(P u)); the draws,
    # q and the weight stay those of z (AnnealingParams.mass_factor)
    logdensity_fn, factor = _mass_coordinates(logdensity_fn, params)
    start = z_init if factor is None else _to_mass(factor, z_init)
    momentum, move, refresh, steps = _chain_parts(
        logdensity_fn, params, (momentum_noise, refresh_noises, uniforms),
        num_leapfrog_steps, corrected, integrator, deferred=deferred,
    )
    if deferred:  # nothing in the chain reads log p̄: a placeholder in the state
        batch = jnp.shape(z_init)[:-1]
        state = IntegratorState(start, momentum, jnp.zeros(batch, z_init.dtype), None)
    else:
        state = _initial_state(logdensity_fn, start, momentum, integrator)

    def transition(state, step):
        beta, step_size, noise, uniform = step
        return move(refresh(state, noise), beta, step_size, uniform)

    if remat:
        transition = jax.checkpoint(transition, prevent_cse=False)
    final_state, per_step = jax.lax.scan(transition, state, steps)
    final_logdensity = final_state.target_logdensity
    if integrator == "position_verlet" and not corrected:
        # Evaluated afresh so that nothing outside the scan reads the carried value: when
        # the per-transition diagnostics are not used either, XLA then drops the K
        # evaluations of log p̄ that only they need. With them the SVI step on madelon
        # (d = 501, K = 32) costs 145 MFLOP, without them 112 (compiled cost analysis),
        # and every transition costs one target gradient and no more.
        final_logdensity = logdensity_fn(final_state.position)
    # (a deferred chain's last output is its momentum log ratios, its increments too)
    log_weight = final_logdensity - log_q_initial + jnp.sum(per_step[-1], axis=0)
    diverged = None
    if deferred:
        per_step, diverged = _deferred_diagnostics(
            logdensity_fn, start, log_weight, final_logdensity, steps[0], per_step
        )
    info = AnnealingInfo(z_init, log_q_initial, *per_step, diverged)
    return _from_mass(factor, final_state.position), log_weight, info


def _mass_coordinates(logdensity_fn, params):
    """``(u ↦ log p̄(P u), P)`` for a chain with a mass factor P (lower triangle), else
    ``(logdensity_fn, None)``."""
    if params.mass_factor is None:
        return logdensity_fn, None
    factor = jnp.tril(params.mass_factor)
    return (lambda u: logdensity_fn(_from_mass(factor, u))), factor


def _from_mass(factor, u):
    """z = P u (``u`` itself where ``factor`` is None), for ``u`` of shape ``(..., d)``."""
    return u if factor is None else u @ factor.T


def _to_mass(factor, z):
    """u = P⁻¹ z by a triangular solve, for ``z`` of shape ``(..., d)``."""
    flat = jnp.reshape(z, (-1, z.shape[-1]))
    return jnp.reshape(solve_triangular(factor, flat.T, lower=True).T, z.shape)


def _deferred_diagnostics(logdensity_fn, z_init, log_weight, final_logdensity, betas, moved):
    """A deferred chain's per-transition diagnostics (:func:`_make_move`'s ``step_info``)
    and its divergence flag, from the scan's outputs ``(z_{m+1}, log q_m at the
    transition's start and end, momentum log ratio)``; per-transition arrays have the
    transitions' axis first (``(K,)``, or ``(K, B)`` for rows)."""
    positions, gaussian_start, gaussian_end, momentum_log_ratio = moved
    starts = jnp.concatenate([z_init[None], positions[:-1]], axis=0)
    # β_m against per-row values (K, B) where the rows share one schedule
    betas = jnp.reshape(
        betas, jnp.shape(betas) + (1,) * (jnp.ndim(gaussian_start) - jnp.ndim(betas))
    )

    def energy_errors(start_logdensity, end_logdensity, at=slice(None)):
        """Transitions ``at``'s energy errors, from log p̄ at their starts and ends."""
        beta = betas[at]
        log_pi_start = (1.0 - beta) * gaussian_start[at] + beta * start_logdensity
        log_pi_end = (1.0 - beta) * gaussian_end[at] + beta * end_logdensity
        return log_pi_end - log_pi_start + momentum_log_ratio[at]

    def per_transition(starts, final_logdensity):
        start_logdensity = jax.lax.map(logdensity_fn, starts)
        end_logdensity = jnp.concatenate(
            [start_logdensity[1:], jnp.expand_dims(final_logdensity, 0)], axis=0
        )
        return end_logdensity, energy_errors(start_logdensity, end_logdensity)

    target_logdensity, log_accept_ratio = per_transition(starts, final_logdensity)
    accepted = jnp.ones(jnp.shape(log_accept_ratio), bool)
    per_step = (
        target_logdensity, momentum_log_ratio, log_accept_ratio, accepted, momentum_log_ratio
    )

    # The divergence flag, without the K values where the chain is calm.
    stop = jax.lax.stop_gradient
    last_error = energy_errors(logdensity_fn(stop(starts[-1])), final_logdensity, at=-1)
    calm = (
        jnp.all(jnp.abs(momentum_log_ratio) <= KINETIC_SCREEN, axis=0)
        & (jnp.abs(last_error) <= DIVERGENCE_ENERGY)
        & jnp.isfinite(log_weight)
    )

    def stepwise(starts, final_logdensity, log_weight):
        return divergence_rule(log_weight, per_transition(starts, final_logdensity)[1], axis=0)

    operands = jax.tree.map(stop, (starts, final_logdensity, log_weight))
    diverged = _unless_all(stop(calm), stepwise, operands)
    return per_step, diverged


def _unless_all(calm, fn, operands):
    """``fn(*operands)`` where some ``calm`` is False, else all False (``fn``'s output
    is boolean and shaped like ``calm``): a ``lax.cond`` on ``any(~calm)``, which stays
    one under ``jax.vmap``: the batched predicate is reduced over the batch, so ``fn``
    runs, batched, for every member where one needs it, and for none otherwise. ``fn``'s
    closure (the model's data and parameters, traced under ``jit`` or ``grad``) is passed
    as arguments; no gradient flows through (the inputs are not differentiated)."""
    # Every closed-over value (integer data included, e.g. a minibatch's indices) becomes
    # an argument: a tracer of the enclosing trace may not be a constant of custom_vmap's.
    traced = jax.make_jaxpr(fn)(*operands)
    consts = [jax.lax.stop_gradient(c) for c in traced.consts]

    def closed(*args):
        return jax.core.eval_jaxpr(traced.jaxpr, args[len(operands):], *args[: len(operands)])[0]

    @custom_vmap
    def run(calm, operands, consts):
        return jax.lax.cond(
            jnp.all(calm),
            lambda: jnp.zeros(jnp.shape(calm), bool),
            lambda: closed(*operands, *consts),
        )

    @run.def_vmap
    def run_batched(axis_size, in_batched, calm, operands, consts):
        calm_batched, operands_batched, consts_batched = in_batched
        axes = jax.tree.map(lambda b: 0 if b else None, (operands_batched, consts_batched))
        if not calm_batched:
            calm = jnp.broadcast_to(calm, (axis_size,) + jnp.shape(calm))

        def checked():
            return jax.vmap(
                lambda ops, cs: closed(*ops, *cs), in_axes=axes, axis_size=axis_size
            )(operands, consts)

        result = jax.lax.cond(
            jnp.all(calm), lambda: jnp.zeros(jnp.shape(calm), bool), checked
        )
        return result, True

    return run(calm, tuple(operands), consts)


def check_integrator(integrator):
    """Raise a ``ValueError`` naming the choices unless ``integrator`` is one of :data:`INTEGRATORS`."""
    if integrator not in INTEGRATORS:
        raise ValueError(f"integrator must be one of {INTEGRATORS}, got {integrator!r}.")


def _value_and_grad(logdensity_fn):
    """z ↦ (log p̄(z), ∇ log p̄(z)), for one chain or for rows (the gradient of the sum)."""

    def total(z):
        value = logdensity_fn(z)
        return jnp.sum(value), value

    def value_and_grad(z):
        (_, value), grad = jax.value_and_grad(total, has_aux=True)(z)
        return value, grad

    return value_and_grad


def _grad(logdensity_fn):
    """z ↦ ∇ log p̄(z), for one chain or for rows (the gradient of the sum)."""
    return jax.grad(lambda z: jnp.sum(logdensity_fn(z)))


def _initial_state(logdensity_fn, position, momentum, integrator):
    """The integrator state at ``position``: position Verlet needs no gradient there."""
    check_integrator(integrator)
    if integrator == "position_verlet":
        state = IntegratorState(position, momentum, logdensity_fn(position), None)
    else:
        state = IntegratorState(position, momentum, *_value_and_grad(logdensity_fn)(position))
    _check_logdensity_shape(state.target_logdensity, position)
    return state


def _check_logdensity_shape(value, position):
    """A clear error unless ``logdensity_fn`` gave one value per chain: a scalar for a
    position ``(d,)``, ``(B,)`` for rows ``(B, d)`` (static shapes: free under jit). A
    vector of per-coordinate terms would otherwise be carried into a vector of "log
    weights", each of them wrong."""
    expected = jnp.shape(position)[:-1]
    if jnp.shape(value) != expected:
        what = (
            "a scalar for a position z of shape (d,) (sum the model's terms)" if not expected
            else f"shape {expected} for rows of shape (B, d) = {jnp.shape(position)}, one "
            "value per row (not summed over the rows)"
        )
        raise ValueError(
            f"logdensity_fn must return {what}; it returned shape {jnp.shape(value)}."
        )


def _chain_parts(
    logdensity_fn, params, noise, num_leapfrog_steps, corrected, integrator, deferred=False,
):
    """What the forward and the reverse sampler share: ``(momentum, move, refresh, steps)``.

    ``noise`` is ``(momentum noise, refresh noises, uniforms)`` (:func:`_transition_noise`;
    for rows, already with the transitions' axis first). ``momentum`` is the first
    momentum, ρ ~ N(0, Σ); ``move`` the leapfrog part of a transition
    (:func:`_make_move`); ``refresh(state, noise)`` the partial momentum refresh
    ρ ← η ρ + sqrt(1 − η²) Σ^(1/2) ξ; ``steps`` the scanned inputs (β_m, ε_m, ξ_m, u_m),
    each with the transitions' axis first (a per-row schedule ``(B, K)`` is transposed).
    """
    momentum_noise, noises, uniforms = noise
    damping, momentum_scale = params.damping, params.momentum_scale
    momentum = momentum_scale * momentum_noise
    move = _make_move(
        logdensity_fn, params, num_leapfrog_steps, corrected, integrator, deferred
    )
    refresh_scale = jnp.sqrt(1.0 - damping**2) * momentum_scale

    def refresh(state, noise):
        return state._replace(momentum=damping * state.momentum + refresh_scale * noise)

    betas, step_sizes = params.betas, params.step_sizes
    if jnp.ndim(betas) == 2:
        betas = betas.T
    if jnp.ndim(step_sizes) == 2:
        step_sizes = step_sizes.T
    return momentum, move, refresh, (betas, step_sizes, noises, uniforms)


def _make_move(
    logdensity_fn, params, num_leapfrog_steps, corrected, integrator, deferred=False
):
    """The deterministic (or Metropolis-corrected) part of transition m.

    ``move(start, β_m, ε_m, u)`` runs the leapfrog for π_m from ``start`` (whose momentum
    was already refreshed) and returns the new state and the per-step diagnostics
    ``(log p̄ at the new position, momentum log ratio, log acceptance ratio, accepted,
    weight increment)``. The forward sampler refreshes then moves; the reverse sampler
    moves then refreshes. β_m, ε_m and u are scalars for one chain, or one per row.
    ``deferred`` (position Verlet, uncorrected): log p̄ is not evaluated; the move
    returns ``(z'', log q_m(z), log q_m(z''), momentum log ratio)`` instead (for
    :func:`_deferred_diagnostics`) and leaves the state's log p̄ as it was.
    """
    loc, scale, momentum_scale, drift_scale = (
        params.loc, params.scale, params.momentum_scale, params.drift_scale
    )
    force_limit = params.force_limit
    loc_slope, log_scale_slope = params.bridge_loc_slope, params.bridge_log_scale_slope
    value_and_grad = _value_and_grad(logdensity_fn)
    target_grad = _grad(logdensity_fn)

    if params.mass_factor is not None:
        # the chain's coordinates u = P⁻¹ z: q = N(P⁻¹ m, (P⁻¹ L)(P⁻¹ L)ᵀ), P⁻¹ L lower
        # triangular; the bridge's slopes act there (AnnealingParams.mass_factor)
        factor = jnp.tril(params.mass_factor)
        full = scale if jnp.ndim(scale) == 2 else jnp.diag(scale)
        loc, loc_slope = _to_mass(factor, loc), _to_mass(factor, loc_slope)
        scale = solve_triangular(factor, jnp.tril(full), lower=True)

    bridge_parts = bridge_gaussian_parts(loc, scale, loc_slope, log_scale_slope)

    def move(start, beta, step_size, uniform):
        bridge_logpdf, bridge_grad_logpdf = bridge_parts(beta)
        # per-chain scalars against (..., d) vectors
        beta_v, step_v = jnp.expand_dims(beta, -1), jnp.expand_dims(step_size, -1)

        def bridge_grad(z, grad_target):
            force = (1.0 - beta_v) * bridge_grad_logpdf(z) + beta_v * grad_target
            if force_limit is None:
                return force
            return force_limit * jnp.tanh(force / force_limit)

        def bridge_logdensity(z, logdensity_target):
            return (1.0 - beta) * bridge_logpdf(z) + beta * logdensity_target

        if integrator == "position_verlet":
            z, rho = drift_kick_drift(
                start.position, start.momentum, step_v, momentum_scale, target_grad,
                bridge_grad, num_leapfrog_steps, drift_scale,
            )
            if deferred:
                momentum_log_ratio = kinetic_log_density(
                    rho, momentum_scale
                ) - kinetic_log_density(start.momentum, momentum_scale)
                return start._replace(position=z, momentum=rho), (
                    z,
                    bridge_logpdf(start.position),
                    bridge_logpdf(z),
                    momentum_log_ratio,
                )
            proposal = IntegratorState(z, rho, logdensity_fn(z), None)
        else:
            proposal = leapfrog(
                start, step_v, momentum_scale, value_and_grad, bridge_grad,
                num_leapfrog_steps, drift_scale,
            )
        momentum_log_ratio = kinetic_log_density(
            proposal.momentum, momentum_scale
        ) - kinetic_log_density(start.momentum, momentum_scale)
        log_pi_start = bridge_logdensity(start.position, start.target_logdensity)
        log_pi_proposal = bridge_logdensity(proposal.position, proposal.target_logdensity)
        log_accept_ratio = log_pi_proposal - log_pi_start + momentum_log_ratio

        if corrected:
            # A NaN ratio compares False, so a diverged proposal is rejected.
            accepted = jnp.log(uniform) < log_accept_ratio
            rejected = start._replace(momentum=-start.momentum)
            new_state = jax.tree.map(
                lambda a, b: jnp.where(_against(accepted, a), a, b), proposal, rejected
            )
            increment = jnp.where(accepted, log_pi_start - log_pi_proposal, 0.0)
        else:
            accepted = jnp.ones(jnp.shape(log_accept_ratio), bool)
            new_state = proposal
            increment = momentum_log_ratio
        step_info = (
            new_state.target_logdensity,
            momentum_log_ratio,
            log_accept_ratio,
            accepted,
            increment,
        )
        return new_state, step_info

    return move


def _against(flag, leaf):
    """A per-chain flag with trailing axes added to broadcast against ``leaf``."""
    return jnp.reshape(flag, jnp.shape(flag) + (1,) * (jnp.ndim(leaf) - jnp.ndim(flag)))


def reverse_annealed_sample(
    rng_key: jax.Array,
    logdensity_fn: LogDensityFn,
    params: AnnealingParams,
    position: jax.Array,
    *,
    num_leapfrog_steps: int = 1,
    corrected: bool = False,
    integrator: str = "velocity_verlet",
) -> tuple[jax.Array, jax.Array, AnnealingInfo]:
    """Run the annealing chain *backwards* from ``position`` (Grosse et al.'s reverse AIS).

    The path z_{K+1} → z_K → ... → z_1 is drawn from the backward process that defines
    the UHA (or, with ``corrected=True``, the Hamiltonian AIS) weight: (z_{K+1}, ρ_{K+1})
    ~ p(z) S(ρ), then for m = K, ..., 1 the reversal of transition m (the leapfrog for
    π_m, Metropolis-corrected if asked, followed by a partial momentum refresh; working
    with negated momenta makes the reversal the same code as the forward move). The
    returned log weight is the forward weight *of that path*, so that

    * if ``position`` is an exact draw from the posterior p = p̄ / Z, then
      E[log w] ≥ log Z: a stochastic **upper** bound (the gap is the KL divergence
      from the backward to the forward path distribution), and E[1 / w] = 1 / Z;
    * together with the forward sampler's lower bound it sandwiches log Z.

    The bound is only valid for exact posterior draws: with approximate ones (e.g. short
    or unconverged MCMC) it can fall below log Z.

    Returns:
        ``(z_1, log w, info)``; ``info`` is ordered by transition m = 1..K like the
        forward sampler's, with ``info.initial_position = z_1``, ``info.log_q_initial =
        log q(z_1)``, ``info.target_logdensity[m-1] = log p̄(z_m)`` and
        ``info.log_accept_ratio`` / ``info.accepted`` those of the backward moves.
    """
    position = jnp.asarray(position, params.loc.dtype)
    dim, num_transitions = params.loc.shape[-1], params.betas.shape[-1]
    noise = _reverse_noise(rng_key, dim, num_transitions, params.loc.dtype)
    return _reverse(
        noise, logdensity_fn, params, position, num_leapfrog_steps, corrected, integrator
    )


def reverse_annealed_sample_rows(
    rng_keys: jax.Array,
    logdensity_fn: LogDensityFn,
    params: AnnealingParams,
    position: jax.Array,
    *,
    num_leapfrog_steps: int = 1,
    corrected: bool = False,
    integrator: str = "velocity_verlet",
) -> tuple[jax.Array, jax.Array, AnnealingInfo]:
    """:func:`reverse_annealed_sample` for B rows at once, from ``position`` of shape
    ``(B, d)``; arguments as in :func:`annealed_sample_rows`. Row i's chain is exactly the
    single-row one with key ``rng_keys[i]``."""
    params = _rows_params(params, rng_keys)
    position = jnp.asarray(position, params.loc.dtype)
    dim, num_transitions = params.loc.shape[-1], params.betas.shape[-1]
    noise = jax.vmap(lambda key: _reverse_noise(key, dim, num_transitions, params.loc.dtype))(
        rng_keys
    )
    z, log_weight, info = _reverse(
        _steps_first(noise), logdensity_fn, params, position, num_leapfrog_steps, corrected,
        integrator,
    )
    return z, log_weight, _rows_info(info)


def _reverse_noise(rng_key, dim, num_transitions, dtype):
    key_momentum, key_refresh, key_accept = jax.random.split(rng_key, 3)
    return _transition_noise(key_momentum, key_refresh, key_accept, dim, num_transitions, dtype)


def _reverse(noise, logdensity_fn, params, position, num_leapfrog_steps, corrected, integrator):
    logdensity_fn, factor = _mass_coordinates(logdensity_fn, params)
    if factor is not None:
        position = _to_mass(factor, position)
    momentum, move, refresh, steps = _chain_parts(
        logdensity_fn, params, noise, num_leapfrog_steps, corrected, integrator,
    )
    state = _initial_state(logdensity_fn, position, momentum, integrator)
    final_logdensity = state.target_logdensity

    def transition(state, step):
        beta, step_size, noise, uniform = step
        moved, step_info = move(state, beta, step_size, uniform)
        return refresh(moved, noise), step_info

    first_state, per_step = jax.lax.scan(transition, state, steps, reverse=True)
    first_state = first_state._replace(position=_from_mass(factor, first_state.position))
    log_q_initial = gaussian_logpdf(first_state.position, params.loc, params.scale)
    # Each backward move's increment is the forward increment with start and end swapped.
    increments = -per_step[-1]
    log_weight = final_logdensity - log_q_initial + jnp.sum(increments, axis=0)
    target_logdensity, momentum_log_ratio, log_accept_ratio, accepted, _ = per_step
    info = AnnealingInfo(
        first_state.position, log_q_initial, target_logdensity,
        # In forward terms, log S(ρ_{m+1}) - log S(ρ'_m) is minus the backward move's.
        -momentum_log_ratio, log_accept_ratio, accepted, increments,
    )
    return first_state.position, log_weight, info


def uha_sample(
    rng_key, logdensity_fn, params, *, num_leapfrog_steps=1, remat=False,
    integrator="velocity_verlet", deferred_diagnostics=False,
):
    """UHA draw (differentiable). See :func:`annealed_sample`."""
    return annealed_sample(
        rng_key, logdensity_fn, params,
        num_leapfrog_steps=num_leapfrog_steps, corrected=False, remat=remat,
        integrator=integrator, deferred_diagnostics=deferred_diagnostics,
    )


def hais_sample(
    rng_key, logdensity_fn, params, *, num_leapfrog_steps=1, integrator="velocity_verlet"
):
    """Hamiltonian AIS draw with the same parameters (Metropolis-corrected, unbiased).

    Gradients are stopped: the corrected weight is not differentiable.
    """
    params = jax.lax.stop_gradient(params)
    return annealed_sample(
        rng_key, logdensity_fn, params,
        num_leapfrog_steps=num_leapfrog_steps, corrected=True, remat=False,
        integrator=integrator,
    )


def uha_sample_rows(
    rng_keys, logdensity_fn, params, *, num_leapfrog_steps=1, remat=False,
    integrator="velocity_verlet", deferred_diagnostics=False,
):
    """UHA draws, one per row (differentiable). See :func:`annealed_sample_rows`."""
    return annealed_sample_rows(
        rng_keys, logdensity_fn, params,
        num_leapfrog_steps=num_leapfrog_steps, corrected=False, remat=remat,
        integrator=integrator, deferred_diagnostics=deferred_diagnostics,
    )


def hais_sample_rows(
    rng_keys, logdensity_fn, params, *, num_leapfrog_steps=1, integrator="velocity_verlet"
):
    """Hamiltonian AIS draws, one per row (gradients stopped). See :func:`annealed_sample_rows`."""
    params = jax.lax.stop_gradient(params)
    return annealed_sample_rows(
        rng_keys, logdensity_fn, params,
        num_leapfrog_steps=num_leapfrog_steps, corrected=True, remat=False,
        integrator=integrator,
    )
