"""A warm start for q that holds on badly scaled posteriors.

Plain Gaussian VI with Adam (:func:`~numpyro_uha.core.fit_gaussian`) moves every
coordinate of q's mean by about the learning rate per step, whatever that coordinate's
posterior scale: a coefficient known to ±1e-3 is then never resolved, and one with a
posterior sd of 100 takes thousands of steps to reach. :func:`warm_start` first finds the
posterior's scales, then runs the same VI in coordinates where every scale is about one:

1. **A mode by L-BFGS** (optax's ``scale_by_lbfgs`` directions) from ``init_loc``, in
   coordinates standardized by the curvature there, s_i = 1 / sqrt(H_ii),
   H = -∇² log p̄ (``fallback_scale`` where H_ii is not positive and finite). Each
   iteration evaluates the log density at a whole row batch of step lengths along the
   direction (2⁸, 2⁷, …, 1, ½, …, all scaled down so that no point is farther than a
   reach, 8 standardized units at first, doubled whenever the farthest point was the
   best) and moves to the lowest of those that decrease the objective enough (Armijo,
   and strictly); a step with yᵀs ≤ 0 restarts the L-BFGS memory, and so does a
   search along the memory's direction that finds no decrease (the search ends where
   a gradient step finds none). The reach matters
   where the model's cost depends on its parameters: one call lasts as long as its
   slowest point, and an ODE model's adaptive solver took minutes at a decay rate of
   e^16 that a 2⁸-fold step had tried. From a start far out in a steep tail (a
   Poisson rate e^56 at a random start) the curvature's scales can lie below the
   floats' resolution (:data:`MODE_SCALE_SPACINGS`) and the gradient's norm overflow;
   a search that ends far from its start in its start's units is run again from there,
   standardized by the curvature where it ended (:data:`RESTANDARDIZE_SDS`).
   **Then Newton steps** (:func:`newton_polish`, up to :data:`NEWTON_MAX_DIM`
   coordinates, where the loops run in Python): L-BFGS stalls where the posterior's
   correlations are near ±1 (a regression on raw, uncentered, collinear columns: a
   condition number of 10⁷ to 10⁸ after standardization; on a 26-coordinate one the
   warm start's q ended centred 400 (float32) to 1 300 (float64) nats below the mode),
   while steps on the whole Hessian (its eigenvalues by magnitude, the same d
   Hessian-vector products the diagonal scales take) reach the mode in about ten. The
   polished mode is kept where its Laplace approximation scores a higher ELBO than the
   unpolished one's, and either the steps converged (Newton's decrement below
   ``NEWTON_DECREMENT``) or no curvature scale shrank tenfold: a centred hierarchical
   model's density grows without bound into a spike, which Newton steps would follow
   and never converge in, while a mode search that stalled far out (a noise scale 10⁴
   times too large) has scales that rightly shrink at the mode.
2. **A Laplace approximation** at that mode: N(mode, diag(s²)) with the curvature
   scales at the mode; for a full-rank q, N(mode, H⁻¹) with the whole Hessian (d
   Hessian-vector products on unit vectors: the columns the diagonal was read from),
   where it is positive definite.
3. **VI from three starts, side by side**: z = m + s ⊙ u (or m + diag(s) L_u u for full
   rank), q_u fitted as :func:`~numpyro_uha.core.fit_gaussian` does (Adam, cosine-decayed
   learning rate, the same draws at every step for all three starts) (a) in the model's
   own coordinates from N(init_loc, fallback_scale²), the plain warm start; (b) from
   init_loc, standardized by the curvature there; (c) from the Laplace approximation,
   standardized by it (for full rank, with L_u the Cholesky factor of the standardized
   H⁻¹, so a Gaussian posterior is fitted before the first step). The fit with the
   lowest final loss (mean over its last tenth) is kept: the mode of a hierarchical or time-series model can be a degenerate spike (a
   scale → 0) that VI in the spike's coordinates cannot leave, and curvature at a random
   start can mislead, while on a badly scaled regression only a standardized start
   resolves the posterior in a thousand Adam steps.

The result says whether the VI converged (the mean loss over the last tenth of the steps
no lower than over the tenth before, within two standard errors).

**The VI skipped where the Laplace approximation is already the posterior.** Before step
3 the Laplace approximation is scored (its log weights at the draws every fit is scored
at); where its KL to the posterior, log Z − ELBO, is within ``laplace_tolerance`` (0.02
nats: half the log weights' variance plus two standard errors, and the
importance-weighted bound's gap, see :func:`laplace_close`), no Gaussian can do
measurably better and the VI is not run. This is the large-data case (a logistic
regression on 10⁵ rows: the VI's 1000 × 24 full-data gradients were 12 of an 18 s
setup) and the Gaussian one; a hierarchical, skewed or correlated (for a diagonal q)
posterior is far above the tolerance and runs the VI as before. Only where the loops run
in Python (under a JAX transform the VI always runs).

**Compiled once, driven from Python.** Every stage needs the log density in only two
ways: its value and gradient at a batch of rows, and Hessian-vector products at a batch
of rows (a :class:`RowsOracle`). With concrete inputs and a compiled oracle
(:func:`rows_oracle`), the log density is compiled in those two programs alone and the
stages' loops run in Python around them and around small model-free update programs:
XLA compiles the model twice, not once per stage (the fused single program took several
seconds to compile on two CPU cores, longer than the fit runs). :func:`difference_oracle`
goes one program further: its products are central differences of the compiled
gradient, so the model is compiled once (``UHAGuide``'s setup uses it). Under a JAX
transform (traced inputs) the same steps run in ``lax`` loops.

**Compiled early, beside other work.** The model-free steps depend only on q's dimension,
dtype and the options, so :func:`precompile` compiles them in a background thread,
rehearsing the same calls on a stand-in oracle, while the caller traces its model
(``UHAGuide`` starts it before NumPyro's initialization); :func:`compile_in_background`
compiles already-traced programs beside each other. XLA releases the
GIL while it compiles, so on two cores most of that time overlaps. And they are kept on
disk (:mod:`numpyro_uha.core.executables`): a later process loads them instead of
compiling them.
"""

from __future__ import annotations

from functools import wraps
import os
import threading
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from numpyro_uha.core import executables
from numpyro_uha.core.batching import aval_key
from numpyro_uha.core.gaussian import gaussian_logpdf_of_draw, gaussian_sample
from numpyro_uha.core.vi import _raw_to_scale, _scale_to_raw

__all__ = [
    "RowsOracle",
    "WarmStart",
    "compile_in_background",
    "curvature_scale",
    "difference_oracle",
    "find_mode",
    "hessian_matrix",
    "laplace_close",
    "loss_decrease",
    "max_curvature",
    "newton_polish",
    "oracle_log_weights",
    "precompile",
    "rows_oracle",
    "to_default_device",
    "warm_start",
]

#: Above this dimension the Hessian's diagonal (d Hessian-vector products) is skipped.
MAX_CURVATURE_DIM = 2048

#: Rows of every Hessian-vector-product call :func:`warm_start` makes (the guide's
#: curvature check uses the same width, so one program serves both).
HVP_ROWS = 65

#: Guards small_jit's lazy creation of its jit wrappers.
_COMPILE_LOCK = threading.Lock()

#: Armijo's sufficient-decrease constant.
_ARMIJO = 1e-4


class RowsOracle(NamedTuple):
    """The log density as the warm start uses it, on batches of rows.

    Attributes:
        value_and_grad: ``Z (R, d) -> (log p̄ (R,), ∇ log p̄ (R, d))``.
        hvp: ``(Z (R, d), V (R, d)) -> ∇² log p̄(z_r) v_r (R, d)``.
        compiled: whether both are compiled programs, so loops around them may run in
            Python (see the module docstring); plain functions are traced into ``lax``
            loops instead.
        step_device: where the model-free steps around a compiled oracle run (a
            ``jax.Device``; ``None``: where their inputs are, the default device).
            :func:`difference_oracle` builds such an oracle (see :func:`to_default_device`).
    """

    value_and_grad: Callable[[jax.Array], tuple[jax.Array, jax.Array]]
    hvp: Callable[[jax.Array, jax.Array], jax.Array]
    compiled: bool = False
    step_device: object = None


def rows_oracle(logdensity_fn: Callable[[jax.Array], jax.Array], compiled: bool = True) -> RowsOracle:
    """A :class:`RowsOracle` for ``logdensity_fn``, jitted when ``compiled``."""

    def value_and_grad(zs):
        return jax.vmap(jax.value_and_grad(logdensity_fn))(zs)

    def hvp(zs, vs):
        grad = jax.grad(logdensity_fn)
        return jax.vmap(lambda z, v: jax.jvp(grad, (z,), (v,))[1])(zs, vs)

    if compiled:
        return RowsOracle(jax.jit(value_and_grad), jax.jit(hvp), True)
    return RowsOracle(value_and_grad, hvp, False)


class WarmStart(NamedTuple):
    """Result of :func:`warm_start`.

    Attributes:
        loc, scale: the fitted q (scale a vector, or a Cholesky factor for full rank).
        losses: negative ELBO estimates of the VI steps.
        start: which start the kept fit came from: 0 the plain warm start, 1 init_loc
            standardized by its curvature, 2 the Laplace approximation at the mode.
        log_weights: log p̄(z) − log q(z) at ``num_score_draws`` fresh draws z from the
            kept q: their mean estimates its ELBO, the bound UHA starts from and should
            improve on.
        converged: whether the VI's loss had stopped decreasing (see module docstring).
    """

    loc: jax.Array
    scale: jax.Array
    losses: jax.Array
    start: jax.Array
    log_weights: jax.Array
    converged: jax.Array


# ----------------------------------------------------------------------- drivers
def _traced(tree) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(tree))


def resolve_oracle(logdensity_fn, oracle, *inputs) -> tuple[RowsOracle, object]:
    """The oracle to use and how its loops run: ``False`` traced into ``lax`` loops;
    else in Python (a compiled oracle, concrete inputs), ``True`` with the model-free
    steps where their inputs are, or the oracle's ``step_device`` (a ``jax.Device``) to
    run them there."""
    if oracle is None:
        if logdensity_fn is None:
            raise ValueError("Pass logdensity_fn or oracle.")
        oracle = rows_oracle(logdensity_fn, compiled=not _traced(inputs))
    # under a JAX transform even a new constant is traced
    if not (oracle.compiled and not _traced((inputs, jnp.zeros(())))):
        return oracle, False
    return oracle, True if oracle.step_device is None else oracle.step_device


