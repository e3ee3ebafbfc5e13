"""Is ``UHALocalGuide.global_log_z``'s log p(x) right, and its standard error honest?

On the two normal hierarchies of ``benchmarks.global_khat`` (60 groups, noise sd 0.3 and
1; their log p(x) is exact by quadrature, ``benchmarks.local_globals.exact``), a fit
(centered after 1500 steps for the well informed one, ``decenter=True`` after 6000 for
the weakly informed one: the good fits of that benchmark) is checked with ``--keys``
keys per setting of ``num_samples``: the mean of log_z against the exact value (its
bias: lower, by about se²/2 from the chains' shared noise), the spread of log_z over the
keys against the mean reported ``se`` (and its ``chains_se`` part), and the largest
|log_z − exact| / se.

    python -m benchmarks.global_log_z_calibration            # about 3 minutes on 2 cores
    python -m benchmarks.global_log_z_calibration --smoke
"""

from __future__ import annotations

import argparse
import warnings

import jax
import numpy as np

from benchmarks.common import write_results
from benchmarks.global_khat import BATCH, MODELS, fit
from benchmarks.local_globals import exact
from numpyro_uha import UHAFitWarning

FITS = [("normal_informed", 0.3, False, 1500), ("normal_weak", 1.0, True, 6000)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--num-samples", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--name", default="global_log_z_calibration")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    args = parser.parse_args(argv)
    fits, num_draws = FITS, 4000
    if args.smoke:
        fits, args.keys, args.num_samples, num_draws = [("normal_informed", 0.3, False, 20)], 2, [4], 100
    rows = []
    md = (
        f"`UHALocalGuide(K=8)`, minibatches of {BATCH}, Adam 1e-2 decaying tenfold; "
        f"`global_log_z` with {num_draws} draws, keys 100-{99 + args.keys}. Exact: "
        "quadrature on (mu, log tau). Bias: mean log_z − exact; spread: the sd of log_z "
        "over the keys; se: the mean reported se (chains' part in brackets); worst: the "
        "largest |log_z − exact| / se; warned: keys whose call warned.\n\n"
        "| model | fit | chains per point and draw | exact | mean log_z | bias | spread | se | worst | warned |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for name, noise, decenter, steps in fits:
        model, y, _ = MODELS[name]()
        ref = exact(y, noise)["log_z"]
        guide, params = fit(model, (y,), decenter, steps, BATCH)
        for num_samples in args.num_samples:
            results, warned = [], 0
            for key in range(args.keys):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    results.append(guide.global_log_z(
                        jax.random.PRNGKey(100 + key), params, y, BATCH,
                        num_draws=num_draws, num_samples=num_samples,
                    ))
                warned += any(issubclass(w.category, UHAFitWarning) for w in caught)
            log_z = np.array([r.log_z for r in results])
            se = np.array([r.se for r in results])
            row = {
                "model": name, "decenter": decenter, "steps": steps, "num_samples": num_samples,
                "exact": ref, "log_z": log_z.tolist(), "se": se.tolist(),
                "chains_se": [r.chains_se for r in results], "warned": warned,
            }
            rows.append(row)
            fit_name = f"{'decenter=True' if decenter else 'centered'}, {steps}"
            md += (
                f"| {name} | {fit_name} | {num_samples} | {ref:.3f} | {log_z.mean():.3f} "
                f"| {log_z.mean() - ref:+.3f} | {log_z.std(ddof=1):.3f} | {se.mean():.3f} "
                f"({np.mean(row['chains_se']):.3f}) | {np.max(np.abs(log_z - ref) / se):.2f} "
                f"| {warned} of {args.keys} |\n"
            )
            print(md.splitlines()[-1], flush=True)
    path = write_results(args.name, {"num_draws": num_draws, "rows": rows}, md)
    print(path.read_text())


if __name__ == "__main__":
    main()
