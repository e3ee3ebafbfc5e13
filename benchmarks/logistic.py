"""Inference tasks of the paper's Figure 1 and Section 5.3: Bayesian logistic regression
(sonar, ionosphere, australian, a1a, madelon) and the Inference Gym time series ported to
NumPyro (``brownian_motion``, d = 32; ``lorenz_bridge``, d = 90; see
:mod:`numpyro_uha.models` and ``benchmarks/inference_gym_ports.py`` for their check).

For each dataset, seed and K, in one run: plain VI, importance-weighted VI (IW), UHA
tuning only (ε, η), UHA tuning everything, Hamiltonian AIS with the paper's (ε, η) grid
search, and NumPyro's AutoDAIS — all started from the same plain-VI q, trained with the
same optimizer and number of steps — plus UHA trained at the largest K and extrapolated
(Appendix D) to larger K. Each is scored by its ELBO and IW log Z from ``--num-draws``
draws; the table reports mean ± standard deviation over seeds, and a plot in the
paper's style (ELBO against K) is written next to the results.

    python -m benchmarks.logistic --datasets sonar ionosphere --K 2 4 8 16 32 64 \
        --extrapolate 128 256 --seeds 0 1 2 3
    python -m benchmarks.logistic --datasets brownian_motion lorenz_bridge --name time_series
    python -m benchmarks.logistic --smoke
"""

from __future__ import annotations

import argparse
import json
import math
import time

import jax
import numpy as np
import jax.numpy as jnp
from numpyro.infer import MCMC, NUTS, RenyiELBO, Trace_ELBO
from numpyro.infer.autoguide import AutoDAIS, AutoDiagonalNormal
from numpyro.infer.initialization import init_to_uniform, init_to_value

from benchmarks.common import fit, model_logdensity, results_dir, summarize, write_results
from numpyro_uha import GROUPS, UHAGuide
from numpyro_uha.datasets import DATASETS, load_logistic_regression, logistic_regression_model
from numpyro_uha.models import brownian_motion_model, lorenz_bridge_model
from numpyro_uha.evaluation import extrapolate, guide_log_weights, hais_grid_search

#: UHA at K = 64 (ELBO, IW log Z) from the paper's first author's later public code,
#: and reference log Z from long SMC runs (issue 4), except for the Lorenz bridge.
ANCHORS = {
    "sonar": {"uha_k64": (-111.97, -108.71), "uha_k256": (-109.74, -108.41), "log_z": -108.38},
    "ionosphere": {"uha_k64": (-112.74, -111.58), "log_z": -111.60},
    "brownian_motion": {"uha_k64": (0.00, 1.08), "log_z": 1.15},
    # No published reference: the lower end of the bracket [−29.2, −27.4] of
    # `python -m benchmarks.reference_log_z` (NUTS + a Gaussian fitted to its draws).
    "lorenz_bridge": {"log_z": -29.2},
}

#: Task name -> callable(data_dir) returning (model, model_args).
TASKS = {
    **{name: (lambda data_dir, name=name: (logistic_regression_model, load_logistic_regression(name, data_dir)))
       for name in DATASETS},
    "brownian_motion": lambda data_dir: (brownian_motion_model, ()),
    "lorenz_bridge": lambda data_dir: (lorenz_bridge_model, ()),
}

METHODS = ("plain VI", "IW", "UHA (ε, η)", "UHA (all)", "HAIS (grid)", "AutoDAIS", "UHA (all, extrapolated)")


def score(log_w, K):
    return summarize(np.asarray(log_w, np.float64), K)


def vi_init_loc_fn(model, model_args, args, seed):
    """Where plain VI's loc starts: NumPyro's default (uniform(−2, 2) in unconstrained space)
    or, with ``--vi-init nuts``, the posterior median of a short NUTS run (1000 warm-up,
    1000 draws, one chain). The latter is an oracle start for targets whose plain VI gets
    stuck in a poor local basin (the Lorenz bridge: see ``benchmarks/reference_log_z.py``);
    every method still starts from the VI q trained from there."""
    if args.vi_init == "uniform":
        return init_to_uniform
    mcmc = MCMC(NUTS(model), num_warmup=1000, num_samples=1000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(2000 + seed), *model_args)
    return init_to_value(values={k: jnp.median(v, axis=0) for k, v in mcmc.get_samples().items()})


def non_finite_params(params):
    """Names of the parameters holding NaN or inf (a diverged training run)."""
    return sorted(k for k, v in params.items() if not bool(np.all(np.isfinite(np.asarray(v)))))


