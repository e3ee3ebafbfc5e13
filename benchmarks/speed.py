"""Speed and memory of UHAGuide against NumPyro's AutoDAIS, in one run (issue 4, item 4).

All timings are medians over repeats, reported as ratios measured in the same process:

* SVI step time, UHAGuide / AutoDAIS, same model, K, particles and optimizer;
* SVI step time / the *cost floor*: a jitted ``lax.scan`` of K vectorized (over the
  particles) value-and-grad evaluations of the model's log density, i.e. the forward
  gradient work any K-step annealing method must do;
* ``sample_posterior`` of N draws, AutoDAIS / UHAGuide (second call, after compilation;
  the first call, compilation included, is reported too) and UHAGuide / the cost floor
  over N particles;
* peak temporary memory of one compiled SVI step (XLA's ``memory_analysis``) at large K
  with and without ``remat=True``.

    python -m benchmarks.speed                   # sonar K=32 x 8 particles, madelon memory
    python -m benchmarks.speed --smoke           # tiny sizes, seconds
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import optax
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDAIS
from numpyro.infer.util import potential_energy

from benchmarks.common import write_results
from numpyro_uha import UHAGuide
from numpyro_uha.datasets import load_logistic_regression, logistic_regression_model


def _median_time(fn, repeats, *args):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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
    return _median_time(run, repeats, state) / steps, svi, state


def cost_floor(model, X, y, latent_dim, K, num_particles, repeats):
    """Seconds for K vectorized value-and-grad evaluations of the log density."""
    def logdensity(z):
        return -potential_energy(model, (X, y), {}, {"w": z})

    value_and_grad = jax.vmap(jax.value_and_grad(logdensity))

    @jax.jit
    def run(z):
        def body(z, _):
            value, grad = value_and_grad(z)
            return z + 1e-6 * grad, value

        return jax.lax.scan(body, z, None, length=K)

    z = 0.01 * jax.random.normal(jax.random.PRNGKey(1), (num_particles, latent_dim))
    jax.block_until_ready(run(z))
    return _median_time(run, repeats, z)


def sample_time(guide, params, X, y, num_draws, repeats):
    first_start = time.perf_counter()
    jax.block_until_ready(guide.sample_posterior(jax.random.PRNGKey(2), params, X, y, sample_shape=(num_draws,)))
    first = time.perf_counter() - first_start
    steady = _median_time(
        lambda: guide.sample_posterior(jax.random.PRNGKey(3), params, X, y, sample_shape=(num_draws,)),
        repeats,
    )
    return first, steady


def step_memory(model, guide, X, y, num_particles):
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO(num_particles=num_particles))
    state = svi.init(jax.random.PRNGKey(0), X, y)
    compiled = jax.jit(svi.update).lower(state, X, y).compile()
    analysis = compiled.memory_analysis()
    return int(analysis.temp_size_in_bytes) if analysis is not None else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", default="sonar")
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
        args.memory_dataset, args.memory_K, args.memory_particles = args.dataset, 4, 2

    model = logistic_regression_model
    X, y = load_logistic_regression(args.dataset)
    d = X.shape[1]
    rows = {}
    uha_guide = UHAGuide(model, K=args.K, warm_start_steps=0)
    dais_guide = AutoDAIS(model, K=args.K)
    uha_step, uha_svi, uha_state = svi_step_time(model, uha_guide, X, y, args.num_particles, args.steps, args.repeats)
    dais_step, dais_svi, dais_state = svi_step_time(model, dais_guide, X, y, args.num_particles, args.steps, args.repeats)
    floor_step = cost_floor(model, X, y, d, args.K, args.num_particles, args.repeats)
    rows["svi_step"] = {
        "uha_ms": 1e3 * uha_step, "autodais_ms": 1e3 * dais_step, "floor_ms": 1e3 * floor_step,
        "uha_over_autodais": uha_step / dais_step,
        "uha_over_floor": uha_step / floor_step,
        "autodais_over_floor": dais_step / floor_step,
    }
    print(rows["svi_step"], flush=True)

    uha_params = uha_svi.get_params(uha_state)
    dais_params = dais_svi.get_params(dais_state)
    uha_first, uha_draw = sample_time(uha_guide, uha_params, X, y, args.num_draws, args.repeats)
    dais_first, dais_draw = sample_time(dais_guide, dais_params, X, y, args.num_draws, max(2, args.repeats // 3))
    floor_draw = cost_floor(model, X, y, d, args.K, args.num_draws, args.repeats)
    rows["sample_posterior"] = {
        "num_draws": args.num_draws,
        "uha_s": uha_draw, "autodais_s": dais_draw, "floor_s": floor_draw,
        "uha_first_call_s": uha_first, "autodais_first_call_s": dais_first,
        "autodais_over_uha": dais_draw / uha_draw,
        "autodais_over_uha_first_call": dais_first / uha_first,
        "uha_over_floor": uha_draw / floor_draw,
    }
    print(rows["sample_posterior"], flush=True)

    Xm, ym = load_logistic_regression(args.memory_dataset)
    memory = {}
    for remat in (False, True):
        guide = UHAGuide(model, K=args.memory_K, warm_start_steps=0, remat=remat)
        memory["remat" if remat else "no_remat"] = step_memory(model, guide, Xm, ym, args.memory_particles)
    memory["autodais"] = step_memory(model, AutoDAIS(model, K=args.memory_K), Xm, ym, args.memory_particles)
    rows["memory_bytes"] = {
        "dataset": args.memory_dataset, "d": int(Xm.shape[1]), "K": args.memory_K,
        "num_particles": args.memory_particles, **memory,
    }
    print(rows["memory_bytes"], flush=True)

    s, p, m = rows["svi_step"], rows["sample_posterior"], rows["memory_bytes"]
    mib = 2.0**20
    table = (
        f"Model: {args.dataset} logistic regression (d = {d}), K = {args.K}, "
        f"{args.num_particles} particles; medians of {args.repeats} repeats "
        f"({args.steps} jitted SVI steps each). Cost floor: jitted scan of K vectorized "
        "value-and-grad evaluations of the log density.\n\n"
        "| measure | UHAGuide | AutoDAIS | cost floor | ratio |\n|---|---|---|---|---|\n"
        f"| SVI step (ms) | {s['uha_ms']:.2f} | {s['autodais_ms']:.2f} | {s['floor_ms']:.2f} | "
        f"UHA/DAIS {s['uha_over_autodais']:.2f}; UHA/floor {s['uha_over_floor']:.2f}; "
        f"DAIS/floor {s['autodais_over_floor']:.2f} |\n"
        f"| sample_posterior {p['num_draws']} draws (s) | {p['uha_s']:.3f} | {p['autodais_s']:.3f} | "
        f"{p['floor_s']:.3f} | DAIS/UHA {p['autodais_over_uha']:.1f}×; UHA/floor {p['uha_over_floor']:.2f} |\n"
        f"| same, first call incl. compile (s) | {p['uha_first_call_s']:.2f} | "
        f"{p['autodais_first_call_s']:.2f} | - | DAIS/UHA {p['autodais_over_uha_first_call']:.1f}× |\n\n"
        f"Peak temporary memory of one compiled SVI step ({m['dataset']}, d = {m['d']}, "
        f"K = {m['K']}, {m['num_particles']} particles; XLA memory_analysis): UHAGuide "
        f"{m['no_remat'] / mib:.1f} MiB, UHAGuide(remat=True) {m['remat'] / mib:.1f} MiB, "
        f"AutoDAIS {m['autodais'] / mib:.1f} MiB.\n"
    )
    path = write_results(args.name, {"settings": vars(args), "results": rows}, table)
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
