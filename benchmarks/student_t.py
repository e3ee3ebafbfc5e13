"""Factorized Student-t target (paper Section 5.1, Table 1): log Z = 0 exactly.

One run trains and scores, for every d:

* UHAGuide under two protocols —
  ``paper``: q from plain VI, Adam 1e-3, tune q, ε and η only (every other group frozen),
  with the paper's leapfrog (velocity Verlet);
  ``default``: ``UHAGuide(model, K=K)`` as a user gets it, everything tuned;
* NumPyro's ``AutoDAIS`` at the same K, started from the same plain-VI q;
* importance-weighted VI (IW): q trained on the K'-sample IW bound (``RenyiELBO(alpha=0)``)
  from the plain-VI q, scored by that bound;
* plain VI itself (AutoDiagonalNormal).

Each ELBO is estimated from enough draws that its standard error is below
``--rel-se`` × |ELBO| (capped by ``--max-draws``; the achieved SE is reported).

    python -m benchmarks.student_t --dims 20 200 500 --K 1 4 16 64 128 --iw-K 128 1024
    python -m benchmarks.student_t --smoke
"""

from __future__ import annotations

import argparse
import math
import time

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import SVI, RenyiELBO, Trace_ELBO
from numpyro.infer.autoguide import AutoDAIS, AutoDiagonalNormal

from benchmarks.common import summarize, write_results
from numpyro_uha import GROUPS, UHAGuide
from numpyro_uha.evaluation import guide_log_weights

#: The paper's reported UHA ELBOs (Table 1), by d then K (paper's K = ours + 1).
PAPER_UHA = {
    20: {1: -0.82, 4: -0.55, 16: -0.36, 64: -0.19, 128: -0.14},
    200: {1: -8.1, 4: -5.5, 16: -3.5, 64: -1.9, 128: -1.4},
    500: {1: -20.5, 4: -13.9, 16: -9.0, 64: -5.2, 128: -3.8},
}
PAPER_IW = {20: {128: -0.14, 1024: -0.088}, 200: {128: -3.7, 1024: -2.9}, 500: {128: -12.0, 1024: -10.4}}
PAPER_TUNED = ("q", "step_size", "damping")


def student_t_model(dim: int):
    def model():
        numpyro.sample("z", dist.StudentT(3.0, 0.0, 1.0).expand([dim]).to_event(1))

    return model


def adaptive_log_weights(draw, rel_se, min_draws, max_draws, seed):
    """Draw log weights in growing batches until SE < rel_se·|mean| (or max_draws)."""
    chunks, n, i = [], 0, 0
    batch = min_draws
    while True:
        chunk = np.asarray(draw(jax.random.PRNGKey(10_000 * seed + i), batch), np.float64)
        chunks.append(chunk)
        n += batch
        i += 1
        log_w = np.concatenate(chunks)
        se = log_w.std(ddof=1) / math.sqrt(n)
        if se < rel_se * abs(log_w.mean()) or n >= max_draws:
            return log_w
        batch = min(max_draws - n, n)


