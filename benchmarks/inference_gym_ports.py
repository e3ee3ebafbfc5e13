"""Check the NumPyro ports of the Inference Gym targets against ground truth.

Runs NumPyro's NUTS on :func:`numpyro_uha.models.brownian_motion_model` and
:func:`numpyro_uha.models.lorenz_bridge_model` and compares every posterior mean with a
reference mean, in units of the combined Monte Carlo standard error
sqrt(se_nuts² + se_ref²), and every posterior standard deviation by its relative error. A
correct port gives z scores that look like draws from N(0, 1) (max |z| over d elements
around 2–3.5); a wrong one gives |z| in the tens.

References: for the Lorenz bridge, the Gym's ground truth (recorded by
``benchmarks/inference_gym_reference.py``). For Brownian motion, the *exact* posterior
moments by quadrature (:func:`numpyro_uha.models.brownian_motion_reference`, se_ref = 0);
the Gym's shipped ground truth for this target is also scored, and disagrees with both the
exact values and NUTS (see the table), although the port's log density equals the Gym's at
every test point (``tests/test_models.py``): it does not match the Gym's own checked-in
observations.

    python -m benchmarks.inference_gym_ports
    python -m benchmarks.inference_gym_ports --smoke
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import numpy as np
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC, NUTS

from benchmarks.common import write_results
from numpyro_uha.models import brownian_motion_model, brownian_motion_reference, lorenz_bridge_model

REFERENCE = Path(__file__).parent / "reference" / "inference_gym.json"
TARGETS = {"brownian_motion": brownian_motion_model, "lorenz_bridge": lorenz_bridge_model}


def load_reference():
    return json.loads(REFERENCE.read_text())


def exact_as_reference(exact):
    """:func:`brownian_motion_reference`'s output in the Gym reference's layout (se = 0)."""
    zeros = {k: np.zeros_like(np.asarray(v, np.float64)) for k, v in exact["mean"].items()}
    return {"mean": exact["mean"], "std": exact["std"], "mean_se": zeros}


def score(samples, ref):
    z_all, std_rel, rows = [], [], []
    for site, ref_mean in ref["mean"].items():
        draws = np.asarray(samples[site], np.float64)  # (chains, draws, ...)
        ref_mean = np.asarray(ref_mean, np.float64)
        ref_std = np.asarray(ref["std"][site], np.float64)
        ref_se = np.asarray(ref["mean_se"][site], np.float64)
        flat = draws.reshape(draws.shape[:2] + (-1,))
        mean = flat.mean((0, 1)).reshape(ref_mean.shape)
        std = flat.std((0, 1)).reshape(ref_mean.shape)
        ess = np.asarray(effective_sample_size(flat)).reshape(ref_mean.shape)
        se = std / np.sqrt(ess)
        z = (mean - ref_mean) / np.sqrt(se**2 + ref_se**2)
        rel = (std - ref_std) / ref_std
        z_all.append(z.ravel())
        std_rel.append(rel.ravel())
        rows.append({"site": site, "num_elements": int(z.size), "max_abs_z": float(np.abs(z).max()),
                     "max_abs_std_rel_error": float(np.abs(rel).max()), "min_ess": float(ess.min())})
    z_all, std_rel = np.concatenate(z_all), np.concatenate(std_rel)
    return {
        "d": int(z_all.size),
        "max_abs_z": float(np.abs(z_all).max()), "rms_z": float(np.sqrt(np.mean(z_all**2))),
        "frac_abs_z_gt_3": float(np.mean(np.abs(z_all) > 3)),
        "median_abs_std_rel_error": float(np.median(np.abs(std_rel))),
        "max_abs_std_rel_error": float(np.abs(std_rel).max()),
        "sites": rows,
    }


def check_target(name, args, gym_ref, exact):
    mcmc = MCMC(NUTS(TARGETS[name], target_accept_prob=0.9), num_warmup=args.warmup,
                num_samples=args.samples, num_chains=args.chains, chain_method="sequential",
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(args.seed))
    samples = mcmc.get_samples(group_by_chain=True)
    divergences = int(np.asarray(mcmc.get_extra_fields()["diverging"]).sum())
    out = []
    refs = [("Inference Gym ground truth", gym_ref)]
    if name == "brownian_motion":
        refs.insert(0, ("exact (quadrature)", exact_as_reference(exact)))
    for label, ref in refs:
        out.append({"target": name, "gym_name": gym_ref["gym_name"], "reference": label,
                    "num_divergences": divergences, **score(samples, ref)})
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--name", default="inference_gym_ports")
    args = parser.parse_args(argv)
    if args.smoke:
        args.warmup, args.samples, args.chains = 50, 50, 1
    gym = load_reference()
    exact = brownian_motion_reference()
    results = []
    for name in args.targets:
        for r in check_target(name, args, gym[name], exact):
            results.append(r)
            print(f"{name} vs {r['reference']}: d={r['d']} max|z|={r['max_abs_z']:.2f} rms z={r['rms_z']:.2f} "
                  f"median |std rel err|={r['median_abs_std_rel_error']:.3f}", flush=True)
    table = (
        f"NumPyro NUTS on the ports ({args.chains} chains × {args.samples} draws after {args.warmup} warm-up, "
        f"seed {args.seed}) against the Inference Gym's ground truth ({gym['source']}) and, "
        "for Brownian motion, the exact posterior by quadrature (`numpyro_uha.models.brownian_motion_reference`, "
        f"log Z = {exact['log_z']:.4f}). "
        "z = (NUTS mean − reference mean) / sqrt(se_NUTS² + se_ref²) per element; a correct port has "
        "rms z ≈ 1 and max |z| ≈ 2–3.5 over d elements.\n\n"
        "| target | Gym target | reference | d | max abs z | rms z | share abs z > 3 | median / max abs rel. error of std | divergences |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    for r in results:
        table += (f"| {r['target']} | {r['gym_name']} | {r['reference']} | {r['d']} | {r['max_abs_z']:.2f} | {r['rms_z']:.2f} | "
                  f"{r['frac_abs_z_gt_3']:.3f} | {r['median_abs_std_rel_error']:.3f} / "
                  f"{r['max_abs_std_rel_error']:.3f} | {r['num_divergences']} |\n")
    path = write_results(args.name, {"settings": vars(args), "results": results}, table)
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
