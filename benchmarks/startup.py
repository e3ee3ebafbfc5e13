"""Start-up time: ``svi.init`` of ``UHAGuide`` beside ``AutoNormal`` (issue 16, item 1).

What a user waits for before the first SVI step: each (model, guide) pair's ``svi.init``
is timed in a **fresh Python process** (imports excluded, JAX's first-use costs
included, no compilation cache), ``--repeats`` times, median reported. Guides:
``AutoNormal``; ``UHAGuide(K=32)`` with its built-in warm start (the default); and
``UHAGuide(K=32, warm_start_steps=0)``. The warm start's quality is reported beside its
cost: the ELBO of the q UHA starts from (mean log weight of 256 draws, with its standard
error), the bound UHA training must improve on.

Run: ``python -m benchmarks.startup [--models ...] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import numpy as np

from benchmarks.common import write_results

MODELS = ["hierarchical_logistic", "gp_rbf", "lkj_mvn"]
GUIDES = ["AutoNormal", "UHAGuide", "UHAGuide(warm_start_steps=0)"]

_CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
import jax, optax
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from numpyro_uha import UHAGuide
from benchmarks.zoo_models import ZOO
name, guide_name = sys.argv[1], sys.argv[2]
m = ZOO[name]
guide = {
    "AutoNormal": lambda: AutoNormal(m.model),
    "UHAGuide": lambda: UHAGuide(m.model, K=32),
    "UHAGuide(warm_start_steps=0)": lambda: UHAGuide(m.model, K=32, warm_start_steps=0),
}[guide_name]()
svi = SVI(m.model, guide, optax.adam(1e-3), Trace_ELBO())
start = time.perf_counter()
state = svi.init(jax.random.PRNGKey(0), *m.args)
jax.block_until_ready(state)
seconds = time.perf_counter() - start
start_elbo = getattr(guide, "_start_elbo", None)
print("RESULT", json.dumps({"seconds": seconds, "start_elbo": start_elbo}))
"""


def time_init(model: str, guide: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, model, guide], capture_output=True, text=True, check=False,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{model} / {guide} failed:\n{out.stderr[-3000:]}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--name", default="startup")
    parser.add_argument("--smoke", action="store_true", help="one model, one repeat")
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.repeats = ["hierarchical_logistic"], 1

    rows = {}
    for model in args.models:
        rows[model] = {}
        for guide in GUIDES:
            runs = [time_init(model, guide) for _ in range(args.repeats)]
            secs = [r["seconds"] for r in runs]
            rows[model][guide] = {
                "seconds": secs, "median_s": float(np.median(secs)),
                "start_elbo": runs[0]["start_elbo"],
            }
            print(model, guide, rows[model][guide], flush=True)

    table = (
        f"`svi.init` in a fresh process (imports excluded, JAX's first-use compilation "
        f"included), median of {args.repeats}; K = 32. Target (issue 16): UHAGuide at most "
        "2 s more than AutoNormal. Start ELBO: the ELBO of the q UHA starts from "
        "(256 draws, ± SE).\n\n"
        "| model | AutoNormal (s) | UHAGuide (s) | UHAGuide − AutoNormal (s) | "
        "UHAGuide, warm_start_steps=0 (s) | start ELBO |\n|---|---|---|---|---|---|\n"
    )
    for model, r in rows.items():
        an, uha, cold = (r[g]["median_s"] for g in GUIDES)
        elbo = r["UHAGuide"]["start_elbo"]
        elbo_cell = f"{elbo[0]:.2f} ± {elbo[1]:.2f}" if elbo else "—"
        table += f"| {model} | {an:.2f} | {uha:.2f} | {uha - an:+.2f} | {cold:.2f} | {elbo_cell} |\n"
    path = write_results(args.name, {"rows": rows, "repeats": args.repeats}, table)
    print(path.read_text())


if __name__ == "__main__":
    main()
