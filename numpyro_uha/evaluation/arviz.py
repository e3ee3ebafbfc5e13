"""ArviZ export and importance-weight diagnostics for UHA draws.

UHA draws are independent (each one is a fresh run of the annealed dynamics from a fresh
z₁ ~ q), and each carries a log importance weight log w = log p(x, z) - log q(z) of the
augmented proposal. This module turns them into an :class:`arviz.InferenceData` (by
default importance-resampled, with a pointwise log-likelihood group for ``az.loo`` and
``az.waic``), checks the weights with Pareto-smoothed importance sampling (PSIS), and uses
them for self-normalized importance-weighted moments and importance resampling.
"""

from __future__ import annotations

import jax
import numpy as np
from numpyro import handlers
from numpyro.primitives import Messenger

from numpyro_uha import _enumerate
from numpyro_uha._keywords import check_model_keywords, model_of
from numpyro_uha._weights import (  # noqa: F401 -- the public ones re-exported
    ELBO_SE_BAD,
    KHAT_BAD,
    KHAT_GOOD,
    _check_log_weights,
    _warn_if_poor_fit,
    khat_verdict,
    psis_khat,
)
from numpyro_uha.guide import CPU_BATCH_PER_DEVICE, _is_factor

__all__ = [
    "ELBO_SE_BAD",
    "KHAT_BAD",
    "KHAT_GOOD",
    "importance_resample",
    "khat_verdict",
    "psis_khat",
    "to_inference_data",
    "weighted_moments",
]


# ----------------------------------------------------------------------- helpers