def quick_compiler_options(platform: str | None = None) -> dict | None:
    """XLA options for a program whose compile time is most of its cost (run once, or
    tiny): on CPU the lowest backend optimization (a third to a half of the compile time;
    the same run time for the warm start's small steps) and XLA's older loop emitters
    instead of its fusion emitters (``xla_cpu_use_fusion_emitters``: about half of what
    compiling still costs at that level, measured on the test suite's programs). On a
    GPU, XLA's lowest backend optimization and no autotuning (:data:`QUICK_GPU_OPTIONS`)
    where the environment variable ``NUMPYRO_UHA_QUICK_GPU_OPTIONS`` is ``1`` (default
    :data:`QUICK_GPU_DEFAULT`). ``None`` elsewhere. ``platform``: the backend the program
    runs on (default: JAX's default backend)."""
    platform = jax.default_backend() if platform is None else platform
    if platform == "gpu" and os.environ.get(
        "NUMPYRO_UHA_QUICK_GPU_OPTIONS", QUICK_GPU_DEFAULT
    ) == "1":
        return known_compiler_options(platform, QUICK_GPU_OPTIONS)
    if platform != "cpu":
        return None
    return known_compiler_options(platform, QUICK_CPU_OPTIONS)


#: :func:`quick_compiler_options` on CPU (those this process's XLA knows)
QUICK_CPU_OPTIONS = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
#: ... and on a GPU, where ``NUMPYRO_UHA_QUICK_GPU_OPTIONS`` (default
#: :data:`QUICK_GPU_DEFAULT`) is ``1``: on an H200 (hierarchical logistic regression,
#: one fresh process each, benchmarks/startup_compiles.py) ``svi.init`` 15.9 s against
#: 17.7 s at XLA's defaults, the same start ELBO (-129.820 ± 0.028);
#: benchmarks/results/gpu_h200_1204c
QUICK_GPU_OPTIONS = {"xla_backend_optimization_level": 0, "xla_gpu_autotune_level": 0}
#: ``NUMPYRO_UHA_QUICK_GPU_OPTIONS``'s value where it is not set: ``"1"``, the quick
#: options on a GPU too
QUICK_GPU_DEFAULT = "1"


#: (platform, option name, value) -> whether this process's XLA accepts the option
_KNOWN_OPTIONS: dict = {}


def known_compiler_options(platform: str, options: dict) -> dict | None:
    """``options`` without those this process's XLA does not know: XLA adds and retires
    its debug options between jaxlib releases (``xla_cpu_use_fusion_emitters`` is one such
    CPU option), and ``jax.jit(..., compiler_options=...)`` with an unknown one fails at
    the first call ("No such compile option"), where leaving it out only compiles the
    program as XLA's defaults would. Each option is tried once per process on a trivial
    program for ``platform`` (a millisecond or two; all at once first, one by one only
    where that fails). ``None`` where none is left."""
    todo = [item for item in options.items() if (platform, *item) not in _KNOWN_OPTIONS]
    if todo:
        with _COMPILE_LOCK:
            todo = [item for item in todo if (platform, *item) not in _KNOWN_OPTIONS]
            if todo and _compiles_with(platform, dict(todo)):
                _KNOWN_OPTIONS.update({(platform, *item): True for item in todo})
            else:
                for item in todo:
                    _KNOWN_OPTIONS[(platform, *item)] = _compiles_with(platform, dict([item]))
    kept = {k: v for k, v in options.items() if _KNOWN_OPTIONS[(platform, k, v)]}
    return kept or None


def _compiles_with(platform: str, options: dict) -> bool:
    """Whether a trivial program for a ``platform`` device compiles with ``options``
    (ahead of time: no call, so also where a JAX transform is tracing)."""
    device = jax.devices(platform)[0]
    arg = jax.ShapeDtypeStruct((), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(device))
    try:
        jax.jit(lambda x: x + 1, compiler_options=options).lower(arg).compile()
    except Exception as error:  # noqa: BLE001 - XLA's error type varies across jaxlibs
        if "compile option" in str(error).lower():
            return False
        raise
    return True


def _on_device(args, static_argnums, device):
    """``args`` with their arrays (not the static ones) placed on ``device``."""
    def put(x):
        if isinstance(x, (jax.Array, np.ndarray, np.generic)):
            return jax.device_put(x, device)
        return x

    return tuple(a if i in static_argnums else jax.tree.map(put, a) for i, a in enumerate(args))


def to_default_device(tree):
    """The array leaves of ``tree`` as uncommitted arrays on JAX's default device, as
    results computed there are: what an oracle with a ``step_device`` returns goes
    through this before other code mixes it with the model's arrays."""
    def move(x):
        if isinstance(x, jax.Array) and not _traced(x):
            return jnp.asarray(np.asarray(x))
        return x

    return jax.tree.map(move, tree)


#: A model-free step whose largest array argument has at least this many elements is
#: compiled at XLA's default optimization, not :func:`quick_compiler_options`': at the
#: lowest level its run time grows faster than its compile time shrinks. A Gaussian
#: random walk of d steps (2-core CPU, no executables on disk): d = 5000, 1000 warm-start
#: VI steps on 24 × 5000 draws took 8 of a 15.4 s setup, 9.4 s in all at the default
#: level; d = 2000: 10.0 → 7.6 s; d = 1000: 6.8 → 6.6 s (3.3 s against 5.1 s with the
#: executables on disk); d = 500 is faster all quick (5.4 s against 7.9 s).
QUICK_MAX_ELEMENTS = 2**14


def _small(args, static_argnums) -> bool:
    """Whether every array argument of a step has fewer than :data:`QUICK_MAX_ELEMENTS`
    elements (see :func:`small_jit`)."""
    dynamic = [a for i, a in enumerate(args) if i not in static_argnums]
    return all(
        np.size(leaf) < QUICK_MAX_ELEMENTS
        for leaf in jax.tree.leaves(dynamic) if hasattr(leaf, "shape")
    )


def small_jit(static_argnums=()):
    """jit for the warm start's model-free steps: tiny programs run once per iteration,
    compiled on CPU at XLA's lowest backend optimization (a third of the compile time,
    the same run time at these sizes; steps on arrays of :data:`QUICK_MAX_ELEMENTS` or
    more at the default level). Called with ``host=False`` (loops traced into
    ``lax`` loops, under a JAX transform) the step is a plain function, inlined; with
    ``host`` a ``jax.Device`` (an oracle's ``step_device``) it runs on that device, its
    array arguments copied there; called with traced arguments (under the caller's JAX
    transform) it is inlined too. On JAX's default CPU device the executables go
    through the on-disk cache of :mod:`numpyro_uha.core.executables`: compiled once per
    machine, not once per process."""

    def decorate(fn):
        compiled = {}

        @wraps(fn)
        def call(*args, host):
            if host is False or _traced(args):
                # traced (in a lax loop, or under the caller's transform): inlined
                return fn(*args)
            device = None if host is True else host
            platform = jax.default_backend() if device is None else device.platform
            options = quick_compiler_options(platform) if _small(args, static_argnums) else None
            key = (platform, options is None)
            if key not in compiled:
                with _COMPILE_LOCK:  # the first call may come from two threads
                    if key not in compiled:
                        compiled[key] = jax.jit(
                            fn, static_argnums=static_argnums, compiler_options=options,
                        )
            if device is not None:
                args = _on_device(args, static_argnums, device)
            else:
                folder = executables.active(platform)
                if folder is not None:  # compiled once per machine (executables.py)
                    return _cached_call(compiled[key], args, folder, platform, options)
            return compiled[key](*args)

        call.small_jit = True  # a model-free step (precompile's tests find them by it)
        # (static args, tree, avals) -> executable, in this process
        call.executables = executables.register({})

        def _cached_call(jitted, args, folder, platform, options):
            static = tuple(args[i] for i in static_argnums)
            dynamic = tuple(a for i, a in enumerate(args) if i not in static_argnums)
            leaves, tree = jax.tree.flatten(dynamic)
            signature = (platform, static, tree, tuple(map(aval_key, leaves)))
            executable = call.executables.get(signature)
            if executable is None:
                executable = executables.load_or_compile(
                    jitted, args, folder, options,
                    call=f"{fn.__module__}.{fn.__qualname__} {signature!r}",
                )
                call.executables[signature] = executable
            return executable(*dynamic)

        return call

    return decorate


def _loop(host, n: int, body, carry):
    """``carry = body(i, carry)`` for i < n: in Python around compiled steps (``host``
    not ``False``, see :func:`resolve_oracle`), else one ``lax.fori_loop``."""
    if host is not False:
        for i in range(n):
            carry = body(np.int32(i), carry)
        return carry
    return jax.lax.fori_loop(0, n, body, carry)


@small_jit()
def _take(xs, c):
    return jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, c, 0, False), xs)


@small_jit()
def _put(x, part, c):
    """``x`` with rows ``c·len(part) …`` replaced by ``part``."""
    return jax.lax.dynamic_update_slice_in_dim(x, part, c * part.shape[0], 0)


#: The central difference's step h (see :func:`difference_oracle`): H v ≈ (∇ log p̄(z + h v)
#: − ∇ log p̄(z − h v)) / 2h. In single precision the rounding error of the difference
#: grows as h shrinks and the truncation error as h² grows; 1e-2 (the products' inputs are
#: unit vectors or q's scales times unit vectors) keeps both near 1e-4 relative where z is
#: of order one. Far from the origin the step grows with |z| (:data:`DIFFERENCE_SPACINGS`).
DIFFERENCE_STEP = 1e-2

#: Far from the origin, z ± h v must differ from z by many of the float's spacings there:
#: at |z| = 3e5 in single precision z + 1e-2 rounds back to z, the difference was 0 and
#: the warm start's curvature (and with it q's scales and the step ceiling) came out
#: wrong, silently (a regression's intercept near 3e5: q's scale 0.014 of the posterior's).
#: Each row's step is the larger of :data:`DIFFERENCE_STEP` and this many spacings of its
#: largest moved coordinate (relative rounding error near 1/256; in double precision the
#: rule changes nothing below |z| ≈ 1e11).
DIFFERENCE_SPACINGS = 256


