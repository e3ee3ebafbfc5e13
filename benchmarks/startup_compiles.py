"""What ``svi.init`` compiles, and how long each compilation takes (issue 16, item 1).

``benchmarks.startup`` times ``svi.init`` whole; this lists its parts: every program JAX
traces, lowers and compiles during ``UHAGuide``'s ``svi.init`` (and ``AutoNormal``'s,
first, in the same process or not: ``--after-autonormal``), from JAX's own compile log
(``jax_log_compiles``: "Finished tracing + transforming", "Finished jaxpr to MLIR
module conversion", "Finished XLA compilation", each with its seconds), summed per
program and stage, largest first. One fresh process per guide (UHAGuide's cache of
compiled steps empty, no JAX persistent cache), so JAX's first-use costs land in the
first program each compiles.

``--quick-gpu-options``: UHAGuide twice, its quick programs (NumPyro's initial-point
search, the warm start's model-free steps) compiled at XLA's default GPU options and at
``warm_start.QUICK_GPU_OPTIONS`` (``NUMPYRO_UHA_QUICK_GPU_OPTIONS`` 0 and 1), each with
its start ELBO.

Run: ``python -m benchmarks.startup_compiles [--model hierarchical_logistic]
[--quick-gpu-options]``.
"""

from __future__ import annotations

import argparse
import tempfile

from benchmarks.common import run_child, write_results
from benchmarks.startup import child_env

_CHILD = r"""
import json, logging, re, sys, time, warnings
warnings.simplefilter("ignore")
import jax, optax
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from numpyro_uha import UHAGuide
from benchmarks.zoo_models import ZOO
m = ZOO[sys.argv[1]]
entries = []
pattern = re.compile(r"Finished (.*?) (?:of |for )?(\S+) in ([0-9.eE+-]+) ?sec")

class Collect(logging.Handler):
    def emit(self, record):
        hit = pattern.search(record.getMessage())
        if hit:
            entries.append([hit.group(1), hit.group(2), float(hit.group(3))])

logging.getLogger("jax").addHandler(Collect())
jax.config.update("jax_log_compiles", True)
out = {}
for name in sys.argv[2:]:
    guide = AutoNormal(m.model) if name == "AutoNormal" else UHAGuide(m.model, K=32)
    svi = SVI(m.model, guide, optax.adam(1e-3), Trace_ELBO())
    entries.clear()
    start = time.perf_counter()
    jax.block_until_ready(svi.init(jax.random.PRNGKey(0), *m.args))
    out[name] = {"seconds": time.perf_counter() - start, "entries": list(entries),
                 "start_elbo": getattr(guide, "_start_elbo", None)}
print("RESULT", json.dumps(out))
"""


def _fresh(model, *guides, **env):
    """One fresh process's runs, with an empty cache of UHAGuide's compiled steps (as
    on a machine that never ran UHAGuide) and no JAX persistent cache."""
    with tempfile.TemporaryDirectory() as empty:
        return run_child(_CHILD, model, *guides, env=child_env(empty, **env))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="hierarchical_logistic")
    parser.add_argument("--after-autonormal", action="store_true",
                        help="set up AutoNormal first in UHAGuide's process")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--quick-gpu-options", action="store_true",
                        help="also UHAGuide with NUMPYRO_UHA_QUICK_GPU_OPTIONS=1 (and the "
                             "first UHAGuide with it 0)")
    parser.add_argument("--name", default="startup_compiles")
    args = parser.parse_args(argv)
    runs = {"AutoNormal": _fresh(args.model, "AutoNormal")["AutoNormal"]}
    uha = ["AutoNormal", "UHAGuide"] if args.after_autonormal else ["UHAGuide"]
    if args.quick_gpu_options:
        for flag in ("0", "1"):
            runs[f"UHAGuide, NUMPYRO_UHA_QUICK_GPU_OPTIONS={flag}"] = _fresh(
                args.model, *uha, NUMPYRO_UHA_QUICK_GPU_OPTIONS=flag)["UHAGuide"]
    else:
        runs["UHAGuide"] = _fresh(args.model, *uha)["UHAGuide"]
    md = (
        f"`svi.init` on {args.model}, one fresh process per guide"
        + (" (UHAGuide's after AutoNormal's)" if args.after_autonormal else "")
        + ": each guide's seconds, and its programs' tracing, lowering and compilation "
        "from JAX's compile log (summed per program and stage, largest first; the "
        "stages overlap where one program's tracing traces another, so their sum can "
        "exceed the whole).\n\n"
    )
    for name, run in runs.items():
        total = {}
        for stage, program, seconds in run["entries"]:
            total[(stage, program)] = total.get((stage, program), 0.0) + seconds
        logged = sum(total.values())
        elbo = run.get("start_elbo")
        md += (f"**{name}**: `svi.init` {run['seconds']:.2f} s"
               + (f" (start ELBO {elbo[0]:.4f} ± {elbo[1]:.3f})" if elbo else "")
               + f", of which {logged:.2f} s "
               f"logged in {len(run['entries'])} entries\n\n| stage | program | s |\n|---|---|---|\n")
        for (stage, program), seconds in sorted(total.items(), key=lambda x: -x[1])[:args.top]:
            md += f"| {stage} | `{program}` | {seconds:.3f} |\n"
        md += "\n"
    path = write_results(args.name, {"runs": runs, "args": vars(args)}, md)
    print(path.read_text())


if __name__ == "__main__":
    main()
