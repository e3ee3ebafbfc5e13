"""Many data points on one device: ``svi.init`` and ``to_inference_data`` as N grows.

A logistic regression (d = 20 coefficients and an intercept, standard normal priors,
N rows of standard normal covariates, float32) is set up in a **fresh Python process**
per cell (imports excluded, JAX's first-use costs included):

- ``svi.init`` seconds of ``AutoNormal``, of ``UHAGuide(K=8)`` with its default warm
  start, and of ``UHAGuide(K=8, warm_start_steps=200)`` (the user's knob for a cheaper
  start), with the untrained guide's bound beside UHA's (``log_z``'s ELBO of 256 draws,
  ± its standard error): what the cheaper warm start costs in nats;
- ``svi.init`` of a Gaussian random walk of ``--walk-steps`` steps observed with noise
  (many latent coordinates: the warm start's model-free steps on large arrays);
- ``to_inference_data`` of 1000 draws with the pointwise log-likelihood at
  ``--idata-n`` rows: its seconds and the process's peak resident memory above the peak
  before the call (``ru_maxrss``), beside the size of the log-likelihood it returns.

``--baseline REF`` runs the same cells for ``UHAGuide`` at git revision REF (a temporary
worktree, the same Python environment), interleaved with the current tree's.

Each tree's compiled model-free steps are put on disk by an untimed process first (as a
user's earlier session would); ``svi.init`` is the median of ``--repeats`` processes.

Run: ``python -m benchmarks.large_data [--sizes 10000 100000] [--idata-n 300000]
[--repeats 3] [--walk-steps 20000] [--baseline REF] [--name large_data] [--smoke]``. Writes
``benchmarks/results/<name>.{json,md}``; ``--smoke``: tiny sizes, one repeat.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import run_child, write_results

CHILD = r"""
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
import numpy as np, jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist, optax
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from numpyro_uha import UHAGuide
from numpyro_uha.evaluation import log_z, to_inference_data

n, guide_name, stage, kind = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
rng = np.random.default_rng(0)
if kind == "logistic":
    d = 20
    x = rng.normal(size=(n, d))
    w_true = rng.normal(size=d) * 0.5
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-x @ w_true))).astype(np.float32)
    x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y)

    def model(x, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=x @ w + b), obs=y)
else:  # a Gaussian random walk of n steps observed with noise: n + 1 latent coordinates
    x = None
    y = jnp.asarray(np.cumsum(rng.normal(size=n)) + rng.normal(size=n), jnp.float32)

    def model(x, y=None):
        s = numpyro.sample("s", dist.HalfNormal(1.0))
        walk = numpyro.sample("walk", dist.GaussianRandomWalk(s, num_steps=y.shape[0]))
        numpyro.sample("y", dist.Normal(walk, 1.0), obs=y)

if guide_name == "AutoNormal":
    guide = AutoNormal(model)
elif guide_name == "UHAGuide":
    guide = UHAGuide(model, K=8, progress_bar=False)
else:
    steps = int(guide_name.split("=")[1])  # "UHAGuide:warm_start_steps=200"
    guide = UHAGuide(model, K=8, warm_start_steps=steps, progress_bar=False)
svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
start = time.perf_counter()
state = svi.init(jax.random.PRNGKey(0), x, y)
jax.block_until_ready(state)
out = {"init_s": time.perf_counter() - start}
params = svi.get_params(state)
if stage == "init" and guide_name != "AutoNormal":
    estimate = log_z(guide, jax.random.PRNGKey(1), params, x, y, num_draws=256)
    out.update(elbo=float(estimate.elbo), elbo_se=float(estimate.elbo_se))
if stage == "idata":
    jax.block_until_ready(guide.sample_posterior(jax.random.PRNGKey(2), params, x, y, sample_shape=(1000,)))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    idata = to_inference_data(guide, jax.random.PRNGKey(3), params, x, y, num_samples=1000)
    out["idata_s"] = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out["peak_above_gib"] = (after - before) / 2**20
    out["log_lik_gib"] = idata.log_likelihood["y"].nbytes / 2**30
