"""Does a fit degraded by a large learning rate warn? (docs/zoo.md, "Learning rates,
checked again")

Three regressions written for this check (ordinal logistic, negative-binomial, Weibull;
150 simulated points, seed 1), each fitted by ``UHAGuide(K=8)`` for ``--steps`` Adam
steps (1500) at each learning rate, then compared with NUTS (500 warm-up, 1000 draws) by
:func:`numpyro_uha.evaluation.compare_with_nuts` (2000 draws of ``sample_posterior``):
the largest gap of the draws' means in NUTS sds, the range of their sd ratios, and the
warnings of the fit and of the draws (which of them fired: the bias check, k̂, a
divergence, a fit worse than its start).

Run: ``python -m benchmarks.learning_rate_warnings [--models ordinal negbin weibull]
[--learning-rates 0.01 0.1]`` (~20 min on a 2-core CPU); ``--smoke``: one model, one
rate, few steps.
"""

from __future__ import annotations

import argparse
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import SVI, Trace_ELBO

from benchmarks.common import write_results
from numpyro_uha import UHAGuide
from numpyro_uha.evaluation import compare_with_nuts


def ordinal(X, y=None):
    b = numpyro.sample("b", dist.Normal(0, 2).expand([3]).to_event(1))
    c = numpyro.sample("c", dist.TransformedDistribution(
        dist.Normal(0, 3).expand([3]).to_event(1), dist.transforms.OrderedTransform()
    ))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.OrderedLogistic(X @ b, c), obs=y)


def negbin(X, y=None):
    b = numpyro.sample("b", dist.Normal(0, 1).expand([3]).to_event(1))
    a = numpyro.sample("a", dist.Normal(0, 2))
    phi = numpyro.sample("phi", dist.Gamma(2.0, 0.5))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(a + X @ b), phi), obs=y)


def weibull(X, y=None):
    b = numpyro.sample("b", dist.Normal(0, 1).expand([3]).to_event(1))
    k = numpyro.sample("k", dist.LogNormal(0.0, 0.5))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.Weibull(jnp.exp(0.5 + X @ b), k), obs=y)


MODELS = {"ordinal": ordinal, "negbin": negbin, "weibull": weibull}


def data(n=150):
    """The simulated covariates and each model's responses (seed 1)."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(n, 3)).astype(np.float32)
    eta = X @ np.array([0.8, -0.5, 0.3])
    ys = {
        "ordinal": np.digitize(eta + rng.logistic(size=n), [-1.0, 0.5, 2.0]).astype(np.int32),
        "negbin": rng.negative_binomial(3.0, 3.0 / (3.0 + np.exp(0.5 + eta))).astype(np.float32),
        "weibull": (np.exp(0.5 + eta) * rng.weibull(1.5, size=n)).astype(np.float32),
    }
    return jnp.asarray(X), {k: jnp.asarray(v) for k, v in ys.items()}


def _kind(message: str) -> str:
    """A warning's kind, by the words it starts with (for the table)."""
    for words, kind in [
        ("weights move the mean", "bias check"), ("weights say the approximation", "k̂"),
        ("divergences", "divergence"), ("made the approximation worse", "worse than start"),
    ]:
        if words in message:
            return kind
    return message[:40]


def run_one(name, lr, X, y, steps, num_draws, nuts_warmup, nuts_samples):
    model = MODELS[name]
    guide = UHAGuide(model, K=8)
    svi = SVI(model, guide, optax.adam(lr), Trace_ELBO())
    with warnings.catch_warnings(record=True) as fit_warnings:
        warnings.simplefilter("always")
        result = svi.run(jax.random.PRNGKey(1), steps, X, y, progress_bar=False)
    with warnings.catch_warnings(record=True) as draw_warnings:
        warnings.simplefilter("always")
        comparison = compare_with_nuts(
            guide, jax.random.PRNGKey(2), result.params, X, y, num_samples=nuts_samples,
            num_warmup=nuts_warmup, num_draws=num_draws,
        )
    table = comparison.table
    ratios = table["uha_std"] / table["nuts_std"]
    fit_messages = [str(w.message) for w in fit_warnings]
    draw_messages = [str(w.message) for w in draw_warnings]
    return {
        "model": name, "learning_rate": lr, "steps": steps,
        "final_loss": float(np.mean(np.asarray(result.losses)[-max(1, steps // 15):])),
        "max_abs_mean_gap_in_nuts_sds": float(np.max(np.abs(table["mean_error_in_sd"]))),
        "worst_element": str(table["index"][int(np.argmax(np.abs(table["mean_error_in_sd"])))]),
        "sd_ratio_min": float(ratios.min()), "sd_ratio_max": float(ratios.max()),
        "mean_gap_in_nuts_sds": dict(zip(table["index"], map(float, table["mean_error_in_sd"]))),
        "fit_warnings": fit_messages, "draw_warnings": draw_messages,
        "warned_by": sorted({_kind(m) for m in fit_messages + draw_messages}),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--learning-rates", nargs="+", type=float, default=[0.01, 0.1])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--name", default="learning_rate_warnings")
    parser.add_argument("--smoke", action="store_true", help="one model, one rate, few steps")
    args = parser.parse_args(argv)
    num_draws, nuts_warmup, nuts_samples = 2000, 500, 1000
    if args.smoke:
        args.models, args.learning_rates, args.steps = ["negbin"], [0.1], 20
        num_draws, nuts_warmup, nuts_samples = 100, 50, 50
    X, ys = data()
    runs = []
    for name in args.models:
        for lr in args.learning_rates:
            runs.append(run_one(name, lr, X, ys[name], args.steps, num_draws,
                                nuts_warmup, nuts_samples))
            print({k: runs[-1][k] for k in ("model", "learning_rate",
                   "max_abs_mean_gap_in_nuts_sds", "warned_by")}, flush=True)
    table = (
        f"`UHAGuide(K=8)`, {args.steps} Adam steps at each learning rate, against NUTS "
        f"({nuts_warmup} warm-up, {nuts_samples} draws) by `compare_with_nuts` ({num_draws} "
        "draws); one seed. Largest |mean gap| in NUTS sds (the element), the draws' sd / "
        "NUTS' sd over all elements, and which warnings fired (fit and draws).\n\n"
        "| model | learning rate | final loss | max mean gap (NUTS sds) | sd ratios | warned by |\n"
        "|---|---|---|---|---|---|\n"
    )
    for r in runs:
        table += (
            f"| {r['model']} | {r['learning_rate']:g} | {r['final_loss']:.2f} | "
            f"{r['max_abs_mean_gap_in_nuts_sds']:.2f} ({r['worst_element']}) | "
            f"{r['sd_ratio_min']:.2f}–{r['sd_ratio_max']:.2f} | "
            f"{', '.join(r['warned_by']) or 'nothing'} |\n"
        )
    path = write_results(args.name, {"runs": runs}, table)
    print(path.read_text())


if __name__ == "__main__":
    main()
