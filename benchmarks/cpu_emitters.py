"""XLA's CPU fusion emitters against its older loop emitters, for a user's own programs.

The package compiles its quick CPU programs (the warm start's model-free steps, NumPyro's
compiled initial search) with ``xla_cpu_use_fusion_emitters=False``
(``numpyro_uha.core.warm_start.quick_compiler_options``); the training step is the user's
``jax.jit(svi.update)`` (or ``svi.run``'s), compiled with whatever ``XLA_FLAGS`` the user
set, which a library should not change. This measures what
``XLA_FLAGS=--xla_cpu_use_fusion_emitters=false`` changes there: for each model, in a
fresh process per setting (no compilation caches), ``UHAGuide(K=32)``'s ``svi.init``, the
first call of ``jax.jit(svi.update)`` (compiling the step) and the mean time of the next
``--steps`` steps, both settings timed the same way (jitted step, blocked on its loss),
and the loss after them (the same programs up to rounding: the losses agree).

    python -m benchmarks.cpu_emitters [--models ...] [--steps 300] [--repeats 1]
    python -m benchmarks.cpu_emitters --smoke
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from benchmarks.common import run_child, write_results

MODELS = ["hierarchical_logistic", "gp_rbf", "lkj_mvn"]
SETTINGS = {"fusion emitters (XLA's default)": "", "loop emitters": "--xla_cpu_use_fusion_emitters=false"}

_CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
import jax, optax
from numpyro.infer import SVI, Trace_ELBO
from benchmarks.zoo_models import ZOO
from numpyro_uha import UHAGuide

m, steps = ZOO[sys.argv[1]], int(sys.argv[2])
svi = SVI(m.model, UHAGuide(m.model, K=int(sys.argv[3])), optax.adam(1e-3), Trace_ELBO())
start = time.perf_counter()
state = svi.init(jax.random.PRNGKey(0), *m.args)
jax.block_until_ready(state)
init_s = time.perf_counter() - start
update = jax.jit(svi.update)
start = time.perf_counter()
state, loss = update(state, *m.args)
jax.block_until_ready(loss)
first_s = time.perf_counter() - start
start = time.perf_counter()
for _ in range(steps):
    state, loss = update(state, *m.args)
jax.block_until_ready(loss)
step_ms = (time.perf_counter() - start) / steps * 1e3
print("RESULT", json.dumps({"init_s": init_s, "first_step_s": first_s, "step_ms": step_ms,
                            "loss": float(loss)}))
"""


def _child(model, flags, steps, K):
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR")}
    env["NUMPYRO_UHA_CACHE_DIR"] = ""  # the package's own executable cache off
    if flags:
        env["XLA_FLAGS"] = flags
    return run_child(_CHILD, model, str(steps), str(K), env=env)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--K", type=int, default=32)
    parser.add_argument("--name", default="cpu_emitters")
    parser.add_argument("--smoke", action="store_true", help="one model, K = 4, 5 steps")
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.steps, args.K, args.repeats = ["hierarchical_logistic"], 5, 4, 1
    results = {}
    for model in args.models:
        runs = {name: [] for name in SETTINGS}
        for _ in range(args.repeats):  # the settings interleaved, repeat by repeat
            for name, flags in SETTINGS.items():
                runs[name].append(_child(model, flags, args.steps, args.K))
                print(model, name, runs[name][-1], flush=True)
        results[model] = {
            name: {key: float(np.median([r[key] for r in rs])) for key in rs[0]}
            for name, rs in runs.items()
        }
    names = list(SETTINGS)
    lines = [
        f"`UHAGuide(K={args.K})` on CPU, each setting in a fresh process (no compilation "
        f"caches), median of {args.repeats}: `svi.init`, the first call of "
        f"`jax.jit(svi.update)` (compiling the step) and the mean of the next {args.steps} "
        "jitted steps. Loop emitters: `XLA_FLAGS=--xla_cpu_use_fusion_emitters=false`. "
        "The package's own quick programs use the loop emitters in both columns.",
        "",
        "| model | svi.init (s): fusion / loop | first step (s): fusion / loop | step (ms): "
        "fusion / loop | loss after: fusion / loop |",
        "|---|---|---|---|---|",
    ]
    for model, r in results.items():
        a, b = r[names[0]], r[names[1]]
        lines.append(
            f"| {model} | {a['init_s']:.2f} / {b['init_s']:.2f} | {a['first_step_s']:.2f} / "
            f"{b['first_step_s']:.2f} | {a['step_ms']:.2f} / {b['step_ms']:.2f} | "
            f"{a['loss']:.4f} / {b['loss']:.4f} |"
        )
    path = write_results(args.name, {"settings": SETTINGS, "steps": args.steps, "K": args.K,
                                     "repeats": args.repeats, "results": results},
                         "\n".join(lines))
    print(path.read_text())


if __name__ == "__main__":
    main()
