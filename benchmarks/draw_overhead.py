"""Where the time of one ``UHAGuide.sample_posterior`` call goes (issue 16, draws on a GPU).

On a GPU the chain of 10 000 draws takes about a millisecond, so the work around it (the
checks of the draws' log weights, the slice to ``num_draws``, each dispatch and each wait
for the device) is a large share of a call. This times, on one untrained logistic
regression guide (K = 32; untrained, or after ``--warm-start-steps``) and in one
process, medians of ``--repeats`` calls after two:

- ``plain``: ``sample_posterior`` as a user calls it (the key made once, outside);
- ``keep``: the same with ``nonfinite="keep"``, which skips every check of the weights;
- ``with a start``: plain with a start ELBO to compare with (the data's fingerprint is
  checked too; the default ``warm_start_steps`` gives a guide one);
- ``in jit``: the same call inside ``jax.jit`` (one program, no checks);
- ``chain``: the guide's compiled draw program alone, at the width a plain call uses
  (the key split, the chain and the summary of the weights the checks read);
- ``join``: the slice of that chunk to ``num_draws`` (dispatch and wait);
- ``summary copy``: that summary copied to the host again (JAX keeps an array's host
  copy: this times the bookkeeping, not a transfer); ``chain, summary to host``: the
  chain's program and the first copy of its summary, the plain call's wait;
- ``small program`` and ``..., 1 array to host`` / ``2 arrays to host``: a tiny program,
  then with one or both of its two fresh outputs copied (each array its own transfer: the
  summary is one array since 2026-12-04); ``..., output in host memory, to host``: the
  program writes that output to the host's memory itself (``jax.memory.Space.Host``);
- ``chain, summary to host (made in device / host memory)`` and ``plain, summary made in
  device / host memory``: the chain with its summary's first copy, and the plain call,
  with the summary left in the device's memory or written to the host's by the chain's
  program (``guide.SUMMARY_IN_HOST_MEMORY``);
- ``summary, own program``: the same summary made by a program of its own from the
  sliced weights, as calls of more than one chunk make it;
- ``k̂ from the summary`` and ``psis_khat``: Pareto k̂ on the host from the summary's
  largest weights, and from all of them (``psis_khat``, NumPy's partition first); ``k̂
  from the summary, the device's``: what the plain call does, the device's fit read
  (the host fits only near 0.7 or a rounding boundary);
- ``chain, checks made``: ``chain`` with the draws' mean and spread checks made in its
  program (what a call does where k̂ < 0.7, which an untrained guide's weights rarely
  are: the plain rows above then skip them);
- ``in plain: <part>``: the mean time per plain call spent in each of its parts
  (``_check_params``, the summary's copy to the host, which waits for the chain, k̂'s
  fit, the warnings, ...), timed inside the calls: what the plain call does around its
  chain, part by part;
- ``checks in NumPy``: the same checks as calls made them before they moved into the
  chain's program (up to 2^20 latent values): the draws copied to the host and the
  formulas of ``_weights.check_values`` in float64 NumPy.

It reads private parts of the guide (the compiled draw program, the summary) to take the
call apart; the plain, keep and in-jit rows use the public API only.
"""

from __future__ import annotations

import argparse
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
from numpyro.infer import SVI, Trace_ELBO

from benchmarks.common import write_results
from benchmarks.common import median_time
from numpyro_uha import UHAGuide
from numpyro_uha import guide as guide_module
from numpyro_uha._weights import (
    check_values,
    psis_khat,
    summary_from_values,
    summary_khat,
    summary_largest,
    weight_summary,
)
from numpyro_uha.datasets import load_logistic_regression, logistic_regression_model


def _median_ms(fn, repeats):
    """speed's median time of ``fn``, in ms, after two calls (compilation, caches)."""
    jax.block_until_ready(fn())
    jax.block_until_ready(fn())
    return 1e3 * median_time(fn, repeats)


#: the plain call's parts timed by ``_time_parts``: (owner, attribute); a wait for the
#: device shows in the part that waits (the summary's copy to the host)
PARTS = (
    (guide_module.UHAGuide, "_check_params"),
    (guide_module, "_chunkable"),
    (guide_module, "_first"),
    (guide_module, "_join"),
    (guide_module, "summary_from_values"),
    (guide_module, "weight_summary"),
    (guide_module, "summary_khat"),
    (guide_module, "_warn_poor_fit"),
    (guide_module.UHAGuide, "_warn_if_worse"),
    (guide_module.UHAGuide, "_warn_if_draws_biased"),
    (guide_module.UHAGuide, "_handle_nonfinite"),
)


