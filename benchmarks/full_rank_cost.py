"""A diagonal against a full-rank q past ``FULL_RANK_MAX_DIM`` (32): cost and bound.

On the paper's logistic regressions above 32 coordinates (ionosphere d = 35, sonar
d = 61), ``UHAGuide`` at its defaults but ``base_dist`` ("diagonal", what "auto" gives
there, and "cholesky"), in the same run: ``svi.init`` seconds, milliseconds per jitted
``svi.update`` (median of ``--repeats`` blocks of 50 after a warm-up step, both jitted),
the start q's ELBO, and UHA's bound (the mean of 2 000 log weights ± its standard error)
after ``--steps`` steps of Adam(``--lr``). The evidence for or against raising
``FULL_RANK_MAX_DIM`` (docs/zoo.md, the twenty-first hunt).

``--datasets`` also takes two models past 32 coordinates that are not regressions: the
Inference Gym's convection Lorenz bridge (``lorenz_bridge``, d = 90) and a BYM model of
Poisson counts on a 7 × 7 grid (``icar_bym``, d = 101: an improper ICAR ``phi`` with its
pairwise-difference and soft sum-to-zero terms as ``numpyro.factor``, beside unstructured
effects ``theta``; synthetic counts, seed 0).

    python -m benchmarks.full_rank_cost
    python -m benchmarks.full_rank_cost --datasets sonar --steps 5000
    python -m benchmarks.full_rank_cost --datasets lorenz_bridge icar_bym --name full_rank_cost_models
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
from numpyro.infer import SVI, Trace_ELBO

from benchmarks.common import write_results
from numpyro_uha import UHAGuide
from numpyro_uha.datasets import load_logistic_regression
from numpyro_uha.datasets import logistic_regression_model as model
from numpyro_uha.evaluation import log_z_from_weights
from numpyro_uha.models import lorenz_bridge_model

GRID = 7


def _grid_edges(side):
    idx = np.arange(side * side).reshape(side, side)
    right = [(idx[i, j], idx[i, j + 1]) for i in range(side) for j in range(side - 1)]
    down = [(idx[i, j], idx[i + 1, j]) for i in range(side - 1) for j in range(side)]
    return np.array(right + down)


EDGES = _grid_edges(GRID)


def icar_bym(E, y):
    """Poisson counts with expected values E, log rate b0 + σ_φ φ + σ_θ θ: φ an intrinsic
    CAR field on the grid (improper, pairwise differences and a soft sum-to-zero term as
    factors), θ unstructured."""
    n = GRID * GRID
    b0 = numpyro.sample("b0", dist.Normal(0.0, 2.0))
    sigma_phi = numpyro.sample("sigma_phi", dist.HalfNormal(1.0))
    sigma_theta = numpyro.sample("sigma_theta", dist.HalfNormal(1.0))
    phi = numpyro.sample("phi", dist.ImproperUniform(dist.constraints.real_vector, (), (n,)))
    numpyro.factor("icar", -0.5 * jnp.sum((phi[EDGES[:, 0]] - phi[EDGES[:, 1]]) ** 2))
    numpyro.factor("sum_to_zero", dist.Normal(0.0, 0.001 * n).log_prob(jnp.sum(phi)))
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0).expand([n]).to_event(1))
    numpyro.sample("y", dist.Poisson(E * jnp.exp(b0 + sigma_phi * phi + sigma_theta * theta)), obs=y)


def _icar_data():
    rng = np.random.default_rng(0)
    n = GRID * GRID
    E = rng.uniform(5, 20, n)
    phi = np.cumsum(rng.normal(0, 0.3, n))
    y = rng.poisson(E * np.exp(0.1 + phi - phi.mean() + 0.2 * rng.normal(size=n)))
    return jnp.asarray(E, jnp.float32), jnp.asarray(y)


def target(name):
    """``(model, args)`` for a dataset name or one of the two other models."""
    if name == "lorenz_bridge":
        return lorenz_bridge_model, ()
    if name == "icar_bym":
        return icar_bym, _icar_data()
    return model, load_logistic_regression(name)


def run(dataset, base_dist, steps, lr, repeats):
    model, args = target(dataset)
    guide = UHAGuide(model, base_dist=base_dist)
    svi = SVI(model, guide, optax.adam(lr), Trace_ELBO())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        state = svi.init(jax.random.PRNGKey(0), *args)
        init_s = time.perf_counter() - start
        update = jax.jit(svi.update)
        state, _ = update(state, *args)
        jax.block_until_ready(state)
        blocks = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(50):
                state, _ = update(state, *args)
            jax.block_until_ready(state)
            blocks.append((time.perf_counter() - start) / 50)
        result = svi.run(jax.random.PRNGKey(0), steps, *args, progress_bar=False, init_state=state)
        draws = guide.sample_posterior_with_log_weights(
            jax.random.PRNGKey(7), result.params, *args, sample_shape=(2000,))
    lw = np.asarray(draws.log_weights, np.float64)
    est = log_z_from_weights(lw[np.isfinite(lw)])
    return {"dataset": dataset, "base_dist": base_dist, "d": int(guide.latent_dim),
            "init_s": init_s, "step_ms": 1e3 * float(np.median(blocks)),
            "start_elbo": float(guide._start_elbo[0]), "bound": est.elbo, "bound_se": est.elbo_se,
            "warnings": sorted({type(w.message).__name__ for w in caught if w.category.__name__.startswith("UHA")})}


def render(payload) -> str:
    lines = ["| dataset | d | base_dist | svi.init (s) | ms / step | step ratio | start q ELBO | UHA bound | UHA warnings |",
             "|---|---|---|---|---|---|---|---|---|"]
    diag = {r["dataset"]: r for r in payload["runs"] if r["base_dist"] == "diagonal"}
    for r in payload["runs"]:
        ratio = r["step_ms"] / diag[r["dataset"]]["step_ms"] if r["dataset"] in diag else float("nan")
        lines.append(f"| {r['dataset']} | {r['d']} | {r['base_dist']} | {r['init_s']:.1f} | {r['step_ms']:.2f} "
                     f"| {ratio:.2f} | {r['start_elbo']:.3f} | {r['bound']:.3f} ± {r['bound_se']:.3f} "
                     f"| {', '.join(r.get('warnings', ['not recorded'])) or 'none'} |")
    lines += ["", f"{payload['steps']} steps of Adam({payload['lr']:g}) after the timed ones; K = 32 "
              "(the default); both updates jitted; step ratio: against the diagonal q's."]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["ionosphere", "sonar"])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--name", default="full_rank_cost")
    parser.add_argument("--smoke", action="store_true", help="australian, 20 steps: the plumbing only")
    args = parser.parse_args(argv)
    if args.smoke:
        args.datasets, args.steps, args.repeats = ["australian"], 20, 1
    payload = {"steps": args.steps, "lr": args.lr, "runs": []}
    for dataset in args.datasets:
        for base_dist in ("diagonal", "cholesky"):
            payload["runs"].append(run(dataset, base_dist, args.steps, args.lr, args.repeats))
            jax.clear_caches()
    print(write_results(args.name, payload, render(payload)))


if __name__ == "__main__":
    main()
