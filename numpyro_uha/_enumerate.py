"""Discrete latent sites, marginalized by enumeration (as NumPyro's NUTS does).

UHA's Hamiltonian dynamics need a continuous state. A model with discrete latent sites
of finite support (a mixture's assignments, an HMM's states) is handled as NumPyro's HMC
handles it: the chain targets the *marginal* log density of the continuous latents z,
log Σ_c p(x, z, c), which NumPyro computes with funsor
(:func:`numpyro.contrib.funsor.log_density` on the model under ``enum(config_enumerate(
model))``; the discrete sites' enumeration dimensions sit left of the model's plates).

The guide then draws the discrete sites from their exact conditional given the chain's
last position, c ~ p(c | z, x) (funsor's forward-filter backward-sample,
:func:`numpyro.contrib.funsor.infer_discrete`), and counts log p(c | z, x) in its own
log density. Any ELBO's term for the joint draw (z, c) is then

    log p(x, z, c) - log q(z) - log p(c | z, x) = log p(x, z) - log q(z),

the UHA bound's term on the marginal, for every c: ``Trace_ELBO``,
``TraceEnum_ELBO`` and the rest estimate the same bound, whose gradient is the
reparameterized one (c enters only through a term that does not depend on it). The
draws are posterior draws of (z, c) jointly, with the marginal's importance weights.

funsor is an optional dependency (``pip install "numpyro-uha[enum]"``), needed only for
models with discrete latent sites, as in NumPyro.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import sys
import threading
import warnings

import jax
import jax.numpy as jnp
from numpyro import handlers
from numpyro.primitives import Messenger
import numpyro.distributions as dist
import numpyro.infer.autoguide as _autoguide
from numpyro.infer.util import _guess_max_plate_nesting, log_density

EXTRA = 'pip install "numpyro-uha[enum]" (or pip install funsor)'

#: The largest array (elements) the conditional sampler may need, checked at setup: funsor's
#: backward sampling of a chain of discrete sites written with ``markov`` builds the
#: joint table of the whole chain (2^40 entries for 40 binary states).
MAX_SAMPLER_ELEMENTS = 2**27

#: Serializes the swap of numpyro.infer.autoguide.helpful_support_errors.
_LOCK = threading.RLock()


def discrete_sites(model_trace, owner: str) -> tuple:
    """The latent (unobserved) discrete sample sites of ``model_trace``, in order, each
    checked to be enumerable; raises naming the site where one is not, and where funsor,
    which marginalizes them, is not installed."""
    names = []
    for name, site in model_trace.items():
        if site["type"] != "sample" or site["is_observed"] or not site["fn"].support.is_discrete:
            continue
        kind = site.get("infer", {}).get("enumerate")
        if kind not in (None, "parallel"):
            raise ValueError(
                f"{owner}: discrete latent site '{name}' is marked "
                f"infer={{'enumerate': {kind!r}}}; only 'parallel' enumeration (or none: "
                "every discrete site is enumerated, as by NumPyro's NUTS) is supported."
            )
        if not site["fn"].has_enumerate_support:
            raise ValueError(
                f"{owner}: latent site '{name}' has a discrete distribution "
                f"({type(site['fn']).__name__}) without finite support, so it cannot be "
                "enumerated (summed out) and UHA's dynamics need a continuous state. "
                "Marginalize it out of the model by hand, truncate it to a finite support "
                "(e.g. a Categorical over 0..N), or condition on it."
            )
        names.append(name)
    if names:
        try:
            importlib.import_module("funsor")
        except ImportError as err:
            raise ImportError(
                f"{owner}: latent site(s) {names} are discrete; they are summed out of "
                "the model by enumeration, which needs funsor: " + EXTRA + "."
            ) from err
    return tuple(names)


def scopes_renaming_plates(model, args, kwargs) -> list:
    """The prefixes of the ``numpyro.handlers.scope`` handlers that rename a plate of
    ``model`` (those without ``hide_types=["plate"]``), found by running it once under a
    seed; empty if none, or if the model cannot run."""
    from numpyro.primitives import _PYRO_STACK

    found = []

    class _Look(Messenger):
        def process_message(self, msg):
            if msg["type"] != "plate":
                return
            for h in _PYRO_STACK:
                if isinstance(h, handlers.scope) and "plate" not in h.hide_types:
                    if h.prefix not in found:
                        found.append(h.prefix)

    try:
        with handlers.trace(), handlers.seed(rng_seed=0):
            _Look(model)(*args, **kwargs)
    except Exception:  # noqa: BLE001 -- a hint only; the model's own error is reported
        return []
    return found


def enumeration_failed(names, err, scoped=()) -> str:
    """The message for a model that raised when run with its discrete sites ``names``
    enumerated (NumPyro's NUTS raises the same). ``scoped``: the prefixes of the
    ``scope`` handlers that rename the model's plates, which enumeration cannot follow."""
    inside = enumeration_failed_inside(err)
    if inside:
        return (
            f"UHAGuide: NumPyro's enumeration failed inside NumPyro ({type(err).__name__} "
            f"{str(err)!r} raised in {inside}) when the model "
            f"ran with its discrete latent site(s) {list(names)[:6]} enumerated, as "
            "NumPyro's NUTS and TraceEnum_ELBO run it, which fail on it the same way. One "
            "known trigger: a continuous latent sampled inside "
            "numpyro.contrib.control_flow.scan beside an enumerated site; sample it once "
            "outside the scan (or stack per-step values drawn outside it)."
        )
    if scoped:
        return (
            f"UHAGuide: the model raised {type(err).__name__}: {err} -- when run with its "
            f"discrete latent site(s) {list(names)[:6]} enumerated, as NumPyro's NUTS runs "
            "it too. Its plates are renamed by numpyro.handlers.scope (prefix "
            f"{', '.join(repr(p) for p in scoped)}), and enumeration's plate dimensions "
            "keep the plates' own names, so the two do not meet: pass "
            "hide_types=['plate'] to that scope (its sample sites keep their prefix)."
        )
    return (
        f"UHAGuide: the model raised {type(err).__name__}: {err} -- when run with its "
        f"discrete latent site(s) {list(names)[:6]} enumerated, as NumPyro's NUTS runs "
        "it too. Enumeration puts each discrete site's values in a new dimension left of "
        "the model's plates, so the model must broadcast: batch dimensions declared with "
        "numpyro.plate (not .expand([n]).to_event(1) of a distribution whose parameters "
        "depend on a discrete site), and indexing that keeps leading dimensions (x[..., i]"
        " rather than x[i]; Vindex from numpyro.contrib.indexing)."
    )


def enumeration_failed_inside(err) -> str:
    """``file:line`` of the innermost frame of ``err``'s traceback where it lies in NumPyro's
    enumeration code (``numpyro/contrib/funsor``), on an ``AssertionError`` (an internal
    check failing, not a message for the user); ``""`` otherwise."""
    if not isinstance(err, AssertionError):
        return ""
    import traceback

    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        path = frame.filename.replace("\\", "/")
        if "numpyro/contrib/funsor/" in path:
            return f"numpyro/contrib/funsor/{path.rsplit('numpyro/contrib/funsor/', 1)[1]}:{frame.lineno}"
    return ""


def plate_nesting(model_trace) -> int:
    """The model's plate nesting (enumeration dimensions go left of it)."""
    return _guess_max_plate_nesting(model_trace)


def enumerated(model, max_plate_nesting: int):
    """``model`` with every discrete latent site enumerated in parallel, left of its
    ``max_plate_nesting`` plate dimensions."""
    from numpyro.contrib.funsor import config_enumerate, enum

    return enum(config_enumerate(model), -max_plate_nesting - 1)


def kept_entries(site):
    """Which entries of a discrete site the model counts (its masks, from
    ``numpyro.handlers.mask`` or ``obs_mask``, broadcast to the site's batch shape), and
    the size of its support: ``(keep, size)``."""
    fn = site["fn"]
    # batch and event entries: a Masked distribution under Independent masks event entries
    keep = jnp.ones(fn.shape(), bool)
    while True:
        if isinstance(fn, dist.MaskedDistribution):
            keep = keep & jnp.broadcast_to(jnp.asarray(fn._mask, bool), keep.shape)
        elif not isinstance(fn, (dist.ExpandedDistribution, dist.Independent)):
            break
        fn = fn.base_dist
    return keep, fn.enumerate_support(expand=False).shape[0]


def masked_out_log_count(model_trace, names):
    """Σ over the discrete sites ``names`` of log |support| for each entry the model
    masks out. Summed out, such an entry counts 1 for each of its values (its masked
    log density is 0), which adds log |support| to log Σ_c p(x, z, c) and to log Z but
    nothing that depends on z; the guide removes it, so that log Z is the model's, as
    for masked-out continuous entries (``_masked.py``). E.g. a hidden Markov model's
    padding steps past each sequence's length (numpyro's ``hmm_enum`` example)."""
    total = jnp.zeros(())
    for name in names:
        keep, size = kept_entries(model_trace[name])
        total = total + jnp.sum(~keep) * math.log(size)
    return total


def marginal_log_density(model, max_plate_nesting, args, kwargs, values):
    """log Σ_c p(x, z, c) at constrained continuous ``values`` z (Jacobians not
    included: the caller's, as :func:`numpyro.infer.util.log_density`)."""
    from numpyro.contrib.funsor import log_density as enum_log_density

    return enum_log_density(enumerated(model, max_plate_nesting), args, kwargs, values)[0]


def log_conditional(model, max_plate_nesting, names, args, kwargs, values, drawn):
    """log p(c | z, x) = log p(x, z, c) - log Σ_c p(x, z, c) of the discrete sites
    ``names`` at their ``drawn`` values, at constrained continuous ``values`` z; the
    marginal less the masked-out entries (:func:`masked_out_log_count`, read from the
    joint's trace), as in the chain's target."""
    with handlers.block():
        joint, joint_trace = log_density(
            handlers.seed(model, 0), args, kwargs, {**values, **drawn}
        )
        marginal = marginal_log_density(
            handlers.seed(model, 0), max_plate_nesting, args, kwargs, values
        ) - masked_out_log_count(joint_trace, names)
    return jnp.asarray(joint - marginal)


def draw_discrete(rng_key, model, max_plate_nesting, names, args, kwargs, values):
    """The discrete sites ``names`` drawn from p(c | z, x) at constrained continuous
    ``values`` z, and log p(c | z, x): ``({name: value}, log_prob)``."""
    from numpyro.contrib.funsor import config_enumerate, infer_discrete

    conditioned = handlers.substitute(model, data=values)
    sampler = infer_discrete(
        config_enumerate(conditioned), first_available_dim=-max_plate_nesting - 1,
        temperature=1, rng_key=rng_key,
    )
    with handlers.block():
        trace = handlers.trace(handlers.seed(sampler, 0)).get_trace(*args, **kwargs)
    drawn = {name: trace[name]["value"] for name in names}
    return drawn, log_conditional(model, max_plate_nesting, names, args, kwargs, values, drawn)


def draw_discrete_from_prior(rng_key, model, max_plate_nesting, names, args, kwargs, values):
    """The discrete sites ``names`` drawn from their prior p(c | z) at constrained
    continuous ``values`` z, and log p(c | z, x) = log p(x, z, c) - log p(x, z) (the
    marginal summed by funsor, as in the chain's target): ``({name: value},
    log_prob)``. For a guide that cannot draw c from p(c | z, x) (a hidden Markov
    chain): with log p(c | z, x) in its density, any ELBO's term for (z, c) is
    log p(x, z, c) - log q(z) - log p(c | z, x) = log p(x, z) - log q(z), the UHA log
    weight, for *every* c of positive probability, so c may come from anywhere; the
    prior given z is one that NumPyro can draw from every model."""
    with handlers.block():
        trace = handlers.trace(
            handlers.seed(handlers.substitute(model, data=values), rng_key)
        ).get_trace(*args, **kwargs)
    drawn = {name: trace[name]["value"] for name in names}
    return drawn, log_conditional(model, max_plate_nesting, names, args, kwargs, values, drawn)


@contextlib.contextmanager
def discrete_sites_allowed(names):
    """Within the block, NumPyro's AutoGuide setup lets the discrete latent sites
    ``names`` through. Its prototype loop refuses every discrete latent site ("Continuous
    inference cannot handle discrete sample site"), also an enumerated one that no guide
    site will stand for; NumPyro's own answer is to hide the site from the guide
    (``handlers.block``), which would also hide it from NumPyro's initialization, whose
    potential energy must sum it out. The loop's check (``helpful_support_errors`` around
    ``biject_to`` of the support) is passed over for these sites only."""
    names = frozenset(names)
    if not names:
        yield
        return
    with _LOCK:
        original = _autoguide.helpful_support_errors

        @contextlib.contextmanager
        def helpful_support_errors(site, *args, **kwargs):
            if site.get("name") in names and site["fn"].support.is_discrete:
                try:
                    yield
                except NotImplementedError:  # biject_to of a discrete support
                    pass
                return
            with original(site, *args, **kwargs):
                yield

        _autoguide.helpful_support_errors = helpful_support_errors
        try:
            yield
        finally:
            _autoguide.helpful_support_errors = original


def sampler_problem(draw, inputs, names):
    """Why ``draw`` (the guide's conditional draw of the discrete sites ``names``, called
    with ``inputs``) cannot run, as ``(reason, cause)``, or ``None`` where it can:
    NumPyro's ``infer_discrete`` raises (e.g. discrete sites inside
    ``numpyro.contrib.control_flow.scan``), or its program needs an array too large to
    hold (a chain of dependent discrete sites). Traced only (``jax.make_jaxpr``): nothing
    is compiled or allocated. Warnings are not failures here: the trace runs with them
    ignored, so a filter that turns one into an error (``-W error``; NumPyro's
    ``infer_discrete`` warns of float64 requests on some models) does not change which
    sites are drawn (the draws themselves still warn)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            jaxpr = jax.make_jaxpr(draw)(*inputs)
    except Exception as err:  # noqa: BLE001 - reported by the caller, with the cause
        why = f"NumPyro's infer_discrete fails on it ({type(err).__name__}: {err})"
        masked = [n for n in names if n.endswith("_unobserved")]
        if masked:
            why += (
                f"; {masked} come from obs_mask on a discrete site, on which "
                "infer_discrete (and NumPyro's Predictive(..., infer_discrete=True)) "
                "fails: give the labelled and the unlabelled data a site each (observed, "
                "and latent) to have them drawn"
            )
        return why, err
    largest = max(
        (math.prod(v.aval.shape) for eqn in jaxpr.jaxpr.eqns for v in eqn.outvars
         if hasattr(v.aval, "shape")),
        default=0,
    )
    if largest > MAX_SAMPLER_ELEMENTS:
        return (
            f"drawing them with NumPyro's infer_discrete needs an array of {largest:.3g} "
            "elements (funsor's backward sampling of a chain of dependent discrete sites "
            "builds the joint table of the whole chain)"
        ), None
    return None


def undrawn_message(names, why, dependents) -> str:
    """The setup warning of a guide that cannot draw its discrete sites ``names`` from
    p(c | z, x) (``why``: :func:`sampler_problem`'s reason)."""
    shown = f"{list(names)[:6]}{' ...' if len(names) > 6 else ''}"
    text = (
        f"UHAGuide: the discrete latent site(s) {shown} are summed out of UHA's target, "
        f"but the guide cannot draw them from their conditional p(c | z, x): {why}. It "
        "draws them from their prior p(c | z) instead, with log p(c | z, x) = "
        "log p(x, z, c) - log p(x, z) in its density, so that every ELBO's term is still "
        "UHA's log weight on the marginal (training, log_z and the estimators are exact); "
        "but these draws of them are not posterior draws: sample_posterior leaves them out"
    )
    if dependents:
        text += f", with the deterministic site(s) {list(dependents)} that depend on them"
    return text + (
        ", and in Predictive they (and everything downstream of them) are prior draws "
        "given the continuous ones."
    )


def caller(cls):
    """The nearest object of type ``cls`` whose method is on the Python call stack (the
    ``self`` of a calling frame), or ``None``: which NumPyro program runs a guide
    (``Predictive``), which NumPyro's handler stack does not say."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, cls):
            return owner
        frame = frame.f_back
    return None


def enumerating() -> bool:
    """Whether a NumPyro funsor ``enum`` handler is active (``TraceEnum_ELBO`` runs the
    guide and the model under one)."""
    from numpyro.contrib.funsor.enum_messenger import BaseEnumMessenger
    from numpyro.primitives import _PYRO_STACK

    return any(isinstance(handler, BaseEnumMessenger) for handler in _PYRO_STACK)


def check_undrawn_context(names, scanned):
    """Called by a guide that draws its discrete sites ``names`` from their prior (see
    :func:`undrawn_message`); ``scanned``: those of them inside NumPyro's ``scan``.
    Raises under enumeration (``TraceEnum_ELBO``) where some are scanned: NumPyro's
    enumerated ``scan`` does not replay the guide's values, so the model would enumerate
    them while the guide's density counts its own draws (measured: an ELBO 134 nats off
    on a 10-step HMM). Warns in ``Predictive``, whose draws of them are prior draws."""
    if scanned and enumerating():
        raise ValueError(
            f"UHAGuide: TraceEnum_ELBO cannot train this guide on this model: the discrete "
            f"latent site(s) {list(scanned)[:6]} are inside numpyro.contrib.control_flow."
            "scan, whose enumerated form does not replay the guide's values of them (the "
            "ELBO would be wrong). Use Trace_ELBO (or TraceGraph_ELBO): with this guide "
            "their terms are UHA's log weights on the marginal, as TraceEnum_ELBO's would be."
        )
    from numpyro.infer import Predictive

    if caller(Predictive) is not None:
        warnings.warn(
            f"UHAGuide: in Predictive, the discrete latent site(s) {list(names)[:6]} are "
            "drawn from their prior given the guide's continuous draws (the guide cannot "
            "draw them from p(c | z, x) for this model): they, and sites that depend on "
            "them, are not posterior (predictive) draws.",
            UserWarning, stacklevel=3,
        )


def dependent_deterministic(model, max_plate_nesting, args, kwargs, values) -> tuple:
    """The deterministic sites of ``model`` whose values depend on its discrete latent
    sites, at constrained continuous ``values``: those whose shape changes when the
    discrete sites are enumerated (their values laid out along new dimensions)."""
    with handlers.block():
        plain = handlers.trace(
            handlers.substitute(handlers.seed(model, 0), data=values)
        ).get_trace(*args, **kwargs)
        enum_trace = handlers.trace(
            enumerated(handlers.substitute(handlers.seed(model, 0), data=values),
                       max_plate_nesting)
        ).get_trace(*args, **kwargs)
    return tuple(
        name for name, site in plain.items()
        if site["type"] == "deterministic"
        and (name not in enum_trace
             or jnp.shape(enum_trace[name]["value"]) != jnp.shape(site["value"]))
    )


def pointwise_log_likelihood(model, max_plate_nesting, names, args, kwargs, values) -> dict:
    """log p(y | θ) of every observed site, per element of its batch shape, at one
    draw's ``values`` (every latent site, the discrete ``names`` included): each
    observed site's *local* discrete sites (in its plates only, e.g. a mixture's
    assignment of each data point) are summed out, the others (shared by several
    elements, e.g. a global switch) are held at their drawn values, as the continuous
    latents are. For LOO and WAIC, which need p(y_i | θ) with y_i's own latents summed out.
    """
    with handlers.block():
        plain = handlers.trace(handlers.substitute(handlers.seed(model, 0), data=values)).get_trace(
            *args, **kwargs
        )
    plates = {
        n: {f.name for f in site["cond_indep_stack"]} for n, site in plain.items()
        if site["type"] == "sample"
    }
    out = {}
    for name, site in plain.items():
        if site["type"] != "sample" or not site["is_observed"]:
            continue
        local = [c for c in names if plates[c] and plates[c] <= plates[name]]
        shared = [c for c in names if c not in local and c not in values]
        if shared:
            raise ValueError(
                f"log_likelihood: the observed site '{name}' depends on the discrete "
                f"latent site(s) {shared[:6]}, which are shared by several of its elements "
                "(not in its plates only, e.g. a hidden Markov chain's states) and which "
                "this guide does not draw: its elements have no pointwise likelihood given "
                "the continuous latents. Pass log_likelihood=False."
            )
        # conditioned, not substituted: the enumeration would overwrite a substituted
        # discrete value with its support (condition leaves deterministic sites, e.g. a
        # mean computed from c, to follow the enumerated values)
        held = {k: v for k, v in values.items() if k not in local}
        with handlers.block():
            enum_trace = handlers.trace(
                enumerated(handlers.condition(handlers.seed(model, 0), data=held),
                           max_plate_nesting)
            ).get_trace(*args, **kwargs)
        site_e = enum_trace[name]
        total = site_e["fn"].log_prob(site_e["value"])
        for c in local:
            total = total + enum_trace[c]["fn"].log_prob(enum_trace[c]["value"])
        batch_ndim = len(site["fn"].batch_shape)
        extra = tuple(range(jnp.ndim(total) - batch_ndim))  # the enumeration dimensions
        total = jax.scipy.special.logsumexp(total, axis=extra) if extra else total
        for c in local:  # a masked-out assignment counts each of its values once
            keep, size = kept_entries(plain[c])
            total = total - jnp.where(keep, 0.0, math.log(size))
        out[name] = jnp.broadcast_to(total, site["fn"].batch_shape)
    return out
