"""Strong and weak scaling of sharded SVI steps and draws (issue 16, item 5).

Logistic regression on sonar (d = 61), ``UHAGuide(K=32, sharding=mesh)``, SVI particles
sharded with ``Trace_ELBO(num_particles=P, vectorize_particles=shard_particles(mesh))``.

- **CPU**: each device count N runs in its own process with
  ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (the flag must be set before JAX
  starts). Forced host devices share the machine's cores: the speed-up is bounded by the
  core count, which the table states.
- **Accelerator** (``--platform gpu``): the devices the machine has (``N`` up to
  ``jax.device_count()``).

Strong scaling: fixed total work (``--particles`` per step, ``--draws`` per call) split
over N devices. Weak scaling: fixed work per device (``--particles`` and ``--draws`` ×
N). Times are medians of ``--repeats`` jitted SVI steps (``svi.update`` under
``jax.jit``) and of ``guide.sample_posterior`` calls (compiled, after a first call),
in one process per N; speed-up and efficiency are against N = 1 of the same run.

Run: ``python -m benchmarks.scaling [--devices 1 2 4 8] [--platform cpu]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

SONAR_K = 32


def _child(num_devices, particles, draws, repeats, weak, out):
    import jax
    import optax
    from numpyro.infer import SVI, Trace_ELBO

    from numpyro_uha import UHAGuide, shard_particles
    from numpyro_uha.datasets import load_logistic_regression, logistic_regression_model

    devices = jax.devices()[:num_devices]
    mesh = jax.sharding.Mesh(np.array(devices), ("draws",))
    X, y = load_logistic_regression("sonar")
    model = logistic_regression_model
    scale = num_devices if weak else 1
    num_particles, num_draws = particles * scale, draws * scale
    guide = UHAGuide(model, K=SONAR_K, warm_start_steps=0, sharding=mesh,
                     sample_batch_size=num_draws)
    svi = SVI(model, guide, optax.adam(1e-3),
              Trace_ELBO(num_particles=num_particles, vectorize_particles=shard_particles(mesh)))
    # the state replicated on the mesh, as the steps return it (else the second step
    # compiles again for the new placement)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    state = jax.device_put(svi.init(jax.random.PRNGKey(0), X, y), replicated)
    update = jax.jit(svi.update)
    for _ in range(2):
        state, _ = update(state, X, y)
    jax.block_until_ready(state)
    steps = []
    for _ in range(repeats):
        start = time.perf_counter()
        state, loss = update(state, X, y)
        jax.block_until_ready(loss)
        steps.append(time.perf_counter() - start)
    params = svi.get_params(state)
    jax.block_until_ready(guide.sample_posterior(jax.random.PRNGKey(1), params, X, y,
                                                 sample_shape=(num_draws,)))
    draw_times = []
    for i in range(repeats):
        start = time.perf_counter()
        samples = guide.sample_posterior(jax.random.PRNGKey(2 + i), params, X, y,
                                         sample_shape=(num_draws,))
        jax.block_until_ready(samples)
        draw_times.append(time.perf_counter() - start)
    result = {
        "num_devices": num_devices, "device_kind": devices[0].device_kind,
        "platform": devices[0].platform, "num_particles": num_particles,
        "num_draws": num_draws, "step_s": float(np.median(steps)),
        "draws_s": float(np.median(draw_times)),
    }
    with open(out, "w") as f:
        json.dump(result, f)


def _run_child(n, platform, args, weak, path):
    env = dict(os.environ)
    if platform == "cpu":
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n}"
        env["JAX_PLATFORMS"] = "cpu"
    cmd = [sys.executable, "-m", "benchmarks.scaling", "--child", str(n), "--out", path,
           "--particles", str(args.particles), "--draws", str(args.draws),
           "--repeats", str(args.repeats)] + (["--weak"] if weak else [])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"N={n} weak={weak} failed:\n{done.stderr[-3000:]}")
    with open(path) as f:
        return json.load(f)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--platform", default="cpu", choices=["cpu", "gpu", "tpu"])
    parser.add_argument("--particles", type=int, default=64, help="per step (strong); per device (weak)")
    parser.add_argument("--draws", type=int, default=8192, help="per call (strong); per device (weak)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--name", default="scaling")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--child", type=int)
    parser.add_argument("--out")
    parser.add_argument("--weak", action="store_true")
    args = parser.parse_args(argv)
    if args.child:
        return _child(args.child, args.particles, args.draws, args.repeats, args.weak, args.out)
    if args.smoke:
        args.devices, args.particles, args.draws, args.repeats = [1, 2], 4, 64, 2

    import tempfile

    from benchmarks.common import write_results

    rows = {"strong": [], "weak": []}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("strong", "weak"):
            for n in args.devices:
                r = _run_child(n, args.platform, args, mode == "weak", os.path.join(tmp, f"{mode}{n}.json"))
                rows[mode].append(r)
                print(mode, r, flush=True)

    def table(mode):
        base = rows[mode][0]
        text = ("| devices | particles | draws | SVI step (ms) | step speed-up | step efficiency | "
                "draws (s) | draws speed-up | draws efficiency |\n|---|---|---|---|---|---|---|---|---|\n")
        for r in rows[mode]:
            n = r["num_devices"] / base["num_devices"]
            if mode == "strong":
                s_step, s_draw = base["step_s"] / r["step_s"], base["draws_s"] / r["draws_s"]
                e_step, e_draw = s_step / n, s_draw / n
            else:  # work grows with N: speed-up = N x time_1 / time_N, efficiency = time_1 / time_N
                e_step, e_draw = base["step_s"] / r["step_s"], base["draws_s"] / r["draws_s"]
                s_step, s_draw = e_step * n, e_draw * n
            text += (f"| {r['num_devices']} | {r['num_particles']} | {r['num_draws']} | "
                     f"{1e3 * r['step_s']:.2f} | {s_step:.2f}× | {e_step:.0%} | {r['draws_s']:.3f} | "
                     f"{s_draw:.2f}× | {e_draw:.0%} |\n")
        return text

    first = rows["strong"][0]
    md = (
        f"Sonar logistic regression (d = 61), K = {SONAR_K}, UHAGuide sharded over a 1-D mesh; "
        f"{first['platform']} devices ({first['device_kind']})"
        + (f", forced host devices sharing {os.cpu_count()} cores" if args.platform == "cpu" else "")
        + f". Medians of {args.repeats} jitted SVI steps / compiled `sample_posterior` calls, one "
        "process per device count; speed-up and efficiency against 1 device in this run.\n\n"
        f"**Strong scaling** ({args.particles} particles per step, {args.draws} draws per call, "
        "split over the devices):\n\n" + table("strong")
        + f"\n**Weak scaling** ({args.particles} particles and {args.draws} draws per device):\n\n"
        + table("weak")
    )
    path = write_results(args.name, {"rows": rows, "args": vars(args)}, md)
    print(path.read_text())


if __name__ == "__main__":
    main()