def fit(model, guide, steps, lr, seed, init_params=None):
    svi = SVI(model, guide, optax.adam(lr), Trace_ELBO())
    start = time.perf_counter()
    result = svi.run(jax.random.PRNGKey(seed), steps, progress_bar=False, init_params=init_params)
    jax.block_until_ready(result.params)
    return result.params, time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dims", type=int, nargs="+", default=[20, 200, 500])
    parser.add_argument("--K", type=int, nargs="+", default=[1, 4, 16, 64, 128])
    parser.add_argument("--iw-K", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--protocols", nargs="+", default=["paper", "default"])
    parser.add_argument("--no-dais", action="store_true")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--vi-steps", type=int, default=5000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--rel-se", type=float, default=0.01)
    parser.add_argument("--min-draws", type=int, default=10_000)
    parser.add_argument("--max-draws", type=int, default=320_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    parser.add_argument("--name", default="student_t")
    args = parser.parse_args(argv)
    if args.smoke:
        args.dims, args.K, args.iw_K = [3], [2], [4]
        args.steps, args.vi_steps, args.min_draws, args.max_draws = 20, 20, 200, 400

    rows = []

    def record(**row):
        rows.append(row)
        paper = row.get("paper")
        print(
            f"d={row['dim']:4d} {row['method']:22s} K={str(row['K']):5s} ELBO {row['elbo']:9.4f} "
            f"± {row['elbo_se']:.4f} (n={row['num_draws']})"
            + (f"  paper {paper}" if paper is not None else "")
            + (f"  ({row['train_seconds']:.1f}s)" if row.get("train_seconds") else ""),
            flush=True,
        )

    for dim in args.dims:
        model = student_t_model(dim)
        # Plain VI: the paper's starting point and the IW proposal.
        vi_guide = AutoDiagonalNormal(model)
        vi_params, vi_seconds = fit(model, vi_guide, args.vi_steps, 1e-2, args.seed)
        vi_loc, vi_scale = vi_params["auto_loc"], vi_params["auto_scale"]

        def vi_draw(key, n):
            return guide_log_weights(key, model, vi_guide, vi_params, n)

        log_w = adaptive_log_weights(vi_draw, args.rel_se, args.min_draws, args.max_draws, args.seed)
        record(dim=dim, method="plain VI", K=None, train_seconds=vi_seconds,
               **summarize(log_w))

        for iw_k in args.iw_K:
            # Importance-weighted VI (the paper's IW): q trained on the IW bound with K'
            # samples (NumPyro's RenyiELBO with alpha = 0), started at plain VI.
            iw_guide = AutoDiagonalNormal(model)
            iw_svi = SVI(model, iw_guide, optax.adam(args.lr), RenyiELBO(alpha=0.0, num_particles=iw_k))
            start = time.perf_counter()
            iw_params = iw_svi.run(jax.random.PRNGKey(args.seed), args.steps, progress_bar=False,
                                   init_params=vi_params).params
            iw_seconds = time.perf_counter() - start

            def iw_draw(key, n, iw_k=iw_k, iw_guide=iw_guide, iw_params=iw_params):
                w = guide_log_weights(key, model, iw_guide, iw_params, n * iw_k, batch_size=65_536)
                w = w.reshape(n, iw_k)
                return jax.scipy.special.logsumexp(w, axis=1) - math.log(iw_k)

            log_w = adaptive_log_weights(iw_draw, args.rel_se, max(args.min_draws // iw_k, 50),
                                         max(4 * args.max_draws // iw_k, 100), args.seed)
            record(dim=dim, method="IW (IWVI-trained q)", K=iw_k, train_seconds=iw_seconds,
                   paper=PAPER_IW.get(dim, {}).get(iw_k), **summarize(log_w, iw_k))

        for K in args.K:
            for protocol in args.protocols:
                if protocol == "paper":
                    frozen = tuple(g for g in GROUPS if g not in PAPER_TUNED)
                    guide = UHAGuide(
                        model, K=K, frozen=frozen, init_from=(vi_guide, vi_params),
                        integrator="velocity_verlet",
                    )
                else:
                    guide = UHAGuide(model, K=K)
                params, seconds = fit(model, guide, args.steps, args.lr, args.seed)

                def draw(key, n, guide=guide, params=params):
                    return guide.sample_posterior_with_log_weights(key, params, sample_shape=(n,)).log_weights

                log_w = adaptive_log_weights(draw, args.rel_se, args.min_draws, args.max_draws, args.seed)
                record(dim=dim, method=f"UHAGuide ({protocol})", K=K, train_seconds=seconds,
                       paper=PAPER_UHA.get(dim, {}).get(K),
                       **summarize(log_w, K))
            if not args.no_dais:
                guide = AutoDAIS(model, K=K)
                init = {"auto_z_0_loc": vi_loc, "auto_z_0_scale": vi_scale}
                params, seconds = fit(model, guide, args.steps, args.lr, args.seed, init)

                def dais_draw(key, n, guide=guide, params=params):
                    return guide_log_weights(key, model, guide, params, n)

                log_w = adaptive_log_weights(dais_draw, args.rel_se, args.min_draws, args.max_draws, args.seed)
                record(dim=dim, method="AutoDAIS (plain-VI q)", K=K, train_seconds=seconds,
                       **summarize(log_w, K))

    # Markdown: one table per d, methods as rows, K as columns.
    table = (
        f"Protocols: `paper` = q from plain VI (AutoDiagonalNormal, Adam 1e-2, {args.vi_steps} steps), "
        f"then tune q, ε, η only, with the paper's leapfrog (velocity Verlet); `default` = `UHAGuide(model, K=K)`, everything tuned. Both "
        f"`SVI(..., optax.adam({args.lr}), Trace_ELBO())`, {args.steps} steps, seed {args.seed}. "
        "AutoDAIS starts from the same plain-VI q; IW trains q on the K'-sample IW bound "
        "(RenyiELBO, alpha = 0) from the plain-VI q, same optimizer and steps. ELBO ± standard error from enough draws for "
        f"se < {args.rel_se}·|ELBO| (at most {args.max_draws}). True log Z = 0. Our K counts "
        "transitions; the paper's K is ours + 1, so its K = 4, 16, 64, 128 columns sit next to "
        "our K = 4, 16, 64, 128 (one gradient fewer for us) and its K = 1 next to ours.\n\n"
    )
    for dim in args.dims:
        sub = [r for r in rows if r["dim"] == dim]
        ks = sorted({r["K"] for r in sub if r["K"] is not None and not r["method"].startswith("IW")})
        table += f"**d = {dim}**\n\n| method | " + " | ".join(f"K={k}" for k in ks) + " |\n"
        table += "|---|" + "---|" * len(ks) + "\n"
        methods = [m for m in dict.fromkeys(r["method"] for r in sub) if not m.startswith(("IW", "plain"))]
        for m in methods:
            cells = []
            for k in ks:
                hit = [r for r in sub if r["method"] == m and r["K"] == k]
                cells.append(f"{hit[0]['elbo']:.3f} ± {hit[0]['elbo_se']:.3f}" if hit else "-")
            table += f"| {m} | " + " | ".join(cells) + " |\n"
        paper = PAPER_UHA.get(dim, {})
        if paper:
            table += "| paper's UHA | " + " | ".join(str(paper.get(k, "-")) for k in ks) + " |\n"
        for r in sub:
            if r["method"].startswith(("IW", "plain")):
                label = r["method"] + (f", K={r['K']}" if r["K"] else "")
                extra = f" (paper {r['paper']})" if r.get("paper") is not None else ""
                table += f"\n{label}: {r['elbo']:.3f} ± {r['elbo_se']:.3f}{extra}  "
        table += "\n\n"
    path = write_results(args.name, {"settings": vars(args), "rows": rows}, table)
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
