"""``UHALocalGuide(precondition=...)`` on a mixed model with groups of very different sizes.

A Poisson mixed model written as a user writes it: 500 groups whose sizes range from 1 to
300 observations (geometric, p = 0.03), a random intercept per group, two global latents,
minibatches of 50 groups. The groups' posterior sds then differ about tenfold, the case
``precondition=True`` (each chain steps in units of its own q_i's sds) is for. The guide's
per-data-point q starts at ``init_scale`` for every group; the table crosses the two
settings of ``precondition`` with two values of ``init_scale``.

Each fit: ``SVI`` with ``Trace_ELBO``, Adam 1e-2 decaying exponentially to 5e-4 over the
steps, K = 8, seed 0. Reported: the full-data bound at the final parameters (the mean of
``-loss`` over 100 fresh minibatches, ± its standard error), the mean training loss over
the last 200 steps, and the training steps whose loss was not finite (diverged chains).

    python -m benchmarks.local_precondition            # 3000 steps, about 5 minutes on 2 cores
    python -m benchmarks.local_precondition --smoke    # tiny, for the test suite
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
from numpyro.infer import SVI, Trace_ELBO

from benchmarks.common import minibatch_bound, write_results
from numpyro_uha import UHALocalGuide


def make_data(num_groups: int, seed: int = 1):
    """Per group: the sum of its Poisson counts and its number of observations."""
    rng = np.random.default_rng(seed)
    sizes = np.minimum(rng.geometric(0.03, num_groups), 300)
    group = np.repeat(np.arange(num_groups), sizes)
    intercepts = rng.normal(0.0, 0.7, num_groups)
    counts = rng.poisson(np.exp(0.5 + intercepts[group]))
    totals = np.bincount(group, weights=counts, minlength=num_groups)
    return jnp.asarray(totals), jnp.asarray(sizes, jnp.float32)


def model(totals, sizes, batch):
    a = numpyro.sample("a", dist.Normal(0.0, 3.0))
    s = numpyro.sample("s", dist.HalfNormal(2.0))
    with numpyro.plate("groups", totals.shape[0], subsample_size=batch) as idx:
        u = numpyro.sample("u", dist.Normal(0.0, s))
        # a group's counts are n_g Poisson(exp(a + u_g)) draws; their sum is sufficient
        numpyro.sample("y", dist.Poisson(sizes[idx] * jnp.exp(a + u)), obs=totals[idx])


def fit(data, batch, steps, precondition, init_scale, K=8, eval_batches=100, seed=0) -> dict:
    guide = UHALocalGuide(model, K=K, precondition=precondition, init_scale=init_scale)
    schedule = optax.exponential_decay(1e-2, steps, 0.05)
    svi = SVI(model, guide, optax.adam(schedule), Trace_ELBO())
    start = time.perf_counter()
    result = svi.run(jax.random.PRNGKey(seed), steps, *data, batch, progress_bar=False)
    losses = np.asarray(result.losses)
    bound, bound_se = minibatch_bound(model, guide, result.params, (*data, batch), eval_batches, 1000)
    finite = np.isfinite(losses)
    return {
        "precondition": precondition,
        "init_scale": init_scale,
        "elbo": bound,
        "elbo_se": bound_se,
        "last_losses": float(np.mean(losses[-200:][finite[-200:]])),
        "nonfinite_steps": int(np.sum(~finite)),
        "step_size": float(result.params["local_step_size"]),
        "seconds": time.perf_counter() - start,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=500)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--init-scales", type=float, nargs="+", default=[0.1, 0.03])
    parser.add_argument("--name", default="local_precondition")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    args = parser.parse_args(argv)
    eval_batches = 100
    if args.smoke:
        args.groups, args.batch, args.steps, args.init_scales, eval_batches = 20, 5, 30, [0.1], 3
    data = make_data(args.groups)
    rows = []
    for init_scale in args.init_scales:
        for precondition in (False, True):
            row = fit(data, args.batch, args.steps, precondition, init_scale,
                      eval_batches=eval_batches)
            rows.append(row)
            print(row, flush=True)
    md = (
        f"Poisson mixed model, {args.groups} groups of 1-300 observations, minibatches of "
        f"{args.batch} groups, `UHALocalGuide(K=8)`, {args.steps} steps of Adam 1e-2 decaying "
        "to 5e-4, seed 0. ELBO: the full-data bound at the final parameters (mean of −loss "
        f"over {eval_batches} fresh minibatches ± SE; higher is better); last losses: the "
        "mean training loss of the last 200 steps (finite ones); non-finite: training steps "
        "whose loss was not finite.\n\n"
        "| init_scale | precondition | ELBO | last losses | non-finite steps | learned ε | seconds |\n"
        "|---|---|---|---|---|---|---|\n"
        + "".join(
            f"| {r['init_scale']:g} | {r['precondition']} | {r['elbo']:.2f} ± {r['elbo_se']:.2f} "
            f"| {r['last_losses']:.2f} | {r['nonfinite_steps']} | {r['step_size']:.3f} "
            f"| {r['seconds']:.0f} |\n"
            for r in rows
        )
    )
    path = write_results(args.name, {"args": vars(args), "rows": rows}, md)
    print(path.read_text())


if __name__ == "__main__":
    main()
