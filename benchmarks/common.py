"""Shared benchmark plumbing: summaries of log weights, result writing and fresh-process runs."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import jax
import numpy as np
import optax
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import UHAGuide
from numpyro_uha.evaluation import log_z_from_weights

RESULTS_DIR = Path(__file__).parent / "results"


def results_dir() -> Path:
    """Where results go: ``$NUMPYRO_UHA_RESULTS_DIR`` if set (the smoke tests use a
    temporary directory), else ``benchmarks/results``."""
    return Path(os.environ.get("NUMPYRO_UHA_RESULTS_DIR") or RESULTS_DIR)


def fit(model, guide, loss, steps, lr, seed, model_args, init_params=None):
    """``steps`` of SVI with ``optax.adam(lr)``: (params, seconds)."""
    svi = SVI(model, guide, optax.adam(lr), loss)
    start = time.perf_counter()
    result = svi.run(jax.random.PRNGKey(seed), steps, *model_args, progress_bar=False, init_params=init_params)
    jax.block_until_ready(result.params)
    return result.params, time.perf_counter() - start


def probe_guide(model, model_args):
    """``(guide, params)``: an initialized, untrained UHAGuide, to read the model's flat
    latent layout (``guide.latent_dim``) and log density from."""
    probe = UHAGuide(model, K=1, warm_start_steps=0)
    svi = SVI(model, probe, optax.adam(1e-3), Trace_ELBO())
    return probe, svi.get_params(svi.init(jax.random.PRNGKey(0), *model_args))


def model_logdensity(model, model_args):
    """z ↦ log p̄(z), the model's log joint on the flat unconstrained latent vector (the
    layout every AutoContinuous guide uses), from a probe UHAGuide's initialization."""
    probe, params = probe_guide(model, model_args)
    return probe.get_logdensity_fn(params, *model_args)


def minibatch_bound(model, guide, params, model_args, num_batches: int, first_seed: int):
    """The full-data bound at ``params`` of a model with a subsampled plate: −loss of
    ``Trace_ELBO`` on ``num_batches`` fresh minibatches (keys ``first_seed``,
    ``first_seed + 1``, ...), as ``(mean, standard error)``. Jitted once: run eagerly,
    NumPyro's subsampling compiles a fresh scan at every call."""
    loss = jax.jit(lambda key, p: Trace_ELBO().loss(key, p, model, guide, *model_args))
    bounds = -np.asarray([
        float(loss(jax.random.PRNGKey(first_seed + k), params)) for k in range(num_batches)
    ])
    return float(bounds.mean()), float(bounds.std(ddof=1) / np.sqrt(num_batches))


def median_time(fn, repeats, *args) -> float:
    """Median wall-clock seconds of ``fn(*args)`` (waited for) over ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def xla_cost(compiled) -> dict:
    """XLA's cost analysis of a compiled program (``flops``, ``bytes accessed``, ...);
    older jax returns one dict per device program, of which the first is taken."""
    cost = compiled.cost_analysis()
    return cost[0] if isinstance(cost, (list, tuple)) else cost


def summarize(log_weights, num_transitions=None):
    est = log_z_from_weights(log_weights, num_transitions)
    return {
        "elbo": est.elbo,
        "elbo_se": est.elbo_se,
        "iw_log_z": est.iw,
        "iw_log_z_se": est.iw_se,
        "ess": est.ess,
        "num_draws": est.num_draws,
    }


def _command_line() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    entry = ["-m", spec.name] if spec is not None else sys.argv[:1]
    return shlex.join(["python", *entry, *sys.argv[1:]])


def _git_commit():
    try:
        return subprocess.run(
            ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, check=False,
            cwd=Path(__file__).parent,
        ).stdout.strip() or None
    except OSError:
        return None


#: The commit and time when the benchmark process started (this module is imported before
#: any run): the code that ran, even if the working tree changes before the results are
#: written.
_START = {"git_commit": _git_commit(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}


def environment() -> dict:
    versions = {}
    for pkg in ("jax", "jaxlib", "numpyro", "optax", "arviz", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "command": _command_line(),
        "machine": f"{platform.machine()} {platform.processor() or ''} {jax.devices()[0].device_kind}".strip(),
        "cpu_count": __import__("os").cpu_count(),
        "python": platform.python_version(),
        "versions": versions,
        **_START,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def write_results(name: str, payload: dict, table_md: str) -> Path:
    out = results_dir()
    (out / name).parent.mkdir(parents=True, exist_ok=True)
    env = environment()
    payload = {"environment": env, **payload}
    (out / f"{name}.json").write_text(json.dumps(payload, indent=2))
    header = (
        f"# {name}\n\nCommand: `{env['command']}`  \nMachine: {env['machine']} "
        f"({env['cpu_count']} cores), Python {env['python']}  \nVersions: "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items())
        + f"  \nCommit: {env['git_commit']} (at start, {env['started']}); written {env['date']}\n\n"
    )
    path = out / f"{name}.md"
    path.write_text(header + table_md + "\n")
    return path


def run_child(script: str, *argv: str, env=None, cwd=None) -> dict:
    """Run ``script`` in a fresh Python process (``python -c script *argv``); the JSON of
    its ``RESULT {json}`` line."""
    out = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True,
        check=False, env=env, cwd=cwd,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{' / '.join(argv)} failed:\n{out.stderr[-3000:]}")
