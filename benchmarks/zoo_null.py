"""How the zoo's score treats *exact* draws: its noise floor on the funnel.

The zoo scores 2000 draws against a NUTS reference (max |mean error| / sd ≤ 0.5 and mean
|log sd ratio| ≤ 0.3 is "right"). On Neal's funnel, x's marginals are heavy-tailed (sd
e^(9/4), carried by v's upper tail), so a 2000-draw sd is itself noisy. This scores
``--repeats`` sets of 2000 exact draws (v ~ N(0, 3²), x = e^(v/2) z) with the zoo's own
``moment_errors`` against the cached reference, and reports the quantiles of both scores
and how often exact draws are called wrong.

    python -m benchmarks.zoo_null
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.common import write_results
from benchmarks.zoo import load_reference, moment_errors


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--num-draws", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="zoo_null_funnel")
    args = p.parse_args(argv)
    moments, _ = load_reference("funnel")
    rng = np.random.default_rng(args.seed)
    mean_err, log_sd = [], []
    for _ in range(args.repeats):
        v = 3.0 * rng.standard_normal(args.num_draws)
        x = np.exp(v / 2)[:, None] * rng.standard_normal((args.num_draws, 4))
        scores = moment_errors({"v": v, "x": x}, moments)
        mean_err.append(scores["max_mean_err"])
        log_sd.append(scores["mean_log_sd_ratio"])
    mean_err, log_sd = np.array(mean_err), np.array(log_sd)
    qs = [0.05, 0.5, 0.95, 0.99]
    wrong = (mean_err > 0.5) | (log_sd > 0.3)
    payload = {
        "repeats": args.repeats, "num_draws": args.num_draws, "seed": args.seed,
        "quantiles": qs,
        "max_mean_err_quantiles": np.quantile(mean_err, qs).tolist(),
        "mean_log_sd_ratio_quantiles": np.quantile(log_sd, qs).tolist(),
        "fraction_wrong": float(wrong.mean()),
    }
    table = (
        f"{args.repeats} sets of {args.num_draws} exact funnel draws (numpy seed {args.seed}), "
        "scored against the zoo's cached NUTS reference by `benchmarks.zoo.moment_errors`.\n\n"
        "| score | 5 % | 50 % | 95 % | 99 % |\n|---|---|---|---|---|\n"
        + "".join(
            f"| {label} | " + " | ".join(f"{q:.3f}" for q in np.quantile(vals, qs)) + " |\n"
            for label, vals in [("max of abs(mean err) / sd", mean_err), ("mean of abs(log sd ratio)", log_sd)]
        )
        + f"\nExact draws scored wrong (the zoo's bar): {wrong.mean():.1%}.\n"
    )
    path = write_results(args.name, payload, table)
    print(path.read_text())


if __name__ == "__main__":
    main()
