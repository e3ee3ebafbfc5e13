"""What XLA compiles for one SVI step: UHAGuide against NumPyro's AutoDAIS.

Timings on a shared CPU are noisy; the compiled program is not. For each guide this
reports XLA's cost analysis of the jitted ``svi.update`` (FLOPs, bytes accessed) and, for
every ``while`` loop of the optimized HLO (the annealing scans, forward and backward, and
the random-number loops), how many instructions and fused kernels its body has, and the
shapes of the matrix products in the program. Two steps with the same products and
similar kernel counts do the same work; a timing gap between them is then overhead or
noise, not arithmetic (``docs/benchmarks.md``, *Speed and memory*).

    python -m benchmarks.compiled_step                      # madelon, K = 32, 8 particles
    python -m benchmarks.compiled_step --dataset sonar
    python -m benchmarks.compiled_step --smoke
"""

from __future__ import annotations

import argparse
import collections
import re

import jax
import optax
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDAIS

from benchmarks.common import write_results, xla_cost
from numpyro_uha import UHAGuide
from numpyro_uha.datasets import load_logistic_regression, logistic_regression_model

_OP = re.compile(r"= \S+ ([a-z][\w\-]*)\(")


def _computations(hlo_text):
    """name -> instruction lines of every computation in an HLO module's text."""
    out = {}
    for block in hlo_text.split("\n\n"):
        lines = block.strip().split("\n")
        m = re.match(r"(?:ENTRY )?%?([\w.\-]+)", lines[0])
        if m:
            out[m.group(1)] = [line for line in lines[1:] if "=" in line]
    return out


def analyse(guide, X, y, num_particles):
    svi = SVI(logistic_regression_model, guide, optax.adam(1e-3), Trace_ELBO(num_particles=num_particles))
    state = svi.init(jax.random.PRNGKey(0), X, y)
    compiled = jax.jit(svi.update).lower(state, X, y).compile()
    cost = xla_cost(compiled)
    text = compiled.as_text()
    comps = _computations(text)
    loops = []
    for body in re.findall(r"while\(.*?body=%?([\w.\-]+)", text):
        ops = collections.Counter(m.group(1) for m in map(_OP.search, comps.get(body, [])) if m)
        loops.append({"instructions": sum(ops.values()), "fusions": ops.get("fusion", 0)})
    dots = sorted(re.findall(r"= (\w+\[[\d,]*\])\S* dot\(", text))
    return {
        "mflop": cost.get("flops", 0.0) / 1e6,
        "mbytes": cost.get("bytes accessed", 0.0) / 1e6,
        # The two largest loops are the annealing scans (of the forward and the backward
        # pass); the rest are the random-number loops.
        "scan_loops": sorted(loops, key=lambda d: -d["instructions"])[:2],
        "num_small_loops": max(len(loops) - 2, 0),
        "dots": dots,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="madelon")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--K", type=int, default=32)
    parser.add_argument("--num-particles", type=int, default=8)
    parser.add_argument("--name", default="compiled_step")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for the test suite)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.dataset, args.K, args.num_particles = "sonar", 2, 2
    X, y = load_logistic_regression(args.dataset, args.data_dir)
    guides = {
        "UHAGuide (default)": UHAGuide(logistic_regression_model, K=args.K, warm_start_steps=0),
        "UHAGuide (velocity Verlet)": UHAGuide(
            logistic_regression_model, K=args.K, warm_start_steps=0, integrator="velocity_verlet"
        ),
        "AutoDAIS": AutoDAIS(logistic_regression_model, K=args.K),
    }
    rows = []
    for label, guide in guides.items():
        r = {"guide": label, **analyse(guide, X, y, args.num_particles)}
        rows.append(r)
        print(label, r, flush=True)

    def scan(r, i):
        loops = r["scan_loops"]
        return f"{loops[i]['fusions']} / {loops[i]['instructions']}" if len(loops) > i else "-"

    table = (
        f"One jitted `svi.update` on {args.dataset} logistic regression, K = {args.K}, "
        f"{args.num_particles} particles (`Trace_ELBO`), compiled for this machine's CPU. The two "
        "largest `while` loops are the annealing scans (the forward pass's and the backward pass's; "
        "the larger first); kernels = fused kernels / instructions in the loop body.\n\n"
        "| guide | MFLOP | MB accessed | larger scan: kernels | smaller scan: kernels | other loops | "
        "matrix products |\n|---|---|---|---|---|---|---|\n"
    )
    for r in rows:
        dots = ", ".join(f"{n}× {shape}" for shape, n in collections.Counter(r["dots"]).items())
        table += (f"| {r['guide']} | {r['mflop']:.1f} | {r['mbytes']:.1f} | {scan(r, 0)} | {scan(r, 1)} | "
                  f"{r['num_small_loops']} | {dots} |\n")
    path = write_results(args.name, {"settings": vars(args), "rows": rows}, table)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
