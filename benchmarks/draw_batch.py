"""Draws against ``sample_batch_size`` and the cost floor (issue 16, item 4).

For logistic regression on each dataset (``UHAGuide(K=32)``, untrained: the time does
not depend on the parameters' values), the time of ``--num-draws`` draws from
``guide.sample_posterior`` (compiled, after a first call) at several fixed
``sample_batch_size`` values and at the default (``None``: sized to the device), beside
the cost floor of :mod:`benchmarks.speed` (a jitted scan of K vectorized value-and-grad
evaluations of the log density at all the draws at once). Same process, same device.

Run: ``python -m benchmarks.draw_batch [--datasets sonar madelon] [--num-draws 10000]``.
"""

from __future__ import annotations

import argparse

import jax
import optax
from numpyro.infer import SVI, Trace_ELBO

from benchmarks.common import write_results
from benchmarks.common import median_time
from benchmarks.speed import cost_floor, sample_time
from numpyro_uha import UHAGuide
from numpyro_uha.datasets import load_logistic_regression, logistic_regression_model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["sonar", "madelon"])
    parser.add_argument("--num-draws", type=int, default=10000)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--K", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--name", default="draw_batch")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.datasets, args.num_draws, args.batch_sizes, args.K, args.repeats = ["sonar"], 100, [64], 2, 2
    model = logistic_regression_model
    rows = {}
    for dataset in args.datasets:
        X, y = load_logistic_regression(dataset)
        d = int(X.shape[1])
        floor = cost_floor(model, X, y, d, args.K, args.num_draws, args.repeats)
        row = {"d": d, "floor_s": floor, "by_batch": {}}
        for batch in [None, *args.batch_sizes]:
            guide = UHAGuide(model, K=args.K, warm_start_steps=0, sample_batch_size=batch)
            svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
            params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, y))
            first, steady = sample_time(guide, params, X, y, args.num_draws, args.repeats)
            # the same draws under the user's own jax.jit: one program, no host-side
            # work around it (no checks of params, weights or data): what the per-call
            # work of the plain call costs is the difference
            jitted = jax.jit(lambda key, params, X, y: guide.sample_posterior(
                key, params, X, y, sample_shape=(args.num_draws,)))
            jax.block_until_ready(jitted(jax.random.PRNGKey(2), params, X, y))
            in_jit = median_time(jitted, args.repeats, jax.random.PRNGKey(3), params, X, y)
            row["by_batch"]["default" if batch is None else str(batch)] = {
                "sample_batch_size": guide.sample_batch_size, "first_s": first, "steady_s": steady,
                "over_floor": steady / floor, "jitted_s": in_jit, "over_jitted": steady / in_jit,
            }
            print(dataset, batch, row["by_batch"], flush=True)
        rows[dataset] = row

    device = jax.devices()[0]
    md = (
        f"{args.num_draws} draws of `sample_posterior` (compiled; median of {args.repeats} calls "
        f"after a first) on {device.platform} ({device.device_kind}), logistic regression, "
        f"K = {args.K}, against the cost floor (a jitted scan of K vectorized value-and-grad "
        "evaluations at all the draws at once). `default` is `sample_batch_size=None`, sized "
        "to the device (its value in brackets). *In jit*: the same call inside the user's "
        "own `jax.jit` (median of as many calls): one program with no host-side work (no "
        "checks of params, weights or data), but traced it runs its batches in one "
        "`lax.scan` of equal batches of at most `sample_batch_size` instead of chunks of a "
        "fixed width: where it is faster (one batch, as on a GPU), the difference is the "
        "plain call's per-call work; where slower, the scan costs more than that work.\n\n"
        "| dataset | d | sample_batch_size | draws (s) | draws / floor | in jit (s) | "
        "draws / in jit | first call (s) |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    for dataset, row in rows.items():
        for label, r in row["by_batch"].items():
            size = f"default ({r['sample_batch_size']})" if label == "default" else label
            md += (f"| {dataset} | {row['d']} | {size} | {r['steady_s']:.4f} | "
                   f"{r['over_floor']:.2f} | {r['jitted_s']:.4f} | {r['over_jitted']:.2f} | "
                   f"{r['first_s']:.2f} |\n")
        md += f"| {dataset} | {row['d']} | floor | {row['floor_s']:.4f} | 1.00 | | | |\n"
    path = write_results(args.name, {"rows": rows, "args": vars(args)}, md)
    print(path.read_text())


if __name__ == "__main__":
    main()