print("RESULT " + json.dumps(out))
"""


GUIDES = ("AutoNormal", "UHAGuide", "UHAGuide warm_start_steps=200")


def _median(results):
    """The median ``svi.init`` seconds of the runs, the bound of the first (the same seed:
    every run's bound is the same)."""
    return {**results[0], "init_s": float(np.median([r["init_s"] for r in results])),
            "init_s_runs": [r["init_s"] for r in results]}


def _cell(n, guide, stage, tree=None, kind="logistic"):
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")])
    return run_child(CHILD, str(n), guide, stage, kind, env=env, cwd=tree)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--idata-n", type=int, default=300_000)
    parser.add_argument("--baseline", default=None, help="a git revision to compare with")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--walk-steps", type=int, default=20_000, help="0: no random walk")
    parser.add_argument("--name", default="large_data")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, one repeat: checks that the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.idata_n, args.repeats, args.walk_steps = [500], 500, 1, 50
    root = Path(__file__).resolve().parents[1]
    baseline_tree = None
    if args.baseline:
        baseline_tree = tempfile.mkdtemp(prefix="numpyro-uha-baseline-")
        subprocess.run(
            ["git", "-C", str(root), "worktree", "add", "--detach", baseline_tree, args.baseline],
            check=True, capture_output=True,
        )
    try:
        # each tree's compiled model-free steps on disk first (numpyro_uha.core.executables):
        # a user's later processes find them there
        _cell(min(args.sizes), "UHAGuide", "init")
        if baseline_tree:
            _cell(min(args.sizes), "UHAGuide", "init", baseline_tree)
        rows = {}
        for n in args.sizes:
            runs = {guide: [] for guide in GUIDES}
            if baseline_tree:
                runs["UHAGuide at baseline"] = []
            for _ in range(args.repeats):  # interleaved: every cell once per round
                for guide in GUIDES:
                    runs[guide].append(_cell(n, guide.replace(" ", ":"), "init"))
                if baseline_tree:
                    runs["UHAGuide at baseline"].append(_cell(n, "UHAGuide", "init", baseline_tree))
            rows[n] = {guide: _median(results) for guide, results in runs.items()}
            print(n, rows[n], flush=True)
        walk = {}
        if args.walk_steps:
            walk["AutoNormal"] = _cell(args.walk_steps, "AutoNormal", "init", kind="walk")
            walk["UHAGuide"] = _cell(args.walk_steps, "UHAGuide", "init", kind="walk")
            if baseline_tree:
                walk["UHAGuide at baseline"] = _cell(
                    args.walk_steps, "UHAGuide", "init", baseline_tree, kind="walk"
                )
            print("walk", walk, flush=True)
        idata = {"current": _cell(args.idata_n, "UHAGuide:warm_start_steps=50", "idata")}
        print("idata", idata, flush=True)
        if baseline_tree:
            idata["baseline"] = _cell(args.idata_n, "UHAGuide:warm_start_steps=50", "idata", baseline_tree)
            print("idata baseline", idata["baseline"], flush=True)
    finally:
        if baseline_tree:
            subprocess.run(
                ["git", "-C", str(root), "worktree", "remove", "--force", baseline_tree],
                check=False, capture_output=True,
            )
            shutil.rmtree(baseline_tree, ignore_errors=True)
    lines = [
        f"## `svi.init` (seconds: median of {args.repeats} fresh processes, interleaved) and "
        "the untrained UHA bound",
        "",
        "| N | guide | `svi.init` s | untrained ELBO ± se |",
        "|---|---|---|---|",
    ]
    for n, cells in rows.items():
        for guide, r in cells.items():
            elbo = f"{r['elbo']:.3f} ± {r['elbo_se']:.3f}" if "elbo" in r else "–"
            lines.append(f"| {n} | {guide} | {r['init_s']:.1f} | {elbo} |")
    if walk:
        lines += [
            "",
            f"## `svi.init` of a Gaussian random walk of {args.walk_steps} steps (one fresh "
            "process each; d = steps + 1 latent coordinates, a diagonal q)",
            "",
            "| guide | `svi.init` s | untrained ELBO ± se |",
            "|---|---|---|",
        ]
        for guide, r in walk.items():
            elbo = f"{r['elbo']:.3f} ± {r['elbo_se']:.3f}" if "elbo" in r else "–"
            lines.append(f"| {guide} | {r['init_s']:.1f} | {elbo} |")
    lines += [
        "",
        f"## `to_inference_data`, 1000 draws, N = {args.idata_n} (log-likelihood included)",
        "",
        "| tree | seconds | peak memory above the previous peak (GiB) | log-likelihood (GiB) |",
        "|---|---|---|---|",
    ]
    for tree, r in idata.items():
        lines.append(
            f"| {tree} | {r['idata_s']:.1f} | {r['peak_above_gib']:.2f} | {r['log_lik_gib']:.2f} |"
        )
    payload = {"sizes": args.sizes, "idata_n": args.idata_n, "baseline": args.baseline,
               "repeats": args.repeats, "walk_steps": args.walk_steps, "walk": walk,
               "init": {str(n): cells for n, cells in rows.items()}, "idata": idata}
    path = write_results(args.name, payload, "\n".join(lines))
    print(path.read_text())


if __name__ == "__main__":
    main()