def _check_positive_int(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer ≥ {minimum}"
        raise ValueError(f"{name} must be {what}, got {value!r}.")
    return int(value)


def _is_local(guide) -> bool:
    from numpyro_uha.local import UHALocalGuide

    return isinstance(guide, UHALocalGuide)


def _require_uha_guide(guide, where):
    """A clear error for NumPyro's own guides (the draws of UHAGuide and UHALocalGuide
    come with the weights and site names these functions use)."""
    from numpyro.infer.autoguide import AutoGuide

    from numpyro_uha.guide import UHAGuide
    from numpyro_uha.local import UHALocalGuide

    if isinstance(guide, AutoGuide) and not isinstance(
        guide, (UHAGuide, UHALocalGuide)
    ):
        raise TypeError(
            f"{where} takes a UHAGuide or a UHALocalGuide, got {type(guide).__name__}. For "
            "NumPyro's own guides, draw with guide.sample_posterior(rng_key, params, "
            "*args, sample_shape=(n,)) and pass the draws to arviz.from_dict(posterior="
            "{name: draws[name][None] for name in draws}); numpyro_uha.evaluation.log_z "
            "takes any NumPyro AutoGuide."
        )


def _latent_sites(guide) -> list:
    """The model's own names of the guide's latent sites (``x``, not the non-centered
    ``x_decentered`` it runs): a ``UHALocalGuide``'s globals, then its locals."""
    from numpyro_uha import _decenter

    if _is_local(guide):
        return list(guide._global_latents) + [
            _decenter.written_name(name, guide.decentered_sites) for name in guide._local_sites
        ]
    model_site = getattr(guide, "_model_site", lambda name: name)
    return [model_site(name) for name in guide._init_locs]


def _joint_draws(guide, rng_key, params, args, kwargs, num_draws, where, weighted, **options):
    """``(draws, has_weights)``: ``num_draws`` draws of every latent site as a
    ``WeightedDraws`` (``options`` go to a ``UHAGuide``'s draw method). A ``UHAGuide``'s
    carry their log importance weights; a
    ``UHALocalGuide``'s carry none (each data point's chain has a weight given the
    globals, the globals' draws none), so they are marked zero and ``weighted``, the
    caller's wish to use weights, must not be true for them. They are drawn for the
    whole data (a subsampled plate's minibatch would be a random one)."""
    if not _is_local(guide):
        draws = guide.sample_posterior_with_log_weights(
            rng_key, params, *args, sample_shape=(num_draws,), **options, **kwargs
        )
        return draws, True
    if weighted:
        raise ValueError(
            f"{where}: a UHALocalGuide's draws have no joint importance weights (each data "
            "point's chain is weighted given the globals; the globals' draws are not), so "
            "they can only be used as they are: pass resample=False / weighted=False, or "
            "leave it unset."
        )
    size, subsample_size = guide._sizes(args, kwargs)
    if subsample_size != size:
        raise ValueError(
            f"{where}: the model's plate subsamples {subsample_size} of {size} data points "
            "with these arguments; pass the arguments for the whole data (e.g. batch=None) "
            "so that every data point's latents are drawn and the data match them."
        )
    samples = guide.sample_posterior(rng_key, params, *args, sample_shape=(num_draws,), **kwargs)
    from numpyro_uha.guide import WeightedDraws

    samples = {name: samples[name] for name in _latent_sites(guide) if name in samples}
    return WeightedDraws(samples, np.zeros(num_draws), None, None), False


def _check_draws(draws, where, allow_nonfinite=False):
    """(flat log weights, number of draws, sample_shape) of a WeightedDraws, validated.

    With ``allow_nonfinite`` NaN and +inf log weights are let through (the caller
    handles diverged draws)."""
    if not hasattr(draws, "samples") or not hasattr(draws, "log_weights"):
        raise TypeError(
            f"{where}: expected a WeightedDraws (from "
            f"guide.sample_posterior_with_log_weights), got {type(draws).__name__}."
        )
    sample_shape = tuple(np.shape(draws.log_weights))
    if len(sample_shape) == 0:
        raise ValueError(
            f"{where}: the draws have no sample dimension (log_weights is a scalar); draw "
            "them with sample_shape=(num_draws,)."
        )
    for name, value in draws.samples.items():
        if tuple(np.shape(value))[: len(sample_shape)] != sample_shape:
            raise ValueError(
                f"{where}: site '{name}' has shape {np.shape(value)}, which does not start "
                f"with the log weights' sample shape {sample_shape}."
            )
    if allow_nonfinite:
        log_w = np.asarray(draws.log_weights, dtype=np.float64).ravel()
    else:
        log_w = _check_log_weights(draws.log_weights, where)
    return log_w, log_w.size, sample_shape


def _host_finite_mask(draws, log_w, total):
    """Mask of the draws whose log weight and latent (if present) are finite, on the host
    (NumPy; guide._finite_draws is the jitted per-draw mask of the draw methods)."""
    finite = np.isfinite(log_w)
    latent = getattr(draws, "latent", None)
    if latent is not None and np.size(latent):
        finite &= np.all(np.isfinite(np.asarray(latent, np.float64).reshape(total, -1)), axis=1)
    return finite


def _flat_samples(draws, sample_shape, num_draws):
    """Every site as a numpy array with one leading draw dimension."""
    k = len(sample_shape)
    return {
        name: np.asarray(value).reshape((num_draws,) + tuple(np.shape(value))[k:])
        for name, value in draws.samples.items()
    }


def _normalized_weights(log_w, smooth):
    if smooth:
        import arviz as az

        log_w, _ = az.psislw(log_w.copy(), reff=1.0, normalize=True)
    w = np.exp(log_w - np.max(log_w))
    return w / np.sum(w)


# ------------------------------------------------------------------------ export


def to_inference_data(
    guide,
    rng_key,
    params,
    *args,
    num_samples=1000,
    num_chains=1,
    draws=None,
    resample=None,
    log_likelihood=True,
    posterior_predictive=False,
    **kwargs,
):
    """UHA draws as an :class:`arviz.InferenceData`, importance-resampled by default.

    Draws ``num_chains * num_samples`` draws with
    :meth:`~numpyro_uha.UHAGuide.sample_posterior_with_log_weights` (or uses ``draws``)
    and stores them with dimensions ``("chain", "draw", ...)``.

    **The importance weights.** UHA draws are not posterior draws: they come from the
    UHA approximation and each carries a log importance weight log w. ArviZ treats the
    ``posterior`` group as (equally weighted) posterior draws, and so do ``az.loo``,
    ``az.waic``, ``az.compare`` and ``az.summary``. So by default (``resample=True``)
    the ``posterior`` and ``log_likelihood`` groups hold draws *resampled* from the
    UHA draws with probabilities proportional to their weights (multinomial, as in
    :func:`importance_resample`, as many draws as UHA draws). Those are approximately
    posterior draws, consistent as the number of draws grows, and LOO/WAIC computed
    from them estimate the *posterior's* predictive accuracy. Resampled draws repeat
    UHA draws; their information is that of the weights' effective sample size
    (``attrs["importance_ess"]``), not of their number, and the Monte Carlo error of
    any estimate from them is larger than for as many independent posterior draws.
    Check the weights first: with ``attrs["pareto_khat"]`` ≥ 0.7 (:func:`khat_verdict`)
    the resampled draws, and anything computed from them, should not be trusted.

    With ``resample=False`` the groups hold the UHA draws themselves, unweighted:
    ``az.summary``, ``az.loo`` and ``az.waic`` then describe the UHA approximation, not
    the posterior, and ``sample_stats.log_weight`` holds each draw's weight (e.g. for
    :func:`psis_khat` or :func:`weighted_moments`).

    UHA draws are independent, so the "chains" are an arbitrary split of one set of
    draws, there only because ArviZ's diagnostics expect a chain dimension: R-hat is
    ≈ 1 by construction and the effective sample size ArviZ reports is ≈ the number of
    draws (it cannot see that resampled draws repeat).

    Groups:

    - ``posterior``: every latent site (constrained) and deterministic site, under the
      model's site names;
    - ``log_likelihood``: for every observed site, the pointwise log-likelihood
      log p(y | θ) at each draw (the site's ``log_prob`` with event dimensions summed,
      one value per element of its batch shape, e.g. per data point of a plate),
      computed by running the model with the same ``*args, **kwargs`` and the draw
      substituted (:func:`numpyro.infer.log_likelihood`); only where the model has
      observed sites and ``log_likelihood=True``. With discrete latent sites (their
      draws are in the ``posterior`` group), each data point's own discrete sites (in
      its plates only, e.g. a mixture's assignment) are summed out, as LOO needs
      p(y_i | θ) with y_i's own latents summed out; discrete sites shared by several
      points are held at their drawn values, as the continuous latents are;
    - ``sample_stats``: with ``resample=True``, ``uha_draw``: the index of the UHA
      draw each draw copies (into ``draws`` when given); with ``resample=False``,
      ``log_weight``: the UHA log importance weight of each draw;
    - ``observed_data``: the observed sites' values for these model arguments (only
      when the model has observed sites);
    - ``posterior_predictive`` (with ``posterior_predictive=True``): for every observed
      site, a replicate drawn at each draw of the ``posterior`` group, by
      :class:`numpyro.infer.Predictive` with the model's observed sites drawn instead
      of observed (so a site that feeds a later one, as in an autoregression, feeds it
      its replicate: the replicates are the model's joint simulation given the draw,
      not each site's prediction given the data); ``numpyro.factor`` sites have none.
      For ``az.plot_ppc`` (and ``az.loo_pit`` where each observation is a scalar).

    ``attrs`` record ``weighting`` (``"importance_resampled"`` or ``"none"``),
    ``num_uha_draws``, the weights' ``pareto_khat`` (:func:`psis_khat`) and
    ``importance_ess`` ((Σw)²/Σw²), computed on all UHA draws before resampling, and
    ``num_nonfinite``, the number of diverged draws.

    **Diverged draws** (a NaN or infinite log weight, or a non-finite latent) are zero
    weights: they are never resampled, and with ``resample=False`` they are left out
    (with the last few finite draws, if needed, so that the rest split evenly into
    ``num_chains``). They are counted in ``attrs["num_nonfinite"]`` (together with the
    ``num_dropped`` of given ``draws``) and announced by a
    :class:`~numpyro_uha.UHANonfiniteDrawsWarning`; more than 10 % raise
    ``FloatingPointError``. A :class:`~numpyro_uha.UHAFitWarning` says when the weights
    show a poor fit (Pareto k̂ ≥ 0.7 or an ELBO standard error above 1 nat).

    Args:
        guide: a :class:`~numpyro_uha.UHAGuide` or :class:`~numpyro_uha.UHALocalGuide`
            that has been set up (trained); for the latter, pass the model's arguments
            for the whole data (no subsample), as its locals are drawn for every data
            point.
        rng_key: JAX random key for the draws and the resampling; with ``draws`` given
            it seeds the resampling only, and ``None`` means ``PRNGKey(0)``.
        params: the trained parameters, e.g. ``svi_result.params`` (the model's own
            ``numpyro.param`` values among them are used for the log-likelihood).
        *args: the model's positional arguments (the data used in training).
        num_samples: draws per chain.
        num_chains: number of chains the draws are split into.
        draws: a :class:`~numpyro_uha.WeightedDraws` to export instead of drawing new
            ones; any sample shape whose size is a multiple of ``num_chains``. It is
            split into ``num_chains`` chains of equal length (``num_samples`` is
            ignored).
        resample: build the ``posterior`` and ``log_likelihood`` groups from
            importance-resampled draws rather than from the UHA draws as they are (see
            above). ``None`` (default): resampled for a ``UHAGuide``; a
            ``UHALocalGuide``'s draws have no joint weights, so they are exported as
            they are (no ``sample_stats``, no ``pareto_khat`` or ``importance_ess``),
            and ``True`` is an error for it.
        log_likelihood: add the ``log_likelihood`` group.
        posterior_predictive: add the ``posterior_predictive`` group (replicates of the
            observed sites, one per posterior draw, from the key ``rng_key`` gives).
        **kwargs: the model's keyword arguments.

    Returns:
        arviz.InferenceData: with groups ``posterior``, ``sample_stats`` and, where the
        model observes data, ``log_likelihood``, ``observed_data`` and, if asked for,
        ``posterior_predictive``.

    Raises:
        ValueError: if ``num_samples`` or ``num_chains`` is not a positive integer, the
            number of ``draws`` is not divisible by ``num_chains``, or
            ``posterior_predictive=True`` for a model without observed sites.
        TypeError: if ``guide`` is not a UHAGuide or UHALocalGuide, or
            ``posterior_predictive`` or ``log_likelihood`` is not a bool.
        FloatingPointError: if a log weight is +inf, more than 10 % of the draws
            diverged, or every weight is zero.
    """
    _require_uha_guide(guide, "to_inference_data")
    check_model_keywords(model_of(guide), kwargs, to_inference_data)
    import arviz as az

    for name, value in (("log_likelihood", log_likelihood),
                        ("posterior_predictive", posterior_predictive)):
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(
                f"to_inference_data: {name} must be True or False, got {value!r}."
            )
    num_chains = _check_positive_int("num_chains", num_chains)
    predictive_key = None
    if posterior_predictive:
        # its own key: the draws and the resampling are those of a call without it
        predictive_key = jax.random.fold_in(
            jax.random.PRNGKey(0) if rng_key is None else rng_key, 1
        )
    if draws is None:
        num_samples = _check_positive_int("num_samples", num_samples)
        draw_key, resample_key = jax.random.split(rng_key)
        draws, has_weights = _joint_draws(
            guide, draw_key, params, args, kwargs, num_chains * num_samples,
            "to_inference_data", resample, nonfinite="keep",
        )
    else:
        has_weights = True
        resample_key = jax.random.PRNGKey(0) if rng_key is None else rng_key
    if resample is None:  # resampled where the draws have weights
        resample = has_weights
    with handlers.block():
        model_trace = handlers.trace(handlers.seed(model_of(guide), 0)).get_trace(
            *args, **kwargs
        )
    if not has_weights:  # a UHALocalGuide's draws hold the latents only
        draws.samples.update(_deterministic_sites(
            model_of(guide), params, draws.samples,
            [name for name, site in model_trace.items() if site["type"] == "deterministic"],
            args, kwargs,
        ))
    log_w, total, sample_shape = _check_draws(draws, "to_inference_data", allow_nonfinite=True)
    if np.any(log_w == np.inf):
        _check_log_weights(log_w, "to_inference_data")  # raises, naming the count
    finite = _host_finite_mask(draws, log_w, total)
    num_bad = int(total - np.sum(finite))
    num_nonfinite = num_bad + int(getattr(draws, "num_dropped", 0) or 0)
    if num_bad:
        _nonfinite_draws(num_bad, total, "to_inference_data")
    # A diverged draw is a zero weight (see LogZEstimate): never resampled.
    log_w = np.where(finite, log_w, -np.inf)
    if not np.any(finite):
        _check_log_weights(log_w, "to_inference_data")  # raises: all weights are zero
    samples = _flat_samples(draws, sample_shape, total)
    if resample:
        index = _resample_index(resample_key, log_w, total)
    else:
        # The UHA draws as they are: the diverged ones are dropped and, if needed, the
        # last few finite ones too, so that the rest split evenly into chains.
        index = np.flatnonzero(finite)
        if num_bad:
            index = index[: len(index) - len(index) % num_chains]
    if len(index) % num_chains:
        raise ValueError(
            f"to_inference_data: {len(index)} draws cannot be split evenly into "
            f"num_chains={num_chains} chains."
        )
    if len(index) == 0:
        raise ValueError(
            f"to_inference_data: fewer finite draws than num_chains={num_chains}."
        )
    per_chain = len(index) // num_chains

    def by_chain(value):
        return value.reshape((num_chains, per_chain) + value.shape[1:])

    posterior = {name: by_chain(value[index]) for name, value in samples.items()}
    if not has_weights:  # a UHALocalGuide's draws: no weights to record
        sample_stats = None
    elif resample:
        sample_stats = {"uha_draw": by_chain(index)}
    else:
        sample_stats = {"log_weight": by_chain(log_w[index])}

    observed = {
        name: np.asarray(site["value"])
        for name, site in model_trace.items()
        if site["type"] == "sample" and site["is_observed"]
    }
    log_lik = None
    if observed and log_likelihood:
        # At the distinct UHA draws, then copied along with them.
        pointwise = _pointwise_log_likelihood(
            guide, params, samples, args, kwargs, _chunk_draws(guide, observed),
        )
        # one site's rows at a time, each site's full array freed once taken
        log_lik = {name: by_chain(_rows(pointwise.pop(name), index)) for name in list(pointwise)}

    predictive = None
    if posterior_predictive:
        replicated = [name for name in observed if not _is_factor(model_trace[name])]
        if not replicated:
            raise ValueError(
                "to_inference_data: posterior_predictive=True, but the model has no "
                "observed sites to replicate (numpyro.factor terms have none)."
            )
        predictive = _posterior_predictive(
            model_of(guide), params, {name: value[index] for name, value in samples.items()},
            replicated, predictive_key, args, kwargs,
            _chunk_draws(guide, {name: observed[name] for name in replicated}),
        )
        predictive = {name: by_chain(value) for name, value in predictive.items()}

    attrs = {
        "inference_library": "numpyro_uha",
        "num_transitions": getattr(guide, "K", None),
        "weighting": "importance_resampled" if resample else "none",
        "num_uha_draws": total,
        "num_nonfinite": num_nonfinite,
    }
    if has_weights:
        w = np.exp(log_w - np.max(log_w))
        khat = _warn_if_poor_fit(log_w, "to_inference_data", stacklevel=3)
        attrs["pareto_khat"] = psis_khat(log_w) if khat is None else khat
        attrs["importance_ess"] = float(np.sum(w) ** 2 / np.sum(w**2))
    attrs = {key: value for key, value in attrs.items() if value is not None}
    return az.from_dict(
        posterior=posterior,
        posterior_predictive=predictive,
        log_likelihood=log_lik,
        sample_stats=sample_stats,
        observed_data=observed or None,
        attrs=attrs,
    )


def _nonfinite_draws(num_bad, total, where):
    """Warn about ``num_bad`` diverged draws of ``total``, or raise above 10 %."""
    import warnings

    from numpyro_uha._divergence import UHANonfiniteDrawsWarning

    what = (
        f"{where}: {num_bad} of {total} draws have a non-finite log weight or latent "
        "(their Hamiltonian trajectories diverged)"
    )
    advice = "Train with a smaller learning rate or max_step_size."
    if num_bad > 0.1 * total:
        raise FloatingPointError(
            f"{what}: more than 10 %, so the approximation is unusable. {advice}"
        )
    warnings.warn(
        f"{what}; they get zero weight (never resampled) and are left out of the "
        f"posterior group (attrs['num_nonfinite']). {advice}",
        UHANonfiniteDrawsWarning,
        stacklevel=4,
    )


def _with_model_params(model, params):
    """``model`` with its own ``numpyro.param`` sites set to their values in ``params``
    (the trained ones; a guide's own parameters there are not the model's)."""
    model_params = dict(params) if isinstance(params, dict) else {}

    def param_value(site):
        if site["type"] == "param" and site["name"] in model_params:
            return model_params[site["name"]]
        return None

    return handlers.substitute(model, substitute_fn=param_value)


def _deterministic_sites(model, params, samples, names, args, kwargs):
    """The model's ``numpyro.deterministic`` sites ``names`` at each draw of ``samples``
    (every latent site of the model as written), by :class:`numpyro.infer.Predictive`:
    a ``UHALocalGuide``'s draws hold the latents only."""
    from numpyro.infer import Predictive

    if not names:
        return {}
    with handlers.block():
        values = Predictive(
            _with_model_params(model, params), posterior_samples=samples,
            return_sites=list(names), batch_ndims=1,
        )(jax.random.PRNGKey(0), *args, **kwargs)
    return {name: values[name] for name in names}


class _Unobserved(Messenger):
    """``fn`` with its observed sites (``names``) drawn from their distributions
    instead: a later site sees the drawn value, as when the model simulates data."""

    def __init__(self, fn, names):
        self.names = frozenset(names)
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and msg["is_observed"] and msg["name"] in self.names:
            msg["value"] = None
            msg["is_observed"] = False


def _posterior_predictive(model, params, samples, names, rng_key, args, kwargs, batch_size):
    """site name -> one replicate of each observed site in ``names`` per draw of
    ``samples``, by :class:`numpyro.infer.Predictive` on the model with those sites
    drawn (:class:`_Unobserved`) and its own ``numpyro.param`` values from ``params``,
    ``batch_size`` draws at a time (a key per chunk, folded from ``rng_key``)."""
    from numpyro.infer import Predictive

    simulating = _Unobserved(_with_model_params(model, params), names)

    def replicate(i, chunk):
        return Predictive(
            simulating, posterior_samples=chunk, return_sites=list(names),
            batch_ndims=1, parallel=True,
        )(jax.random.fold_in(rng_key, i), *args, **kwargs)

    return _in_chunks(replicate, samples, batch_size)


#: The most values of the observed sites together a chunk of :func:`to_inference_data`'s
#: pointwise log-likelihood or replicated data holds (64 MiB in single precision): the
#: model runs unfused on the chunk, each of its intermediate arrays as large, and the
#: guide's ``sample_batch_size`` is sized for its compiled gradient instead (1000 draws
#: at once of a 3·10⁵-point logistic regression took 3.8 GB above the 1.1 GB result).
CHUNK_VALUES = 2**24


def _chunk_draws(guide, observed) -> int:
    """Draws per chunk for the observed sites ``observed`` (name -> value): the guide's
    ``sample_batch_size``, fewer where that many draws of the sites would hold more
    than :data:`CHUNK_VALUES` values (at least one draw)."""
    batch = getattr(guide, "sample_batch_size", CPU_BATCH_PER_DEVICE)
    values = sum(int(np.size(value)) for value in observed.values())
    return max(1, min(batch, CHUNK_VALUES // max(values, 1)))


def _in_chunks(fn, samples, batch_size):
    """site name -> the rows of ``fn(i, chunk)`` (a dict of arrays with one row per draw)
    over the ``i``-th chunks of ``batch_size`` draws of ``samples``, joined: written into
    arrays allocated once, at the first chunk (a list of chunks joined at the end held
    the result twice: 1000 draws of a 10⁶-point log-likelihood are 4 GB each)."""
    num_draws = next(iter(samples.values())).shape[0]
    out = None
    for i, start in enumerate(range(0, num_draws, batch_size)):
        chunk = {name: value[start : start + batch_size] for name, value in samples.items()}
        with handlers.block():
            values = fn(i, chunk)
        if out is None:
            out = {
                name: np.empty((num_draws,) + tuple(np.shape(value)[1:]), _dtype_of(value))
                for name, value in values.items()
            }
        for name, value in values.items():
            out[name][start : start + batch_size] = np.asarray(value)
    return {} if out is None else out


def _dtype_of(value):
    """``value``'s NumPy dtype (a JAX array's ``dtype``: JAX deprecates handing the array
    itself to ``np.result_type``)."""
    return np.dtype(value.dtype) if hasattr(value, "dtype") else np.result_type(value)


def _rows(value, index):
    """``value[index]``, without the copy where ``index`` takes every row in order."""
    if len(index) == len(value) and np.array_equal(index, np.arange(len(value))):
        return value
    return value[index]


def _pointwise_log_likelihood(guide, params, samples, args, kwargs, batch_size):
    """site name -> log p(y_site | θ) for every observed site, one row per draw.

    The model runs with each draw substituted (``numpyro.infer.log_likelihood``) and its
    own ``numpyro.param`` sites set from ``params``, ``batch_size`` draws at a time.
    """
    from numpyro.infer import log_likelihood

    # the model as written: the draws hold its own sites (x, not a non-centered x_decentered)
    model = handlers.seed(_with_model_params(model_of(guide), params), 0)
    discrete = getattr(guide, "_discrete", ())
    if discrete:
        # each data point's own discrete sites summed out, at every draw (_enumerate.py)
        one = jax.jit(lambda values: _enumerate.pointwise_log_likelihood(
            model, guide._plate_nesting, discrete, args, kwargs, values
        ))
        return _in_chunks(lambda _, chunk: jax.vmap(one)(chunk), samples, batch_size)
    return _in_chunks(
        lambda _, chunk: log_likelihood(
            model, chunk, *args, parallel=True, batch_ndims=1, **kwargs
        ),
        samples, batch_size,
    )


# --------------------------------------------------------- weighted estimates


def weighted_moments(draws, smooth=False) -> dict:
    """Self-normalized importance-weighted mean and standard deviation of every site.

    With normalized weights w̃_i ∝ exp(log w_i), mean = Σ w̃_i x_i and
    std = sqrt(Σ w̃_i (x_i - mean)²), elementwise. These are consistent for the
    posterior moments as the number of draws grows (biased for finite draws), provided
    the weights are not too heavy-tailed (check :func:`psis_khat`). The weights are
    shifted by their maximum before exponentiating, so large log weights do not
    overflow.

    Args:
        draws: a :class:`~numpyro_uha.WeightedDraws` from
            :meth:`~numpyro_uha.UHAGuide.sample_posterior_with_log_weights` (any
            sample shape; all sample dimensions are pooled).
        smooth: use PSIS-smoothed weights (``arviz.psislw``), which reduces the variance
            of the estimates when a few weights dominate.

    Returns:
        dict: site name -> ``(mean, std)``, numpy arrays of the site's shape.

    Raises:
        TypeError: if ``draws`` is not a WeightedDraws.
        ValueError: if a site's leading shape does not match the log weights' shape.
        FloatingPointError: if a log weight is NaN or +inf, or all are -inf.
    """
    log_w, n, sample_shape = _check_draws(draws, "weighted_moments")
    w = _normalized_weights(log_w, smooth)
    out = {}
    for name, x in _flat_samples(draws, sample_shape, n).items():
        x = x.astype(np.float64)
        wb = w.reshape((n,) + (1,) * (x.ndim - 1))
        mean = np.sum(wb * x, axis=0)
        var = np.sum(wb * (x - mean) ** 2, axis=0)
        out[name] = (mean, np.sqrt(var))
    return out


def importance_resample(rng_key, draws, num_samples=None) -> dict:
    """Resample draws with replacement, with probabilities proportional to their weights.

    Multinomial resampling turns the weighted UHA draws into (approximately) posterior
    draws: the resampled set is consistent for the posterior as the number of input
    draws grows. Resampled draws repeat input draws, so they are not independent; with
    heavy-tailed weights (large :func:`psis_khat`) a few draws are repeated many times.

    Args:
        rng_key: JAX random key.
        draws: a :class:`~numpyro_uha.WeightedDraws` (any sample shape; pooled).
        num_samples: number of draws to return; defaults to the number of input draws.

    Returns:
        dict: site name -> numpy array with leading dimension ``num_samples``, every
        entry a copy of one of the input draws.

    Raises:
        TypeError: if ``draws`` is not a WeightedDraws.
        ValueError: if ``num_samples`` is not a positive integer, or a site's leading
            shape does not match the log weights' shape.
        FloatingPointError: if a log weight is NaN or +inf, or all are -inf.
    """
    log_w, n, sample_shape = _check_draws(draws, "importance_resample")
    num_samples = n if num_samples is None else _check_positive_int("num_samples", num_samples)
    index = _resample_index(rng_key, log_w, num_samples)
    return {name: x[index] for name, x in _flat_samples(draws, sample_shape, n).items()}


def _resample_index(rng_key, log_w, num_samples) -> np.ndarray:
    """``num_samples`` indices drawn with replacement, with probabilities ∝ exp(log_w)."""
    # Gumbel-max categorical draws on the log weights: exact, and -inf means never picked.
    return np.asarray(
        jax.random.categorical(rng_key, log_w - np.max(log_w), shape=(num_samples,))
    )
