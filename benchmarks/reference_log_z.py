"""Reference log Z for the inference tasks, independent of every method being compared.

NUTS runs on the task's log density over the flat unconstrained latent vector (the same
function every guide targets), and :func:`numpyro_uha.evaluation.log_z_bracket_from_draws`
fits a full-rank Gaussian q to its draws. Then

* lower end: the importance-weighted estimate log mean_i p̄(z_i)/q(z_i) over draws from q
  (a stochastic lower bound: its expectation is ≤ log Z), with the plain ELBO of q next to
  it;
* upper end: the EUBO, mean over the NUTS draws of log p̄(z) − log q(z). For exact
  posterior draws E_p[log p̄ − log q] = log Z + KL(p ‖ q) ≥ log Z, for any normalized q
  that does not depend on them: it is cross-fitted (each half of every chain scored under
  the Gaussian fitted to the other halves). Its standard error uses the draws' effective
  sample size.

The bracket holds only if NUTS has found the posterior: the table lists R-hat and the
smallest effective sample size over the latent coordinates, and the run is checked on
tasks whose log Z is known (Brownian motion: exact, by quadrature; sonar and ionosphere:
long SMC runs, issue 4). On the Lorenz bridge this is the only reference there is, and it
shows that every method started from plain VI sits in a local basin far below log Z (see
``docs/benchmarks.md``).

    python -m benchmarks.reference_log_z
    python -m benchmarks.reference_log_z --tasks lorenz_bridge --num-chains 4
    python -m benchmarks.reference_log_z --smoke
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin
from numpyro.infer import MCMC, NUTS

from benchmarks.common import probe_guide, write_results
from benchmarks.logistic import ANCHORS, TASKS
from numpyro_uha.evaluation import log_z_bracket_from_draws
from numpyro_uha.models import brownian_motion_reference

#: Known log Z to check the bracket against: exact for Brownian motion, long SMC runs
#: (issue 4) for the logistic regressions.
KNOWN = {
    "brownian_motion": (brownian_motion_reference()["log_z"], "exact (quadrature)"),
    **{name: (ANCHORS[name]["log_z"], "long SMC (issue 4)") for name in ("sonar", "ionosphere")},
}


def nuts_draws(logdensity_fn, dim, *, seed, num_chains, num_warmup, num_samples):
    """NUTS draws of the flat latent vector, shape (num_chains, num_samples, dim).

    Chains start from independent uniform(−2, 2) points, like NumPyro's default
    ``init_to_uniform``, and run one after another.
    """
    key_init, key_run = jax.random.split(jax.random.PRNGKey(seed))
    init = jax.random.uniform(key_init, (num_chains, dim), minval=-2.0, maxval=2.0)
    mcmc = MCMC(
        NUTS(potential_fn=lambda z: -logdensity_fn(z)),
        num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
        chain_method="sequential", progress_bar=False,
    )
    mcmc.run(key_run, init_params=init)
    draws = mcmc.get_samples(group_by_chain=True)
    divergences = int(np.sum(mcmc.get_extra_fields()["diverging"]))
    return np.asarray(draws, np.float64), divergences


def run_task(name, args):
    model, model_args = TASKS[name](args.data_dir)
    probe, probe_params = probe_guide(model, model_args)
    logdensity_fn, dim = probe.get_logdensity_fn(probe_params, *model_args), probe.latent_dim
    start = time.perf_counter()
    draws, divergences = nuts_draws(logdensity_fn, dim, seed=args.seed, num_chains=args.num_chains,
                                    num_warmup=args.num_warmup, num_samples=args.num_samples)
    nuts_seconds = time.perf_counter() - start
    r_hat = np.asarray(split_gelman_rubin(draws)) if args.num_chains > 1 else np.full(dim, np.nan)
    n_eff = np.asarray(effective_sample_size(draws))
    bracket = log_z_bracket_from_draws(
        jax.random.PRNGKey(args.seed + 1), logdensity_fn, draws.reshape(-1, dim),
        num_chains=args.num_chains, num_q_draws=args.num_q_draws,
    )._asdict()
    known, source = KNOWN.get(name, (None, None))
    row = {
        "task": name, "dim": dim, "seed": args.seed, "num_chains": args.num_chains,
        "num_warmup": args.num_warmup, "num_samples": args.num_samples, "nuts_seconds": nuts_seconds,
        "divergences": divergences, "max_r_hat": float(np.nanmax(r_hat)) if args.num_chains > 1 else None,
        "min_n_eff": float(n_eff.min()), **bracket, "known_log_z": known, "known_source": source,
    }
    if known is not None:
        row["known_in_bracket"] = bool(
            bracket["lower"] - 3 * bracket["lower_se"] <= known <= bracket["upper"] + 3 * bracket["upper_se"]
        )
    print(f"{name}: log Z in [{bracket['lower']:.3f} ± {bracket['lower_se']:.3f}, "
          f"{bracket['upper']:.3f} ± {bracket['upper_se']:.3f}] (q ELBO {bracket['q_elbo']:.3f}); "
          f"R-hat {row['max_r_hat']}, min n_eff {row['min_n_eff']:.0f}, divergences {divergences}"
          + (f"; known {known:.3f} ({source})" if known is not None else ""), flush=True)
    return row


def _fmt(x, se):
    return f"{x:.2f} ± {se:.2f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["brownian_motion", "sonar", "ionosphere", "lorenz_bridge"],
                        choices=sorted(TASKS))
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-chains", type=int, default=4)
    parser.add_argument("--num-warmup", type=int, default=2000)
    parser.add_argument("--num-samples", type=int, default=5000)
    parser.add_argument("--num-q-draws", type=int, default=100_000)
    parser.add_argument("--name", default="reference_log_z")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.tasks, args.num_chains, args.num_warmup, args.num_samples = ["brownian_motion"], 2, 50, 50
        args.num_q_draws = 500

    rows = [run_task(name, args) for name in args.tasks]
    table = (
        "Reference log Z from NUTS on the flat unconstrained log density every guide targets "
        f"({args.num_chains} chains × {args.num_samples} draws after {args.num_warmup} warm-up, "
        "chains from uniform(−2, 2) starts) and a full-rank Gaussian q fitted to its draws. "
        "Lower end: IW estimate over draws from q (a stochastic lower bound); upper end: EUBO "
        "E_p[log p̄ − log q] over the NUTS draws (an upper bound if NUTS found the posterior), "
        "cross-fitted: each half of every chain is scored under the Gaussian fitted to the other "
        "halves; its se uses the effective sample size. A known log Z is 'in' when it lies within "
        "3 se of the bracket.\n\n"
        "| task | d | log Z ≥ (IW of q) | log Z ≤ (EUBO) | ELBO of q | IW ESS of q | known log Z | in bracket | "
        "max R-hat | min n_eff | divergences |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for r in rows:
        known = f"{r['known_log_z']:.2f} ({r['known_source']})" if r["known_log_z"] is not None else "-"
        inside = ("yes" if r["known_in_bracket"] else "**no**") if r["known_log_z"] is not None else "-"
        r_hat = f"{r['max_r_hat']:.3f}" if r["max_r_hat"] is not None else "-"
        table += (f"| {r['task']} | {r['dim']} | {_fmt(r['lower'], r['lower_se'])} | {_fmt(r['upper'], r['upper_se'])} | "
                  f"{_fmt(r['q_elbo'], r['q_elbo_se'])} | {r['q_ess']:.0f} of {r['num_q_draws']} | {known} | {inside} | "
                  f"{r_hat} | {r['min_n_eff']:.0f} | {r['divergences']} |\n")
    path = write_results(args.name, {"settings": vars(args), "rows": rows}, table)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