def run_dataset(name, args, rows):
    model, model_args = TASKS[name](args.data_dir)
    # The model's log density on the flat latent vector plain VI's q lives on, for HAIS.
    logdensity_fn = model_logdensity(model, model_args) if "HAIS (grid)" in args.methods else None
    for seed in args.seeds:
        key = jax.random.PRNGKey(1000 + seed)

        def add(method, K, result, seconds=None):
            if method not in args.methods:
                return
            row = {"dataset": name, "seed": seed, "method": method, "K": K, "train_seconds": seconds, **result}
            rows.append(row)
            print(f"{name} seed={seed} {method:24s} K={str(K):4s} ELBO {row['elbo']:10.3f} "
                  f"IW {row['iw_log_z']:10.3f}" + (f" ({seconds:.1f}s)" if seconds else ""), flush=True)

        def diverged(method, K, why):
            # A training run that blew up is recorded and listed in the table instead of
            # ending the whole run (AutoDAIS at Adam 3e-3 on the Lorenz bridge, for one).
            rows.append({"dataset": name, "seed": seed, "method": method, "K": K, "diverged": why})
            print(f"{name} seed={seed} {method:24s} K={K}: diverged ({why})", flush=True)

        vi_guide = AutoDiagonalNormal(model, init_loc_fn=vi_init_loc_fn(model, model_args, args, seed))
        vi_params, seconds = fit(model, vi_guide, Trace_ELBO(), args.vi_steps, 1e-2, seed, model_args)
        add("plain VI", None, score(guide_log_weights(key, model, vi_guide, vi_params, args.num_draws, *model_args), None), seconds)
        vi_init = (vi_guide, vi_params)
        for K in args.K:
            if "IW" in args.methods:
                iw_guide = AutoDiagonalNormal(model)
                iw_params, seconds = fit(model, iw_guide, RenyiELBO(alpha=0.0, num_particles=K), args.steps,
                                         args.lr, seed, model_args, init_params=vi_params)
                bad = non_finite_params(iw_params)
                if bad:
                    diverged("IW", K, f"non-finite parameter(s) {bad} after training")
                else:
                    n = max(args.num_draws // K, 100)
                    w = guide_log_weights(key, model, iw_guide, iw_params, n * K, *model_args).reshape(n, K)
                    iw_bound = jax.scipy.special.logsumexp(w, axis=1) - math.log(K)
                    add("IW", K, score(iw_bound, K), seconds)

            # "UHA (ε, η)" is the paper's basic UHA: its leapfrog (velocity Verlet), the
            # plain-VI q and standard momentum kept, only (ε, η) tuned (q is frozen: the
            # paper's Figure 1 method tunes ε and η from the VI q). "UHA (all)" is
            # UHAGuide's default.
            frozen_eh = tuple(g for g in GROUPS if g not in ("step_size", "damping"))
            for method, frozen, integrator in (
                ("UHA (ε, η)", frozen_eh, "velocity_verlet"), ("UHA (all)", (), "position_verlet"),
            ):
                if method not in args.methods:
                    continue
                guide = UHAGuide(
                    model, K=K, frozen=frozen, init_from=vi_init, integrator=integrator
                )
                try:
                    params, seconds = fit(model, guide, Trace_ELBO(), args.steps, args.lr, seed, model_args)
                except FloatingPointError as err:
                    # A non-finite weight during training: svi.run ends with the guide's
                    # UHADivergenceError (the parameters stopped at the last finite fit).
                    if "non-finite" not in str(err):
                        raise
                    diverged(method, K, "non-finite log weight during training")
                    continue
                draws = guide.sample_posterior_with_log_weights(key, params, *model_args, sample_shape=(args.num_draws,))
                add(method, K, score(draws.log_weights, K), seconds)
                if method == "UHA (all)" and K == max(args.K):
                    for K_big in args.extrapolate:
                        big_guide, big_params = extrapolate(guide, params, K_big)
                        big = big_guide.sample_posterior_with_log_weights(
                            key, big_params, *model_args, sample_shape=(args.num_draws,))
                        add("UHA (all, extrapolated)", K_big, score(big.log_weights, K_big))

            if "HAIS (grid)" in args.methods:
                start = time.perf_counter()
                grid = hais_grid_search(key, logdensity_fn, vi_params["auto_loc"], vi_params["auto_scale"], K,
                                        num_draws=args.grid_draws, num_pilot=args.grid_pilot)
                add("HAIS (grid)", K, {**score(grid.best.log_weights, K),
                                       "acceptance": grid.best.mean_acceptance}, time.perf_counter() - start)

            if "AutoDAIS" in args.methods:
                dais = AutoDAIS(model, K=K)
                dais_params, seconds = fit(model, dais, Trace_ELBO(), args.steps, args.lr, seed, model_args,
                                           init_params={"auto_z_0_loc": vi_params["auto_loc"],
                                                        "auto_z_0_scale": vi_params["auto_scale"]})
                bad = non_finite_params(dais_params)
                if bad:
                    diverged("AutoDAIS", K, f"non-finite parameter(s) {bad} after training")
                    continue
                add("AutoDAIS", K, score(guide_log_weights(key, model, dais, dais_params, args.num_draws,
                                                           *model_args), K), seconds)


def summarize_rows(rows):
    """(dataset, method, K) -> mean and std over seeds of ELBO and IW log Z."""
    groups = {}
    for r in rows:
        if "diverged" in r:
            continue
        groups.setdefault((r["dataset"], r["method"], r["K"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        elbo = np.array([r["elbo"] for r in rs])
        iw = np.array([r["iw_log_z"] for r in rs])
        out[key] = {
            "elbo_mean": float(elbo.mean()), "elbo_std": float(elbo.std(ddof=1)) if len(rs) > 1 else 0.0,
            "iw_mean": float(iw.mean()), "iw_std": float(iw.std(ddof=1)) if len(rs) > 1 else 0.0,
            "num_seeds": len(rs),
        }
    return out


def _mean_std(v):
    """"mean ± std" of the ELBO over seeds; the mean alone for a single seed."""
    if v["num_seeds"] < 2:
        return f"{v['elbo_mean']:.2f}"
    return f"{v['elbo_mean']:.2f} ± {v['elbo_std']:.2f}"


def plot(summary, datasets, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4), squeeze=False)
    for ax, name in zip(axes[0], datasets):
        for method in METHODS:
            pts = sorted((k[2], v) for k, v in summary.items() if k[0] == name and k[1] == method and k[2] is not None)
            if not pts:
                continue
            ks = [p[0] for p in pts]
            ax.errorbar(ks, [p[1]["elbo_mean"] for p in pts], yerr=[p[1]["elbo_std"] for p in pts],
                        marker="o", ms=3, capsize=2, label=method)
        vi = summary.get((name, "plain VI", None))
        if vi:
            ax.axhline(vi["elbo_mean"], color="gray", ls=":", label="plain VI")
        anchor = ANCHORS.get(name, {})
        ax.set_xscale("log", base=2)
        ax.set_xlabel("K (transitions)")
        ax.set_ylabel("ELBO")
        ax.set_title(name)
        elbos = [v["elbo_mean"] for k, v in summary.items() if k[0] == name and k[1] != "plain VI"]
        if "log_z" in anchor and elbos and max(elbos) > anchor["log_z"] - 100:
            ax.axhline(anchor["log_z"], color="black", ls="--", lw=0.8, label="reference log Z")
            gap = anchor["log_z"] - max(elbos)  # how far the best method is from log Z
            ax.set_ylim(max(min(elbos) - 2, anchor["log_z"] - max(20, 5 * gap)), anchor["log_z"] + 1)
        elif "log_z" in anchor:
            # Every method is far below the reference (a local basin): say so instead of
            # squeezing the curves into a sliver.
            ax.text(0.02, 0.98, f"reference log Z ≈ {anchor['log_z']:.1f} (off the chart: "
                    f"{anchor['log_z'] - max(elbos):.0f} nats above the best ELBO)", transform=ax.transAxes,
                    va="top", fontsize=7)
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--datasets", nargs="+", default=["sonar", "ionosphere"], choices=sorted(TASKS),
                        metavar="TASK", help=f"any of {sorted(TASKS)}")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--K", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    parser.add_argument("--extrapolate", type=int, nargs="*", default=[128, 256])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--vi-steps", type=int, default=5000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--vi-init", choices=["uniform", "nuts"], default="uniform",
                        help="where plain VI starts: NumPyro's default, or a short NUTS run's "
                             "posterior median (an oracle start for multimodal targets)")
    parser.add_argument("--num-draws", type=int, default=5000)
    parser.add_argument("--grid-draws", type=int, default=1000)
    parser.add_argument("--grid-pilot", type=int, default=256)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    parser.add_argument("--name", default="logistic")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS), metavar="METHOD",
                        help=f"methods to run (default: all of {list(METHODS)}); plain VI always trains, as "
                             "every method starts from it, but is only reported if listed")
    parser.add_argument("--append", action="store_true",
                        help="merge with the rows of an existing results/<name>.json (rows of the same "
                             "dataset, seed, method and K are replaced); the table lists every command")
    parser.add_argument("--replot", action="store_true",
                        help="only redraw results/<name>.png from results/<name>.json (no runs)")
    args = parser.parse_args(argv)
    if args.replot:
        rows = json.loads((results_dir() / f"{args.name}.json").read_text())["rows"]
        path = results_dir() / f"{args.name}.png"
        plot(summarize_rows(rows), list(dict.fromkeys(r["dataset"] for r in rows)), path)
        print(f"wrote {path}")
        return
    if args.smoke:
        args.datasets, args.K, args.extrapolate, args.seeds = ["sonar"], [2], [4], [0]
        args.steps = args.vi_steps = 10
        args.num_draws, args.grid_draws, args.grid_pilot = 200, 50, 16

    rows = []
    for name in args.datasets:
        run_dataset(name, args, rows)
    previous_runs = []
    old_path = results_dir() / f"{args.name}.json"
    if args.append and old_path.is_file():
        old = json.loads(old_path.read_text())
        new_keys = {(r["dataset"], r["seed"], r["method"], r["K"]) for r in rows}
        kept = [r for r in old["rows"] if (r["dataset"], r["seed"], r["method"], r["K"]) not in new_keys]
        previous_runs = old.get("previous_runs", []) + [{"environment": old["environment"], "settings": old["settings"]}]
        rows = kept + rows
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    summary = summarize_rows(rows)
    plot_path = results_dir() / f"{args.name}.png"
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    plot(summary, datasets, plot_path)

    table = (
        f"All methods start from the same plain-VI q (AutoDiagonalNormal, Adam 1e-2, {args.vi_steps} "
        "steps" + (", its loc started at the posterior median of a short NUTS run (`--vi-init nuts`)"
                   if args.vi_init == "nuts" else "") + f") and train with `optax.adam({args.lr})` for {args.steps} steps; scores from "
        f"{args.num_draws} draws; mean ± std over seeds (the mean alone for one seed; n seeds per cell: a subscript where fewer than the "
        "most). IW trains q on the K-sample "
        "bound (RenyiELBO, alpha = 0) and reports that bound as its ELBO. HAIS: linear schedule, "
        "standard momentum, (ε, η) by the paper's grid search. UHA (ε, η): the paper's leapfrog "
        "(velocity Verlet), only ε, η tuned; UHA (all): `UHAGuide` defaults (position Verlet, "
        "every group tuned). K counts transitions (paper's K "
        f"= ours + 1). Plot: `{plot_path.name}`.\n\n"
    )
    if previous_runs:
        table += "Rows merged from earlier runs of this script (`--append`): " + "; ".join(
            f"`{p['environment']['command']}` (commit {p['environment'].get('git_commit')}, {p['environment'].get('date')})"
            for p in previous_runs) + ".\n\n"
    diverged = [r for r in rows if "diverged" in r]
    if diverged:
        table += "Training diverged (no score): " + ", ".join(
            f"{r['dataset']} {r['method']} K={r['K']} seed {r['seed']} ({r['diverged']})" for r in diverged) + ".\n\n"
    max_n = max(v["num_seeds"] for v in summary.values())
    for name in datasets:
        ks = sorted({k[2] for k in summary if k[0] == name and k[2] is not None})
        table += f"**{name}** — ELBO (IW log Z)\n\n| method | " + " | ".join(f"K={k}" for k in ks) + " |\n"
        table += "|---|" + "---|" * len(ks) + "\n"
        vi = summary.get((name, "plain VI", None))
        for method in METHODS[1:]:
            cells = []
            for k in ks:
                v = summary.get((name, method, k))
                n = f"<sub>n={v['num_seeds']}</sub>" if v and v["num_seeds"] < max_n else ""
                cells.append(f"{_mean_std(v)}{n} ({v['iw_mean']:.2f})" if v else "-")
            if any(c != "-" for c in cells):
                table += f"| {method} | " + " | ".join(cells) + " |\n"
        if vi:
            table += f"\nplain VI: ELBO {_mean_std(vi)}, IW log Z {vi['iw_mean']:.2f}.  "
        anchor = ANCHORS.get(name)
        if anchor:
            table += f"\nAnchors: {anchor}.\n\n"
        else:
            table += "\n\n"
    path = write_results(
        args.name,
        {"settings": vars(args), "previous_runs": previous_runs, "rows": rows,
         "summary": [{"dataset": k[0], "method": k[1], "K": k[2], **v} for k, v in summary.items()]},
        table,
    )
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