def _difference_steps(zs, vs, widen):
    """Each row's step h_r (see :data:`DIFFERENCE_SPACINGS`): the larger of
    :data:`DIFFERENCE_STEP` and the floor, ``widen``-fold, but never below the floor,
    h_r · max|v_r| at least that many spacings of the largest |z_ri| among the
    coordinates v_r moves."""
    reach = jnp.max(jnp.where(vs != 0, jnp.abs(zs), 0), axis=-1)
    size = jnp.max(jnp.abs(vs), axis=-1)
    spacings = DIFFERENCE_SPACINGS * jnp.finfo(zs.dtype).eps * reach
    floor = jnp.where(size > 0, spacings / jnp.where(size > 0, size, 1), 0)
    return jnp.maximum(jnp.maximum(DIFFERENCE_STEP, floor) * widen, floor).astype(zs.dtype)


#: A product is resolved where some entry of its difference of gradients is more than
#: this many times that entry's own rounding (the float's spacing at the larger of the
#: two gradients' entries): far from the mode the gradient is large and the curvature
#: small (a regression's intercept 3e5 from a start at 0 under a N(0, 1e6²) prior: a
#: difference of 2e-9 on gradients of 0.02, at the resolution of single precision), and
#: the product was rounding noise.
DIFFERENCE_RESOLUTION = 64.0

#: Rows whose product is not resolved are differenced again with their step this many
#: times larger (a flat direction stays unresolved, with a product near 0, as before).
DIFFERENCE_WIDEN = 1024.0

#: How many times a row is differenced again at most (see :data:`DIFFERENCE_WIDEN` and
#: :data:`DIFFERENCE_COARSE`).
DIFFERENCE_RETRIES = 2

#: A row whose step moves z farther than this many of the sds its own product implies
#: along v_r (1 / sqrt(|vᵀHv|) for a unit v) is differenced again with a step of
#: :data:`DIFFERENCE_FINE` such sds: the fixed step 1e-2 spans hundreds of sds of a
#: coefficient known to 1e-4, and where the log density is far from quadratic over
#: that span the difference is not its curvature (a Poisson regression with a covariate
#: up to 1000: e^(1000 h) = e^10 across the step, the curvature 300 times too large,
#: the warm start's q a third and a tenth of the posterior's sds, silently).
DIFFERENCE_COARSE = 0.5

#: The step, in sds along v_r, of a row differenced again for :data:`DIFFERENCE_COARSE`.
DIFFERENCE_FINE = 0.05


