"""Start-up time: ``svi.init`` of ``UHAGuide`` beside ``AutoNormal`` (issue 16, item 1).

What a user waits for before the first SVI step: each (model, guide) pair's ``svi.init``
is timed in a **fresh Python process** (imports excluded, JAX's first-use costs
included, no compilation cache: ``UHAGuide``'s own on-disk cache of its compiled
model-free steps, ``numpyro_uha.core.executables``, starts empty in each), ``--repeats``
times, median reported; and ``UHAGuide`` in a *later* process, its cache filled by an
earlier (untimed) process that set up the same model. Guides:
``AutoNormal``; ``UHAGuide(K=32)`` with its built-in warm start (the default); and
``UHAGuide(K=32, warm_start_steps=0)``. The warm start's quality is reported beside its
cost: the ELBO of the q UHA starts from (mean log weight of 256 draws, with its standard
error), the bound UHA training must improve on.

``--baseline REF`` also times ``UHAGuide`` at git revision REF (a temporary worktree of
this repository, the same Python environment), each repeat interleaved with the current
tree's, so the two columns share the machine's state.

``--warm-start-device NAME`` also times ``UHAGuide(K=32, warm_start_device=NAME)`` (e.g.
``cpu`` on a GPU machine: the warm start's model-free steps on the host CPU), interleaved
with the others, in a column of its own with its start ELBO.

``--quick-gpu-options`` also times ``UHAGuide(K=32)`` with its model-free steps compiled
on a GPU at ``xla_backend_optimization_level=0`` and ``xla_gpu_autotune_level=0`` (patched
in the child process: an experiment for a GPU machine, not a package option). A variant
that fails is reported as such in its column.

``--persistent-cache`` times instead what a user who enables JAX's persistent
compilation cache waits in a *later* process: for each model and guide (``AutoNormal``,
``UHAGuide``), one process fills a fresh cache directory, then ``--repeats`` processes
are timed with it (every program cached: ``jax_persistent_cache_min_compile_time_secs``
0).

``--warm-process`` times instead ``svi.init`` in a process that has set up the same
model before (an ``AutoNormal`` fit, as in a notebook): JAX has compiled the model's
operations once, so ``AutoNormal``'s ``svi.init`` takes a fraction of a second and
``UHAGuide``'s is the compilation and running of its own programs; a second
``UHAGuide`` (a new instance, the same model) is timed after it.

Run: ``python -m benchmarks.startup [--models ...] [--repeats 3] [--baseline REF]
[--persistent-cache | --warm-process]``.
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
    "UHAGuide(warm_start_device)": lambda: UHAGuide(m.model, K=32, warm_start_device=sys.argv[3]),
    "UHAGuide(quick GPU options)": lambda: UHAGuide(m.model, K=32),
}[guide_name]()
if guide_name == "UHAGuide(quick GPU options)":
    # an experiment, not a package option: the model-free steps compiled on a GPU with
    # XLA's lowest backend optimization and no autotuning, as on a CPU
    import numpyro_uha.core.warm_start as ws
    _package_options = ws.quick_compiler_options
    ws.quick_compiler_options = lambda platform=None: {
        "xla_backend_optimization_level": 0, "xla_gpu_autotune_level": 0,
    } if (platform or jax.default_backend()) == "gpu" else _package_options(platform)
svi = SVI(m.model, guide, optax.adam(1e-3), Trace_ELBO())
start = time.perf_counter()
state = svi.init(jax.random.PRNGKey(0), *m.args)
jax.block_until_ready(state)
seconds = time.perf_counter() - start
start_elbo = getattr(guide, "_start_elbo", None)
start = time.perf_counter()
jax.block_until_ready(jax.jit(svi.update)(state, *m.args))  # compiled, as svi.run does
first_step = time.perf_counter() - start
print("RESULT", json.dumps({"seconds": seconds, "start_elbo": start_elbo, "first_step_s": first_step}))
"""


_WARM_CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
import jax, optax
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from numpyro_uha import UHAGuide
from benchmarks.zoo_models import ZOO
m = ZOO[sys.argv[1]]

def init_seconds(guide):
    svi = SVI(m.model, guide, optax.adam(1e-3), Trace_ELBO())
    start = time.perf_counter()
    jax.block_until_ready(svi.init(jax.random.PRNGKey(0), *m.args))
    return time.perf_counter() - start

