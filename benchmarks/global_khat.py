"""Does ``UHALocalGuide.global_log_z`` warn when the local guide's globals are off?

The locally enhanced bound that SVI trains can put a weakly informed hierarchy's group
scale several times too low, and nothing else warns (docs/zoo.md, the eleventh hunt).
``global_log_z`` weights draws of the global guide by the prior times every data point's
estimated p(x_i | θ) over q(θ) and warns where the weights' Pareto k̂ ≥ 0.7. This fits
four models with local latents as users write them (minibatches of 25, ``UHALocalGuide(K=8)``,
Adam 1e-2 decaying tenfold), centered (the default) after 1500 steps and ``decenter=True``
after 6000, and runs ``global_log_z`` (its defaults: 4000 draws, 64 chains per data
point and draw; ``--num-samples``) with ``--seeds`` keys on each fit, beside NUTS on the full data (500
warm-up, 1000 draws): the group scale's mean from the guide, from the weighted draws
and from NUTS, k̂, the effective sample size, how many keys warned, and log p(x).

Models: ``normal_informed`` (60 groups, ybar ~ Normal(z, 0.3), z ~ Normal(mu, tau)),
``normal_weak`` (the same with noise sd 1: each group's data say little),
``logistic_intercept`` (100 groups of 6 Bernoulli draws, logit = z_g),
``poisson_lognormal`` (200 counts, one per local log rate) and ``poisson_mixed``
(``benchmarks.local_precondition``'s 500 groups of 1-300 counts, minibatches of 50, 3000
steps for both fits: there ``decenter=True`` puts the scale twice too high).

    python -m benchmarks.global_khat            # about 8 minutes on 2 cores
    python -m benchmarks.global_khat --num-samples 16 --name global_khat_16  # fewer chains
    python -m benchmarks.global_khat --smoke    # tiny, for the test suite
"""

from __future__ import annotations

import argparse
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO

from benchmarks.common import write_results
from numpyro_uha import UHAFitWarning, UHALocalGuide
from numpyro_uha.evaluation import weighted_moments

BATCH = 25


def _normal(noise, groups=60):
    rng = np.random.default_rng(0)
    z = rng.normal(0.5, 1.0, groups)
    y = jnp.asarray(z + noise * rng.standard_normal(groups), jnp.float32)

    def model(y, batch):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfNormal(2.0))
        with numpyro.plate("groups", y.shape[0], subsample_size=batch) as idx:
            z = numpyro.sample("z", dist.Normal(mu, tau))
            numpyro.sample("y", dist.Normal(z, noise), obs=y[idx])

    return model, y, "tau"


def _logistic(groups=100, per_group=6):
    rng = np.random.default_rng(0)
    z = rng.normal(0.3, 1.2, groups)
    y = jnp.asarray(rng.random((groups, per_group)) < 1 / (1 + np.exp(-z[:, None])), jnp.float32)

    def model(y, batch):
        mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
        tau = numpyro.sample("tau", dist.HalfNormal(2.0))
        with numpyro.plate("groups", y.shape[0], subsample_size=batch) as idx:
            z = numpyro.sample("z", dist.Normal(mu, tau))
            numpyro.sample("y", dist.Bernoulli(logits=z[:, None]).to_event(1), obs=y[idx])

    return model, y, "tau"


def _poisson(points=200):
    rng = np.random.default_rng(0)
    y = jnp.asarray(rng.poisson(np.exp(rng.normal(1.0, 0.6, points))), jnp.float32)

    def model(y, batch):
        mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
        s = numpyro.sample("s", dist.HalfNormal(2.0))
        with numpyro.plate("points", y.shape[0], subsample_size=batch) as idx:
            z = numpyro.sample("z", dist.Normal(mu, s))
            numpyro.sample("y", dist.Poisson(jnp.exp(z)), obs=y[idx])

    return model, y, "s"


def _poisson_mixed():
    # benchmarks.local_precondition's model (500 groups of 1-300 counts, mostly well
    # informed): decenter=True overshoots its scale s there (benchmarks.local_globals)
    from benchmarks.local_precondition import make_data
    from benchmarks.local_precondition import model as poisson_model

    return poisson_model, make_data(500), "s"


MODELS = {
    "normal_informed": lambda: _normal(0.3),
    "normal_weak": lambda: _normal(1.0),
    "logistic_intercept": _logistic,
    "poisson_lognormal": _poisson,
    "poisson_mixed": _poisson_mixed,
}
FITS = {"centered": (False, 1500), "decenter=True": (True, 6000)}
#: per model where not FITS and BATCH: the fits of benchmarks.local_globals
SETTINGS = {"poisson_mixed": ({"centered": (False, 3000), "decenter=True": (True, 3000)}, 50)}


def nuts(model, data, site, num_samples):
    mcmc = MCMC(NUTS(model), num_warmup=num_samples // 2, num_samples=num_samples,
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), *data, data[0].shape[0])
    draws = np.asarray(mcmc.get_samples()[site])
    return float(draws.mean()), float(draws.std())


