"""Compile once: first call, second call and a new shape of every guide-level evaluation
function (issue 16, item 2).

A first call compiles; a second call with the same shapes should only run. For each zoo
model, a UHAGuide is trained briefly (compile time is the point here, not the fit), and
each of ``guide.sample_posterior``, ``log_z``, ``hais``, ``sandwich`` and
``log_z_bracket`` is timed on a *fresh copy* of the trained guide (unpickled: no compiled
program of another function's first call is reused, so every first call includes all of
its own compilation):

* **first**: the first call (tracing and compilation included);
* **second**: the same call again, same key and shapes (median of ``--repeats``);
* **new shape**: one call with a smaller ``sample_shape`` / ``num_draws`` (and fewer
  posterior draws for ``sandwich`` and ``log_z_bracket``) at the same chunk widths
  (2^k or 3 · 2^(k-1)), which needs no new chain program;
* **fewer**: 100 draws (a narrower width of their own, 128: before wider widths were
  reused, a new chain program), and **more**: 3000 draws (several chunks: before the
  chunks' keys were made in the chain's program, a second chain program beside the
  one-chunk one), then **more again**: 2500 draws, as many chunks as 3000 (the weight
  summary and the draws' checks are taken over the joined chunks, padding masked out:
  one program per chunk count, where before 2026-12-02 it was one per draw count).

Each timing also counts the XLA compilations it ran (JAX's
``/jax/core/compile/backend_compile_duration`` event): 0 in a second call means the time
left is the computation itself.

For comparison, the rows marked *per-call jit* time the functional layer on the guide's
log density (``annealed_hais``, ``annealed_sandwich``, ``log_z_bracket_from_draws`` on
``guide.get_logdensity_fn(params, *args)``): key by key the same estimates, and exactly
what the guide-level ``hais``, ``sandwich`` and ``log_z_bracket`` ran before they
compiled once (every call compiled anew).

Beside them, for scale, the same for NumPyro's ``AutoNormal.sample_posterior`` and
``numpyro.infer.Predictive`` (the model's posterior predictive under AutoNormal), which
are not jitted and retrace on every call. The posterior draws ``sandwich`` and
``log_z_bracket`` need are the UHA guide's own (fine for timing; not exact posterior
draws, so the upper bounds mean nothing here). Every time is wall-clock seconds in one
process, on a machine that may be shared: the ratios are what matters.

``UHALocalGuide`` (one chain per data point of a minibatch) gets the same for its
``sample_posterior`` and ``log_z`` on the local-latent models of
``benchmarks.user_models_local`` (the first ``B`` data points, every global latent fixed
at its posterior mean for ``log_z``), beside ``AutoNormal.sample_posterior`` there.

    python -m benchmarks.compile_once               # hierarchical_logistic, gp_rbf, lkj_mvn
    python -m benchmarks.compile_once --smoke       # tiny sizes, for the test suite
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time

import jax
import numpy as np
from jax import monitoring
from numpyro.infer import Predictive, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from benchmarks.common import fit, write_results
from benchmarks.user_models_local import MODELS as LOCAL_MODELS
from benchmarks.zoo_models import ZOO
from numpyro_uha import UHAGuide, UHALocalGuide
from numpyro_uha.guide import _chunk_bucket
from numpyro_uha.evaluation import (
    annealed_hais,
    annealed_sandwich,
    hais,
    log_z,
    log_z_bracket,
    log_z_bracket_from_draws,
    sandwich,
)

#: The functions timed, in table order.
FUNCTIONS = (
    "UHA sample_posterior",
    "log_z",
    "hais",
    "sandwich",
    "log_z_bracket",
    "annealed_hais (per-call jit)",
    "annealed_sandwich (per-call jit)",
    "log_z_bracket_from_draws (per-call jit)",
    "AutoNormal sample_posterior",
    "Predictive (AutoNormal)",
)

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_compiles = [0]


def _count_compiles(event, duration, **kwargs):
    if event == COMPILE_EVENT:
        _compiles[0] += 1


def _timed(fn):
    """(seconds, XLA compilations) of one call of ``fn``."""
    before = _compiles[0]
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start, _compiles[0] - before


def _time_calls(first_call, new_shape_call, repeats, fewer_call=None, more_call=None,
                more_again_call=None):
    """Seconds and compilations: ``first_call`` once, again (median of ``repeats``),
    then ``new_shape_call``, ``fewer_call``, ``more_call`` and ``more_again_call`` once
    each (where given)."""
    first, first_compiles = _timed(first_call)
    again = [_timed(first_call) for _ in range(repeats)]
    second = statistics.median(t for t, _ in again)
    new_shape, new_compiles = _timed(new_shape_call)
    out = {
        "first_s": first, "second_s": second, "ratio": first / second, "new_shape_s": new_shape,
        "first_compiles": first_compiles, "second_compiles": max(c for _, c in again),
        "new_shape_compiles": new_compiles,
    }
    for name, call in (("fewer", fewer_call), ("more", more_call),
                       ("more_again", more_again_call)):
        if call is not None:
            out[f"{name}_s"], out[f"{name}_compiles"] = _timed(call)
    return out


def _cell(row, name):
    """``seconds (compilations)`` of a row's ``name`` call, or – where it was not run."""
    if f"{name}_s" not in row:
        return "–"
    return f"{row[name + '_s']:.4f} ({row[name + '_compiles']})"