first = init_seconds(AutoNormal(m.model))  # the model's operations compiled here
out = {"first_autonormal_s": first, "AutoNormal": init_seconds(AutoNormal(m.model))}
out["UHAGuide"] = init_seconds(UHAGuide(m.model, K=32))
out["UHAGuide, again"] = init_seconds(UHAGuide(m.model, K=32))
print("RESULT", json.dumps(out))
"""


DEVICE_GUIDE = "UHAGuide(warm_start_device)"
QUICK_GUIDE = "UHAGuide(quick GPU options)"


def _extras(args):
    """The optional guides' keys and column labels."""
    out = []
    if args.warm_start_device:
        out.append((DEVICE_GUIDE, f"UHAGuide, warm_start_device={args.warm_start_device!r}"))
    if args.quick_gpu_options:
        out.append((QUICK_GUIDE, "UHAGuide, steps at XLA's quick GPU options"))
    return out


def time_init(
    model: str, guide: str, tree: str | None = None, cache: str | None = None,
    device: str | None = None, executables: str | None = None,
) -> dict:
    """One fresh process's ``svi.init``. ``executables``: the folder of UHAGuide's cache
    of compiled model-free steps (``NUMPYRO_UHA_CACHE_DIR``; default: a new empty one,
    as on a machine that never ran UHAGuide)."""
    if executables is None:
        with tempfile.TemporaryDirectory() as empty:
            return time_init(model, guide, tree, cache, device, executables=empty)
    env = child_env(executables, cache, tree)
    return run_child(_CHILD, model, guide, *([device] if device else []), env=env, cwd=tree)


