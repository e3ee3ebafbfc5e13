"""The globals' spread under ``UHALocalGuide``: a centered hierarchy against the same model
non-centered (``decenter=True``), beside NUTS and the exact posterior.

A normal hierarchy written as users write it, 60 groups, each seen through its mean
``ybar_g ~ Normal(z_g, sigma)``, ``z_g ~ Normal(mu, tau)``, ``mu ~ Normal(0, 5)``,
``tau ~ HalfNormal(2)``, minibatches of 20 groups, in two regimes: weakly informed groups
(``sigma = 1``, about the spread of the z_g: the posterior of each z_g is as wide as the
prior given mu and tau, a funnel) and well informed ones (``sigma = 0.1``). The marginal
``ybar_g ~ Normal(mu, sqrt(tau² + sigma²))`` is exact, so the table also gives log Z (by
quadrature on a grid of (mu, log tau)) and the best bound any mean-field Gaussian on
(mu, log tau) can reach with exact local posteriors (the ``AutoNormal`` global guide's
ceiling; its mu and tau sds are what such a guide should give).

Each fit: ``UHALocalGuide(K=8)`` (global guide ``AutoNormal``), ``Trace_ELBO``, Adam 3e-2
decaying exponentially to 1.5e-3 over the steps, seeds 0, 1, 2, on the model as written:
"centered" (``decenter=False``, the default), "decenter=True" (the guide runs z
non-centered and emits z), and, once (seed 0), the model the user non-centers with
``handlers.reparam(config={"z": LocScaleReparam(0)})`` (the same chains: a check).
Reported: the global guide's mean and sd of mu and tau (4000 draws), the
full-data bound at the final parameters (mean of −loss over 100 fresh minibatches ± SE).

    python -m benchmarks.local_globals            # 6000 steps: about 5 minutes on 2 cores
    python -m benchmarks.local_globals --smoke    # tiny, for the test suite
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from jax.scipy.special import logsumexp
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO
from numpyro.infer.reparam import LocScaleReparam

from benchmarks.common import minibatch_bound, write_results
from numpyro_uha import UHALocalGuide

NUM_GROUPS = 60


def make_data(sigma: float, seed: int = 1):
    rng = np.random.default_rng(seed)
    z = 0.5 + rng.standard_normal(NUM_GROUPS)
    return jnp.asarray(z + sigma * rng.standard_normal(NUM_GROUPS), jnp.float32)


def model(ybar, sigma, batch):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    with numpyro.plate("groups", ybar.shape[0], subsample_size=batch) as idx:
        z = numpyro.sample("z", dist.Normal(mu, tau))
        numpyro.sample("ybar", dist.Normal(z, sigma), obs=ybar[idx])


NON_CENTERED = numpyro.handlers.reparam(model, config={"z": LocScaleReparam(0)})


def exact(ybar, sigma, grid=801):
    """log Z by quadrature, the posterior means and sds of mu and tau, and the best
    mean-field Gaussian on (mu, log tau) (its bound, its mu and tau moments)."""
    ybar = np.asarray(ybar, np.float64)

    def log_joint(mu, log_tau):
        tau = np.exp(log_tau)
        spread = np.sqrt(tau**2 + sigma**2)[..., None]
        lik = (-0.5 * ((ybar - mu[..., None]) / spread) ** 2 - np.log(spread)
               - 0.5 * np.log(2 * np.pi)).sum(-1)
        prior = (-0.5 * (mu / 5.0) ** 2 - np.log(5.0 * np.sqrt(2 * np.pi))
                 + np.log(2.0) - 0.5 * (tau / 2.0) ** 2 - np.log(2.0 * np.sqrt(2 * np.pi)))
        return lik + prior + log_tau  # log tau: the Jacobian of tau = exp(log tau)

    mus, lts = np.linspace(-2.5, 3.5, grid), np.linspace(-9.0, 2.5, grid)
    M, T = np.meshgrid(mus, lts, indexing="ij")
    L = log_joint(M, T)
    cell = (mus[1] - mus[0]) * (lts[1] - lts[0])
    log_z = float(logsumexp(L) + np.log(cell))
    w = np.exp(L - L.max())
    w /= w.sum()
    moments = lambda v: (float((w * v).sum()), float(np.sqrt((w * v**2).sum() - (w * v).sum() ** 2)))  # noqa: E731
    (mu_mean, mu_sd), (tau_mean, tau_sd) = moments(M), moments(np.exp(T))
    # the best mean-field Gaussian on (mu, log tau): Adam on the reparameterized ELBO
    eps = np.random.default_rng(0).standard_normal((20000, 2))

    def neg_elbo(p):
        theta = p[:2] + jnp.exp(p[2:]) * eps
        tau = jnp.exp(theta[:, 1])
        spread = jnp.sqrt(tau**2 + sigma**2)[:, None]
        lik = (-0.5 * ((ybar - theta[:, :1]) / spread) ** 2 - jnp.log(spread)
               - 0.5 * jnp.log(2 * jnp.pi)).sum(-1)
        prior = (-0.5 * (theta[:, 0] / 5.0) ** 2 - jnp.log(5.0 * jnp.sqrt(2 * jnp.pi))
                 + jnp.log(2.0) - 0.5 * (tau / 2.0) ** 2 - jnp.log(2.0 * jnp.sqrt(2 * jnp.pi)))
        entropy = p[2:].sum() + jnp.log(2 * jnp.pi * jnp.e)
        return -(jnp.mean(lik + prior + theta[:, 1]) + entropy)

    p = jnp.array([mu_mean, np.log(tau_mean), np.log(mu_sd), -1.0])
    opt = optax.adam(1e-2)
    state = opt.init(p)
    step = jax.jit(jax.value_and_grad(neg_elbo))
    for _ in range(3000):
        value, grad = step(p)
        updates, state = opt.update(grad, state)
        p = optax.apply_updates(p, updates)
    theta = np.asarray(p[:2] + jnp.exp(p[2:]) * eps)
    return {
        "log_z": log_z, "mu": mu_mean, "mu_sd": mu_sd, "tau": tau_mean, "tau_sd": tau_sd,
        "mean_field_bound": -float(value), "mean_field_mu_sd": float(theta[:, 0].std()),
        "mean_field_tau": float(np.exp(theta[:, 1]).mean()),
        "mean_field_tau_sd": float(np.exp(theta[:, 1]).std()),
    }


def nuts(ybar, sigma, num_samples):
    mcmc = MCMC(NUTS(NON_CENTERED), num_warmup=num_samples, num_samples=num_samples,
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), ybar, sigma, NUM_GROUPS)
    s = mcmc.get_samples()
    return {"mu": float(s["mu"].mean()), "mu_sd": float(s["mu"].std()),
            "tau": float(s["tau"].mean()), "tau_sd": float(s["tau"].std())}


def fit(ybar, sigma, batch, steps, coordinates, seed, eval_batches) -> dict:
    m = NON_CENTERED if coordinates == "LocScaleReparam" else model
    guide = UHALocalGuide(m, K=8, decenter=coordinates == "decenter=True")
    schedule = optax.exponential_decay(3e-2, steps, 0.05)
    svi = SVI(m, guide, optax.adam(schedule), Trace_ELBO())
    start = time.perf_counter()
    result = svi.run(jax.random.PRNGKey(seed), steps, ybar, sigma, batch, progress_bar=False)
    seconds = time.perf_counter() - start
    draws = guide.global_guide.sample_posterior(
        jax.random.PRNGKey(100 + seed), result.params, sample_shape=(4000,)
    )
    bound, bound_se = minibatch_bound(m, guide, result.params, (ybar, sigma, batch),
                                      eval_batches, 1000)
    return {
        "coordinates": coordinates, "seed": seed,
        "mu": float(draws["mu"].mean()), "mu_sd": float(draws["mu"].std()),
        "tau": float(draws["tau"].mean()), "tau_sd": float(draws["tau"].std()),
        "elbo": bound, "elbo_se": bound_se, "seconds": seconds,
    }


def poisson_mixed(smoke: bool) -> dict:
    """The Poisson mixed model of ``benchmarks.local_precondition`` (most groups well
    informed): centered against ``decenter=True``, NUTS for reference."""
    from benchmarks.local_precondition import make_data
    from benchmarks.local_precondition import model as poisson_model

    groups, batch, steps, eval_batches, samples = (20, 5, 20, 3, 50) if smoke else (500, 50, 3000, 100, 1000)
    data = make_data(groups)
    mcmc = MCMC(NUTS(poisson_model), num_warmup=samples, num_samples=samples, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), *data, groups)
    s = mcmc.get_samples()
    rows = [{"fit": f"NUTS ({samples} draws)", "a": float(s["a"].mean()), "a_sd": float(s["a"].std()),
             "s": float(s["s"].mean()), "s_sd": float(s["s"].std())}]
    for decenter in (False, True):
        guide = UHALocalGuide(poisson_model, K=8, decenter=decenter)
        svi = SVI(poisson_model, guide, optax.adam(optax.exponential_decay(1e-2, steps, 0.05)),
                  Trace_ELBO())
        start = time.perf_counter()
        result = svi.run(jax.random.PRNGKey(0), steps, *data, batch, progress_bar=False)
        seconds = time.perf_counter() - start
        draws = guide.global_guide.sample_posterior(
            jax.random.PRNGKey(1), result.params, sample_shape=(4000,)
        )
        bound, bound_se = minibatch_bound(poisson_model, guide, result.params, (*data, batch),
                                          eval_batches, 1000)
        rows.append({
            "fit": "decenter=True" if decenter else "centered",
            "a": float(draws["a"].mean()), "a_sd": float(draws["a"].std()),
            "s": float(draws["s"].mean()), "s_sd": float(draws["s"].std()),
            "elbo": bound, "elbo_se": bound_se, "seconds": seconds,
        })
        print("poisson", rows[-1], flush=True)
    return {"groups": groups, "batch": batch, "steps": steps, "rows": rows}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--sigmas", type=float, nargs="+", default=[1.0, 0.1])
    parser.add_argument("--name", default="local_globals")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    args = parser.parse_args(argv)
    eval_batches, nuts_samples = 100, 2000
    if args.smoke:
        args.steps, args.seeds, args.sigmas, eval_batches, nuts_samples = 20, 1, [1.0], 3, 50
    out = []
    md = (
        f"Normal hierarchy, {NUM_GROUPS} groups seen through their means (sd sigma), "
        f"minibatches of {args.batch} groups, `UHALocalGuide(K=8)` with its default "
        f"`AutoNormal` global guide, {args.steps} steps of Adam 3e-2 decaying to 1.5e-3, "
        f"seeds 0-{args.seeds - 1}; centered: `decenter=False` (the default); decenter=True: "
        "the guide runs z non-centered; LocScaleReparam: the user's non-centered model "
        "(seed 0 only, a check that it is the same). Exact: quadrature on (mu, log tau); mean-field ceiling: "
        "the best mean-field Gaussian on (mu, log tau) with exact local posteriors (what "
        "the `AutoNormal` global guide can reach at best). Bound: the full-data bound at "
        f"the final parameters (mean of -loss over {eval_batches} fresh minibatches ± SE; "
        "higher is better).\n\n"
        "| sigma | fit | seed | mu | mu sd | tau | tau sd | bound | seconds |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    for sigma in args.sigmas:
        ybar = make_data(sigma)
        ref = exact(ybar, sigma)
        ref_nuts = nuts(ybar, sigma, nuts_samples)
        md += (
            f"| {sigma:g} | exact | | {ref['mu']:.3f} | {ref['mu_sd']:.3f} | {ref['tau']:.3f} "
            f"| {ref['tau_sd']:.3f} | log Z = {ref['log_z']:.2f} | |\n"
            f"| {sigma:g} | mean-field ceiling | | | {ref['mean_field_mu_sd']:.3f} "
            f"| {ref['mean_field_tau']:.3f} | {ref['mean_field_tau_sd']:.3f} "
            f"| {ref['mean_field_bound']:.2f} | |\n"
            f"| {sigma:g} | NUTS ({nuts_samples} draws) | 0 | {ref_nuts['mu']:.3f} "
            f"| {ref_nuts['mu_sd']:.3f} | {ref_nuts['tau']:.3f} | {ref_nuts['tau_sd']:.3f} | | |\n"
        )
        rows = []
        runs = [(c, seed) for c in ("centered", "decenter=True") for seed in range(args.seeds)]
        for coordinates, seed in runs + [("LocScaleReparam", 0)]:
            row = fit(ybar, sigma, args.batch, args.steps, coordinates, seed, eval_batches)
            rows.append(row)
            print(sigma, row, flush=True)
            md += (
                f"| {sigma:g} | {coordinates} | {seed} | {row['mu']:.3f} | {row['mu_sd']:.3f} "
                f"| {row['tau']:.3f} | {row['tau_sd']:.3f} | {row['elbo']:.2f} ± "
                f"{row['elbo_se']:.2f} | {row['seconds']:.0f} |\n"
            )
        out.append({"sigma": sigma, "exact": ref, "nuts": ref_nuts, "rows": rows})
    poisson = poisson_mixed(args.smoke)
    md += (
        "\nPoisson mixed model (`benchmarks.local_precondition`'s: 500 groups of 1-300 "
        "counts, so most groups are well informed, random intercepts `u ~ Normal(0, s)`, "
        "data drawn with a = 0.5, s = 0.7), minibatches of 50 groups, "
        f"`UHALocalGuide(K=8)`, {poisson['steps']} steps of Adam 1e-2 decaying to 5e-4, "
        "seed 0; NUTS on the full data for reference.\n\n"
        "| fit | a | a sd | s | s sd | bound | seconds |\n|---|---|---|---|---|---|---|\n"
        + "".join(
            f"| {r['fit']} | {r['a']:.3f} | {r['a_sd']:.3f} | {r['s']:.3f} | {r['s_sd']:.3f} | "
            + (f"{r['elbo']:.1f} ± {r['elbo_se']:.1f} | {r['seconds']:.0f} |\n" if "elbo" in r else "| |\n")
            for r in poisson["rows"]
        )
    )
    out.append({"poisson_mixed": poisson})
    path = write_results(args.name, {"args": vars(args), "regimes": out}, md)
    print(path.read_text())


if __name__ == "__main__":
    main()
