"""UHAGuide's mass matrices on correlated posteriors (the twenty-first hunt, docs/zoo.md).

For each model of :mod:`benchmarks.correlated_models`, each Adam learning rate and each
``dense_mass`` option (``False``: the diagonal mass; ``True``: the dense one; ``auto``:
the default's choice), ``UHAGuide(model, dense_mass=...)`` at its defaults (K = 32, the
warm start) is set up and trained by ``svi.run``; reported: 1 / λ_min of the start q's
correlation matrix (full-rank q), the start q's ELBO and half the variance of its log
weights (KL(q‖p) to second order), UHA's bound at the setup's parameters and after
training (the mean of 2 000 log weights and its standard error), PSIS k̂, and the draws'
moments against NUTS (max |Δmean| / NUTS sd, mean |log sd ratio|; right when ≤ 0.5 and
≤ 0.3, as in :mod:`benchmarks.zoo`), with the guide's warnings.

NUTS references (dense mass, target 0.9, 2 chains × 1 500 warm-up + 2 000 draws) are
cached in ``benchmarks/reference/correlated_nuts/<model>.npz``.

    python -m benchmarks.correlated_hunt                      # every model, 1e-3 and 1e-2
    python -m benchmarks.correlated_hunt --models logistic_raw --dense False True
    python -m benchmarks.correlated_hunt --smoke
    python -m benchmarks.correlated_hunt --models redundant40 collinear40_90 random_walk50 \
        --dense auto --base-dist auto cholesky --name correlated_wide   # d > 32
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import jax
import numpy as np
import optax
from numpyro.diagnostics import summary
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO

import numpyro_uha.guide as uha_guide
from benchmarks.common import write_results
from benchmarks.correlated_models import MODELS, WIDE
from benchmarks.zoo import fit_checks, moment_errors
from numpyro_uha import UHAGuide
from numpyro_uha.evaluation import log_z_from_weights, psis_khat

REFERENCE_DIR = Path(__file__).parent / "reference" / "correlated_nuts"
DENSE = {"auto": "auto", "False": False, "True": True}
NUM_DRAWS = 2000


def reference(name, model, args):
    path = REFERENCE_DIR / f"{name}.npz"
    if not path.exists():
        mcmc = MCMC(NUTS(model, dense_mass=True, target_accept_prob=0.9), num_warmup=1500,
                    num_samples=2000, num_chains=2, chain_method="sequential", progress_bar=False)
        mcmc.run(jax.random.PRNGKey(0), *args)
        stats = summary(mcmc.get_samples(group_by_chain=True))
        info = {
            "max_rhat": max(float(np.max(v["r_hat"])) for v in stats.values()),
            "min_ess": min(float(np.min(v["n_eff"])) for v in stats.values()),
            "divergences": int(mcmc.get_extra_fields()["diverging"].sum()),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **{k: np.asarray(v) for k, v in mcmc.get_samples().items()},
                 _info=json.dumps(info))
    data = dict(np.load(path))
    info = json.loads(str(data.pop("_info")))
    return {k: (v.mean(0), v.std(0), None) for k, v in data.items()}, info


def _start_condition(guide):
    scale = np.asarray(guide.initial_q[1])
    if scale.ndim != 2:
        return None
    return float(uha_guide._inverse_smallest_correlation(scale, host=True))


def _bound(guide, key, params, args):
    weighted = guide.sample_posterior_with_log_weights(key, params, *args, sample_shape=(NUM_DRAWS,))
    lw = np.asarray(weighted.log_weights, np.float64).ravel()
    finite = lw[np.isfinite(lw)]
    est = log_z_from_weights(finite)
    return weighted, est.elbo, est.elbo_se, float(psis_khat(finite)), int(lw.size - finite.size)


ALL = {**MODELS, **WIDE}


def run_one(name, lr, dense, steps, moments, base_dist="auto"):
    model, args = ALL[name]
    rec = {"model": name, "lr": lr, "dense_mass": str(dense), "base_dist": base_dist, "steps": steps}
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        try:
            guide = UHAGuide(model, dense_mass=dense, base_dist=base_dist)
            svi = SVI(model, guide, optax.adam(lr), Trace_ELBO())
            state = svi.init(jax.random.PRNGKey(0), *args)
            params0 = svi.get_params(state)
            rec["dense"] = any(k.endswith("mass_factor") for k in params0)
            rec["inv_lambda_min"] = _start_condition(guide)
            lw0 = np.asarray(guide.warm_start_result.log_weights, np.float64)
            rec["start_elbo"] = float(guide._start_elbo[0])
            rec["start_half_var"] = float(0.5 * np.var(lw0, ddof=1))
            _, rec["setup_bound"], rec["setup_se"], _, _ = _bound(guide, jax.random.PRNGKey(5), params0, args)
            result = svi.run(jax.random.PRNGKey(0), steps, *args, progress_bar=False, init_state=state)
            weighted, rec["bound"], rec["se"], rec["khat"], rec["nonfinite"] = _bound(
                guide, jax.random.PRNGKey(7), result.params, args)
            draws = {k: np.asarray(v) for k, v in weighted.samples.items() if k in moments}
            rec.update(moment_errors(draws, moments))
        except Exception as err:  # noqa: BLE001 -- every failure is a result
            rec["error"] = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
            rec["right"] = False
    rec["warnings"] = sorted({w.category.__name__ for w in log
                              if w.category.__name__.startswith("UHA") or w.category is RuntimeWarning})
    rec["fit_checks"] = fit_checks(log)
    rec["seconds"] = round(time.perf_counter() - start, 1)
    jax.clear_caches()
    return rec


def _f(x, digits=2):
    return "–" if x is None else f"{x:.{digits}f}"


def render(payload) -> str:
    lines = [
        "| model | lr | base_dist | dense_mass | mass | 1/λ_min | start q ELBO (½ var) | UHA at setup | trained | k̂ "
        "| max \\|Δmean\\|/sd | \\|log sd ratio\\| | right | warnings |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["runs"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['lr']:g} | {r.get('base_dist', 'auto')} | {r['dense_mass']} "
                         f"| error: {r['error']} |" + " |" * 9)
            continue
        lines.append(
            f"| {r['model']} | {r['lr']:g} | {r.get('base_dist', 'auto')} | {r['dense_mass']} "
            f"| {'dense' if r['dense'] else 'diagonal'} "
            f"| {_f(r['inv_lambda_min'], 1)} | {r['start_elbo']:.3f} ({r['start_half_var']:.3f}) "
            f"| {r['setup_bound']:.3f} ± {r['setup_se']:.3f} | {r['bound']:.3f} ± {r['se']:.3f} "
            f"| {r['khat']:.2f} | {_f(r.get('max_mean_err'))} | {_f(r.get('mean_log_sd_ratio'))} "
            f"| {'yes' if r.get('right') else 'no'} | {', '.join(r['fit_checks']) or '–'} |"
        )
    lines += ["", "NUTS references (dense mass, 2 × 2 000 draws): "
              + "; ".join(f"{k}: R-hat {v['max_rhat']:.3f}, ESS {v['min_ess']:.0f}, "
                          f"{v['divergences']} divergences" for k, v in payload["references"].items())]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(ALL),
                        help="default: the twelve of MODELS; WIDE's three (d > 32) by name")
    parser.add_argument("--lrs", nargs="+", type=float, default=[1e-3, 1e-2])
    parser.add_argument("--dense", nargs="+", default=["False", "True"], choices=list(DENSE))
    parser.add_argument("--base-dist", nargs="+", default=["auto"], choices=["auto", "cholesky", "diagonal"])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--name", default="correlated_hunt")
    parser.add_argument("--smoke", action="store_true",
                        help="one model, one rate, 20 steps: checks the plumbing only")
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.lrs, args.dense, args.steps = ["exp_decay"], [1e-2], ["auto"], 20
    payload = {"steps": args.steps, "references": {}, "runs": []}
    for name in args.models:
        moments, payload["references"][name] = reference(name, *ALL[name])
        for lr in args.lrs:
            for base_dist in args.base_dist:
                for dense in args.dense:
                    if DENSE[dense] is True and base_dist == "diagonal":
                        continue
                    rec = run_one(name, lr, DENSE[dense], args.steps, moments, base_dist)
                    print(json.dumps(rec), flush=True)
                    payload["runs"].append(rec)
        write_results(args.name, payload, render(payload))
    print(write_results(args.name, payload, render(payload)))


if __name__ == "__main__":
    main()
