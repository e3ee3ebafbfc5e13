"""Everything the evaluation layer reports, on one real posterior.

Bayesian logistic regression (default: sonar, d = 61). Trains UHAGuide at K, then:
ELBO and IW log Z with standard errors; Hamiltonian AIS with the guide's parameters and
with the paper's (ε, η) grid search; the PSIS k̂ of the UHA weights; extrapolation to a
larger K; a NUTS reference run, the moment errors of UHA against it, and the reverse-AIS
sandwich started from the NUTS draws.

    python -m benchmarks.evaluation_report --dataset sonar --K 64 --steps 5000
"""

from __future__ import annotations

import argparse
import time

import jax
import optax
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO

from benchmarks.common import results_dir, write_results
from numpyro_uha import UHAGuide
from numpyro_uha.datasets import load_logistic_regression, logistic_regression_model
from numpyro_uha.evaluation import (
    compare_with_nuts,
    extrapolate,
    hais,
    hais_grid_search,
    log_z,
    plot_nuts_comparison,
    psis_khat,
    sandwich,
)


def _est(e):
    return {"elbo": e.elbo, "elbo_se": e.elbo_se, "iw": e.iw, "iw_se": e.iw_se, "ess": e.ess,
            "num_draws": e.num_draws, "K": e.num_transitions}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", default="sonar")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--K", type=int, default=64)
    parser.add_argument("--K-extrapolate", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--num-particles", type=int, default=1)
    parser.add_argument("--num-draws", type=int, default=10_000)
    parser.add_argument("--nuts-warmup", type=int, default=2000)
    parser.add_argument("--nuts-samples", type=int, default=20_000)
    parser.add_argument("--sandwich-draws", type=int, default=2000)
    parser.add_argument("--grid-draws", type=int, default=1000)
    parser.add_argument("--grid-pilot", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    parser.add_argument("--name", default=None)
    args = parser.parse_args(argv)
    if args.smoke:
        args.K, args.K_extrapolate, args.steps, args.num_draws = 2, 4, 10, 100
        args.nuts_warmup, args.nuts_samples, args.sandwich_draws = 50, 100, 50
        args.grid_draws, args.grid_pilot = 50, 16
    name = args.name or f"evaluation_{args.dataset}_K{args.K}"
    key = jax.random.PRNGKey(args.seed)
    keys = iter(jax.random.split(key, 16))

    X, y = load_logistic_regression(args.dataset, args.data_dir)
    model = logistic_regression_model
    out = {"settings": vars(args)}
    guide = UHAGuide(model, K=args.K, warm_start_steps=50 if args.smoke else 1000)
    svi = SVI(model, guide, optax.adam(args.lr), Trace_ELBO(num_particles=args.num_particles))
    t0 = time.perf_counter()
    result = svi.run(next(keys), args.steps, X, y, progress_bar=False)
    out["train_seconds"] = time.perf_counter() - t0
    params = result.params
    print(f"trained K={args.K} in {out['train_seconds']:.1f}s", flush=True)

    uha = log_z(guide, next(keys), params, X, y, num_draws=args.num_draws)
    out["uha"] = _est(uha)
    print("UHA", uha, flush=True)
    draws = guide.sample_posterior_with_log_weights(next(keys), params, X, y, sample_shape=(args.num_draws,))
    out["khat"] = psis_khat(draws.log_weights)
    print(f"PSIS k-hat {out['khat']:.3f}", flush=True)

    corrected = hais(guide, next(keys), params, X, y, num_draws=args.num_draws)
    out["hais_guide_params"] = {**_est(corrected.log_z), "mean_acceptance": corrected.mean_acceptance}
    print("HAIS (UHA's parameters)", corrected, flush=True)

    # The paper's baseline starts from the plain-VI q: the guide's warm start before SVI.
    q_loc, q_scale = guide.initial_q
    t0 = time.perf_counter()
    grid = hais_grid_search(next(keys), guide.get_logdensity_fn(params, X, y), q_loc, q_scale,
                            args.K, num_draws=args.grid_draws, num_pilot=args.grid_pilot)
    out["hais_grid"] = {**_est(grid.best.log_z), "mean_acceptance": grid.best.mean_acceptance,
                        "table": grid.table, "seconds": time.perf_counter() - t0}
    print("HAIS (grid search)", grid.best, flush=True)

    big_guide, big_params = extrapolate(guide, params, args.K_extrapolate)
    big = log_z(big_guide, next(keys), big_params, X, y, num_draws=args.num_draws)
    out["uha_extrapolated"] = _est(big)
    print(f"UHA extrapolated to K={args.K_extrapolate}", big, flush=True)

    t0 = time.perf_counter()
    mcmc = MCMC(NUTS(model), num_warmup=args.nuts_warmup, num_samples=args.nuts_samples, progress_bar=False)
    mcmc.run(next(keys), X, y)
    nuts_samples = mcmc.get_samples()
    out["nuts_seconds"] = time.perf_counter() - t0
    comparison = compare_with_nuts(guide, next(keys), params, X, y, mcmc_samples=nuts_samples,
                                   num_draws=args.num_draws)
    out["moments"] = {"mean_mae": comparison.mean_mae, "std_mae": comparison.std_mae,
                      "cov_mae": comparison.cov_mae}
    print(f"vs NUTS: mean MAE {comparison.mean_mae:.4f}, std MAE {comparison.std_mae:.4f}, "
          f"cov MAE {comparison.cov_mae:.5f}", flush=True)
    figure = plot_nuts_comparison(comparison)
    figure_path = results_dir() / f"{name}_moments.png"
    figure_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(figure_path, dpi=110, bbox_inches="tight")

    # Thin the NUTS chain to nearly independent draws for the reverse (upper) bound.
    thin = max(1, args.nuts_samples // args.sandwich_draws)
    exact = {k: v[::thin][: args.sandwich_draws] for k, v in nuts_samples.items()}
    bounds = sandwich(guide, next(keys), params, exact, X, y, num_draws=args.num_draws)
    out["sandwich"] = {"lower_elbo": bounds.lower.elbo, "lower_iw": bounds.lower.iw,
                       "lower_iw_se": bounds.lower.iw_se, "upper": bounds.upper,
                       "upper_se": bounds.upper_se, "upper_iw": bounds.upper_iw,
                       "upper_iw_se": bounds.upper_iw_se, "num_reverse": bounds.num_reverse}
    print("sandwich", bounds, flush=True)

    def fmt(d, key="elbo"):
        return f"{d[key]:.2f} ± {d[key + '_se']:.2f}"

    table = (
        f"{args.dataset} logistic regression, UHAGuide(K={args.K}) defaults, Adam {args.lr}, "
        f"{args.steps} steps, {args.num_particles} particle(s); estimates from "
        f"{args.num_draws} draws; NUTS {args.nuts_warmup} warm-up + {args.nuts_samples} draws.\n\n"
        "| estimator | ELBO ± se | IW log Z ± se |\n|---|---|---|\n"
        f"| UHA, K={args.K} | {fmt(out['uha'])} | {fmt(out['uha'], 'iw')} |\n"
        f"| UHA extrapolated, K={args.K_extrapolate} | {fmt(out['uha_extrapolated'])} | "
        f"{fmt(out['uha_extrapolated'], 'iw')} |\n"
        f"| HAIS with UHA's parameters (acceptance {out['hais_guide_params']['mean_acceptance']:.2f}) | "
        f"{fmt(out['hais_guide_params'])} | {fmt(out['hais_guide_params'], 'iw')} |\n"
        f"| HAIS, paper's grid search (acceptance {out['hais_grid']['mean_acceptance']:.2f}) | "
        f"{fmt(out['hais_grid'])} | {fmt(out['hais_grid'], 'iw')} |\n\n"
        f"Sandwich (reverse chains from {bounds.num_reverse} thinned NUTS draws): "
        f"log Z in [{bounds.lower.iw:.3f} ± {bounds.lower.iw_se:.3f}, "
        f"{bounds.upper_iw:.3f} ± {bounds.upper_iw_se:.3f}]; reverse ELBO-type bound "
        f"{bounds.upper:.3f} ± {bounds.upper_se:.3f}.\n\n"
        f"PSIS k̂ of the UHA weights: {out['khat']:.3f}.\n\n"
        f"Moments vs NUTS: mean MAE {comparison.mean_mae:.4f}, std MAE {comparison.std_mae:.4f}, "
        f"covariance MAE {comparison.cov_mae:.5f}.\n"
    )
    path = write_results(name, out, table)
    print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