@small_jit(static_argnums=(2,))
def _difference_points(zs, vs, width, widen):
    """The rows z_r + h_r v_r, then z_r − h_r v_r, in chunks of ``width`` (zero rows past
    the end), a zero buffer for their gradients, and the steps h_r (``widen``-fold, and
    never below :data:`DIFFERENCE_SPACINGS` spacings where ``widen`` < 1)."""
    h = _difference_steps(zs, vs, widen)[:, None]
    points = jnp.concatenate([zs + h * vs, zs - h * vs])
    num = -(-points.shape[0] // width)
    padded = jnp.zeros((num * width, zs.shape[-1]), zs.dtype).at[: points.shape[0]].set(points)
    return padded.reshape(num, width, -1), jnp.zeros_like(padded), h


@small_jit()
def _difference_finish(grads, h, vs, previous, pending, first, widen, settled):
    """The products of the rows still ``pending`` (the others keep ``previous``), which
    of them are to be differenced again, the next attempt's ``widen`` factors, and which
    products are resolved: a row not resolved (see :data:`DIFFERENCE_RESOLUTION`) is
    widened; a resolved row whose step is coarse (see :data:`DIFFERENCE_COARSE`) is
    narrowed. A step whose product is not finite (it left the log density's domain), or
    is not resolved where the previous one was (``settled``), keeps the previous product
    and is not tried again."""
    rows = h.shape[0]
    up, down = grads[:rows], grads[rows : 2 * rows]
    products = (up - down) / (2.0 * h)
    spacing = jnp.finfo(up.dtype).eps * jnp.maximum(jnp.abs(up), jnp.abs(down))
    resolved = jnp.any(jnp.abs(up - down) > DIFFERENCE_RESOLUTION * spacing, axis=-1)
    finite = jnp.all(jnp.isfinite(products), axis=-1)
    take = pending & (first | (finite & (resolved | ~settled)))
    # the move h‖v‖ in sds along v: h ‖v‖ sqrt(|vᵀHv|) / ‖v‖
    curvature = jnp.abs(jnp.sum(vs * products, axis=-1))
    moved = h[:, 0] * jnp.sqrt(jnp.where(finite, curvature, 0.0))
    coarse = resolved & (moved > DIFFERENCE_COARSE)
    fine = widen * DIFFERENCE_FINE / jnp.where(coarse, moved, 1.0)
    again = take & (~resolved | coarse)
    widen = jnp.where(~resolved, widen * DIFFERENCE_WIDEN, jnp.where(coarse, fine, widen))
    settled = jnp.where(take, resolved, settled)
    return jnp.where(take[:, None], products, previous), again, widen, settled


def difference_oracle(
    value_and_grad: Callable[[jax.Array], tuple[jax.Array, jax.Array]], width: int,
    step_device=None,
) -> RowsOracle:
    """A compiled :class:`RowsOracle` from one compiled value-and-gradient program that
    takes ``width`` rows: Hessian-vector products by central differences of the
    gradient (:data:`DIFFERENCE_STEP`, larger far from the origin, and again larger for
    rows whose difference is below the gradients' rounding, smaller for rows whose step
    spans more than half an sd of the curvature it measured), ``width`` rows per call.
    The log density is then compiled once, not twice: forward-over-reverse products cost a second program
    that took longer to compile than the first (0.8 against 0.45 s on a GP, 1.0 against
    0.75 s on an LKJ model, 2-core CPU). The warm start uses the products for scales
    (the curvature's diagonal, a Laplace approximation that VI then refines) and the
    step ceiling (a largest eigenvalue, with a margin), where a relative error near 1e-4
    does not matter; on a quadratic log density the differences are exact up to
    rounding.

    ``step_device`` (a ``jax.Device``, e.g. the host CPU beside a GPU): the loops'
    model-free steps run there (see :func:`small_jit`), and the rows the model program
    gets are copied to the default device first; what the loops return is then on
    ``step_device`` (:func:`to_default_device` moves it back). Tiny steps compile in
    a fraction of the time on a CPU, at the cost of two small copies per model call."""
    host = True if step_device is None else step_device
    if step_device is not None:
        model_value_and_grad = value_and_grad

        def value_and_grad(zs):
            return model_value_and_grad(to_default_device(zs))

    def hvp(zs, vs):
        rows = zs.shape[0]
        widen = np.ones(rows, zs.dtype)
        products, pending = np.zeros(zs.shape, zs.dtype), np.ones(rows, bool)
        settled = np.zeros(rows, bool)
        for attempt in range(DIFFERENCE_RETRIES + 1):
            chunks, grads, h = _difference_points(zs, vs, width, widen, host=host)

            def body(c, grads):
                return _put(grads, value_and_grad(_take(chunks, c, host=host))[1], c, host=host)

            grads = _loop(host, chunks.shape[0], body, grads)
            products, pending, widen, settled = _difference_finish(
                grads, h, vs, products, pending, np.asarray(attempt == 0), widen, settled,
                host=host,
            )
            if attempt == DIFFERENCE_RETRIES or not np.any(np.asarray(pending)):
                return products

    return RowsOracle(value_and_grad, hvp, True, step_device)


# --------------------------------------------------------------------- curvature
def _unit_rows(chunk, rows, z):
    """The unit vectors e_(chunk·rows + r), r < ``rows`` (zero rows past the dimension)."""
    index = chunk * rows + jnp.arange(rows)
    return (index[:, None] == jnp.arange(z.shape[-1])[None, :]).astype(z.dtype)


@small_jit(static_argnums=(4,))
def _curvature_step(diag, hv, c, z, rows):
    """Chunk ``c``'s diagonal entries from its products ``hv`` (none for c < 0), and the
    rows of chunk c + 1: z beside the unit vectors e_((c+1)·rows + r)."""
    part = jnp.sum(_unit_rows(c, rows, z) * hv, axis=-1)
    diag = jnp.where(c >= 0, jax.lax.dynamic_update_slice_in_dim(diag, part, jnp.maximum(c, 0) * rows, 0), diag)
    return diag, jnp.broadcast_to(z, (rows, z.shape[-1])), _unit_rows(c + 1, rows, z)


@small_jit(static_argnums=(4,))
def _hessian_step(hessian, hv, c, z, rows):
    """Like :func:`_curvature_step`, keeping chunk ``c``'s whole products: row i of
    ``hessian`` becomes ∇² log p̄ e_i."""
    updated = jax.lax.dynamic_update_slice_in_dim(hessian, hv, jnp.maximum(c, 0) * rows, 0)
    hessian = jnp.where(c >= 0, updated, hessian)
    return hessian, jnp.broadcast_to(z, (rows, z.shape[-1])), _unit_rows(c + 1, rows, z)


def hessian_matrix(
    logdensity_fn: Callable[[jax.Array], jax.Array] | None,
    z: jax.Array,
    *,
    oracle: RowsOracle | None = None,
    rows: int = HVP_ROWS,
) -> jax.Array:
    """∇² log p̄ at ``z`` (d × d, symmetrized) by Hessian-vector products on the unit
    vectors, ``rows`` at a time."""
    oracle, host = resolve_oracle(logdensity_fn, oracle, z)
    dim = z.shape[-1]
    num = -(-dim // rows)
    xp = jnp if host is False else np  # constants built by NumPy: no eager programs
    hessian = xp.zeros((num * rows, dim), z.dtype)
    carry = _hessian_step(hessian, xp.zeros((rows, dim), z.dtype), np.int32(-1), z, rows, host=host)

    def body(c, carry):
        hessian, zs, vs = carry
        return _hessian_step(hessian, oracle.hvp(zs, vs), c, z, rows, host=host)

    hessian, _, _ = _loop(host, num, body, carry)
    return _symmetric_part(hessian, host=host)


@small_jit()
def _diagonal(hessian):
    return jnp.diagonal(hessian)


@small_jit()
def _symmetric_part(hessian):
    square = hessian[: hessian.shape[-1]]
    return 0.5 * (square + square.T)


@small_jit()
def _laplace_units(unit_scales, hessian, scale):
    """The full-rank starts' initial Cholesky factors in u-coordinates: diagonal ones
    from ``unit_scales``, and for the Laplace start (the last) the factor of
    (S (−∇² log p̄) S)⁻¹, S = diag(``scale``), where that is positive definite and
    finite (else its diagonal one)."""
    units = jax.vmap(jnp.diag)(unit_scales)
    precision = -(scale[:, None] * hessian * scale[None, :])
    cov = jnp.linalg.inv(precision)
    tril = jnp.linalg.cholesky(0.5 * (cov + cov.T))  # NaN where not positive definite
    diag = jnp.diagonal(tril)
    ok = jnp.all(jnp.isfinite(tril)) & jnp.all(diag > 0) & jnp.all(diag < 1e6)
    return units.at[-1].set(jnp.where(ok, tril, units[-1]))


@small_jit()
def _curvature_finish(diag, fallback):
    neg_diag = -diag[: fallback.shape[-1]]
    ok = jnp.isfinite(neg_diag) & (neg_diag > 0)
    scale = jnp.where(ok, jax.lax.rsqrt(jnp.where(ok, neg_diag, 1.0)), fallback)
    return jnp.clip(scale, 1e-12, 1e12)


def curvature_scale(
    logdensity_fn: Callable[[jax.Array], jax.Array] | None,
    z: jax.Array,
    fallback: jax.Array,
    *,
    oracle: RowsOracle | None = None,
    rows: int = HVP_ROWS,
) -> jax.Array:
    """1 / sqrt(-∂² log p̄ / ∂z_i²) at ``z``, ``fallback`` where that is not positive and
    finite (or for every coordinate when d > :data:`MAX_CURVATURE_DIM`); the diagonal by
    Hessian-vector products on unit vectors, ``rows`` at a time."""
    oracle, host = resolve_oracle(logdensity_fn, oracle, z, fallback)
    dim = z.shape[-1]
    xp = jnp if host is False else np  # constants built by NumPy: no eager programs
    fallback = xp.broadcast_to(xp.asarray(fallback, z.dtype), (dim,))
    if dim > MAX_CURVATURE_DIM:
        return jnp.asarray(fallback)
    num = -(-dim // rows)
    diag = xp.zeros(num * rows, z.dtype)
    diag, zs, vs = _curvature_step(diag, xp.zeros((rows, dim), z.dtype), np.int32(-1), z, rows, host=host)

    def body(c, carry):
        diag, zs, vs = carry
        return _curvature_step(diag, oracle.hvp(zs, vs), c, z, rows, host=host)

    diag, _, _ = _loop(host, num, body, (diag, zs, vs))
    return _curvature_finish(diag, fallback, host=host)


#: Most Lanczos iterations :func:`max_curvature` takes (each one Hessian-vector product
#: per point); where the concrete loop runs in Python it stops earlier, once every
#: point's estimate has changed by less than :data:`CURVATURE_RTOL` (relative) on two
#: iterations in a row, and it never takes more than the dimension (the Krylov space is
#: then the whole space: the estimate is exact up to rounding).
CURVATURE_ITERS = 30

#: See :data:`CURVATURE_ITERS`. The step ceiling is a fraction of 2/sqrt(λ): an estimate
#: settled to 1e-3 moves the ceiling by 5e-4 of itself.
CURVATURE_RTOL = 1e-3


@small_jit(static_argnums=(2,))
def _lanczos_begin(z, scale, iters):
    """The rows ``z`` as a batch, the Lanczos carry (previous and current unit vectors,
    the tridiagonal's diagonal α and off-diagonal β so far, and whether each row's
    Krylov space stopped growing) and the first products' inputs S v. The
    start vectors are random (a fixed key): a fixed start such as the normalized ones
    vector is orthogonal to a contrast's eigenvector (z₁ − z₂ on two collinear
    coefficients), which power iteration and Lanczos then never find."""
    zs = jnp.atleast_2d(z)
    n = zs.shape[0]
    v0 = jax.random.normal(jax.random.PRNGKey(0), zs.shape, zs.dtype)
    v0 = v0 / jnp.linalg.norm(v0, axis=-1, keepdims=True)
    zeros = jnp.zeros((n, iters), zs.dtype)
    carry = (jnp.zeros_like(zs), v0, zeros, zeros, jnp.zeros(n, bool))
    return zs, carry, _times(scale, v0)


def _times(scale, v):
    """S v for rows ``v`` (n, d): S = diag(``scale``), or the matrix ``scale`` (d, d)."""
    return v @ scale.T if jnp.ndim(scale) == 2 else scale * v


def _minus_times_transposed(scale, w):
    """−Sᵀ w for rows ``w`` (n, d), S as in :func:`_times` (for a vector, ``-scale * w``:
    the arithmetic, and so the rounding, of the diagonal case as it always was)."""
    return -(w @ scale) if jnp.ndim(scale) == 2 else -scale * w


@small_jit()
def _lanczos_step(carry, hv, scale, j):
    """Lanczos iteration ``j`` on A = Sᵀ H S (H = −∇² log p̄) from the products ``hv`` =
    ∇² log p̄ · (S v_j), every row at once: α_j, β_j, v_(j+1) by the three-term recurrence
    (no full reorthogonalization: lost orthogonality repeats converged Ritz values, it
    does not move the extreme ones past the spectrum), and the estimate max |θ| over the
    Ritz values θ of the j + 1 by j + 1 tridiagonal. A row whose β_j vanishes (its
    Krylov space is invariant: an isotropic A after one step) is done, its estimate
    exact; it keeps its vectors (the oracle then differences a nonzero vector) and its
    α and β, so its estimate stays. Returns the carry, the next inputs S v_(j+1), and the estimates."""
    v_prev, v, alpha, beta, done = carry
    iters = alpha.shape[-1]
    w = _minus_times_transposed(scale, hv)
    a = jnp.sum(v * w, axis=-1)
    b_prev = jnp.where(j > 0, jnp.take(beta, jnp.maximum(j - 1, 0), axis=-1), 0.0)
    w = w - a[:, None] * v - b_prev[:, None] * v_prev
    w = w - jnp.sum(w * v, axis=-1)[:, None] * v  # one local reorthogonalization
    b = jnp.linalg.norm(w, axis=-1)
    index = jnp.arange(iters)
    alpha = jnp.where(done[:, None], alpha, jnp.where(index == j, a[:, None], alpha))
    beta = jnp.where(done[:, None], beta, jnp.where(index == j, b[:, None], beta))
    keep = index <= j
    diagonal = jnp.where(keep, alpha, 0.0)
    off = jnp.where(index[:-1] < j, beta[:, :-1], 0.0)
    tridiagonal = (
        jax.vmap(jnp.diag)(diagonal)
        + jax.vmap(lambda o: jnp.diag(o, 1))(off)
        + jax.vmap(lambda o: jnp.diag(o, -1))(off)
    )
    theta = jnp.linalg.eigvalsh(tridiagonal)
    estimate = jnp.maximum(jnp.abs(theta[:, 0]), jnp.abs(theta[:, -1]))
    scale_of = jnp.maximum(jnp.abs(a), estimate)
    stop = ~done & (b <= 1e-6 * scale_of)
    v_next = w / jnp.where(b > 0, b, 1.0)[:, None]
    new_prev = jnp.where((done | stop)[:, None], v_prev, v)
    new_v = jnp.where((done | stop)[:, None], v, v_next)
    return (new_prev, new_v, alpha, beta, done | stop), _times(scale, new_v), estimate


def max_curvature(
    logdensity_fn: Callable[[jax.Array], jax.Array] | None,
    z: jax.Array,
    scale: jax.Array,
    num_iters: int = CURVATURE_ITERS,
    *,
    oracle: RowsOracle | None = None,
) -> jax.Array:
    """The largest |eigenvalue| of Sᵀ H S, H = -∇² log p̄ at ``z``, S = diag(``scale``)
    (or the matrix ``scale``, shape ``(d, d)``: the leapfrog in the coordinates u = S⁻¹ z),
    by Lanczos iterations on Hessian-vector products (at most ``num_iters`` of them, and
    at most the dimension; in a Python loop, fewer once the estimates settle, see
    :data:`CURVATURE_ITERS`). Lanczos' extreme Ritz values converge far faster than
    power iteration's norms (thirty power iterations took 14 of a 37 s setup on a
    10⁵-point regression, where the Ritz values settle in a few).

    ``z`` may be a batch of points ``(n, d)`` (one iteration each, the products of all
    rows in one oracle call); the result then has shape ``(n,)``. The leapfrog with
    per-coordinate steps h = ε · scale is stable on the quadratic approximation at ``z``
    only while ε · sqrt(λ_max(S H S)) < 2.
    """
    oracle, host = resolve_oracle(logdensity_fn, oracle, z, scale)
    iters = max(1, min(int(num_iters), z.shape[-1]))
    zs, carry, sv = _lanczos_begin(z, scale, iters, host=host)
    if host is False:
        def body(j, state):
            carry, sv, _ = state
            return _lanczos_step(carry, oracle.hvp(zs, sv), scale, j, host=host)

        _, _, lam = jax.lax.fori_loop(0, iters, body, (carry, sv, jnp.zeros(zs.shape[0], zs.dtype)))
    else:
        previous, settled = None, 0
        for j in range(iters):
            carry, sv, lam = _lanczos_step(carry, oracle.hvp(zs, sv), scale, np.int32(j), host=host)
            current = np.asarray(lam)
            if previous is not None:
                change = np.abs(current - previous)
                quiet = ~np.isfinite(current) | (change <= CURVATURE_RTOL * np.abs(current))
                settled = settled + 1 if np.all(quiet) else 0
                if settled >= 2:
                    break
            previous = current
    return lam if z.ndim == 2 else lam[0]


# -------------------------------------------------------------------------- mode
class _ModeState(NamedTuple):
    i: jax.Array
    u: jax.Array
    value: jax.Array  # the objective -log p̄(init + s u)
    grad: jax.Array  # its gradient in u
    memory: optax.OptState
    ok: jax.Array
    reach: jax.Array  # the line search's farthest point (see _step_lengths)
    fresh: jax.Array  # whether the direction searched is the gradient's (no memory)


_LBFGS = optax.scale_by_lbfgs()


#: The line search's first reach: its farthest point, in standardized units (the
#: start's sds), from the current one along any coordinate. Every point of a line
#: search is evaluated in one call, which lasts as long as its slowest point: a model
#: whose cost grows with its parameters (an adaptive ODE solver: a decay rate e^16 took
#: 83 s per call, e^40 did not finish) is as slow as the farthest point. The reach
#: grows REACH_GROWTH-fold each time the farthest point was the best one (a mode
#: 15 000 sds away, a badly scaled regression, is reached in a few more iterations).
INITIAL_REACH_SDS = 8.0
REACH_GROWTH = 2.0


def _step_lengths(rows, direction, reach):
    """The line search's step lengths along ``direction``, one per row: 2⁸, 2⁷, … (1 at
    the ninth row), all scaled down where the longest would go farther than ``reach``
    along some coordinate."""
    lengths = 2.0 ** (8.0 - jnp.arange(rows, dtype=direction.dtype))
    farthest = lengths[0] * jnp.max(jnp.abs(direction))
    return lengths * jnp.minimum(1.0, reach / jnp.where(farthest > 0, farthest, 1.0))


def _mode_ask(state, init, s, rows):
    """The L-BFGS direction from ``state`` and the line search's points along it."""
    direction, memory = _LBFGS.update(state.grad, state.memory, state.u)
    direction = -direction
    # not a descent direction: steepest descent, the memory dropped
    bad = ~(jnp.vdot(state.grad, direction) < 0) | ~jnp.all(jnp.isfinite(direction))
    fresh_direction, fresh = _LBFGS.update(state.grad, _LBFGS.init(state.u), state.u)
    # optax's first direction, g / ‖g‖, is 0 where ‖g‖² overflows (gradients past 1e19
    # in float32, far out in a steep tail): then the same direction computed from
    # g / max|g|
    big = jnp.max(jnp.abs(state.grad))
    unit = state.grad / jnp.where(big > 0, big, 1.0)
    unit = unit / jnp.where(big > 0, jnp.linalg.norm(unit), 1.0)
    lost = ~(jnp.vdot(state.grad, fresh_direction) > 0) | ~jnp.all(jnp.isfinite(fresh_direction))
    fresh_direction = jnp.where(lost, unit, fresh_direction)
    direction = jnp.where(bad, -fresh_direction, direction)
    memory = jax.tree.map(lambda a, b: jnp.where(bad, a, b), fresh, memory)
    fresh = state.fresh | bad
    us = state.u + _step_lengths(rows, direction, state.reach)[:, None] * direction
    return state._replace(memory=memory, fresh=fresh), direction, init + s * us


@small_jit(static_argnums=(4,))
def _mode_begin(values, grads, init, s, rows):
    """The state at ``init`` (the oracle's first row there) and the first line search."""
    f, g = -values[0], -grads[0] * s
    u = jnp.zeros_like(init)
    ok = jnp.isfinite(f) & jnp.all(jnp.isfinite(g))
    state = _ModeState(
        jnp.asarray(0, jnp.int32), u, f, g, _LBFGS.init(u), ok,
        jnp.asarray(INITIAL_REACH_SDS, init.dtype),
        jnp.asarray(True),
    )
    return _mode_ask(state, init, s, rows)


@small_jit(static_argnums=(6,))
def _mode_step(state, direction, values, grads, init, s, num_steps):
    """The line search's outcome from the oracle's values and gradients at its points,
    and the next line search."""
    rows = values.shape[0]
    alphas = _step_lengths(rows, direction, state.reach)
    f = -values
    g = -grads * s
    slope = jnp.vdot(state.grad, direction)
    finite = jnp.isfinite(f) & jnp.all(jnp.isfinite(g), axis=-1)
    # a strict decrease too: in float32 near the mode, c·α·slope is below the value's
    # resolution, and points of equal value (and a larger gradient) would pass
    armijo = finite & (f <= state.value + _ARMIJO * alphas * slope) & (f < state.value)
    found = jnp.any(armijo)
    k = jnp.argmin(jnp.where(armijo, f, jnp.inf))  # the lowest point with enough decrease
    new_grad = g[k]
    # y·s > 0 keeps the L-BFGS inverse Hessian positive definite; else start it afresh.
    # A search along a direction from the memory that found nothing is tried again along
    # the gradient, the memory dropped (far out in a steep tail, the curvature a jump
    # left behind can point a thousandfold too far): the search ends only where a
    # gradient step finds no decrease.
    curved = found & (jnp.vdot(new_grad, direction) > slope)
    retry = ~found & ~state.fresh
    memory = jax.tree.map(
        lambda a, b: jnp.where(curved, a, b), state.memory, _LBFGS.init(state.u)
    )
    small = jnp.max(jnp.abs(new_grad)) < 1e-6
    keep = lambda new, old: jnp.where(found, new, old)  # noqa: E731
    state = _ModeState(
        state.i + 1,
        keep(state.u + alphas[k] * direction, state.u),
        keep(f[k], state.value),
        keep(new_grad, state.grad),
        memory,
        (found | retry) & ~small & (state.i + 1 < num_steps),
        # the farthest point was the best: the mode may be farther still
        jnp.where(found & (k == 0), REACH_GROWTH * state.reach, state.reach),
        ~curved,
    )
    return _mode_ask(state, init, s, rows)


#: :func:`find_mode`'s standardizing scales are at least this many float spacings of
#: their coordinate of the start: a smaller scale moves z by less than its resolution at
#: every step length. Far out in a steep tail the curvature gives such scales (a Poisson
#: regression's rate e^56 at a random start, x up to 1000: scales of 1e-12 at z ≈ 0.06,
#: whose spacing is 4e-9), and the search stopped where it began: the warm start's q
#: was a point 20 orders of magnitude below the posterior's log density, silently.
MODE_SCALE_SPACINGS = 256


@small_jit()
def _resolvable(init, scale):
    return jnp.maximum(scale, MODE_SCALE_SPACINGS * jnp.finfo(init.dtype).eps * jnp.abs(init))


#: A mode search that ends farther than this many of its start's sds from the start
#: (along some coordinate) is run again from where it ended, standardized by the
#: curvature there. Its convergence test (a gradient below 1e-6 in standardized units)
#: assumes scales near the posterior's; from a start far out in a steep tail (a Poisson
#: regression's rate e^244 at a random start in double precision: scales of 1e-12) the
#: gradient at a point 2 500 nats below the mode passed it.
RESTANDARDIZE_SDS = 1e3


@small_jit()
def _far(mode, init, scale):
    return jnp.max(jnp.abs(mode - init) / scale) > RESTANDARDIZE_SDS


@small_jit(static_argnums=(1,))
def _rows_of(z, rows):
    return jnp.broadcast_to(z, (rows,) + z.shape)


def find_mode(
    logdensity_fn: Callable[[jax.Array], jax.Array] | None,
    init: jax.Array,
    scale: jax.Array,
    num_steps: int = 200,
    *,
    oracle: RowsOracle | None = None,
    rows: int = 24,
) -> tuple[jax.Array, jax.Array]:
    """Maximize log p̄ by L-BFGS from ``init``, in coordinates standardized by ``scale``
    (see the module docstring), ``rows`` step lengths per iteration.

    Returns ``(z, log p̄(z))``: the best point found (the start if no step decreased the
    objective); the iteration stops after ``num_steps``, when no step length decreases
    the objective, or when the gradient vanishes.
    """
    oracle, host = resolve_oracle(logdensity_fn, oracle, init, scale)
    scale = _resolvable(init, scale, host=host)
    values, grads = oracle.value_and_grad(_rows_of(init, rows, host=host))
    carry = _mode_begin(values, grads, init, scale, rows, host=host)

    def body(carry):
        state, direction, zs = carry
        values, grads = oracle.value_and_grad(zs)
        return _mode_step(state, direction, values, grads, init, scale, num_steps, host=host)

    if host is not False:
        while bool(carry[0].ok):
            carry = body(carry)
    else:
        carry = jax.lax.while_loop(lambda c: c[0].ok, body, carry)
    return _mode_result(carry[0], init, scale, host=host)


@small_jit()
def _mode_result(state, init, scale):
    return init + scale * state.u, -state.value


# ------------------------------------------------------------------- Newton polish
#: The largest dimension whose mode, where the loops run in Python, is polished by Newton
#: steps on the whole Hessian after the L-BFGS search (:func:`newton_polish`): the
#: Hessian costs the d Hessian-vector products the diagonal scales take anyway, and its
#: eigendecomposition little next to them up to here.
NEWTON_MAX_DIM = 256

#: At most this many Newton steps. Far from the mode the steps are damped (the line
#: search takes a fraction of each): on a diamonds-like regression (26 coordinates, raw
#: collinear columns, a noise scale started 10⁴ times too large) the polish climbed from
#: 18 000 nats below the mode and needed 64 steps, each about a tenth of a second.
NEWTON_STEPS = 100

#: The polish stops where Newton's decrement, ½ gᵀ|H|⁻¹g (the gain in nats a step would
#: make on a quadratic), is below this.
NEWTON_DECREMENT = 1e-2

#: Eigenvalues of the standardized curvature are taken at least this fraction of the
#: largest (in magnitude): a step along a direction flatter than that is bounded.
NEWTON_FLOOR = 1e-8


#: The damped half of the Newton line search (``_newton_points``): steps of length
#: at most r for r log-spaced over this range (in the unconstrained coordinates' units).
NEWTON_RADII = (1e-4, 1e4)


@small_jit(static_argnums=(3,))
def _newton_points(hessian, grad, z, rows):
    """The saddle-free Newton step from ``z`` (|H|⁻¹ g, H's eigenvalues by magnitude,
    in coordinates standardized by H's diagonal) and ``rows`` points to try: z + 2⁻ʳ
    step for the first half (r = 0, 1, …), and for the second z + (|H| + μ I)⁻¹ g with
    μ = ‖g‖ / r, a step of length at most r, for radii r log-spaced over
    :data:`NEWTON_RADII` (a trust region's path, from a gradient step to Newton's).
    The second half is for points where the curvature says nothing: a mode search that
    ended with a noise scale 10¹⁷ times too large sits where the likelihood's gradient
    and curvature have vanished but its log density still climbs (linearly) back, and
    every shortening of Newton's step overshoots. With Newton's decrement ½ gᵀ|H|⁻¹g
    (NaN where not finite: the polish stops there, not converged)."""
    diag = jnp.abs(jnp.diagonal(hessian))
    ok = jnp.isfinite(diag) & (diag > 0)
    d = jnp.where(ok, jnp.sqrt(jnp.where(ok, diag, 1.0)), 1.0)
    standardized = hessian / d[:, None] / d[None, :]
    w, u = jnp.linalg.eigh(0.5 * (standardized + standardized.T))
    w = jnp.abs(w)
    w = jnp.maximum(w, NEWTON_FLOOR * jnp.max(w))
    projected = u.T @ (grad / d)
    coef = projected / jnp.where(w > 0, w, 1.0)
    step = (u @ coef) / d
    decrement = 0.5 * jnp.vdot(projected, coef)
    finite = jnp.isfinite(decrement) & jnp.all(jnp.isfinite(step))
    halvings, damped = rows - rows // 2, rows // 2
    lengths = 2.0 ** -jnp.arange(halvings, dtype=z.dtype)
    # the trust region's path, in the model's own coordinates
    w0, u0 = jnp.linalg.eigh(0.5 * (hessian + hessian.T))
    radii = jnp.logspace(*np.log10(NEWTON_RADII), damped, dtype=z.dtype)
    mus = jnp.linalg.norm(grad) / radii
    damped_steps = ((u0.T @ grad) / (jnp.abs(w0) + mus[:, None])) @ u0.T
    steps = jnp.concatenate([
        lengths[:, None] * jnp.where(finite, step, 0.0),
        jnp.where(jnp.all(jnp.isfinite(damped_steps), axis=-1, keepdims=True), damped_steps, 0.0),
    ])
    return z + steps, jnp.where(finite, decrement, jnp.nan)


@small_jit()
def _newton_pick(zs, values, grads, z, value, grad):
    """The line search's best point where it raises log p̄, else ``z``."""
    fine = jnp.isfinite(values) & jnp.all(jnp.isfinite(grads), axis=-1)
    values = jnp.where(fine, values, -jnp.inf)
    i = jnp.argmax(values)
    better = values[i] > value
    return (
        jnp.where(better, zs[i], z), jnp.where(better, values[i], value),
        jnp.where(better, grads[i], grad), better,
    )


def newton_polish(
    z: jax.Array, hessian: jax.Array, *, oracle: RowsOracle, rows: int,
    num_steps: int = NEWTON_STEPS, rehearse: bool = False,
) -> tuple[jax.Array, jax.Array, bool, bool]:
    """Newton steps on log p̄ from ``z`` (``hessian`` ∇² log p̄ there), each with a line
    search of ``rows`` step lengths, while Newton's decrement is at least
    :data:`NEWTON_DECREMENT` nats and a step raises log p̄; loops in Python (a compiled
    oracle, concrete inputs).

    L-BFGS in coordinates standardized by the curvature's diagonal stalls where the
    posterior's correlations are near ±1 (a regression on raw, uncentered and collinear
    columns: a condition number of 10⁷ to 10⁸ after standardization; on a 26-coordinate
    one the warm start's q ended centred 400 to 1 300 nats below the mode); Newton's
    steps on the whole Hessian reach the mode in about ten (from 18 000 nats below, with a
    noise scale started 10⁴ times too large, in 64). Returns the point, the Hessian
    there, whether it moved, and whether it converged (Newton's decrement there below
    :data:`NEWTON_DECREMENT`: a mode, not a point on the way up a spike). ``rehearse``: one step whatever the decrement
    (:func:`precompile`).
    """
    oracle, host = resolve_oracle(None, oracle, z, hessian)
    if host is False:
        raise ValueError("newton_polish runs its loop in Python: pass a compiled oracle.")
    values, grads = oracle.value_and_grad(_rows_of(z, rows, host=host))
    value, grad = _take((values, grads), np.int32(0), host=host)  # the first row: z
    moved = converged = False
    for _ in range(num_steps):
        zs, decrement = _newton_points(hessian, grad, z, rows, host=host)
        converged = bool(decrement < NEWTON_DECREMENT)  # False where NaN (not finite)
        if not rehearse and not bool(decrement >= NEWTON_DECREMENT):
            break
        values, grads = oracle.value_and_grad(zs)
        z, value, grad, better = _newton_pick(zs, values, grads, z, value, grad, host=host)
        if not bool(better):
            break
        hessian = hessian_matrix(None, z, oracle=oracle)
        moved = True
        converged = False  # the decrement at the new point is not known yet
        if rehearse:
            break
    return z, hessian, moved, converged


# ---------------------------------------------------------------------------- VI
def _adam(learning_rate, num_steps):
    return optax.adam(optax.cosine_decay_schedule(learning_rate, num_steps, alpha=0.01))


def _vi_ask(params, key, starts, scales, num_particles):
    """The step's noise (the same for every start, as fit_gaussian's) and the points
    z = start + s ⊙ u, u ~ q_u, of all starts as rows."""
    noise = jax.random.normal(key, (num_particles, starts.shape[-1]), starts.dtype)

    def points(loc, raw, start, s):
        us = jax.vmap(lambda e: gaussian_sample(e, loc, _raw_to_scale(raw)))(noise)
        return start + s * us

    zs = jax.vmap(points)(*params, starts, scales)
    return noise, zs.reshape(-1, starts.shape[-1])


@small_jit(static_argnums=(4, 5, 6))
def _vi_begin(key, starts, scales, unit_scales, full_rank, num_particles, steps_and_rate):
    """Every start's q_u = N(0, unit scale), the optimizer, the step keys and the
    first step's points."""
    num_steps, learning_rate = steps_and_rate
    # full rank: (starts, d, d) initial factors, or their diagonals
    unit = jax.vmap(jnp.diag)(unit_scales) if full_rank and unit_scales.ndim == 2 else unit_scales
    params = (jnp.zeros_like(starts), jax.vmap(_scale_to_raw)(unit))
    return _vi_carry(key, params, starts, scales, num_particles, steps_and_rate)


@small_jit(static_argnums=(4, 5))
def _vi_resume(key, params, starts, scales, num_particles, steps_and_rate):
    """:func:`_vi_begin` from given ``params`` (a further round of the same starts): a
    fresh optimizer and schedule, new step keys."""
    return _vi_carry(key, params, starts, scales, num_particles, steps_and_rate)


def _vi_carry(key, params, starts, scales, num_particles, steps_and_rate):
    """The VI's first carry from ``params``, and the first step's points."""
    num_steps, learning_rate = steps_and_rate
    keys = jax.random.split(key, num_steps)
    losses = jnp.zeros((num_steps, starts.shape[0]), starts.dtype)
    noise, zs = _vi_ask(params, keys[0], starts, scales, num_particles)
    return (params, _adam(learning_rate, num_steps).init(params), losses, keys, noise), zs


@small_jit(static_argnums=(5,))
def _vi_step(carry, values, grads, i, starts_scales, steps_and_rate):
    """One Adam step of every start's negative ELBO at step ``i``'s draws (the oracle's
    ``values`` and ``grads`` there), and step i + 1's points.

    The gradient of log p̄ enters through a linear surrogate (the oracle's gradient,
    held fixed), the rest (the draws' dependence on q, log q) by autodiff: the same
    gradient as fit_gaussian's."""
    params, opt_state, losses, keys, noise = carry
    starts, scales = starts_scales
    num_steps, learning_rate = steps_and_rate
    num_starts, particles = starts.shape[0], noise.shape[0]
    values = values.reshape(num_starts, particles)
    grads_u = grads.reshape(num_starts, particles, -1) * scales[:, None, :]

    def neg_elbo(params):
        def one(loc, raw, g, value):
            scale = _raw_to_scale(raw)
            us = jax.vmap(lambda e: gaussian_sample(e, loc, scale))(noise)
            log_q = jax.vmap(lambda e: gaussian_logpdf_of_draw(e, loc, scale))(noise)
            surrogate = -jnp.mean(jnp.sum(jax.lax.stop_gradient(g) * us, axis=-1) - log_q)
            return surrogate, -jnp.mean(value - log_q)

        surrogates, step_losses = jax.vmap(one)(*params, grads_u, values)
        return jnp.sum(surrogates), step_losses

    grad, step_losses = jax.grad(neg_elbo, has_aux=True)(params)
    updates, opt_state = _adam(learning_rate, num_steps).update(grad, opt_state, params)
    params = optax.apply_updates(params, updates)
    if params[1].ndim == 3:
        params = (params[0], jnp.tril(params[1]))
    losses = jax.lax.dynamic_update_index_in_dim(losses, step_losses, i, 0)
    next_key = keys[jnp.minimum(i + 1, num_steps - 1)]
    noise, zs = _vi_ask(params, next_key, starts, scales, particles)
    return (params, opt_state, losses, keys, noise), zs


def _fit_starts(oracle, host, key, starts, scales, unit_scales, full_rank, num_steps,
                learning_rate, num_particles, iterations=None, callback=None, params=None,
                done=0):
    """VI of q_u from each start (z = start + scale ⊙ u, q_u from N(0, unit scale)),
    Adam on all starts at once with the same draws (as ``vmap`` of fit_gaussian over
    the starts); returns the last carry: ``(params in u, optimizer state, losses
    (num_steps, starts), keys, noise)``. ``params``: go on from these (a further round,
    ``_more_rounds``), ``done`` steps already counted by ``callback``."""
    steps_and_rate = (num_steps, float(learning_rate))
    if params is None:
        carry, zs = _vi_begin(
            key, starts, scales, unit_scales, full_rank, num_particles, steps_and_rate,
            host=host,
        )
    else:
        carry, zs = _vi_resume(key, params, starts, scales, num_particles, steps_and_rate, host=host)

    def body(i, state):
        carry, zs = state
        values, grads = oracle.value_and_grad(zs)
        state = _vi_step(carry, values, grads, i, (starts, scales), steps_and_rate, host=host)
        if callback is not None and host is not False:
            callback(done + int(i) + 1)
        return state

    iterations = num_steps if iterations is None else min(iterations, num_steps)
    carry, _ = _loop(host, iterations, body, (carry, zs))
    return carry


#: Rounds of the warm start's VI at most (each ``num_steps`` Adam steps on a fresh
#: cosine schedule, from where the last ended), where the loops run in Python: a round
#: follows while a start's fit was still falling over its round's second half and could
#: pass the best one (``_worth_another_round``). A centred hierarchical model's mode
#: search ends in the spike where a group scale goes to 0, and VI from its Laplace
#: approximation stays in that collapsed fit; the plain start climbs out of the prior
#: more slowly and, after one round, could lose to it: a Poisson GLMM with 300 groups of
#: 5 (d = 305) started 267 nats below its fit after more rounds, its group scale at 0.01
#: of NUTS's, and UHA's training never left it.
VI_MAX_ROUNDS = 4

#: Nats a start's loss must have fallen over the second half of a round (and more than
#: twice its standard error) for another round: a further round costs as much as the
#: first.
VI_ROUND_MIN_FALL = 1.0

#: Nats by which half of one more such fall must take a start that is not the best
#: below the best start's final loss for another round: on the zoo, worse starts that
#: would pass it by less (the GP of ``benchmarks.startup``: 1.02 nats) ended level with
#: it, a round spent for nothing; those that gained passed it by far more.
VI_ROUND_PASS_MARGIN = 2.0


def _worth_another_round(losses, scales) -> bool:
    """Whether a further VI round is worth its cost, from the last round's ``losses``
    (steps, starts), in u-coordinates (shifted by each start's Σ log s, as in
    :func:`_pick`): some start's mean loss fell from the middle tenth of the round to
    its last tenth by more than :data:`VI_ROUND_MIN_FALL` nats and twice the standard
    error, and it is the best start, or half of one more such fall would take it more
    than :data:`VI_ROUND_PASS_MARGIN` below the best start's final loss (on the zoo, worse
    starts 0.2 to 4 nats behind and falling 2.5 to 5 nats all ended level with the best,
    a round spent for nothing). The fall over the second half, not over the last
    tenth: the cosine schedule's last steps are too small to show that a fit is still
    far from its optimum."""
    losses = _model_losses(np.asarray(losses, np.float64), np.asarray(scales, np.float64))
    n = losses.shape[1]
    tail = n // 10
    if tail < 2:
        return False
    last, middle = losses[:, -tail:], losses[:, n // 2 - tail : n // 2]
    final = np.mean(last, axis=1)
    fall = np.mean(middle, axis=1) - final
    se = np.sqrt((np.var(middle, axis=1) + np.var(last, axis=1)) / tail)
    finite = np.isfinite(final) & np.isfinite(fall) & np.isfinite(se)
    if not finite.any():
        return False
    best = np.min(np.where(finite, final, np.inf))
    is_best = final <= best
    # the best start: still falling; another: passing the best by a round's worth
    passes = np.where(is_best, True, final - 0.5 * fall < best - VI_ROUND_PASS_MARGIN)
    going = finite & (fall > np.maximum(2.0 * se, VI_ROUND_MIN_FALL)) & passes
    return bool(going.any())


def _more_rounds(oracle, host, key, fits, starts, scales, unit_scales, full_rank, num_steps,
                 learning_rate, num_particles, callback, max_rounds):
    """Further rounds of :func:`_fit_starts` while :func:`_worth_another_round`: the
    last round's carry, and the losses (steps, starts) of the rounds before it."""
    earlier = []
    for r in range(1, max_rounds):
        if not _worth_another_round(fits[2], scales):
            break
        earlier.append(np.asarray(fits[2]))
        fits = _fit_starts(
            oracle, host, jax.random.fold_in(key, r), starts, scales, unit_scales, full_rank,
            num_steps, learning_rate, num_particles, None, callback, params=fits[0],
            done=r * num_steps,
        )
    return fits, earlier


# ------------------------------------------------------------------------ scoring
@small_jit(static_argnums=(3, 4))
def _score_points(key, loc, scale, num_draws, rows):
    """The noise of ``num_draws`` draws from q (gaussian_log_weights's with the same
    key), and the draws in chunks of ``rows`` (the missing rows of the last chunk copies
    of the first draws)."""
    noise = jax.random.normal(key, (num_draws, loc.shape[-1]), loc.dtype)
    zs = jax.vmap(lambda e: gaussian_sample(e, loc, scale))(noise)
    num = -(-num_draws // rows)
    padded = jnp.resize(zs, (num * rows, zs.shape[-1]))
    return noise, padded.reshape(num, rows, -1)


@small_jit()
def _score_finish(values, noise, loc, scale):
    values = values[: noise.shape[0]]
    return values - jax.vmap(lambda e: gaussian_logpdf_of_draw(e, loc, scale))(noise)


def oracle_log_weights(
    oracle: RowsOracle, rng_key: jax.Array, loc: jax.Array, scale: jax.Array,
    num_draws: int, rows: int,
) -> jax.Array:
    """log p̄(z) − log q(z) at ``num_draws`` draws z ~ q (the draws of
    :func:`~numpyro_uha.core.gaussian_log_weights` with the same key), evaluated
    ``rows`` at a time by ``oracle``."""
    oracle, host = resolve_oracle(None, oracle, rng_key, loc, scale)
    noise, chunks = _score_points(rng_key, loc, scale, num_draws, rows, host=host)
    num = chunks.shape[0]

    def body(c, values):
        return _put(values, oracle.value_and_grad(_take(chunks, c, host=host))[0], c, host=host)

    xp = jnp if host is False else np  # constants built by NumPy: no eager programs
    values = _loop(host, num, body, xp.zeros(num * rows, loc.dtype))
    return _score_finish(values, noise, loc, scale, host=host)


# --------------------------------------------------------------------- warm start
@small_jit(static_argnums=(3,))
def _prepare(rng_key, init_loc, fallback_scale, dim):
    score_key, fit_key = jax.random.split(rng_key)
    fallback = jnp.broadcast_to(jnp.asarray(fallback_scale, init_loc.dtype), (dim,))
    return score_key, fit_key, fallback


@small_jit()
def _starts(init_loc, mode, scale0, scale1, fallback):
    # 0: the plain warm start (z-coordinates, q = N(init_loc, fallback_scale²));
    # 1: from init_loc, standardized by the curvature there;
    # 2: the Laplace approximation at the mode, in its standardized coordinates.
    ones = jnp.ones_like(init_loc)
    starts = jnp.stack([init_loc, init_loc, mode])
    return starts, jnp.stack([ones, scale0, scale1]), jnp.stack([fallback, ones, ones])


def _model_losses(losses, scales, xp=np):
    """The VI's ``losses`` (steps, starts) as (starts, steps) negative ELBOs in the
    model's coordinates: log p̄ in u-coordinates lacks each start's constant Σ log s."""
    return losses.T - xp.sum(xp.log(scales), axis=1)[:, None]


@small_jit(static_argnums=(3, 4))
def _pick(fits, starts, scales, full_rank, tail):
    """The fit with the lowest final loss, in the model's coordinates, and whether its
    VI had converged."""
    params, _, all_losses, _, _ = fits
    locs = starts + scales * params[0]
    fitted = jax.vmap(_raw_to_scale)(params[1])
    fitted = scales[:, :, None] * fitted if full_rank else scales * fitted
    all_losses = _model_losses(all_losses, scales, jnp)
    final = jnp.mean(all_losses[:, -tail:], axis=1)
    final = jnp.where(jnp.isfinite(final), final, jnp.inf)
    best = jnp.argmin(final)
    return locs[best], fitted[best], all_losses[best], best.astype(jnp.int32), _converged(all_losses[best])


#: :func:`warm_start`'s default ``laplace_tolerance``, in nats: below the VI's own noise
#: at the end of its default 1000 steps (its fit was 0.06 nats *worse* than the Laplace
#: approximation on a 10 000-point logistic regression whose Laplace KL was 0.014).
LAPLACE_TOLERANCE = 0.02


#: A polished point where the Newton steps did not converge is not kept where some
#: coordinate's curvature scale there is below this fraction of its scale at the
#: unpolished mode: the signature of a spike (a centred
#: hierarchical model's density near a group scale σ → 0, where every scale shrinks with
#: σ, and float32's log weights are no longer to be trusted: on the hold-out set's
#: centred surgical model the polished start scored an "ELBO" of +55 where log Z is
#: about −46; its steps ended at a point with a non-finite Hessian).
NEWTON_MIN_SCALE_RATIO = 0.1


@small_jit()
def _keep_polished(weights, other, scale, other_scale, converged):
    """Whether the polished Laplace approximation (log ``weights``, curvature scales
    ``scale``) is kept over the unpolished one: a higher mean log weight (an ELBO
    estimate; not finite counts as −∞), and the Newton steps ``converged`` (a mode) or
    no scale collapsed (:data:`NEWTON_MIN_SCALE_RATIO`)."""

    def elbo(w):
        mean = jnp.mean(w)
        return jnp.where(jnp.isfinite(mean), mean, -jnp.inf)

    kept = converged | jnp.all(scale >= NEWTON_MIN_SCALE_RATIO * other_scale)
    return (elbo(weights) > elbo(other)) & kept


@small_jit(static_argnums=(3,))
def _laplace_q(starts, scales, unit_scales, full_rank):
    """The Laplace start (the last) as a q in the model's coordinates."""
    loc, s, unit = starts[-1], scales[-1], unit_scales[-1]
    return loc, (s[:, None] * unit if full_rank and unit.ndim == 2 else s * unit)


def laplace_close(log_weights, tolerance: float) -> bool:
    """Whether a q whose log weights log p̄ − log q at draws from q are
    ``log_weights`` is within ``tolerance`` nats of the posterior: every weight finite,
    half their variance (KL(q‖p) to second order) plus two of its standard errors, and
    the gap between the importance-weighted bound and the ELBO (a lower bound on
    KL(q‖p) that a heavy right tail of the weights inflates), both at most
    ``tolerance``. The KL is as q's own draws see it: a second mode they never reach
    does not show (nor does it to the VI, whose draws come from the same kind of q)."""
    lw = np.asarray(log_weights, np.float64)
    n = lw.shape[0]
    if n < 2 or not np.all(np.isfinite(lw)):
        return False
    dev = lw - lw.mean()
    square = dev**2
    var = float(np.mean(square)) * n / (n - 1)
    if not 0.5 * var <= tolerance:  # far off (its higher moments may overflow): no
        return False
    var_se = float(np.sqrt(max(np.mean(square**2) - np.mean(square) ** 2, 0.0) / n))
    top = float(dev.max())
    gap = top + float(np.log(np.mean(np.exp(dev - top))))  # log-mean-exp, without overflow
    return 0.5 * (var + 2.0 * var_se) <= tolerance and gap <= tolerance


def loss_decrease(losses, xp=np):
    """How much the VI's loss fell at the end: (mean over the second-last tenth of the
    steps − mean over the last tenth, its standard error), in nats; ``None`` with fewer
    than 20 steps. ``xp``: ``numpy`` (host) or ``jax.numpy`` (inside a program)."""
    n = losses.shape[0] // 10
    if n < 2:
        return None
    last, before = losses[-n:], losses[-2 * n : -n]
    diff = xp.mean(before) - xp.mean(last)
    return diff, xp.sqrt(xp.var(before) / n + xp.var(last) / n)


def _converged(losses: jax.Array) -> jax.Array:
    decrease = loss_decrease(losses, jnp)
    if decrease is None:
        return jnp.asarray(True)
    diff, se = decrease
    return jnp.isfinite(diff) & (diff <= 2.0 * se)


def warm_start(
    rng_key: jax.Array,
    logdensity_fn: Callable[[jax.Array], jax.Array] | None,
    init_loc: jax.Array,
    fallback_scale: float | jax.Array,
    *,
    full_rank: bool = False,
    num_steps: int = 1000,
    learning_rate: float = 0.01,
    num_particles: int = 8,
    mode_steps: int = 200,
    num_score_draws: int = 256,
    oracle: RowsOracle | None = None,
    vi_iterations: int | None = None,
    callback: Callable[[int], None] | None = None,
    laplace_tolerance: float | None = LAPLACE_TOLERANCE,
    max_rounds: int = VI_MAX_ROUNDS,
) -> WarmStart:
    """Fit q to the posterior, robust to its scales (see the module docstring).

    ``oracle`` (a :class:`RowsOracle`, e.g. :func:`rows_oracle` of ``logdensity_fn``)
    replaces ``logdensity_fn``: with a compiled one and concrete inputs, the log density
    is compiled twice in all (value and gradient at ``3 · num_particles`` rows,
    Hessian-vector products at :data:`HVP_ROWS` rows) and the loops run in Python.
    ``vi_iterations`` stops the VI after that many of its ``num_steps`` steps (the
    schedule unchanged): :func:`precompile`'s rehearsal, which only needs each step
    compiled. ``callback(n)`` is called after each VI step with the number of steps done,
    where the loops run in Python (a compiled oracle and concrete inputs; not inside
    ``lax`` loops): a progress bar's hook.

    ``max_rounds``: where the loops run in Python, the VI goes on for up to that many
    rounds of ``num_steps`` (each on a fresh cosine schedule from where the last ended)
    while a start has not converged and could still pass the best one (see
    :data:`VI_MAX_ROUNDS`); ``losses`` then holds every round's.

    ``laplace_tolerance`` (nats; ``None``: off): where the loops run in Python, the
    Laplace approximation is scored at ``num_score_draws`` draws before the VI, and
    where :func:`laplace_close` finds it within ``laplace_tolerance`` of the posterior
    (KL(q‖p) = log Z − ELBO, estimated by half the variance of its log weights, plus two
    standard errors, and by the importance-weighted bound's gap), the VI is skipped:
    no fit of a Gaussian can gain more than that KL, and it is already below what the
    VI's own noise leaves (a large-data posterior is this close to Gaussian, where the
    VI's ``num_steps`` full-data gradients dominate the start's cost). The result is
    then the Laplace q (``start`` 2, ``converged``, no ``losses``), its log weights
    those of the check (the same draws the kept fit is scored at otherwise).
    """
    init_loc = jnp.asarray(init_loc)
    oracle, host = resolve_oracle(logdensity_fn, oracle, rng_key, init_loc, fallback_scale)
    rows = 3 * num_particles  # every value-and-gradient call: the VI's three starts
    dim = init_loc.shape[-1]
    score_key, fit_key, fallback = _prepare(rng_key, init_loc, fallback_scale, dim, host=host)

    scale0 = curvature_scale(None, init_loc, fallback, oracle=oracle)
    mode, _ = find_mode(None, init_loc, scale0, mode_steps, oracle=oracle, rows=rows)
    if host is False or bool(_far(mode, init_loc, scale0, host=host)):
        # the start's scales were off by orders of magnitude: search again from there,
        # standardized by the curvature where the first search stopped
        scale = curvature_scale(None, mode, scale0, oracle=oracle)
        mode, _ = find_mode(None, mode, scale, mode_steps, oracle=oracle, rows=rows)
    laplace_full = full_rank and dim <= MAX_CURVATURE_DIM
    polish = host is not False and dim <= NEWTON_MAX_DIM

    def laplace_starts(mode, hessian):
        if hessian is not None:
            # the same Hessian-vector products give the diagonal scales and the whole matrix
            scale1 = _curvature_finish(_diagonal(hessian, host=host), scale0, host=host)
        else:
            scale1 = curvature_scale(None, mode, scale0, oracle=oracle)
        starts, scales, unit_scales = _starts(init_loc, mode, scale0, scale1, fallback, host=host)
        if laplace_full:
            unit_scales = _laplace_units(unit_scales, hessian, scale1, host=host)
        return starts, scales, unit_scales

    def laplace_weights(laplace):
        lap_loc, lap_scale = _laplace_q(*laplace, full_rank, host=host)
        return oracle_log_weights(oracle, score_key, lap_loc, lap_scale, num_score_draws, rows)

    hessian = hessian_matrix(None, mode, oracle=oracle) if laplace_full or polish else None
    laplace = laplace_starts(mode, hessian)
    lap_weights = None
    if polish:
        # Newton steps where L-BFGS stalled (correlations near ±1); the polished mode is
        # kept where its Laplace approximation's ELBO is the higher and the steps
        # converged or no curvature scale collapsed (a hierarchical model's density
        # grows without bound into a spike that Newton would follow, never converging)
        rehearse = vi_iterations is not None
        polished, polished_hessian, moved, converged = newton_polish(
            mode, hessian, oracle=oracle, rows=rows, rehearse=rehearse
        )
        if moved or rehearse:
            polished_laplace = laplace_starts(polished, polished_hessian)
            lap_weights = laplace_weights(laplace)
            polished_weights = laplace_weights(polished_laplace)
            _, polished_scales, _ = polished_laplace
            _, unpolished_scales, _ = laplace
            if bool(_keep_polished(  # the Laplace starts' curvature scales (the last)
                polished_weights, lap_weights, polished_scales[-1], unpolished_scales[-1],
                np.bool_(converged), host=host,
            )):
                laplace, lap_weights = polished_laplace, polished_weights
    starts, scales, unit_scales = laplace

    if host is not False and laplace_tolerance is not None:
        # the Laplace approximation scored first: VI cannot gain more than its KL
        if lap_weights is None:
            lap_weights = laplace_weights(laplace)
        lap_loc, lap_scale = _laplace_q(starts, scales, unit_scales, full_rank, host=host)
        if vi_iterations is None and laplace_close(lap_weights, laplace_tolerance):
            return WarmStart(
                lap_loc, lap_scale, np.zeros((0,), init_loc.dtype), np.int32(2),
                lap_weights, np.bool_(True),
            )
    fits = _fit_starts(
        oracle, host, fit_key, starts, scales, unit_scales, full_rank, num_steps,
        learning_rate, num_particles, vi_iterations, callback,
    )
    earlier = []
    if host is not False and vi_iterations is None and max_rounds > 1:
        fits, earlier = _more_rounds(
            oracle, host, fit_key, fits, starts, scales, unit_scales, full_rank, num_steps,
            learning_rate, num_particles, callback, max_rounds,
        )
    loc, scale, losses, best, converged = _pick(
        fits, starts, scales, full_rank, max(1, num_steps // 10), host=host
    )
    if earlier:  # the kept start's losses over every round, as _pick gives them
        scales_np = np.asarray(scales)
        losses = np.concatenate(
            [_model_losses(r, scales_np)[int(best)] for r in earlier] + [np.asarray(losses)]
        )
    log_weights = oracle_log_weights(oracle, score_key, loc, scale, num_score_draws, rows)
    # (called in precompile's rehearsal too, vi_iterations set, to compile it there)
    if lap_weights is not None and bool(
        _laplace_better(lap_weights, log_weights, host=host)
    ) and vi_iterations is None:
        # the VI made its starts worse (noisy steps on d(d+1)/2 factor entries at
        # large d): the Laplace q as it is, as where it was close enough to skip the VI
        lap_loc, lap_scale = _laplace_q(starts, scales, unit_scales, full_rank, host=host)
        return WarmStart(
            lap_loc, lap_scale, np.zeros((0,), init_loc.dtype), np.int32(2),
            lap_weights, np.bool_(True),
        )
    return WarmStart(loc, scale, losses, best, log_weights, converged)


@small_jit()
def _laplace_better(laplace_weights, fit_weights):
    """Whether the Laplace q's ELBO estimate beats the kept fit's: their mean log
    weights at the same noise (the same ``score_key`` and number of draws), every weight
    finite; a non-finite fit's weights count as −∞."""
    fit = jnp.where(jnp.all(jnp.isfinite(fit_weights)), jnp.mean(fit_weights), -jnp.inf)
    return jnp.all(jnp.isfinite(laplace_weights)) & (jnp.mean(laplace_weights) > fit)


# -------------------------------------------------------------- compile in advance
_REHEARSED: set = set()


def precompile(
    signature, rehearsal: Callable[[RowsOracle], object], width: int | None = None,
    step_device=None,
) -> threading.Thread | None:
    """Compile the model-free steps of a warm start in a background thread, while the
    caller does other work (e.g. traces its model): ``rehearsal(oracle)`` runs the
    same calls the real setup will make (the same shapes, dtypes and static
    arguments, e.g. :func:`warm_start` with ``vi_iterations=2``) on a stand-in
    compiled oracle, a unit Gaussian centred at 1. Every :func:`small_jit` step is then
    in JAX's compilation cache when the real setup calls it, and only the model's own
    program(s) are left to compile there. The stand-in touches nothing but JAX, so
    it may run beside code that uses global state (NumPyro's handler stack).

    ``signature`` (hashable: the dimension, dtype and static arguments) is rehearsed
    once per process. ``width``: the stand-in is a :func:`difference_oracle` of that
    many rows, as the real setup's (else exact products), with its steps on
    ``step_device`` (see :func:`difference_oracle`). Returns the started thread
    (``join`` it before the real calls, so that the two do not compile the same steps at
    once), or ``None`` when already rehearsed. Failures in the thread are ignored: the
    real call compiles what is left.
    """
    signature = (signature, step_device)
    with _COMPILE_LOCK:
        if signature in _REHEARSED:
            return None
        _REHEARSED.add(signature)
    oracle = rows_oracle(lambda z: -0.5 * jnp.sum((z - 1.0) ** 2))
    if width is not None:
        oracle = difference_oracle(oracle.value_and_grad, width, step_device)

    def run():
        try:
            jax.block_until_ready(rehearsal(oracle))
        except Exception:  # noqa: BLE001 - a cache warm-up only
            pass

    thread = threading.Thread(target=run, name="numpyro-uha-precompile", daemon=True)
    thread.start()
    return thread


def compile_in_background(*lowered) -> list[threading.Thread]:
    """Compile already-lowered programs (``jax.jit(f).lower(...)``) in background
    threads, one each: XLA's compilation releases the GIL, so they compile beside each
    other and beside the caller, and a later call of ``f`` with the same argument types
    finds its program compiled. Join the threads before that call: JAX would otherwise
    compile the same program a second time. Failures are ignored (the call compiles)."""

    def run(program):
        try:
            program.compile()
        except Exception:  # noqa: BLE001 - a cache warm-up only
            pass

    threads = [
        threading.Thread(target=run, args=(program,), name="numpyro-uha-compile", daemon=True)
        for program in lowered
    ]
    for thread in threads:
        thread.start()
    return threads
