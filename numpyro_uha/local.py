"""UHA for local latent variables, with data subsampling and amortization.

:class:`UHALocalGuide` is for models with one plate of local latent variables, the shape
NumPyro users write for one latent per data point (mixed models with many groups,
variational autoencoders) and for data too large for full-batch gradients::

    def model(x_batch, num_data):
        theta = numpyro.sample("theta", ...)                    # global latents
        with numpyro.plate("data", num_data, subsample_size=len(x_batch)):
            z = numpyro.sample("z", ...)                        # local latents
            numpyro.sample("x", ..., obs=x_batch)

Every data point i of a minibatch gets its own UHA chain (``core.uha_sample_rows``) on
log p(x_i, z_i | globals) (plus the Jacobian of z_i's unconstraining map), from its
initial Gaussian q_i: per-data-point parameters (subsampled with the plate) or an
**encoder**, any callable x_i ↦ (μ_i, σ_i) (amortized). The annealing parameters ε(β), η,
Σ, β, ψ, δ are shared by the data points, or per data point with
``per_data_point=True``. The global latents are left to any NumPyro guide (default
:class:`~numpyro.infer.autoguide.AutoNormal` on the model with the plate's sites hidden).

The guide's density is the augmented proposal of the paper for every chain, inside the
plate, so NumPyro's ``Trace_ELBO`` scales the minibatch terms by N/B (the plate does it)
and its loss is an unbiased estimate of the full-data bound

    E_q(θ)[ log p(θ) − log q(θ) + Σ_{i=1}^N log w_i(θ) ],

the paper's UHA bound for each data point's local latents given the globals (the
"locally enhanced bound" of Geffner & Domke, 2022), which is at least the plain ELBO of
the same q and tightens with K. It is the paper's Section 5.4 setting with a decoder's
weights as ``numpyro.param`` sites of the model.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro import handlers
from numpyro.distributions import constraints
from numpyro.distributions.transforms import biject_to
from numpyro.infer.autoguide import AutoGuide, AutoNormal
from numpyro.infer.initialization import init_to_median, init_to_uniform
from numpyro.infer.util import log_density
import numpyro.distributions as dist
from numpyro.distributions.util import sum_rightmost

from numpyro_uha import _decenter, _supports
from numpyro_uha._keywords import check_model_keywords, did_you_mean_site
from numpyro_uha._memory_maps import relieve as relieve_memory_maps
from numpyro_uha._masked import _batch_mask, completion_log_density, masked_out_entries
from numpyro_uha.core import (
    AnnealingParams,
    betas_from_logits,
    check_integrator,
    hais_sample_rows,
    step_sizes_from_beta,
    uha_sample_rows,
)
from numpyro_uha._divergence import (
    DIVERGENCE_ENERGY,
    LatchConstraint,
    LocalDivergenceRecord,
    UHAFitWarning,
    check_latch,
    chain_diverged,
    gate,
)
from numpyro_uha._weights import (
    KHAT_BAD, khat_counts, log_spread, psis_khat, psis_khat_columns,
)
from numpyro_uha.core.batching import reuse_width, signature_of
from numpyro_uha.core.sharding import leading_axis_sharding, num_shards, shard_leading
from numpyro_uha.guide import (
    GROUPS,
    UHADivergenceWarning,
    UHAGuide,
    _check_frozen,
    _check_int,
    _check_step_sizes,
    _default_init_step_size,
    _draws_quantile,
    _chunk_bucket,
    check_param_range,
    _chunkable,
    _draw_keys,
    _guide_factor,
    _is_tracer,
    _jit_once,
    _join,
    _key_chunk,
    _merge_static,
    _needs_concrete_data,
    _nonfinite_concrete_float,
    _nonfinite_observed,
    _real,
    _sample_shape,
    _site_values,
    _split_static,
)

__all__ = ["UHALocalGuide", "LocalLogZ", "GlobalLogZ"]

#: Chains (draws × data points) run together by the draw methods; bounds their memory.
DRAW_ROWS = 65536

#: :meth:`UHALocalGuide.global_log_z` warns below this effective fraction of its draws:
#: for a Gaussian q(θ) whose mean is off the posterior's by δ of their common sd, the
#: fraction is exp(−δ²), 0.05 at δ = 1.73 (and k̂ can miss such a shift where the
#: weights' tail is short: a guide on the far side of a narrow posterior)
ESS_FRACTION_BAD = 0.05

#: The groups ``per_data_point=True`` makes per data point (q always is, or is amortized).
ANNEALING_GROUPS = tuple(g for g in GROUPS if g != "q")


class LocalLogZ(NamedTuple):
    """log p(x_i) estimates of every data point of a minibatch, and their sums.

    Attributes:
        log_z: per data point, the importance-weighted estimate log mean_s w_i^(s), shape
            ``(B,)`` (consistent; lower-biased by about var(w)/(2 S mean(w)²)).
        se: its delta-method standard error per data point.
        total: Σ_i log_z, the minibatch's log-likelihood estimate.
        total_se: its standard error (the data points' chains are independent).
        elbo: per data point, the mean log weight (the UHA bound), shape ``(B,)``.
        elbo_se: its standard error.
        total_elbo: Σ_i elbo.
        total_elbo_se: its standard error.
        ess: per data point, the effective sample size of its weights.
        num_nonfinite: per data point, draws whose weight diverged (counted as w = 0).
        num_samples: chains per data point.
        pareto_khat: per data point, the Pareto k̂ of its weights
            (:func:`~numpyro_uha.evaluation.psis_khat`): at 0.7 or above its ``log_z`` is
            unreliable (lower-biased, ``se`` too small), and :meth:`UHALocalGuide.log_z`
            warns, naming the data points.
    """

    log_z: np.ndarray
    se: np.ndarray
    total: float
    total_se: float
    elbo: np.ndarray
    elbo_se: np.ndarray
    total_elbo: float
    total_elbo_se: float
    ess: np.ndarray
    num_nonfinite: np.ndarray
    num_samples: int
    pareto_khat: np.ndarray | None = None

    def __str__(self) -> str:
        bad = ""
        if self.pareto_khat is not None:
            count = int(np.sum(np.asarray(self.pareto_khat) >= KHAT_BAD))
            bad = f"; Pareto k̂ ≥ {KHAT_BAD} at {count}" if count else ""
        return (
            f"{len(self.log_z)} data points: log-likelihood {self.total:.2f} ± "
            f"{self.total_se:.2f} | ELBO {self.total_elbo:.2f} ± {self.total_elbo_se:.2f} "
            f"({self.num_samples} chains each{bad})"
        )


class GlobalLogZ(NamedTuple):
    """log p(x) of all the data and the weights of the global latents' draws, from
    :meth:`UHALocalGuide.global_log_z`.

    Draw s of the global guide, θ_s ~ q(θ), has the weight

        w_s = p(θ_s) p(x_out | θ_s) Π_i p̂(x_i | θ_s) / q(θ_s),

    p(x_out | θ) the observed sites outside the plate and p̂(x_i | θ) the mean of
    ``num_samples`` UHA weights of data point i's chain given θ_s, an unbiased estimate of
    p(x_i | θ_s). So E[w_s] = p(x) (the data points' chains are independent), and the
    weights are importance weights of the globals' posterior marginal p(θ | x) against
    the global guide: heavy-tailed (large ``pareto_khat``) where q(θ) misses it, e.g. a
    hierarchy's group scale fitted too small.

    Attributes:
        log_z: log mean_s w_s, a consistent, lower-biased estimate of log p(x) of all
            the data (every data point of the plate).
        se: its standard error: that of the mean over the draws (delta method;
            unreliable where ``pareto_khat`` ≥ 0.7) and ``chains_se`` together.
        chains_se: the part of ``se`` from the chains' noise, common to every draw
            (common random numbers): sqrt(Σ_i var(log p̂(x_i | θ))) by the delta method,
            averaged over the weighted draws. It does not shrink with ``num_draws``,
            only with ``num_samples``, and ``log_z`` is lower-biased by about half its
            square.
        elbo: mean_s log w_s, a lower bound on log p(x).
        elbo_se: its standard error.
        ess: the effective sample size of the weights, (Σ w)² / Σ w².
        pareto_khat: the weights' Pareto k̂ (:func:`~numpyro_uha.evaluation.psis_khat`).
            At 0.7 or above (or with ``ess`` under 5 % of the draws) the global guide
            misses the globals' posterior: their moments from
            :meth:`UHALocalGuide.sample_posterior` are off by more than their spread
            suggests, and :meth:`~UHALocalGuide.global_log_z` warns.
        samples: the draws θ_s, constrained, by global site name, leading axis
            ``num_draws``.
        log_weights: log w_s, shape ``(num_draws,)`` (-inf: a draw all of whose chains
            at some data point diverged). With ``samples``, what
            :func:`~numpyro_uha.evaluation.weighted_moments` and
            :func:`~numpyro_uha.evaluation.importance_resample` take.
        num_samples: chains per data point and draw.
    """

    log_z: float
    se: float
    chains_se: float
    elbo: float
    elbo_se: float
    ess: float
    pareto_khat: float
    samples: dict
    log_weights: np.ndarray
    num_samples: int

    def __str__(self) -> str:
        return (
            f"log p(x) {self.log_z:.2f} ± {self.se:.2f} (chains {self.chains_se:.2f}) | "
            f"ELBO {self.elbo:.2f} ± {self.elbo_se:.2f} | Pareto k̂ {self.pareto_khat:.2f}, "
            f"ESS {self.ess:.0f} of {self.log_weights.shape[0]} draws "
            f"({self.num_samples} chains per data point and draw)"
        )


def _sampleable(fn, names=None):
    """``fn`` where a latent site that no handler gave a value and whose distribution
    cannot be sampled (an ``ImproperUniform``: a flat prior) takes ``init_to_uniform``'s
    value, as in NumPyro's own setup (only the sites ``names``, if given). The setup's
    traces, the draw methods' size probe and the global guide's model (whose local sites
    are hidden from its initialization) run the model at values they draw, and such a
    site raised a bare ``NotImplementedError`` there. Outermost of the handlers it wraps,
    so it sees the values they give and the key ``seed`` gives."""
    return handlers.substitute(fn, substitute_fn=partial(_flat_prior_value, names=names))


def _flat_prior_value(site, names=None):
    if site["type"] != "sample" or site["is_observed"] or site["value"] is not None:
        return None
    if names is not None and site["name"] not in names:
        return None
    fn = site["fn"]
    try:
        jax.eval_shape(lambda: fn.sample(jax.random.PRNGKey(0)))
    except NotImplementedError:
        if site["kwargs"].get("rng_key") is None:  # not seeded: any point will do
            site = {**site, "kwargs": {**site["kwargs"], "rng_key": jax.random.PRNGKey(0)}}
        return init_to_uniform(site)
    except Exception:  # noqa: BLE001 - the site's own sampling raises it, as before
        return None
    return None


class UHALocalGuide(AutoGuide):
    r"""UHA for the local latent variables of one subsampled plate; globals by any guide.

    Usage (a VAE: no global latents, the decoder's weights are ``numpyro.param`` sites of
    the model, the encoder's are registered by the encoder)::

        guide = UHALocalGuide(vae_model, K=16, encoder=encoder)
        svi = SVI(vae_model, guide, optax.adam(1e-4), Trace_ELBO())
        state = svi.init(rng_key, x_batch, num_data)
        state, loss = svi.update(state, x_next_batch, num_data)

    Args:
        model: a NumPyro model with exactly one plate of local latent variables (a
            plate with ``subsample_size``, or the one named by ``subsample_plate``). Every
            latent site inside it is local and must be continuous; every latent site
            outside it is global.
        K: annealing transitions per data point (≥ 1).
        encoder: ``None`` (q_i's mean and scale are parameters of shape ``(N, d)``,
            subsampled with the plate) or a callable called inside the guide with the
            minibatch's observed values in the plate (the array, for one observed site;
            a dict by site name for several) and returning ``(loc, scale)`` of shape
            ``(B, d)``, d the number of unconstrained local coordinates per data point,
            in the order the model samples its local sites. It may register its
            weights with ``numpyro.param`` or ``numpyro.contrib.module`` (Flax, Haiku,
            Equinox), as a NumPyro guide would.
        global_guide: the guide of the global latents: ``None`` (an ``AutoNormal``), an
            ``AutoGuide`` class or any callable ``model -> guide`` (called with the model
            with the plate's sites hidden; a hand-written guide function goes in as
            ``lambda model: my_guide`` and returns a dict of the global latents'
            values), or a guide instance the user built (on a model without the plate's
            sites). Ignored when the model has no global
            latents. Not a :class:`~numpyro_uha.UHAGuide` (a ``TypeError``): fit on
            the model with the plate's sites hidden, its chain would anneal to the
            globals' prior; anneal globals and locals together with ``UHAGuide`` on
            the whole model instead, where the full data fit in one step.
        decenter: run local sites non-centered. ``False`` (default): the model's own
            coordinates. ``True``: every local site ``z ~ Normal(loc, scale)`` (or
            StudentT, Cauchy, Laplace, Logistic) whose loc or scale depends on other
            latent variables (the globals: a centered hierarchy) is run as
            ``z = loc + scale · z̃``, ``z̃ ~ Normal(0, 1)``, so each q_i (on z̃) follows
            the globals; a MultivariateNormal or MultivariateStudentT one as
            ``z = loc + scale_tril · z̃``. A list of local site names: those sites. The
            guide still emits and returns ``z`` (its Jacobian is in the guide's density,
            so the bound stays exact); q's parameters, the encoder's output and
            :meth:`get_logdensity_fn`'s rows are in z̃. Where each data point's latents
            are weakly informed, the global guide's spread is then right where the
            centered one's is several times too small; where they are well informed,
            the model's own coordinates fit better and ``True`` can be far off (a
            Poisson mixed model's group sd
            came out twice NUTS's). Fit both and keep the higher full-data bound
            (measured: docs/how-to/local-latents.md). Resolved at setup into
            ``guide.decentered_sites``.
        subsample_plate: the local plate's name, needed when no plate (or more than one)
            has ``subsample_size`` smaller than its size.
        per_data_point: give each data point its own annealing parameters (ε, its slope,
            η, Σ, β, ψ, δ: shape ``(N, ...)``, subsampled with the plate) instead of
            shared ones.
        precondition: run each data point's chain in its own q_i's standardized
            coordinates (z − μ_i) / σ_i: the momentum scales are Σ's (shared or per data
            point) divided by q_i's sds, which is the same as the chain on the standardized
            target, so ε, its cap ``max_step_size`` and Σ are in units of each q_i's sds.
            Off by default (ε and Σ in the latents' own unconstrained units for every data
            point, as in the paper's VAEs): measured, it helped a VAE a little and hurt a
            Poisson mixed model with groups of very different sizes (see
            docs/how-to/local-latents.md).
        prefix: prefix of the guide's ``numpyro.param`` names.
        init_scale: initial sd of q_i (without an encoder).
        init_step_size: initial ε, in (0, ``max_step_size``); by default 0.02, or half of
            ``max_step_size`` where that is smaller.
        max_step_size: ε_max; every ε(β_m) stays in (0, ε_max) (the paper caps ε at
            0.05 for its VAEs).
        min_momentum_scale: a floor on Σ's diagonal sds (``None``: any positive
            value). Coordinate j's leapfrog step is ε δ_j / m_j, so ``max_step_size``
            caps it only while Σ cannot shrink; with a floor, it stays below
            ``max_step_size * δ_j / min_momentum_scale`` (in q_i's sds with
            ``precondition``), a cap on the step itself where δ is frozen (the group
            ``"drift"``). In (0, 1) (Σ starts at 1).
        init_damping: initial η in (0, ``max_damping``).
        max_damping: η's upper end (1 by default: η in (0, 1)). Learned, η goes toward 1
            (no momentum refresh) on the VAE benchmark, where the gradient through 16
            almost deterministic leapfrog steps grew until the fit fell; a cap below 1
            refreshes the momentum at every transition (see
            docs/how-to/local-latents.md).
        frozen: groups that are not learned, as for :class:`~numpyro_uha.UHAGuide`
            (``"q"``, ``"step_size"``, ``"step_size_slope"``, ``"damping"``,
            ``"momentum"``, ``"schedule"``, ``"bridge"``, ``"drift"``); freeze an
            encoder's or decoder's weights with the optimizer (e.g.
            ``optax.multi_transform``). A frozen group gets a zero gradient, which
            Adam turns into no update; a decoupled weight decay (``optax.adamw``) would
            still shrink it, so mask it out of such an optimizer too.
        num_leapfrog_steps: L, leapfrog steps per transition.
        integrator: ``"position_verlet"`` (default) or ``"velocity_verlet"``.
        remat: rematerialize each transition in the backward pass.
        sharding: shard the minibatch's chains over devices: a
            :class:`jax.sharding.Mesh` (the data-point axis is split over all its axes) or
            a :class:`~jax.sharding.NamedSharding` of the leading axis. Each device runs
            B / n data points' chains (B a multiple of n; otherwise the chains are not
            constrained), the keys are split before sharding, so results do not depend
            on the device count; parameters are replicated. Combine it with
            :func:`~numpyro_uha.shard_particles` for several particles per step.
    """

    # guides pickled before these options existed
    min_momentum_scale = None
    max_damping = 1.0
    requested_decenter = False
    decentered_sites = ()
    _user_model = None
    _hold_data = False  # the model reads its data's values (set up)
    _encoder_param_names = ()  # the encoder's numpyro.param sites, seen when it runs

    def __init__(
        self,
        model,
        *,
        K: int = 8,
        encoder=None,
        global_guide=None,
        subsample_plate: str | None = None,
        decenter=False,
        per_data_point: bool = False,
        precondition: bool = False,
        prefix: str = "local",
        init_scale: float = 0.1,
        init_step_size: float | None = None,
        max_step_size: float = 0.2,
        init_damping: float = 0.9,
        max_damping: float = 1.0,
        min_momentum_scale: float | None = None,
        frozen=(),
        num_leapfrog_steps: int = 1,
        integrator: str = "position_verlet",
        remat: bool = False,
        sharding=None,
    ):
        _check_int("K", K, 1)
        _check_int("num_leapfrog_steps", num_leapfrog_steps, 1)
        check_integrator(integrator)
        max_step_size = _real("max_step_size", max_step_size)
        init_step_size = _default_init_step_size(init_step_size, max_step_size, 0.02)
        init_damping = _real("init_damping", init_damping)
        init_scale = _real("init_scale", init_scale)
        _check_step_sizes(init_step_size, max_step_size)
        max_damping = _real("max_damping", max_damping)
        if not 0 < max_damping <= 1:
            raise ValueError(f"max_damping (η's upper end) must be in (0, 1], got {max_damping!r}.")
        if not 0 < init_damping < max_damping:
            raise ValueError(
                f"init_damping (η) must be in (0, max_damping) = (0, {max_damping}), "
                f"got {init_damping!r}."
            )
        if not init_scale > 0:
            raise ValueError(f"init_scale must be a positive number, got {init_scale!r}.")
        if min_momentum_scale is not None:
            min_momentum_scale = _real("min_momentum_scale", min_momentum_scale)
            if not 0 < min_momentum_scale < 1:
                raise ValueError(
                    "min_momentum_scale must be None or in (0, 1) (Σ's sds start at 1), "
                    f"got {min_momentum_scale!r}."
                )
        if encoder is not None and not callable(encoder):
            raise TypeError(
                f"encoder must be a callable x -> (loc, scale), got {type(encoder).__name__}."
            )
        frozen = _check_frozen(frozen)
        decenter = _check_decenter(decenter)
        _refuse_uha_global_guide(global_guide)  # a class or instance: refused at once
        self.K = K
        self.encoder = encoder
        self._global_guide_arg = global_guide
        self.global_guide = None
        self.subsample_plate = subsample_plate
        self.requested_decenter = decenter
        self.decentered_sites = ()  # resolved at setup
        self._user_model = model
        self.per_data_point = bool(per_data_point)
        self.precondition = bool(precondition)
        self.init_scale = init_scale
        self.init_step_size = init_step_size
        self.max_step_size = max_step_size
        self.init_damping = init_damping
        self.max_damping = max_damping
        self.min_momentum_scale = min_momentum_scale
        self.frozen = frozenset(frozen)
        self.num_leapfrog_steps = num_leapfrog_steps
        self.integrator = integrator
        self.remat = remat
        self.sharding = leading_axis_sharding(sharding)
        self._jitted = {}
        self._completed_sites = ()  # see _find_completed_sites
        # the latch: a parameter the first diverged chain in training moves off 0
        # (see _divergence.py); svi.get_params then warns
        self._divergence = LocalDivergenceRecord()
        self._latch_constraint = LatchConstraint(self._divergence)
        super().__init__(model, prefix=prefix, init_loc_fn=init_to_median)

    # ------------------------------------------------------------------ setup
    def _setup_prototype(self, *args, **kwargs):
        try:
            self._setup(*args, **kwargs)
        except BaseException:
            # not half set up: the next call (the user fixed it) sets up again
            self.prototype_trace = None
            self.global_guide = None
            raise

    def _setup(self, *args, **kwargs):
        if not _is_tracer((args, kwargs)):
            relieve_memory_maps("UHALocalGuide")  # before this setup compiles (see _memory_maps)
        rng_key = numpyro.prng_key()
        if rng_key is None:
            rng_key = jax.random.PRNGKey(0)
        self.model = self._written_model
        with handlers.block():
            trace = handlers.trace(_sampleable(handlers.seed(self.model, rng_key))).get_trace(
                *args, **kwargs
            )
        name, size, subsample_size, dim = self._find_plate(trace)
        self.decentered_sites = self._resolve_decenter(trace, name, args, kwargs)
        if self.decentered_sites:  # the rest of the setup in the non-centered coordinates
            self.model = _decenter.decentered_model(self._written_model, self.decentered_sites)
            with handlers.block():
                trace = handlers.trace(_sampleable(handlers.seed(self.model, rng_key))).get_trace(
                    *args, **kwargs
                )
        self.prototype_trace = trace
        # the model reads its data's values: programs hold the data (guide._split_static)
        self._hold_data = _needs_concrete_data(self.model, args, kwargs, _site_values(trace))
        self._plate_name = name
        self._plate_dim = dim
        sites_in = {
            n: s for n, s in trace.items()
            if s["type"] == "sample" and any(f.name == name for f in s["cond_indep_stack"])
        }
        self._local_sites = [n for n, s in sites_in.items() if not s["is_observed"]]
        self._observed_sites = [n for n, s in sites_in.items() if s["is_observed"]]
        global_latents = [
            n for n, s in trace.items()
            if s["type"] == "sample" and not s["is_observed"] and n not in sites_in
        ]
        if not self._local_sites:
            raise ValueError(
                f"UHALocalGuide: the plate '{name}' has no latent sample sites; it is for "
                "models with one latent variable (or several) per data point. Use "
                "UHAGuide for models with global latents only."
            )
        for n in self._local_sites:
            site = trace[n]
            if site["fn"].support.is_discrete:
                raise ValueError(
                    f"UHALocalGuide: local site '{n}' is discrete ({type(site['fn']).__name__}); "
                    "UHA needs continuous latent variables, and this guide does not sum "
                    "discrete ones out (UHAGuide does, on the full data). Marginalize it "
                    "by hand (the logsumexp over its values in a numpyro.factor) or make "
                    "it continuous."
                )
            inner = [
                f.name for f in site["cond_indep_stack"]
                if f.name != name and f.size is not None
                and trace.get(f.name, {}).get("args", (None, None))[1] not in (None, f.size)
            ]
            if inner:
                raise ValueError(
                    f"UHALocalGuide: local site '{n}' is in a second subsampled plate "
                    f"{inner}; only one plate may be subsampled."
                )
        for n in global_latents:
            if trace[n]["fn"].support.is_discrete:
                raise ValueError(
                    f"UHALocalGuide: global site '{n}' is discrete; the global guide needs "
                    "continuous latent variables (this guide does not sum discrete sites "
                    "out; UHAGuide does, on the full data)."
                )
        if self.encoder is not None and all(
            trace[n].get("infer", {}).get("is_auxiliary", False) for n in self._observed_sites
        ):
            raise ValueError(
                f"UHALocalGuide: the encoder is called with the observed values of the "
                f"plate '{name}''s sample sites, and the plate has none"
                + (f" (only numpyro.factor terms: {self._observed_sites})"
                   if self._observed_sites else "")
                + ". Observe the data at a sample site "
                "(numpyro.sample(name, distribution, obs=data[idx])), or use the guide "
                "without an encoder (q_i's parameters per data point)."
            )
        self._global_latents = global_latents
        self._model_param_sites = {n: s for n, s in trace.items() if s["type"] == "param"}
        # the layout of one data point's unconstrained local coordinates
        layout, offset = [], 0
        for n in self._local_sites:
            site = trace[n]
            axis = self._row_axis(site)
            value = site["value"]
            transform = biject_to(site["fn"].support)
            unconstrained = transform.inv(value)
            per_row = jnp.moveaxis(unconstrained, axis, 0).shape[1:]
            width = int(np.prod(per_row, dtype=int))
            layout.append((n, axis, per_row, offset, width, unconstrained.shape))
            offset += width
        self._layout = layout
        self.latent_dim = offset
        dtype = jnp.result_type(float)
        # q_i starts at the prior median of each local (unconstrained), for every data point
        with handlers.block():
            start = handlers.trace(_sampleable(
                handlers.seed(
                    handlers.substitute(self.model, self._median_values(trace, rng_key)), rng_key
                )
            )).get_trace(*args, **kwargs)
        row = self._pack({n: biject_to(start[n]["fn"].support).inv(start[n]["value"])
                          for n in self._local_sites})
        self._init_loc_row = jnp.where(jnp.isfinite(row), row, 0.0).mean(0).astype(dtype)
        self._completed_sites = ()
        self._check_no_batch_sized_globals(trace, global_latents, size, subsample_size)
        self._check_finite_data(trace, trace[name]["value"])
        self._check_outside_sites_ignore_locals(trace, args, kwargs, sites_in)
        self._completed_sites = self._find_completed_sites(trace, args, kwargs, size)
        if self.encoder is None and subsample_size < size and not _is_tracer((args, kwargs)):
            self._warn_if_data_ignore_the_indices(args, kwargs, size, subsample_size)
        if self._global_latents:
            self.global_guide = self._make_global_guide()
        self._init_values = self._initial_values(dtype)

    @property
    def _written_model(self):
        """The model as the user wrote it (``self.model`` is it non-centered at the
        ``decentered_sites``)."""
        return self._user_model if self._user_model is not None else self.model

    def _resolve_decenter(self, trace, plate, args, kwargs) -> tuple:
        """The local sites to run non-centered (see ``decenter``)."""
        requested = self.requested_decenter
        if requested is False:
            return ()
        local = {
            n for n, s in trace.items()
            if s["type"] == "sample" and not s["is_observed"]
            and any(f.name == plate for f in s["cond_indep_stack"])
        }
        if requested is True:
            found = _decenter.find_decenterable(self._written_model, args, kwargs, scaled=True)
            return tuple(n for n in found if n in local)
        for n in requested:
            if n not in local:
                raise ValueError(
                    f"UHALocalGuide: decenter names {n!r}, not a latent site of the plate "
                    f"'{plate}' (its latent sites: {sorted(local)})."
                    f"{did_you_mean_site(n, sorted(local))}"
                )
            if _decenter.real_loc_scale(trace[n]["fn"]) is None:
                raise ValueError(
                    f"UHALocalGuide: decenter site {n!r} has a "
                    f"{type(_decenter._unwrap(trace[n]['fn'])).__name__} "
                    "distribution; only loc-scale families of real support "
                    f"({', '.join(f.__name__ for f in _decenter.LOC_SCALE_FAMILIES)}) can be "
                    "non-centered."
                )
            if trace[n].get("mask") is not None:
                raise ValueError(
                    f"UHALocalGuide: decenter site {n!r} is masked; a masked site stays "
                    "as written."
                )
        return tuple(requested)

    def _written_site(self, name) -> str:
        """The model's own site for a local site of the guide: ``z`` for ``z_decentered``."""
        return _decenter.written_name(name, self.decentered_sites)

    def _written(self, values, trace, num_rows):
        """The local sites as the model writes them (``z = loc + scale · z̃`` read from
        ``trace``, the non-centered model's at ``values``) and each row's
        log |dz/dz̃| = Σ log scale."""
        out, log_jacobian = {}, jnp.zeros(num_rows, jnp.result_type(float))
        for n, value in values.items():
            written = self._written_site(n)
            if written == n:
                out[n] = value
                continue
            out[written] = trace[written]["value"]
            log_scale = sum_rightmost(  # over the site's event, then the rows
                trace[n]["infer"][_decenter.LOG_SCALE], trace[n]["fn"].event_dim
            )
            log_jacobian = log_jacobian + self._per_row(log_scale, num_rows)
        return out, log_jacobian

    def _find_plate(self, trace):
        plates = {n: s for n, s in trace.items() if s["type"] == "plate"}
        subsampled = {
            n: s for n, s in plates.items()
            if s["args"][1] is not None and s["args"][1] < s["args"][0]
        }
        if self.subsample_plate is not None:
            if self.subsample_plate not in plates:
                raise ValueError(
                    f"UHALocalGuide: subsample_plate='{self.subsample_plate}' is not a plate "
                    f"of the model; its plates are {sorted(plates)}."
                )
            others = sorted(set(subsampled) - {self.subsample_plate})
            if others:
                raise ValueError(
                    f"UHALocalGuide: the model subsamples plates {others} besides "
                    f"'{self.subsample_plate}'; only one plate may be subsampled."
                )
            chosen = self.subsample_plate
        elif len(subsampled) == 1:
            chosen = next(iter(subsampled))
        elif len(subsampled) > 1:
            raise ValueError(
                f"UHALocalGuide: the model subsamples {len(subsampled)} plates "
                f"{sorted(subsampled)}; only one plate of local latents may be subsampled."
            )
        elif len(plates) == 1:  # full data, one plate: that is the data plate
            chosen = next(iter(plates))
        else:
            raise ValueError(
                "UHALocalGuide: no plate with subsample_size < size found; name the plate of "
                f"local latents with subsample_plate= (the model's plates: {sorted(plates)})."
            )
        size, subsample_size = trace[chosen]["args"][:2]
        if subsample_size is None:
            subsample_size = size
        dims = {
            f.dim for s in trace.values() if s["type"] == "sample"
            for f in s["cond_indep_stack"] if f.name == chosen
        }
        if len(dims) != 1:
            raise ValueError(f"UHALocalGuide: no sample site is inside the plate '{chosen}'.")
        return chosen, size, subsample_size, dims.pop()

    def _check_no_batch_sized_globals(self, trace, global_latents, size, subsample_size):
        """A latent outside the plate that runs over its data points is a mistake."""
        for n in global_latents:
            site = trace[n]
            batch = tuple(site["fn"].batch_shape)
            pos = len(batch) + self._plate_dim
            if pos < 0 or any(f.dim == self._plate_dim for f in site["cond_indep_stack"]):
                continue  # no such axis, or it is another plate's (a vector of globals)
            if subsample_size < size and batch[pos] == subsample_size:
                raise ValueError(
                    f"UHALocalGuide: latent site '{n}' has the minibatch's size "
                    f"({subsample_size}) along the plate's dim ({self._plate_dim}) but is "
                    f"sampled outside the plate '{self._plate_name}': sample local latent "
                    f"variables inside `with numpyro.plate('{self._plate_name}', ...)`."
                )
            if batch[pos] == size and size > 1:
                warnings.warn(
                    f"UHALocalGuide: latent site '{n}' has the plate's size ({size}) along "
                    f"its dim but is sampled outside the plate '{self._plate_name}', so it is "
                    "treated as a global latent (one Gaussian over all of it, no annealing). "
                    "If it is one latent per data point, sample it inside the plate.",
                    UserWarning,
                    stacklevel=4,
                )

    def _check_outside_sites_ignore_locals(self, trace, args, kwargs, sites_in):
        """A clear error where a sample site outside the plate (observed, latent or a
        ``numpyro.factor``) depends on the local latents: each chain targets the density
        of the sites inside the plate only, so such a term would be missing from the
        chains and from :meth:`log_z` (e.g. observations in a second plate indexing the
        group effects, ``y ~ Normal(a[group], ...)``). Found by tracing the model again
        with every local moved (by 0.7 in its unconstrained coordinates) and everything
        else (latents, plates' indices) held: a site outside whose log density changes
        depends on them. Skipped where the values are traced (set up inside a JAX
        transform)."""
        if _is_tracer([trace[n]["value"] for n in self._local_sites]) or _is_tracer((args, kwargs)):
            return
        moved = {}
        for n in self._local_sites:
            transform = biject_to(trace[n]["fn"].support)
            moved[n] = transform(transform.inv(trace[n]["value"]) + 0.7)
        held = {
            n: site["value"] for n, site in trace.items()
            if site["type"] in ("sample", "plate") and n not in moved
            and not (site["type"] == "sample" and site["is_observed"])
        }
        with handlers.block():
            again = handlers.trace(_sampleable(
                handlers.seed(handlers.substitute(self.model, data={**held, **moved}), 0)
            )).get_trace(*args, **kwargs)
        dependent = []
        for n, site in trace.items():
            if site["type"] != "sample" or n in sites_in or n not in again:
                continue
            before = np.asarray(site["fn"].log_prob(site["value"]))
            after = np.asarray(again[n]["fn"].log_prob(again[n]["value"]))
            if before.shape != after.shape or not np.allclose(
                before, after, rtol=1e-6, atol=0.0, equal_nan=True
            ):
                dependent.append(n)
        if dependent:
            raise ValueError(
                f"UHALocalGuide: site(s) {dependent} outside the plate '{self._plate_name}' "
                f"depend on its local latent(s) {self._local_sites}. Each data point's chain "
                "targets the density of the sites inside the plate (its local latents and "
                "observations), so a term outside it would be missing from the chains and "
                "from log_z. Put each data point's observations (and any factor of its "
                "locals) inside the plate, e.g. for grouped data one plate over the groups "
                "whose observed site has the group's observations as its event or a masked "
                "row; or use UHAGuide for the whole model."
            )

    def _check_finite_data(self, trace, idx):
        """A clear error where an observed site of the plate has a NaN or inf value
        (not masked out) for a data point of this minibatch: its chain's target is not
        finite anywhere. Concrete values only (traced ones, inside jit, cannot be)."""
        for n in self._observed_sites:
            site = trace.get(n)
            bad = None if site is None else _nonfinite_observed(site)
            if bad is None or not bad.any():
                continue
            axis = bad.ndim + self._plate_dim
            rows = bad.any(axis=tuple(a for a in range(bad.ndim) if a != axis)) if axis >= 0 \
                else np.ones(1, bool)
            at = np.flatnonzero(rows) if rows.size == np.size(idx) else np.zeros(0, int)
            points = np.asarray(idx)[at]
            more = " ..." if at.size > 10 else ""
            raise ValueError(
                f"UHALocalGuide: the observed site '{n}' has NaN or inf values for data "
                f"point(s) {list(map(int, points[:10]))}{more} of the plate "
                f"'{self._plate_name}' (the minibatch's rows {at[:10].tolist()}{more}, "
                "where the model is passed its minibatch): their log density is not finite at any "
                "latent value. Drop those data points, or replace the values by finite ones "
                "and mask them out (numpyro.handlers.mask or obs_mask)."
            )

    def _check_finite_data_at(self, args, kwargs, idx):
        """:meth:`_check_finite_data` on the model traced at the plate's indices ``idx``
        (concrete), eagerly: also where the guide is being traced (Predictive's
        ``lax.map``, a jit)."""
        with jax.ensure_compile_time_eval(), handlers.block():
            trace = handlers.trace(handlers.seed(handlers.substitute(
                self.model, data={self._plate_name: jnp.asarray(idx)}), 0)).get_trace(
                *args, **kwargs)
        self._check_finite_data(trace, idx)

    def _raise_if_called_on_nonfinite_data(self, arrays, args, kwargs, size):
        """:meth:`_check_finite_data` over every data point, where the guide is called
        (``Predictive``, ``svi.update``, ``svi.run``'s step as it is traced) on concrete
        data (``arrays``, the arguments' array leaves) that are not all finite: the chains
        of those points gave NaN predictions (``Predictive``) or a NaN loss, silently.
        Checked on the host; the model is traced only where some array is not finite."""
        if _nonfinite_concrete_float(arrays):
            self._check_finite_data_at(args, kwargs, np.arange(size))

    def _sizes(self, args, kwargs):
        """The plate's (size, subsample size) in this call (the data may change size).

        Every plate's indices are substituted (the first ones): NumPyro's own subsampling,
        run eagerly, compiles a new program at every call."""
        try:
            with handlers.block():
                trace = handlers.trace(_sampleable(
                    handlers.seed(handlers.substitute(self.model, substitute_fn=_decenter.first_indices), 0)
                )).get_trace(*args, **kwargs)
        except TypeError as error:
            if args or kwargs:
                raise
            raise TypeError(
                "UHALocalGuide: the model could not be run without arguments. Each data "
                "point's chain targets p(x_i, z_i | globals), so the draw methods, median, "
                "quantiles and log_z need the model's arguments (the data), as in "
                "training: e.g. guide.sample_posterior(key, params, *model_args, "
                f"sample_shape=...). The model said: {error}"
            ) from error
        if self._plate_name not in trace:
            raise ValueError(
                f"UHALocalGuide: the model no longer has the plate '{self._plate_name}'."
            )
        unobserved = [
            n for n in self._observed_sites if n not in trace or not trace[n]["is_observed"]
        ]
        if unobserved:
            raise ValueError(
                f"UHALocalGuide: site(s) {unobserved} of the plate '{self._plate_name}' were "
                "observed when the guide was set up but are not observed in this call (obs "
                "None?). Each data point's chain targets p(x_i, z_i), so the guide needs the "
                "observed data to draw the local latents. For posterior predictive draws, "
                "draw with guide.sample_posterior(key, params, <the model's arguments with "
                "the data>, sample_shape=...) and pass them to Predictive(model, "
                "posterior_samples=...) called without the data."
            )
        gone = [
            n for n in [*self._local_sites, *self._global_latents]
            if n not in trace or trace[n]["type"] != "sample" or trace[n]["is_observed"]
        ]
        if gone:
            raise ValueError(
                f"UHALocalGuide: site(s) {gone} are observed (or gone) in this call but "
                "were latent when the guide was set up: its chains and global guide are "
                "over them, and a value passed for them now would be ignored (the draws "
                "and log_z silently those of the model without it). Call the guide with "
                "the arguments it was trained with, or set up and train a new guide with "
                "these."
            )
        size, subsample_size = trace[self._plate_name]["args"][:2]
        return size, size if subsample_size is None else subsample_size

    def _row_axis(self, site):
        """The axis of a site's value that runs over the plate's data points."""
        return self._plate_dim - site["fn"].event_dim

    def _median_values(self, trace, rng_key):
        """Each local site's prior median (from draws; its prototype value if it has
        none), so that q_i starts in the bulk of the prior."""
        values = {}
        for n in self._local_sites:
            fn = trace[n]["fn"]
            try:
                # the median in unconstrained coordinates, mapped back: a coordinate-wise
                # median of constrained draws leaves a support such as the simplex
                transform = biject_to(fn.support)
                values[n] = transform(jnp.median(transform.inv(fn.sample(rng_key, (31,))), axis=0))
            except Exception:  # noqa: BLE001 - a distribution that cannot be sampled
                values[n] = trace[n]["value"]
        return values

    def _hidden_model(self):
        """The model with the plate's sites hidden: the global guide's model, and the
        globals' prior (with any observed site outside the plate) in global_log_z."""
        return _Hidden(self.model, list(self._local_sites) + list(self._observed_sites))

    def _make_global_guide(self):
        hidden = self._hidden_model()
        choice = self._global_guide_arg
        if choice is None:
            return AutoNormal(hidden, prefix=f"{self.prefix}_global")
        if isinstance(choice, type) and issubclass(choice, AutoGuide):
            return choice(hidden, prefix=f"{self.prefix}_global")
        if isinstance(choice, AutoGuide) or not callable(choice):
            return choice
        name = getattr(choice, "__name__", type(choice).__name__)
        advice = (
            f"global_guide={name} is called as a factory, model -> guide (with the model "
            "with the plate's sites hidden); a guide function of the model's arguments "
            f"goes in as global_guide=lambda model: {name}, and must return a dict of "
            "the global latents' values, as AutoGuides do"
        )
        try:
            guide = choice(hidden)
        except TypeError as e:
            raise TypeError(f"UHALocalGuide: {advice}. Calling it raised: {e}") from e
        if not callable(guide):
            raise TypeError(
                f"UHALocalGuide: {advice}. It returned {type(guide).__name__}, not a guide."
            )
        _refuse_uha_global_guide(guide)  # what a factory built
        return guide

    def _initial_values(self, dtype):
        # NumPy constants: concrete even when the setup runs under jax.jit(svi.init)
        # (JAX's constructors would give values of that trace, unusable after it)
        d, K = self.latent_dim, self.K
        dtype = np.dtype(dtype)
        shared = {
            "step_size": np.asarray(self.init_step_size, dtype),
            "step_size_slope": np.zeros((), dtype),
            "damping": np.asarray(self.init_damping, dtype),
            "momentum_scale": np.ones(d, dtype),
            "beta_logits": np.zeros(K + 1, dtype),
            "bridge_loc_slope": np.zeros(d, dtype),
            "bridge_log_scale_slope": np.zeros(d, dtype),
            "drift_scale": np.ones(d, dtype),
        }
        return shared

    def _specs(self):
        return {
            "step_size": constraints.interval(0.0, self.max_step_size),
            "step_size_slope": constraints.real,
            "damping": constraints.interval(0.0, self.max_damping),
            "momentum_scale": (
                constraints.positive if self.min_momentum_scale is None
                else constraints.greater_than(self.min_momentum_scale)
            ),
            "beta_logits": constraints.real,
            "bridge_loc_slope": constraints.real,
            "bridge_log_scale_slope": constraints.real,
            "drift_scale": constraints.positive,
        }

    def _learnable(self, short):
        return not any(short in GROUPS[g] for g in self.frozen)

    def _param(self, short, init, constraint):
        value = numpyro.param(f"{self.prefix}_{short}", init, constraint=constraint)
        check_param_range("UHALocalGuide", f"{self.prefix}_{short}", short, value, constraint)
        return value if self._learnable(short) else jax.lax.stop_gradient(value)

    def _row_param(self, short, init, constraint, idx):
        """A per-data-point parameter, shape ``(N, ...)``, and its minibatch rows ``idx``.

        Indexed here rather than by the plate (``event_dim``), which can subsample a
        parameter only when its data axis lines up with the plate's ``dim``: rows are
        always the leading axis here, wherever the model's plate sits.
        """
        return jnp.take(self._param(short, init, constraint), idx, axis=0)

    # ------------------------------------------------------------- packing
    def _pack(self, unconstrained):
        """Per-site unconstrained values (data axis where the model puts it) → (B, d)."""
        rows = []
        for n, axis, per_row, _, width, _ in self._layout:
            value = jnp.moveaxis(unconstrained[n], axis, 0)
            rows.append(jnp.reshape(value, (value.shape[0], width)))
        return jnp.concatenate(rows, axis=-1)

    def _unpack(self, rows):
        """(B, d) → per-site unconstrained values in the model's shapes."""
        out = {}
        for n, axis, per_row, offset, width, _ in self._layout:
            value = jnp.reshape(rows[:, offset:offset + width], (rows.shape[0],) + per_row)
            out[n] = jnp.moveaxis(value, 0, axis)
        return out

    def _constrain(self, rows, left_out=None, trace=None):
        """(B, d) unconstrained → constrained site values and the rows' log |det J|
        (without the entries ``left_out``, ``{site: bool over its batch shape}``: the
        completed ones, see :meth:`_completion`). Each site's support from ``trace``, the
        model run at the rows (:meth:`_trace_at_rows`), where given: a support may move
        with the data point or a global latent (a censoring bound, ``_supports.py``);
        the setup's otherwise."""
        values, log_det = {}, jnp.zeros(rows.shape[0], rows.dtype)
        for n, u in self._unpack(rows).items():
            site = (self.prototype_trace if trace is None else trace)[n]
            transform = biject_to(site["fn"].support)
            value = transform(u)
            values[n] = value
            ladj = transform.log_abs_det_jacobian(u, value)
            if left_out is not None and n in left_out:
                ladj = jnp.where(left_out[n], 0.0, ladj)
            log_det = log_det + self._per_row(ladj, rows.shape[0])
        return values, log_det

    def _trace_at_rows(self, rows, data, args, kwargs):
        """The model's trace with the local sites at the rows (each mapped through its
        support as the model draws it) and the sites in ``data`` (globals, model
        params, the plate's indices) at those values."""
        return _supports.trace_at_unconstrained(
            self.model, self._unpack(rows), args, kwargs, data=data
        )

    def _bounded_by_values(self) -> tuple:
        """The local sites whose support may move with the data point or a global
        latent (:func:`~numpyro_uha._supports.bounded_by_values`)."""
        return _supports.bounded_by_values(self.prototype_trace, self._local_sites)

    # ------------------------------------------------ masked-out local entries
    def _find_completed_sites(self, trace, args, kwargs, size):
        """The local sites whose entries the model masks out (``obs_mask``'s
        ``"<name>_unobserved"`` where the data are observed, ``handlers.mask``) and
        nothing depends on: every unconstrained coordinate of every masked-out entry of
        the setup's minibatch has an exactly zero gradient at q's initial rows and three
        draws around them. Each chain's target would be flat, hence improper, there (q_i
        widens without end and the bound with it); those entries are completed as in
        ``UHAGuide`` (``numpyro_uha/_masked.py``): a standard normal density on their
        unconstrained coordinates, so log p(x_i) and the other latents' posterior are
        the model's. Which entries is read from each call's masks (:meth:`_completion`)."""
        masked = {n: m for n, m in masked_out_entries(trace).items() if n in self._local_sites}
        if not masked or _is_tracer((args, kwargs)):
            return ()
        idx = trace[self._plate_name]["value"]
        global_values = {n: trace[n]["value"] for n in self._global_latents}
        model_params = {n: s["value"] for n, s in trace.items() if s["type"] == "param"}
        logdensity = self._rows_logdensity(  # their Jacobians out of the probed density
            args, kwargs, global_values, model_params, idx, size, probed=tuple(masked)
        )
        grad = jax.jit(jax.vmap(jax.grad(lambda rows: jnp.sum(logdensity(rows)))))
        start = jnp.broadcast_to(self._init_loc_row, (idx.shape[0], self.latent_dim))
        noise = jax.random.normal(jax.random.PRNGKey(0), (3,) + start.shape, start.dtype)
        probes = jnp.concatenate([start[None], start[None] + noise])
        flat = np.all(np.asarray(grad(probes)) == 0.0, axis=0)
        completed = []
        for n, left_out in masked.items():
            coords = np.asarray(self._entry_rows(n, jnp.asarray(left_out), idx.shape[0]))
            if coords.any() and flat[coords].all():
                completed.append(n)
        return tuple(completed)

    def _entry_rows(self, n, entries, num_rows):
        """A bool over site ``n``'s batch shape → the rows' (B, d) coordinates it covers."""
        out = jnp.zeros((num_rows, self.latent_dim), bool)
        for name, axis, per_row, offset, width, shape in self._layout:
            if name != n:
                continue
            event = len(shape) - jnp.ndim(entries)
            full = _with_axis(shape, axis, num_rows)
            value = jnp.broadcast_to(jnp.reshape(entries, jnp.shape(entries) + (1,) * event), full)
            value = jnp.reshape(jnp.moveaxis(value, axis, 0), (num_rows, width))
            out = out.at[:, offset:offset + width].set(value)
        return out

    def _left_out(self, trace, sites):
        """``{site: bool over its batch shape}``: the entries of ``sites`` (the completed
        ones) that this call's model (``trace``) masks out."""
        out = {}
        for n in sites:
            fn = trace[n]["fn"]
            value = trace[n]["value"]
            batch_shape = jnp.shape(value)[: jnp.ndim(value) - fn.event_dim]
            out[n] = ~jnp.broadcast_to(_batch_mask(fn), batch_shape)
        return out

    def _completion(self, rows, left_out):
        """Σ log N(u; 0, 1) per row over the unconstrained coordinates of the entries
        ``left_out`` (:meth:`_left_out`)."""
        coords = jnp.zeros(rows.shape, bool)
        for n, entries in left_out.items():
            coords = coords | self._entry_rows(n, entries, rows.shape[0])
        return completion_log_density(rows, coords)

    def _completed_parts(self, rows, trace):
        """(log |det J| without the completed entries, their completion density) per row,
        for the guide's factor; the masks from ``trace``, this call's model at the rows."""
        left_out = self._left_out(trace, self._completed_sites)
        return self._constrain(rows, left_out, trace)[1], self._completion(rows, left_out)

    def _per_row(self, log_prob, subsample_size):
        """Sum a site's log density (its batch shape) over all but the data axis → (B,)."""
        axis = self._plate_dim
        shape = _with_axis(jnp.shape(log_prob), axis, subsample_size)
        log_prob = jnp.moveaxis(jnp.broadcast_to(log_prob, shape), axis, 0)
        return jnp.sum(jnp.reshape(log_prob, (subsample_size, -1)), axis=-1)

    # -------------------------------------------------------- log density
    def _rows_logdensity(
        self, args, kwargs, global_values, model_params, idx, size, probed=None
    ):
        """Z (B, d) ↦ (log p(x_i, z_i | globals) + log|det J_i|)_i, one model run for all.

        The completed sites' masked-out entries count with their completion density and
        without their Jacobian; ``probed`` (the setup's flatness probe): these sites'
        masked-out entries without their Jacobian and without a density."""
        completed = getattr(self, "_completed_sites", ()) if probed is None else probed
        plate_name, subsample_size = self._plate_name, idx.shape[0]
        plate_scale = size / subsample_size

        def logdensity(rows):
            data = {**global_values, **model_params, plate_name: idx}
            trace = self._trace_at_rows(rows, data, args, kwargs)
            left_out = self._left_out(trace, completed) if completed else None
            log_det = self._constrain(rows, left_out, trace)[1]
            if completed and probed is None:
                log_det = log_det + self._completion(rows, left_out)
            total = log_det
            for n in self._local_sites + self._observed_sites:
                site = trace[n]
                log_prob = site["fn"].log_prob(site["value"])
                if site.get("mask") is not None:
                    log_prob = jnp.where(site["mask"], log_prob, 0.0)
                if site.get("scale") is not None:
                    # the plate's N/B belongs to the minibatch bound, not to one chain
                    log_prob = log_prob * (site["scale"] / plate_scale)
                    if _decenter.LOG_SCALE in site["infer"]:
                        # z = loc + scale · z̃ under a scale c (handlers.scale): the
                        # model scores c · log p(z), the guide's density carries the
                        # whole Jacobian, so the chain's target needs (1 − c) Σ log scale
                        # beside c · log p(z̃) (as UHAGuide's _UnscaledJacobians)
                        jacobian = sum_rightmost(
                            site["infer"][_decenter.LOG_SCALE], site["fn"].event_dim
                        )
                        if site.get("mask") is not None:
                            jacobian = jnp.where(site["mask"], jacobian, 0.0)
                        log_prob = log_prob + (1.0 - site["scale"] / plate_scale) * jacobian
                total = total + self._per_row(log_prob, subsample_size)
            return total

        return logdensity

    def get_logdensity_fn(self, params, *args, subsample_idx=None, global_values=None, **kwargs):
        """The rows' target ``Z (B, d) ↦ (B,)`` for trained ``params``, the globals fixed
        at ``global_values`` (constrained, by site name), for the data points
        ``subsample_idx`` (default: all, when the model does not subsample)."""
        self._require_setup()
        size, subsample_size = self._sizes(args, kwargs)
        idx = self._subsample(subsample_idx, size, subsample_size, args, kwargs)
        return self._rows_logdensity(
            args, kwargs, self._check_globals(global_values), self._model_params_in(params), idx,
            size,
        )

    def get_annealing_params(self, params, *args, subsample_idx=None, **kwargs):
        """The core's per-row :class:`~numpyro_uha.core.AnnealingParams` (q_i from the
        parameters or the encoder) of the data points ``subsample_idx``: what
        ``core.uha_sample_rows`` runs on with :meth:`get_logdensity_fn`."""
        self._require_setup()
        idx = self._subsample(subsample_idx, *self._sizes(args, kwargs), args, kwargs)

        def body(*args, **kwargs):
            return self._body(args, kwargs, annealing_only=True)

        with handlers.block():
            annealing, _ = handlers.substitute(
                handlers.seed(body, 0), data={**params, self._plate_name: idx}
            )(*args, **kwargs)
        return annealing

    def _model_params_in(self, params):
        return {n: params[n] for n in self._model_param_sites if n in params}

    def _check_globals(self, global_values):
        global_values = {} if global_values is None else dict(global_values)
        missing = sorted(set(self._global_latents) - set(global_values))
        if missing:
            raise ValueError(
                f"UHALocalGuide: global_values lacks the global latent site(s) {missing}."
            )
        for n in self._global_latents:
            expected = jnp.shape(self.prototype_trace[n]["value"])
            if jnp.shape(global_values[n]) != expected:
                raise ValueError(
                    f"UHALocalGuide: global_values['{n}'] must have the site's shape "
                    f"{expected} (a constrained value), got {jnp.shape(global_values[n])}."
                )
        return global_values

    def _subsample(self, subsample_idx, size, subsample_size, args, kwargs):
        plate_name = self._plate_name
        if subsample_idx is None:
            if subsample_size != size:
                if self._indices_unused(args, kwargs, size, subsample_size):
                    return jnp.arange(subsample_size)
                raise ValueError(
                    f"UHALocalGuide: the plate '{plate_name}' subsamples {subsample_size} of "
                    f"{size} data points; pass subsample_idx= (an integer array of length "
                    f"{subsample_size}) to say which. (Only an amortized guide, with an "
                    "encoder and shared annealing parameters, on a model that is passed "
                    "its minibatch rather than indexing its data with the plate, needs none.)"
                )
            return jnp.arange(size)
        idx = jnp.asarray(subsample_idx)
        if idx.shape != (subsample_size,) or not jnp.issubdtype(idx.dtype, jnp.integer):
            raise ValueError(
                f"UHALocalGuide: subsample_idx must be an integer array of shape "
                f"({subsample_size},), got {idx.dtype} {idx.shape}."
            )
        if not isinstance(idx, jax.core.Tracer):  # concrete: checked here (traced: cannot be)
            values = np.asarray(idx)
            if values.size and (values.min() < 0 or values.max() >= size):
                raise ValueError(
                    f"UHALocalGuide: subsample_idx must index the {size} data points of the "
                    f"plate '{plate_name}', in [0, {size}); got values from {values.min()} "
                    f"to {values.max()}."
                )
        return idx

    def _indices_unused(self, args, kwargs, size, subsample_size):
        """Whether the plate's indices change nothing for these arguments: an encoder
        (no per-data-point q) with shared annealing parameters, and a model whose sites
        all have the same values and log densities under two different index sets (a
        model passed its minibatch, as VAEs are written). Then a draw needs no
        ``subsample_idx``."""
        if self.encoder is None or self.per_data_point:
            return False
        # decided on concrete values, also under an outer jit; arguments traced there
        # (the minibatch itself an argument of the jitted function) cannot decide it
        try:
            with jax.ensure_compile_time_eval():
                return self._same_traces(args, kwargs, size, subsample_size)
        except jax.errors.ConcretizationTypeError:
            return False

    def _warn_if_data_ignore_the_indices(self, args, kwargs, size, subsample_size):
        """Per-data-point q_i are picked by the plate's indices, so a model passed a
        minibatch that does not follow them (``model(x_batch, N)`` with the plate's
        indices unused) trains q_i on another data point's data: warn where the plate's
        observed values are the same for two different sets of indices."""
        traces = self._traces_at_two_index_sets(args, kwargs, size, subsample_size)

        def data(site):
            # a numpyro.factor's value is a constant placeholder: its data are in its
            # log density (the locals are the same in both traces: the same key)
            if site.get("infer", {}).get("is_auxiliary", False):
                return site["fn"].log_prob(site["value"])
            return site["value"]

        pairs = {
            n: (data(traces[0][n]), data(traces[1][n])) for n in self._observed_sites
            if n in traces[0] and n in traces[1]
        }
        same = [
            n for n, (a, b) in pairs.items()
            if jnp.shape(a) == jnp.shape(b) and bool(jnp.array_equal(a, b))
        ]
        if same and len(same) == len(self._observed_sites):
            warnings.warn(
                f"UHALocalGuide: the observed site(s) {same} of the plate "
                f"'{self._plate_name}' hold the same values whichever data points the "
                "plate's indices pick, but each data point's q_i (per-data-point "
                "parameters, no encoder) is chosen by those indices: a model passed its "
                "minibatch would train q_i on another data point's data. Index the full "
                f"data by the plate's indices (`with numpyro.plate('{self._plate_name}', N, "
                "subsample_size=B) as idx: ... obs=y[idx]`, or numpyro.subsample), or give "
                "an encoder. (If your data points are identical, this is harmless.)",
                UserWarning,
                stacklevel=4,
            )

    def _traces_at_two_index_sets(self, args, kwargs, size, subsample_size):
        """The model traced with the plate's indices the first ``subsample_size`` and
        the last ones reversed (the same keys otherwise)."""
        first = jnp.arange(subsample_size)
        other = jnp.arange(size - subsample_size, size)[::-1]
        traces = []
        for idx in (first, other):
            with handlers.block():
                traces.append(
                    handlers.trace(_sampleable(
                        handlers.seed(
                            handlers.substitute(self.model, data={self._plate_name: idx}), 0
                        )
                    )).get_trace(*args, **kwargs)
                )
        return traces

    def _same_traces(self, args, kwargs, size, subsample_size):
        traces = self._traces_at_two_index_sets(args, kwargs, size, subsample_size)
        for name, site in traces[0].items():
            if site["type"] != "sample":
                continue
            twin = traces[1].get(name)
            if twin is None:
                return False
            pairs = [(site["value"], twin["value"]),
                     (site["fn"].log_prob(site["value"]), twin["fn"].log_prob(twin["value"]))]
            for a, b in pairs:
                if jnp.shape(a) != jnp.shape(b) or not bool(jnp.array_equal(a, b)):
                    return False
        return True

    def _require_setup(self):
        if self.prototype_trace is None:
            raise RuntimeError(
                "UHALocalGuide has not been initialized: run svi.init(...)/svi.run(...) or "
                "call the guide once with the model's arguments first."
            )

    def _check_params_given(self, params, size, where):
        """A clear error where ``params`` lack the guide's own parameters (an empty or
        wrong dict would run on their initial values) or its per-data-point ones were
        fitted for another number of data points (rows past them would be NaN)."""
        if not isinstance(params, Mapping):
            raise TypeError(
                f"UHALocalGuide.{where}: params must be a dict of parameter values "
                f"(svi.get_params(state) or svi.run(...).params), got {type(params).__name__}."
            )
        own = {f"{self.prefix}_{short}" for short in self._init_values}
        if self.encoder is None:
            own |= {f"{self.prefix}_loc", f"{self.prefix}_scale"}
        missing = sorted(own - set(params))
        if missing:
            raise ValueError(
                f"UHALocalGuide.{where}: params lacks the guide's parameter(s) "
                f"{missing[:6]}{' ...' if len(missing) > 6 else ''}; pass all of them, "
                "svi.get_params(state) or svi.run(...).params (with prefix="
                f"'{self.prefix}')."
            )
        # the model's numpyro.param sites (a decoder) and the encoder's: left out, they
        # would silently take their initial values
        for whose, names in (("model", self._model_param_sites),
                             ("encoder", self._encoder_param_names)):
            missing = sorted(set(names) - set(params))
            if missing:
                raise ValueError(
                    f"UHALocalGuide.{where}: params lacks the {whose}'s parameter(s) "
                    f"{missing[:6]}{' ...' if len(missing) > 6 else ''}, which would take "
                    "their initial values; pass all the fitted parameters, "
                    "svi.get_params(state) or svi.run(...).params."
                )
        specs = self._specs()
        for short in self._init_values:
            name = f"{self.prefix}_{short}"
            if short in specs and not _is_tracer(params[name]):
                check_param_range("UHALocalGuide", name, short, params[name], specs[short])
        if self.encoder is None:
            rows = jnp.shape(params[f"{self.prefix}_loc"])[0]
            if rows != size:
                raise ValueError(
                    f"UHALocalGuide.{where}: the plate '{self._plate_name}' has {size} data "
                    f"points in this call, but the per-data-point parameters "
                    f"({self.prefix}_loc) were fitted for {rows}: data points past those "
                    "have no q_i. Pass the data the guide was fitted to (an encoder, "
                    "encoder=..., is what generalizes to new data points)."
                )

    # ----------------------------------------------------------------- guide
    def _annealing(self, values, loc, scale):
        """The core's per-row parameters from the registered values."""
        betas = betas_from_logits(values["beta_logits"])
        step = values["step_size"]
        slope = values["step_size_slope"]
        step_sizes = step_sizes_from_beta(
            betas, jnp.expand_dims(step, -1), jnp.expand_dims(slope, -1), self.max_step_size
        )
        return AnnealingParams(
            loc=loc,
            scale=scale,
            betas=betas,
            step_sizes=step_sizes,
            damping=values["damping"],
            # preconditioned: Σ relative to q_i's sds, i.e. the dynamics of data point i
            # in q_i's standardized coordinates (z - μ_i) / σ_i
            momentum_scale=(
                values["momentum_scale"] / scale if self.precondition
                else values["momentum_scale"]
            ),
            bridge_loc_slope=values["bridge_loc_slope"],
            bridge_log_scale_slope=values["bridge_log_scale_slope"],
            drift_scale=values["drift_scale"],
        )

    def _encoder_input(self, args, kwargs, global_values, model_params, idx):
        plate_name = self._plate_name
        data = {**global_values, **model_params, plate_name: idx}
        with handlers.block():
            trace = handlers.trace(_sampleable(
                handlers.seed(handlers.substitute(self.model, data=data), 0)
            )).get_trace(*args, **kwargs)
        observed = {  # the data: not a numpyro.factor's (auxiliary) site
            n: trace[n]["value"] for n in self._observed_sites
            if not trace[n].get("infer", {}).get("is_auxiliary", False)
        }
        if len(observed) == 1:
            return next(iter(observed.values()))
        return observed

    def _local_widths(self) -> str:
        """"'z' 2, 'x_unobserved' 4": each local site's unconstrained coordinates per
        data point, in the model's order (for the encoder's errors)."""
        return ", ".join(f"'{n}' {width}" for n, _, _, _, width, _ in self._layout)

    def _q(self, args, kwargs, global_values, model_params, idx, size):
        subsample_size = idx.shape[0]
        d = self.latent_dim
        if self.encoder is None:
            # lazy initial values: under jax.jit(svi.init) the setup's start is a value
            # of that trace, usable only while it runs (where the parameters are created)
            loc = self._row_param(
                "loc", lambda _: jnp.broadcast_to(self._init_loc_row, (size, d)),
                constraints.real, idx,
            )
            scale = self._row_param(
                "scale", lambda _: jnp.full((size, d), self.init_scale, self._init_loc_row.dtype),
                constraints.softplus_positive, idx,
            )
            return loc, scale
        inputs = self._encoder_input(args, kwargs, global_values, model_params, idx)
        with handlers.trace() as encoder_trace:
            out = self.encoder(inputs)
        names = {n for n, site in encoder_trace.items() if site["type"] == "param"}
        if not names <= set(self._encoder_param_names):  # recorded for _check_params_given
            self._encoder_param_names = tuple(sorted(names | set(self._encoder_param_names)))
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(
                "UHALocalGuide: the encoder must return a pair (loc, scale), each of shape "
                f"({subsample_size}, {d}) (unconstrained local coordinates per data point: "
                f"{self._local_widths()}), got {type(out).__name__}"
                f"{f' of length {len(out)}' if isinstance(out, (tuple, list)) else ''}."
            )
        loc, scale = jnp.asarray(out[0]), jnp.asarray(out[1])
        if loc.shape != (subsample_size, d) or scale.shape != (subsample_size, d):
            raise ValueError(
                f"UHALocalGuide: the encoder must return loc and scale of shape "
                f"({subsample_size}, {d}) (data points in the minibatch, unconstrained local "
                f"coordinates per data point, in the model's order: {self._local_widths()}), got "
                f"{loc.shape} and {scale.shape}."
            )
        if not isinstance(scale, jax.core.Tracer) and not isinstance(loc, jax.core.Tracer):
            # concrete (svi.init, a draw outside jit): checked here
            bad_scale = ~(np.asarray(scale) > 0) | ~np.isfinite(np.asarray(scale))
            bad_loc = ~np.isfinite(np.asarray(loc))
            if bad_scale.any() or bad_loc.any():
                rows = np.flatnonzero(bad_scale.any(-1) | bad_loc.any(-1))
                raise ValueError(
                    "UHALocalGuide: the encoder must return a finite loc and a positive, "
                    f"finite scale; got {int(bad_loc.sum())} non-finite loc and "
                    f"{int(bad_scale.sum())} non-positive or non-finite scale entries, in "
                    f"the minibatch's rows {rows[:10].tolist()}"
                    f"{' ...' if rows.size > 10 else ''} (a scale from e.g. softplus or exp "
                    "is positive; non-finite outputs often come from non-finite data)."
                )
        return loc, scale

    def _body(
        self, args, kwargs, corrected=False, annealing_only=False, skip_diverged=False,
        fixed_globals=None,
    ):
        """The guide: global guide, then every data point's chain inside the plate.

        Returns the latent values (constrained, by site name) and the rows' log weights.
        ``skip_diverged`` (the guide as SVI and ``Predictive`` call it, not the draw
        methods): a diverged chain is skipped (see :meth:`_chain_impl`).
        """
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
        if fixed_globals is not None:  # the chains given these globals (log p(x_i | θ))
            global_values = dict(fixed_globals)
        else:
            global_values = self.global_guide(*args, **kwargs) if self.global_guide else {}
            if not isinstance(global_values, dict) or any(
                n not in global_values for n in self._global_latents
            ):
                got = (sorted(global_values) if isinstance(global_values, dict)
                       else type(global_values).__name__)
                raise TypeError(
                    "UHALocalGuide: the global guide must return a dict of every global "
                    f"latent site's value ({list(self._global_latents)}), as AutoGuides "
                    f"do; it returned {got}. A hand-written guide: end it with "
                    "return {'name': value, ...}."
                )
        global_values = {n: global_values[n] for n in self._global_latents}
        model_params = {
            n: numpyro.param(n, s["value"], **s["kwargs"])
            for n, s in self._model_param_sites.items()
        }
        plate_name = self._plate_name
        size, subsample_size = self._sizes(args, kwargs)
        arrays, spec = _split_static((args, kwargs), self._hold_data)
        if skip_diverged:  # SVI, Predictive (the draw methods check their own minibatch)
            self._raise_if_called_on_nonfinite_data(arrays, args, kwargs, size)
        specs = self._specs()
        values = {}
        if not self.per_data_point:
            values = {s: self._param(s, v, specs[s]) for s, v in self._init_values.items()}
        latch = None
        if skip_diverged:
            latch = numpyro.param(
                f"{self.prefix}_diverged", jnp.zeros((), jnp.result_type(float)),
                constraint=self._latch_constraint,
            )
            check_latch(
                latch, self._divergence, "when the guide was called with its params",
                reset_if_clear=True,
            )
        rng_key = numpyro.prng_key()
        if rng_key is None:
            raise RuntimeError(
                "UHALocalGuide needs a random key: run it under numpyro.handlers.seed (SVI, "
                "Predictive and sample_posterior do this for you)."
            )
        with numpyro.plate(
            plate_name, size, subsample_size=subsample_size, dim=self._plate_dim
        ) as idx:
            if self.per_data_point:
                values = {
                    s: self._row_param(s, jnp.broadcast_to(v, (size,) + v.shape), specs[s], idx)
                    for s, v in self._init_values.items()
                }
            loc, scale = self._q(args, kwargs, global_values, model_params, idx, size)
            annealing = self._annealing(values, loc, scale)
            if annealing_only:
                return annealing, idx
            keys = jax.random.split(rng_key, subsample_size)
            # one compiled program per argument structure: run op by op (svi.init,
            # Predictive), the chain's hundreds of operations would each be compiled
            rows, log_weight, info, local_values, log_det, is_diverged = _jit_once(
                self._jitted, self._chain_impl, spec, size=size, corrected=corrected,
                skip_diverged=skip_diverged,
            )(keys, annealing, global_values, model_params, idx, arrays)
            # Trace_ELBO adds log p(x_i, z_i | θ) from the model's trace (scaled N/B by the
            # plate, like this factor); the factor is the rest of chain i's augmented
            # proposal density (in constrained space: minus the Jacobian), so the
            # per-point ELBO is exactly its UHA log weight.
            factor = info.log_q_initial - jnp.sum(info.log_weight_increments, axis=-1) - log_det
            if is_diverged is not None:
                # no gradient from a diverged chain; its value stays (the loss shows it).
                # Its q_i gets the gradient of its own ELBO term at the chain's start
                # (log p(x_i, z_1) − log q_i(z_1), z_1 its end here): a q_i far from its
                # posterior, whose chain diverges for that reason, moves toward it
                # instead of staying where no gradient reaches it
                start = info.log_q_initial - log_det
                fallback = start - jax.lax.stop_gradient(start)
                factor = jnp.where(is_diverged, jax.lax.stop_gradient(factor) + fallback, factor)
                # the latch's loss gradient is (N/B) × the number of diverged chains
                factor = factor + latch * is_diverged.astype(factor.dtype)
                # a diverged chain's leapfrog step backs off (value 0, loss gradient +1 in
                # its log per-coordinate step): otherwise, with no gradient from it,
                # per-data-point parameters that drifted to a diverging step stay there
                factor = factor + _step_backoff(values) * is_diverged.astype(factor.dtype)
            # the data points along the plate's dim, as the model's sites have them
            factor = jnp.reshape(factor, (subsample_size,) + (1,) * (-self._plate_dim - 1))
            _guide_factor(f"_{self.prefix}_uha_factor", factor)
            for n in self._local_sites:
                event_dim = self.prototype_trace[n]["fn"].event_dim
                written = self._written_site(n)
                numpyro.sample(written, dist.Delta(local_values[written], event_dim=event_dim))
        if is_diverged is None:  # the draw methods: which chains diverged (uncorrected only:
            # a corrected chain rejects a step with a large energy error, its draw is valid)
            is_diverged = (
                ~jnp.isfinite(log_weight) if corrected
                else chain_diverged(log_weight, info)
            )
        return {**global_values, **local_values}, log_weight, is_diverged

    def __call__(self, *args, **kwargs):
        return self._body(args, kwargs, skip_diverged=True)[0]

    def _chain_impl(
        self, keys, annealing, global_values, model_params, idx, arrays, *, spec, size, corrected,
        skip_diverged=False,
    ):
        """Every data point's chain (and the constrained end points) for given inputs.

        ``skip_diverged``: as ``UHAGuide`` skips a diverged particle. A chain whose log
        weight is not finite, or with a leapfrog step whose energy error exceeds
        ``DIVERGENCE_ENERGY`` nats (``_divergence.diverged``), has weight 0 in the limit
        while its gradient, through Jacobians grown exponentially along the trajectory,
        can be 1e16 or NaN and would swamp Adam's moment estimates. Such a chain's end is
        replaced by its start z_1 ~ q_i (so the model scores a finite point, and q_i gets
        the gradient of its plain ELBO term there, see :meth:`_body`), no gradient flows
        back through the chain, and a gradient still not finite at the chain's inputs
        (NaN through the leapfrog's own derivatives) is zeroed (``_divergence.gate``): that
        step is skipped for the chains' parameters. The loss keeps the diverged chain's value, so it shows.
        Returns ``diverged`` (per data point), ``None`` without ``skip_diverged``.
        """
        args, kwargs = _merge_static(arrays, spec)
        if skip_diverged:
            annealing, global_values, model_params = gate(
                (annealing, global_values, model_params), jnp.asarray(False)
            )
        logdensity = self._rows_logdensity(args, kwargs, global_values, model_params, idx, size)
        rows_sharding = self.sharding
        if rows_sharding is not None and keys.shape[0] % num_shards(rows_sharding):
            rows_sharding = None  # an uneven minibatch runs unconstrained
        if rows_sharding is not None:
            # the data points' chains split over the devices (XLA partitions the model's
            # evaluation on the minibatch accordingly); per-row parameters with them
            num_rows = keys.shape[0]
            keys = shard_leading(keys, rows_sharding)
            annealing = jax.tree.map(
                lambda a: shard_leading(a, rows_sharding)
                if jnp.ndim(a) >= 1 and jnp.shape(a)[0] == num_rows else a,
                annealing,
            )
        if corrected:
            rows, log_weight, info = hais_sample_rows(
                keys, logdensity, annealing, num_leapfrog_steps=self.num_leapfrog_steps,
                integrator=self.integrator,
            )
        else:
            rows, log_weight, info = uha_sample_rows(
                keys, logdensity, annealing, num_leapfrog_steps=self.num_leapfrog_steps,
                integrator=self.integrator, remat=self.remat,
                deferred_diagnostics=not self.remat,  # (the K positions kept: not with remat)
            )
        if rows_sharding is not None:
            rows, log_weight = shard_leading((rows, log_weight), rows_sharding)
        is_diverged = None
        if skip_diverged:
            is_diverged = chain_diverged(log_weight, info)
            rows = jnp.where(is_diverged[:, None], info.initial_position, rows)
        completed = getattr(self, "_completed_sites", ())
        trace = None
        if completed or self.decentered_sites or self._bounded_by_values():
            # one trace of the model at the chains' ends
            data = {**global_values, **model_params, self._plate_name: idx}
            trace = self._trace_at_rows(rows, data, args, kwargs)
        local_values, log_det = self._constrain(rows, trace=trace)
        if completed:
            # the model's trace leaves the completed entries out: the factor carries
            # their density and not their Jacobian, so each point's ELBO is its weight
            log_det, completion = self._completed_parts(rows, trace)
            log_det = log_det + completion
        if self.decentered_sites:
            # the model's own z: the guide's density of z is that of z̃ over |dz/dz̃|
            local_values, log_jacobian = self._written(local_values, trace, idx.shape[0])
            log_det = log_det + log_jacobian
        return rows, log_weight, info, local_values, log_det, is_diverged

    # ------------------------------------------------------------ sampling
    def sample_posterior(
        self, rng_key, params, *args, sample_shape=(), subsample_idx=None, **kwargs
    ):
        """Draws of every latent site (constrained) for the data points ``subsample_idx``.

        Each draw runs the global guide and every data point's chain afresh. Without a
        subsampled plate (``subsample_size`` equal to the plate's size) ``subsample_idx``
        may be left out: all data points. It may also be left out for an amortized guide
        (an encoder, shared annealing parameters) on a model passed its minibatch, as
        VAEs are written: the plate's indices then change nothing, which is checked on
        the arguments (it cannot be where they are traced, inside a jitted function).
        """
        check_model_keywords(self._written_model, kwargs, self.sample_posterior)
        draws, _, flags = self._draws(
            rng_key, params, args, kwargs, sample_shape, subsample_idx, with_diverged=True
        )
        if not isinstance(flags, jax.core.Tracer) and bool(np.any(flags)):
            flags = np.reshape(np.asarray(flags), (-1, np.shape(flags)[-1]))
            idx = self._subsample(subsample_idx, *self._sizes(args, kwargs), args, kwargs)
            points = np.asarray(idx)[np.flatnonzero(flags.any(0))]
            warnings.warn(
                f"UHALocalGuide.sample_posterior: {int(flags.sum())} of the {flags.size} "
                f"chains (draws × data points) diverged (a log weight that is not finite, or "
                f"a leapfrog step's energy error over {DIVERGENCE_ENERGY:g} nats), at data "
                f"point(s) {points[:10].tolist()}{' ...' if points.size > 10 else ''}: their "
                "draws are the diverged chains' end points, not draws from the posterior. "
                + (
                    "With per_data_point=True, training on seldom brings such a data point "
                    "back (its own step gets only a small back-off gradient, which Adam "
                    "scales down by the larger gradients it had before): retrain with "
                    "precondition=True (steps in q_i's units), a smaller learning rate or "
                    "max_step_size, or min_momentum_scale."
                    if self.per_data_point else
                    "Train longer or with a smaller max_step_size (these data points' "
                    "posteriors may be far narrower than the others', see precondition=True)."
                ),
                UHADivergenceWarning,
                stacklevel=2,
            )
        return draws

    def median(self, params, *args, num_samples=1000, rng_key=None, subsample_idx=None, **kwargs):
        """Monte Carlo median of every latent site (the global ones and those of the data
        points ``subsample_idx``) from ``num_samples`` draws of :meth:`sample_posterior`
        (seeded with ``rng_key``, default ``PRNGKey(0)``), elementwise and unweighted.
        Unlike NumPyro's ``AutoGuide.median(params)``, it needs the model's arguments:
        each data point's chain targets p(x_i, z_i)."""
        check_model_keywords(self._written_model, kwargs, self.median)
        draws = self._mc_draws(params, args, kwargs, num_samples, rng_key, subsample_idx)
        return {name: _draws_quantile(value, 0.5) for name, value in draws.items()}

    def quantiles(
        self, params, quantiles, *args, num_samples=1000, rng_key=None, subsample_idx=None,
        **kwargs,
    ):
        """Monte Carlo quantiles of every latent site, as :meth:`median`: per site, an
        array with a leading dimension of ``len(quantiles)``."""
        check_model_keywords(self._written_model, kwargs, self.quantiles)
        q = jnp.asarray(quantiles)
        draws = self._mc_draws(params, args, kwargs, num_samples, rng_key, subsample_idx)
        return {name: _draws_quantile(value, q) for name, value in draws.items()}

    def _mc_draws(self, params, args, kwargs, num_samples, rng_key, subsample_idx):
        _check_int("num_samples", num_samples, 1)
        rng_key = jax.random.PRNGKey(0) if rng_key is None else rng_key
        return self.sample_posterior(
            rng_key, params, *args, sample_shape=(num_samples,), subsample_idx=subsample_idx,
            **kwargs,
        )

    def log_weights(
        self, rng_key, params, *args, num_samples=1000, subsample_idx=None, corrected=False,
        global_values=None, **kwargs,
    ):
        """Per-draw, per-data-point log weights ``(num_samples, B)`` (UHA, or Hamiltonian
        AIS with ``corrected=True``), each data point's chain given the draw's globals,
        or given ``global_values`` (constrained values of every global latent site, by
        name) where passed: then E[w_i] = p(x_i | globals)."""
        check_model_keywords(self._written_model, kwargs, self.log_weights)
        _check_int("num_samples", num_samples, 1)
        _, log_w = self._draws(
            rng_key, params, args, kwargs, (num_samples,), subsample_idx, corrected=corrected,
            fixed_globals=None if global_values is None else self._check_globals(global_values),
        )
        return log_w

    def log_z(
        self, rng_key, params, *args, num_samples=1000, subsample_idx=None, corrected=False,
        global_values=None, **kwargs,
    ) -> LocalLogZ:
        """log p(x_i) per data point and summed, with standard errors (:class:`LocalLogZ`).

        ``num_samples`` chains per data point give its ELBO (mean log w_i, a lower bound)
        and its importance-weighted estimate log mean w_i (E[w_i] = p(x_i) for every
        parameter value: a consistent, lower-biased estimate of log p(x_i)), as
        :func:`~numpyro_uha.evaluation.log_z_from_weights` computes them (a diverged draw
        is a zero weight, counted). With ``corrected=True`` the chains are Hamiltonian AIS.
        For models without global latents (a VAE's test log-likelihood) this is
        log p(x_i); with global latents it is log p(x_i | globals) at the
        ``global_values`` passed (constrained, every global site by name; required).
        """
        check_model_keywords(self._written_model, kwargs, self.log_z)
        _check_int("num_samples", num_samples, 2)  # a mean and its standard error
        if self._global_latents and global_values is None:
            raise ValueError(
                "UHALocalGuide.log_z: the model has global latent sites "
                f"{self._global_latents}; per-data-point log Z is log p(x_i | globals): "
                "pass global_values={site: value} (e.g. posterior means from "
                "sample_posterior) to fix them."
            )
        log_w = self.log_weights(
            rng_key, params, *args, num_samples=num_samples, subsample_idx=subsample_idx,
            corrected=corrected, global_values=global_values, **kwargs,
        )
        log_w = np.asarray(log_w, np.float64)
        from numpyro_uha.evaluation.logz import log_z_columns

        column = log_z_columns(log_w, self.K)
        iw, iw_se, elbo, elbo_se = column["iw"], column["iw_se"], column["elbo"], column["elbo_se"]
        # (log_z_columns raised above where fewer than two weights of a point are
        # finite; NaN is a zero weight there, -inf here)
        nan = np.isnan(log_w)
        khat = psis_khat_columns(np.where(nan, -np.inf, log_w) if nan.any() else log_w)
        # the data points' indices (log_weights checked subsample_idx; without it, the
        # chains are those of the first B data points, as _subsample gives)
        idx = np.arange(log_w.shape[1]) if subsample_idx is None else np.asarray(subsample_idx)
        num_samples = log_w.shape[0]
        heavy = khat_counts(
            khat, num_samples - column["num_nonfinite"], num_samples, column["spread"]
        )
        _warn_if_points_fit_poorly(
            heavy, column["num_nonfinite"], log_w.shape[0], idx, self.per_data_point,
            column["ess"],
        )
        return LocalLogZ(
            log_z=iw,
            se=iw_se,
            total=float(iw.sum()),
            total_se=float(np.sqrt(np.sum(iw_se**2))),
            elbo=elbo,
            elbo_se=elbo_se,
            total_elbo=float(elbo.sum()),
            total_elbo_se=float(np.sqrt(np.sum(elbo_se**2))),
            ess=column["ess"],
            num_nonfinite=column["num_nonfinite"].astype(int),
            num_samples=int(log_w.shape[0]),
            pareto_khat=khat,
        )

    def global_log_z(
        self, rng_key, params, *args, num_draws=4000, num_samples=64, corrected=False,
        **kwargs,
    ) -> GlobalLogZ:
        """log p(x) of all the data, and whether the global guide fits the globals'
        posterior (:class:`GlobalLogZ`).

        ``num_draws`` draws θ_s of the global guide, each weighted by the globals' prior
        (and any observed site outside the plate) times, for *every* data point of the
        plate, the mean of ``num_samples`` of its chains' weights given θ_s (an unbiased
        estimate of p(x_i | θ_s)), over the global guide's density. The weights' mean
        estimates p(x); their Pareto k̂ says whether q(θ) covers the globals' posterior
        p(θ | x). The locally enhanced bound trained by SVI can fit q(θ) badly where
        the data say little about each data point's local latents (a centered
        hierarchy's group scale several times too small), and nothing else shows it;
        this warns (:class:`~numpyro_uha.UHAFitWarning`) where k̂ ≥ 0.7 or fewer than
        5 % of the draws are effective (``ESS_FRACTION_BAD``).

        Pass the model's arguments as in training: the data points are visited in
        minibatches of the plate's subsample size (the whole plate, whatever
        ``subsample_idx`` training used). Every draw θ_s uses the same chains' random
        numbers at a data point (common random numbers), so the chains' noise, summed
        over many data points, shifts all draws' weights alike instead of swamping
        their differences; each w_s stays unbiased, and so does their mean.

        Cost: ``num_draws × num_samples`` chains per data point (the defaults: 256 000),
        run ``DRAW_ROWS`` at a time: 1.4–18 s a call on 60–500 data points on 2 CPU
        cores (``benchmarks.global_khat``). ``corrected=True`` runs Hamiltonian AIS
        chains. The default of 64 chains (not fewer) is for the check where the guide is
        far off: each p̂(x_i | θ) is estimated by chains fitted at the guide's θ, poorly
        far from it (measured: a scale twice the posterior's warned on 4 of 4 keys with
        64 chains, 2 of 4 with 16), and for log p(x)'s bias (about −se²/2: −0.45 nats
        with 16 chains, +0.02 with 64 on a 60-group hierarchy); docs/how-to/local-latents.md.
        """
        from numpyro_uha.evaluation.logz import log_z_from_weights

        check_model_keywords(self._written_model, kwargs, self.global_log_z)
        _check_int("num_draws", num_draws, 2)  # a mean and its standard error
        _check_int("num_samples", num_samples, 2)  # the chains' variance at a data point
        self._require_setup()
        if not self._global_latents:
            raise ValueError(
                "UHALocalGuide.global_log_z: the model has no global latent sites; "
                "log p(x) is the sum over data points of log_z(...).log_z (its total "
                "over minibatches that cover the data)."
            )
        if _is_tracer(rng_key) or any(_is_tracer(x) for x in jax.tree.leaves(params)):
            raise TypeError(
                "UHALocalGuide.global_log_z returns host numbers (NumPy and float): call "
                "it outside jax.jit and jax.vmap."
            )
        size, batch = self._sizes(args, kwargs)
        self._check_params_given(params, size, "global_log_z")
        if batch != size and self._indices_unused(args, kwargs, size, batch):
            raise ValueError(
                "UHALocalGuide.global_log_z: the model is passed its minibatch (the "
                f"plate '{self._plate_name}' indices change nothing), so the other data "
                "points cannot be visited: call it with the whole data set and the "
                f"plate's full size ({size}) as the minibatch size."
            )
        arrays, spec = _split_static((args, kwargs), self._hold_data)
        key_globals, key_chains = jax.random.split(rng_key)
        globals_program = _jit_once(self._jitted, self._globals_impl, spec)
        log_q, log_prior, samples = globals_program(
            jax.random.split(key_globals, num_draws), params, arrays
        )
        host_samples = {n: np.asarray(v) for n, v in samples.items()}
        fixed = [n for n, v in host_samples.items() if v.size and np.all(v == v[:1])]
        if fixed:
            raise ValueError(
                f"UHALocalGuide.global_log_z: the global guide gave every draw the same "
                f"value of {fixed}: a point mass (AutoDelta; AutoLaplaceApproximation "
                "during training), which has no density to weigh its draws by, so "
                "neither log p(x) nor the check can be computed. Fit the globals with "
                "a guide that has a density (AutoNormal, the default; "
                "AutoMultivariateNormal) for this."
            )
        # the chains, in blocks of draws × data points (one program whatever num_draws
        # and the number of minibatches: the last block of each is padded and dropped)
        width = max(1, min(num_draws, DRAW_ROWS // (num_samples * batch)))
        num_blocks = -(-num_draws // width)
        padded = jax.tree.map(
            lambda x: jnp.concatenate(
                [x, jnp.repeat(x[:1], num_blocks * width - num_draws, axis=0)]
            ),
            samples,
        )
        chains = _jit_once(
            self._jitted, self._global_chains_impl, spec, num=num_samples,
            corrected=corrected, rows=batch,
        )
        log_likelihood = np.zeros(num_draws)
        chains_var = np.zeros(num_draws)  # Σ_i var(log p̂(x_i | θ_s))
        for start in range(0, size, batch):
            idx = np.arange(start, start + batch)
            real = idx < size
            idx = jnp.asarray(np.where(real, idx, 0), jnp.int32)
            # independent between data points (the weights' product stays unbiased),
            # common to the draws θ_s
            keys = jax.random.split(jax.random.fold_in(key_chains, start), num_samples)
            for b in range(num_blocks):
                block = jax.tree.map(lambda x: x[b * width:(b + 1) * width], padded)
                per_point, var = chains(keys, params, idx, arrays, block)
                n = min(width, num_draws - b * width)
                at = slice(b * width, b * width + n)
                log_likelihood[at] += np.asarray(per_point, np.float64)[:n, real].sum(axis=1)
                chains_var[at] += np.asarray(var, np.float64)[:n, real].sum(axis=1)
        log_w = np.asarray(log_prior, np.float64) + log_likelihood - np.asarray(log_q, np.float64)
        log_w = np.where(np.isnan(log_w), -np.inf, log_w)
        estimate = log_z_from_weights(log_w)
        khat = psis_khat(log_w)
        # the chains' noise is common to the draws: it shifts log_z by about its sd,
        # which the spread of the weights between draws cannot show
        normalized = np.exp(log_w - np.max(log_w))
        normalized /= normalized.sum()
        chains_se = float(np.sqrt(np.sum(normalized * np.nan_to_num(chains_var, nan=0.0))))
        _warn_if_globals_missed(khat, estimate.ess, num_draws, log_w)
        return GlobalLogZ(
            log_z=estimate.iw,
            se=float(np.hypot(estimate.iw_se, chains_se)),
            chains_se=chains_se,
            elbo=estimate.elbo,
            elbo_se=estimate.elbo_se,
            ess=estimate.ess,
            pareto_khat=float(khat),
            samples=host_samples,
            log_weights=log_w,
            num_samples=num_samples,
        )

    def _globals_impl(self, keys, params, arrays, *, spec):
        """Draws of the global guide: (log q(θ_s), log prior of θ_s with the observed
        sites outside the plate, θ_s by site name) for every key."""
        args, kwargs = _merge_static(arrays, spec)
        hidden = self._hidden_model()

        def one(key):
            key_guide, key_model = jax.random.split(key)
            log_q, trace = log_density(
                handlers.seed(self.global_guide, key_guide), args, kwargs, params
            )
            unset = sorted(n for n, site in trace.items()
                           if site["type"] == "param" and n not in params)
            if unset:
                raise ValueError(
                    "UHALocalGuide.global_log_z: params lacks the global guide's "
                    f"parameter(s) {unset[:6]}; pass all of them, svi.get_params(state) or "
                    "svi.run(...).params."
                )
            theta = {n: trace[n]["value"] for n in self._global_latents}
            # the hidden model draws its (blocked) local sites: a key, unused by the density
            log_prior, _ = log_density(
                handlers.seed(hidden, key_model), args, kwargs, {**params, **theta}
            )
            return log_q, log_prior, theta

        return jax.lax.map(one, keys)

    def _global_chains_impl(
        self, keys, params, idx, arrays, thetas, *, spec, num, corrected, rows
    ):
        """log of the mean of ``num`` chains' weights at each data point ``idx``, given
        each θ of ``thetas`` (the same keys for every θ), and its delta-method variance:
        each of shape ``(draws, rows)``."""

        def per_theta(theta):
            log_w = self._draws_impl(
                keys, params, idx, arrays, theta, spec=spec, num=num, chunk=num,
                corrected=corrected, rows=rows,
            )[1]
            log_w = jnp.where(jnp.isnan(log_w), -jnp.inf, log_w)  # diverged: w = 0
            log_sum = jax.scipy.special.logsumexp(log_w, axis=0)
            # the delta-method variance of log mean w, var(w) / (num mean(w)²), from
            # Σw² / (Σw)² (in [1/num, 1]); NaN where every chain diverged
            ratio = jnp.exp(jax.scipy.special.logsumexp(2 * log_w, axis=0) - 2 * log_sum)
            return log_sum - jnp.log(num), (num * ratio - 1) / (num - 1)

        return jax.vmap(per_theta)(thetas)  # thetas × num × rows ≤ DRAW_ROWS chains

    def _draws(
        self, rng_key, params, args, kwargs, sample_shape, subsample_idx, corrected=False,
        fixed_globals=None, with_diverged=False,
    ):
        """``(draws, log_w)`` with leading ``sample_shape`` (and the chains' divergence
        flags, shape ``sample_shape + (B,)``, third, ``with_diverged``)."""
        self._require_setup()
        size, subsample_size = self._sizes(args, kwargs)
        self._check_params_given(params, size, "sample_posterior/log_weights/log_z")
        idx = self._subsample(subsample_idx, size, subsample_size, args, kwargs)
        sample_shape = _sample_shape(sample_shape, "UHALocalGuide")
        num = max(int(np.prod(sample_shape, dtype=int)), 1)
        arrays, spec = _split_static((args, kwargs), self._hold_data)
        rows = idx.shape[0]
        cap = max(1, DRAW_ROWS // max(rows, 1))  # chains (draws × data points) at once
        program = partial(
            _jit_once, self._jitted, self._draws_impl, spec, corrected=corrected, rows=rows
        )
        if _chunkable(rng_key, num, (params, idx, fixed_globals), arrays):
            # Concrete: the draws run in chunks of a fixed width (2^k or 3 · 2^(k-1), at
            # least 64, at most `cap`), one compiled program per width, so another
            # sample_shape or num_samples reuses it; the last chunk is padded with extra
            # keys, computed and dropped. Key i is split's key i whatever the width. A
            # wider width already compiled (up to REUSE_WIDTH_RATIO times) is reused.
            width = reuse_width(
                self, ("draws", spec, corrected, rows,
                       signature_of((params, idx, arrays, fixed_globals))),
                min(cap, _chunk_bucket(num)), cap,
            )
            num_chunks = -(-num // width)
            keys = _draw_keys(rng_key, num, num_chunks * width)
            draw = program(num=width, chunk=width)
            chunks = [
                draw(keys if num_chunks == 1 else _key_chunk(keys, i * width, width),
                     params, idx, arrays, fixed_globals)
                for i in range(num_chunks)
            ]
            out = chunks[0] if num_chunks * width == num else _join(chunks, num)
        else:
            # Traced (under an outer jit or vmap): one program for this count, in chunks
            # of at most `cap` chains by lax.map
            keys = jax.random.split(rng_key, num)
            out = program(num=num, chunk=min(num, cap))(keys, params, idx, arrays, fixed_globals)
        log_w = out[1]
        if not isinstance(log_w, jax.core.Tracer) and not np.all(np.isfinite(np.asarray(log_w))):
            # a weight that is not finite: name non-finite data, if that is the cause
            self._check_finite_data_at(args, kwargs, idx)
        if not sample_shape:
            out = jax.tree.map(lambda x: x[0], out)
        else:
            # a zero in sample_shape: one draw was run (for the shapes), none is returned
            empty = 0 in sample_shape
            out = jax.tree.map(
                lambda x: jnp.reshape(x[:0] if empty else x, sample_shape + x.shape[1:]), out
            )
        return out if with_diverged else out[:2]

    def _draws_impl(
        self, keys, params, idx, arrays, fixed_globals, *, spec, num, chunk, corrected, rows
    ):
        args, kwargs = _merge_static(arrays, spec)

        def body(*args, **kwargs):
            return self._body(args, kwargs, corrected=corrected, fixed_globals=fixed_globals)

        def one(key):
            with handlers.block():
                return handlers.substitute(
                    handlers.seed(body, key), data={**params, self._plate_name: idx}
                )(*args, **kwargs)

        return jax.lax.map(one, keys, batch_size=chunk)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_jitted"] = {}  # compiled programs do not pickle; rebuilt on first use
        return state


def _khat_counts_of(khat, log_w) -> bool:
    """:func:`~numpyro_uha._weights.khat_counts` for one set of log weights (NaN and
    -inf: zero weights): a k̂ ≥ ``KHAT_BAD`` is a poor fit unless every weight is
    finite and none is more than twice their geometric mean."""
    log_w = np.asarray(log_w, np.float64)
    num_finite = int(np.isfinite(log_w).sum())
    return khat_counts(float(khat), num_finite, log_w.size, log_spread(log_w))


def _warn_if_globals_missed(khat, ess, num_draws, log_w=None):
    """:class:`~numpyro_uha.UHAFitWarning` where the global draws' importance weights of
    :meth:`UHALocalGuide.global_log_z` say q(θ) misses p(θ | x): Pareto k̂ ≥
    ``KHAT_BAD`` (not where the weights ``log_w`` are all within a factor of two of their
    mean: :func:`_khat_counts_of`) or an effective sample size under
    ``ESS_FRACTION_BAD`` of the draws."""
    if log_w is None:
        heavy = khat_counts(float(khat), num_draws, num_draws, None)
    else:
        heavy = _khat_counts_of(khat, log_w)
    few = bool(ess < ESS_FRACTION_BAD * num_draws)
    if heavy or few:
        reasons = [f"Pareto k̂ = {khat:.2f} ≥ {KHAT_BAD}"] if heavy else []
        if few:
            reasons.append(
                f"an effective sample size of {ess:.1f} of {num_draws} draws "
                f"(under {100 * ESS_FRACTION_BAD:g} %)"
            )
        warnings.warn(
            f"UHALocalGuide.global_log_z: the global latents' importance weights have "
            f"{' and '.join(reasons)}: the global guide misses the posterior "
            "of the global latents, so their draws from sample_posterior (and "
            "Predictive) are off by more than their spread says, and log_z is "
            "lower-biased with too small an se. Refit the other way (decenter=True "
            "where the data say little about each data point, as a hierarchy's group "
            "scale; without it where they say much) and keep the fit with the higher "
            "global_log_z(...).log_z; train longer (each q_i moves only when its data "
            "point is in the minibatch) or use a global guide that can fit "
            "correlations (global_guide=AutoMultivariateNormal). Compare the globals "
            "with NUTS where you can.",
            UHAFitWarning,
            stacklevel=3,
        )


def _warn_if_points_fit_poorly(heavy, num_nonfinite, num_samples, idx, per_data_point, ess):
    """:class:`~numpyro_uha.UHAFitWarning` naming the data points whose weights say
    their q_i and chain fit poorly: Pareto k̂ ≥ ``KHAT_BAD`` (``heavy``, per data point,
    from :func:`_khat_counts_of`: an ``inf`` k̂ from too few draws, or weights all within
    a factor of two of their mean, do not count), an effective sample size ``ess`` under
    ``ESS_FRACTION_BAD`` of the chains (as ``global_log_z``'s rule: a tail so far out
    that k̂'s fit has too few weights to be finite shows there), or more than 10 % of
    the chains diverged."""
    heavy = np.asarray(heavy, bool)
    few = np.asarray(ess) < ESS_FRACTION_BAD * num_samples
    diverging = num_nonfinite > 0.1 * num_samples
    problems = []
    for flags, what in [
        (heavy, f"Pareto k̂ ≥ {KHAT_BAD} (their log_z is lower-biased and its se too small)"),
        (few, f"an effective sample size under {100 * ESS_FRACTION_BAD:g} % of the chains "
              "(the same)"),
        (diverging, "more than 10 % of the chains diverged"),
    ]:
        if flags.any():
            points = idx[np.flatnonzero(flags)]
            problems.append(
                f"{what} at {points.size} data point(s) {points[:10].tolist()}"
                f"{' ...' if points.size > 10 else ''}"
            )
    if problems:
        advice = (
            "Train longer (a data point's q_i learns only in the minibatches it is in) or "
            "with a larger K" + (
                "" if per_data_point else
                "; per_data_point=True gives each data point its own step sizes and "
                "momentum scales"
            ) + "; precondition=True puts the steps in each q_i's units where the data "
            "points' posteriors differ in width."
        )
        warnings.warn(
            f"UHALocalGuide.log_z: the importance weights say some data points' "
            f"approximations are poor: {'; '.join(problems)} (see pareto_khat). {advice}",
            UHAFitWarning,
            stacklevel=3,
        )


def _check_decenter(decenter):
    if decenter is True or decenter is False:
        return decenter
    if (
        isinstance(decenter, str) or not hasattr(decenter, "__iter__")
        or not all(isinstance(n, str) for n in decenter)
    ):
        raise ValueError(
            "decenter must be True, False or a list of local site names, got "
            f"{decenter!r}."
        )
    return tuple(decenter)


class _Hidden:
    """``model`` with the sites ``names`` hidden: ``handlers.block(model, hide=names)``,
    but picklable (NumPyro's ``block`` keeps a lambda), so a guide holding it pickles."""

    def __init__(self, model, names):
        self.model = model
        self.names = list(names)

    def __call__(self, *args, **kwargs):
        with handlers.block(hide=self.names):
            return _sampleable(self.model, self.names)(*args, **kwargs)


def _refuse_uha_global_guide(guide):
    """Raise if ``guide`` is a :class:`UHAGuide` (class or instance). A UHA chain cannot
    be the global guide: it is fit on the model with the plate's sites hidden, so its
    target would be the globals' prior (the data's likelihood is in the hidden sites),
    not their posterior: a valid but useless bound (measured on a Poisson
    random-intercept model: loss NaN, global posterior sds 7-21x NUTS's)."""
    cls = guide if isinstance(guide, type) else type(guide)
    if not issubclass(cls, UHAGuide):
        return
    name = cls.__name__
    raise TypeError(
        f"UHALocalGuide: global_guide={name} is not supported. The global guide is fit on "
        "the model with the plate's sites hidden, so a UHA chain there would anneal to the "
        "global latents' prior, not their posterior: the likelihood of the data is in the "
        "hidden local and observed sites. Give the globals a Gaussian guide (AutoNormal, "
        "the default; AutoMultivariateNormal; AutoLowRankMultivariateNormal), or, when the "
        "full data fit in one step, anneal globals and locals together with UHAGuide on "
        "the whole model (no subsample_size)."
    )


def _step_backoff(values):
    """Zero, with gradient 1 in log ε + mean_j log(δ_j / m_j), the log of the chain's
    typical per-coordinate leapfrog step (shape ``()`` shared, ``(B,)`` per data point).

    Added to a diverged chain's term of the loss, it lowers that step at the next
    optimizer step; a chain that did not diverge gets nothing.
    """
    log_step = (
        jnp.log(values["step_size"])
        + jnp.mean(jnp.log(values["drift_scale"]), axis=-1)
        - jnp.mean(jnp.log(values["momentum_scale"]), axis=-1)
    )
    return log_step - jax.lax.stop_gradient(log_step)


def _with_axis(shape, axis, size):
    """``shape`` with the data axis present (size 1 → ``size``), for broadcasting."""
    shape = list(shape)
    ndim = len(shape)
    pos = axis if axis >= 0 else ndim + axis
    if pos < 0:
        shape = [1] * (-pos) + shape
        pos = 0
    shape[pos] = size
    return tuple(shape)
