"""Per-step gradient norms and diverged chains of a UHA VAE fit (a probe, issue 15).

Reruns :func:`benchmarks.vae.train_uha`'s fit step for step (the plain VAE first, then
``UHALocalGuide`` from it, with the keys, batches and optimizer ``benchmarks.vae`` uses for
the same options, so its validation bounds are that benchmark's) with one pass-through
optax transformation in front of the optimizer. At every step it records the global norm
of the decoder's gradient, of the guide's own parameters' gradient (ε, η, β, Σ), and the
number of diverged chains (the loss gradient of the guide's latch parameter
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
from numpyro.infer import SVI, Trace_ELBO

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
    options = lambda epochs: V.TrainOptions(epochs, args.batch_size, args.lr, None, 1)  # noqa: E731
    vae = V.METHODS["vae"].train(jax.random.fold_in(key, 1), data, arch, 1,
                                 options(args.vae_epochs), None)
    # benchmarks.vae's key for UHA at this K (its rows share the IWAE's seed)
    method_key = jax.random.fold_in(key, 10 + sorted(V.METHODS).index(V.SEED_AS["uha"]))
    model, guide = V.make_uha_guide(
        arch, args.K, data.pixel_mean, args.init_step_size, V.UHA_MAX_STEP_SIZE,
        args.precondition, args.min_momentum_scale, args.max_damping,
    )
    num_data, batch = int(data.train.shape[0]), args.batch_size
    steps_per_epoch = num_data // batch
    optimizer = optax.chain(
        gradient_monitor(num_data, batch),
        V.uha_optimizer(args.lr, args.param_lr_scale, False, args.param_lr_decay,
                        args.epochs * steps_per_epoch),
    )
    svi = SVI(model, guide, optimizer, Trace_ELBO())
    key_init, key_loop, _ = jax.random.split(jax.random.fold_in(method_key, 2 * args.K), 3)
    state = svi.init(key_init, V.binarize(key_init, data.train[:batch]), num_data,
                     init_params=vae.params)

    @jax.jit
    def step(state, x_batch):
        state, loss = svi.update(state, x_batch, num_data)
        monitor = state.optim_state[1][1][0]  # (step, (params, chain state)); the monitor's
        return state, -loss / num_data, monitor

    validate = V._uha_validation_bound(guide, data, args.validation_samples)
    log = []
    for epoch in range(1, args.epochs + 1):  # train_loop's batches, epoch by epoch
        key_bin, key_perm = jax.random.split(jax.random.fold_in(key_loop, epoch))
        images = V.binarize(key_bin, data.train)
        order = jax.random.permutation(key_perm, num_data)[: steps_per_epoch * batch]
        batches = images[order].reshape(steps_per_epoch, batch, -1)
        objectives, monitors = [], []
        for i in range(steps_per_epoch):
            state, objective, monitor = step(state, batches[i])
            objectives.append(objective)
            monitors.append(monitor)
        monitors = {k: np.asarray(jnp.stack([m[k] for m in monitors])) for k in monitors[0]}
        params = svi.get_params(state)
        scales = np.asarray(params["local_momentum_scale"])
        record = {
            "epoch": epoch,
            "validation": validate(params),
            "train": float(np.mean(np.asarray(jnp.stack(objectives)))),
            "decoder_gradient": _stats(monitors["decoder"]),
            "guide_gradient": _stats(monitors["guide"]),
            "steps_with_diverged_chains": int((monitors["diverged"] > 0).sum()),
            "step_size": float(params["local_step_size"]),
            "damping": float(params["local_damping"]),
            "momentum_scale_min": float(scales.min()),
            "momentum_scale_median": float(np.median(scales)),
        }
        log.append(record)
        print(f"epoch {epoch}: validation {record['validation']:.3f}, decoder gradient "
              f"max/median {record['decoder_gradient']['max'] / record['decoder_gradient']['median']:.2f}, "
              f"diverged steps {record['steps_with_diverged_chains']}", flush=True)
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