def child_env(executables: str, cache: str | None = None, tree: str | None = None,
              **extra: str) -> dict:
    """The environment of a timed fresh process: this one's with ``extra``, UHAGuide's
    cache of compiled steps in ``executables`` (``NUMPYRO_UHA_CACHE_DIR``), JAX's
    persistent cache only where ``cache`` names one (then every program in it), and
    ``tree``'s package and benchmarks first on the path where given."""
    env = dict(os.environ, **extra)
    env["NUMPYRO_UHA_CACHE_DIR"] = executables
    if cache is None:  # no JAX persistent cache unless asked for (--persistent-cache)
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
    else:  # JAX's persistent compilation cache, every program in it
        env.update(
            JAX_COMPILATION_CACHE_DIR=cache,
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        )
    if tree is not None:  # the package and benchmarks of another checkout
        env["PYTHONPATH"] = tree + os.pathsep + env.get("PYTHONPATH", "")
    return env


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--name", default="startup")
    parser.add_argument("--smoke", action="store_true",
                        help="one model, one repeat, every optional column")
    parser.add_argument("--baseline", default=None, help="git revision to time UHAGuide at too")
    parser.add_argument(
        "--warm-start-device", default=None,
        help="also time UHAGuide(warm_start_device=THIS), e.g. cpu on a GPU machine",
    )
    parser.add_argument(
        "--quick-gpu-options", action="store_true",
        help="also time UHAGuide with its model-free steps compiled at "
        "xla_backend_optimization_level=0, xla_gpu_autotune_level=0 on a GPU (an experiment)",
    )
    parser.add_argument(
        "--persistent-cache", action="store_true",
        help="time later processes with JAX's persistent compilation cache filled",
    )
    parser.add_argument(
        "--warm-process", action="store_true",
        help="time svi.init in a process that set up the same model before",
    )
    args = parser.parse_args(argv)
    if args.smoke:  # every column, the optional ones too
        args.models, args.repeats = ["hierarchical_logistic"], 1
        args.warm_start_device, args.quick_gpu_options = args.warm_start_device or "cpu", True
    if args.persistent_cache:
        return _main_cached(args)
    if args.warm_process:
        return _main_warm(args)

    with tempfile.TemporaryDirectory() as tmp:
        baseline_tree = None
        root = Path(__file__).resolve().parents[1]
        if args.baseline:
            baseline_tree = str(Path(tmp) / "baseline")
            subprocess.run(
                ["git", "-C", str(root), "worktree", "add", "--detach", baseline_tree, args.baseline],
                check=True, capture_output=True,
            )
        try:
            rows = _time_all(args, baseline_tree)
        finally:
            if baseline_tree:
                subprocess.run(
                    ["git", "-C", str(root), "worktree", "remove", "--force", baseline_tree],
                    check=False, capture_output=True,
                )

    # the optional columns, each a guide's median and start ELBO
    columns = ([(BASELINE, f"UHAGuide at {args.baseline}")] if args.baseline else []) + _extras(args)
    table = (
        f"`svi.init` in a fresh process (imports excluded, JAX's first-use compilation "
        f"included), median of {args.repeats}; K = 32. Target (issue 16): UHAGuide at most "
        "2 s more than AutoNormal. Start ELBO: the ELBO of the q UHA starts from "
        "(256 draws, ± SE). First step: the first call of `jax.jit(svi.update)` after it "
        "(compiling the training step, as `svi.run` does), not part of the target, for what "
        "a user waits in all. UHAGuide's compiled model-free steps are cached on disk "
        "(`numpyro_uha.core.executables`): every UHAGuide column starts with an empty cache "
        "(a machine that never ran UHAGuide), except *later process*: the cache filled by "
        "an earlier process that set up the same model (untimed).\n\n"
        "| model | AutoNormal (s) | UHAGuide (s) | UHAGuide − AutoNormal (s) | "
        "UHAGuide, later process (s) | later − AutoNormal (s) | "
        "UHAGuide, warm_start_steps=0 (s) | start ELBO | first step: AutoNormal / "
        "UHAGuide (s) |"
        + "".join(f" {label} (s) | its start ELBO |" for _, label in columns)
        + "\n|" + "---|" * (9 + 2 * len(columns)) + "\n"
    )
    for model, r in rows.items():
        an, uha, cold = (r[g]["median_s"] for g in GUIDES)
        later = r[LATER]["median_s"]
        elbo_cell = _elbo_cell(r["UHAGuide"]["start_elbo"])
        steps = " / ".join(f"{r[g]['first_step_median_s']:.2f}" for g in GUIDES[:2])
        table += (
            f"| {model} | {an:.2f} | {uha:.2f} | {uha - an:+.2f} | {later:.2f} | "
            f"{later - an:+.2f} | {cold:.2f} | {elbo_cell} | {steps} |"
        )
        for guide, _ in columns:
            extra = r[guide]
            cell = (
                f"{extra['median_s']:.2f} | {_elbo_cell(extra['start_elbo'])}"
                if "error" not in extra else f"failed: {extra['error']} | —"
            )
            table += f" {cell} |"
        table += "\n"
    differ = [m for m, r in rows.items() if not r["later_start_elbo_equal"]]
    table += (
        "\nStart ELBO of every later process equal to the first process's: "
        + (f"**no** on {', '.join(differ)}" if differ else "yes, on every model") + ".\n"
    )
    result = {"rows": rows, "repeats": args.repeats, "baseline": args.baseline,
              "warm_start_device": args.warm_start_device,
              "quick_gpu_options": args.quick_gpu_options}
    path = write_results(args.name, result, table)
    print(path.read_text())


BASELINE = "UHAGuide (baseline)"
LATER = "UHAGuide (later process)"


def _main_cached(args):
    rows = {}
    for model in args.models:
        rows[model] = {}
        for guide in GUIDES[:2]:
            with tempfile.TemporaryDirectory() as cache:
                fill = time_init(model, guide, cache=cache)
                runs = [time_init(model, guide, cache=cache) for _ in range(args.repeats)]
            rows[model][guide] = {"filling_s": fill["seconds"], **_summary(runs)}
            print(model, guide, rows[model][guide], flush=True)
    table = (
        "`svi.init` in a later process with JAX's persistent compilation cache filled by an "
        f"earlier one (every program cached), median of {args.repeats}; K = 32. The first "
        "process (filling the cache) in parentheses. First step: the first call of "
        "`jax.jit(svi.update)`.\n\n"
        "| model | AutoNormal (s) | UHAGuide (s) | UHAGuide − AutoNormal (s) | first step: "
        "AutoNormal / UHAGuide (s) | start ELBO |\n|---|---|---|---|---|---|\n"
    )
    for model, r in rows.items():
        an, uha = r["AutoNormal"], r["UHAGuide"]
        table += (
            f"| {model} | {an['median_s']:.2f} ({an['filling_s']:.2f}) | {uha['median_s']:.2f} "
            f"({uha['filling_s']:.2f}) | {uha['median_s'] - an['median_s']:+.2f} | "
            f"{an['first_step_median_s']:.2f} / {uha['first_step_median_s']:.2f} | "
            f"{_elbo_cell(uha['start_elbo'])} |\n"
        )
    result = {"rows": rows, "repeats": args.repeats, "persistent_cache": True}
    path = write_results(args.name, result, table)
    print(path.read_text())


