"""What the divergence check costs a UHA training step: the step-by-step rule against the
screened one of ``annealed_sample(..., deferred_diagnostics=True)``, in one run.

A UHA training step gates the gradient of every particle whose chain diverged (a
non-finite log weight, or a leapfrog step whose energy error exceeds 1000 nats, NUTS's
rule), so each step must know which did. The energy errors need log p̄ at every position
of the chain, which the position-Verlet transitions do not otherwise evaluate: K more
evaluations of the model per particle. ``deferred_diagnostics`` checks a chain step by
step only where a kinetic increment exceeds 100 nats, its last step's energy error 1000
nats, or its weight is not finite (see ``numpyro_uha.core.annealed_sample``), so a calm
chain costs two evaluations of log p̄ instead of K + 1.

Three jitted training steps on the same logistic-regression log density (the package's
own datasets), parameters and keys, through the pure-JAX core as its users call it
(``annealed_sample`` under ``jax.vmap`` over particles, ``jax.value_and_grad`` of the
mean log weight with diverged particles' weights stopped, a plain gradient step):

* *stepwise*: ``deferred_diagnostics=False``, the flag from ``info.log_accept_ratio``
  (the rule ``UHAGuide`` applied until 2026-12-02);
* *screened*: ``deferred_diagnostics=True``, the flag ``info.diverged`` (the rule
  ``UHAGuide`` applies since);
* *no check*: no flag (the cost of training without the gate).

Every timing is a median over ``--repeats`` of ``--steps`` steps inside one ``lax.scan``;
the three are timed in turn, and the whole measurement is repeated ``--runs`` times in
one process (the table gives the median ratio and its range). XLA's cost analysis of each
compiled step (floating-point operations; a loop body counted once, both branches of a
conditional too) is deterministic.
The two checked steps' flags are compared at each step of one call (``flags equal``).

    python -m benchmarks.divergence_check             # sonar, madelon; 1 and 8 particles
    python -m benchmarks.divergence_check --smoke     # tiny sizes, seconds
"""

from __future__ import annotations

import argparse
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.util import potential_energy

from benchmarks.common import median_time, write_results, xla_cost
from numpyro_uha.core import annealed_sample, make_params
from numpyro_uha.core.annealing import divergence_rule
from numpyro_uha.datasets import load_logistic_regression, logistic_regression_model

VARIANTS = ("stepwise", "screened", "no_check")


def _flags(variant, log_weight, info):
    if variant == "stepwise":
        return divergence_rule(log_weight, info.log_accept_ratio)
    if variant == "screened":
        return info.diverged
    return jnp.zeros(jnp.shape(log_weight), bool)


def training_step(logdensity, num_particles, variant):
    """``(params, key) -> (params, flags)``: one gradient step on the mean log weight."""

    def loss(params, key):
        keys = jax.random.split(key, num_particles)
        _, log_weight, info = jax.vmap(
            lambda k: annealed_sample(
                k, logdensity, params, integrator="position_verlet",
                deferred_diagnostics=variant == "screened",
            )
        )(keys)
        flags = _flags(variant, log_weight, info)
        kept = jnp.where(flags, jax.lax.stop_gradient(log_weight), log_weight)
        return -jnp.mean(jnp.where(flags, 0.0, kept)), flags

    def step(params, key):
        (_, flags), grads = jax.value_and_grad(loss, has_aux=True)(params, key)
        params = jax.tree.map(lambda p, g: p - 1e-6 * g, params, grads)
        return params, flags

    return step


def initial_params(d, K):
    """A q of sds 0.1 at 0 and a schedule of small steps: calm chains, as in training."""
    return make_params(
        jnp.zeros(d), jnp.full(d, 0.1), betas=jnp.linspace(1.0 / K, 1.0, K),
        step_size=jnp.full(K, 0.02), damping=0.9, momentum_scale=jnp.full(d, 10.0),
    )


