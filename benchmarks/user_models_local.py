"""Local-latent models written as users write them: ``UHALocalGuide`` against ``AutoNormal``.

Three models with one subsampled plate of local latents, none from this project's tests
or benchmarks:

* ``random_slopes``: 200 groups × 8 observations, a random intercept and slope per group
  (a 2-vector with an ``LKJCholesky`` correlation and half-normal scales), minibatches
  of 32 groups;
* ``gamma_frailty``: 400 Poisson counts with a Gamma(a, a) frailty per observation (a
  positive local) and three regression coefficients, minibatches of 50;
* ``t_scale_mixture``: a Student-t likelihood written as a normal scale mixture, an
  inverse-gamma weight per observation, minibatches of 50.

Each guide is fit at its defaults and with ``init_scale=1.0`` (the per-data-point q's
starting sd; both guides default to 0.1): ``SVI`` + ``Trace_ELBO``, Adam 1e-2 decaying to
1e-3, 1500 steps, seed 0, K = 8. Reported: the full-data bound at the final parameters
(mean of −loss over 50 fresh minibatches ± SE), the training steps whose loss was not
finite, and whether ``Predictive`` and pickling work on the fitted guide.

    python -m benchmarks.user_models_local           # about 5 minutes on 2 cores
    python -m benchmarks.user_models_local --smoke   # tiny, for the test suite
"""

from __future__ import annotations

import argparse
import pickle
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import SVI, Predictive, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from benchmarks.common import minibatch_bound, write_results
from numpyro_uha import UHALocalGuide


def random_slopes_data(rng, groups=200, n=8):
    x = rng.normal(size=(groups, n))
    chol = np.array([[1.0, 0.0], [0.6, 0.8]])
    b = rng.normal(size=(groups, 2)) @ chol.T * np.array([0.8, 0.5])
    y = b[:, :1] + b[:, 1:] * x + 0.5 * rng.normal(size=(groups, n))
    return jnp.asarray(x), jnp.asarray(y)


def random_slopes(x, y, batch):
    L = numpyro.sample("L", dist.LKJCholesky(2, 2.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0).expand([2]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("groups", x.shape[0], subsample_size=batch) as idx:
        b = numpyro.sample("b", dist.MultivariateNormal(jnp.zeros(2), scale_tril=tau[:, None] * L))
        mu = b[:, :1] + b[:, 1:] * x[idx]
        numpyro.sample("y", dist.Normal(mu, sigma).to_event(1), obs=y[idx])


def gamma_frailty_data(rng, n=400):
    X = rng.normal(size=(n, 3))
    frailty = rng.gamma(2.0, 0.5, n)
    y = rng.poisson(frailty * np.exp(X @ np.array([0.5, -0.3, 0.2])))
    return jnp.asarray(X), jnp.asarray(y)


def gamma_frailty(X, y, batch):
    a = numpyro.sample("a", dist.Gamma(2.0, 1.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=batch) as idx:
        lam = numpyro.sample("lam", dist.Gamma(a, a))
        numpyro.sample("y", dist.Poisson(lam * jnp.exp(X[idx] @ beta)), obs=y[idx])


def t_scale_mixture_data(rng, n=300):
    return (jnp.asarray(1.0 + rng.standard_t(3, n)),)


def t_scale_mixture(y, batch):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(3.0))
    with numpyro.plate("data", y.shape[0], subsample_size=batch) as idx:
        w = numpyro.sample("w", dist.InverseGamma(1.5, 1.5))
        numpyro.sample("y", dist.Normal(mu, sigma * jnp.sqrt(w)), obs=y[idx])


#: name -> (model, data maker, minibatch size)
MODELS = {
    "random_slopes": (random_slopes, random_slopes_data, 32),
    "gamma_frailty": (gamma_frailty, gamma_frailty_data, 50),
    "t_scale_mixture": (t_scale_mixture, t_scale_mixture_data, 50),
}


def run_one(model, args, guide, steps, eval_batches) -> dict:
    svi = SVI(model, guide, optax.adam(optax.exponential_decay(1e-2, steps, 0.1)), Trace_ELBO())
    start = time.perf_counter()
    result = svi.run(jax.random.PRNGKey(0), steps, *args, progress_bar=False)
    seconds = time.perf_counter() - start
    losses = np.asarray(result.losses)
    bound, bound_se = minibatch_bound(model, guide, result.params, args, eval_batches, 100)
    predictive = Predictive(model, guide=guide, params=result.params, num_samples=4)
    predicted = predictive(jax.random.PRNGKey(3), *args)
    pickle.loads(pickle.dumps(guide))  # raises if the fitted guide does not pickle
    return {
        "elbo": bound,
        "elbo_se": bound_se,
        "nonfinite_steps": int(np.sum(~np.isfinite(losses))),
        "predictive_ok": bool(np.all(np.isfinite(np.asarray(predicted["y"], float)))),
        "seconds": seconds,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--K", type=int, default=8)
    parser.add_argument("--init-scales", type=float, nargs="+", default=[0.1, 1.0])
    parser.add_argument("--name", default="user_models_local")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    args = parser.parse_args(argv)
    eval_batches = 50
    if args.smoke:
        args.models, args.steps, args.init_scales, eval_batches = ["t_scale_mixture"], 5, [0.1], 2
    rows = []
    for name in args.models:
        model, make_data, batch = MODELS[name]
        data = make_data(np.random.default_rng(0)) + (batch,)
        for init_scale in args.init_scales:
            guides = {
                "AutoNormal": AutoNormal(model, init_scale=init_scale),
                f"UHALocalGuide(K={args.K})": UHALocalGuide(model, K=args.K, init_scale=init_scale),
            }
            for label, guide in guides.items():
                row = {"model": name, "guide": label, "init_scale": init_scale,
                       **run_one(model, data, guide, args.steps, eval_batches)}
                rows.append(row)
                print(row, flush=True)
    md = (
        f"Local-latent models written as users write them; each guide fit {args.steps} steps "
        "(Adam 1e-2 decaying to 1e-3, seed 0) from its per-data-point q's `init_scale`. "
        f"ELBO: the full-data bound at the final parameters (mean of −loss over {eval_batches} "
        "fresh minibatches ± SE; higher is better). Non-finite: training steps whose loss was "
        "not finite. Predictive / pickle: `Predictive(model, guide=...)` gave finite draws "
        "and the fitted guide pickled.\n\n"
        "| model | init_scale | guide | ELBO | non-finite steps | Predictive, pickle | seconds |\n"
        "|---|---|---|---|---|---|---|\n"
        + "".join(
            f"| {r['model']} | {r['init_scale']:g} | {r['guide']} | {r['elbo']:.2f} ± "
            f"{r['elbo_se']:.2f} | {r['nonfinite_steps']} | {'yes' if r['predictive_ok'] else 'NO'} "
            f"| {r['seconds']:.0f} |\n"
            for r in rows
        )
    )
    path = write_results(args.name, {"args": vars(args), "rows": rows}, md)
    print(path.read_text())


if __name__ == "__main__":
    main()
