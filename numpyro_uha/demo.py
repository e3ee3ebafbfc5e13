"""Demo: plain VI versus UHA on a target whose log Z is known exactly.

The embedded default model is the paper's factorized Student-t (3 degrees of freedom,
location 0, scale 1) in ``--dim`` dimensions. It is a normalized density, so log Z = 0
and every lower bound can be read as its gap to the truth.

    python -m numpyro_uha.demo                 # d = 20, K = 32
    python -m numpyro_uha.demo --dim 100 --K 64
"""

from __future__ import annotations

import argparse
import time

import jax
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDiagonalNormal

from numpyro_uha import UHAGuide
from numpyro_uha.evaluation import guide_log_weights, log_z_from_weights

TRUE_LOG_Z = 0.0


def student_t_model(dim: int):
    """Factorized Student-t(3, 0, 1) in ``dim`` dimensions: log Z = 0."""

    def model():
        numpyro.sample("z", dist.StudentT(3.0, 0.0, 1.0).expand([dim]).to_event(1))

    return model


def _fit(model, guide, steps, learning_rate, seed, progress_bar):
    svi = SVI(model, guide, optax.adam(learning_rate), Trace_ELBO())
    start = time.perf_counter()
    result = svi.run(jax.random.PRNGKey(seed), steps, progress_bar=progress_bar)
    jax.block_until_ready(result.params)
    return result.params, time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=20, help="dimension d of the Student-t target")
    parser.add_argument("--K", type=int, default=32, help="UHA annealing transitions")
    parser.add_argument("--vi-steps", type=int, default=5000)
    parser.add_argument("--uha-steps", type=int, default=3000)
    parser.add_argument("--num-draws", type=int, default=10_000, help="draws for the estimates")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress-bar", action="store_true")
    args = parser.parse_args(argv)
    progress = not args.no_progress_bar

    model = student_t_model(args.dim)
    print(f"Target: factorized Student-t(3), d = {args.dim}; true log Z = {TRUE_LOG_Z}")

    print(f"\nPlain VI: AutoDiagonalNormal, Adam(5e-3), {args.vi_steps} steps")
    vi_guide = AutoDiagonalNormal(model)
    vi_params, vi_time = _fit(model, vi_guide, args.vi_steps, 5e-3, args.seed, progress)

    print(f"\nUHA: UHAGuide(model, K={args.K}), Adam(1e-3), {args.uha_steps} steps")
    uha_guide = UHAGuide(model, K=args.K)
    uha_params, uha_time = _fit(model, uha_guide, args.uha_steps, 1e-3, args.seed, progress)

    key = jax.random.PRNGKey(args.seed + 1)
    estimates = {
        "plain VI": log_z_from_weights(guide_log_weights(key, model, vi_guide, vi_params, args.num_draws)),
        f"UHA (K={args.K})": log_z_from_weights(
            uha_guide.sample_posterior_with_log_weights(
                key, uha_params, sample_shape=(args.num_draws,), nonfinite="keep"
            ).log_weights,
            args.K,
        ),
    }
    times = {"plain VI": vi_time, f"UHA (K={args.K})": uha_time}

    print(f"\nEstimates from {args.num_draws} draws each (true log Z = {TRUE_LOG_Z}):")
    print(f"{'method':<12} {'ELBO ± se':>20} {'IW log Z ± se':>20} {'ESS':>9} {'fit s':>7}")
    for name, est in estimates.items():
        print(
            f"{name:<12} {est.elbo:>11.4f} ± {est.elbo_se:<6.4f} {est.iw:>11.4f} ± "
            f"{est.iw_se:<6.4f} {est.ess:>9.1f} {times[name]:>7.1f}"
        )
    gain = estimates[f"UHA (K={args.K})"].elbo - estimates["plain VI"].elbo
    print(f"\nUHA closes {gain:.3f} nats of plain VI's {TRUE_LOG_Z - estimates['plain VI'].elbo:.3f}-nat gap.")
    return estimates


if __name__ == "__main__":
    main()
