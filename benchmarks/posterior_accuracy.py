"""Posterior accuracy at equal gradient budgets (paper Appendix E).

Bayesian logistic regression (default: sonar, d = 61). A long NumPyro NUTS run gives the
reference covariance; then, for each budget B (counted in gradient evaluations of the log
density, the paper's unit) and seed, each method spends at most B and its posterior
covariance (and mean) is scored by the mean absolute error over all d² (d) entries:

* **NUTS** — half of B for warm-up, half for sampling (iterations chosen from the
  reference run's mean tree size; the table reports the gradients actually used).
* **mean-field VI** — ``AutoDiagonalNormal``, Adam, one-particle ELBO, B steps;
  covariance diag(scale²).
* **IW** — ``AutoDiagonalNormal`` warm-started by 1000 plain-VI steps, trained on the
  K = 32 importance-weighted bound (``RenyiELBO(alpha=0)``), then the rest of B spent on
  proposals in groups of 256, moments by self-normalized importance weighting.
* **UHA** — ``UHAGuide(K=32)`` (defaults: every group tuned, 1000-step warm start),
  trained with Adam, extrapolated to K = 256 (Appendix D), the rest of B spent on draws
  (charged K + 1 = 257 gradients each: the default position Verlet takes 256 gradients
  and one value, counted as a gradient; a training step likewise); moments of the draws as they are (unweighted, as the
  paper) and self-normalized by their weights.
* **UHA, full-rank q** — the same with ``base_dist="cholesky"``.

Training uses at most 3000 steps (the paper's protocol) and at most 80% of B, so that
every method keeps at least 20% of B for its draws (the paper's 3000 × 32 would exhaust
B = 1e5 before any draw).

    python -m benchmarks.posterior_accuracy --budgets 1e5 5e5 1e6 --seeds 0 1 2
    python -m benchmarks.posterior_accuracy --smoke
"""

from __future__ import annotations

import argparse
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC, NUTS, SVI, RenyiELBO, Trace_ELBO
from numpyro.infer.autoguide import AutoDiagonalNormal

from benchmarks.common import fit, model_logdensity, results_dir, write_results
from numpyro_uha import UHAGuide
from numpyro_uha.datasets import DATASETS, load_logistic_regression, logistic_regression_model

METHODS = ("NUTS", "mean-field VI", "IW", "UHA", "UHA (weighted)", "UHA full-rank q", "UHA full-rank q (weighted)")
WARM_START = 1000


def mean_and_cov(z, log_w=None):
    """Mean, covariance and ESS of the rows of z, self-normalized by exp(log_w) if given
    (the package's evaluation.weighted_moments gives means and standard deviations only)."""
    z = np.asarray(z, np.float64)
    if log_w is None:
        w = np.full(z.shape[0], 1.0 / z.shape[0])
    else:
        log_w = np.asarray(log_w, np.float64)
        w = np.exp(log_w - log_w.max())
        w /= w.sum()
    mean = w @ z
    centred = z - mean
    cov = (centred * w[:, None]).T @ centred
    if log_w is None and z.shape[0] > 1:
        cov *= z.shape[0] / (z.shape[0] - 1)
    ess = 1.0 / np.sum(w**2)
    return mean, cov, ess


def errors(mean, cov, ref):
    return {"cov_mae": float(np.mean(np.abs(cov - ref["cov"]))), "mean_mae": float(np.mean(np.abs(mean - ref["mean"])))}


def reference(model, model_args, args):
    mcmc = MCMC(NUTS(model), num_warmup=args.reference_warmup, num_samples=args.reference_samples,
                num_chains=args.reference_chains, chain_method="sequential", progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(12345), *model_args, extra_fields=("num_steps",))
    z = np.asarray(mcmc.get_samples()["w"], np.float64)
    steps = np.asarray(mcmc.get_extra_fields()["num_steps"])
    ess = np.asarray(effective_sample_size(np.asarray(mcmc.get_samples(group_by_chain=True)["w"], np.float64)))
    return {"mean": z.mean(0), "cov": np.cov(z, rowvar=False), "num_draws": z.shape[0],
            "median_ess": float(np.median(ess)), "mean_tree_size": float(steps.mean()),
            "seconds": time.perf_counter() - start}


def run_nuts(model, model_args, budget, seed, ref):
    per_iter = max(ref["mean_tree_size"], 1.0)
    warmup = max(int(budget / 2 / per_iter), 10)
    mcmc = MCMC(NUTS(model), num_warmup=warmup, num_samples=1, progress_bar=False)
    key = jax.random.PRNGKey(seed)
    key, sub = jax.random.split(key)
    mcmc.warmup(sub, *model_args, extra_fields=("num_steps",), collect_warmup=True)
    used = int(np.asarray(mcmc.get_extra_fields()["num_steps"]).sum())
    draws = []
    # Sample in rounds, re-estimating the tree size, until the budget is (nearly) spent.
    for _ in range(4):
        samples = int((budget - used) / per_iter)
        if samples < 2 or (draws and budget - used < 0.02 * budget):
            break
        mcmc.num_samples = samples
        key, sub = jax.random.split(key)
        mcmc.run(sub, *model_args, extra_fields=("num_steps",))
        steps = np.asarray(mcmc.get_extra_fields()["num_steps"])
        used += int(steps.sum())
        per_iter = max(float(steps.mean()), 1.0)
        draws.append(np.asarray(mcmc.get_samples()["w"]))
        mcmc.post_warmup_state = mcmc.last_state
    z = np.concatenate(draws)
    mean, cov, _ = mean_and_cov(z)
    return {**errors(mean, cov, ref), "gradients": used, "num_draws": z.shape[0]}