def fit(model, data, decenter, steps, batch):
    """``UHALocalGuide(K=8)`` trained by Adam 1e-2 decaying tenfold: (guide, params)."""
    guide = UHALocalGuide(model, K=8, decenter=decenter)
    svi = SVI(model, guide, optax.adam(optax.exponential_decay(1e-2, steps, 0.1)), Trace_ELBO())
    return guide, svi.run(jax.random.PRNGKey(0), steps, *data, batch, progress_bar=False).params


def fit_and_check(model, data, site, decenter, steps, batch, seeds, num_draws, num_samples=64):
    start = time.perf_counter()
    guide, params = fit(model, data, decenter, steps, batch)
    fit_s = time.perf_counter() - start
    checks = []
    for seed in range(seeds):
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = guide.global_log_z(jax.random.PRNGKey(10 + seed), params, *data, batch,
                                        num_draws=num_draws, num_samples=num_samples)
        checks.append({
            "seed": seed, "seconds": time.perf_counter() - start,
            "pareto_khat": result.pareto_khat, "ess": result.ess,
            "warned": any(issubclass(w.category, UHAFitWarning) for w in caught),
            "log_z": result.log_z, "se": result.se, "chains_se": result.chains_se,
            "guide_mean": float(np.mean(result.samples[site])),
            "guide_sd": float(np.std(result.samples[site])),
            "weighted_mean": float(weighted_moments(result)[site][0]),
        })
    return {"fit_seconds": fit_s, "checks": checks}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--name", default="global_khat")
    parser.add_argument("--num-samples", type=int, default=64,
                        help="global_log_z's chains per data point and draw")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    args = parser.parse_args(argv)
    fits, num_draws, nuts_samples = FITS, 4000, 1000
    if args.smoke:
        args.models, args.seeds, num_draws, nuts_samples = ["normal_informed"], 1, 200, 50
        fits = {"centered": (False, 20)}
    rows = []
    md = (
        f"`UHALocalGuide(K=8)`, minibatches of {BATCH} (poisson_mixed: 50), Adam 1e-2 "
        "decaying tenfold, the steps in the fit column. `global_log_z` with "
        f"{num_draws} draws and {args.num_samples} chains per data point and draw, keys 10-{9 + args.seeds}. "
        "The group scale: the guide's mean ± sd, the weighted draws' mean (median over "
        "keys), NUTS's mean ± sd on the full data, z = (guide − NUTS) / NUTS sd; k̂ and ESS "
        "per key; warned: keys whose call warned (k̂ ≥ 0.7 or ESS under 5 % of the draws); log p(x) of key 10 ± se "
        "(chains' part in brackets).\n\n"
        "| model | fit | scale: guide | weighted | NUTS | z | k̂ | ESS | warned | log p(x) | fit s | check s |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for name in args.models:
        model, data, site = MODELS[name]()
        data = data if isinstance(data, tuple) else (data,)
        ref_mean, ref_sd = nuts(model, data, site, nuts_samples)
        model_fits, batch = SETTINGS.get(name, (fits, BATCH))
        if args.smoke:
            model_fits, batch = fits, BATCH
        for fit_name, (decenter, steps) in model_fits.items():
            out = fit_and_check(model, data, site, decenter, steps, batch, args.seeds, num_draws,
                                args.num_samples)
            c = out["checks"]
            row = {"model": name, "fit": fit_name, "steps": steps, "batch": batch, "site": site,
                   "nuts_mean": ref_mean, "nuts_sd": ref_sd, **out}
            rows.append(row)
            print(name, fit_name, [(round(x["pareto_khat"], 2), x["warned"]) for x in c], flush=True)
            z = (c[0]["guide_mean"] - ref_mean) / ref_sd
            khats = ", ".join(f"{x['pareto_khat']:.2f}" for x in c)
            esses = ", ".join(f"{x['ess']:.0f}" for x in c)
            md += (
                f"| {name} | {fit_name}, {steps} | {site} {c[0]['guide_mean']:.3f} ± {c[0]['guide_sd']:.3f} "
                f"| {np.median([x['weighted_mean'] for x in c]):.3f} "
                f"| {ref_mean:.3f} ± {ref_sd:.3f} | {z:+.1f} "
                f"| {khats} | {esses} "
                f"| {sum(x['warned'] for x in c)} of {len(c)} "
                f"| {c[0]['log_z']:.2f} ± {c[0]['se']:.2f} ({c[0]['chains_se']:.2f}) "
                f"| {out['fit_seconds']:.0f} | {np.median([x['seconds'] for x in c]):.1f} |\n"
            )
    path = write_results(args.name, {"num_draws": num_draws, "num_samples": args.num_samples, "rows": rows}, md)
    print(path.read_text())


if __name__ == "__main__":
    main()
