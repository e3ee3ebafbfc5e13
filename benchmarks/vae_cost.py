"""The cost of one VAE training step, UHA against IWAE at equal K (issue 15, the time item).

Issue 15 asks for UHA's per-epoch time within 1.5× the IWAE's at equal K (the same number
of decoder gradients). This benchmark measures what that asks of the hardware: for each K,
the same two steps as :mod:`benchmarks.vae` trains with (IWAE: :func:`benchmarks.vae.iwae_step`,
DReG, one batched decoder pass over B·K rows and its backward pass; UHA: NumPyro ``SVI``
with ``Trace_ELBO`` on ``UHALocalGuide`` and :func:`benchmarks.vae.uha_optimizer`, the
paper's row: K sequential gradients of log p(x, z) in z, and the training gradient through
them) are

* **counted**: XLA's own floating-point operation count of the compiled step
  (``jax.jit(...).lower(...).compile().cost_analysis()``). XLA counts a loop's body once,
  so the counting compile unrolls every ``lax.scan`` (the chain's K transitions); the
  timed programs are the ordinary ones. The UHA chain's forward pass alone (the K
  gradients, no training gradient: ``guide.log_weights``) is counted too;
* **timed**: the median wall time of a step, the two methods' steps interleaved in blocks
  on the same batch, after compilation.

Both use the same architecture and batch; the counts do not depend on the machine, the
times do (so the table gives both ratios, measured in the same run).

    python -m benchmarks.vae_cost                  # Fashion-MNIST sizes, K = 1 8 16 32
    python -m benchmarks.vae_cost --smoke          # tiny sizes, for the test suite
"""

from __future__ import annotations

import argparse
import contextlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from numpyro.infer import SVI, Trace_ELBO

from benchmarks import vae as V
from benchmarks.common import write_results, xla_cost


@contextlib.contextmanager
def _unrolled_scans():
    """Every ``jax.lax.scan`` traced inside runs fully unrolled (for XLA's cost count,
    which counts a loop body once whatever its trip count)."""
    scan = jax.lax.scan

    def unrolled(*args, **kwargs):
        kwargs["unroll"] = True
        return scan(*args, **kwargs)

    jax.lax.scan = unrolled
    try:
        yield
    finally:
        jax.lax.scan = scan


def _flops(fn, *args) -> float:
    """XLA's flop count of ``jax.jit(fn)`` on ``args`` (call it with the scans unrolled)."""
    return float(xla_cost(jax.jit(fn).lower(*args).compile())["flops"])


def _median_step_seconds(steps: dict, states: dict, x, blocks: int, per_block: int) -> dict:
    """Median seconds per step of each jitted ``step(state, x) -> (state, value)``,
    timed in interleaved blocks of ``per_block`` steps (the first call, which compiles,
    is not timed)."""
    for name, step in steps.items():
        states[name], value = step(states[name], x)
        jax.block_until_ready(value)
    times = {name: [] for name in steps}
    for _ in range(blocks):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(per_block):
                states[name], value = step(states[name], x)
            jax.block_until_ready(value)
            times[name].append((time.perf_counter() - start) / per_block)
    return {name: float(np.median(t)) for name, t in times.items()}


