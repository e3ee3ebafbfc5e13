"""Per-step gradient norms and diverged chains of a UHA VAE fit (a probe, issue 15).

Runs :func:`benchmarks.vae.train_uha`'s fit (the plain VAE first, then ``UHALocalGuide``
from it, with the key ``benchmarks.vae`` gives it at that K, so the same batches and
optimizer) with one pass-through optax transformation in front of the optimizer. At
every step it records the global norm of the decoder's gradient, of the guide's own
parameters' gradient (ε, η, β, Σ), and the number of diverged chains (the loss gradient of the guide's latch parameter
``local_diverged`` is (N/B) × that number); per epoch it reports their median, 99th
percentile and largest, with the validation bound and the annealing parameters.

Usage (the Fashion-MNIST fit of docs/benchmarks.md, about 10 minutes on 2 CPU cores)::

    python -m benchmarks.vae_gradients --dataset fashion-mnist --vae-epochs 60 --epochs 18 \\
        --K 16 --min-momentum-scale 0.05 --name vae_gradients_k16_floor0.05

Writes ``benchmarks/results/<name>.{json,md}``.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import vae as V
from benchmarks.common import write_results


def _norm(tree: dict, keep) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(jnp.square(v)) for k, v in tree.items() if keep(k)))


def _is_guide_param(name: str) -> bool:
    return not name.startswith(("decoder_", "encoder_")) and name != "local_diverged"


def gradient_monitor(num_data: int, batch_size: int) -> optax.GradientTransformation:
    """Pass-through optax transformation whose state is the last step's gradient norms
    (decoder, guide parameters) and number of diverged chains."""

    def init(params):
        del params
        return {"decoder": jnp.zeros(()), "guide": jnp.zeros(()), "diverged": jnp.zeros(())}

    def update(updates, state, params=None):
        del state, params
        diverged = updates.get("local_diverged", jnp.zeros(())) / (num_data / batch_size)
        return updates, {
            "decoder": _norm(updates, lambda k: k.startswith("decoder_")),
            "guide": _norm(updates, _is_guide_param),
            "diverged": diverged,
        }

    return optax.GradientTransformation(init, update)


def _stats(values: np.ndarray) -> dict:
    return {"median": float(np.median(values)), "p99": float(np.percentile(values, 99)),
            "max": float(values.max())}


def run(args) -> list[dict]:
    # the split benchmarks.vae makes (the test subset is not used here)
    data = V.load_vae_data(args.dataset, validation_size=args.validation_size,
                           test_subset=200, seed=args.seed)
    arch = V.Architecture(int(data.train.shape[1]), args.latent_dim, args.hidden)
    key = jax.random.PRNGKey(args.seed)

    def options(epochs):
        return V.TrainOptions(epochs, args.batch_size, args.lr, None, 1, args.validation_samples)

    vae = V.METHODS["vae"].train(jax.random.fold_in(key, 1), data, arch, 1,
                                 options(args.vae_epochs), None)
    num_data = int(data.train.shape[0])
    steps_per_epoch = num_data // args.batch_size
    monitors, epoch_ends = [], []

    def on_step(state, svi):
        monitors.append(state.optim_state[1][1][0])  # (step, (params, chain state)): the monitor's
        if len(monitors) % steps_per_epoch == 0:
            params = svi.get_params(state)
            epoch_ends.append({k: np.asarray(params[f"local_{k}"])
                               for k in ("step_size", "damping", "momentum_scale")})

    # benchmarks.vae's key for UHA at this K (its rows share the IWAE's seed)
    method_key = jax.random.fold_in(key, 10 + sorted(V.METHODS).index(V.SEED_AS["uha"]))
    result = V.train_uha(
        jax.random.fold_in(method_key, 2 * args.K), data, arch, args.K, options(args.epochs),
        vae.params, init_step_size=args.init_step_size, param_lr_scale=args.param_lr_scale,
        precondition=args.precondition, param_lr_decay=args.param_lr_decay,
        min_momentum_scale=args.min_momentum_scale, max_damping=args.max_damping,
        monitor=gradient_monitor(num_data, args.batch_size), on_step=on_step,
    )
    log = []
    for epoch, end in enumerate(epoch_ends, start=1):
        steps = monitors[(epoch - 1) * steps_per_epoch: epoch * steps_per_epoch]
        stacked = {k: np.asarray(jnp.stack([m[k] for m in steps])) for k in steps[0]}
        log.append({
            "epoch": epoch,
            "validation": dict(result.validation)[epoch],
            "train": result.train_objective[epoch - 1],
            "decoder_gradient": _stats(stacked["decoder"]),
            "guide_gradient": _stats(stacked["guide"]),
            "steps_with_diverged_chains": int((stacked["diverged"] > 0).sum()),
            "step_size": float(end["step_size"]),
            "damping": float(end["damping"]),
            "momentum_scale_min": float(end["momentum_scale"].min()),
            "momentum_scale_median": float(np.median(end["momentum_scale"])),
        })
    return log


def table(log: list[dict]) -> str:
    lines = [
        "| epoch | validation bound | train bound | decoder gradient: p99 / median | max / median "
        "| guide's gradient: max / median | steps with a diverged chain | ε | η | Σ's sds: smallest, median |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in log:
        dec, gui = r["decoder_gradient"], r["guide_gradient"]
        lines.append(
            f"| {r['epoch']} | {r['validation']:.2f} | {r['train']:.2f} | "
            f"{dec['p99'] / dec['median']:.2f} | {dec['max'] / dec['median']:.2f} | "
            f"{gui['max'] / gui['median']:.1f} | {r['steps_with_diverged_chains']} | "
            f"{r['step_size']:.4f} | {r['damping']:.4f} | "
            f"{r['momentum_scale_min']:.3f}, {r['momentum_scale_median']:.3f} |"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="fashion-mnist", choices=["digits", "fashion-mnist"])
    p.add_argument("--vae-epochs", type=int, default=60)
    p.add_argument("--epochs", type=int, default=18, help="epochs of the UHA fit")
    p.add_argument("--K", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--hidden", type=int, default=450)
    p.add_argument("--latent-dim", type=int, default=64)
    p.add_argument("--validation-size", type=int, default=1000)
    p.add_argument("--validation-samples", type=int, default=16)
    p.add_argument("--init-step-size", type=float, default=0.04)
    p.add_argument("--param-lr-scale", type=float, default=100.0)
    p.add_argument("--param-lr-decay", type=float, default=0.01)
    p.add_argument("--precondition", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--min-momentum-scale", type=float, default=None)
    p.add_argument("--max-damping", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="vae_gradients")
    p.add_argument("--smoke", action="store_true",
                   help="digits, 2 + 1 epochs, K = 2, a small network: checks that it runs")
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.smoke:
        args.dataset, args.vae_epochs, args.epochs, args.K = "digits", 2, 1, 2
        args.hidden, args.latent_dim, args.validation_size = 16, 4, 300
        args.validation_samples, args.lr = 2, 1e-3
    log = run(args)
    md = (
        f"UHA K = {args.K} on {args.dataset} from a VAE trained {args.vae_epochs} epochs "
        f"(`benchmarks.vae`'s keys, batches and optimizer for these options), {args.epochs} "
        "epochs; per epoch: the validation bound, the mean training bound, the gradient "
        "norms over the epoch's steps (before the optimizer) and the steps where a chain "
        "diverged; the annealing parameters at the epoch's end.\n\n" + table(log)
    )
    path = write_results(args.name, {"args": vars(args), "epochs": log}, md)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