def _try(rows, label, measure):
    """``rows[label] = measure()``, or NaN with the error printed (an experiment that a
    backend may not support)."""
    try:
        rows[label] = measure()
    except Exception as error:  # noqa: BLE001 - reported, the other rows go on
        print(f"{label}: {type(error).__name__}: {error}"[:2000])
        rows[label] = float("nan")


def _time_parts(fn, repeats):
    """Mean milliseconds per call of each of :data:`PARTS` over ``repeats`` calls of
    ``fn`` (wrapped with a timer for these calls only; parts not called are left out)."""
    spent, originals = {}, []
    for owner, name in PARTS:
        original = getattr(owner, name, None)
        if original is None:
            continue
        originals.append((owner, name, original))

        def timed(*a, _original=original, _name=name, **k):
            start = time.perf_counter()
            try:
                return _original(*a, **k)
            finally:
                spent[_name] = spent.get(_name, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)
    try:
        for _ in range(repeats):
            jax.block_until_ready(fn())
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
    return {name: 1e3 * t / repeats for name, t in sorted(spent.items(), key=lambda x: -x[1])}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="sonar")
    parser.add_argument("--num-draws", type=int, default=10000)
    parser.add_argument("--K", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warm-start-steps", type=int, default=0,
                        help="the guide's warm start (0: an untrained q, whose weights "
                             "are too heavy-tailed for the draws' mean and spread checks "
                             "to run; the default's Laplace q passes k̂ on easy data)")
    parser.add_argument("--sample-batch-size", type=int, default=None,
                        help="the guide's sample_batch_size (default: sized to the device)")
    parser.add_argument("--name", default="draw_overhead")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.num_draws, args.K, args.repeats = 300, 2, 2
    warnings.simplefilter("ignore")  # the untrained guide's weights warn at every call
    X, y = load_logistic_regression(args.dataset)
    model, n = logistic_regression_model, args.num_draws
    guide = UHAGuide(model, K=args.K, warm_start_steps=args.warm_start_steps,
                     sample_batch_size=args.sample_batch_size)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, y))
    key = jax.random.PRNGKey(3)

    def plain(**kw):
        return lambda: guide.sample_posterior(key, params, X, y, sample_shape=(n,), **kw)

    # k̂ of the timed call's own weights: below 0.7 (and with the weights not all
    # within 0.25 nats) the plain calls run the draws' mean and spread checks too
    khat = float(psis_khat(np.asarray(guide.sample_posterior_with_log_weights(
        key, params, X, y, sample_shape=(n,), nonfinite="keep").log_weights, np.float64)))
    rows = {}
    rows["plain"] = _median_ms(plain(), args.repeats)
    # the plain call's parts, each timed inside the calls (means over the calls)
    parts = _time_parts(plain(), args.repeats)
    rows["keep"] = _median_ms(plain(nonfinite="keep"), args.repeats)
    guide._start_elbo = (-1e9, 1.0)  # a start that never warns
    rows["with a start"] = _median_ms(plain(), args.repeats)
    guide._start_elbo = None
    jitted = jax.jit(lambda key, params: guide.sample_posterior(key, params, X, y, sample_shape=(n,)))
    rows["in jit"] = _median_ms(lambda: jitted(key, params), args.repeats)

    arrays, spec = guide_module._split_static(((X, y), {}))
    draw = guide._jitted_draws[spec]
    width = min(guide.sample_batch_size, guide_module._chunk_bucket(n))
    chain = dict(params=params, arrays=arrays, spec=spec, corrected=False, with_info=False,
                 with_samples=True, sharding=None)
    if -(-n // width) == 1:
        # the plain call's own program: a traced offset and checks flag (a constant one
        # would compile another program)
        chain.update(split=True, num_valid=np.int32(n), threshold=-np.inf,
                     offset=np.uint32(0), check=np.bool_(False),
                     summary_to_host=guide_module._summary_in_host_memory())
        rows["chain"] = _median_ms(lambda: draw(key, batch_size=width, **chain), args.repeats)
        *out, fused = draw(key, batch_size=width, **chain)
        rows["join"] = _median_ms(lambda: guide_module._join([tuple(out)], n), args.repeats)
        rows["summary copy"] = _median_ms(
            lambda: summary_from_values(fused, n, summary_largest(n)), args.repeats
        )
        # the chain with its summary copied to the host: the plain call's wait
        rows["chain, summary to host"] = _median_ms(
            lambda: jax.device_get(draw(key, batch_size=width, **chain)[5]), args.repeats
        )
        # copies of fresh (not yet copied) device arrays: one array against two
        small = jax.jit(lambda x: (x[:2].astype(jnp.int32), x + 1.0))
        x = jnp.zeros(400)
        rows["small program"] = _median_ms(lambda: small(x), args.repeats)
        rows["small program, 1 array to host"] = _median_ms(
            lambda: jax.device_get(small(x)[1]), args.repeats
        )
        rows["small program, 2 arrays to host"] = _median_ms(
            lambda: jax.device_get(small(x)), args.repeats
        )
        # the same with the program writing its second output to the host's memory
        small_host = jax.jit(
            lambda x: (x[:2].astype(jnp.int32), jax.device_put(x + 1.0, jax.memory.Space.Host))
        )
        _try(rows, "small program, output in host memory, to host", lambda: _median_ms(
            lambda: jax.device_get(small_host(x)[1]), args.repeats
        ))
        # the chain and the plain call with the summary in the device's and the host's
        # memory (guide.SUMMARY_IN_HOST_MEMORY; the plain rows above: its default here)
        for to_host in (False, True):
            where = "host" if to_host else "device"
            at = dict(chain, summary_to_host=to_host)
            _try(rows, f"chain, summary to host (made in {where} memory)", lambda: _median_ms(
                lambda: jax.device_get(draw(key, batch_size=width, **at)[5]), args.repeats
            ))
            default = guide_module.SUMMARY_IN_HOST_MEMORY
            guide_module.SUMMARY_IN_HOST_MEMORY = to_host
            try:
                _try(rows, f"plain, summary made in {where} memory",
                     lambda: _median_ms(plain(), args.repeats))
            finally:
                guide_module.SUMMARY_IN_HOST_MEMORY = default
        _, log_w, _, _, finite = guide_module._join([tuple(out)], n)
        rows["summary, own program"] = _median_ms(
            lambda: weight_summary(log_w, finite, khat=True), args.repeats
        )
        summary = summary_from_values(fused, n, summary_largest(n))
        rows["k̂ from the summary"] = _median_ms(lambda: summary_khat(summary, n), args.repeats)
        rows["k̂ from the summary, the device's"] = _median_ms(
            lambda: summary_khat(summary, n, exact=False), args.repeats
        )
        host = np.asarray(log_w, np.float64)
        rows["psis_khat"] = _median_ms(lambda: psis_khat(host), args.repeats)
        checked = dict(chain, check=np.bool_(True))
        rows["chain, checks made"] = _median_ms(
            lambda: draw(key, batch_size=width, **checked), args.repeats
        )
        latent = out[2][:n]

        def numpy_checks():
            lw, ok, z = jax.device_get((log_w, finite, latent))
            with np.errstate(invalid="ignore", divide="ignore"):
                return check_values(
                    np.asarray(lw, np.float64), np.asarray(ok, bool),
                    np.asarray(z, np.float64), xp=np,
                )

        rows["checks in NumPy"] = _median_ms(numpy_checks, args.repeats)

    for name, ms in parts.items():
        rows[f"in plain: {name}"] = ms

    device = jax.devices()[0]
    md = (
        f"One `sample_posterior` call of {n} draws taken apart: {args.dataset} logistic "
        f"regression, K = {args.K}, `UHAGuide` "
        + ("untrained" if not args.warm_start_steps else f"after {args.warm_start_steps} warm-start steps")
        + f" (the draws' Pareto k̂ {khat:.2f}: the plain calls "
        + ("run" if khat < 0.7 else "skip")
        + " the mean and spread checks), on "
        f"{device.platform} ({device.device_kind}); medians of {args.repeats} calls, milliseconds. The rows are "
        "described in `benchmarks/draw_overhead.py`; `chain` and what follows it only where "
        "the draws fit in one chunk (a GPU's default batch).\n\n"
        "| part | ms | / in jit |\n|---|---|---|\n"
    )
    for label, ms in rows.items():
        md += f"| {label} | {ms:.3f} | {ms / rows['in jit']:.2f} |\n"
    path = write_results(
        args.name, {"rows_ms": rows, "width": width, "khat": khat, "args": vars(args)}, md
    )
    print(path.read_text())


if __name__ == "__main__":
    main()