def measure(arch: V.Architecture, K: int, batch: int, num_data: int, blocks: int, per_block: int,
            seed: int = 0) -> dict:
    """Flop counts and step times of IWAE and UHA at ``K`` (one row of the table)."""
    key = jax.random.PRNGKey(seed)
    x = (jax.random.uniform(jax.random.fold_in(key, 0), (batch, arch.data_dim)) < 0.3).astype(
        jnp.float32
    )
    params = V.init_params(jax.random.fold_in(key, 1), arch)
    lr = 1e-4

    iwae_opt = optax.adam(lr)
    iwae = V.iwae_step(arch, K, iwae_opt)
    iwae_state = (params, iwae_opt.init(params), jax.random.fold_in(key, 2))

    def uha_setup():
        # a guide of its own for the count and for the timing: the guide keeps its
        # compiled chain, which must be traced with the scans unrolled for the count only
        model, guide = V.make_uha_guide(arch, K, None, 0.04)
        svi = SVI(model, guide, V.uha_optimizer(lr), Trace_ELBO())
        state = svi.init(jax.random.fold_in(key, 3), x, num_data, init_params=params)

        def step(state, x_batch):
            return svi.update(state, x_batch, num_data)

        def chain(rng_key, p, x_batch):
            return guide.log_weights(rng_key, p, x_batch, x_batch.shape[0], num_samples=1)

        return step, state, chain, svi.get_params(state)

    with _unrolled_scans():
        uha, uha_state, chain, uha_params = uha_setup()
        flops = {
            "iwae": _flops(iwae, iwae_state, x),
            "uha": _flops(uha, uha_state, x),
            "uha_chain": _flops(chain, jax.random.fold_in(key, 4), uha_params, x),
        }
    uha, uha_state, _, _ = uha_setup()
    seconds = _median_step_seconds(
        {"iwae": jax.jit(iwae), "uha": jax.jit(uha)}, {"iwae": iwae_state, "uha": uha_state}, x,
        blocks, per_block,
    )
    return {
        "K": K,
        "iwae_gflop": flops["iwae"] / 1e9,
        "uha_gflop": flops["uha"] / 1e9,
        "uha_chain_gflop": flops["uha_chain"] / 1e9,
        "flop_ratio": flops["uha"] / flops["iwae"],
        "iwae_step_s": seconds["iwae"],
        "uha_step_s": seconds["uha"],
        "time_ratio": seconds["uha"] / seconds["iwae"],
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--K", type=int, nargs="+", default=[1, 8, 16, 32])
    parser.add_argument("--data-dim", type=int, default=784)
    parser.add_argument("--latent-dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=450)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--num-data", type=int, default=59000)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--per-block", type=int, default=10)
    parser.add_argument("--name", default="vae_cost")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.K, args.data_dim, args.latent_dim, args.hidden = [1, 2], 16, 4, 8
        args.batch_size, args.num_data, args.blocks, args.per_block = 8, 64, 1, 2
    arch = V.Architecture(args.data_dim, args.latent_dim, args.hidden)
    rows = []
    for K in args.K:
        row = measure(arch, K, args.batch_size, args.num_data, args.blocks, args.per_block)
        rows.append(row)
        print(row, flush=True)
    md = (
        f"One training step on a batch of {args.batch_size} images of {arch.data_dim} pixels, "
        f"encoder and decoder with one hidden layer of {arch.hidden} ReLU units, latent "
        f"dimension {arch.latent_dim} (the `benchmarks.vae` networks). IWAE: the DReG step "
        "of `benchmarks.vae` (K draws per image in one batched decoder pass); UHA: `SVI` + "
        "`Trace_ELBO` on `UHALocalGuide(K)` (K transitions, position Verlet: K gradients of "
        "log p(x, z) in z per image), the paper's row (encoder frozen). GFLOP: XLA's count "
        "of the compiled step (every `lax.scan` unrolled for the count); UHA chain: the "
        "chain's forward pass alone (`guide.log_weights`, no training gradient). Step "
        f"seconds: median over {args.blocks} interleaved blocks of {args.per_block} steps, "
        "after compilation, both jitted.\n\n"
        "| K | IWAE GFLOP | UHA GFLOP | UHA chain GFLOP | UHA / IWAE flops | IWAE step (s) "
        "| UHA step (s) | UHA / IWAE time |\n|---|---|---|---|---|---|---|---|\n"
        + "".join(
            f"| {r['K']} | {r['iwae_gflop']:.3f} | {r['uha_gflop']:.3f} | "
            f"{r['uha_chain_gflop']:.3f} | {r['flop_ratio']:.2f} | {r['iwae_step_s']:.4f} | "
            f"{r['uha_step_s']:.4f} | {r['time_ratio']:.2f} |\n"
            for r in rows
        )
    )
    path = write_results(args.name, {"args": vars(args), "rows": rows}, md)
    print(path.read_text())


if __name__ == "__main__":
    main()