def run_vi(model, model_args, budget, seed, ref, args):
    guide = AutoDiagonalNormal(model)
    params, _ = fit(model, guide, Trace_ELBO(), int(budget), args.lr, seed, model_args)
    mean = np.asarray(params["auto_loc"], np.float64)
    cov = np.diag(np.asarray(params["auto_scale"], np.float64) ** 2)
    return {**errors(mean, cov, ref), "gradients": int(budget), "num_draws": None}


def training_steps(budget, per_step, fixed, args):
    return max(min(args.train_steps, int((0.8 * budget - fixed) / per_step)), 0)


def run_iw(model, model_args, budget, seed, ref, logdensity_fn, args):
    K = args.K
    guide = AutoDiagonalNormal(model)
    params, _ = fit(model, guide, Trace_ELBO(), WARM_START, 1e-2, seed, model_args)
    steps = training_steps(budget, K, WARM_START, args)
    if steps:
        params, _ = fit(model, guide, RenyiELBO(alpha=0.0, num_particles=K), steps, args.lr, seed, model_args,
                        init_params=params)
    used = WARM_START + steps * K
    n = int((budget - used) // args.K_sample) * args.K_sample
    loc, scale = params["auto_loc"], params["auto_scale"]
    z = loc + scale * jax.random.normal(jax.random.PRNGKey(10_000 + seed), (n, loc.shape[0]))
    log_q = jnp.sum(jax.scipy.stats.norm.logpdf(z, loc, scale), -1)
    log_w = jax.vmap(logdensity_fn)(z) - log_q
    mean, cov, ess = mean_and_cov(z, log_w)
    return {**errors(mean, cov, ref), "gradients": used + n, "num_draws": n, "ess": float(ess)}


def run_uha(model, model_args, budget, seed, ref, args, base_dist):
    guide = UHAGuide(model, K=args.K, base_dist=base_dist, warm_start_steps=WARM_START)
    steps = training_steps(budget, args.K + 1, WARM_START, args)
    svi = SVI(model, guide, optax.adam(args.lr), Trace_ELBO())
    params = svi.run(jax.random.PRNGKey(seed), steps, *model_args, progress_bar=False).params if steps else \
        svi.get_params(svi.init(jax.random.PRNGKey(seed), *model_args))
    used = WARM_START + steps * (args.K + 1)
    big, big_params = guide.extrapolate(params, args.K_sample) if args.K_sample != args.K else (guide, params)
    n = int((budget - used) // (args.K_sample + 1))
    out = {}
    if n < 2:
        return out
    draws = big.sample_posterior_with_log_weights(jax.random.PRNGKey(10_000 + seed), big_params, *model_args,
                                                  sample_shape=(n,))
    z = np.asarray(draws.latent)
    for weighted in (False, True):
        mean, cov, ess = mean_and_cov(z, draws.log_weights if weighted else None)
        out[weighted] = {**errors(mean, cov, ref), "gradients": used + n * (args.K_sample + 1), "num_draws": n,
                         "ess": float(ess), "elbo": float(np.mean(draws.log_weights))}
    return out


def plot(summary, budgets, ref_mae, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for method in METHODS:
        pts = [(b, summary[(method, b)]) for b in budgets if (method, b) in summary]
        if not pts:
            continue
        ax.errorbar([p[0] for p in pts], [p[1]["cov_mae_mean"] for p in pts],
                    yerr=[p[1]["cov_mae_se"] for p in pts], marker="o", ms=4, capsize=3, label=method)
    ax.axhline(ref_mae, color="gray", ls=":", lw=0.8, label="reference's own MC error (est.)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("budget B (gradient evaluations)")
    ax.set_ylabel("covariance MAE vs long NUTS")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", default="sonar", choices=sorted(DATASETS))
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--budgets", type=float, nargs="+", default=[1e5, 5e5, 1e6])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--K", type=int, default=32)
    parser.add_argument("--K-sample", type=int, default=256)
    parser.add_argument("--train-steps", type=int, default=3000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--reference-warmup", type=int, default=2000)
    parser.add_argument("--reference-samples", type=int, default=50_000)
    parser.add_argument("--reference-chains", type=int, default=2)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--name", default=None)
    args = parser.parse_args(argv)
    if args.smoke:
        args.budgets, args.seeds, args.K, args.K_sample, args.train_steps = [3e3], [0], 2, 4, 20
        args.reference_warmup, args.reference_samples, args.reference_chains = 50, 100, 1
    name = args.name or f"posterior_accuracy_{args.dataset}"

    X, y = load_logistic_regression(args.dataset, args.data_dir)
    model, model_args = logistic_regression_model, (X, y)
    ref = reference(model, model_args, args)
    print(f"reference: {ref['num_draws']} NUTS draws (median ESS {ref['median_ess']:.0f}), "
          f"mean tree size {ref['mean_tree_size']:.1f}, "
          f"{ref['seconds']:.0f}s", flush=True)
    logdensity_fn = model_logdensity(model, model_args)

    rows = []
    for budget in args.budgets:
        for seed in args.seeds:
            def add(method, result, seconds):
                rows.append({"method": method, "budget": budget, "seed": seed, "seconds": seconds, **result})
                print(f"B={budget:.0e} seed={seed} {method:28s} cov MAE {result['cov_mae']:.5f} "
                      f"mean MAE {result['mean_mae']:.4f} grads {result['gradients']} ({seconds:.1f}s)", flush=True)

            t = time.perf_counter()
            add("NUTS", run_nuts(model, model_args, budget, seed, ref), time.perf_counter() - t)
            t = time.perf_counter()
            add("mean-field VI", run_vi(model, model_args, budget, seed, ref, args), time.perf_counter() - t)
            t = time.perf_counter()
            add("IW", run_iw(model, model_args, budget, seed, ref, logdensity_fn, args), time.perf_counter() - t)
            for base_dist, label in (("diagonal", "UHA"), ("cholesky", "UHA full-rank q")):
                t = time.perf_counter()
                out = run_uha(model, model_args, budget, seed, ref, args, base_dist)
                seconds = time.perf_counter() - t
                if out:
                    add(label, out[False], seconds)
                    add(f"{label} (weighted)", out[True], seconds)

    summary = {}
    for method in METHODS:
        for budget in args.budgets:
            rs = [r for r in rows if r["method"] == method and r["budget"] == budget]
            if not rs:
                continue
            cov = np.array([r["cov_mae"] for r in rs])
            mean = np.array([r["mean_mae"] for r in rs])
            summary[(method, budget)] = {
                "cov_mae_mean": float(cov.mean()),
                "cov_mae_se": float(cov.std(ddof=1) / math.sqrt(len(rs))) if len(rs) > 1 else 0.0,
                "mean_mae_mean": float(mean.mean()),
                "gradients_max": int(max(r["gradients"] for r in rs)),
                "num_seeds": len(rs),
            }
    # Scale of the reference's own error: a covariance entry from N (here: the median
    # ESS) Gaussian draws has standard error sqrt((σ_ii σ_jj + σ_ij²) / N), and E|N(0, s²)|
    # = s·sqrt(2/π). Errors below this level cannot be told apart from the reference's.
    var = np.diag(ref["cov"])
    ref_mae = float(np.mean(np.sqrt((np.outer(var, var) + ref["cov"] ** 2) / ref["median_ess"])) * math.sqrt(2 / math.pi))
    plot_path = results_dir() / f"{name}.png"
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    plot(summary, args.budgets, ref_mae, plot_path)

    table = (
        f"Logistic regression on {args.dataset} (d = {DATASETS[args.dataset]}). Reference: NumPyro NUTS, "
        f"{args.reference_chains} chains × {args.reference_samples} draws after {args.reference_warmup} warm-up "
        f"(mean tree size {ref['mean_tree_size']:.1f}, median ESS {ref['median_ess']:.0f}); its own covariance "
        f"error is ≈ {ref_mae:.1e} on the MAE scale. Covariance (and mean) MAE over seeds {args.seeds}: mean ± se. "
        f"UHA/IW: K = {args.K} for training (≤ {args.train_steps} steps, ≤ 80% of B, Adam {args.lr}), draws at "
        f"K = {args.K_sample} (UHA extrapolated). 'gradients' is the most any seed used. Plot: `{plot_path.name}`.\n\n"
        "| method | " + " | ".join(f"B = {b:.0e}" for b in args.budgets) + " |\n|---|" + "---|" * len(args.budgets) + "\n"
    )
    for method in METHODS:
        cells = []
        for b in args.budgets:
            v = summary.get((method, b))
            cells.append(f"{v['cov_mae_mean']:.4f} ± {v['cov_mae_se']:.4f} (mean {v['mean_mae_mean']:.3f}; "
                         f"{v['gradients_max']:.2g} grads)" if v else "-")
        table += f"| {method} | " + " | ".join(cells) + " |\n"
    path = write_results(name, {"settings": vars(args),
                                "reference": {k: v for k, v in ref.items() if k not in ("mean", "cov")},
                                "reference_cov_mae_scale": ref_mae, "rows": rows,
                                "summary": [{"method": k[0], "budget": k[1], **v} for k, v in summary.items()]},
                         table)
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