def _main_warm(args):
    rows = {}
    for model in args.models:
        runs = [run_child(_WARM_CHILD, model) for _ in range(args.repeats)]
        rows[model] = {
            key: {"seconds": [r[key] for r in runs],
                  "median_s": float(np.median([r[key] for r in runs]))}
            for key in runs[0]
        }
        print(model, rows[model], flush=True)
    table = (
        "`svi.init` in a process that has set up the same model before (an `AutoNormal` "
        "`svi.init`, whose time is in the first column), median of "
        f"{args.repeats} processes; K = 32. Then `AutoNormal` again, `UHAGuide`, and a "
        "second `UHAGuide` (a new instance of the same guide).\n\n"
        "| model | first AutoNormal (s) | AutoNormal (s) | UHAGuide (s) | UHAGuide − "
        "AutoNormal (s) | UHAGuide again (s) |\n|---|---|---|---|---|---|\n"
    )
    for model, r in rows.items():
        an, uha = r["AutoNormal"]["median_s"], r["UHAGuide"]["median_s"]
        table += (
            f"| {model} | {r['first_autonormal_s']['median_s']:.2f} | {an:.2f} | {uha:.2f} "
            f"| {uha - an:+.2f} | {r['UHAGuide, again']['median_s']:.2f} |\n"
        )
    path = write_results(args.name, {"rows": rows, "repeats": args.repeats,
                                     "warm_process": True}, table)
    print(path.read_text())


def _summary(results):
    """One guide's timed children: their times, medians and (first child's) start ELBO
    (an optional guide's failure: its error)."""
    failed = [r for r in results if "error" in r]
    if failed:
        return {"error": failed[0]["error"]}
    secs = [r["seconds"] for r in results]
    steps = [r["first_step_s"] for r in results]
    return {
        "seconds": secs, "median_s": float(np.median(secs)),
        "first_step_s": steps, "first_step_median_s": float(np.median(steps)),
        "start_elbo": results[0]["start_elbo"],
    }


def _elbo_cell(elbo):
    return f"{elbo[0]:.2f} ± {elbo[1]:.2f}" if elbo else "—"


def _time_all(args, baseline_tree):
    rows = {}
    for model in args.models:
        rows[model] = {}
        runs = {guide: [] for guide in GUIDES}
        if baseline_tree:
            runs[BASELINE] = []
        for guide, _ in _extras(args):
            runs[guide] = []
        runs[LATER] = []
        filled = tempfile.mkdtemp(prefix="numpyro-uha-executables-")
        time_init(model, "UHAGuide", executables=filled)  # an earlier process, untimed
        def add(column, result):
            # each process's result as it comes: a run cut short (a device's time limit)
            # still says what it measured
            runs[column].append(result)
            print("timed", model, column, result, flush=True)

        for _ in range(args.repeats):  # interleaved: every guide once per round
            for guide in GUIDES:
                add(guide, time_init(model, guide))
            add(LATER, time_init(model, "UHAGuide", executables=filled))
            if baseline_tree:
                add(BASELINE, time_init(model, "UHAGuide", baseline_tree))
            for guide, _ in _extras(args):
                try:  # an experiment: its failure is a cell of the table, not the run's end
                    add(guide, time_init(model, guide, device=args.warm_start_device))
                except RuntimeError as e:
                    add(guide, {"error": str(e).splitlines()[-1][:200]})
        shutil.rmtree(filled, ignore_errors=True)
        for guide, results in runs.items():
            rows[model][guide] = _summary(results)
            print(model, guide, rows[model][guide], flush=True)
        # the cache changes no result: the later processes start where the first did
        rows[model]["later_start_elbo_equal"] = all(
            r["start_elbo"] == runs["UHAGuide"][0]["start_elbo"] for r in runs[LATER]
        )
    return rows


if __name__ == "__main__":
    main()
