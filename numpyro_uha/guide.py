"""``UHAGuide``: the NumPyro adapter around the pure-JAX core.

This is the only module that knows about NumPyro traces and sites. It turns a model into
a flat log density in unconstrained space (Jacobians included) from the arguments of the
*current* call, registers the learnable parameters, and hands everything to
:func:`numpyro_uha.core.annealed_sample`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping
from functools import partial
import functools
import hashlib
import sys
import warnings
import weakref
from typing import NamedTuple

import jax
import jax.scipy.linalg  # noqa: F401 - solve_triangular (_force_sds)
import jax.numpy as jnp
from jax.sharding import NamedSharding
import numpy as np
import numpyro
from numpyro import handlers
from numpyro.primitives import Messenger
import numpyro.distributions as dist
import tqdm
from numpyro.distributions import constraints
from numpyro.distributions.transforms import biject_to
from numpyro.distributions.util import sum_rightmost
from numpyro.infer.autoguide import (
    AutoContinuous,
    AutoDiagonalNormal,
    AutoGuide,
    AutoMultivariateNormal,
    AutoNormal,
)
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import constrain_fn, potential_energy, unconstrain_fn
from numpyro.infer.util import log_density as model_log_density

from numpyro_uha import _decenter, _enumerate, _hidden, _linalg_hang, _supports
from numpyro_uha._compiled_init import compiled_initialization
from numpyro_uha._divergence import (
    DIVERGENCE_ENERGY,  # noqa: F401 - guide.DIVERGENCE_ENERGY, as before
    DivergenceRecord,
    LatchConstraint,
    UHADivergenceError,
    UHADivergenceWarning,
    UHADrawsOffWarning,
    UHAFitWarning,
    UHAImproperPosteriorWarning,
    UHASupportWarning,
    UHANonfiniteDrawsWarning,
    UHAWorseThanStartWarning,
    check_latch,
    chain_diverged,
    finite_guard,
    gate,
)
from numpyro_uha._keywords import check_model_keywords, did_you_mean_site
from numpyro_uha._memory_maps import relieve as relieve_memory_maps
from numpyro_uha._masked import (
    completable,
    _batch_mask,
    completion_log_density,
    current_coordinates,
    has_mask,
    masked_out_entries,
)
from numpyro_uha._precondition import (
    StandardizedCholesky,
    StandardizedPositive,
    StandardizedReal,
    _scale_corr_inverse,
)
from numpyro_uha._weights import (
    SHIFT_BAD,
    SPREAD_BAD,
    WeightSummary,
    UHA_ADVICE,
    _warn_poor_fit,
    flag_checks,
    khat_counts,
    summary_from_values,
    summary_khat,
    summary_largest,
    summary_values,
    weight_summary,
)
from numpyro_uha.core import (
    AnnealingInfo,
    AnnealingParams,
    annealed_sample,
    betas_from_logits,
    check_integrator,
    gaussian_logpdf,
    step_sizes_from_beta,
    step_sizes_under_ceiling,
)
from numpyro_uha.core.batching import batched_map, reuse_width, signature_of
from numpyro_uha.core.sharding import (
    gather,
    leading_axis_sharding,
    num_shards,
    put_global,
    replicated,
    shard_leading,
)
from numpyro_uha.core.warm_start import (
    HVP_ROWS,
    difference_oracle,
    laplace_close,
    loss_decrease,
    max_curvature,
    oracle_log_weights,
    precompile,
    quick_compiler_options,
    resolve_oracle,
    rows_oracle,
    small_jit,
    to_default_device,
    warm_start,
)
from numpyro_uha.core.warm_start import _traced as _is_tracer  # one tracer test for all

__all__ = [
    "UHAGuide",
    "WeightedDraws",
    "GROUPS",
    "NONFINITE_MODES",
    "UHADivergenceError",
    "UHADivergenceWarning",
    "UHAFitWarning",
    "UHADrawsOffWarning",
    "UHAWorseThanStartWarning",
    "UHAImproperPosteriorWarning",
    "UHASupportWarning",
    "UHANonfiniteDrawsWarning",
]

#: Values of the ``nonfinite`` argument of :meth:`UHAGuide.sample_posterior`.
NONFINITE_MODES = ("drop", "raise", "keep")
#: With ``nonfinite="drop"``, more than this fraction of non-finite draws still raises.
MAX_NONFINITE_FRACTION = 0.1

#: The stability ceiling on the leapfrog step, as a fraction of the quadratic limit 2/sqrt(λ).
STABILITY_FRACTION = 0.75

#: ``base_dist="auto"`` gives a full-rank q up to this many latent coordinates: a
#: mean-field q cannot follow correlated posteriors (a GARCH(1,1)'s parameters: sds 45 %
#: too small with the diagonal q, 7 % with full rank), and UHA's K = 32 steps do not make
#: up for it. Its d(d+1)/2 scale parameters and O(d²) bridge density per leapfrog step
#: (a triangular inverse once per chain, O(d³)) cost more per SVI step as d grows.
#: Measured (``benchmarks.full_rank_cost``, results ``full_rank_cost_all``: K = 32, 2 000
#: steps of Adam 1e-3, the same run; the bound, full rank / diagonal, and the time per
#: jitted step, full over diagonal, 2-core CPU): ionosphere (d = 35) −111.76 / −114.37
#: for 1.2 times the time, sonar (61) −108.61 / −116.04 for 2.2, a1a (120) −680.22 /
#: −707.92 for 2.1, the Lorenz bridge (90) −29.89 / −48.02 for 1.2, a BYM model (101)
#: −191.24 / −231.00 for 4.1, madelon (501) −2400.08 / −2418.21 for 3.3 (the diagonal q's
#: UHA extrapolated to K = 256 reaches −109.74 on sonar, −686.65 on a1a, −2403.86 on
#: madelon); three correlated models of d = 42 to 51 were right at both learning rates
#: with full rank and 2 to 13 nats tighter where correlated, wrong in 4 of 6 runs with the
#: diagonal q; a centred stochastic-volatility model (63) and a hierarchical
#: beta-binomial (73) level (within 0.7 nats; right / wrong alike). Past 128 only madelon
#: was measured: pass ``base_dist="cholesky"`` there (the k̂ warning of a diagonal q says so).
FULL_RANK_MAX_DIM = 128

#: ``dense_mass="auto"``: a full-rank q's chain moves in q's whitened coordinates (a dense
#: mass matrix) where its start's correlation matrix C has 1 / λ_min(C) at least this: on
#: a Gaussian posterior the diagonal mass's stability ceiling is then sqrt(1000) ≈ 32 times
#: below the dense one's. Measured (Adam 1e-3 and 1e-2, the trained bound, dense minus
#: diagonal): a diamonds-like regression (1 / λ_min 7·10⁷) +0.44 and +0.79 nats, and no
#: longer below its start q; a 4-D Gaussian of correlations 0.9999 (10⁴) the first step's
#: bound 0.9 → 0.02 nats below log Z; but on the 17 full-rank zoo and hold-out models
#: (1 / λ_min 1 to 121) no consistent gain, −0.42 to +0.10 nats (nested plates, 58: −0.34
#: to −0.42 on three seeds), so those keep the diagonal mass.
DENSE_MASS_MIN_CONDITION = 1000.0

#: ``dense_mass="auto"`` also takes the dense mass from 1 / λ_min(C) at least this where
#: the start q is already close to the posterior (``DENSE_MASS_CLOSE_KL``). The mass
#: factor is the start's Cholesky factor, fixed in training: where q is already close,
#: it is the posterior's whitening; where training still has far to move q, it goes
#: stale. Measured (the twenty-first hunt, docs/zoo.md; Adam 1e-3 and 1e-2, trained bound,
#: dense minus diagonal): six moderately correlated models (1 / λ_min 27 to 795, the start
#: q's KL to the posterior 0.01 to 0.2 nats) +0.01 to +0.08 nats in all twelve runs, and
#: UHA at the setup's parameters no longer below q (0.09 to 0.15 nats below it with the
#: diagonal mass on four of them); against that, nested plates (58, KL ≈ 11 nats) and
#: varying slopes (118, KL ≈ 80) lost with the dense mass (-0.42 to -0.03), and keep the
#: diagonal one under this rule.
DENSE_MASS_CLOSE_CONDITION = 20.0

#: "Close" for ``DENSE_MASS_CLOSE_CONDITION``: the start q's log weights put its
#: KL(q‖p) within this many nats (:func:`~numpyro_uha.core.warm_start.laplace_close`, the
#: warm start's own test: half their variance plus two standard errors, and the
#: importance-weighted bound's gap).
DENSE_MASS_CLOSE_KL = 0.5

#: Draws from q (besides its mean) where the stability ceiling's curvature is taken: with
#: the mean, 65 points, whose central differences are 130 rows, six calls of the
#: setup's :data:`SETUP_ROWS` per Lanczos iteration.
CURVATURE_DRAWS = HVP_ROWS - 1

#: Those draws are from q widened this many times: the chain's draws reach past q's bulk
#: (the annealing moves them toward p̄, and q's width itself drifts in training), and
#: where the curvature grows in the tails (a noise scale's log under a flat prior: the
#: curvature grows as 1/σ²) a ceiling set on q's own draws let training at Adam 1e-2 push
#: the steps to the edge and break down late (zoo ``improper_positive``, seeds 0 and 1:
#: ELBO -35.42 after a breakdown in the last 500 steps; widened: -34.95 and -34.97, no
#: breakdown). Where the curvature is the same everywhere (a Gaussian), nothing changes.
CURVATURE_WIDTH = 2.0

#: Rows of the setup's value-and-gradient calls (the warm start's: 3 starts × 8 draws).
SETUP_ROWS = 24

#: A warm start shows its progress bar (``progress_bar=True``) once its VI steps have run
#: ``PROGRESS_DELAY`` seconds, and only where all of them would take more than
#: ``PROGRESS_MIN_TOTAL`` seconds (on most models they are over in a second or two).
PROGRESS_DELAY = 2.0
PROGRESS_MIN_TOTAL = 10.0

#: Where the kick's force saturates, in q's standard deviations (AnnealingParams.force_limit).
FORCE_LIMIT_SDS = 30.0

#: Draws of the starting q whose log weights estimate its ELBO (for ``init_from``; the
#: warm start scores its q with its own ``num_score_draws``).
START_ELBO_DRAWS = 256

#: Fewer finite draws than this are not compared with the starting q's ELBO.
START_ELBO_MIN_DRAWS = 100

#: A log weight counts as below q's ELBO when it is lower by 1 nat, or by this many of
#: single precision's spacings at q's ELBO where that is more: at a log density of
#: -1.6e25 (a warm start stuck far out in a steep tail) the same draws' log weights
#: differed by 1.15e18 nats of rounding between q's and UHA's, and training was said to
#: have made the fit worse.
START_ELBO_SPACINGS = 64


def _below_start(start_elbo: float) -> float:
    """How far below q's ELBO a log weight (or the UHA ELBO) must be to count as lower
    (see :data:`START_ELBO_SPACINGS`)."""
    return max(1.0, START_ELBO_SPACINGS * float(np.finfo(np.float32).eps) * abs(start_elbo))
#: ``sample_posterior`` checks the draws' weights (Pareto k̂, the ELBO's standard error)
#: when it draws at least this many: below it the tail fit of k̂ rests on too few draws
#: (ArviZ fits the largest min(N/5, 3√N) weights: 40 at N = 200).
KHAT_MIN_DRAWS = 200
#: What ``sample_posterior``'s poor-weights warning adds: what k̂ says about the draws.
POOR_WEIGHTS_MEANING = (
    "Heavy-tailed weights mean the draws, not only weighted estimates, may be off: check "
    "them against NUTS on this model (numpyro_uha.evaluation.compare_with_nuts) before "
    "trusting them."
)

#: The narrowest chunk of draws sample_posterior compiles (see UHAGuide._draws).
DRAW_CHUNK_MIN = 64
#: Whether the chain's program (draws in one program, unsharded) writes the weight
#: summary its checks read to the host's pinned memory itself, so that reading it needs
#: no device-to-host copy of its own: ``"auto"`` (on a GPU, where such a copy of a small
#: fresh array took 0.5 ms, 0.9 ms after the chain: benchmarks/draw_overhead.py), ``True``
#: or ``False``. Read per call; programs are compiled per value.
SUMMARY_IN_HOST_MEMORY = "auto"

#: Default ``sample_batch_size`` per CPU device: about a thousand draws at a time (more
#: are slower per draw on CPUs), and not 1024: XLA:CPU's programs on 1024 (or 2048)
#: draws at a time ran 25-55 % slower per draw than on 1000 or 1008 for logistic
#: regressions (sonar, madelon, a hierarchical one; K = 32), equal for an LKJ model and
#: a GP (strides of 4 KiB alias in the caches). 1008 = 63 · 16: whole shards for up to
#: 16 devices.
CPU_BATCH_PER_DEVICE = 1008

#: The fewest draws per CPU device the memory cap of the default may leave (see
#: ``UHAGuide._device_batch_size``).
CPU_BATCH_MIN = 16

#: The share of the memory available (free RAM on a CPU, the device's free memory on a
#: GPU/TPU) the default ``sample_batch_size``'s draws may plan to use.
DRAW_MEMORY_SHARE = 0.25

#: The least default ``sample_batch_size`` per GPU/TPU device.
DEVICE_BATCH_MIN = 1024

#: Most draws per GPU/TPU device computed together by default.
DEVICE_BATCH_MAX = 65536

#: Registered but never learned: the stability ceiling, the force bound and (full-rank q)
#: the mass factor, set by the warm start (see ``_start_arrays``), in params so that the
#: fit carries them.
FIXED = ("stability_scale", "stability_ceiling", "force_limit", "mass_factor")

#: Learnable parameter groups (paper Section 5.3) and the parameters in each.
GROUPS: dict[str, tuple[str, ...]] = {
    "q": ("loc", "scale"),
    "step_size": ("step_size",),
    "step_size_slope": ("step_size_slope",),
    "damping": ("damping",),
    "momentum": ("momentum_scale",),
    "schedule": ("beta_logits",),
    "bridge": ("bridge_loc_slope", "bridge_log_scale_slope"),
    "drift": ("drift_scale",),
}


#: Why get_posterior, get_base_dist and get_transform are not available.
_NO_CLOSED_FORM = (
    "UHAGuide's posterior has no closed form (its draws come from a Hamiltonian chain); "
    "use sample_posterior() or sample_posterior_with_log_weights(). The Gaussian q the "
    "chain starts from is in the params (the guide's '_loc' and '_scale' or '_scale_tril' "
    "entries, in the unconstrained space)."
)


class WeightedDraws(NamedTuple):
    """Posterior draws with their UHA importance weights.

    Attributes:
        samples: dict of constrained site values (latent and deterministic sites), each
            with leading shape ``sample_shape``.
        log_weights: log w of every draw, shape ``sample_shape``. exp(log w) is an
            unbiased estimate of the model's marginal likelihood Z; the mean of log w is
            the ELBO.
        latent: the flat unconstrained draws z_{K+1}, shape ``sample_shape + (d,)``.
        info: per-transition :class:`~numpyro_uha.core.AnnealingInfo` of every draw
            (``None`` where a caller asked for draws only).
        num_dropped: how many diverged draws (non-finite log weight or latent) were
            removed by ``nonfinite="drop"``; the leading size is then the requested one
            minus ``num_dropped``. 0 with ``"keep"``, ``"raise"`` or under ``jit``.
    """

    samples: dict
    log_weights: jax.Array
    latent: jax.Array
    info: AnnealingInfo
    num_dropped: int = 0


#: What a Predictive call the guide cannot serve without the data can do instead.
_PREDICT_FROM_DRAWS = (
    "Draw with guide.sample_posterior(key, params, *training_data) and pass the draws of "
    "the sites you need to Predictive(model, posterior_samples=...)."
)


#: The array leaves of model arguments (traced by the guide's programs unless held).
_ARRAY_TYPES = (jax.Array, np.ndarray, np.generic)


def _split_static(tree, hold=False):
    """Separate array leaves (traced by jit) from Python and NumPy scalars, concrete 0-d
    integer arrays and strings (kept static, as their values: a NumPy or JAX integer sizes
    a plate as a Python int does, ``J = g.max() + 1`` or ``np.int64``; traced, a call with
    ``np.int64(5)`` after a setup with ``5`` failed inside the guide's programs).

    ``hold``: concrete arrays are kept static too, each as a :class:`_Held` constant of
    the compiled programs, for a model whose Python code reads its data's values
    (:func:`_needs_concrete_data`); traced arrays stay traced. A static leaf Python
    cannot hash (a pandas ``DataFrame`` handed to the model) is held too."""
    leaves, treedef = jax.tree.flatten(tree)
    is_array = tuple(
        isinstance(x, (jax.Array, np.ndarray))
        and not (hold and not isinstance(x, jax.core.Tracer))
        and not _concrete_integer_scalar(x)
        for x in leaves
    )
    arrays = [x for x, a in zip(leaves, is_array) if a]
    static = tuple(
        _Held(_as_numpy_scalar(x)) if isinstance(x, _ARRAY_TYPES) or not _hashable(x) else x
        for x, a in zip(leaves, is_array) if not a
    )
    return arrays, (treedef, is_array, static)


def _concrete_integer_scalar(x) -> bool:
    """A concrete 0-d integer or boolean array: a size, a count or a switch (``jnp.asarray(20)``
    as a minibatch size, ``J = g.max() + 1`` as a plate's), kept static as a NumPy or
    Python integer is; traced, a plate sized by it failed where ``AutoNormal`` runs."""
    return (
        not isinstance(x, jax.core.Tracer)
        and np.ndim(x) == 0
        and (jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_)
    )


def _as_numpy_scalar(x):
    """A concrete 0-d integer JAX array as the NumPy scalar of its value and dtype, which
    the guide's programs see as a constant: inside ``jax.jit`` JAX stages every operation
    on a JAX array, even a constant one, so ``subsample_size > size`` on it was traced;
    any other value as it is."""
    return np.asarray(x)[()] if isinstance(x, jax.Array) and _concrete_integer_scalar(x) else x


def _merge_static(arrays, spec):
    treedef, is_array, static = spec
    arrays, static = iter(arrays), iter(static)
    leaves = [next(arrays) if a else _unheld(next(static)) for a in is_array]
    return jax.tree.unflatten(treedef, leaves)


class _Held:
    """A concrete model argument held as a compiled program's constant (a static
    argument). An array is keyed by its contents (a NumPy array changed in place, or
    equal data in a new array: the program of those contents); any other object by
    identity (the same object, the same program: a program holds the values the object
    had when it was traced, as ``SVI.run``'s own compiled step does)."""

    __slots__ = ("value", "_key")

    def __init__(self, value):
        self.value = value
        self._key = ("object", id(value))
        if isinstance(value, _ARRAY_TYPES):
            try:
                data = np.ascontiguousarray(value)
                digest = hashlib.blake2b(data.view(np.uint8).reshape(-1), digest_size=16)
            except (TypeError, ValueError):  # e.g. an object array: by identity
                return
            self._key = ("array", np.shape(value), data.dtype.str, digest.digest())

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        if not isinstance(other, _Held) or self._key != other._key:
            return False
        return self._key[0] == "array" or self.value is other.value


def _unheld(x):
    return x.value if isinstance(x, _Held) else x


#: What JAX raises where Python code needs a traced value's concrete value.
_CONCRETE_VALUE_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.NonConcreteBooleanIndexError,
)


def _guide_factor(name, log_factor):
    """``numpyro.factor`` for a guide's log density, as an observed ``Delta`` site (value
    0, ``log_density`` the factor) instead of a ``Unit`` one: the same term in every ELBO,
    and a reparameterized one, whose gradient NumPyro's ``TraceGraph_ELBO`` keeps (it
    stops the gradient of a site without a reparameterized sampler, which ``Unit`` is)."""
    zero = jnp.zeros_like(log_factor)
    # not validated: a diverged draw's factor is NaN or inf by design (its weight is 0)
    fn = dist.Delta(zero, log_density=log_factor, validate_args=False)
    numpyro.sample(name, fn, obs=zero, infer={"is_auxiliary": True})


def _site_values(trace) -> dict:
    """The values of a trace's latent sample sites and parameters."""
    return {
        name: site["value"] for name, site in trace.items()
        if site["type"] == "param" or (site["type"] == "sample" and not site["is_observed"])
    }


def _needs_concrete_data(model, args, kwargs, values) -> bool:
    """Whether ``model``'s Python code reads the values of its array arguments (e.g.
    ``int(group.max()) + 1`` groups, ``np.unique(g)``, ``x[x > 0]``), so that it cannot
    run with them traced, as arguments of a compiled program. Found by tracing the
    model once with its latent and parameter sites at ``values`` (concrete) and its
    arrays abstract; nothing is compiled. NumPyro's own inference closes the data over
    (``SVI.run``, ``MCMC``), where such a model runs: the guide's programs then hold the
    data as constants (see :func:`_split_static`) instead of taking them as arguments."""
    arrays, spec = _split_static((args, kwargs))
    if not arrays or _is_tracer(arrays):
        return False

    def run(arrays):
        a, k = _merge_static(arrays, spec)
        seeded = handlers.seed(handlers.substitute(model, data=values), rng_seed=0)
        with handlers.block():
            handlers.trace(seeded).get_trace(*a, **k)

    try:
        jax.eval_shape(run, arrays)
    except _CONCRETE_VALUE_ERRORS:
        return True
    except Exception:  # noqa: BLE001 - anything else is the compiled path's to report
        return False
    return False


#: Added to JAX's TypeError when training a model that runs ``lax.while_loop`` fails.
WHILE_LOOP_NOTE = (
    "UHAGuide: the model runs jax.lax.while_loop, and JAX fails to differentiate it "
    "inside the guide's transitions (a lax.scan differentiated in reverse mode; "
    "NumPyro's AutoDAIS fails the same way), even where its result feeds only a "
    "numpyro.deterministic site. Compute that value from the draws after the fit "
    "(e.g. with Predictive's output), or use lax.fori_loop with bounds known at trace "
    "time (a lax.scan)."
)


#: Added to JAX's error where a JVP rule in the model calls back to the host.
SECOND_DERIVATIVE_NOTE = (
    "UHAGuide: training differentiates the model's log density twice (its gradient "
    "drives the leapfrog steps, and the parameters' gradient runs through them), so "
    "whatever computes that gradient must be differentiable too: a jax.custom_jvp rule "
    "that calls jax.pure_callback is not. Write the rule in jax.numpy, or give the "
    "callback inside it its own custom_jvp. (AutoNormal and NUTS need first derivatives "
    "only.)"
)


#: Added to a distribution's "got invalid ... parameter" error from NumPyro's
#: initialization of the model.
INVALID_AT_INIT_NOTE = (
    "UHAGuide: NumPyro's initialization of the model failed: a distribution got an "
    "invalid parameter at the model's first values (init_loc_fn's, by default uniform "
    "in (-2, 2) on each site's unconstrained scale, or draws from the prior). An "
    "unstandardized covariate or a wide prior inside exp(...) overflows there (a "
    "NegativeBinomial2 mean exp(a + b x) with x up to 500 is infinite at b = 2). "
    "Standardize the covariates, or start where the model is finite with "
    "init_loc_fn=init_to_value(values={...}). NumPyro's AutoNormal fails the same way."
)


#: Added to JAX's TypeError when the guide is differentiated in forward mode.
FORWARD_MODE_NOTE = (
    "UHAGuide: the guide is trained by reverse-mode differentiation only: its gradient "
    "guards (which zero a diverging step's gradient) are reverse-mode rules, so "
    "svi.run(..., forward_mode_differentiation=True) (or SVI.update with it) cannot "
    "differentiate it. Train without that option; UHAGuide(forward_mode_differentiation="
    "True) applies only to NumPyro's initialization of the model."
)


#: What an error about non-finite observed data tells the user to do.
NONFINITE_DATA_ADVICE = (
    "Drop those entries, or replace them by finite values and mask them out "
    "(numpyro.handlers.mask or obs_mask)."
)


#: JAX arrays found finite by :func:`_nonfinite_concrete_float`, by identity while they
#: live (JAX arrays are immutable): a loop of eager calls copies its data to the host once.
_FINITE_ARRAYS: dict = {}


def _nonfinite_concrete_float(arrays) -> bool:
    """Whether some concrete floating-point array among ``arrays`` holds NaN or inf
    (checked on the host; traced ones are skipped)."""
    for x in jax.tree.leaves(arrays):
        if _is_tracer(x) or not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
            continue
        known = _FINITE_ARRAYS.get(id(x))
        if known is not None and known() is x:
            continue
        if not np.all(np.isfinite(np.asarray(x))):
            return True
        if isinstance(x, jax.Array):
            key = id(x)
            _FINITE_ARRAYS[key] = weakref.ref(x, lambda _, key=key: _FINITE_ARRAYS.pop(key, None))
    return False


def _inside_cond(site) -> bool:
    """Whether a sample site comes from ``numpyro.contrib.control_flow.cond`` (a
    control-flow site that ``scan`` did not index)."""
    return bool(site.get("_control_flow_done")) and "_scan_current_index" not in site.get(
        "infer", {}
    )


def _refuse_latents_in_cond(in_cond, who: str = "") -> None:
    """A clear error where latent sites ``in_cond`` (see :func:`_inside_cond`) are
    sampled inside ``numpyro.contrib.control_flow.cond`` and the installed NumPyro's
    ``cond`` does not replay a guide's values: every guide's ELBO terms (and importance
    weights) on such a model are wrong. ``who`` begins the message."""
    if in_cond and not _cond_replays():
        raise ValueError(
            f"{who}latent site(s) {list(in_cond)[:6]} are sampled inside "
            "numpyro.contrib.control_flow.cond, which in this NumPyro version does not "
            "replay a guide's values: under Trace_ELBO (and every ELBO) the model's cond "
            "returns a fresh draw from the branch while the trace records the guide's, "
            "so every guide's loss and importance weights on this model are wrong (its "
            "terms are not log p(x, z) - log q(z)). Write the branch choice into the "
            "distribution's parameters instead, e.g. numpyro.sample('b', "
            "dist.Normal(jnp.where(a > 0, 1.0, -1.0), 1.0)), which every guide and NUTS "
            "handle."
        )


@functools.cache
def _cond_replays() -> bool:
    """Whether the installed NumPyro's ``cond`` returns a replayed value (numpyro 0.22's
    does not: its branches honour ``condition`` and ``substitute`` only, and a replayed
    site's recorded value then differs from the one the model goes on with). Probed on a
    one-site model."""
    from numpyro.contrib.control_flow import cond

    def model():
        return cond(True, lambda _: numpyro.sample("x", dist.Normal(0.0, 1.0)),
                    lambda _: numpyro.sample("x", dist.Normal(0.0, 1.0)), None)

    recorded = handlers.trace(
        handlers.seed(lambda: numpyro.sample("x", dist.Delta(jnp.asarray(123.0))), 0)
    ).get_trace()
    with handlers.block():
        returned = handlers.seed(handlers.replay(model, trace=recorded), 0)()
    return bool(jnp.abs(returned - 123.0) < 1e-3)


class _ScannedPlates(AutoGuide):
    """Registers the plates of latent sites inside ``numpyro.contrib.control_flow.scan``
    (or another control-flow primitive), whose body's plates leave no site in the trace:
    NumPyro's AutoContinuous setup looks every latent site's plate up among the trace's
    plate sites and raised ``KeyError: '<plate>'`` on such a model (every AutoContinuous
    guide does; e.g. several series' latent states in a ``scan`` step's plate). Sits
    between AutoContinuous and AutoGuide in UHAGuide's MRO: it runs after AutoGuide's
    setup has read the trace's plates and before AutoContinuous's check."""

    def _setup_prototype(self, *args, **kwargs):
        super()._setup_prototype(*args, **kwargs)
        for site in self.prototype_trace.values():
            if site["type"] == "sample" and site.get("_control_flow_done"):
                for frame in site["cond_indep_stack"]:
                    self._prototype_frame_full_sizes.setdefault(frame.name, frame.size)


class UHAGuide(AutoContinuous, _ScannedPlates):
    r"""Uncorrected Hamiltonian Annealing guide (Geffner & Domke, NeurIPS 2021).

    A draw starts at z₁ ~ q = N(μ, diag(s²)) (or N(μ, LLᵀ)) in the model's unconstrained
    space and runs ``K`` uncorrected under-damped Hamiltonian transitions through the
    bridging densities q_ψ(β_m)^(1-β_m) p̄^(β_m). The guide's density is the augmented
    proposal of the paper, so :class:`~numpyro.infer.Trace_ELBO` optimizes the UHA bound
    (paper eq. 13), which is at least the ELBO of q and tightens as ``K`` grows.

    ``K`` counts annealing transitions, as :class:`~numpyro.infer.autoguide.AutoDAIS`
    does: one target gradient each with ``num_leapfrog_steps=1`` (and one value of the
    target at the end; the paper's velocity Verlet needs one more gradient, at z₁). It
    uses K bridging densities, so it is the paper's ":math:`K`" of ``K + 1`` ("number of
    bridging densities plus one").

    Learnable groups (names accepted by ``frozen``):

    - ``"q"``: μ and s (or L) of the initial Gaussian;
    - ``"step_size"``: ε(0), kept in (0, ``max_step_size``);
    - ``"step_size_slope"``: the slope of ε(β) (affine in β on the logit scale);
    - ``"damping"``: η in (0, 1), momentum persistence;
    - ``"momentum"``: the diagonal momentum covariance Σ (for a full-rank q, in the
      coordinates u = L₀⁻¹ z its start's Cholesky factor L₀ whitens, where the chain
      moves: a dense mass matrix, ``AnnealingParams.mass_factor``);
    - ``"schedule"``: the strictly increasing β_1 < ... < β_K in (0, 1);
    - ``"bridge"``: ψ, the slopes making q_ψ(β)'s mean and scale affine in β;
    - ``"drift"``: δ, a per-coordinate factor on the step size, starting at 1:
      coordinate i drifts and is kicked with the step ε δ_i (z += ε δ Σ⁻¹ ρ,
      ρ += ε δ ∇ log π), so the leapfrog still conserves the energy
      −log π + ½ ρᵀ Σ⁻¹ ρ that the weight uses, to second order in ε, and approaches
      exact annealing as K grows for every δ. Σ sets the mass (how momentum turns into
      motion, and the refresh); δ lets each coordinate's step differ from ε.

    A frozen group keeps its initial value: it is registered as a ``numpyro.param``
    (so ``params`` holds the whole fit) but gets no gradient.
    The paper's basic UHA tunes ``q``, ``step_size`` and ``damping`` only, with
    ``integrator="velocity_verlet"``; tuning everything (the default) gave the best
    bounds in its Section 5.3 and in our benchmarks (``docs/benchmarks.md``).

    The default ``integrator="position_verlet"`` (drift, kick, drift) gave higher bounds
    than the paper's velocity Verlet (kick, drift, kick) on every benchmark task with δ
    learned (measured when δ scaled the drift only; not yet re-measured with δ as a
    per-coordinate step), and needs one target gradient fewer per draw. Every choice of
    integrator, δ and the other parameters gives a valid bound and an unbiased
    estimate of Z.

    By default q is first fitted by plain Gaussian VI on the first call's data, the
    paper's starting point, robustly to the posterior's scales
    (:func:`~numpyro_uha.core.warm_start.warm_start`: an L-BFGS mode and its Laplace
    scales, then ``warm_start_steps`` Adam steps of VI from three starts, the best kept,
    with up to three further rounds of as many steps while a start is still falling and
    could pass the best, unless the Laplace approximation is within 0.02 nats of the
    posterior already;
    a warning says when it had not converged; the log density compiled in two small
    programs, the loops run in Python around them), and Σ is set to the inverse of q's
    variances so that ε is in units of the posterior scale. After a warm start (or
    ``init_from``) the defaults that make training hold at common learning rates are on:

    - q's mean, scale and the bridge's mean slope are optimized in units of the warm
      start's sds (``params`` keep model units), so Adam's steps are the same fraction of
      a posterior sd on every coordinate, whether it is known to ±1e-3 or ±1e3;
    - every per-coordinate leapfrog step stays under ¾ of the quadratic stability limit,
      2 / sqrt(λ_max), with λ_max the largest curvature (in q's sds) over q's mean and 64
      draws from q widened twice (the chain's draws go past q's bulk), whatever the
      optimizer does to ε, δ and Σ;
    - the kick's force is bounded, L tanh(∇ log π / L) with L = 30 / q's sds, so a draw
      in q's far tails cannot be thrown to infinity (the weight stays exact: see
      :class:`~numpyro_uha.core.AnnealingParams`);
    - a particle that diverges anyway is skipped (see ``check_finite``).

    Latent entries that the model masks out and nothing in it depends on (the entries of
    an ``obs_mask`` site's ``"<name>_unobserved"`` latent where the data are observed,
    padding under :func:`numpyro.handlers.mask`) leave the posterior flat, hence
    improper, along them. The guide counts each such entry with a standard normal
    density on its unconstrained coordinates, which changes neither the posterior of
    the other latents nor log Z (``numpyro_uha/_masked.py``); ``guide.completed_entries``
    names them after setup; their draws mean nothing (the model ignores them).

    Discrete latent sites of finite support (mixture assignments, indicators; marked
    ``infer={"enumerate": "parallel"}`` or not) are summed out of the chain's target by
    enumeration, as NumPyro's NUTS does (needs funsor: ``numpyro-uha[enum]``), and the
    guide draws them from their exact conditional p(c | z, x) at the chain's last
    position, with log p(c | z, x) in its density: ``Trace_ELBO`` and ``TraceEnum_ELBO``
    then estimate the same bound on log Z, and the draws hold (z, c) jointly
    (``numpyro_uha/_enumerate.py``; NumPyro's SVI still warns about Trace_ELBO and
    discrete sites). Where NumPyro cannot draw them from p(c | z, x) (a hidden Markov
    model's states inside ``scan`` or a long ``markov`` loop), the guide draws them from
    their prior p(c | z) with log p(c | z, x) in its density instead: the ELBO is still
    UHA's bound on the marginal, but the states are left out of the posterior draws
    (a warning at setup says so; docs/how-to/discrete.md).

    Usage::

        guide = UHAGuide(model, K=32)
        svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
        result = svi.run(rng_key, 5000, *model_args)
        draws = guide.sample_posterior(rng_key, result.params, *model_args,
                                       sample_shape=(1000,))
        # posterior predictive at new inputs, as with any AutoGuide (y left out: the
        # chains run on the data the guide was set up with)
        predicted = Predictive(model, guide=guide, params=result.params,
                               num_samples=1000)(rng_key, X_new)

    Args:
        model: a NumPyro model whose latent sites are all continuous.
        K: number of annealing transitions (≥ 1).
        prefix: prefix of the guide's ``numpyro.param`` names.
        init_loc_fn: per-site initialization strategy for μ (before the warm start).
        init_scale: initial standard deviation of q (before the warm start).
        base_dist: ``"diagonal"`` (mean-field q), ``"cholesky"`` (full-rank q) or
            ``"auto"`` (the default): full rank where the model has 2 to
            ``FULL_RANK_MAX_DIM`` (128) unconstrained latent coordinates, mean-field
            otherwise. Resolved at setup into ``guide.base_dist``.
        dense_mass: for a full-rank q, whether the chain moves in the coordinates
            u = L₀⁻¹ z that its start's Cholesky factor L₀ whitens (a dense mass matrix:
            ``True``) or in z with a diagonal mass (``False``); ``"auto"`` (the default)
            chooses the dense mass where the start's correlations are strong (1 / the
            smallest eigenvalue of its correlation matrix at least
            ``DENSE_MASS_MIN_CONDITION`` = 1000, where a diagonal mass's steps are ~30
            times shorter along the posterior's ridge), or moderate (at least
            ``DENSE_MASS_CLOSE_CONDITION`` = 20) with the start q already within
            ``DENSE_MASS_CLOSE_KL`` = 0.5 nats of the posterior (the warm start's
            Laplace-closeness test on its log weights), the diagonal one elsewhere (on
            the zoo's and hold-out set's models, whose correlations are milder or whose
            starts are far from the posterior, the dense mass gained nothing consistent).
            The dense mass is stored with the fit (the never-learned ``mass_factor``
            param, L₀); without it the chain is the diagonal mass's, as before the option
            existed. ``True`` with a diagonal q is refused.
        num_leapfrog_steps: L, leapfrog steps per transition (1 = under-damped Langevin).
        integrator: ``"position_verlet"`` (default) or ``"velocity_verlet"`` (the paper's
            leapfrog); see :func:`~numpyro_uha.core.annealed_sample`.
        init_step_size: initial ε, in (0, ``max_step_size``); by default 0.25, or half of
            ``max_step_size`` where that is smaller.
        max_step_size: ε_max; every ε(β_m) stays in (0, ε_max).
        init_damping: initial η in [0, 1).
        frozen: names of groups that are not learned (see above).
        warm_start_steps: plain-VI steps fitting q at initialization (0 disables the warm
            start, and with it the preconditioning, the step ceiling and the force bound;
            none are run where the Laplace approximation's KL to the posterior is below
            0.02 nats, as on large data); up to three further rounds of as many steps
            follow while a start's fit is still falling and could pass the best one
            (``core.warm_start.VI_MAX_ROUNDS``).
        warm_start_learning_rate: peak Adam learning rate of the warm start.
        init_from: ``(fitted_guide, fitted_params)`` of an ``AutoNormal``,
            ``AutoDiagonalNormal`` or ``AutoMultivariateNormal`` trained on the same model:
            q starts there and the built-in warm start is skipped. The one-liner after
            plain VI is ``UHAGuide(model, K=32, init_from=(vi_guide, vi_result.params))``.
        remat: rematerialize each transition in the backward pass: memory for large K no
            longer scales with the model's intermediates, at about one extra forward pass.
        sample_batch_size: draws computed together (vectorized) in
            :meth:`sample_posterior` and the estimators; bounds their memory. ``None``
            (default) sizes it to the device: 1008 per CPU device, fewer (at least 16)
            where those would plan more than a quarter of the free RAM (a GP on 1000
            points: 128); on a GPU or TPU as many as a quarter of the device's free
            memory holds (measured from the compiled gradient of the model's log
            density), between 1024 and 65536 per device; times the number of devices
            draws are sharded over. Sized at the first draw.
        sharding: shard draws over devices: a :class:`jax.sharding.Mesh` (the draws'
            leading axis is split over all its axes) or a
            :class:`~jax.sharding.NamedSharding` of the leading axis. Keys are split
            before sharding, so draw ``i`` is the same on any number of devices;
            parameters and data are replicated. Used by :meth:`sample_posterior`,
            ``Predictive`` and every estimator of :mod:`numpyro_uha.evaluation`, across
            processes too (after ``jax.distributed.initialize``: each process passes the
            same key and gets all the draws). For SVI's particles use
            :func:`~numpyro_uha.shard_particles`.
        check_finite: watch for NaN or infinite log weights during training, on every
            backend: a particle whose trajectory diverged is skipped (no gradient flows
            back from it, and a step whose gradient is not finite leaves the parameters
            unchanged), training goes on, and
            :class:`~numpyro_uha.UHADivergenceWarning` says how many steps diverged
            where values are concrete (``svi.get_params``, so the end of ``svi.run``;
            this guide's methods). When the trained guide's *draws*
            diverge, its draw methods raise :class:`UHADivergenceError` (a
            ``FloatingPointError``) holding the parameters of the first diverging
            training step. ``False`` lets NaN through (use with
            ``svi.run(..., stable_update=True)``).
        decenter: non-centered coordinates for hierarchical sites. ``"auto"`` (the
            default): every latent site ``x ~ Normal(loc, scale)`` (or StudentT, Cauchy,
            Laplace, Logistic) whose loc or scale depends on other latent variables is
            run as ``x = loc + scale · x̃``, ``x̃ ~ Normal(0, 1)`` (a funnel becomes a
            Gaussian where the data say little about ``x``), and a MultivariateNormal or
            MultivariateStudentT one as ``x = loc + scale_tril · x̃`` (correlated group
            effects; a latent Gaussian process, whitened), also where its parameters are
            constants but its prior makes some coordinate nearly a function of the others
            (a latent field under a fixed kernel); the guide still emits and
            returns ``x``, and the bound stays exact (the Jacobian is in the guide's log
            density). Where the data say much about each ``x`` the model's own
            coordinates fit better, so with a warm start both are warm-started from the
            same point and keys and the one with the higher start ELBO is kept (both
            ELBOs in ``guide.coordinate_elbos``; the setup then takes about twice as
            long). ``False``: the model's own coordinates. A list of site names:
            those sites. Resolved at setup into ``guide.decentered_sites`` (sites inside
            ``numpyro.contrib.control_flow.scan``, masked or scaled sites are left as
            written). With ``init_from``, ``"auto"`` means ``False`` (q comes from a fit
            in the model's coordinates).
        forward_mode_differentiation: passed to NumPyro's model initialization.
        warm_start_device: where the warm start's small model-free steps run (the
            L-BFGS, Adam and curvature updates between calls of the model): ``None``
            (default) beside the model, on JAX's default device; a platform name such as
            ``"cpu"`` or a ``jax.Device`` to run them there, while the model's log
            density stays on the default device (two small copies per model call). On a
            GPU, ``"cpu"`` compiles the about 25 tiny steps at the CPU's quick setting
            instead of for the GPU (on an H200, ``svi.init`` took longer so: 10.9 s
            against 8.5; see docs/how-to/devices.md). The fit is the same
            up to the two devices' rounding (bit for bit on two devices of one kind);
            only ``svi.init``'s time changes. A ``jax.Device`` is pickled as its
            platform name.
        progress_bar: show a progress bar (on stderr, as ``svi.run``'s) over the warm
            start's VI steps when they take longer than 10 seconds
            (``numpyro_uha.guide.PROGRESS_MIN_TOTAL``; a model whose log density is
            expensive: the warm start evaluates its gradient at 24 points per step);
            ``False`` never shows one, and neither does a setup run by
            ``svi.run(..., progress_bar=False)``.
    """

    def __init__(
        self,
        model,
        *,
        K: int = 32,
        prefix: str = "auto",
        init_loc_fn=init_to_uniform,
        init_scale: float = 0.1,
        base_dist: str = "auto",
        num_leapfrog_steps: int = 1,
        integrator: str = "position_verlet",
        init_step_size: float | None = None,
        max_step_size: float = 1.0,
        init_damping: float = 0.9,
        frozen=(),
        warm_start_steps: int = 1000,
        warm_start_learning_rate: float = 0.01,
        init_from=None,
        remat: bool = False,
        sample_batch_size: int | None = None,
        sharding=None,
        check_finite: bool = True,
        decenter="auto",
        forward_mode_differentiation: bool = False,
        warm_start_device=None,
        progress_bar: bool = True,
        dense_mass="auto",
    ):
        _check_int("K", K, 1)
        _check_int("num_leapfrog_steps", num_leapfrog_steps, 1)
        _check_int("warm_start_steps", warm_start_steps, 0)
        if sample_batch_size is not None:
            _check_int("sample_batch_size", sample_batch_size, 1)
        check_integrator(integrator)
        if base_dist not in ("auto", "diagonal", "cholesky"):
            raise ValueError(
                f"base_dist must be 'auto', 'diagonal' or 'cholesky', got {base_dist!r}."
            )
        if not (isinstance(dense_mass, (bool, np.bool_)) or dense_mass == "auto"):
            raise ValueError(
                f"dense_mass must be 'auto', True or False, got {dense_mass!r}."
            )
        if dense_mass is True and base_dist == "diagonal":
            raise ValueError(
                "dense_mass=True needs a full-rank q (base_dist='cholesky', or 'auto' for "
                f"a model of at most {FULL_RANK_MAX_DIM} latent coordinates); a diagonal q's "
                "chain moves in q's own standardized coordinates already."
            )
        self.dense_mass = dense_mass if dense_mass == "auto" else bool(dense_mass)
        max_step_size = _real("max_step_size", max_step_size)
        init_step_size = _default_init_step_size(init_step_size, max_step_size, 0.25)
        init_damping = _real("init_damping", init_damping)
        init_scale = _real("init_scale", init_scale)
        _check_step_sizes(init_step_size, max_step_size)
        if not 0 <= init_damping < 1:
            raise ValueError(f"init_damping (η) must be in [0, 1), got {init_damping!r}.")
        if not (init_scale > 0 and math.isfinite(init_scale)):
            raise ValueError(f"init_scale must be a positive finite number, got {init_scale!r}.")
        if not callable(model):
            raise TypeError(f"model must be a callable NumPyro model, got {model!r}.")
        if not isinstance(prefix, str) or not prefix:
            raise TypeError(f"prefix must be a non-empty string, got {prefix!r}.")
        if not (warm_start_learning_rate > 0):
            raise ValueError(
                f"warm_start_learning_rate must be positive, got {warm_start_learning_rate!r}."
            )
        frozen = _check_frozen(frozen)
        _step_device(warm_start_device)  # a clear error now, not at setup
        self.warm_start_device = warm_start_device
        if not isinstance(progress_bar, (bool, np.bool_)):
            raise TypeError(f"progress_bar must be True or False, got {progress_bar!r}.")
        self.progress_bar = bool(progress_bar)
        self.K = K
        self.requested_base_dist = base_dist
        # resolved at setup, where the dimension is known (see FULL_RANK_MAX_DIM)
        self.base_dist = "diagonal" if base_dist == "auto" else base_dist
        self.num_leapfrog_steps = num_leapfrog_steps
        self.integrator = integrator
        self.init_step_size = init_step_size
        self.max_step_size = max_step_size
        # η = 0 lies on the boundary of the learnable interval (0, 1); nudge it inside.
        self.init_damping = init_damping if init_damping > 0 else 1e-4
        self.frozen = frozenset(frozen)
        self.warm_start_steps = warm_start_steps
        self.warm_start_learning_rate = warm_start_learning_rate
        if init_from is not None and not (isinstance(init_from, tuple) and len(init_from) == 2):
            raise ValueError(
                "init_from must be a (fitted_guide, fitted_params) pair, e.g. "
                f"(AutoDiagonalNormal(model), svi_result.params); got {type(init_from).__name__}."
            )
        self.init_from = init_from
        self.remat = remat
        self._sample_batch_size = sample_batch_size
        self._auto_batch_size = None
        self._start_data = None  # see _setup_fingerprint
        self.sharding = leading_axis_sharding(sharding)
        self.check_finite = check_finite
        self._init_scale = init_scale
        self.requested_decenter = _check_decenter(decenter, init_from)
        self._user_model = model
        self.decentered_sites = ()  # resolved at setup
        # discrete latent sites, summed out of the chain's target (_enumerate.py; set up)
        self._discrete, self._plate_nesting = (), 0
        # whether the guide draws them from p(c | z, x) (else from their prior p(c | z):
        # _choose_discrete_draws), and the deterministic sites it then leaves out of its
        # posterior draws
        self._draws_discrete, self._undrawn_dependents = True, ()
        self._scanned_discrete = ()  # those of them inside numpyro's scan
        # latent entries masked out and flat, completed at setup (_masked.py)
        self._completion = {}
        # decenter="auto": the start ELBO of each coordinate system tried (set up)
        self.coordinate_elbos = None
        self._init_values = None
        self._setup_args = None
        # the model reads its data's values: programs hold the data (_needs_concrete_data)
        self._hold_data = False
        self._jitted_draws = {}
        # per argument structure and shapes: whether a values-only call (Predictive)
        # withholds the data, so that the chains run on the setup's (_chain_arguments)
        self._withheld_calls = {}
        # the last params checked and what the check found: a repeated draw with the same
        # (immutable) arrays reads nothing back from the device for it
        self._checked_params = _LastSeen()
        # the same for the model arguments draws are compared with the setup data on
        self._checked_data = _LastSeen()
        self._jitted_setup = {}
        self._divergence = DivergenceRecord()
        self._latch_constraint = LatchConstraint(self._divergence)
        super().__init__(
            model,
            prefix=prefix,
            init_loc_fn=init_loc_fn,
            forward_mode_differentiation=forward_mode_differentiation,
        )
        self._user_init_loc_fn = init_loc_fn

    # ------------------------------------------------------------------ setup
    def _setup_prototype(self, *args, **kwargs):
        self._setup_coordinates(args, kwargs)
        self._warn_if_flat()
        self._warn_if_ruled_out()

    def _setup_coordinates(self, args, kwargs):
        """The setup, in the coordinates ``decenter`` resolves to."""
        self.model = self._user_model
        if not _is_tracer((args, kwargs)):
            relieve_memory_maps("UHAGuide")  # before this setup compiles (see _memory_maps)
        dim = self._validate_model(args, kwargs)
        precompiling = None if _is_tracer((args, kwargs)) else self._precompile_setup(dim)
        try:
            return self._setup_resolved(precompiling, args, kwargs)
        except BaseException:
            # a setup that fails (a model with no valid start, a bad argument) waits for
            # the compiling thread: a process exiting while XLA compiles in it aborts
            if precompiling is not None:
                precompiling.join()
            raise

    def _setup_resolved(self, precompiling, args, kwargs):
        """:meth:`_setup_coordinates` once the model-free steps compile in the
        background: the coordinates ``decenter`` resolves to, and the setup in them."""
        decenter = self._resolve_decenter(args, kwargs)
        if not (
            decenter and self.requested_decenter == "auto" and self.warm_start_steps > 0
            and self.init_from is None and not _is_tracer((args, kwargs))
        ):
            return self._setup_in(decenter, precompiling, args, kwargs)
        # "auto": which coordinates fit better depends on the data (non-centered where a
        # group's data say little, the model's own where they say much: a hierarchical
        # normal model with 5 observations per group lost 13 nats non-centered), so both
        # are warm-started, from the same point and keys, and the one with the higher
        # start ELBO is kept
        rng_key = numpyro.prng_key()
        if rng_key is None:
            rng_key = jax.random.PRNGKey(0)
        with handlers.seed(rng_seed=rng_key):
            self._setup_in(decenter, precompiling, args, kwargs)
        if not self.decentered_sites:  # none reached (inside scan): nothing to compare
            return
        non_centered = dict(self.__dict__)
        self._jitted_setup, self._jitted_draws = {}, {}  # programs of the other model
        self.model = self._user_model
        with handlers.seed(rng_seed=rng_key):
            self._setup_in((), None, args, kwargs)
        self.coordinate_elbos = {
            "non_centered": non_centered["_start_elbo"], "as_written": self._start_elbo
        }
        non_centered["coordinate_elbos"] = self.coordinate_elbos
        if _elbo_or_minus_inf(non_centered["_start_elbo"]) > _elbo_or_minus_inf(
            self._start_elbo
        ):
            self.__dict__.update(non_centered)

    def _setup_in(self, decenter, precompiling, args, kwargs):
        """The setup in given coordinates: ``decenter`` names the non-centered sites."""
        self._flat_mask = self._ruled_out = self._flat_in_value = None
        self._completion = {}
        # NumPyro's initial point: in non-centered coordinates, the one init_loc_fn gives
        # the model as written (see _decenter.decentered_init)
        self.init_loc_fn = self._user_init_loc_fn
        if decenter:
            self.model = _decenter.decentered_model(self._user_model, decenter)
            self.init_loc_fn = _decenter.decentered_init(self._user_init_loc_fn)
        try:
            # NumPyro's initial point, compiled; enumerated discrete sites let through
            with compiled_initialization(), _enumerate.discrete_sites_allowed(self._discrete):
                super()._setup_prototype(*args, **kwargs)
        except RuntimeError as err:
            if "valid initial parameters" not in str(err):
                raise
            raise ValueError(self._describe_bad_initial_point(args, kwargs)) from err
        except (ValueError, TypeError, IndexError, AssertionError) as err:
            if not self._discrete and isinstance(err, ValueError) and "got invalid" in str(err):
                err.add_note(INVALID_AT_INIT_NOTE)
            if not self._discrete or (
                isinstance(err, AssertionError) and not _enumerate.enumeration_failed_inside(err)
            ):
                raise
            # the model failed only when its discrete sites were enumerated
            scoped = _enumerate.scopes_renaming_plates(self._user_model, args, kwargs)
            raise ValueError(_enumerate.enumeration_failed(self._discrete, err, scoped)) from err
        if decenter:
            reached = tuple(n for n in decenter if n + _decenter.SUFFIX in self.prototype_trace)
            if self.requested_decenter != "auto" and len(reached) < len(decenter):
                raise ValueError(
                    f"UHAGuide: decenter site(s) {sorted(set(decenter) - set(reached))} "
                    "could not be non-centered (inside numpyro.contrib.control_flow.scan, "
                    "where numpyro.handlers.reparam does not reach)."
                )
            self.decentered_sites = reached
            # x itself is a deterministic site of the non-centered model, not one the
            # user wrote: NumPyro's AutoGuideList refuses a part whose prototype trace
            # shows a deterministic site, and this guide emits x as a sample site anyway
            for name in reached:
                if self.prototype_trace.get(name, {}).get("type") == "deterministic":
                    del self.prototype_trace[name]
            if reached != decenter:  # some were inside scan: drop them from the config
                self.model = (
                    _decenter.decentered_model(self._user_model, reached)
                    if reached else self._user_model
                )
        else:
            self.decentered_sites = ()
        if self.requested_base_dist == "auto":
            self.base_dist = "cholesky" if self._full_rank(self.latent_dim) else "diagonal"
        if self._dense is True and self.base_dist != "cholesky":
            raise ValueError(
                f"UHAGuide: dense_mass=True needs a full-rank q, but this model has "
                f"{self.latent_dim} latent coordinates, more than FULL_RANK_MAX_DIM = "
                f"{FULL_RANK_MAX_DIM}, so base_dist='auto' gives a diagonal q: pass "
                "base_dist='cholesky' as well (its cost grows as d² per leapfrog step)."
            )
        self._model_param_sites = {
            name: site for name, site in self.prototype_trace.items() if site["type"] == "param"
        }
        if not _is_tracer((args, kwargs)):
            self._setup_args = (args, kwargs)
        model_params = {name: site["value"] for name, site in self._model_param_sites.items()}
        self._hold_data = _needs_concrete_data(
            self.model, args, kwargs, _site_values(self.prototype_trace)
        )
        init_loc = self._init_latent
        # built by NumPy: one transfer, no operations compiled one at a time
        if self.base_dist == "cholesky":
            init_scale = np.eye(self.latent_dim) * self._init_scale
        else:
            init_scale = np.full(self.latent_dim, self._init_scale)
        init_scale = jnp.asarray(init_scale.astype(np.dtype(init_loc.dtype)))
        loc, scale = init_loc, init_scale
        self._precondition = None
        preconditioned = False  # q standardized by the start it fitted (_precondition.py)
        self._start_elbo = None  # (ELBO, its standard error) of the q UHA starts from
        self._nan_at_prior = None  # _NanAtPrior: where the warm start diverged, why
        # derived from the setup arguments when first needed, not at svi.init
        self._auto_batch_size = self._start_data = None
        arrays, spec = _split_static((args, kwargs), self._hold_data)
        lam = None  # the curvature behind the step ceiling (see _start_arrays)
        start_log_weights = None  # the start q's, where it was scored (_dense_for)
        host = not _is_tracer((arrays, model_params, init_loc))
        if host:
            self._completion = self._masked_flat_entries(init_loc, arrays, spec, model_params)
            if self._completion:  # programs traced before read the model without it
                self._jitted_setup, self._jitted_draws = {}, {}
            self._flat_in_value = self._flat_in_own_value(init_loc, arrays, spec, model_params)
        if self.init_from is not None:
            loc, scale = self._q_from_fitted(*self.init_from)
            preconditioned = True
            log_weights, lam = self._run_setup(
                "score", jax.random.PRNGKey(0), loc, scale, arrays, spec, model_params,
                precompiling,
            )
            if not _is_tracer(log_weights):
                self._start_elbo = _mean_and_se(log_weights)
                start_log_weights = log_weights
        elif self.warm_start_steps > 0:
            fit, lam = self._run_setup(
                "warm_start", numpyro.prng_key(), init_loc,
                jnp.asarray(self._init_scale, init_loc.dtype), arrays, spec, model_params,
                precompiling,
            )
            if _is_tracer(fit):
                # set up inside a JAX transform: no constants to standardize by
                loc, scale = fit.loc, fit.scale
                lam = None
            elif bool(_all_finite((fit.loc, fit.scale), host=True)):
                loc, scale = fit.loc, fit.scale
                preconditioned = True
                self._start_elbo = _mean_and_se(fit.log_weights)
                start_log_weights = fit.log_weights
                losses = np.asarray(fit.losses)
                tail = losses[-2 * max(1, losses.shape[0] // 10):]
                if not bool(fit.converged) and not np.all(np.isfinite(tail)):
                    warnings.warn(
                        f"UHAGuide: the plain-VI warm start's loss was not finite at "
                        f"{int(np.sum(~np.isfinite(tail)))} of its last {tail.size} "
                        "steps: some of its draws from q (a Gaussian over every "
                        "unconstrained coordinate) fell where the log density is -inf or "
                        "NaN, e.g. outside a region a factor of -inf cuts out, so "
                        "whether it converged cannot be told. UHA training starts from "
                        "it anyway. Where the model cuts its support with a factor, "
                        "sampling a site on that support instead (b = a + d with d "
                        "positive, or constraints.ordered_vector, for a < b) keeps every "
                        "draw inside it.",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                elif not bool(fit.converged):
                    diff, se = loss_decrease(losses)
                    warnings.warn(
                        f"UHAGuide: the plain-VI warm start had not converged after "
                        f"{losses.shape[0]} steps: its mean loss fell by "
                        f"{diff:.3g} ± {se:.2g} nats from the second-last tenth of the "
                        "steps to the last (more than twice its standard error). UHA "
                        "training starts from it anyway and goes on fitting q; for a "
                        "closer start, pass a larger "
                        "warm_start_steps, or init_from=(fitted_guide, params) from your "
                        "own longer VI fit.",
                        RuntimeWarning,
                        stacklevel=2,
                    )
            else:
                lam = None
                nan = ""
                if host:
                    self._nan_at_prior = self._nan_sites_at_prior(args, kwargs, model_params)
                    if self._nan_at_prior is not None:
                        nan = " " + self._nan_at_prior.sentence
                warnings.warn(
                    "UHAGuide: the plain-VI warm start diverged (non-finite values); "
                    f"starting q from init_loc_fn and init_scale instead.{nan}",
                    RuntimeWarning,
                    stacklevel=2,
                )
            self.warm_start_result = fit
        dtype = init_loc.dtype
        if lam is None or _is_tracer(lam):
            lam = jnp.asarray(jnp.nan, dtype)
        start = _start_arrays(
            loc, scale, lam, self.K + 1, self.init_step_size, self.max_step_size,
            self._dense_for(scale, start_log_weights), host=host,
        )
        with_ceiling = not _is_tracer(start["stability_ceiling"]) and bool(
            jnp.isfinite(start["stability_ceiling"])
        )
        self._init_values = self._initial_values(loc, scale, start, preconditioned, with_ceiling)
        if preconditioned:
            # the optimizer's units (_precondition.py): the start's mean and marginal sds,
            # or for a full-rank q its Cholesky factor (whitened coordinates)
            self._precondition = (
                loc, _whitening_factor(scale, host=host) if self.base_dist == "cholesky"
                else start["stability_scale"],
            )
            if self.base_dist == "cholesky" and not _is_tracer(scale):
                self._check_factor_invertible(scale)

    @property
    def _poor_fit_advice(self) -> str:
        """The k̂ warning's advice; for a diagonal q, that a full-rank one follows
        correlations (past ``FULL_RANK_MAX_DIM`` it is not the default)."""
        if self.base_dist == "cholesky" or (self.latent_dim or 0) < 2:
            return UHA_ADVICE
        why = (
            "base_dist='diagonal'" if self.requested_base_dist == "diagonal"
            else f"{self.latent_dim} coordinates, more than FULL_RANK_MAX_DIM = {FULL_RANK_MAX_DIM}"
        )
        return (
            f"{UHA_ADVICE} This q is diagonal ({why}), and a correlated posterior is beyond "
            "it: base_dist='cholesky' gives a full-rank q (its cost per step grows as d²)."
        )

    def _check_factor_invertible(self, scale):
        """A clear error where q's start Cholesky factor cannot be inverted at its dtype:
        the optimizer's coordinates of ``{prefix}_scale_tril`` (whitened by that factor,
        ``_precondition.py``) would be NaN, and ``svi.init`` would hand SVI NaN
        parameters without a word."""
        u = _scale_corr_inverse(scale, self._precondition[1], host=True)
        if np.all(np.isfinite(np.asarray(u))):  # NumPy: no program to compile
            return
        factor = np.asarray(scale, np.float64)
        condition = float(np.linalg.cond(np.tril(factor))) if np.all(np.isfinite(factor)) else np.inf
        raise FloatingPointError(
            f"UHAGuide: q's start Cholesky factor ('{self._param_name('scale')}', "
            f"{factor.shape[0]} × {factor.shape[0]}, condition number {condition:.3g}) "
            f"cannot be inverted in {np.asarray(scale).dtype}, so its optimizer "
            "coordinates would be NaN. Where it came from init_from, refit that guide or "
            "pass a better-conditioned q; otherwise pass base_dist='diagonal', or run in "
            "float64 (jax.config.update('jax_enable_x64', True))."
        )

    def _initial_values(self, loc, scale, start, preconditioned, with_ceiling) -> dict:
        """The parameters' initial values from q's ``loc`` and ``scale`` and the
        derived ``start`` arrays (:func:`_start_arrays`)."""
        values = {
            "loc": loc,
            "scale": scale,
            "step_size": jnp.asarray(self.init_step_size, loc.dtype),
            "damping": jnp.asarray(self.init_damping, loc.dtype),
            **{k: v for k, v in start.items() if k not in FIXED and k != "ceiled_step_size"},
        }
        if preconditioned:
            # Both enter the dynamics, so they are registered as (never learned) params:
            # a guide rebuilt from scratch and given a fit's params draws what the fit drew.
            if with_ceiling:
                values["stability_scale"] = start["stability_scale"]
                values["stability_ceiling"] = start["stability_ceiling"]
                values["step_size"] = start["ceiled_step_size"]
            # kicks bounded at FORCE_LIMIT_SDS / s (q's sds): the gradient of a Gaussian
            # coordinate that far out; see AnnealingParams.force_limit
            values["force_limit"] = start["force_limit"]
        if "mass_factor" in start:
            # a full-rank q's chain moves in its start's whitened coordinates (the
            # momentum, its scales, the steps and the force bound are theirs)
            values["mass_factor"] = start["mass_factor"]
        return values

    @property
    def sample_batch_size(self) -> int:
        """Draws computed together (see the constructor); the device-sized default once
        the guide is set up, where none was given."""
        if self._sample_batch_size is not None:
            return self._sample_batch_size
        if self._auto_batch_size is None:
            if self._setup_args is None:  # not set up, or set up on traced arguments
                return CPU_BATCH_PER_DEVICE * num_shards(self.sharding)
            self._auto_batch_size = self._device_batch_size(
                *_split_static(self._setup_args, self._hold_data),
                {name: site["value"] for name, site in self._model_param_sites.items()},
            )
        return self._auto_batch_size

    @sample_batch_size.setter
    def sample_batch_size(self, value):
        if value is not None:
            _check_int("sample_batch_size", value, 1)
        self._sample_batch_size = value

    def _device_batch_size(self, arrays, spec, model_params) -> int:
        """The default ``sample_batch_size``: on a GPU or TPU the draws a quarter of the
        device's free memory holds, from the memory XLA plans for a vectorized gradient
        of the log density (what each leapfrog step computes), between 1024 and 65536
        per device (a power of two); on a CPU 1008 per device, fewer (a power of two,
        at least 16) where 1008 would plan more than a quarter of the free RAM (a GP's
        N × N kernel per draw: N = 1000 planned 22 GiB at 1008). Times the devices the
        draws are sharded over."""
        shards = num_shards(self.sharding)
        device = (
            self.sharding.mesh.devices.flat[0] if self.sharding is not None else jax.devices()[0]
        )
        probe = 64

        def grads(zs, arrays):
            args, kwargs = _merge_static(arrays, spec)
            logdensity_fn = self._make_logdensity(args, kwargs, model_params)
            return jax.vmap(jax.grad(logdensity_fn))(zs)

        def per_draw_bytes(lowered):
            memory = lowered.compile().memory_analysis()
            per_draw = (memory.temp_size_in_bytes + memory.output_size_in_bytes) / probe
            # the chain's own state per draw: position, momentum, gradient, weights
            return per_draw + 8 * self.latent_dim * self._init_latent.dtype.itemsize

        zs = jax.ShapeDtypeStruct((probe, self.latent_dim), self._init_latent.dtype)
        if device.platform == "cpu":
            try:
                budget = DRAW_MEMORY_SHARE * _free_host_memory()
                lowered = jax.jit(grads).lower(zs, arrays)
                # a cheap screen first (no compilation): the bytes the gradient reads and
                # writes bound what it holds at once; only where that bound does not fit
                # is the plan compiled and read
                accessed = _bytes_accessed(lowered) / probe
                if accessed * CPU_BATCH_PER_DEVICE <= budget:
                    return CPU_BATCH_PER_DEVICE * shards
                fits = int(budget / max(per_draw_bytes(lowered), 1.0))
            except Exception:  # noqa: BLE001 - no memory figures here: the plain default
                return CPU_BATCH_PER_DEVICE * shards
            if fits >= CPU_BATCH_PER_DEVICE:
                return CPU_BATCH_PER_DEVICE * shards
            per_device = max(CPU_BATCH_MIN, fits)
            return (1 << (per_device.bit_length() - 1)) * shards
        try:
            stats = device.memory_stats() or {}
            free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
            per_draw = per_draw_bytes(jax.jit(grads).lower(zs, arrays))
            fits = int(DRAW_MEMORY_SHARE * free / max(per_draw, 1.0))
        except Exception:  # no memory statistics or analysis on this backend
            fits = DEVICE_BATCH_MAX
        per_device = max(DEVICE_BATCH_MIN, min(DEVICE_BATCH_MAX, fits))
        return (1 << (per_device.bit_length() - 1)) * shards

    def _program(self, impl, spec, *, quick=False, **static):
        """``impl`` with ``spec`` and ``static`` bound, jitted once per argument structure
        (``spec``) and options; not jitted where ``spec`` cannot be hashed (only a pytree
        node whose own data cannot: :func:`_split_static` holds an unhashable leaf, e.g.
        a DataFrame, by identity). ``quick``: compiled
        at XLA's lowest CPU optimization, for a program run once or a few times, where
        the compile time is most of the cost (:func:`~numpyro_uha.core.warm_start.small_jit`)."""
        return _jit_once(self._jitted_setup, impl, spec, quick=quick, **static)

    def _sample_impl(self, rng_key, annealing, model_params, arrays, *, spec):
        args, kwargs = _merge_static(arrays, spec)
        return annealed_sample(
            rng_key,
            self._make_logdensity(args, kwargs, model_params),
            annealing,
            num_leapfrog_steps=self.num_leapfrog_steps,
            remat=self.remat,
            integrator=self.integrator,
            # the divergence check of calm chains without K evaluations of the model; it
            # keeps the K positions (K·d per particle), which remat is asked not to
            deferred_diagnostics=not self.remat,
        )

    def _run_setup(self, kind, rng_key, loc, scale, arrays, spec, model_params, precompiling=None):
        """The setup's numerical work: ``"warm_start"`` (the warm start from ``loc`` with
        fallback scale ``scale``, and the curvature at the fitted q) or ``"score"``
        (``init_from``'s q scored, and its curvature); returns ``(fit or log weights, λ)``.

        The model's log density is compiled in one program, its value and gradient at
        :data:`SETUP_ROWS` rows (Hessian-vector products by central differences of it,
        :func:`~numpyro_uha.core.warm_start.difference_oracle`), once per argument
        structure, and the warm start's loops run around it (see
        :mod:`numpyro_uha.core.warm_start`): one program holding every stage compiled
        the model once per stage and took seconds longer. Set up inside a JAX transform
        (traced arguments), the same steps are traced inline, with exact products.

        ``precompiling``: the thread compiling the model-free steps
        (:meth:`_precompile_setup`); it is joined before the first step runs.
        """
        if _is_tracer((rng_key, loc, scale, arrays, model_params)) or not _hashable(spec):
            args, kwargs = _merge_static(arrays, spec)
            oracle = rows_oracle(self._make_logdensity(args, kwargs, model_params), compiled=False)
        else:
            program = self._program(self._oracle_impl, spec)
            width = self._setup_width(kind)
            rows = jax.ShapeDtypeStruct((width, loc.shape[-1]), loc.dtype)
            if precompiling is not None and precompiling.is_alive():
                # the model's one program, compiled now, beside the model-free steps'
                # rehearsal (XLA releases the GIL while it compiles); the call below
                # finds it compiled
                program.lower(rows, arrays, model_params).compile()
            call = lambda zs: program(zs, arrays, model_params)  # noqa: E731
            jaxpr_text = str(program.trace(rows, arrays, model_params).jaxpr)
            _linalg_hang.warn_if_linalg_may_hang(jaxpr_text)
            if "callback" in jaxpr_text:
                # a model calling the host (jax.pure_callback, which needs the GIL): each
                # call waited for (its results are the next step's input anyway); with
                # several queued, the callback could wait on a thread holding the GIL
                # while it waits for a free slot (XLA:CPU bounds the executions in
                # flight): a hang at 0 % CPU, seen once in a test of a custom_jvp rule
                # calling the host. Other models keep the overlap (0.6 s of setup).
                call = lambda zs: jax.block_until_ready(program(zs, arrays, model_params))  # noqa: E731
            oracle = difference_oracle(
                call, width, step_device=_step_device(self.warm_start_device),
            )
        if precompiling is not None:
            precompiling.join()
        out = self._setup_numerics(kind, oracle, rng_key, loc, scale, self.base_dist == "cholesky")
        if oracle.compiled:
            q = (out[0].loc, out[0].scale) if kind == "warm_start" else (loc, scale)
            self._flat_mask, ruled_out = _probe_near_q(oracle, *q, width)
            if ruled_out is not None:
                points, at_mean = ruled_out
                args, kwargs = _merge_static(arrays, spec)
                self._ruled_out = _RuledOut(
                    points.shape[0], width, at_mean,
                    self._sites_ruling_out(points[0], args, kwargs, model_params),
                )
        return out

    def _model_trace_at(self, unconstrained, model_params, args, kwargs):
        """The model's trace with each latent site at its ``unconstrained`` value (by
        the guide's site name), mapped by the site's support as the model draws it (a
        support that depends on another latent included: ``_supports.py``)."""
        return _supports.trace_at_unconstrained(
            self._conditioned_model(model_params), unconstrained, args, kwargs
        )

    def _sites_ruling_out(self, latent, args, kwargs, model_params):
        """The model's sites whose log density is −inf at the unconstrained ``latent``
        (one point; a model run op by op, only where such a point was found)."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # NumPyro's out-of-support warnings
                trace = self._model_trace_at(
                    self._unpack_latent(jnp.asarray(latent)), model_params, args, kwargs
                )
        except Exception:  # noqa: BLE001 - a diagnosis only: no names rather than a failure
            return []
        return [
            self._model_site(name) for name, log_prob in _site_log_probs(trace)
            if np.any(log_prob == -np.inf)
        ]

    def _warn_if_ruled_out(self):
        """Warn (:class:`~numpyro_uha.UHASupportWarning`) where the setup found points
        near q at which the log density is −inf (:func:`_probe_near_q`)."""
        found = getattr(self, "_ruled_out", None)
        if found is None:
            return
        count, total, at_mean, sites = found
        by = f"site(s) {sites} rule them out" if sites else "some site rules them out"
        mean = (
            " q's mean is one of them: the warm start ended outside the posterior's "
            "support, and training from there diverges."
            if at_mean else ""
        )
        warnings.warn(
            f"UHAGuide: the model's log density is -inf at {count} of {total} points near "
            f"q (its mean and draws at {FLAT_CHECK_WIDTH:g} sds) although every latent "
            f"site's value there is inside its support: {by}, so the posterior's support "
            "is narrower than the latent sites declare (observations y ~ Uniform(0, theta) "
            f"bound theta below by max(y), for example).{mean} A Gaussian q puts mass there "
            "and the chains that reach it diverge. Declare the bound in the model, so that "
            "every unconstrained value is possible: e.g. theta = y.max() + "
            "numpyro.sample('excess', dist.HalfNormal(...)), or a prior whose support "
            "starts there.",
            UHASupportWarning,
            stacklevel=2,
        )

    def _warn_if_flat(self):
        """Warn (:class:`~numpyro_uha.UHAImproperPosteriorWarning`) where the setup found
        coordinates the log density does not depend on (:func:`_probe_near_q`), or
        coordinates of an improper flat prior on an unbounded support that it depends on
        only through their log |det J| (:meth:`_flat_in_own_value`), naming their sites
        and positions."""
        masks = [
            m for m in (getattr(self, "_flat_mask", None), getattr(self, "_flat_in_value", None))
            if m is not None
        ]
        if not masks or not any(m.any() for m in masks):
            return
        mask = np.logical_or.reduce(masks)
        parts = []
        for name, positions in self._latent_positions().items():
            flat = mask[positions.reshape(-1)].reshape(positions.shape)
            if not flat.any():
                continue
            where = [tuple(int(i) for i in w) for w in np.argwhere(flat)]
            shown = ", ".join(str(w[0] if len(w) == 1 else w) for w in where[:8])
            more = f", … ({len(where)} in all)" if len(where) > 8 else ""
            what = f"at positions {shown}{more}" if flat.ndim else ""
            parts.append(f"{self._model_site(name)!r} {what}".rstrip())
        in_value = getattr(self, "_flat_in_value", None)
        support = (
            "; for a flat prior on an unbounded support such as positive: apart from the "
            "log |det J| of the map to that support, so flat in the site's own value"
            if in_value is not None and in_value.any() else ""
        )
        warnings.warn(
            "UHAGuide: the model's log density does not depend on latent site(s) "
            f"{'; '.join(parts)} (its gradient there is exactly zero at q's mean and at "
            f"draws from q{support}), so the posterior is improper in "
            "them: no guide can fit them, and the ELBO and log Z grow without bound as q "
            "widens there. Latents with an improper prior that nothing depends on do this. "
            "Give them a proper prior, or leave them out of the model. (Entries that the "
            "model masks out, as obs_mask and numpyro.handlers.mask do, are completed "
            "instead: see guide.completed_entries.)",
            UHAImproperPosteriorWarning,
            stacklevel=2,
        )

    def _setup_numerics(self, kind, oracle, rng_key, loc, scale, full_rank, vi_iterations=None):
        """:meth:`_run_setup`'s calls on a given ``oracle`` (the model's, or
        :func:`~numpyro_uha.core.warm_start.precompile`'s stand-in), their results on
        the default device (from the oracle's ``step_device``, if any)."""
        if kind == "warm_start":
            with _warm_start_bar(
                self.progress_bar and _svi_run_progress_bar() is not False
                and oracle.compiled and vi_iterations is None,
                self.warm_start_steps,
            ) as callback:
                fit = warm_start(
                    rng_key, None, loc, scale,
                    full_rank=full_rank,
                    num_steps=self.warm_start_steps,
                    learning_rate=self.warm_start_learning_rate,
                    num_particles=SETUP_ROWS // 3,
                    oracle=oracle,
                    vi_iterations=vi_iterations,
                    callback=callback,
                )
            out = fit, _curvature(
                oracle, fit.loc, fit.scale, self._dense_for(fit.scale, fit.log_weights)
            )
        else:
            log_weights = oracle_log_weights(
                oracle, rng_key, loc, scale, START_ELBO_DRAWS, self._score_rows
            )
            out = log_weights, _curvature(oracle, loc, scale, self._dense_for(scale, log_weights))
        return out if oracle.step_device is None else to_default_device(out)

    def _setup_width(self, kind) -> int:
        """Rows of the setup's model program (:meth:`_oracle_impl`): the warm start's
        value-and-gradient calls, or the scoring's."""
        return SETUP_ROWS if kind == "warm_start" else self._score_rows

    @property
    def _score_rows(self) -> int:
        return min(SETUP_ROWS, self._sample_batch_size or SETUP_ROWS)  # the user's bound, if any

    def _precompile_setup(self, dim):
        """Start compiling the setup's model-free steps for a ``dim``-dimensional q in a
        background thread (:func:`~numpyro_uha.core.warm_start.precompile`), while
        NumPyro's initialization traces the model; ``None`` when there is nothing to
        compile or it was compiled before in this process."""
        if dim is None or (self.init_from is None and self.warm_start_steps == 0):
            return None
        kind = "warm_start" if self.init_from is None else "score"
        full_rank = self._full_rank(dim)
        dtype = jnp.result_type(float)
        signature = (
            kind, dim, str(dtype), full_rank, self.warm_start_steps,
            float(self.warm_start_learning_rate), self._score_rows, self._dense,
        )

        def rehearsal(oracle):
            loc = np.zeros(dim, dtype)  # stand-ins built by NumPy: no eager programs
            key = jax.random.PRNGKey(0)
            if kind == "warm_start":
                scale = np.asarray(1.0, dtype)  # the fallback scale
            else:  # a fitted q's scale
                scale = jnp.eye(dim, dtype=dtype) if full_rank else jnp.ones(dim, dtype)
            out, lam = self._setup_numerics(
                kind, oracle, key, loc, scale, full_rank, vi_iterations=2
            )
            if kind == "warm_start":
                loc, scale = out.loc, out.scale
                _all_finite((loc, scale), host=True)
            start = _start_arrays(
                loc, scale, lam, self.K + 1, self.init_step_size, self.max_step_size,
                self._dense_for(scale), host=True,
            )
            if full_rank:  # the Cholesky parameter's inverse transform (svi.init's)
                _scale_corr_inverse(scale, _whitening_factor(scale, host=True), host=True)
            return start, _q_log_density(loc, loc, scale, host=True)  # the setup call's

        return precompile(
            signature, rehearsal, width=self._setup_width(kind),
            step_device=_step_device(self.warm_start_device),
        )

    @property
    def _dense(self):
        """``dense_mass`` ("auto", True or False; "auto" for a guide pickled before it)."""
        return getattr(self, "dense_mass", "auto")

    def _dense_for(self, scale, log_weights=None) -> bool:
        """Whether q's chain moves in its whitened coordinates (a dense mass), for q's
        start ``scale`` and the log weights it was scored by (``log_weights``; ``None``:
        not scored): never for a diagonal q; ``dense_mass`` where it is True or False;
        for "auto", where q's correlation matrix C has 1 / λ_min(C) ≥
        ``DENSE_MASS_MIN_CONDITION``, or ≥ ``DENSE_MASS_CLOSE_CONDITION`` with the start
        within ``DENSE_MASS_CLOSE_KL`` nats of the posterior (decided on the host; a
        start traced under a JAX transform keeps the diagonal mass). Without it the
        chain is the diagonal mass's, exactly as it was before the dense mass existed
        (no mass factor)."""
        if jnp.ndim(scale) != 2:
            return False
        if self._dense != "auto":
            return bool(self._dense)
        if _is_tracer((scale, log_weights)):
            return False
        condition = float(_inverse_smallest_correlation(scale, host=True))
        if condition >= DENSE_MASS_MIN_CONDITION:
            return True
        return (
            condition >= DENSE_MASS_CLOSE_CONDITION
            and log_weights is not None
            and laplace_close(log_weights, DENSE_MASS_CLOSE_KL)
        )

    def _full_rank(self, dim) -> bool:
        if self.requested_base_dist == "auto":
            return 1 < dim <= FULL_RANK_MAX_DIM  # d = 1: the same q either way
        return self.requested_base_dist == "cholesky"

    def _oracle_impl(self, zs, arrays, model_params, *, spec):
        """The log density's value and gradient at rows ``zs`` (the setup's one model
        program; see :meth:`_run_setup`)."""
        args, kwargs = _merge_static(arrays, spec)
        logdensity_fn = self._make_logdensity(args, kwargs, model_params)
        return rows_oracle(logdensity_fn, compiled=False).value_and_grad(zs)

    def _q_from_fitted(self, guide, params):
        """(loc, scale) of a fitted Gaussian AutoGuide, in this guide's latent layout."""
        if isinstance(guide, AutoNormal):
            def flat(suffix):
                return jnp.concatenate([
                    jnp.reshape(params[f"{name}_{guide.prefix}_{suffix}"], -1)
                    for name in self._init_locs
                ])
            missing = [n for n in self._init_locs if f"{n}_{guide.prefix}_loc" not in params]
            if missing:
                raise ValueError(f"init_from: fitted params lack AutoNormal entries for sites {missing}.")
            loc, scale = flat("loc"), flat("scale")
        elif isinstance(guide, (AutoDiagonalNormal, AutoMultivariateNormal)):
            if guide.prototype_trace is None or list(guide._init_locs) != list(self._init_locs):
                raise ValueError(
                    "init_from: the fitted guide must have been trained on the same model "
                    f"(latent sites {list(self._init_locs)})."
                )
            posterior = guide.get_posterior(params)
            loc = posterior.loc
            scale = (
                posterior.scale_tril if isinstance(guide, AutoMultivariateNormal) else posterior.scale
            )
        else:
            raise TypeError(
                "init_from supports fitted AutoNormal, AutoDiagonalNormal and "
                f"AutoMultivariateNormal guides, got {type(guide).__name__}."
            )
        if loc.shape != (self.latent_dim,):
            raise ValueError(
                f"init_from: fitted loc has shape {loc.shape}, expected ({self.latent_dim},)."
            )
        if self.base_dist == "cholesky" and scale.ndim == 1:
            scale = jnp.diag(scale)
        elif self.base_dist == "diagonal" and scale.ndim == 2:
            scale = jnp.sqrt(jnp.sum(scale**2, axis=-1))
        return loc, scale

    def _trace_at_init(self, model, args, kwargs):
        """The model's trace with latent values from ``init_loc_fn``, as NumPyro's own
        initialization traces it: works for improper priors (``ImproperUniform``), which
        cannot be sampled, and never touches the caller's random key."""
        with handlers.block():
            init_model = handlers.substitute(
                handlers.seed(model, 0), substitute_fn=self.init_loc_fn
            )
            return handlers.trace(init_model).get_trace(*args, **kwargs)

    def _model_site(self, name) -> str:
        """The model's own site for one of the guide's latent sites: ``x`` for the
        non-centered ``x_decentered``, the name itself otherwise."""
        return _decenter.written_name(name, self.decentered_sites)

    def _resolve_decenter(self, args, kwargs) -> tuple:
        """The sites to run non-centered (see ``decenter``), before setup."""
        if self.requested_decenter is False:
            return ()
        if self.requested_decenter == "auto":
            found = tuple(_decenter.find_decenterable(self._user_model, args, kwargs))
            moving = self._moved_by_discrete(found, args, kwargs)
            return tuple(n for n in found if n not in moving)
        names = tuple(self.requested_decenter)
        model_trace = self._trace_at_init(self._user_model, args, kwargs)
        moving = self._moved_by_discrete(names, args, kwargs)
        if moving:
            raise ValueError(
                f"UHAGuide: decenter site(s) {moving} have a loc or scale that depends on "
                f"the discrete latent site(s) {list(self._discrete)}, which are summed out: "
                "non-centered, their values would too. Leave them out of decenter."
            )
        for name in names:
            site = model_trace.get(name)
            if site is None or site["type"] != "sample" or site["is_observed"]:
                latent = sorted(
                    n for n, s in model_trace.items()
                    if s["type"] == "sample" and not s["is_observed"]
                )
                raise ValueError(
                    f"UHAGuide: decenter names {name!r}, not a latent site of the model"
                    f" (its latent sites: {latent}).{did_you_mean_site(name, latent)}"
                )
            base = _decenter._unwrap(site["fn"])
            if type(base) not in _decenter.LOC_SCALE_FAMILIES:
                raise ValueError(
                    f"UHAGuide: decenter site {name!r} has a {type(base).__name__} "
                    "distribution; only loc-scale families "
                    f"({', '.join(f.__name__ for f in _decenter.LOC_SCALE_FAMILIES)}) can be "
                    "non-centered."
                )
        return names

    def _moved_by_discrete(self, names, args, kwargs) -> list:
        """The sites among ``names`` whose loc or scale changes with the discrete latent
        sites' values (the model traced at its initial point with every discrete site at
        the i-th value of its support, for each i up to the largest support's size, 16
        at most). Non-centered, such a site's value x = loc(c) + scale(c) x̃ would move
        with c, which the chain sums out. All of ``names`` where the model cannot be
        traced so."""
        if not self._discrete or not names:
            return []
        try:
            base = self._trace_at_init(self._user_model, args, kwargs)
            continuous = {
                n: site["value"] for n, site in base.items()
                if site["type"] == "sample" and not site["is_observed"]
                and n not in self._discrete
            }

            supports = {n: base[n]["fn"].enumerate_support(expand=False) for n in self._discrete}

            def standardized(pick):
                discrete = {
                    n: jnp.broadcast_to(
                        support[min(pick, len(support) - 1)], jnp.shape(base[n]["value"])
                    )
                    for n, support in supports.items()
                }
                model = handlers.substitute(
                    handlers.seed(self._user_model, 0), data={**continuous, **discrete}
                )
                with handlers.block():
                    model_trace = handlers.trace(model).get_trace(*args, **kwargs)
                return {
                    n: np.asarray(_decenter.to_standard(
                        _decenter._unwrap(model_trace[n]["fn"]), continuous[n]
                    ))
                    for n in names
                }

            first = standardized(0)
            others = [
                standardized(i)
                for i in range(1, min(16, max(len(s) for s in supports.values())))
            ]
        except Exception:  # noqa: BLE001 - not traceable so: none non-centered
            return list(names)
        return [
            n for n in names
            if not all(np.allclose(first[n], other[n], equal_nan=True) for other in others)
        ]

    def _abstract_trace(self, model, args, kwargs):
        """The model's trace at init (:meth:`_trace_at_init`) with abstract values: its
        sites, distributions and shapes, traced without compiling or running anything
        (the concrete trace compiles each of the model's operations the first time,
        seconds on 2 cores; NumPyro's initialization does that later anyway). The
        concrete trace where the abstract one fails (e.g. Python control flow on latent
        values)."""
        traces = []

        def probe():
            traces.append(self._trace_at_init(model, args, kwargs))
            return jnp.zeros(())

        try:
            jax.eval_shape(probe)
        except Exception:  # noqa: BLE001 - not traceable: the concrete trace, below
            pass
        if traces:
            return traces[0]
        # outside the handler: a model's own error is shown once, not as raised "during
        # handling of" the abstract trace's
        return self._trace_at_init(model, args, kwargs)

    def _validate_model(self, args, kwargs):
        model_trace = self._abstract_trace(self.model, args, kwargs)
        latent = []
        for name, site in model_trace.items():
            if site["type"] == "plate":
                size, subsample_size = site["args"][0], site["args"][1]
                if subsample_size is not None and subsample_size < size:
                    raise ValueError(
                        f"UHAGuide: plate '{name}' subsamples {subsample_size} of {size} "
                        "elements. UHA's Hamiltonian dynamics need the full-data log density "
                        "(a subsampled one gives neither a valid bound nor valid dynamics); "
                        "remove `subsample_size` from this plate. Where the plate holds a "
                        "latent site per data point, numpyro_uha.UHALocalGuide trains on "
                        "minibatches (one chain per data point: docs/how-to/local-latents.md)."
                    )
            if site["type"] == "sample" and not site["is_observed"]:
                if site["fn"].support.is_discrete:
                    continue  # summed out (_enumerate.py), checked below
                latent.append(name)
        _refuse_latents_in_cond(
            [n for n in latent if _inside_cond(model_trace[n])], "UHAGuide: "
        )
        parents = _hidden.hidden_parents(self._user_model, args, kwargs)
        if parents:
            raise ValueError(
                f"UHAGuide: the model it was given hides latent site(s) {parents[:6]} "
                "(numpyro.handlers.block) on which the density of its own sites depends. "
                "Its chains run that model, where the hidden sites take one draw from their "
                "prior, not the values another part of an AutoGuideList draws for them: "
                "they would anneal to the wrong posterior. Give this UHAGuide those sites "
                "too (hide fewer), or use it on the whole model. Parts independent of each "
                "other are fine."
            )
        # discrete latent sites: marginalized by enumeration in the chain's target, drawn
        # from their exact conditional by the guide (_enumerate.py)
        self._discrete = _enumerate.discrete_sites(model_trace, "UHAGuide")
        self._plate_nesting = _enumerate.plate_nesting(model_trace) if self._discrete else 0
        self._scanned_discrete = tuple(
            n for n in self._discrete if model_trace[n].get("_control_flow_done")
        )
        if not latent:
            raise ValueError(
                "UHAGuide: the model has no continuous latent sample site (every sample "
                "site is observed, or discrete), so there is no posterior for UHA's "
                "dynamics to approximate."
            )
        try:  # q's dimension, to compile the setup's steps early (_precompile_setup)
            return sum(
                math.prod(biject_to(model_trace[name]["fn"].support).inverse_shape(
                    jnp.shape(model_trace[name]["value"])
                ))
                for name in latent
            )
        except Exception:  # noqa: BLE001 - only an early start
            return None

    def _describe_bad_initial_point(self, args, kwargs):
        """Name the sites whose log probability is not finite at an initial point."""
        model_trace = self._trace_at_init(self.model, args, kwargs)
        data = _nonfinite_data_in(model_trace)
        if data:
            return (
                "UHAGuide: the model's log density is not finite at any initial point "
                f"because the data are not: {_name_nonfinite_data(data)}"
                ". Drop those entries, or mark them missing with obs_mask= on the site "
                "(NumPyro then imputes them, as the latent site '<name>_unobserved'), or "
                "replace them by finite values and mask them out (numpyro.handlers.mask)."
            )
        bad = [
            name
            for name, site in model_trace.items()
            if site["type"] == "sample"
            and not bool(jnp.all(jnp.isfinite(site["fn"].log_prob(site["value"]))))
        ]
        observed = [  # data, not numpyro.factor terms (observed Unit sites)
            n for n in bad
            if model_trace[n].get("is_observed") and not _is_factor(model_trace[n])
        ]
        bound = (
            " Only observed sites are: if the data rule out part of a latent site's "
            "declared support (observations y ~ Uniform(0, theta) rule out theta below "
            "max(y)), declare that bound in the model (e.g. theta = y.max() + a positive "
            "excess); an init_loc_fn=init_to_value(...) inside it starts the guide, but a "
            "Gaussian q still reaches past it (UHASupportWarning)."
            if observed and observed == bad else ""
        )
        gradient = "" if bad else self._nonfinite_gradient_at(model_trace, args, kwargs)
        return (
            "UHAGuide: the model's log density (or its gradient) is not finite at any "
            f"initial point tried by init_loc_fn; sites with a non-finite log probability at "
            f"such a point: {bad or 'none found (check factors and gradients)'}.{gradient} "
            f"Choose another init_loc_fn (e.g. init_to_median) or fix the model.{bound}"
        )

    def _nan_sites_at_prior(self, args, kwargs, model_params):
        """Where the warm start diverged: the model's sites whose log probability is NaN
        at some of :data:`NAN_PRIOR_DRAWS` draws of the latent sites from their prior
        (observed sites at their data), as a :class:`_NanAtPrior`; ``None`` where there
        are none, or the prior cannot be drawn from (an improper prior). A NaN there is
        in the model's own arithmetic (0 · log 0, log of a negative number, inf − inf,
        an overflowing exp), which a chain that reaches it cannot leave; where the
        posterior lies there no step size mends it (NUTS diverges, AutoNormal fails at
        initialization), where only a vague prior reaches it the chains may stay away."""
        model = self._user_model
        if model_params:
            model = handlers.substitute(model, data=model_params)
        counts = {}
        nan_draws = 0
        for seed in range(NAN_PRIOR_DRAWS):
            try:
                with handlers.block(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    trace = handlers.trace(handlers.seed(model, seed)).get_trace(
                        *args, **kwargs
                    )
                    found = [
                        name for name, log_prob in _site_log_probs(trace, enumerated=False)
                        if np.any(np.isnan(log_prob))
                    ]
            except Exception:  # noqa: BLE001 - a diagnosis only (improper priors, ...)
                return None
            nan_draws += bool(found)
            for name in found:
                counts[name] = counts.get(name, 0) + 1
        if not counts:
            return None
        return _NanAtPrior(nan_draws, NAN_PRIOR_DRAWS, sorted(counts, key=lambda n: -counts[n]))

    def _nonfinite_gradient_at(self, model_trace, args, kwargs):
        """A sentence naming the latent sites where the log density's gradient is not
        finite at ``model_trace``'s values although the log density is ('' if none)."""
        values = {
            name: site["value"] for name, site in model_trace.items()
            if site["type"] == "sample" and not site["is_observed"]
            and not site["fn"].support.is_discrete
        }
        try:
            grads = jax.grad(
                lambda v: model_log_density(self.model, args, kwargs, v)[0]
            )(values)
        except Exception:  # noqa: BLE001 - only a better message
            return ""
        named = [n for n, g in grads.items() if not bool(jnp.all(jnp.isfinite(g)))]
        if not named:
            return ""
        return (
            f" The log density is finite there but its gradient is not, in latent site(s) "
            f"{named}: a term whose derivative is infinite or NaN at that value (jnp.sqrt "
            "or jnp.linalg.norm at 0, or jnp.where with a NaN in the branch not taken, "
            "whose gradient is NaN too). Write it with a finite derivative there (e.g. "
            "jnp.sqrt(x + 1e-12)), or start elsewhere."
        )

    # ----------------------------------------------------------- log density
    def _model_params_in(self, params):
        """The model's own ``numpyro.param`` values among ``params``."""
        return {name: params[name] for name in self._model_param_sites if name in params}

    def _conditioned_model(self, model_params):
        return handlers.substitute(self.model, data=model_params) if model_params else self.model

    @property
    def completed_entries(self) -> dict:
        """Latent entries the model masks out and nothing in it depends on, which the
        guide counts with a standard normal density (see the class docstring): ``{site: bool
        array over the site's batch shape}``, by the model's site names; empty where
        there are none or before setup."""
        return {self._model_site(n): e.copy() for n, e in self._completion.items()}

    def _latent_positions(self) -> dict:
        """Each latent site's positions in the flat latent vector (integers, in the
        site's unconstrained shape)."""
        index = self._unpack_latent(np.arange(self.latent_dim, dtype=np.float64))
        return {name: np.rint(np.asarray(p)).astype(int) for name, p in index.items()}

    def _masked_flat_entries(self, init_loc, arrays, spec, model_params) -> dict:
        """The latent entries to complete (:func:`~numpyro_uha._masked.completable`):
        masked out in the prototype trace, and flat at NumPyro's initial point and at
        draws around it (one compiled call of the log density's gradient, made only for
        a model with masked-out latent entries)."""
        masked = masked_out_entries(self.prototype_trace)
        if not masked:
            return {}
        flat = self._flat_at_init(init_loc, arrays, spec, model_params, probe=True)
        return completable(masked, flat, self._latent_positions())

    def _flat_at_init(self, init_loc, arrays, spec, model_params, **target):
        """The coordinates along which the target ``_make_logdensity(..., **target)`` is
        constant at NumPyro's initial point and at draws around it (q's initial scale;
        :func:`_probe_near_q`'s ``flat``, ``None`` if it cannot tell): one compiled call
        of its value and gradient, for the setup's probes before the warm start."""
        args, kwargs = _merge_static(arrays, spec)
        oracle = rows_oracle(self._make_logdensity(args, kwargs, model_params, **target))
        init_scale = np.full(self.latent_dim, self._init_scale, np.dtype(init_loc.dtype))
        flat, _ = _probe_near_q(oracle, init_loc, init_scale, MASK_PROBE_ROWS)
        return flat

    def _flat_in_own_value(self, init_loc, arrays, spec, model_params):
        """The coordinates of the latent sites with an improper flat prior on an
        unbounded support other than the real line
        (:func:`~numpyro_uha._supports.flat_on_unbounded_support`) along which the log
        density, those sites' log |det J| left out, is constant at NumPyro's initial
        point and draws around it: the posterior is flat there in the site's own value,
        hence improper (a bool mask over the latent coordinates). ``None`` without such
        sites, the common case: no program is compiled for it."""
        names = _supports.flat_on_unbounded_support(self.prototype_trace)
        if not names:
            return None
        flat = self._flat_at_init(init_loc, arrays, spec, model_params, without_jacobian=names)
        if flat is None:
            return None
        index = self._latent_positions()
        mask = np.zeros(self.latent_dim, bool)
        for name in names:
            positions = index[name].reshape(-1)
            mask[positions] = flat[positions]
        return mask

    def _make_logdensity(self, args, kwargs, model_params, probe=False, without_jacobian=()):
        """z ↦ the chain's target. A masked-out entry's log |det J| counts (its density
        is then flat in the model's own x, as Trace_ELBO's terms have it) except where
        the entry is completed (_masked.py), which counts with its completion density in
        z instead; ``probe`` (the setup's flatness probe): every masked-out entry
        without its log |det J|, nothing completed yet. ``without_jacobian``: latent sites
        whose log |det J| is left out (:meth:`_flat_in_own_value`'s probe)."""
        model = self._conditioned_model(model_params)
        init_trace = self._check_same_latents(model, args, kwargs)
        coords, completed = self._completion_now(init_trace)
        # summed out, a masked-out discrete entry would count log |support| (_enumerate.py)
        masked_out = _enumerate.masked_out_log_count(init_trace, self._discrete)

        # Seeded inside the block: NumPyro's block lets "prng_key" messages through, so a
        # model drawing keys (e.g. numpyro.contrib.control_flow.scan) would otherwise split
        # the caller's key inside a JAX transform (the warm start's scan) and leak a tracer.
        seeded = handlers.seed(model, rng_seed=0)
        enum = bool(self._discrete)
        if enum:  # discrete latent sites summed out (_enumerate.py)
            seeded = _enumerate.enumerated(seeded, self._plate_nesting)
        # each site's log |det J| unscaled, as in Trace_ELBO's terms (_UnscaledJacobians)
        seeded = _UnscaledJacobians(
            seeded, self._init_locs, None if probe else completed, without_jacobian
        )

        def logdensity_fn(z):
            with handlers.block():
                value = -potential_energy(
                    seeded, args, kwargs, self._unpack_latent(z), enum=enum
                )
            if coords is not None:  # masked-out entries nothing depends on (_masked.py)
                value = value + completion_log_density(z, coords)
            return value - masked_out if self._discrete else value

        return logdensity_fn

    def _completion_now(self, model_trace=None, args=None, kwargs=None, model_params=None):
        """The completed entries (set up by :meth:`_masked_flat_entries`) that this
        call's model masks out: ``(coords, entries)`` (see
        :func:`~numpyro_uha._masked.current_coordinates`), ``(None, {})`` where there
        are none. From ``model_trace``, or a trace at ``args``, ``kwargs`` (under a JAX
        transform only the masks' computation stays in the program)."""
        if not self._completion:
            return None, {}
        if model_trace is None:
            model = self._conditioned_model(model_params)
            model_trace = self._trace_at_init(model, args, kwargs)
        return current_coordinates(
            self._completion, model_trace, self._latent_positions(), self.latent_dim
        )

    def _check_same_latents(self, model, args, kwargs):
        """Raises where this call's latent sites differ from the setup's; returns the
        model's trace at the initial point."""
        model_trace = self._trace_at_init(model, args, kwargs)
        extra = [
            name
            for name, site in model_trace.items()
            if site["type"] == "sample" and not site["is_observed"] and name not in self._init_locs
            and name not in self._discrete
        ]
        if extra:
            raise ValueError(
                f"UHAGuide: site(s) {extra} are unobserved in this call but were observed "
                "when the guide was set up. UHA's dynamics target the posterior, so the guide "
                "needs the observed data: train and call sample_posterior or log Z with "
                "the data arguments used in training. Predictive(model, guide=guide, "
                "params=params, num_samples=n)(key, X_new) may leave out all the observed "
                "data (not only some): the guide then draws from the posterior of the data "
                "it was set up with, and the model predicts at X_new."
            )
        gone = [
            name for name in self._init_locs
            if name not in model_trace or model_trace[name]["type"] != "sample"
            or model_trace[name]["is_observed"]
        ]
        if gone:
            observed = [self._model_site(n) for n in gone if n in model_trace]
            absent = [self._model_site(n) for n in gone if n not in model_trace]
            said = []
            if observed:
                said.append(f"site(s) {observed} are observed in this call")
            if absent:
                said.append(f"site(s) {absent} are not in the model in this call")
            raise ValueError(
                f"UHAGuide: {' and '.join(said)}, but were latent when the guide was set "
                "up (its q and chain are over them; a value passed for them now would be "
                "ignored, the draws and log Z silently those of the model without it). "
                "Call the guide with the arguments it was trained with (the data you "
                "left out then, obs_mask as then), or set up and train a new guide with "
                "these arguments."
            )
        prototype = self.prototype_trace or {}
        factors_gone = [
            self._model_site(name) for name, site in prototype.items()
            if site["type"] == "sample" and site["is_observed"]
            and _is_factor(site) and name not in model_trace
        ]
        if factors_gone:
            raise ValueError(
                f"UHAGuide: numpyro.factor site(s) {factors_gone} were in the model when the "
                "guide was set up but are not in this call: its chains would target another "
                "density (a likelihood written as a factor left out: the prior). Call the "
                "guide with the arguments it was trained with."
            )
        changed = [
            (name, tuple(jnp.shape(prototype[name]["value"])), tuple(jnp.shape(site["value"])))
            for name, site in model_trace.items()
            if site["type"] == "sample" and not site["is_observed"] and name in prototype
            and jnp.shape(site["value"]) != jnp.shape(prototype[name]["value"])
        ]
        if changed:
            raise ValueError(
                "UHAGuide: latent site(s) changed shape since the guide was set up: "
                + ", ".join(f"'{n}' from {a} to {b}" for n, a, b in changed)
                + ". The guide's q and chain are sized to the model it was set up with; "
                "call it with arguments that give every latent site its shape then (a "
                "Python int argument sizing a latent, e.g. a number of basis functions, "
                "must stay the same), or set up a new guide."
            )
        return model_trace

    def _nonfinite_data_sites(self, args, kwargs):
        """Observed sites (not a ``numpyro.factor``'s) with a NaN or inf value, not masked
        out, in these arguments: ``{site: flat indices over its batch shape}`` (concrete
        arguments only)."""
        try:
            model_trace = self._trace_at_init(self.model, args, kwargs)
        except Exception:  # noqa: BLE001 - only a diagnosis
            return {}
        return _nonfinite_data_in(model_trace)

    def get_logdensity_fn(self, params, *args, **kwargs):
        """z ↦ log p̄(z): the model's log joint in unconstrained space, Jacobians included.

        Built from the arguments given here, with the model's own ``numpyro.param``
        values taken from ``params``; ``z`` is a flat vector of size ``latent_dim``.
        """
        self._require_setup()
        return self._make_logdensity(args, kwargs, self._model_params_in(params))

    # ------------------------------------------------------------ parameters
    def _param_specs(self):
        precondition = getattr(self, "_precondition", None)
        if precondition is not None:
            # the optimizer moves q's mean and scale in posterior sds (_precondition.py);
            # s0: marginal sds, or a full-rank q's Cholesky factor (whitened coordinates)
            m0, s0 = precondition
            loc_constraint = StandardizedReal(m0, s0)
            slope_constraint = StandardizedReal(jnp.zeros_like(m0), s0)
            scale_constraint = (
                StandardizedCholesky(m0, s0)
                if self.base_dist == "cholesky"
                else StandardizedPositive(m0, s0)
            )
        else:
            loc_constraint = slope_constraint = constraints.real
            scale_constraint = (
                constraints.scaled_unit_lower_cholesky
                if self.base_dist == "cholesky"
                else constraints.softplus_positive
            )
        return {
            "loc": loc_constraint,
            "scale": scale_constraint,
            "step_size": constraints.interval(0.0, self.max_step_size),
            "step_size_slope": constraints.real,
            "damping": constraints.interval(0.0, 1.0),
            # exp, not softplus: Σ^(1/2) starts at 1/std(q), often 10-100, where softplus is
            # linear and an Adam step of 1e-3 moves it by 0.01-0.1 % only; on the log scale
            # every step is a relative change (a1a, K = 32: ELBO -702.2 -> -697.5).
            "momentum_scale": constraints.positive,
            "beta_logits": constraints.real,
            "bridge_loc_slope": slope_constraint,
            "bridge_log_scale_slope": constraints.real,
            "drift_scale": constraints.positive,
            **{
                # the mass factor: a lower-triangular matrix (its zeros above the diagonal)
                short: constraints.real if short == "mass_factor" else constraints.positive
                for short in FIXED
                if self._init_values is not None and short in self._init_values
            },
        }

    def _param_name(self, short):
        if short == "scale" and self.base_dist == "cholesky":
            return f"{self.prefix}_scale_tril"
        return f"{self.prefix}_{short}"

    def _learnable(self, short):
        if short in FIXED:
            return False
        return not any(short in GROUPS[g] for g in self.frozen)

    def _assemble(self, values) -> AnnealingParams:
        betas = betas_from_logits(values["beta_logits"])
        step_sizes = step_sizes_from_beta(
            betas, values["step_size"], values["step_size_slope"], self.max_step_size
        )
        if "stability_ceiling" in values:
            # the largest per-coordinate step, in units of q's sds, stays under the
            # leapfrog's stability ceiling (see _start_arrays), by a clip whose gradient
            # can bring a step above it back under it (a plain clip gave it none)
            step_sizes = step_sizes_under_ceiling(step_sizes, _step_ceiling(values))
        return AnnealingParams(
            loc=values["loc"],
            scale=values["scale"],
            betas=betas,
            step_sizes=step_sizes,
            damping=values["damping"],
            momentum_scale=values["momentum_scale"],
            bridge_loc_slope=values["bridge_loc_slope"],
            bridge_log_scale_slope=values["bridge_log_scale_slope"],
            drift_scale=values["drift_scale"],
            force_limit=values.get("force_limit"),
            mass_factor=values.get("mass_factor"),
        )

    @property
    def _latch_name(self):
        return f"{self.prefix}_diverged"

    def _register_params(self) -> dict:
        """Register every group as a ``numpyro.param``; frozen ones get no gradient.

        Frozen groups are registered too (behind ``stop_gradient``), so that ``params``
        holds the whole fit: a guide rebuilt from scratch and given these params uses
        the values it was trained with, not a new warm start's. Optimizers leave a
        parameter with an exactly zero gradient unchanged (a decoupled weight decay,
        e.g. ``optax.adamw``, would still shrink it).
        """
        values = {}
        for short, constraint in self._param_specs().items():
            value = numpyro.param(
                self._param_name(short), self._init_values[short], constraint=constraint
            )
            self._check_param_shape(short, jnp.shape(value))
            self._check_param_range(short, value, constraint)
            values[short] = value if self._learnable(short) else jax.lax.stop_gradient(value)
        return values

    def _check_param_range(self, short, value, constraint):
        check_param_range("UHAGuide", self._param_name(short), short, value, constraint)

    def get_annealing_params(self, params) -> AnnealingParams:
        """The core's :class:`~numpyro_uha.core.AnnealingParams` for trained ``params``.

        ``params`` is the dict from ``svi.get_params(state)`` (or ``result.params``);
        frozen groups are read from ``params`` too, or take their initial values where
        ``params`` predates their registration.
        """
        self._require_setup()
        values = {}
        for short in FIXED:  # a fit's ceiling and force bound, whatever this guide's setup
            if self._param_name(short) in params:
                values[short] = jnp.asarray(params[self._param_name(short)])
        for short in self._param_specs():
            if short in values:
                continue
            name = self._param_name(short)
            if name in params:
                values[short] = jnp.asarray(params[name])
            elif not self._learnable(short):
                # params saved before frozen groups were registered: initial values
                values[short] = self._init_values[short]
            else:
                raise KeyError(
                    f"UHAGuide: params has no '{name}'. Pass the params returned by "
                    "svi.get_params(...) or svi.run(...).params for this guide."
                )
        return self._assemble(values)

    # --------------------------------------------------------------- guide
    def _get_posterior(self):
        raise NotImplementedError(_NO_CLOSED_FORM)

    def get_base_dist(self):
        """Not available: UHA's draws come from a Hamiltonian chain, not a transformed
        base distribution (so neither are ``get_posterior`` nor ``get_transform``)."""
        raise NotImplementedError(_NO_CLOSED_FORM)

    def _sample_latent(self, *args, **kwargs):
        return self._latent_and_model_params(*args, **kwargs)[0]

    def _latent_and_model_params(self, *args, _setup_call=False, **kwargs):
        kwargs.pop("sample_shape", None)
        values = self._register_params()
        latch = None
        if self.check_finite:
            latch = numpyro.param(
                self._latch_name, jnp.zeros((), self._init_values["loc"].dtype),
                constraint=self._latch_constraint,
            )
            check_latch(
                latch, self._divergence, "when the guide was called with its params",
                reset_if_clear=True,
            )
        model_params = {
            name: numpyro.param(
                name, site["value"], constraint=site["kwargs"].get("constraint", constraints.real),
                event_dim=site["kwargs"].get("event_dim"),
            )
            for name, site in self._model_param_sites.items()
        }
        rng_key = numpyro.prng_key()
        if rng_key is None:
            raise RuntimeError(
                "UHAGuide needs a random key: run it under numpyro.handlers.seed (SVI, "
                "Predictive and sample_posterior do this for you)."
            )
        # The guide's whole draw (gates, chain, weight) as one compiled program per
        # argument structure. Called concretely (svi.init, a direct call), its hundreds
        # of operations would each be compiled on their own; that program is compiled
        # at XLA's lowest CPU optimization (half the compile time, run once). Under an
        # outer jit (svi.update, Predictive) it is inlined.
        arrays, spec = _split_static((args, kwargs), self._hold_data)
        inputs = (rng_key, values, latch, model_params, arrays)
        concrete = not _is_tracer(inputs)
        if concrete and _setup_call:
            # The call that set the guide up (svi.init): NumPyro only reads its values to
            # trace the model and collect the parameters, so the K-step chain is not
            # compiled for it (every later call runs the chain; training compiles its
            # own inline). It emits NumPyro's initial point (where AutoNormal's setup
            # draw also sits), not a draw from the fitted q: NumPyro replays the model
            # there eagerly with its validation on, and a draw from q can be valid for
            # the model's arithmetic yet fail it (a GP kernel at a long fitted length
            # scale, not numerically positive definite in float32: svi.init raised).
            # Its factor is log q there.
            z = jnp.asarray(self._init_latent, values["loc"].dtype)
            factor = _q_log_density(z, values["loc"], values["scale"], host=True)
            start = z
        else:
            # A concrete call is not a training step: nothing to record on the host, so
            # its program holds no host callback and JAX's persistent cache can keep it.
            z, factor, start = self._program(
                self._draw_one_impl, spec, quick=concrete, record=not concrete
            )(*inputs)
        if self.check_finite and concrete and not bool(jnp.all(jnp.isfinite(z))):
            # A concrete call (svi.init, Predictive without jit): the model would reject
            # NaN values with an opaque validation error. Hand it the finite start of
            # the trajectory instead, with an infinite guide log density: the loss is
            # then +inf, the weight of a diverged draw (0).
            z = start
            factor = jnp.full_like(factor, jnp.inf)
        # Trace_ELBO adds log p(x, z_{K+1}) and the Jacobians from the model's trace; this
        # factor supplies the rest of the augmented proposal's density, so that the ELBO
        # Trace_ELBO estimates is exactly the UHA log weight.
        _guide_factor(f"_{self.prefix}_uha_factor", factor)
        return z, model_params

    def _draw_one_impl(self, rng_key, values, latch, model_params, arrays, *, spec, record=True):
        """One draw of the guide from its parameter ``values``: ``(z, factor, start)``,
        the chain's last position, the guide's log density beyond the model's (log q of
        the start minus the momentum-density ratios), and the chain's start. ``record``:
        record a divergence on the host (:func:`~numpyro_uha._divergence.finite_guard`;
        training steps and other traced calls), not in concrete calls."""
        learnable = {}
        if self.check_finite:
            # No NaN gradient reaches the parameters: a step whose gradient is not finite
            # is skipped.
            learnable = gate(
                {k: v for k, v in values.items() if self._learnable(k)}, jnp.asarray(False)
            )
            values = {**values, **learnable}
        annealing = self._assemble(values)
        z, log_weight, info = self._sample_impl(rng_key, annealing, model_params, arrays, spec=spec)
        factor = info.log_q_initial - jnp.sum(info.momentum_log_ratio)
        if self._completion:
            # Trace_ELBO's log p(x, z) (the model's trace) leaves the completed entries
            # out, the chain's log density counts them (_masked.py): the factor removes
            # them, so that the ELBO Trace_ELBO estimates stays the UHA log weight
            coords = self._completion_now(None, *_merge_static(arrays, spec), model_params)[0]
            factor = factor - completion_log_density(z, coords)
        if self.check_finite:
            # A diverged particle (weight 0 in the limit) is skipped: no gradient flows
            # back from it. The loss gradient of the latch is the fraction of diverged
            # particles (the factor enters the guide's log density), so the optimizer
            # moves it off 0 at the first divergence and never back (see _divergence.py).
            # Diverged: see _divergence.diverged.
            is_diverged = chain_diverged(log_weight, info)
            z, factor = gate((z, factor), is_diverged)
            factor = factor + latch * is_diverged.astype(factor.dtype)
            if record:  # the first diverging training step's parameters, on the host
                factor = factor + finite_guard(
                    self._divergence, jnp.where(is_diverged, jnp.nan, log_weight),
                    annealing.step_sizes[0],
                    {self._param_name(k): v for k, v in learnable.items()},
                )
        return z, factor, info.initial_position

    def __call__(self, *args, **kwargs):
        setup_call = self.prototype_trace is None
        try:
            if setup_call:
                self._setup_prototype(*args, **kwargs)
            else:
                args, kwargs = self._chain_arguments(args, kwargs)
            latent, model_params = self._latent_and_model_params(
                *args, _setup_call=setup_call, **kwargs
            )
        except (TypeError, ValueError) as error:  # JAX's own, where its AD meets the model
            note = self._differentiation_note(error, args, kwargs)
            if note is not None and note not in getattr(error, "__notes__", ()):
                error.add_note(note)
            raise
        _claim_prefix(self.prefix, latent)
        mask_off = numpyro.get_mask() is False
        arrays, spec = _split_static((args, kwargs), self._hold_data)
        if not setup_call:  # (the setup's own checks name non-finite data)
            self._raise_if_called_on_nonfinite_data(arrays, args, kwargs)
        inputs = (latent, model_params, arrays)
        if _is_tracer(inputs):
            emitted = self._emitted_impl(*inputs, spec=spec, mask_off=mask_off)
        else:  # svi.init, a direct call: one program, not an operation at a time
            emitted = self._program(self._emitted_impl, spec, quick=True, mask_off=mask_off)(
                *inputs
            )
        result = {}
        for name, (value, log_density) in emitted.items():
            event_ndim = self.prototype_trace[name]["fn"].event_dim
            original = self._model_site(name)
            result[original] = numpyro.sample(
                original, dist.Delta(value, log_density=log_density, event_dim=event_ndim)
            )
        if self._discrete and setup_call:  # also under a JAX transform (traced only)
            self._choose_discrete_draws(latent, model_params, arrays, spec, args, kwargs)
        if self._discrete and not self._draws_discrete:
            _enumerate.check_undrawn_context(self._discrete, self._scanned_discrete)
        if self._discrete:
            # the discrete sites from their exact conditional p(c | z, x) at the chain's
            # last position, log p(c | z, x) in the guide's density: every ELBO's term is
            # then the marginal's UHA log weight (_enumerate.py)
            inputs = (numpyro.prng_key(), latent, model_params, arrays)
            if _is_tracer(inputs):
                drawn, log_conditional = self._discrete_impl(*inputs, spec=spec)
            else:
                drawn, log_conditional = self._program(
                    self._discrete_impl, spec, quick=True
                )(*inputs)
            for name, value in drawn.items():
                result[name] = numpyro.sample(
                    name, dist.Delta(value, event_dim=self.prototype_trace[name]["fn"].event_dim)
                )
            _guide_factor(f"_{self.prefix}_discrete_factor", log_conditional)
        return result

    def _chain_arguments(self, args, kwargs):
        """The model arguments this call's chain runs on: the call's own, except in a
        call that asks for values only (``numpyro.get_mask() is False``: ``Predictive``'s
        draw from the guide) and withholds every site that was observed at setup (``y=None``
        to predict ``y``, at the training inputs or at new ones). The chain then targets
        the posterior of the setup's data (the arguments of ``svi.init``, as
        :meth:`sample_posterior` called without arguments does), and ``Predictive`` runs
        the model at the call's arguments with those latent values: posterior predictive
        draws, as with any AutoGuide. The call's latent sites must be the setup's, with
        the same shapes (a latent site sized by the data has no posterior at new data
        points: a clear error). Training (the mask is never off there), a call that
        observes some of the data, and a guide set up on traced arguments keep the
        call's own arguments (and the error that names the withheld sites)."""
        if numpyro.get_mask() is not False or self._setup_args is None:
            return args, kwargs
        arrays, spec = _split_static((args, kwargs), self._hold_data)
        try:
            key = (spec, tuple((jnp.shape(a), jnp.result_type(a)) for a in arrays))
            hash(key)
        except TypeError:  # an unhashable static leaf: decide without the cache
            key = None
        withheld = self._withheld_calls.get(key) if key is not None else None
        if withheld is None:
            withheld = self._withholds_data(args, kwargs)
            if key is not None:
                self._withheld_calls[key] = withheld
        return self._setup_args if withheld else (args, kwargs)

    def _withholds_data(self, args, kwargs) -> bool:
        """Whether the model at ``args``, ``kwargs`` observes none of the sites observed
        at setup while its latent sites are the setup's; raises where they are not the
        setup's shapes (see :meth:`_chain_arguments`)."""
        observed, factors = [], []  # the data; numpyro.factor's terms (observed sites)
        for name, site in self.prototype_trace.items():
            if site["type"] == "sample" and site["is_observed"]:
                (factors if _is_factor(site) else observed).append(name)
        if not observed and not factors:
            return False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                model_trace = self._trace_at_init(self.model, args, kwargs)
            except Exception:  # the call's own path raises the model's error
                return False
        if any(  # the call observes data (under any name: obs_mask dropped, say)
            site["type"] == "sample" and site["is_observed"] and not _is_factor(site)
            for site in model_trace.values()
        ):
            return False
        # every observed site is withheld; a factor the call keeps may be a prior's term,
        # one it leaves out was a likelihood's
        observed = observed + [name for name in factors if name not in model_trace]
        if not observed:
            return False
        latent = {
            name: site for name, site in model_trace.items()
            if site["type"] == "sample" and not site["is_observed"] and name not in observed
        }
        # obs_mask at setup: its entries left out were the latent "<y>_unobserved" beside
        # the observed "<y>_observed"; without the data "<y>" is all predicted
        imputed = {
            f"{name[:-len('_observed')]}_unobserved" for name in observed
            if name.endswith("_observed")
        }
        predicted = {name[:-len("_unobserved")] for name in imputed}
        setup = set(self._init_locs) | set(self._discrete)
        if set(latent) - predicted != setup - imputed:
            raise ValueError(
                "UHAGuide: called without the observed data "
                f"({[self._model_site(n) for n in observed]}), the guide draws from the "
                "posterior of the data it was set up with, but this call's latent sites "
                f"are not the setup's: {sorted(set(latent) - predicted - setup)} are "
                f"new, {sorted(setup - imputed - set(latent))} are gone. "
                + _PREDICT_FROM_DRAWS
            )
        latent = {name: site for name, site in latent.items() if name in setup}
        changed = [  # the discrete sites too: drawn per data point, e.g. a mixture's
            (self._model_site(name), tuple(jnp.shape(self.prototype_trace[name]["value"])),
             tuple(jnp.shape(site["value"])))
            for name, site in latent.items()
            if name in self.prototype_trace
            and jnp.shape(site["value"]) != jnp.shape(self.prototype_trace[name]["value"])
        ]
        if changed:
            raise ValueError(
                "UHAGuide: called without the observed data "
                f"({[self._model_site(n) for n in observed]}), the guide draws from the "
                "posterior of the data it was set up with, but at these arguments latent "
                "site(s) have other shapes: "
                + ", ".join(f"'{n}' {b} instead of {a}" for n, a, b in changed)
                + ". Latent values sized by the data (one per data point) have no "
                "posterior at new data points from this guide; predict at inputs that "
                "keep every latent site's shape. " + _PREDICT_FROM_DRAWS
            )
        return True

    def _choose_discrete_draws(self, latent, model_params, arrays, spec, args, kwargs):
        """At setup: whether the guide can draw its discrete sites from p(c | z, x)
        (:func:`~numpyro_uha._enumerate.sampler_problem`). Where it cannot (a hidden
        Markov chain: NumPyro's infer_discrete fails inside ``scan``, or needs the joint
        table of a ``markov`` chain), it draws them from their prior given z with
        log p(c | z, x) in its density (:func:`~numpyro_uha._enumerate.
        draw_discrete_from_prior`: every ELBO's term stays UHA's log weight), leaves
        them out of its posterior draws, and warns saying so."""
        self._draws_discrete = True
        inputs = (jax.random.PRNGKey(0), latent, model_params, arrays)
        problem = _enumerate.sampler_problem(
            partial(self._discrete_impl, spec=spec), inputs, self._discrete
        )
        self._draws_discrete = problem is None
        if problem is None:
            return
        values = self._constrained_latents(latent, model_params, args, kwargs)
        self._undrawn_dependents = _enumerate.dependent_deterministic(
            self._conditioned_model(model_params), self._plate_nesting, args, kwargs, values
        )
        warnings.warn(
            _enumerate.undrawn_message(self._discrete, problem[0], self._undrawn_dependents),
            UserWarning, stacklevel=3,
        )

    def _bounded_by_values(self) -> tuple:
        """The latent sites whose support may move with another site's value or with
        the data (:func:`~numpyro_uha._supports.bounded_by_values`): read from the model
        run at each draw, not from the prototype trace."""
        return _supports.bounded_by_values(self.prototype_trace, self._init_locs)

    def _constrained_latents(self, latent, model_params, args, kwargs) -> dict:
        """The guide model's latent sites (non-centered ones in x̃) at the flat
        unconstrained ``latent``, in their supports (as the model draws them: a support
        bounded by another site's value, see :meth:`_bounded_by_values`)."""
        unconstrained = self._unpack_latent(latent)
        if self._bounded_by_values():
            trace = self._model_trace_at(unconstrained, model_params, args, kwargs)
            return {name: trace[name]["value"] for name in unconstrained}
        return {
            name: biject_to(self.prototype_trace[name]["fn"].support)(value)
            for name, value in unconstrained.items()
        }

    def _discrete_impl(self, rng_key, latent, model_params, arrays, *, spec):
        """The discrete sites drawn from p(c | z, x) at the flat unconstrained
        ``latent`` z, and log p(c | z, x) (:func:`~numpyro_uha._enumerate.draw_discrete`);
        from their prior p(c | z) where the guide cannot draw them from p(c | z, x)
        (:meth:`_choose_discrete_draws`)."""
        args, kwargs = _merge_static(arrays, spec)
        draw = (_enumerate.draw_discrete if self._draws_discrete
                else _enumerate.draw_discrete_from_prior)
        return draw(
            rng_key, self._conditioned_model(model_params), self._plate_nesting,
            self._discrete, args, kwargs,
            self._constrained_latents(latent, model_params, args, kwargs),
        )

    def _emitted_impl(self, latent, model_params, arrays, *, spec, mask_off):
        """The guide's sites from the chain's last position ``latent``: for each latent
        site, its value in the model's space and the Delta's log density (the inverse
        Jacobian), as AutoContinuous emits them. Non-centered sites (see ``decenter``):
        the chain runs in x̃, the guide emits the model's own x = loc + scale · x̃ (read
        from the model run at the draw) with the Jacobian -Σ log scale in its log
        density."""
        unconstrained = self._unpack_latent(latent)
        model_trace = None
        args, kwargs = _merge_static(arrays, spec)
        bounded = self._bounded_by_values()
        if self.decentered_sites or bounded:
            model_trace = self._model_trace_at(unconstrained, model_params, args, kwargs)
        completed = self._completion_now(None, args, kwargs, model_params)[1]
        emitted = {}
        for name, unconstrained_value in unconstrained.items():
            original = self._model_site(name)
            if original != name:
                value = model_trace[original]["value"]
                log_density = _decenter.emitted_log_density(model_trace[name], mask_off)
            else:
                # the support as the model draws it where it may move (_bounded_by_values)
                site = (model_trace if name in bounded else self.prototype_trace)[name]
                transform = biject_to(site["fn"].support)
                value = transform(unconstrained_value)
                log_density = 0.0
                if not mask_off:
                    log_density = -transform.log_abs_det_jacobian(unconstrained_value, value)
                    log_density = sum_rightmost(
                        log_density, jnp.ndim(log_density) - jnp.ndim(value) + site["fn"].event_dim
                    )
            if name in completed:
                # the chain's density counts these entries in z, not x (_masked.py)
                log_density = jnp.where(completed[name], 0.0, log_density)
            emitted[name] = (value, log_density)
        return emitted

    def _check_params(self, params):
        """Warn on divergences in training (the latch); raise on NaN/inf parameter values
        (if concrete)."""
        if _is_tracer(params):
            return
        # what the params say, kept for the same params (a repeated draw call reads
        # nothing back: on a GPU each read is a copy and a wait)
        seen = self._checked_params.get(params)
        if seen is None:
            if self._init_values is not None:
                for short in self._init_values:
                    name = self._param_name(short)
                    if name in params:
                        self._check_param_shape(short, jnp.shape(params[name]))
            # NumPy, not jnp: under an outer jit even a concrete value's jnp result is
            # traced. One device_get: the copies to the host overlap (one wait, not one
            # per param).
            host = jax.device_get(params)
            if self._init_values is not None:
                for short, constraint in self._param_specs().items():
                    if self._param_name(short) in host:
                        self._check_param_range(
                            short, host[self._param_name(short)], constraint
                        )
            # a parameter may be a pytree (random_flax_module's "<name>$params" is the
            # network's parameter dict)
            bad = sorted(
                name for name, value in host.items()
                if not all(np.all(np.isfinite(np.asarray(leaf))) for leaf in jax.tree.leaves(value))
            )
            seen = (bad, host.get(self._latch_name))
            self._checked_params.put(params, seen)
        bad, latch = seen
        if latch is not None:  # every call with these params warns, as before
            check_latch(latch, self._divergence, "in the params given")
        if bad:
            raise FloatingPointError(
                f"UHAGuide: parameter(s) {bad} contain NaN or inf; the training run diverged. "
                "Retrain with a smaller learning rate or max_step_size."
            )

    def _check_param_shape(self, short, given):
        """A clear error where one of this guide's parameters has another shape than its
        own: a fit of another model, another guide or another K (read at trace time, so
        also inside ``jit``, at no cost to the compiled step)."""
        own = jnp.shape(self._init_values[short])
        if tuple(given) == tuple(own):
            return
        name = self._param_name(short)
        if short == "beta_logits":
            raise ValueError(
                f"UHAGuide: params['{name}'] has shape {tuple(given)}, this guide's has "
                f"{own}: they are a fit with K = {given[-1] - 1 if given else '?'} "
                f"transitions, this guide has K = {self.K}. Use a guide with that K, or "
                f"carry the fit over with the guide that made it: new_guide, new_params = "
                f"old_guide.extrapolate(params, {self.K})."
            )
        raise ValueError(
            f"UHAGuide: params['{name}'] has shape {tuple(given)}, this guide's has {own} "
            f"(its model has {self.latent_dim} unconstrained latent coordinates): these "
            "params (or this SVI state) are another guide's or another model's. Pass this "
            "guide's fitted params (svi.get_params(state)), or set up a new fit for the "
            "changed model."
        )

    @property
    def last_finite_params(self):
        """The parameters before the first diverging training step (``None`` if none)."""
        return self._divergence.params

    def __getstate__(self):
        state = super().__getstate__()
        # compiled functions do not pickle; they are rebuilt on first use
        state["_jitted_draws"] = {}
        state["_jitted_setup"] = {}
        state["_withheld_calls"] = {}
        state["_checked_params"] = _LastSeen()
        state["_checked_data"] = _LastSeen()
        state["_auto_batch_size"] = None  # sized again for the device it is loaded on
        state["_start_data"] = None  # derived again from the setup arguments
        if isinstance(self.warm_start_device, jax.Device):  # devices do not pickle
            state["warm_start_device"] = self.warm_start_device.platform
        return state

    def __setstate__(self, state):
        # A guide pickled before ``decenter`` existed was fitted in the model's own
        # coordinates: it stays there.
        state.setdefault("requested_decenter", False)
        state.setdefault("decentered_sites", ())
        state.setdefault("_user_model", state.get("model"))
        state.setdefault("_user_init_loc_fn", state.get("init_loc_fn"))
        state.setdefault("coordinate_elbos", None)
        state.setdefault("warm_start_device", None)
        state.setdefault("progress_bar", True)
        state.setdefault("_checked_params", _LastSeen())
        state.setdefault("_checked_data", _LastSeen())
        state.setdefault("_withheld_calls", {})
        state.setdefault("_hold_data", False)
        state.setdefault("_discrete", ())
        state.setdefault("_plate_nesting", 0)
        state.setdefault("_draws_discrete", True)
        state.setdefault("_undrawn_dependents", ())
        state.setdefault("_scanned_discrete", ())
        self.__dict__.update(state)

    # ------------------------------------------------------------- sampling
    def _require_setup(self):
        if self.prototype_trace is None:
            raise RuntimeError(
                "UHAGuide has not been initialized: run svi.init(...)/svi.run(...) or call "
                "the guide once with the model's arguments first."
            )

    def _draw_impl(
        self, keys, params, arrays, batch_size, spec, corrected, with_info, with_samples=True,
        sharding=None, split=False, num_valid=None, threshold=None, offset=None, check=False,
        summary_to_host=False,
    ):
        """``(samples, log_weights, latent, info, finite)`` of the draws with ``keys``;
        ``finite`` flags the draws whose log weight and latent are finite. With
        ``split``: ``keys`` is one raw key, and the draws' keys are keys ``offset``,
        ..., ``offset + batch_size - 1`` of its split (:func:`_keys_from`: a traced
        ``offset``, so every chunk of any number of draws runs in this one program), and
        the first ``num_valid`` draws' weight summary (:func:`~numpyro_uha._weights.
        summary_values`, ``threshold`` its ``num_below``'s; where ``check``, a traced
        flag, the draws' mean and spread checks too) is a sixth output, made in the same
        program (the rest are padding, dropped by the caller); with ``summary_to_host``,
        written to the host's memory by the program itself (``jax.memory.Space.Host``:
        see :data:`SUMMARY_IN_HOST_MEMORY`)."""
        if split:
            keys = _keys_from(keys, 0 if offset is None else offset, batch_size)
        keys = shard_leading(keys, sharding)
        args, kwargs = _merge_static(arrays, spec)
        annealing = self.get_annealing_params(params)
        model_params = self._model_params_in(params)
        logdensity_fn = self._make_logdensity(args, kwargs, model_params)
        model = self._conditioned_model(model_params)

        def one(key):
            z, log_weight, info = annealed_sample(
                key, logdensity_fn, annealing,
                num_leapfrog_steps=self.num_leapfrog_steps, corrected=corrected,
                integrator=self.integrator,
            )
            samples = None
            if with_samples:
                drawn, at_draw = {}, model
                if self._discrete and self._draws_discrete:
                    # (z, c) jointly: c from p(c | z, x), the weight z's (_enumerate.py)
                    drawn = _enumerate.draw_discrete(
                        jax.random.fold_in(key, 1), model, self._plate_nesting,
                        self._discrete, args, kwargs,
                        self._constrained_latents(z, model_params, args, kwargs),
                    )[0]
                    at_draw = handlers.substitute(model, data=drawn)
                with handlers.block():
                    # seeded per draw: a deterministic site built from numpyro.prng_key()
                    # (noise added to a latent) varies from draw to draw and with the key
                    samples = constrain_fn(
                        handlers.seed(at_draw, jax.random.fold_in(key, 2)), args, kwargs,
                        self._unpack_latent(z), return_deterministic=True,
                    )
                # the model's own sites only (x, not the guide's coordinates x̃)
                samples = {
                    k: v for k, v in samples.items()
                    if self._model_site(k) == k and k not in self._undrawn_dependents
                }
                samples.update(drawn)
            return samples, log_weight, z, (info if with_info else None)

        # Equal batches in one scan: lax.map's remainder batch would run beside the scan,
        # which can deadlock XLA:CPU's batched LAPACK kernels (see batched_map).
        samples, log_weights, z, info = shard_leading(batched_map(one, keys, batch_size), sharding)
        # a latent site's value too: z finite but too far out for the site's transform
        # (exp(z) = inf; an improper posterior's q widens without end) is a failed draw
        values = [
            samples[k] for k, site in self.prototype_trace.items()
            if samples is not None and k in samples
            and site["type"] == "sample" and not site["is_observed"]
        ]
        finite = _finite_draws(log_weights, z, values)
        if not split:
            return samples, log_weights, z, info, finite
        summary = summary_values(
            log_weights, finite, threshold, summary_largest(batch_size), num_valid=num_valid,
            latent=z, check=check,
        )
        if summary_to_host:
            summary = jax.device_put(summary, jax.memory.Space.Host)
        return samples, log_weights, z, info, finite, summary

    def _draws(
        self, rng_key, params, args, kwargs, sample_shape, corrected=False, with_info=True,
        nonfinite="drop", with_samples=True, batch_size=None, warn_as=None,
    ):
        if not isinstance(nonfinite, str) or nonfinite not in NONFINITE_MODES:
            raise ValueError(
                f"nonfinite must be one of {list(NONFINITE_MODES)}, got {nonfinite!r}."
            )
        if batch_size is not None:
            _check_int("batch_size", batch_size, 1)
        self._require_setup()
        self._check_params(params)
        if not args and not kwargs and self._setup_args is not None:
            args, kwargs = self._setup_args  # as median/quantiles: the first call's data
        sample_shape = _sample_shape(sample_shape, "UHAGuide")
        num_draws = int(math.prod(sample_shape))
        if num_draws == 0:
            # no draws (a zero in sample_shape): empty arrays of the draws' shapes, from
            # one draw's
            one = self._draws(
                rng_key, params, args, kwargs, (1,), corrected, with_info, "keep",
                with_samples, batch_size,
            )
            return WeightedDraws(*jax.tree.map(
                lambda x: jnp.reshape(x[:0], sample_shape + jnp.shape(x)[1:]), tuple(one[:4])
            ))
        arrays, spec = _split_static((args, kwargs), self._hold_data)
        if spec not in self._jitted_draws:
            self._jitted_draws[spec] = jax.jit(
                self._draw_impl,
                static_argnames=(
                    "batch_size", "spec", "corrected", "with_info", "with_samples", "sharding",
                    "split", "summary_to_host",
                ),
            )
        sharding = self.sharding
        shards = num_shards(sharding)
        concrete = _chunkable(rng_key, num_draws, params, arrays)
        if sharding is not None and concrete:
            # parameters and data replicated on the mesh (data already on it stay as
            # they are); keys placed below, chunk by chunk
            params, arrays = _on_mesh(sharding, (params, arrays))
        draw = partial(
            self._jitted_draws[spec], params=params, arrays=arrays, spec=spec,
            corrected=corrected, with_info=with_info, with_samples=with_samples,
            sharding=sharding,
        )
        summary_arrays = start = padded = None
        if nonfinite != "keep" and not _is_tracer((rng_key, params, arrays)):
            # q's ELBO at the start, where the draws can be compared with it: the weight
            # summary counts the draws more than 1 nat (_below_start) below it
            start = self._start_elbo_for((args, kwargs))
        threshold = -math.inf if start is None else float(start[0]) - _below_start(start[0])
        # the public methods (``warn_as``, their name) also judge the weights and the
        # draws; the evaluation layer, which calls _draws too, does that itself
        judge = warn_as is not None and num_draws >= KHAT_MIN_DRAWS
        if concrete:
            # Concrete: the draws run in chunks of a fixed width, one compiled program
            # per width, so a new sample_shape reuses it (widths 2^k or 3 · 2^(k-1) from
            # DRAW_CHUNK_MIN up to sample_batch_size, whole shards where sharded, or a
            # wider one already compiled; the last chunk is padded with extra keys,
            # computed and dropped; ``batch_size``, where given, caps the width instead
            # of sample_batch_size). Keys, chunks and results stay on the device: what
            # is compiled per sample_shape beyond the chain is a slice of the joined
            # chunks (the join, and the weight summary over it with the padding masked
            # out, once per chunk count; sharded, also a key split).
            cap = batch_size or self.sample_batch_size
            width = min(cap, _chunk_bucket(num_draws))
            width = -(-width // shards) * shards  # whole shards
            fused = sharding is None and _fold_in_splits(rng_key)
            to_host = fused and _summary_in_host_memory()
            # a width this program already ran at, up to REUSE_WIDTH_RATIO times wider,
            # rather than a new compilation of the chain (e.g. 100 draws after 1000)
            width = reuse_width(
                self._jitted_draws[spec],
                (corrected, with_info, with_samples, sharding, fused, to_host,
                 signature_of((params, arrays))),
                width, max(cap, width),
            )
            num_chunks = -(-num_draws // width)
            if fused:
                # every chunk in one program: its keys from the raw key and the chunk's
                # offset (the same keys as _draw_keys'), the first chunk's weight summary
                # made beside its draws (one dispatch; used where it is the only one)
                key = jnp.asarray(rng_key)
                outs = [
                    draw(key, batch_size=width, split=True, offset=np.uint32(i * width),
                         num_valid=np.int32(num_draws), threshold=threshold,
                         check=np.bool_(judge and num_chunks == 1), summary_to_host=to_host)
                    for i in range(num_chunks)
                ]
                chunks = [tuple(out[:5]) for out in outs]
                if num_chunks == 1:
                    summary_arrays = outs[0][5]
            else:
                keys = _draw_keys(rng_key, num_draws, num_chunks * width)

                def place(i):
                    chunk = keys if num_chunks == 1 else _key_chunk(keys, i * width, width)
                    return chunk if sharding is None else put_global(np.asarray(chunk), sharding)

                chunks = [draw(place(i), batch_size=width) for i in range(num_chunks)]
            # (traced chunks: concrete inputs all closed over by the user's jax.jit; they
            # are joined in the traced program)
            if not _is_tracer(chunks) and not all(
                x.is_fully_addressable for x in jax.tree.leaves(chunks)
            ):
                # across processes: every process gets all the draws
                out = jax.tree.map(
                    lambda *xs: jnp.asarray(np.concatenate([gather(x) for x in xs])[:num_draws]),
                    *chunks,
                )
            elif num_chunks == 1 and width == num_draws:
                out = chunks[0]
            else:
                # the padding kept for the weight summary (one program per padded size,
                # not per num_draws)
                padded = chunks[0] if num_chunks == 1 else _join(chunks)
                out = _first(padded, num_draws)
        else:
            # Traced (under an outer jit or vmap): one program, batched in one scan.
            keys = jax.random.split(rng_key, num_draws)
            if num_draws % shards:
                draw = partial(draw, sharding=None)  # an uneven split: not sharded
            out = draw(keys, batch_size=batch_size or self.sample_batch_size)
        samples, log_weights, latent, info, finite = out
        draws = WeightedDraws(samples, log_weights, latent, info)
        # Traced values (an outer jit or vmap): nothing can be counted or dropped, the
        # draws are returned as they are ("keep").
        if nonfinite != "keep" and not _is_tracer((log_weights, latent)):
            # The checks read a few numbers of the log weights and of the draws (their
            # weighted and plain moments), summarized on the device (one program, one
            # small copy), not the weights and draws themselves.
            if summary_arrays is not None:  # made with the draws (one chunk)
                summary = summary_from_values(
                    summary_arrays, num_draws, summary_largest(num_draws, judge),
                    self.latent_dim,
                )
            elif padded is not None:  # joined from chunks: over the padded join
                summary = weight_summary(
                    padded[1], padded[4], threshold=threshold, khat=judge, latent=padded[2],
                    check=judge, num_valid=num_draws,
                )
            else:
                summary = weight_summary(
                    log_weights, finite, threshold=threshold, khat=judge, latent=latent,
                    check=judge,
                )
            bad = num_draws - summary.num_finite
            if start is not None:
                self._warn_if_worse(summary, start, stacklevel=3, log_weights=log_weights)
            if judge and summary.num_finite >= 2:
                khat = summary_khat(summary, num_draws, exact=False)
                spread = float(summary.high - summary.mean)
                _warn_poor_fit(
                    khat, math.sqrt(summary.var / summary.num_finite), summary.num_finite,
                    num_draws, f"UHAGuide.{warn_as}", stacklevel=4, also=POOR_WEIGHTS_MEANING,
                    spread=spread, advice=self._poor_fit_advice,
                )
                # else the weights cannot say by how much (nor with too few for k̂: inf)
                if not (khat_counts(khat, summary.num_finite, num_draws, spread)
                        or khat == math.inf):
                    self._warn_if_draws_biased(summary, warn_as)
            if bad:
                finite = np.asarray(finite)
                self._raise_if_data_nonfinite(bad, num_draws, args, kwargs)
                draws = self._handle_nonfinite(draws, finite, bad, sample_shape, nonfinite)
                if draws.num_dropped:
                    return draws
        if len(sample_shape) == 1:  # already (num_draws, ...): no reshape to dispatch
            return WeightedDraws(*draws[:4])
        return WeightedDraws(*jax.tree.map(
            lambda x: jnp.reshape(x, sample_shape + jnp.shape(x)[1:]), tuple(draws[:4])
        ))

    def _differentiation_note(self, error, args, kwargs):
        """The note for JAX's error where differentiating the model inside the guide
        failed (``None`` for any other error)."""
        text = str(error)
        if "forward-mode" in text and "custom_vjp" in text:
            return FORWARD_MODE_NOTE
        if "callbacks do not support JVP" in text:
            return SECOND_DERIVATIVE_NOTE
        if "Reverse-mode differentiation does not work for lax.while_loop" in text:
            return WHILE_LOOP_NOTE  # JAX's own words (at the setup, e.g.)
        if isinstance(error, TypeError) and self.prototype_trace is not None and (
            self._model_runs_while_loop(args, kwargs)  # JAX's internal error, in training
        ):
            return WHILE_LOOP_NOTE
        return None

    def _model_runs_while_loop(self, args, kwargs) -> bool:
        """Whether the model's log density (at the setup's point) runs a
        ``lax.while_loop``; ``False`` where that cannot be told."""
        try:
            with jax.ensure_compile_time_eval():
                logdensity = self._make_logdensity(args, kwargs, {
                    name: site["value"] for name, site in self._model_param_sites.items()
                })
                jaxpr = jax.make_jaxpr(logdensity)(jnp.zeros(self.latent_dim))
        except Exception:  # noqa: BLE001 - only for a note on an error already raised
            return False
        return "while[" in str(jaxpr)

    def _raise_if_called_on_nonfinite_data(self, arrays, args, kwargs):
        """A clear error where the guide is called (``Predictive``, ``svi.update``,
        ``svi.run``'s step as it is traced) on data whose observed values are NaN or inf,
        not masked out: the chains then give NaN draws (``Predictive`` returned them
        silently) or a model error about a NaN ``loc``. Checked on concrete arguments
        only (a jitted step's traced data are checked where its loss is), on the host,
        with ``check_finite``; the model is traced only where some array is not finite."""
        if not self.check_finite or not _nonfinite_concrete_float(arrays):
            return
        with jax.ensure_compile_time_eval():  # eagerly, also inside Predictive's lax.map
            data = self._nonfinite_data_sites(args, kwargs)
        if data:
            raise ValueError(
                f"UHAGuide: the data are not finite: {_name_nonfinite_data(data)}. "
                f"{NONFINITE_DATA_ADVICE}"
            )

    def _raise_if_data_nonfinite(self, bad, num_draws, args, kwargs):
        """A clear error where ``bad`` of the draws' log weights are not finite because
        the data (observed values, not masked out) are not (here, and in the evaluation
        layer, whose draws keep them: ``nonfinite="keep"`` checks nothing, for speed)."""
        data = self._nonfinite_data_sites(args, kwargs)
        if data:
            raise ValueError(
                f"UHAGuide: {bad} of {num_draws} draws have a non-finite log weight "
                f"because the data are not finite: {_name_nonfinite_data(data)}. "
                f"{NONFINITE_DATA_ADVICE}"
            )

    def _warn_if_draws_biased(self, summary, warn_as):
        """Warn (:class:`~numpyro_uha.UHADrawsOffWarning`) where the importance weights move a
        latent coordinate's mean by more than ``SHIFT_BAD`` of its sd and by more than
        ``SHIFT_SE_BAD`` standard errors, and where they widen or narrow its sd by more
        than a factor ``1 + SPREAD_BAD`` and ``SHIFT_SE_BAD`` standard errors
        (:func:`~numpyro_uha._weights.flag_checks` of the ``summary``'s ``checks``):
        the draws themselves are off there, although k̂ (< 0.7: checked only then, where
        the weighted estimates can be trusted) says the weighted estimates are fine.
        Skipped where the log weights are too even to move any mean or sd that far."""
        if summary.num_finite < KHAT_MIN_DRAWS:
            return
        # log weights within asinh(SHIFT_BAD) nats of each other bound every shift by
        # SHIFT_BAD (the normalized weights n w̃ then lie in [1/R, R], R − 1/R ≤ 2 SHIFT_BAD)
        # and every sd ratio within [R^-½, R^½] = [0.88, 1.13], inside 1 + SPREAD_BAD
        if summary.high - summary.low <= math.asinh(SHIFT_BAD):
            return
        (shift, se, bad), (log_ratio, ratio_se, misspread) = flag_checks(summary.checks)
        if bad.size == 0 and misspread.size == 0:
            return
        owner, where = {}, {}
        for name, positions in self._latent_positions().items():
            for at, i in np.ndenumerate(positions):
                owner[int(i)] = self._model_site(name)
                where[int(i)] = f"{owner[int(i)]!r}" + (
                    f" at {at[0] if len(at) == 1 else at}" if at else ""
                )

        def worst_first(flagged, size):
            order = flagged[np.argsort(-np.abs(size[flagged]))]
            sites = list(dict.fromkeys(owner.get(int(i), "?") for i in order))
            return sites, int(order[0])

        def shown(sites):
            return f"{sites[:6]}{' …' if len(sites) > 6 else ''}"

        corrected_by = (
            "Moments from the weights (numpyro_uha.evaluation.weighted_moments on "
            "sample_posterior_with_log_weights' draws) or importance-resampled draws "
            "(importance_resample; to_inference_data resamples by default) correct for it "
            "while Pareto k̂ < 0.7"
        )
        if bad.size:
            sites, worst = worst_first(bad, shift)
            warnings.warn(
                UHADrawsOffWarning(
                    f"UHAGuide.{warn_as}: the importance weights move the mean of site(s) "
                    f"{shown(sites)} by more than {SHIFT_BAD:g} of "
                    f"its sd (most: {where.get(worst, '?')}, by {shift[worst]:+.2f} ± "
                    f"{se[worst]:.2f} sds, in the unconstrained coordinates), beyond the "
                    f"weights' noise: the draws are biased there. {corrected_by}; training "
                    "longer or a larger K brings the draws themselves closer.",
                    check="biased", sites=sites,
                ),
                stacklevel=4,
            )
        for narrow in (True, False):  # one warning per direction: a site can have both
            flagged = misspread[(log_ratio[misspread] > 0) == narrow]
            if not flagged.size:
                continue
            sites, worst = worst_first(flagged, log_ratio)
            ratio = math.exp(log_ratio[worst])
            low, high = math.exp(log_ratio[worst] - ratio_se[worst]), math.exp(
                log_ratio[worst] + ratio_se[worst]
            )
            message = (
                f"UHAGuide.{warn_as}: the importance weights {'widen' if narrow else 'narrow'}"
                f" the spread of site(s) {shown(sites)} by more than a factor "
                f"{1 + SPREAD_BAD:g} (most: {where.get(worst, '?')}: the weighted sd is "
                f"{ratio:.2f} ({low:.2f} to {high:.2f}, ± one standard error) times the "
                "draws' own, in the unconstrained coordinates), beyond the weights' noise: the "
                f"draws are too {'narrow' if narrow else 'wide'} there, and their intervals "
                f"{'too short' if narrow else 'too long'}. {corrected_by}; training longer, "
                "a larger K, or base_dist='cholesky' where the posterior is correlated "
                "brings the draws themselves closer."
            )
            warnings.warn(
                UHADrawsOffWarning(
                    message, check="too_narrow" if narrow else "too_wide", sites=sites
                ),
                stacklevel=4,
            )

    def warn_if_worse_than_start(self, log_weights, *, model_args=None, stacklevel=2) -> bool:
        """Warn (:class:`~numpyro_uha.UHAWorseThanStartWarning`, a kind of
        :class:`~numpyro_uha.UHAFitWarning`) when UHA's bound is worse than q's.

        UHA starts from a Gaussian q (the warm start, or ``init_from``) and training
        should only improve on q's ELBO: with ε → 0 the UHA bound *is* q's ELBO. Draws
        whose mean log weight (the UHA ELBO) lies below q's ELBO by more than
        ``max(1 nat, 4 standard errors)`` (both estimates' errors combined), or of which
        significantly more than half (a sign test at 4 standard errors, robust to a few
        huge negative log weights, which make the mean's error useless exactly when
        training broke down) lie more than 1 nat below q's ELBO, mean that
        training made the approximation worse: at a learning rate too high for the
        annealing parameters they can drift until the dynamics break down, and the draws
        are then far from the posterior, often with no divergence reported. Checked by
        ``sample_posterior``, ``sample_posterior_with_log_weights`` and the evaluation
        layer on concrete draws (at least ``START_ELBO_MIN_DRAWS`` = 100 finite ones).
        Returns whether it warned.

        ``model_args`` are the model arguments the draws used, as ``(args, kwargs)``: q's
        ELBO was measured on the data the guide was set up with, so draws on other data
        (another ``X``, ``y``) are not compared with it (no warning). Without them the
        draws are taken to be on the setup data.
        """
        if _is_tracer(log_weights):
            return False
        start = self._start_elbo_for(model_args)
        if start is None:
            return False
        log_w = np.asarray(log_weights, np.float64).ravel()
        log_w = log_w[np.isfinite(log_w)]
        if log_w.size < 2:
            return False
        summary = WeightSummary(
            log_w.size, float(log_w.mean()), float(log_w.var(ddof=1)), float(np.median(log_w)),
            int(np.sum(log_w < start[0] - _below_start(start[0]))),
            float(log_w.min()), float(log_w.max()),
            np.zeros(0),
        )
        return self._warn_if_worse(summary, start, stacklevel=stacklevel)

    def _start_elbo_for(self, model_args):
        """q's ELBO at the start, ``(elbo, se)``, if the draws on ``model_args`` (``(args,
        kwargs)``; ``None``: the setup data) can be compared with it: measured (the warm
        start or ``init_from``) on the same data. Else ``None``."""
        if self._start_elbo is None:
            return None
        if model_args is not None:
            arrays, spec = _split_static(tuple(model_args))
            setup = self._setup_fingerprint()
            # remembered for the last arguments seen (the same JAX arrays), while the
            # setup data and the static arguments are the same too
            seen = self._checked_data.get(arrays)
            if seen is not None and seen[0] is setup and seen[1] == spec:
                same = seen[2]
            else:
                same = _same_data(_data_fingerprint(arrays, spec), setup)
                self._checked_data.put(arrays, (setup, spec, same))
            if not same:
                return None
        return self._start_elbo

    def _warn_if_worse(self, summary, start_elbo, stacklevel, log_weights=None):
        """:meth:`warn_if_worse_than_start`'s test and warning from the finite log
        weights' :class:`~numpyro_uha._weights.WeightSummary` (``num_below``: below
        q's ELBO - 1 nat). The median is for the message only: where the summary has
        none, it is taken from ``log_weights`` (their finite ones) when the test fails."""
        num = summary.num_finite
        if num < START_ELBO_MIN_DRAWS:
            return False
        start, start_se = start_elbo
        elbo, se = summary.mean, math.sqrt(summary.var / num)
        # A sign test too: a few enormous negative log weights make the mean's standard
        # error useless exactly when training has broken down. If the median log weight
        # were at least start - 1 nat, at most half the draws would fall below that.
        below = summary.num_below / num
        worse = []
        margin = _below_start(start)
        if start - elbo > max(margin, 4.0 * math.hypot(se, start_se)):
            worse.append(
                f"the UHA ELBO (mean log weight) is {elbo:.4g} ± {se:.2g}, "
                f"{start - elbo:.3g} nats below q's"
            )
        if below > 0.5 + 4.0 * math.sqrt(0.25 / num):
            median = summary.median
            if math.isnan(median) and log_weights is not None:
                host = np.asarray(log_weights, np.float64).ravel()
                median = float(np.median(host[np.isfinite(host)]))
            worse.append(
                f"{below:.0%} of the log weights lie more than {margin:.3g} "
                f"nat{'s' if margin != 1.0 else ''} below q's ELBO (median "
                f"{median:.4g}, {start - median:.3g} nats below)"
            )
        if not worse:
            return False
        warnings.warn(
            "UHAGuide: training made the approximation worse than the Gaussian q it "
            f"started from: over {num} draws at these params, {'; '.join(worse)}; "
            f"q's ELBO is {start:.4g} ± {start_se:.2g}. The draws may be far from the "
            "posterior. This happens when the learning rate is too high for the annealing "
            "parameters (they drift until the dynamics break down): train with a smaller "
            "learning rate, several times below this fit's (e.g. optax.adam(1e-3) where "
            "1e-2 was used, 1e-4 where 1e-3 was). If UHA is below q already "
            "before training and a smaller rate does not help, its leapfrog steps are "
            "too large for this posterior (a strongly correlated one with a diagonal "
            "mass, whose momentum's scales are per coordinate: base_dist='cholesky' "
            "with dense_mass=True moves the chain in q's whitened coordinates): pass "
            "init_step_size at half (or less) of the first step it uses now, "
            "guide.get_annealing_params(params).step_sizes[0].",
            UHAWorseThanStartWarning,
            stacklevel=stacklevel + 1,
        )
        return True

    def _setup_fingerprint(self):
        """:func:`_data_fingerprint` of the arguments the guide was set up with (the data
        q's ELBO was measured on); ``None`` where they were traced."""
        if self._start_data is None and self._setup_args is not None:
            self._start_data = _data_fingerprint(*_split_static(self._setup_args))
        return self._start_data

    def _handle_nonfinite(self, draws, finite, bad, sample_shape, nonfinite):
        """``draws`` (flat) without its ``bad`` diverged draws, or the error to raise."""
        num_draws = finite.size
        what = (
            f"{bad} of {num_draws} draws have a non-finite log weight or latent "
            "(their Hamiltonian trajectories diverged)"
        )
        advice = (
            "Train with a smaller learning rate or max_step_size (the learned step sizes "
            "are too large for some regions the draws reach)."
        )
        cause = None
        if getattr(self, "_nan_at_prior", None) is None and (
            nonfinite == "raise" or bad > MAX_NONFINITE_FRACTION * num_draws
        ) and getattr(self, "_setup_args", None) is not None:
            # about to raise: is the model's log density NaN where its prior reaches?
            model_params = {n: site["value"] for n, site in self._model_param_sites.items()}
            self._nan_at_prior = self._nan_sites_at_prior(*self._setup_args, model_params)
        if getattr(self, "_nan_at_prior", None) is not None:
            cause = self._nan_at_prior.sentence
            advice = cause
        elif getattr(self, "_ruled_out", None) is not None:
            # the setup's UHASupportWarning: no step size fixes that
            sites = self._ruled_out.sites
            cause = (
                "The setup found points near q, inside every latent site's support, where "
                f"the model's log density is -inf ({'site(s) ' + str(sites) if sites else 'a site'} "
                "ruling them out: UHASupportWarning), so the posterior's support is "
                "narrower than the latent sites declare, and chains that reach those points "
                "diverge whatever the step size. Declare the bound in the model, so that "
                "every unconstrained value is possible."
            )
            advice = cause
        if nonfinite == "raise":
            raise self._divergence.error(what, cause)
        if bad > MAX_NONFINITE_FRACTION * num_draws:
            raise self._divergence.error(
                f"{what}: more than {MAX_NONFINITE_FRACTION * 100:g} %, so the approximation "
                "is unusable and the draws are not dropped", cause,
            )
        if len(sample_shape) != 1:
            raise ValueError(
                f"UHAGuide: {what}. nonfinite='drop' removes them, which only works for a "
                f"one-dimensional sample_shape, got {sample_shape}: draw with "
                f"sample_shape=({num_draws},) and reshape what is left, or pass "
                "nonfinite='keep' to get every draw (diverged ones included)."
            )
        warnings.warn(
            f"UHAGuide: {what}; dropped them, so {num_draws - bad} draws are returned instead of "
            f"{num_draws} (WeightedDraws.num_dropped records the count). {advice} "
            "Pass nonfinite='keep' to keep them or nonfinite='raise' to make this an error.",
            UHANonfiniteDrawsWarning,
            stacklevel=4,
        )
        index = jnp.asarray(np.flatnonzero(finite))
        kept = jax.tree.map(lambda x: jnp.take(x, index, axis=0), tuple(draws[:4]))
        return WeightedDraws(*kept, num_dropped=bad)

    def sample_posterior(
        self, rng_key, params, *args, sample_shape=(), nonfinite="drop", **kwargs
    ):
        """Draw from the UHA approximation (the law of z_{K+1}).

        Draws are computed vectorized, in chunks of at most ``sample_batch_size``, so
        large ``sample_shape`` fit in memory. The chunk width is 2^k or 3 · 2^(k-1) (64,
        96, 128, 192, ... up to ``sample_batch_size``), and the chain is compiled once per
        width, every chunk in the same program (its keys derived from the raw key and the
        chunk's offset): a new ``sample_shape`` runs at the narrowest width already
        compiled that holds it, up to 16 times wider than it needs (draws that need
        several chunks: a width of at least half ``sample_batch_size``), so it rarely
        compiles the chain again. Draw ``i`` is the same for every
        ``sample_shape`` with more than ``i`` draws (same key). Returns a dict of constrained latent and
        deterministic site values with leading shape ``sample_shape``.

        UHA's chain targets the posterior, so it needs the model's data: ``*args`` and
        ``**kwargs`` are the model's arguments, as in training. Called without any (as
        ``AutoNormal``'s ``sample_posterior`` often is), the arguments of the guide's
        first call (its setup, e.g. ``svi.init``) are used.

        ``nonfinite`` says what happens to draws whose trajectory diverged (a NaN or
        infinite log weight, or a non-finite latent):

        - ``"drop"`` (default): they are removed, with a
          :class:`~numpyro_uha.UHANonfiniteDrawsWarning` giving the count, so the
          leading size is smaller than requested. Only for a one-dimensional
          ``sample_shape`` (``()`` raises if its one draw diverged; a longer shape
          raises ``ValueError``). More than 10 % of diverged draws raise
          ``FloatingPointError``: the approximation is unusable.
        - ``"raise"``: any diverged draw raises ``FloatingPointError``.
        - ``"keep"``: every draw is returned as it is.

        Under ``jax.jit`` or ``jax.vmap`` the values are traced, so nothing can be
        counted or removed: every mode behaves like ``"keep"``.

        Concrete draws are checked by their UHA log weights, with a
        :class:`~numpyro_uha.UHAFitWarning` when training made the fit worse than its
        start (:class:`~numpyro_uha.UHAWorseThanStartWarning`,
        :meth:`warn_if_worse_than_start`) and, from ``KHAT_MIN_DRAWS`` = 200 draws, when
        the weights are heavy-tailed (Pareto k̂ ≥ 0.7) or the ELBO's standard error
        exceeds 1 nat: the draws may then be off, so check them against NUTS. Below
        k̂ 0.7, where the weights move a coordinate's mean or widen or narrow its sd
        beyond their noise, :class:`~numpyro_uha.UHADrawsOffWarning` says the draws are
        biased (too narrow, too wide) there.
        """
        check_model_keywords(self._user_model, kwargs, self.sample_posterior)
        return self._draws(
            rng_key, params, args, kwargs, sample_shape, with_info=False, nonfinite=nonfinite,
            warn_as="sample_posterior",
        ).samples

    def sample_posterior_with_log_weights(
        self, rng_key, params, *args, sample_shape=(), nonfinite="drop", **kwargs
    ) -> WeightedDraws:
        """Draws together with their UHA log importance weights (see :class:`WeightedDraws`).

        The weights make self-normalized importance sampling, log Z estimates and PSIS
        diagnostics possible. ``nonfinite`` is as in :meth:`sample_posterior`; the
        number of dropped draws is ``num_dropped`` of the result. For a log Z estimate
        from the weights use ``nonfinite="keep"``:
        :func:`~numpyro_uha.evaluation.log_z_from_weights` counts a diverged draw as a
        zero weight, whereas dropping it would leave it out of the mean.
        """
        check_model_keywords(self._user_model, kwargs, self.sample_posterior_with_log_weights)
        return self._draws(
            rng_key, params, args, kwargs, sample_shape, nonfinite=nonfinite,
            warn_as="sample_posterior_with_log_weights",
        )

    @property
    def initial_q(self):
        """``(loc, scale)`` of q before SVI: the plain-VI warm start (or ``init_from``).

        This is the paper's starting point for every method, e.g. for
        :func:`~numpyro_uha.evaluation.hais_grid_search`.
        """
        self._require_setup()
        return self._init_values["loc"], self._init_values["scale"]

    # --------------------------------------------------- evaluation helpers
    def extrapolate(self, params, K: int):
        """Carry parameters tuned at this guide's K over to ``K`` transitions (Appendix D).

        Returns ``(guide, params)``: a copy of this guide with ``K`` transitions and the
        matching params, ready for :meth:`sample_posterior` and log Z estimates (or as
        ``init_params`` to continue training). The schedule is the piecewise-linear
        interpolation of the tuned β (:func:`~numpyro_uha.core.interpolate_betas`), so it
        stays strictly increasing from 0 to 1. Every step size is multiplied by
        log(K_old + 1) / log(K + 1), the paper's rule written in its count of bridging
        densities (K + 1 for K transitions); ``max_step_size`` is scaled by the same factor
        so that the whole ε(β) curve scales exactly (``step_size_slope`` is kept). All
        other parameters are unchanged: with δ and Σ kept, every per-coordinate step
        ε(β) δ_i (drift and kick alike) scales by the same factor. Meant for ``K`` at
        least the trained K (a smaller K warns: the larger steps can destabilize the
        dynamics).
        """
        import copy

        from numpyro_uha.core import interpolate_betas, logits_from_betas

        self._require_setup()
        _check_int("K", K, 1)
        if K < self.K:
            warnings.warn(
                f"UHAGuide.extrapolate: going down from K={self.K} to K={K} scales the step "
                "sizes up by log(K_old + 1) / log(K + 1) and can make the dynamics unstable "
                "(much worse bounds); Appendix D's rule is meant for a larger K. Train at the "
                "smaller K instead.",
                RuntimeWarning,
                stacklevel=2,
            )
        factor = math.log(self.K + 1) / math.log(K + 1)
        old = self.get_annealing_params(params)
        new_logits = logits_from_betas(interpolate_betas(old.betas, K))
        new = copy.copy(self)
        new.K = K
        new.max_step_size = self.max_step_size * factor
        new.init_step_size = self.init_step_size * factor
        new._jitted_draws = {}
        new._init_values = dict(self._init_values)
        new._init_values["beta_logits"] = new_logits
        new._init_values["step_size"] = self._init_values["step_size"] * factor
        new_params = dict(params)
        logits_name = self._param_name("beta_logits")
        if logits_name in new_params:
            new_params[logits_name] = new_logits
        step_name = self._param_name("step_size")
        if step_name in new_params:
            new_params[step_name] = jnp.asarray(params[step_name]) * factor
        ceiling_name = self._param_name("stability_ceiling")
        if "stability_ceiling" in new._init_values:
            new._init_values["stability_ceiling"] = self._init_values["stability_ceiling"] * factor
        if ceiling_name in new_params:
            new_params[ceiling_name] = jnp.asarray(params[ceiling_name]) * factor
        return new, new_params

    def latent_from_samples(self, samples, *args, params=None, **kwargs):
        """Flat unconstrained latents (``(..., latent_dim)``) for constrained site values.

        ``samples`` maps every latent site to values with a common leading batch shape,
        e.g. ``mcmc.get_samples()``; other keys (deterministic sites) are ignored. This
        is the inverse of what :meth:`sample_posterior` returns, in this guide's layout.
        """
        self._require_setup()
        if not isinstance(samples, Mapping):
            raise TypeError(
                "samples must be a dict {site name: draws} (e.g. mcmc.get_samples()), got "
                f"{type(samples).__name__}."
            )
        # the model's own latent sites (x for a site the guide runs non-centered as x̃)
        own = {name: self._model_site(name) for name in self._init_locs}
        missing = [name for name in own.values() if name not in samples]
        if missing:
            raise ValueError(
                f"samples lack the latent site(s) {missing}; expected every latent site of "
                f"the model: {list(own.values())}."
            )
        # Constrained shapes (a Dirichlet's simplex has one more entry than its
        # unconstrained coordinates), from the model's trace at setup.
        shapes = {
            own[name]: jnp.shape(self.prototype_trace[name]["value"]) for name in self._init_locs
        }
        first = next(iter(own.values()))
        batch_shape = jnp.shape(samples[first])[: jnp.ndim(samples[first]) - len(shapes[first])]
        for name, shape in shapes.items():
            expected = tuple(batch_shape) + shape
            if jnp.shape(samples[name]) != expected:
                raise ValueError(
                    f"samples['{name}'] has shape {jnp.shape(samples[name])}, expected "
                    f"{expected} (batch shape {tuple(batch_shape)} + the site's shape)."
                )
        model_params = self._model_params_in(params or {})
        model = self._conditioned_model(model_params)
        own_model = (
            handlers.substitute(self._user_model, data=model_params)
            if model_params else self._user_model
        )

        def one(values):
            if self.decentered_sites:
                values = _decenter.decentered_values(
                    own_model, args, kwargs, values, self.decentered_sites
                )
            with handlers.block():
                # seeded: discrete latent sites, not among the values, are drawn (the
                # continuous sites' supports and transforms do not depend on them)
                unconstrained = unconstrain_fn(
                    handlers.seed(model, 0), args, kwargs, values
                )
            return jnp.concatenate([jnp.reshape(unconstrained[name], -1) for name in self._init_locs])

        flat = {name: jnp.reshape(jnp.asarray(samples[name]), (-1,) + shape)
                for name, shape in shapes.items()}
        latent = jax.vmap(one)(flat)
        return jnp.reshape(latent, tuple(batch_shape) + (self.latent_dim,))

    def _default_args(self, args, kwargs):
        if args or kwargs:
            return args, kwargs
        if self._setup_args is None:
            raise ValueError(
                "UHAGuide: pass the model's arguments (the guide was first called with "
                "traced arguments, so they were not recorded)."
            )
        return self._setup_args

    def median(self, params, *args, num_samples=1000, rng_key=None, **kwargs):
        """Monte Carlo median of every latent and deterministic site from ``num_samples`` draws.

        UHA's marginals have no closed form, so this is the sample median of draws from
        :meth:`sample_posterior` (seeded with ``rng_key``, default ``PRNGKey(0)``),
        elementwise and unweighted: the median of the UHA approximation. As with
        :class:`~numpyro.infer.autoguide.AutoNormal`, deterministic sites are included;
        here each is the median of the site's own draws (AutoNormal evaluates it at the
        latent medians, which agrees for a monotone function of one latent). With no
        model arguments given, the arguments of the guide's first call are used.
        """
        check_model_keywords(self._user_model, kwargs, self.median)
        return {
            name: _draws_quantile(value, 0.5)
            for name, value in self._mc_draws(params, args, kwargs, num_samples, rng_key).items()
        }

    def quantiles(self, params, quantiles, *args, num_samples=1000, rng_key=None, **kwargs):
        """Monte Carlo quantiles of every latent and deterministic site from ``num_samples`` draws.

        Returns, per site, an array with a leading dimension of ``len(quantiles)``. See
        :meth:`median` for how the draws and arguments are chosen and how deterministic
        sites are treated.
        """
        check_model_keywords(self._user_model, kwargs, self.quantiles)
        q = jnp.asarray(quantiles)
        return {
            name: _draws_quantile(value, q)
            for name, value in self._mc_draws(params, args, kwargs, num_samples, rng_key).items()
        }

    def _mc_draws(self, params, args, kwargs, num_samples, rng_key):
        _check_int("num_samples", num_samples, 1)
        self._require_setup()
        args, kwargs = self._default_args(args, kwargs)
        rng_key = jax.random.PRNGKey(0) if rng_key is None else rng_key
        samples = self.sample_posterior(rng_key, params, *args, sample_shape=(num_samples,), **kwargs)
        # Every latent and deterministic site (all that sample_posterior returns), as
        # AutoNormal's median and quantiles do.
        return dict(samples)


def _draws_quantile(value, q):
    """The ``q`` quantile(s) of draws along their first axis: interpolated for real
    values, and for integer and boolean ones (deterministic sites: a count, an index, a
    flag) the draw at or below it, in the draws' own dtype."""
    if jnp.issubdtype(value.dtype, jnp.inexact):
        return jnp.quantile(value, q, axis=0)
    at = jnp.quantile(value.astype(jnp.int32) if value.dtype == jnp.bool_ else value, q,
                      axis=0, method="lower")
    return at.astype(value.dtype)


class _UnscaledJacobians(Messenger):
    """Leaves the log |det J| of the latent sites ``names`` unscaled in NumPyro's
    ``potential_energy``.

    ``potential_energy`` adds each constrained site's log |det J| as a factor
    ``_<name>_log_det`` under the site's own handlers, so a ``handlers.scale`` around a
    latent site scales its Jacobian too (HMC's convention in NumPyro). Trace_ELBO with any
    AutoGuide does not: the guide's density of the site carries the full Jacobian, so
    each term is scale · log p(x) + log |det J| − log q. UHA's target takes the ELBO's
    convention, or its terms would not be the chain's log weights (for
    ``scale(0.5)`` on ``s ~ HalfNormal(1)``: p(s)^0.5, where NumPyro's NUTS samples
    p(s)^0.5 s^-0.5).

    The log |det J| of a site with masked-out entries counts by the entries ``completed``
    says (see ``UHAGuide._make_logdensity``), whichever mask the model used: NumPyro masks
    the factor under a ``handlers.mask`` around the site but not for a mask on the
    distribution (``.mask(False)``). ``completed``: ``{site: bool entries}``, the
    Jacobian left out at those entries and kept at every other; ``None`` (the setup's
    flatness probe): left out wherever the site's own mask leaves the entry out.

    A non-centered site x = loc + scale · x̃ under a scale c (``decenter``) is the same
    case: the model scores c · log p(x) = c · (log p(x̃) − Σ log scale) and the guide's
    density of x carries the whole Jacobian Σ log scale, where the chain's model scores
    c · log p(x̃): the missing (1 − c) · Σ log scale is added as an unscaled factor."""

    def __init__(self, fn, names, completed=None, without=()):
        self._factors = {f"_{name}_log_det" for name in names}
        self._completed = completed
        self._without = set(without)
        self._keep = {}
        super().__init__(fn)

    def process_message(self, msg):
        # after the model's own scale handlers (inside the model, so above this one on
        # the stack, they process each message first)
        if msg["type"] != "sample":
            return
        if msg["name"] in self._factors:
            msg["scale"] = None
        if msg["name"] in self._keep:
            # The Jacobian of a site with masked-out entries. NumPyro masks it with a
            # handlers.mask around the site but not with a mask on the distribution
            # (``.mask(False)``): both alike here, by the entries it counts at.
            fn = msg["fn"]
            while isinstance(fn, dist.MaskedDistribution):
                fn = fn.base_dist
            keep = self._keep.pop(msg["name"])
            msg["fn"] = fn if keep is None else fn.mask(keep)
        elif not msg["is_observed"] and msg["name"] in self._without:
            self._keep[f"_{msg['name']}_log_det"] = False
        elif not msg["is_observed"] and has_mask(msg["fn"]):
            factor = f"_{msg['name']}_log_det"
            if self._completed is None:  # the probe: where the site counts
                self._keep[factor] = _batch_mask(msg["fn"])
            elif msg["name"] in self._completed:  # everywhere but the completed entries
                self._keep[factor] = ~self._completed[msg["name"]]
            else:  # everywhere
                self._keep[factor] = None

    def postprocess_message(self, msg):
        scale = msg.get("scale")
        if msg["type"] != "sample" or scale is None or _decenter.LOG_SCALE not in msg["infer"]:
            return
        name = f"_{msg['name']}_scaled_jacobian"
        self._factors.add(name)  # its own scale cleared above; the masks apply to it
        log_scale = sum_rightmost(msg["infer"][_decenter.LOG_SCALE], msg["fn"].event_dim)
        numpyro.factor(name, (1.0 - scale) * log_scale)


class _RuledOut(NamedTuple):
    """What the setup's probe found where the log density is −inf near q: ``count`` of
    its ``total`` points, whether q's mean is one, and the sites that rule them out."""

    count: int
    total: int
    at_mean: bool
    sites: list


#: q's sds at which :func:`_probe_near_q` looks (the mean, and draws this far out)
FLAT_CHECK_WIDTH = 2.0
#: points of the probe for masked-out latent entries to complete (UHAGuide._masked_flat_entries)
MASK_PROBE_ROWS = 16


def _site_log_probs(trace, enumerated=True):
    """``(name, log probability)`` of each sample site of a model ``trace`` (host arrays,
    masked-out entries 0; NumPyro's out-of-support warnings silenced), for the setup's
    diagnoses; without ``enumerated``, sites marked for enumeration are left out."""
    for name, site in trace.items():
        if site["type"] != "sample" or (
            not enumerated and site.get("infer", {}).get("enumerate")
        ):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            log_prob = np.asarray(site["fn"].log_prob(site["value"]))
        if site.get("mask") is not None:
            log_prob = np.where(np.asarray(site["mask"]), log_prob, 0.0)
        yield name, log_prob


#: draws from the prior at which a diverged warm start looks for NaN log probabilities
NAN_PRIOR_DRAWS = 16


class _NanAtPrior(NamedTuple):
    """The model's log probability is NaN at ``count`` of ``total`` prior draws, at the
    ``sites`` (most often first): :meth:`UHAGuide._nan_sites_at_prior`."""

    count: int
    total: int
    sites: list

    @property
    def sentence(self) -> str:
        return (
            f"The model's log density is NaN at {self.count} of {self.total} draws from its "
            f"prior, from site(s) {self.sites}: a NaN in the model's own arithmetic "
            "(0 * log(0), log of a negative number, inf - inf; e.g. y * log(p) + (1 - y) "
            "* log(1 - p) where p rounds to 1, or a rate exp(...) that overflows), "
            "which a chain that reaches it cannot leave, whatever its step size. Where "
            "the posterior lies there, write the expression in log space "
            "(dist.Bernoulli(logits=...), jax.nn.log_sigmoid, "
            "jax.scipy.special.xlogy, log1p) or declare the support it needs; where only "
            "a vague prior reaches it, standardized covariates or a tighter prior keep "
            "the chains away, and so may a smaller learning rate or max_step_size."
        )


def _probe_near_q(oracle, loc, scale, rows):
    """The log density near q: at q's mean and ``rows`` − 1 draws from q at
    ``FLAT_CHECK_WIDTH`` times its marginal sds (one call of the setup's model program,
    the points built on the host so that nothing new is compiled). Returns
    ``(flat, ruled_out)``:

    - ``flat``: the coordinates along which the log density is constant, its gradient
      exactly zero there at every point where it is finite (a bool mask); ``None`` with
      fewer than 4 such points (a ``sample_batch_size`` under 4 bounds the scoring
      program's width; at q's mean alone, a gradient could vanish by chance).
    - ``ruled_out``: the points (rows, unconstrained) where it is −inf, q's mean first
      if it is one of them, and whether it is; ``None`` where there are none.

    Both ``None`` where q is not finite."""
    loc, scale = np.asarray(loc), np.asarray(scale)
    if rows < 4 or not (np.all(np.isfinite(loc)) and np.all(np.isfinite(scale))):
        return None, None
    s = np.sqrt(np.sum(scale**2, axis=-1)) if scale.ndim == 2 else np.broadcast_to(scale, loc.shape)
    noise = np.random.default_rng(0).standard_normal((rows - 1, loc.shape[-1]))
    points = np.concatenate([loc[None], loc + FLAT_CHECK_WIDTH * s * noise]).astype(loc.dtype)
    values, grads = oracle.value_and_grad(points)
    values, grads = np.asarray(values), np.asarray(grads)
    finite = np.isfinite(values)
    # where the density is -inf its gradient is often exactly zero too: not flatness
    flat = np.all(grads[finite] == 0, axis=0) if finite.sum() >= 4 else None
    minus_inf = values == -np.inf
    ruled_out = (points[minus_inf], bool(minus_inf[0])) if minus_inf.any() else None
    return flat, ruled_out


def _whitening(scale):
    """A full-rank q's whitening factor: its Cholesky factor, or diag(marginal sds) where
    that is not a valid factor (a diagonal entry not positive and finite); traceable."""
    diag = jnp.diagonal(scale)
    valid = jnp.all(jnp.isfinite(scale)) & jnp.all(diag > 0)
    return jnp.where(valid, jnp.tril(scale), jnp.diag(_marginal_std(scale)))


#: The factor a full-rank q's parameters are standardized by (_precondition.py): the
#: start's :func:`_whitening`.
_whitening_factor = small_jit()(_whitening)


@small_jit()
def _inverse_smallest_correlation(scale):
    """1 / λ_min(C) for a full-rank q's correlation matrix C (``dense_mass="auto"``'s
    measure of how correlated its start is; inf where λ_min is not positive and finite)."""
    whitening = _whitening(scale)
    corr = whitening / _marginal_std(scale)[:, None]  # C = (S⁻¹ L)(S⁻¹ L)ᵀ
    smallest = jnp.linalg.eigvalsh(corr @ corr.T)[0]
    inverse = jnp.where(smallest > 0, 1.0 / smallest, jnp.inf)
    return jnp.where(jnp.isfinite(smallest), inverse, jnp.nan)


def _marginal_std(scale):
    """q's marginal standard deviations from a scale vector or a Cholesky factor."""
    return jnp.sqrt(jnp.sum(scale**2, axis=-1)) if jnp.ndim(scale) == 2 else scale


def _curvature(oracle, loc, scale, dense):
    """λ behind the step ceiling (see :func:`_start_arrays`): the largest of
    λ_max(Sᵀ H S) over q's mean and ``CURVATURE_DRAWS`` draws from q widened
    ``CURVATURE_WIDTH`` times (the curvature in q's tails can be several times that at
    its mean: hierarchical scales, heavy tails, noise scales) and
    λ_max(Sᵀ Σ_q⁻¹ S) (q's part of the bridge: 1 where S is q's own factor), in the
    coordinates the chain moves in: S = diag(s), s = q's marginal sds, for a diagonal q;
    S = P, q's whitening factor, where its chain has the dense mass (``dense``); by Lanczos
    iterations (:func:`~numpyro_uha.core.warm_start.max_curvature`),
    all points' Hessian-vector products in one ``oracle`` call per iteration;
    traceable."""
    _, host = resolve_oracle(None, oracle, loc, scale)
    points, s = _curvature_points(loc, scale, dense, host=host)
    return _curvature_max(max_curvature(None, points, s, oracle=oracle), scale, dense, host=host)


@small_jit()
def _q_log_density(z, loc, scale):
    """log q(z) under q = N(loc, scale) (the setup call's factor)."""
    return gaussian_logpdf(z, loc, scale)


@small_jit(static_argnums=(2,))
def _curvature_points(loc, scale, dense):
    """q's mean and widened draws from q, and the chain's units there (q's marginal sds,
    or a full-rank q's mass factor): along the mass factor's columns, so that a dense
    mass's points follow q's correlations (a diagonal one's, as before, do not)."""
    noise = jax.random.normal(jax.random.PRNGKey(0), (CURVATURE_DRAWS, loc.shape[-1]), loc.dtype)
    if dense:
        factor = _whitening(scale)
        return jnp.concatenate([loc[None], loc + CURVATURE_WIDTH * noise @ factor.T]), factor
    s = _marginal_std(scale)
    return jnp.concatenate([loc[None], loc + CURVATURE_WIDTH * noise * s]), s


@small_jit(static_argnums=(2,))
def _curvature_max(lams, scale, dense):
    lam = jnp.max(jnp.where(jnp.isfinite(lams), lams, 0.0))
    if dense:
        # q's part in u = P⁻¹ z: the precision (P⁻¹ L)⁻ᵀ (P⁻¹ L)⁻¹, λ_max = ‖L⁻¹ P‖²
        within = jax.scipy.linalg.solve_triangular(jnp.tril(scale), _whitening(scale), lower=True)
        return jnp.maximum(lam, jnp.linalg.eigvalsh(within.T @ within)[-1])
    if scale.ndim == 2:
        s = _marginal_std(scale)
        prec = jnp.linalg.inv(scale @ scale.T)
        return jnp.maximum(lam, jnp.linalg.eigvalsh(s[:, None] * prec * s[None, :])[-1])
    return jnp.maximum(lam, 1.0)


@small_jit()
def _all_finite(tree):
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)]))


def _step_ceiling(values):
    """The largest step size ε the stability ceiling c allows with the current δ and Σ:
    every per-coordinate step ε δ_i / Σ_i^(1/2) at most c · s_i (see :func:`_start_arrays`;
    for a full-rank q in the coordinates u its chain moves in, where s = 1)."""
    s, c = values["stability_scale"], values["stability_ceiling"]
    return c / jnp.max(values["drift_scale"] / (values["momentum_scale"] * s))


@small_jit(static_argnums=(3, 6))
def _start_arrays(loc, scale, lam, num_betas, init_step_size, max_step_size, dense):
    """The start's derived arrays, in one small program (run eagerly, these few dozen
    operations would each be compiled on their own): the parameters' initial values
    that do not depend on the constructor's options, and the dynamics' fixed bounds:
    ``stability_scale`` s, q's marginal sds; ``stability_ceiling`` c: every
    per-coordinate step ε(β_m) δ_i / Σ_i^(1/2) is kept at most c · s_i (by
    :func:`~numpyro_uha.core.step_sizes_under_ceiling`); ``force_limit``; and
    ``ceiled_step_size``, the first ε under that ceiling (``init_step_size``, or the
    ceiling where that is lower).

    The leapfrog is stable on a quadratic target only while ε · sqrt(λ_max) < 2 for the
    Hessian in the step's units; at a point, in units of s, λ (``lam``) is found by
    Lanczos iterations on Hessian-vector products (:func:`_curvature`). The ceiling is
    ``STABILITY_FRACTION`` · 2 / sqrt(λ): learning rates that random-walk ε, δ and Σ for
    thousands of steps cannot push the dynamics over that cliff. Not finite (no
    ceiling) where λ is not (``nan`` where the setup runs inside a JAX transform).

    With ``dense`` (a full-rank q, ``UHAGuide._dense_for``) the chain moves in u = P⁻¹ z,
    P = ``mass_factor``, q's Cholesky factor (a dense mass matrix). Every array above is
    then u's: q's sds there are 1 (s = 1, Σ^(1/2) = 1), λ is that of Pᵀ H P, and the
    force bound that of u's force. On a posterior correlated near ±1 the steps of a
    diagonal mass are bounded by its narrowest direction (a diamonds-like regression: its
    ceiling on ε was 1.4·10⁻⁴ in q's marginal sds; with the dense mass it is 1.0); in the
    whitened u every direction is about as wide.
    """
    if dense:
        factor = _whitening(scale)
        within = jax.scipy.linalg.solve_triangular(factor, jnp.tril(scale), lower=True)
        s = jnp.ones_like(loc)
    else:
        s, within = _marginal_std(scale), scale
    zeros = jnp.zeros_like(loc)
    ceiling = jnp.where(
        jnp.isfinite(lam) & (lam > 0), 2.0 * STABILITY_FRACTION / jnp.sqrt(lam), jnp.inf
    )
    init_step_size = jnp.asarray(init_step_size, loc.dtype)
    extra = {"mass_factor": factor} if dense else {}
    return {
        "step_size_slope": jnp.zeros((), loc.dtype),
        "momentum_scale": 1.0 / s,
        "beta_logits": jnp.zeros(num_betas, loc.dtype),
        "bridge_loc_slope": zeros,
        "drift_scale": jnp.ones_like(loc),
        "bridge_log_scale_slope": zeros,
        "stability_scale": s,
        "stability_ceiling": ceiling,
        # the first step size under a ceiling (δ = 1, Σ^(1/2) = 1 / s: ε's own ceiling is
        # c): at most c, the same first step as the clip gave, but stored there rather
        # than above it (step_sizes_under_ceiling's gradient then moves it at once)
        "ceiled_step_size": jnp.where(
            ceiling < max_step_size, jnp.minimum(init_step_size, ceiling), init_step_size
        ),
        # kicks bounded at FORCE_LIMIT_SDS sds of the force under q; see
        # AnnealingParams.force_limit and _force_sds
        "force_limit": FORCE_LIMIT_SDS * _force_sds(within),
        **extra,
    }


def _force_sds(scale):
    """The sds of the force ∇ log q(z) at draws from q: sqrt(diag Σ⁻¹), Σ q's covariance
    (1 / s for a diagonal q; for a full-rank one the column norms of L⁻¹, 1 / the
    conditional sds). Where q's coordinates are correlated almost to ±1 these are far
    larger than 1 / the marginal sds (10⁴ times on a diamonds-like regression): a force
    limit at FORCE_LIMIT_SDS / s clipped every typical kick there, and UHA's bound at
    its first step was 357 nats below q's own ELBO (a 4-dimensional Gaussian with
    correlations 0.9999: 9 nats below)."""
    if jnp.ndim(scale) == 1:
        return 1.0 / scale
    eye = jnp.eye(scale.shape[-1], dtype=scale.dtype)
    inverse = jax.scipy.linalg.solve_triangular(jnp.tril(scale), eye, lower=True)
    return jnp.sqrt(jnp.sum(inverse**2, axis=-2))


_split_keys = jax.jit(jax.random.split, static_argnums=1)


def _hashable(obj) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True


def _elbo_or_minus_inf(start_elbo) -> float:
    """A start ELBO ``(mean, se)`` as a number to compare; −inf where there is none."""
    if start_elbo is None or not np.isfinite(start_elbo[0]):
        return -np.inf
    return float(start_elbo[0])


def _jit_once(cache: dict, impl, spec, *, quick=False, **static):
    """``impl`` with ``spec`` and ``static`` bound, jitted once per argument structure
    (``spec``) and options and kept in ``cache``; not jitted where ``spec`` cannot be
    hashed (only a pytree node whose own data cannot: :func:`_split_static` holds an
    unhashable leaf by identity).
    ``quick``: compiled with :func:`~numpyro_uha.core.warm_start.quick_compiler_options`."""
    fn = partial(impl, spec=spec, **static)
    key = (impl.__name__, spec, quick, tuple(sorted(static.items())))
    if not _hashable(key):
        return fn
    if key not in cache:
        cache[key] = jax.jit(fn, compiler_options=quick_compiler_options() if quick else None)
    return cache[key]


def _default_init_step_size(init_step_size, max_step_size, default):
    """``init_step_size`` as given (a real number), or where ``None`` ``default``, or
    half of ``max_step_size`` where that is smaller (a small ``max_step_size`` alone,
    as the divergence errors advise, is enough)."""
    if init_step_size is not None:
        return _real("init_step_size", init_step_size)
    return min(default, max_step_size / 2) if max_step_size > 0 else default


def _check_step_sizes(init_step_size, max_step_size):
    """A clear error unless 0 < init_step_size < max_step_size."""
    if not max_step_size > 0:
        raise ValueError(f"max_step_size must be a positive number, got {max_step_size!r}.")
    if not 0 < init_step_size < max_step_size:
        raise ValueError(
            "init_step_size must satisfy 0 < init_step_size < max_step_size "
            f"(= {max_step_size}), got {init_step_size!r}."
        )


def _check_decenter(decenter, init_from):
    """``decenter`` as given: "auto", False, or a tuple of site names."""
    if decenter is None or decenter is False:
        return False
    if isinstance(decenter, str):
        if decenter != "auto":
            raise ValueError(
                f"decenter must be 'auto', False or a list of site names, got {decenter!r}."
            )
        return False if init_from is not None else "auto"
    if decenter is True or not isinstance(decenter, (list, tuple, set, frozenset, np.ndarray)):
        raise ValueError(
            "decenter must be 'auto' (non-center each centered hierarchical site where "
            "that fits better), False, or a list of site names, got "
            f"{decenter!r} (UHALocalGuide's decenter=True has no counterpart here: "
            "'auto' finds the sites)."
        )
    names = tuple(decenter)
    if not all(isinstance(n, str) for n in names):
        raise ValueError(f"decenter: site names must be strings, got {names!r}.")
    if names and init_from is not None:
        raise ValueError(
            "decenter and init_from cannot be combined: init_from's q was fitted in the "
            "model's own coordinates; pass decenter=False (or no init_from)."
        )
    return names or False


def _check_frozen(frozen) -> tuple:
    """``frozen`` as a tuple of group names (one name alone is accepted), or a clear error
    naming the unknown groups."""
    if isinstance(frozen, str):
        frozen = (frozen,)
    unknown = sorted(set(frozen) - set(GROUPS))
    if unknown:
        raise ValueError(
            f"Unknown parameter group(s) in frozen: {unknown}. "
            f"Valid groups are {sorted(GROUPS)}."
        )
    return tuple(frozen)


def _claim_prefix(prefix: str, latent) -> None:
    """Record the flat latent as the deterministic site ``_{prefix}_latent``, the name
    NumPyro's ``AutoContinuous`` guides give their own latent: two guides of one
    ``AutoGuideList`` with the same prefix share their parameters (``auto_loc``,
    ``auto_scale``, …) without a word, and the site's duplicate name makes NumPyro's
    trace refuse them instead, whichever guide runs first."""
    name = f"_{prefix}_latent"
    try:
        numpyro.deterministic(name, latent)
    except AssertionError as err:
        if "unique names" not in str(err):
            raise
        raise ValueError(
            f"UHAGuide(prefix={prefix!r}): another guide in this trace uses the same "
            f"prefix (its site {name!r}), so the two would share the parameters named "
            f"'{prefix}_loc', '{prefix}_scale', …. Give each guide of an AutoGuideList "
            f"its own prefix, e.g. UHAGuide(model, prefix='uha')."
        ) from err


def check_param_range(owner, name, short, value, constraint):
    """A clear error where a concrete value of a guide's parameter ``name`` (one set by
    hand: ``init_params``, a ``substitute`` handler, edited params) lies outside its
    ``constraint``'s bounds, where SVI's unconstrained value has no image: a negative
    step size or scale, a damping above 1 (the divergences it causes would otherwise be
    put down to the learning rate). The bounds themselves pass, and so do values within
    a relative 1e-5 of them (a trained value can round onto or past one); traced values
    and other constraints are not checked."""
    if _is_tracer(value):
        return
    if isinstance(constraint, constraints.interval):
        low, high = constraint.lower_bound, constraint.upper_bound
    elif isinstance(constraint, constraints.greater_than):  # (softplus_)positive too
        low, high = constraint.lower_bound, math.inf
    else:
        return
    host = np.asarray(jax.device_get(value), np.float64)
    # a bound's float32 rounding (0.3 is 0.30000001) and a rescaled fit's (extrapolate
    # multiplies a step at its cap by a float64 factor) lie within the slack
    slack = 1e-5 * np.abs(np.asarray([low, high], np.float64))
    outside = np.isfinite(host) & ((host < low - slack[0]) | (host > high + slack[1]))
    if outside.any():
        raise ValueError(
            f"{owner}: params['{name}'] has a value {host[outside].ravel()[0]:g} outside "
            f"[{float(low):g}, {float(high):g}] ({short} must lie there; SVI optimizes it "
            "unconstrained, where such a value has no image). Parameters set by hand "
            "(init_params, numpyro.handlers.substitute, edited params) must lie within "
            "their constraints."
        )


def _svi_run_progress_bar():
    """``progress_bar`` of the ``numpyro.infer.SVI.run`` call this setup runs under (it
    calls ``svi.init``), so that ``svi.run(..., progress_bar=False)`` silences the warm
    start's bar as it does its own; ``None`` outside ``SVI.run`` (``svi.init``, ``jit``)."""
    from numpyro.infer import SVI

    code = getattr(SVI.run, "__code__", None)
    frame = sys._getframe(1)
    try:
        while frame is not None:
            if frame.f_code is code:
                value = frame.f_locals.get("progress_bar")
                return bool(value) if isinstance(value, (bool, np.bool_)) else None
            frame = frame.f_back
        return None
    finally:
        del frame


@contextlib.contextmanager
def _warm_start_bar(enabled: bool, total: int):
    """A progress bar over the warm start's VI steps, on stderr as NumPyro's ``svi.run``
    draws its own, cleared when the warm start ends; yields the warm start's
    ``callback`` (``None`` when not ``enabled``). The bar appears only for a long VI:
    once its steps have run :data:`PROGRESS_DELAY` seconds and all of them would take
    more than :data:`PROGRESS_MIN_TOTAL` (on most models the VI is over in a second or
    two and prints nothing)."""
    if not enabled:
        yield None
        return
    state = {"bar": None, "start": None}

    def callback(done):
        now = time.perf_counter()
        if state["start"] is None:  # timed from the first step, not the compilations
            state["start"] = now
            return
        bar = state["bar"]
        if bar is None:
            elapsed = now - state["start"]
            if elapsed < PROGRESS_DELAY or elapsed * total / done < PROGRESS_MIN_TOTAL:
                return
            bar = state["bar"] = tqdm.tqdm(
                total=total, initial=done, desc="UHAGuide warm start", unit="step",
                leave=False,
            )
        bar.update(done - bar.n)

    try:
        yield callback
    finally:
        if state["bar"] is not None:
            state["bar"].close()


def _step_device(spec):
    """The device the warm start's model-free steps run on for ``warm_start_device`` =
    ``spec`` (``None``, a platform name or a ``jax.Device``): ``None`` where that is JAX's
    default device (no copies), else the device."""
    if spec is None:
        return None
    if isinstance(spec, jax.Device):
        device = spec
    elif isinstance(spec, str):
        try:
            device = jax.local_devices(backend=spec)[0]
        except RuntimeError as e:
            raise ValueError(
                f"warm_start_device: no {spec!r} device here ({e}); pass None, 'cpu' or a "
                "jax.Device."
            ) from None
    else:
        raise ValueError(
            "warm_start_device must be None, a platform name such as 'cpu', or a "
            f"jax.Device; got {type(spec).__name__}."
        )
    return None if device == jax.local_devices()[0] else device


def _summary_in_host_memory() -> bool:
    """Whether the chain's program writes its weight summary to the host's memory
    (:data:`SUMMARY_IN_HOST_MEMORY`; "auto": where JAX's default backend is a GPU)."""
    if SUMMARY_IN_HOST_MEMORY == "auto":
        return jax.default_backend() == "gpu"
    return bool(SUMMARY_IN_HOST_MEMORY)


def _chunk_bucket(num_draws: int) -> int:
    """The smallest width at or above ``num_draws`` of the form 2^k or 3 · 2^(k-1) (64,
    96, 128, 192, 256, ...: at most a third computed in vain), at least
    ``DRAW_CHUNK_MIN``: the sizes the draws' key split and chunk widths are compiled for."""
    if num_draws <= DRAW_CHUNK_MIN:
        return DRAW_CHUNK_MIN
    power = 1 << (num_draws - 1).bit_length()
    three_quarters = 3 * power // 4
    return three_quarters if three_quarters >= num_draws else power


def _on_mesh(sharding, tree):
    """The array leaves of ``tree`` replicated on ``sharding``'s mesh, except those
    already placed on it; ``tree`` as it is without ``sharding``."""
    if sharding is None:
        return tree

    def place(x):
        if isinstance(x, jax.Array) and isinstance(x.sharding, NamedSharding) and (
            x.sharding.mesh == sharding.mesh
        ):
            return x
        if not isinstance(x, _ARRAY_TYPES):
            return x
        return put_global(x, replicated(sharding))

    return jax.tree.map(place, tree)


class _LastSeen:
    """A value computed from a pytree of JAX arrays, remembered for the last tree seen.

    ``get(tree)`` returns it when ``tree``'s leaves are the very same JAX arrays (JAX
    arrays are immutable: same objects, same values) in the same structure, else ``None``;
    any other leaf (a NumPy array can change in place) is never remembered. It holds
    the last tree's leaves, so their ids cannot be reused while it does.
    """

    def __init__(self):
        self._key = None
        self._value = None

    @staticmethod
    def _key_of(tree):
        leaves, treedef = jax.tree.flatten(tree)
        if not all(isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
                   for x in leaves):
            return None
        return treedef, tuple(leaves)

    def get(self, tree):
        key = self._key_of(tree)
        if key is None or self._key is None or key[0] != self._key[0]:
            return None
        if len(key[1]) != len(self._key[1]) or any(a is not b for a, b in zip(key[1], self._key[1])):
            return None
        return self._value

    def put(self, tree, value):
        key = self._key_of(tree)
        self._key, self._value = (key, value) if key is not None else (None, None)


def _data_fingerprint(arrays, spec):
    """Shapes, dtypes, static leaves and (sum, sum of squares) of the array leaves of a
    model's arguments: tells the data the guide was set up with from other data."""
    layout = (spec, tuple((tuple(np.shape(a)), str(a.dtype)) for a in arrays))
    if not arrays:
        return layout, np.zeros((0, 2))
    # concrete arrays inside a JAX trace (closed over by a jitted function) too
    with jax.ensure_compile_time_eval():
        return layout, np.asarray(_sums(list(arrays)), np.float64)


def _same_data(a, b) -> bool:
    """Whether two :func:`_data_fingerprint` values describe the same data (the sums to
    float32 rounding: a sum's order differs between devices)."""
    if a is None or b is None:
        return a is b
    return a[0] == b[0] and bool(np.allclose(a[1], b[1], rtol=1e-5, atol=1e-6))


@jax.jit
def _sums(arrays):
    return jnp.stack([
        jnp.stack([jnp.sum(x), jnp.sum(jnp.square(x))])
        for x in (jnp.asarray(a).astype(jnp.float32) for a in arrays)
    ])


def _chunkable(rng_key, num_draws, params, arrays) -> bool:
    """Whether the draws can run in chunks: concrete values, a raw (uint32) key, at
    least one draw."""
    if not num_draws or _is_tracer((rng_key, params, arrays)):
        return False
    dtype = rng_key.dtype if isinstance(rng_key, jax.Array) else jnp.asarray(rng_key).dtype
    return not jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _keys_from(rng_key, offset, num):
    """Keys ``offset``, ..., ``offset + num - 1`` of ``jax.random.split(rng_key, n)``
    (any larger ``n``), for a traced ``offset``: under JAX's partitionable threefry key i
    of a split is ``fold_in(rng_key, i)`` (checked by :func:`_fold_in_splits`)."""
    index = jnp.asarray(offset, jnp.uint32) + jnp.arange(num, dtype=jnp.uint32)
    return jax.vmap(jax.random.fold_in, (None, 0))(rng_key, index)


def _fold_in_splits(rng_key) -> bool:
    """Whether :func:`_keys_from` gives a split's keys for raw keys such as ``rng_key``
    (JAX's default partitionable threefry: yes), checked once per configuration."""
    return _fold_in_check(
        jnp.shape(rng_key), bool(jax.config.jax_threefry_partitionable),
        str(jax.config.jax_default_prng_impl),
    )


@functools.lru_cache(maxsize=None)
def _fold_in_check(shape, partitionable, impl) -> bool:
    del partitionable, impl  # the cache's key: the configuration checked
    with jax.ensure_compile_time_eval():
        key = jax.random.PRNGKey(12345)
        if key.shape != tuple(shape):
            return False
        split = np.asarray(jax.random.split(key, 7))
        folded = np.asarray(_keys_from(key, 3, 4))
    return bool(np.array_equal(split[3:], folded))


def _draw_keys(rng_key, num_draws, total):
    """``total`` keys on the device: ``jax.random.split(rng_key, num_draws)``'s, then
    ``total - num_draws`` for padding draws (computed and dropped).

    Under JAX's partitionable threefry (the default) key i of a split does not depend on
    the split's size, so this is one split to ``total``; otherwise the padding repeats
    the first keys.
    """
    rng_key = jnp.asarray(rng_key)
    if jax.config.jax_threefry_partitionable:
        return _split_keys(rng_key, total)
    with jax.ensure_compile_time_eval():  # a concrete key inside a jax.jit too
        keys = np.asarray(jax.random.split(rng_key, num_draws))
        return jnp.asarray(keys[np.arange(total) % num_draws])


@partial(jax.jit, static_argnums=2)
def _key_chunk(keys, start, width):
    return jax.lax.dynamic_slice_in_dim(keys, start, width)


def _is_factor(site) -> bool:
    """A ``numpyro.factor`` term: an observed ``Unit`` site (masked or expanded by a
    plate too), not data."""
    fn = site["fn"]
    while isinstance(fn, (dist.MaskedDistribution, dist.ExpandedDistribution,
                          dist.Independent)):
        fn = fn.base_dist
    return isinstance(fn, dist.Unit)


@partial(jax.jit, static_argnums=1)
def _first(tree, num_draws):
    """The first ``num_draws`` of every leaf: one program per count and tree."""
    return jax.tree.map(lambda x: x[:num_draws], tree)


@partial(jax.jit, static_argnums=1)
def _join(chunks, num_draws=None):
    """The chunks' draws end to end: the first ``num_draws`` (one program per chunk
    count and ``num_draws``), or all of them, the last chunk's padding included (one
    program per chunk count)."""
    if num_draws is None:
        return jax.tree.map(lambda *xs: jnp.concatenate(xs), *chunks)
    return jax.tree.map(lambda *xs: jnp.concatenate(xs)[:num_draws], *chunks)


def _nonfinite_data_in(model_trace) -> dict:
    """``{site: flat indices over its batch shape}`` of the observed sites of
    ``model_trace`` holding NaN or inf not masked out (see :func:`_nonfinite_observed`)."""
    bad = {}
    for name, site in model_trace.items():
        nonfinite = _nonfinite_observed(site)
        if nonfinite is not None and nonfinite.any():
            bad[name] = np.flatnonzero(nonfinite)
    return bad


def _name_nonfinite_data(data) -> str:
    """"observed site(s) 'y' (NaN or inf at flat index [3])" for :func:`_nonfinite_data_in`'s
    answer (the first ten indices of each site)."""
    return "observed site(s) " + ", ".join(
        f"'{n}' (NaN or inf at flat index {i[:10].tolist()}{' ...' if i.size > 10 else ''})"
        for n, i in data.items()
    )


def _free_host_memory() -> float:
    """Bytes of RAM free now (Linux; elsewhere an ``OSError``/``ValueError``: the
    caller keeps its default)."""
    import os

    return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _bytes_accessed(lowered) -> float:
    """XLA's count of the bytes a lowered program reads and writes (its cost analysis,
    before compilation; a list of one dict in older JAX)."""
    cost = lowered.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0]
    return float(cost["bytes accessed"])


def _nonfinite_observed(site):
    """For an observed sample site (not a ``numpyro.factor``'s) with a concrete floating
    value: a boolean array over its batch shape, ``True`` where the value has a NaN or inf
    that is not masked out; ``None`` for any other site (traced values cannot be read)."""
    value = site.get("value")
    if (
        site["type"] != "sample" or not site["is_observed"]
        or site.get("infer", {}).get("is_auxiliary", False)
        or isinstance(value, jax.core.Tracer)
        or not jnp.issubdtype(jnp.result_type(value), jnp.inexact)
    ):
        return None
    bad = ~np.isfinite(np.asarray(value))
    event_dim = site["fn"].event_dim
    if event_dim:
        bad = bad.any(axis=tuple(range(-event_dim, 0)))
    mask = site.get("mask")
    if mask is not None and not isinstance(mask, jax.core.Tracer):
        bad = bad & np.broadcast_to(np.asarray(mask), bad.shape)
    # handlers.mask and obs_mask wrap the site's distribution in a MaskedDistribution
    # (NumPyro sets no "mask" entry for them): its masked-out entries are not data
    try:
        bad = bad & np.broadcast_to(_batch_mask(site["fn"], np), bad.shape)
    except (jax.errors.TracerArrayConversionError, ValueError):
        pass  # a traced mask: unreadable here
    return bad


@jax.jit
def _finite_draws(log_weights, latent, values=()):
    """Per draw: a finite log weight, latent z and ``values`` (arrays with the draws on
    their leading axis)."""
    finite = jnp.isfinite(log_weights) & jnp.all(jnp.isfinite(latent), axis=-1)
    for value in values:
        value = jnp.reshape(value, (jnp.shape(value)[0], -1))
        finite = finite & jnp.all(jnp.isfinite(value), axis=-1)
    return finite


def _host_keys(rng_key, num_draws, params, arrays):
    """``jax.random.split(rng_key, num_draws)`` as a host array, or ``None`` where the
    draws cannot run in chunks (traced values, typed keys, no draws).

    Under JAX's partitionable threefry (the default) key i of a split does not depend on
    the split's size, so the keys come from a split to the next chunk width
    (:func:`_chunk_bucket`): compiled once per width, not once per ``num_draws``.
    """
    if not _chunkable(rng_key, num_draws, params, arrays):
        return None
    return np.asarray(_draw_keys(rng_key, num_draws, _chunk_bucket(num_draws)))[:num_draws]


def _mean_and_se(values) -> tuple[float, float] | None:
    """Mean and standard error of the finite ``values``; ``None`` for fewer than two."""
    values = np.asarray(values, np.float64).ravel()
    values = values[np.isfinite(values)]
    if values.size < 2:
        return None
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(values.size))


def _real(name, value) -> float:
    """``value`` as a Python float (NumPy and JAX scalars included), or a ValueError."""
    if isinstance(value, (bool, str, bytes)) or np.ndim(value) != 0:
        raise ValueError(f"{name} must be a real number, got {value!r}.")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}.") from None


def _sample_shape(sample_shape, where) -> tuple[int, ...]:
    """``sample_shape`` as a tuple of Python ints (an int ``n`` is ``(n,)``, as NumPy's
    shapes), or a ValueError naming it."""
    if isinstance(sample_shape, (int, np.integer)) and not isinstance(sample_shape, bool):
        sample_shape = (sample_shape,)
    try:
        shape = tuple(sample_shape)
    except TypeError:
        shape = None
    if shape is None or not all(
        isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise ValueError(
            f"{where}: sample_shape must be a tuple of non-negative integers (e.g. (1000,)), "
            f"got {sample_shape!r}."
        )
    return tuple(int(n) for n in shape)


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