def _fresh(guide):
    """A copy of the trained guide with no compiled program (they are not pickled, and the
    evaluation layer keeps its own per guide object)."""
    return pickle.loads(pickle.dumps(guide))


def measure(name, args):
    entry = ZOO[name]
    model, model_args = entry.model, entry.args
    n, n_new = args.num_draws, args.new_num_draws
    n_few, n_more = args.fewer_num_draws, args.more_num_draws
    n_again = args.more_again_num_draws
    guide = UHAGuide(model, K=args.K, warm_start_steps=args.warm_start_steps)
    params, _ = fit(model, guide, Trace_ELBO(), args.steps, args.learning_rate, 0, model_args)
    normal = AutoNormal(model)
    normal_params, _ = fit(model, normal, Trace_ELBO(), args.steps, args.learning_rate, 0, model_args)

    # Posterior draws for sandwich and the bracket (the guide's own), latent sites only.
    draws = _fresh(guide).sample_posterior(jax.random.PRNGKey(9), params, *model_args, sample_shape=(n,))
    samples = {site: draws[site] for site in guide._init_locs}
    fewer = {site: value[:n_new] for site, value in samples.items()}
    fewest = {site: value[:n_few] for site, value in samples.items()}
    key = jax.random.PRNGKey(1)
    q_draws, q_new = args.q_draws_per_draw * n, args.q_draws_per_draw * n_new
    bracket_batch = args.bracket_batch_size

    def sample_posterior(g, m):
        return lambda: g.sample_posterior(key, params, *model_args, sample_shape=(m,))

    def log_z_call(g, m):
        return lambda: log_z(g, key, params, *model_args, num_draws=m).iw

    def hais_call(g, m):
        return lambda: hais(g, key, params, *model_args, num_draws=m).log_weights

    def sandwich_call(g, s, m):
        return lambda: sandwich(g, key, params, s, *model_args, num_draws=m).upper

    def bracket_call(g, s, m):
        return lambda: log_z_bracket(g, key, params, s, *model_args, num_q_draws=m,
                                     batch_size=bracket_batch).lower

    def sample_posterior_in_jit(g, m):
        jitted = jax.jit(lambda key, params: g.sample_posterior(key, params, *model_args, sample_shape=(m,)))
        return lambda: jitted(key, params)

    def counts(call, g, *first, new=(), few=(), more=()):
        """The first call's and the four other counts' calls of ``call`` on ``g``."""
        return (call(g, *first, n), call(g, *new, n_new), args.repeats,
                call(g, *few, n_few), call(g, *more, n_more), call(g, *more, n_again))

    rows = {}
    g = _fresh(guide)
    rows["UHA sample_posterior"] = _time_calls(*counts(sample_posterior, g))
    # the same draws in one program of the user's (no host-side work; a new shape is a
    # new program): the plain call's second time against the draws' own
    g = _fresh(guide)
    rows["UHA sample_posterior in jax.jit"] = _time_calls(*counts(sample_posterior_in_jit, g))
    g = _fresh(guide)
    rows["log_z"] = _time_calls(*counts(log_z_call, g))
    g = _fresh(guide)
    rows["hais"] = _time_calls(*counts(hais_call, g))
    g = _fresh(guide)
    # fewer: fewer posterior draws too; more: more forward draws, the same posterior draws
    rows["sandwich"] = _time_calls(*counts(
        sandwich_call, g, samples, new=(fewer,), few=(fewest,), more=(samples,)))
    g = _fresh(guide)
    rows["log_z_bracket"] = _time_calls(
        bracket_call(g, samples, q_draws), bracket_call(g, fewer, q_new), args.repeats
    )

    # The functional layer on the guide's log density: the guide-level path before.
    g = _fresh(guide)
    annealing = g.get_annealing_params(params)
    options = dict(num_leapfrog_steps=g.num_leapfrog_steps, integrator=g.integrator,
                   batch_size=g.sample_batch_size)

    def logdensity():
        return g.get_logdensity_fn(params, *model_args)

    def positions(s):
        return g.latent_from_samples(s, *model_args, params=params)

    def annealed_hais_call(m):
        return lambda: annealed_hais(key, logdensity(), annealing, m, **options).log_weights

    def annealed_sandwich_call(s, m):
        return lambda: annealed_sandwich(key, logdensity(), annealing, positions(s), num_draws=m,
                                         **options).upper

    def bracket_draws_call(s, m):
        return lambda: log_z_bracket_from_draws(key, logdensity(), positions(s), num_q_draws=m,
                                                batch_size=bracket_batch).lower

    before = max(1, args.repeats // 3)  # every call compiles: fewer repeats
    rows["annealed_hais (per-call jit)"] = _time_calls(annealed_hais_call(n), annealed_hais_call(n_new), before)
    rows["annealed_sandwich (per-call jit)"] = _time_calls(
        annealed_sandwich_call(samples, n), annealed_sandwich_call(fewer, n_new), before
    )
    rows["log_z_bracket_from_draws (per-call jit)"] = _time_calls(
        bracket_draws_call(samples, q_draws), bracket_draws_call(fewer, q_new), before
    )

    def normal_call(m):
        return lambda: normal.sample_posterior(key, normal_params, *model_args, sample_shape=(m,))

    def predictive_call(m):
        return lambda: Predictive(model, guide=normal, params=normal_params, num_samples=m)(key, *model_args)

    rows["AutoNormal sample_posterior"] = _time_calls(
        normal_call(n), normal_call(n_new), args.repeats, normal_call(n_few), normal_call(n_more),
        normal_call(n_again))
    rows["Predictive (AutoNormal)"] = _time_calls(
        predictive_call(n), predictive_call(n_new), args.repeats, predictive_call(n_few),
        predictive_call(n_more), predictive_call(n_again))
    return {"latent_dim": int(guide.latent_dim), "rows": rows}


def measure_local(name, args):
    """First, second and new-shape calls of UHALocalGuide's sample_posterior and log_z on
    a minibatch of one of ``benchmarks.user_models_local``'s models."""
    model, make_data, batch = LOCAL_MODELS[name]
    model_args = make_data(np.random.default_rng(0)) + (batch,)
    n, n_new = args.num_draws, args.new_num_draws
    guide = UHALocalGuide(model, K=args.K)
    params, _ = fit(model, guide, Trace_ELBO(), args.steps, args.learning_rate, 0, model_args)
    normal = AutoNormal(model)
    normal_params, _ = fit(model, normal, Trace_ELBO(), args.steps, args.learning_rate, 0, model_args)
    idx = np.arange(batch)
    key = jax.random.PRNGKey(1)
    draws = _fresh(guide).sample_posterior(key, params, *model_args, sample_shape=(100,),
                                           subsample_idx=idx)
    globals_ = {site: draws[site].mean(0) for site in guide._global_latents}

    def sample_posterior(g, m):
        return lambda: g.sample_posterior(key, params, *model_args, sample_shape=(m,),
                                          subsample_idx=idx)

    def log_z_call(g, m):
        return lambda: g.log_z(key, params, *model_args, num_samples=m, subsample_idx=idx,
                               global_values=globals_).log_z

    def normal_call(m):
        return lambda: normal.sample_posterior(key, normal_params, *model_args, sample_shape=(m,))

    n_few, n_more, n_again = args.fewer_num_draws, args.more_num_draws, args.more_again_num_draws
    g = _fresh(guide)
    rows = {"UHALocalGuide sample_posterior": _time_calls(
        sample_posterior(g, n), sample_posterior(g, n_new), args.repeats,
        sample_posterior(g, n_few), sample_posterior(g, n_more), sample_posterior(g, n_again))}
    g = _fresh(guide)
    rows["UHALocalGuide log_z"] = _time_calls(
        log_z_call(g, n), log_z_call(g, n_new), args.repeats, log_z_call(g, n_few),
        log_z_call(g, n_more), log_z_call(g, n_again))
    rows["AutoNormal sample_posterior"] = _time_calls(
        normal_call(n), normal_call(n_new), args.repeats, normal_call(n_few), normal_call(n_more),
        normal_call(n_again))
    return {"latent_dim": f"{guide.latent_dim} per data point, B = {batch}", "rows": rows}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=["hierarchical_logistic", "gp_rbf", "lkj_mvn"])
    parser.add_argument("--local-models", nargs="*", default=["gamma_frailty", "random_slopes"],
                        choices=list(LOCAL_MODELS), help="UHALocalGuide rows (K = --local-K)")
    parser.add_argument("--local-K", type=int, default=8)
    parser.add_argument("--K", type=int, default=32)
    parser.add_argument("--steps", type=int, default=200, help="SVI steps (compile time, not quality)")
    parser.add_argument("--warm-start-steps", type=int, default=200)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--num-draws", type=int, default=1000,
                        help="draws (and posterior draws for sandwich / log_z_bracket) of the first calls")
    parser.add_argument("--new-num-draws", type=int, default=800,
                        help="the new shape: at the same chunk width (2^k or 3 * 2^(k-1)) as --num-draws")
    parser.add_argument("--fewer-num-draws", type=int, default=100,
                        help="a smaller count, at a narrower width of its own (a new chain program before "
                             "wider widths were reused)")
    parser.add_argument("--more-num-draws", type=int, default=3000,
                        help="a count of several chunks")
    parser.add_argument("--more-again-num-draws", type=int, default=2500,
                        help="after --more-num-draws: another count of as many chunks")
    parser.add_argument("--q-draws-per-draw", type=int, default=10,
                        help="log_z_bracket's num_q_draws per draw")
    parser.add_argument("--bracket-batch-size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3, help="second calls timed (median)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    parser.add_argument("--name", default="compile_once")
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.K, args.steps, args.warm_start_steps = ["gp_rbf"], 2, 5, 10
        args.num_draws, args.new_num_draws, args.q_draws_per_draw = 40, 30, 2
        args.fewer_num_draws, args.more_num_draws, args.more_again_num_draws = 5, 90, 80
        args.bracket_batch_size, args.repeats = 64, 1
        args.local_models, args.local_K = ["t_scale_mixture"], 2

    for n, n_new in [(args.num_draws, args.new_num_draws),
                     (args.num_draws // 2, args.new_num_draws // 2)]:  # the bracket's halves
        if _chunk_bucket(n) != _chunk_bucket(n_new):
            parser.error(f"--new-num-draws: {n_new} draws run {_chunk_bucket(n_new)} wide, "
                         f"{n} draws {_chunk_bucket(n)} wide; pick one at the same width")
    monitoring.register_event_duration_secs_listener(_count_compiles)
    results = {}
    for name in args.models:
        results[name] = measure(name, args)
        print(name, {f: round(r["ratio"], 1) for f, r in results[name]["rows"].items()}, flush=True)
    local_results = {}
    for name in args.local_models:
        local_results[name] = measure_local(name, argparse.Namespace(**{**vars(args), "K": args.local_K}))
        print(name, {f: round(r["ratio"], 1) for f, r in local_results[name]["rows"].items()},
              flush=True)

    table = (
        f"UHAGuide(K = {args.K}) after {args.warm_start_steps} warm-start and {args.steps} SVI steps "
        f"(Adam {args.learning_rate:g}); AutoNormal after {args.steps} SVI steps. First call: "
        "compilation included, each UHA function on a fresh (unpickled) copy of the guide; "
        f"second: the same call again (median of {args.repeats}); new shape: "
        f"{args.new_num_draws} instead of {args.num_draws} draws (sample_shape, num_draws, and "
        f"posterior draws for sandwich and log_z_bracket; log_z_bracket: {args.q_draws_per_draw} "
        f"draws from q̂ per draw, batch_size {args.bracket_batch_size}), at the same chunk widths; "
        f"fewer: {args.fewer_num_draws} draws (a narrower width of their own: the chain program "
        "of a wider width already compiled runs them, up to 16 times wider); more: "
        f"{args.more_num_draws} draws (several chunks; sandwich: more forward draws, the same "
        "posterior draws; log_z_bracket: not run, –); more again: then "
        f"{args.more_again_num_draws} draws (as many chunks as {args.more_num_draws}: "
        "the weight summary over the joined chunks compiles per chunk count). "
        "hais and sandwich with the guide's sample_batch_size. Seconds, wall clock; in brackets "
        "the XLA compilations the call ran (second: the most over the repeats). *Per-call jit*: "
        "the functional layer on guide.get_logdensity_fn, the guide-level path before this "
        "change (the same estimates). *In jax.jit*: the same draws inside the user's own "
        "`jax.jit` (one program; no host-side checks; a new shape compiles a new program): "
        "what the draws themselves take. UHALocalGuide rows (K = "
        f"{args.local_K}, {args.steps} SVI steps, models of benchmarks.user_models_local): "
        "draws and log Z of the first B data points (log Z given the globals' posterior "
        "means), d its local dimension.\n\n"
        "| model | d | function | first (s) | second (s) | first / second (target ≥ 10) | new shape (s) "
        "| fewer (s) | more (s) | more again (s) |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for name, result in [*results.items(), *local_results.items()]:
        for function, row in result["rows"].items():
            table += (
                f"| {name} | {result['latent_dim']} | {function} | {row['first_s']:.3f} "
                f"({row['first_compiles']}) | {row['second_s']:.4f} ({row['second_compiles']}) | "
                f"{row['ratio']:.1f} | {row['new_shape_s']:.4f} ({row['new_shape_compiles']}) | "
                f"{_cell(row, 'fewer')} | {_cell(row, 'more')} | {_cell(row, 'more_again')} |\n"
            )
    path = write_results(
        args.name, {"settings": vars(args), "results": results, "local": local_results}, table
    )
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
