"""Speed and memory of UHAGuide against NumPyro's AutoDAIS, in one run (issue 4, item 4).

Every timing is a median over ``--repeats`` in one process, and the whole measurement is
repeated ``--runs`` times (fresh guides, same process); the table reports the median
ratio over runs and its range. Ratios are measured in the same process:

* SVI step time, UHAGuide / AutoDAIS, same model, K, particles and optimizer;
* SVI step time / the *cost floor*: a jitted ``lax.scan`` of K vectorized (over the
  particles) value-and-grad evaluations of the model's log density, i.e. the forward
  gradient work any K-step annealing method must do;
* ``sample_posterior`` of N draws, AutoDAIS / UHAGuide (second call, after compilation;
  the first call, compilation included, is reported too) and UHAGuide / the cost floor
  over N particles, and the same floor plus drawing the K·N·d Gaussian refresh noises any
  stochastic sampler must draw (the "stochastic floor");
* the divergence check's cost: SVI step time with ``check_finite=True`` (the default:
  gradient gate, latch parameter, recording branch) over ``check_finite=False``;
* peak temporary memory of one compiled SVI step (XLA's ``memory_analysis``) at large K
  with and without ``remat=True``.

    python -m benchmarks.speed --runs 3          # sonar and madelon, K=32 x 8 particles; madelon memory
    python -m benchmarks.speed --smoke           # tiny sizes, seconds
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDAIS
from numpyro.infer.util import potential_energy

from benchmarks.common import median_time, write_results
from numpyro_uha import UHAGuide
from numpyro_uha.datasets import load_logistic_regression, logistic_regression_model


def svi_step_time(model, guide, X, y, num_particles, steps, repeats):
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO(num_particles=num_particles))
    state = svi.init(jax.random.PRNGKey(0), X, y)

    @jax.jit
    def run(state):
        def body(state, _):
            state, loss = svi.update(state, X, y)
            return state, loss

        return jax.lax.scan(body, state, None, length=steps)

    jax.block_until_ready(run(state))  # compile
    return median_time(run, repeats, state) / steps, svi, state


def cost_floor(model, X, y, latent_dim, K, num_particles, repeats, noise=False):
    """Seconds for K vectorized value-and-grad evaluations of the log density (and, with
    ``noise=True``, one standard-normal draw per particle and dimension at each of them,
    from per-particle keys as a vectorized sampler draws them)."""
    def logdensity(z):
        return -potential_energy(model, (X, y), {}, {"w": z})

    value_and_grad = jax.vmap(jax.value_and_grad(logdensity))

    @jax.jit
    def run(z, keys):
        def body(z, e):
            value, grad = value_and_grad(z)
            z = z + 1e-6 * grad
            return (z if e is None else z + 1e-6 * e), value

        if not noise:
            return jax.lax.scan(body, z, None, length=K)
        eps = jax.vmap(lambda k: jax.random.normal(k, (K, latent_dim)))(keys)  # (N, K, d)
        return jax.lax.scan(body, z, jnp.swapaxes(eps, 0, 1))

    z = 0.01 * jax.random.normal(jax.random.PRNGKey(1), (num_particles, latent_dim))
    keys = jax.random.split(jax.random.PRNGKey(2), num_particles)
    jax.block_until_ready(run(z, keys))
    return median_time(run, repeats, z, keys)


def sample_time(guide, params, X, y, num_draws, repeats):
    first_start = time.perf_counter()
    jax.block_until_ready(guide.sample_posterior(jax.random.PRNGKey(2), params, X, y, sample_shape=(num_draws,)))
    first = time.perf_counter() - first_start
    # the key made once, outside the timed calls, as the in-jit timings pass theirs:
    # making one is a computation on the device of its own (until 2026-11-28 it was
    # timed: on the H200, 10 000 sonar draws took 4.0 ms a call that way, 2.9-3.0 ms with
    # the key made once; benchmarks/results/gpu_h200_1128)
    key = jax.random.PRNGKey(3)
    steady = median_time(
        lambda: guide.sample_posterior(key, params, X, y, sample_shape=(num_draws,)),
        repeats,
    )
    return first, steady


def step_memory(model, guide, X, y, num_particles):
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO(num_particles=num_particles))
    state = svi.init(jax.random.PRNGKey(0), X, y)
    compiled = jax.jit(svi.update).lower(state, X, y).compile()
    analysis = compiled.memory_analysis()
    return int(analysis.temp_size_in_bytes) if analysis is not None else None


def measure(model, X, y, args):
    """One run of every timing on (X, y): seconds and ratios."""
    d = X.shape[1]
    # a diagonal q, as AutoDAIS's (its default) and as when issue 16 set its targets
    # (FULL_RANK_MAX_DIM was 32): like with like; sonar's default q is now full rank
    uha_guide = UHAGuide(model, K=args.K, warm_start_steps=0, base_dist="diagonal")
    dais_guide = AutoDAIS(model, K=args.K)
    uha_step, uha_svi, uha_state = svi_step_time(model, uha_guide, X, y, args.num_particles, args.steps, args.repeats)
    dais_step, dais_svi, dais_state = svi_step_time(model, dais_guide, X, y, args.num_particles, args.steps, args.repeats)
    unchecked_guide = UHAGuide(model, K=args.K, warm_start_steps=0, check_finite=False,
                               base_dist="diagonal")
    unchecked_step, _, _ = svi_step_time(model, unchecked_guide, X, y, args.num_particles, args.steps, args.repeats)
    floor_step = cost_floor(model, X, y, d, args.K, args.num_particles, args.repeats)
    uha_first, uha_draw = sample_time(uha_guide, uha_svi.get_params(uha_state), X, y, args.num_draws, args.repeats)
    dais_first, dais_draw = sample_time(dais_guide, dais_svi.get_params(dais_state), X, y, args.num_draws,
                                        max(2, args.repeats // 3))
    floor_draw = cost_floor(model, X, y, d, args.K, args.num_draws, args.repeats)
    noisy_floor_draw = cost_floor(model, X, y, d, args.K, args.num_draws, args.repeats, noise=True)
    return {
        "uha_step_ms": 1e3 * uha_step, "autodais_step_ms": 1e3 * dais_step, "floor_step_ms": 1e3 * floor_step,
        "step_uha_over_autodais": uha_step / dais_step,
        "uha_unchecked_step_ms": 1e3 * unchecked_step,
        "step_check_over_no_check": uha_step / unchecked_step,
        "step_uha_over_floor": uha_step / floor_step,
        "step_autodais_over_floor": dais_step / floor_step,
        "uha_draws_s": uha_draw, "autodais_draws_s": dais_draw, "floor_draws_s": floor_draw,
        "stochastic_floor_draws_s": noisy_floor_draw,
        "uha_first_call_s": uha_first, "autodais_first_call_s": dais_first,
        "draws_autodais_over_uha": dais_draw / uha_draw,
        "draws_autodais_over_uha_first_call": dais_first / uha_first,
        "draws_uha_over_floor": uha_draw / floor_draw,
        "draws_uha_over_stochastic_floor": uha_draw / noisy_floor_draw,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--datasets", nargs="+", default=["sonar", "madelon"])
    parser.add_argument("--runs", type=int, default=3, help="repeats of the whole timing measurement")
    parser.add_argument("--K", type=int, default=32)
    parser.add_argument("--num-particles", type=int, default=8)
    parser.add_argument("--steps", type=int, default=50, help="SVI steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--num-draws", type=int, default=1000)
    parser.add_argument("--memory-dataset", default="madelon")
    parser.add_argument("--memory-K", type=int, default=256)
    parser.add_argument("--memory-particles", type=int, default=16)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    parser.add_argument("--name", default="speed")
    args = parser.parse_args(argv)
    if args.smoke:
        args.K, args.num_particles, args.steps, args.repeats, args.num_draws = 2, 2, 2, 2, 8
        args.datasets, args.runs = ["sonar"], 1
        args.memory_dataset, args.memory_K, args.memory_particles = "sonar", 4, 2

    model = logistic_regression_model
    timings = {}
    for dataset in args.datasets:
        X, y = load_logistic_regression(dataset)
        runs = [measure(model, X, y, args) for _ in range(args.runs)]
        timings[dataset] = {"d": int(X.shape[1]), "runs": runs,
                            "median": {k: float(np.median([r[k] for r in runs])) for k in runs[0]},
                            "min": {k: float(np.min([r[k] for r in runs])) for k in runs[0]},
                            "max": {k: float(np.max([r[k] for r in runs])) for k in runs[0]}}
        print(dataset, timings[dataset]["median"], flush=True)
    rows = {"timings": timings}

    Xm, ym = load_logistic_regression(args.memory_dataset)
    memory = {}
    for remat in (False, True):
        guide = UHAGuide(model, K=args.memory_K, warm_start_steps=0, remat=remat, base_dist="diagonal")
        memory["remat" if remat else "no_remat"] = step_memory(model, guide, Xm, ym, args.memory_particles)
    memory["autodais"] = step_memory(model, AutoDAIS(model, K=args.memory_K), Xm, ym, args.memory_particles)
    rows["memory_bytes"] = {
        "dataset": args.memory_dataset, "d": int(Xm.shape[1]), "K": args.memory_K,
        "num_particles": args.memory_particles, **memory,
    }
    print(rows["memory_bytes"], flush=True)

    m = rows["memory_bytes"]
    mib = 2.0**20

    def cell(t, key, fmt="{:.2f}"):
        lo, med, hi = t["min"][key], t["median"][key], t["max"][key]
        return fmt.format(med) + (f" ({fmt.format(lo)}–{fmt.format(hi)})" if args.runs > 1 else "")

    table = (
        f"Logistic regression, K = {args.K}, {args.num_particles} particles, Adam; each time a median of "
        f"{args.repeats} repeats ({args.steps} jitted SVI steps each), the whole measurement run {args.runs}× "
        "in one process: median ratio over runs (range). Cost floor: jitted scan of K vectorized "
        "value-and-grad evaluations of the log density; stochastic floor: the same plus the K·N·d "
        f"refresh noises drawn from per-draw keys. Draw timings: `sample_posterior` of {args.num_draws} "
        "draws, after compilation (the first call, compile included, is shown too).\n\n"
        "| model | d | SVI step UHA / AutoDAIS (target ≤ 1.0) | SVI step UHA / floor (target ≤ 2.0) | "
        "AutoDAIS / floor | draws AutoDAIS / UHA (target ≥ 5) | draws UHA / floor (target ≤ 1.5) | "
        "draws UHA / stochastic floor | first call AutoDAIS / UHA | step check_finite on / off |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for dataset, t in timings.items():
        table += (f"| {dataset} | {t['d']} | {cell(t, 'step_uha_over_autodais')} | {cell(t, 'step_uha_over_floor')} | "
                  f"{cell(t, 'step_autodais_over_floor')} | {cell(t, 'draws_autodais_over_uha', '{:.1f}')} | "
                  f"{cell(t, 'draws_uha_over_floor')} | {cell(t, 'draws_uha_over_stochastic_floor')} | "
                  f"{cell(t, 'draws_autodais_over_uha_first_call', '{:.1f}')} | "
                  f"{cell(t, 'step_check_over_no_check')} |\n")
    table += "\nAbsolute medians (ms per SVI step; s per batch of draws):\n\n| model | UHA step | AutoDAIS step | floor step | UHA draws | AutoDAIS draws | floor draws | stochastic floor draws |\n|---|---|---|---|---|---|---|---|\n"
    for dataset, t in timings.items():
        md = t["median"]
        table += (f"| {dataset} | {md['uha_step_ms']:.2f} | {md['autodais_step_ms']:.2f} | {md['floor_step_ms']:.2f} | "
                  f"{md['uha_draws_s']:.3f} | {md['autodais_draws_s']:.3f} | {md['floor_draws_s']:.3f} | "
                  f"{md['stochastic_floor_draws_s']:.3f} |\n")
    table += (
        f"\nPeak temporary memory of one compiled SVI step ({m['dataset']}, d = {m['d']}, "
        f"K = {m['K']}, {m['num_particles']} particles; XLA memory_analysis): UHAGuide "
        f"{m['no_remat'] / mib:.1f} MiB, UHAGuide(remat=True) {m['remat'] / mib:.1f} MiB, "
        f"AutoDAIS {m['autodais'] / mib:.1f} MiB.\n"
    )
    path = write_results(args.name, {"settings": vars(args), "results": rows}, table)
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