def measure(X, y, num_particles, args):
    model = logistic_regression_model

    def logdensity(z):
        return -potential_energy(model, (X, y), {}, {"w": z})

    params = initial_params(X.shape[1], args.K)
    keys = jax.random.split(jax.random.PRNGKey(0), args.steps)
    programs, flops, flags = {}, {}, {}
    for variant in VARIANTS:
        step = training_step(logdensity, num_particles, variant)

        def run(params, keys, step=step):
            return jax.lax.scan(step, params, keys)

        compiled = jax.jit(run).lower(params, keys).compile()
        programs[variant] = compiled
        flops[variant] = float(xla_cost(compiled).get("flops", float("nan")))
        flags[variant] = np.asarray(compiled(params, keys)[1])
    runs = []
    for _ in range(args.runs):
        times = {v: median_time(programs[v], args.repeats, params, keys) / args.steps for v in VARIANTS}
        runs.append({f"{v}_ms": 1e3 * t for v, t in times.items()})
    return {
        "runs": runs,
        "flops": flops,
        "flags_equal": bool(np.array_equal(flags["stepwise"], flags["screened"])),
        "diverged_particle_steps": int(flags["stepwise"].sum()),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--datasets", nargs="+", default=["sonar", "madelon"])
    parser.add_argument("--particles", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--K", type=int, default=32)
    parser.add_argument("--steps", type=int, default=50, help="training steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    parser.add_argument("--name", default="divergence_check")
    args = parser.parse_args(argv)
    if args.smoke:
        args.datasets, args.particles, args.K, args.steps, args.repeats, args.runs = (
            ["sonar"], [2], 4, 2, 2, 1
        )

    cells = {}
    for dataset in args.datasets:
        X, y = load_logistic_regression(dataset)
        for num_particles in args.particles:
            cell = measure(X, y, num_particles, args)
            cell["d"] = int(X.shape[1])
            cells[f"{dataset}/{num_particles}"] = cell
            print(dataset, num_particles, cell["runs"], cell["flops"], flush=True)

    def ratio(cell, a, b):
        values = [r[f"{a}_ms"] / r[f"{b}_ms"] for r in cell["runs"]]
        med = statistics.median(values)
        return f"{med:.2f}" + (f" ({min(values):.2f}–{max(values):.2f})" if len(values) > 1 else "")

    table = (
        f"Logistic regression, K = {args.K}, position Verlet; ms per training step (median of "
        f"{args.repeats} repeats of {args.steps} steps in one `lax.scan`; median over "
        f"{args.runs} runs in one process) and ratios (median, range over runs). MFLOP: XLA's "
        "cost analysis of the compiled scan (a loop body counted once, and both branches of a "
        "conditional: the screened step's count holds the step-by-step check it skips when calm).\n\n"
        "| data | d | particles | stepwise ms | screened ms | no check ms | screened / stepwise | "
        "stepwise / no check | screened / no check | MFLOP stepwise / screened / none | "
        "flags equal | diverged particle-steps |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for name, cell in cells.items():
        dataset, particles = name.split("/")
        med = {v: statistics.median(r[f"{v}_ms"] for r in cell["runs"]) for v in VARIANTS}
        fl = cell["flops"]
        table += (
            f"| {dataset} | {cell['d']} | {particles} | {med['stepwise']:.2f} | "
            f"{med['screened']:.2f} | {med['no_check']:.2f} | "
            f"{ratio(cell, 'screened', 'stepwise')} | {ratio(cell, 'stepwise', 'no_check')} | "
            f"{ratio(cell, 'screened', 'no_check')} | {fl['stepwise'] / 1e6:.2f} / "
            f"{fl['screened'] / 1e6:.2f} / {fl['no_check'] / 1e6:.2f} | "
            f"{'yes' if cell['flags_equal'] else 'NO'} | {cell['diverged_particle_steps']} |\n"
        )
    path = write_results(args.name, {"args": vars(args), "cells": cells}, table)
    print(path.read_text())


if __name__ == "__main__":
    main()
