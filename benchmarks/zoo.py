"""Model zoo: UHAGuide and NumPyro's autoguides against long NUTS runs (issue 14).

Every model of :mod:`benchmarks.zoo_models` (NumPyro models as users write them: flat
priors, unstandardized regressions, hierarchical models, the funnel, time series with and
without ``scan``, simplex/LKJ/truncated/interval sites, masks, params, reparam handlers,
a marginalized mixture) is fitted by each guide at each Adam learning rate, and its draws
are compared with a cached NUTS reference, coordinate by coordinate in constrained space:

* ``max |mean err| / sd``: the largest |guide mean − NUTS mean| / NUTS sd over the
  latent coordinates;
* ``mean |log sd ratio|``: the mean over coordinates of |log(guide sd / NUTS sd)|.

A run is *right* when the first is ≤ 0.5 and the second ≤ 0.3. Coordinates that are
constant under NUTS (the fixed zeros and unit entry of an LKJ Cholesky factor) are left
out. The guide's moments are those of ``guide.sample_posterior`` draws (for UHAGuide:
unweighted draws of the UHA approximation); for UHAGuide the same draws importance-
resampled by their weights (``numpyro_uha.evaluation.importance_resample``) are reported
in an extra column. A run that raises is recorded with its exception (the benchmark goes
on); a run with a NaN loss is recorded as such and is never right.

References (NUTS, 4 chains × 2000 warm-up + 2000 draws, sequential chains) are cached in
``benchmarks/reference/zoo_nuts/<model>.npz`` with ``index.json`` / ``README.md`` (the
command, R-hat and bulk ESS). A reference with max R-hat > 1.01 or min bulk ESS < 400 is
not used: its rows say so.

    python -m benchmarks.zoo --nuts                    # (re)compute the references
    python -m benchmarks.zoo --lrs 1e-2 1e-3 --steps 10000
    python -m benchmarks.zoo --merge zoo_lr1e-2 zoo_lr1e-3 --name zoo
    python -m benchmarks.zoo --smoke

``--set holdout`` does the same on the hold-out set (:mod:`benchmarks.zoo_holdout`, eleven
models kept out of the tuning of UHAGuide's defaults), its references in
``benchmarks/reference/zoo_holdout_nuts/``, its results named ``zoo_holdout…`` by default:

    python -m benchmarks.zoo --set holdout --nuts
    python -m benchmarks.zoo --set holdout --lrs 1e-2 1e-3 --steps 10000
    python -m benchmarks.zoo --set holdout --smoke
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
import warnings
from pathlib import Path

import jax
import numpy as np
import optax
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDAIS, AutoMultivariateNormal, AutoNormal

from benchmarks.common import environment, results_dir, write_results
from benchmarks.zoo_holdout import HOLDOUT
from benchmarks.zoo_holdout import SMOKE_MODELS as HOLDOUT_SMOKE_MODELS
from benchmarks.zoo_models import SMOKE_MODELS, ZOO, latent_sites
from numpyro_uha import UHADrawsOffWarning, UHAFitWarning, UHAGuide
from numpyro_uha.evaluation import importance_resample, log_z_from_weights, psis_khat

REFERENCE_DIR = Path(__file__).parent / "reference" / "zoo_nuts"
HOLDOUT_REFERENCE_DIR = Path(__file__).parent / "reference" / "zoo_holdout_nuts"
# --set: the models, where their references live, the smoke models, the default result name.
SETS = {
    "zoo": {"models": ZOO, "reference_dir": REFERENCE_DIR, "smoke": SMOKE_MODELS, "name": "zoo",
            "title": "the model zoo"},
    "holdout": {"models": HOLDOUT, "reference_dir": HOLDOUT_REFERENCE_DIR, "smoke": HOLDOUT_SMOKE_MODELS,
                "name": "zoo_holdout", "title": "the zoo's hold-out set"},
}
GUIDES = ("UHAGuide", "AutoNormal", "AutoMultivariateNormal", "AutoDAIS")
#: Variants run only when named in ``--guides``: ``UHAGuide_centered`` is UHAGuide at its
#: defaults but ``decenter=False`` (the model's own coordinates), the before row of the
#: automatic non-centering; ``UHAGuide_cholesky`` is UHAGuide at its defaults but
#: ``base_dist="cholesky"`` (a full-rank q at any dimension).
ABLATIONS = ("UHAGuide_centered", "UHAGuide_cholesky")
MAX_RHAT = 1.01
MIN_ESS = 400
MEAN_TOL = 0.5
LOG_SD_TOL = 0.3


# -------------------------------------------------------------------------- references
def _reference_path(name: str, model_set: str = "zoo") -> Path:
    return SETS[model_set]["reference_dir"] / f"{name}.npz"


def run_nuts(entry, chains=4, warmup=2000, samples=2000, seed=0):
    """NUTS on ``entry``'s reference model; returns ``{site: (chains, draws, *shape)}`` for
    the zoo model's latent sites, the number of divergences and the seconds taken."""
    model = entry.nuts_model or entry.model
    scale = entry.nuts_scale
    mcmc = MCMC(
        NUTS(model, **entry.nuts_kwargs), num_warmup=warmup * scale, num_samples=samples * scale,
        num_chains=chains, chain_method="sequential", progress_bar=False,
    )
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), *entry.args, extra_fields=("diverging",))
    seconds = time.perf_counter() - start
    grouped = mcmc.get_samples(group_by_chain=True)
    sites = latent_sites(entry.model, entry.args)
    if entry.nuts_sites is not None:
        grouped = entry.nuts_sites(grouped)
    draws = {k: np.asarray(grouped[k], np.float64) for k in sites}
    divergences = int(np.sum(mcmc.get_extra_fields()["diverging"]))
    return draws, divergences, seconds


def diagnostics(draws: dict) -> dict:
    """Rank-normalized split R-hat and bulk ESS (ArviZ) over the non-constant coordinates."""
    import arviz as az

    idata = az.from_dict(posterior={k: v for k, v in draws.items()})
    rhat = az.rhat(idata)
    ess = az.ess(idata, method="bulk")
    per_site = {}
    for k, v in draws.items():
        sd = v.reshape(v.shape[0] * v.shape[1], -1).std(0)
        keep = sd > 1e-8 * (1 + np.abs(v.reshape(-1, sd.size).mean(0)))
        r = np.asarray(rhat[k]).reshape(-1)[keep]
        e = np.asarray(ess[k]).reshape(-1)[keep]
        per_site[k] = {"max_rhat": float(np.max(r)) if r.size else None,
                       "min_ess_bulk": float(np.min(e)) if e.size else None}
    rhats = [s["max_rhat"] for s in per_site.values() if s["max_rhat"] is not None]
    esses = [s["min_ess_bulk"] for s in per_site.values() if s["min_ess_bulk"] is not None]
    return {"max_rhat": max(rhats), "min_ess_bulk": min(esses), "sites": per_site}


def reference_ok(diag: dict) -> bool:
    return diag["max_rhat"] <= MAX_RHAT and diag["min_ess_bulk"] >= MIN_ESS


def save_reference(name, draws, diag, divergences, seconds, command, settings, model_set="zoo"):
    reference_dir = SETS[model_set]["reference_dir"]
    models = SETS[model_set]["models"]
    reference_dir.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for k, v in draws.items():
        flat = v.reshape((-1,) + v.shape[2:])
        arrays[f"mean/{k}"] = flat.mean(0)
        arrays[f"sd/{k}"] = flat.std(0, ddof=1)
        arrays[f"median/{k}"] = np.median(flat, 0)
        # Every other draw of every chain, float32: enough for any later moment check.
        arrays[f"draws/{k}"] = v[:, ::2].astype(np.float32)
    np.savez_compressed(_reference_path(name, model_set), **arrays)
    index_path = reference_dir / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    env = environment()
    index[name] = {
        "command": command,
        "settings": settings,
        "note": models[name].note,
        "nuts_kwargs": {k: v if isinstance(v, (bool, int, float, str)) else "(see note)"
                        for k, v in models[name].nuts_kwargs.items()},
        "max_rhat": diag["max_rhat"],
        "min_ess_bulk": diag["min_ess_bulk"],
        "ok": reference_ok(diag),
        "divergences": divergences,
        "seconds": round(seconds, 1),
        "sites": diag["sites"],
        "versions": env["versions"],
        "git_commit": env["git_commit"],
        "date": env["date"],
    }
    index = dict(sorted(index.items()))
    index_path.write_text(json.dumps(index, indent=2))
    write_reference_readme(index, model_set)


def write_reference_readme(index, model_set="zoo"):
    flag = "" if model_set == "zoo" else f" --set {model_set}"
    lines = [
        f"# NUTS references of {SETS[model_set]['title']}",
        "",
        f"Written by `python -m benchmarks.zoo{flag} --nuts` (each row's command below); read by",
        "`python -m benchmarks.zoo` and `tests/test_zoo.py`. Each `<model>.npz` holds, per latent",
        "site (constrained space), `mean/<site>`, `sd/<site>`, `median/<site>` over all draws and",
        "`draws/<site>` (every other draw, chains × draws × shape, float32). R-hat is ArviZ's",
        f"rank-normalized split R-hat, ESS its bulk ESS; a reference with max R-hat > {MAX_RHAT} or",
        f"min bulk ESS < {MIN_ESS} is refused by the benchmark.",
        "",
        "| model | chains × (warm-up + draws) | max R-hat | min bulk ESS | divergences | ok | s | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in index.items():
        s = r["settings"]
        lines.append(
            f"| {name} | {s['chains']} × ({s['warmup']} + {s['samples']}) | {r['max_rhat']:.4f} | "
            f"{r['min_ess_bulk']:.0f} | {r['divergences']} | {'yes' if r['ok'] else '**no**'} | "
            f"{r['seconds']:.0f} | {r['note']} |"
        )
    commands = sorted({r["command"] for r in index.values()})
    lines += ["", "Commands:", ""] + [f"- `{c}`" for c in commands]
    (SETS[model_set]["reference_dir"] / "README.md").write_text("\n".join(lines) + "\n")


def load_reference(name, model_set="zoo"):
    """``(moments, record)``: ``{site: (mean, sd, median)}`` and the index entry, or
    ``(None, None)`` when there is no reference (``model_set``: ``"zoo"`` or ``"holdout"``)."""
    path = _reference_path(name, model_set)
    index_path = SETS[model_set]["reference_dir"] / "index.json"
    if not path.exists() or not index_path.exists():
        return None, None
    record = json.loads(index_path.read_text()).get(name)
    data = np.load(path)
    sites = [k.split("/", 1)[1] for k in data.files if k.startswith("mean/")]
    moments = {k: (data[f"mean/{k}"], data[f"sd/{k}"], data[f"median/{k}"]) for k in sites}
    return moments, record


def compute_references(args):
    command = shlex.join(["python", "-m", "benchmarks.zoo", *sys.argv[1:]])
    for name in args.models:
        entry = SETS[args.set]["models"][name]
        draws, divergences, seconds = run_nuts(entry, args.nuts_chains, args.nuts_warmup, args.nuts_samples)
        diag = diagnostics(draws)
        settings = {"chains": args.nuts_chains, "warmup": args.nuts_warmup * entry.nuts_scale,
                    "samples": args.nuts_samples * entry.nuts_scale, "chain_method": "sequential", "seed": 0}
        save_reference(name, draws, diag, divergences, seconds, command, settings, args.set)
        print(f"{name}: max R-hat {diag['max_rhat']:.4f}, min bulk ESS {diag['min_ess_bulk']:.0f}, "
              f"{divergences} divergences, {seconds:.0f} s{'' if reference_ok(diag) else '  REFUSED'}",
              flush=True)


# ------------------------------------------------------------------------------ guides
def make_guide(kind, model, smoke=False):
    if kind == "UHAGuide":
        # Defaults (K = 32, 1000 warm-start steps); the smoke run only checks the plumbing.
        return UHAGuide(model, K=4, warm_start_steps=20) if smoke else UHAGuide(model)
    if kind == "UHAGuide_centered":
        return UHAGuide(model, decenter=False)
    if kind == "UHAGuide_cholesky":
        return UHAGuide(model, base_dist="cholesky")
    if kind == "AutoNormal":
        return AutoNormal(model)
    if kind == "AutoMultivariateNormal":
        return AutoMultivariateNormal(model)
    if kind == "AutoDAIS":
        return AutoDAIS(model)
    raise ValueError(f"unknown guide {kind!r}")


def moment_errors(draws: dict, moments: dict) -> dict:
    """Max |mean error| / NUTS sd and mean |log sd ratio| (and the smallest sd ratio)
    over the non-constant coordinates of the reference's sites."""
    z_err, log_ratio, sd_ratio = [], [], []
    for k, (mean, sd, _) in moments.items():
        x = np.asarray(draws[k], np.float64).reshape((-1,) + np.shape(mean))
        keep = np.asarray(sd).reshape(-1) > 1e-8 * (1 + np.abs(np.asarray(mean).reshape(-1)))
        g_mean = x.mean(0).reshape(-1)[keep]
        g_sd = x.std(0, ddof=1).reshape(-1)[keep]
        ref_mean, ref_sd = np.asarray(mean).reshape(-1)[keep], np.asarray(sd).reshape(-1)[keep]
        z_err.append(np.abs(g_mean - ref_mean) / ref_sd)
        log_ratio.append(np.abs(np.log(g_sd / ref_sd)))
        sd_ratio.append(g_sd / ref_sd)
    z_err, log_ratio = np.concatenate(z_err), np.concatenate(log_ratio)
    if not (np.all(np.isfinite(z_err)) and np.all(np.isfinite(log_ratio))):
        return {"max_mean_err": None, "mean_log_sd_ratio": None, "right": False, "finite": False}
    out = {"max_mean_err": float(z_err.max()), "mean_log_sd_ratio": float(log_ratio.mean()),
           "min_sd_ratio": float(np.concatenate(sd_ratio).min()), "finite": True}
    out["right"] = out["max_mean_err"] <= MEAN_TOL and out["mean_log_sd_ratio"] <= LOG_SD_TOL
    return out


def _message(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 400 else f"{text[:250]} … {text[-150:]}"


def run_one(entry, kind, lr, steps, seed, num_draws, moments, smoke=False):
    record = {"model": entry.name, "guide": kind, "lr": lr, "steps": steps, "seed": seed}
    start = time.perf_counter()
    caught = warnings.catch_warnings(record=True)
    log = caught.__enter__()
    warnings.simplefilter("always")
    try:
        guide = make_guide(kind, entry.model, smoke)
        svi = SVI(entry.model, guide, optax.adam(lr), Trace_ELBO())
        result = svi.run(jax.random.PRNGKey(seed), steps, *entry.args, progress_bar=False)
        losses = np.asarray(result.losses)
        record["fit_seconds"] = round(time.perf_counter() - start, 1)
        record["nan_losses"] = int(np.sum(~np.isfinite(losses)))
        record["final_loss"] = float(np.mean(losses[-max(1, len(losses) // 20):]))
        key = jax.random.PRNGKey(seed + 1000)
        if kind.startswith("UHAGuide"):  # the ablations too: their weights and ELBO
            weighted = guide.sample_posterior_with_log_weights(
                key, result.params, *entry.args, sample_shape=(num_draws,))
            draws = {k: np.asarray(v) for k, v in weighted.samples.items()}
            resampled = importance_resample(jax.random.PRNGKey(seed + 2000), weighted)
            # What the weights say about the fit (the evaluation layer's checks): PSIS k̂,
            # the UHA ELBO and its standard error, and the start ELBO (the warm-start q's).
            log_w = np.asarray(weighted.log_weights, np.float64).ravel()
            log_w = log_w[np.isfinite(log_w)]
            record["khat"] = psis_khat(log_w) if log_w.size >= 10 else None
            summary = log_z_from_weights(log_w) if log_w.size >= 2 else None
            record["elbo"] = None if summary is None else summary.elbo
            record["elbo_se"] = None if summary is None else summary.elbo_se
            start_elbo = getattr(guide, "_start_elbo", None)
            record["start_elbo"] = None if start_elbo is None else float(start_elbo[0])
        else:
            draws = guide.sample_posterior(key, result.params, *entry.args, sample_shape=(num_draws,))
            draws = {k: np.asarray(v) for k, v in draws.items()}
            resampled = None
        record["seconds"] = round(time.perf_counter() - start, 1)
        if record["nan_losses"]:
            record["status"] = "nan"
        else:
            record["status"] = "ok"
        if moments is not None:
            record.update(moment_errors(draws, moments))
            if record["status"] != "ok":
                record["right"] = False
            if resampled is not None:
                iw = moment_errors(resampled, moments)
                record["resampled"] = {"max_mean_err": iw["max_mean_err"],
                                       "mean_log_sd_ratio": iw["mean_log_sd_ratio"],
                                       "right": iw["right"] and record["status"] == "ok"}
    except Exception as err:  # noqa: BLE001 -- every failure is a result
        record["seconds"] = round(time.perf_counter() - start, 1)
        record["status"] = "error"
        record["error_type"] = f"{type(err).__module__}.{type(err).__qualname__}"
        record["error"] = _message(err)
        record["right"] = False
    finally:
        caught.__exit__(None, None, None)
    # What a user would have been told: the guides' own warnings (NumPyro's and
    # numpyro_uha's), by category, counted once per category and message.
    record["warnings"] = sorted({
        w.category.__name__ for w in log
        if w.category.__name__.startswith("UHA") or w.category is RuntimeWarning
    })
    # and which of the draws' checks spoke
    record["fit_checks"] = fit_checks(log)
    # Every run compiles its own programs; without this a full run's process grows by
    # gigabytes (a first full run died of an LLVM out-of-memory error).
    jax.clear_caches()
    return record


def _child(queue, name, kind, lr, steps, seed, num_draws, smoke, model_set="zoo"):
    moments, _ = load_reference(name, model_set)
    queue.put(run_one(SETS[model_set]["models"][name], kind, lr, steps, seed, num_draws, moments, smoke))


def run_isolated(name, kind, lr, steps, seed, num_draws, smoke, timeout, model_set="zoo"):
    """``run_one`` in a fresh process, given up after ``timeout`` seconds (a run that hangs
    is recorded as such instead of stopping the benchmark)."""
    import multiprocessing as mp
    import queue as queue_mod

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_child, args=(q, name, kind, lr, steps, seed, num_draws, smoke, model_set))
    start = time.perf_counter()
    proc.start()
    try:
        record = q.get(timeout=timeout)
    except queue_mod.Empty:
        record = {"model": name, "guide": kind, "lr": lr, "steps": steps, "seed": seed, "status": "error",
                  "error_type": "Timeout", "right": False,
                  "error": f"no result after {timeout} s: the run hung or was too slow (process killed)"}
        record["seconds"] = round(time.perf_counter() - start, 1)
        proc.kill()
    proc.join(10)
    return record


# ------------------------------------------------------------------------------ tables
def _lr_label(lr):
    return f"{lr:.0e}".replace("e-0", "e-")


def _cell(run, ref_ok):
    if run is None:
        return "–"
    if run["status"] == "error":
        return f"✗ {run['error_type'].rsplit('.', 1)[-1]}"
    if run.get("max_mean_err") is None:
        return "✗ NaN" if run["status"] == "nan" or run.get("finite") is False else "(no ref)"
    mark = "✓" if run["right"] else "✗"
    if not ref_ok:
        mark = "(ref refused)"
    nan = " NaN loss" if run["status"] == "nan" else ""
    warned = " ⚠" if _fit_warned(run) else ""
    return f"{mark} {run['max_mean_err']:.2f} / {run['mean_log_sd_ratio']:.2f}{nan}{warned}"


#: Warnings that tell the user the fit itself is not to be trusted (a warm start that had
#: not converged is advice, not a verdict, so it does not count).
FIT_WARNINGS = (
    "UHAFitWarning", "UHADrawsOffWarning", "UHAWorseThanStartWarning",
    "UHADivergenceWarning", "UHANonfiniteDrawsWarning",
)
#: UHAFitWarning's checks, by a phrase of their messages (recorded per run as fit_checks)
FIT_CHECK_TAGS = {
    "khat": "Pareto k̂ =",
    "worse_than_start": "worse than the Gaussian q it started from",
    "diverged_draws": "draws diverged",
}


#: UHADrawsOffWarning's own ``check`` attribute -> the tag
DRAWS_OFF_TAGS = {"biased": "mean_shift", "too_narrow": "spread", "too_wide": "spread_wide"}


def fit_checks(log) -> list:
    """Which of the checks behind ``UHAFitWarning`` and its kinds spoke in ``log``
    (``warnings.catch_warnings(record=True)``'s list): the draws' checks by their
    warning's ``check`` attribute, the others by FIT_CHECK_TAGS' phrases."""
    tags = set()
    for w in log:
        if issubclass(w.category, UHADrawsOffWarning):
            tags.add(DRAWS_OFF_TAGS[w.message.check])
        elif issubclass(w.category, UHAFitWarning):
            tags |= {tag for tag, text in FIT_CHECK_TAGS.items() if text in str(w.message)}
    return sorted(tags)


def _fit_warned(run) -> bool:
    return any(w in FIT_WARNINGS for w in run.get("warnings", ()))


def render(payload) -> str:
    runs = payload["runs"]
    refs = payload["references"]
    guides = [g for g in GUIDES + ABLATIONS if any(r["guide"] == g for r in runs)]
    lrs = sorted({r["lr"] for r in runs}, reverse=True)
    seeds = sorted({r["seed"] for r in runs})
    steps = sorted({r["steps"] for r in runs})
    model_set = payload.get("set", "zoo")
    models = [m for m in SETS[model_set]["models"] if any(r["model"] == m for r in runs)]
    by_key = {(r["model"], r["guide"], r["lr"], r["seed"]): r for r in runs}
    cols = [(g, lr) for lr in lrs for g in guides]
    lines = [
        f"Protocol: each guide fitted by SVI (`Trace_ELBO`, `optax.adam(lr)`, {', '.join(map(str, steps))} steps, "
        f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}); {payload['num_draws']} draws of "
        "`guide.sample_posterior` compared with the cached NUTS reference "
        f"(`benchmarks/reference/{SETS[model_set]['reference_dir'].name}/`) coordinate by coordinate in "
        "constrained space. "
        "Each cell: ✓/✗ (right = max |mean err|/sd ≤ 0.5 and mean |log sd ratio| ≤ 0.3), then "
        "max |mean err|/sd / mean |log sd ratio|; ⚠ = the guide warned the user that the fit "
        "is poor (`UHAFitWarning`, `UHADivergenceWarning`, `UHANonfiniteDrawsWarning`; runs "
        "from before warnings were recorded show none); ✗ with an exception's name = the run raised "
        "(messages below); `UHAGuide` is at its defaults (K = 32, 1000 warm-start steps); "
        "`UHAGuide IR` = the same UHA draws importance-resampled by their weights.",
        "",
    ]
    header = ["model", "NUTS R-hat / ESS"]
    for g, lr in cols:
        header.append(f"{g} {_lr_label(lr)}")
        if g == "UHAGuide":
            header.append(f"UHAGuide IR {_lr_label(lr)}")
    for seed in seeds:
        if len(seeds) > 1:
            lines += [f"Seed {seed}:", ""]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for m in models:
            ref_ok = bool(refs.get(m, {}).get("ok"))
            row = [m + ("" if ref_ok else " (reference refused)" if m in refs else " (no reference)")]
            row.append(f"{refs[m]['max_rhat']:.3f} / {refs[m]['min_ess_bulk']:.0f}" if m in refs else "–")
            for g, lr in cols:
                run = by_key.get((m, g, lr, seed))
                row.append(_cell(run, ref_ok))
                if g == "UHAGuide":
                    if run is None or "resampled" not in run or run["resampled"]["max_mean_err"] is None:
                        row.append("–")
                    else:
                        iw = run["resampled"]
                        row.append(f"{'✓' if iw['right'] else '✗'} {iw['max_mean_err']:.2f} / "
                                   f"{iw['mean_log_sd_ratio']:.2f}")
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    # Counts.
    usable = [m for m in models if refs.get(m, {}).get("ok")]
    lines += [f"Right (of {len(usable)} models with a usable reference"
              + (f", summed over {len(seeds)} seeds" if len(seeds) > 1 else "") + "):", "",
              "| guide | " + " | ".join(f"lr {_lr_label(lr)}" for lr in lrs) + " |",
              "|---|" + "---|" * len(lrs)]
    for g in guides:
        cells = []
        for lr in lrs:
            rs = [by_key.get((m, g, lr, s)) for m in usable for s in seeds]
            rs = [r for r in rs if r is not None]
            n_right = sum(bool(r.get("right")) for r in rs)
            n_err = sum(r["status"] == "error" for r in rs)
            n_nan = sum(r["status"] == "nan" for r in rs)
            n_silent = sum(
                not r.get("right") and r["status"] == "ok" and "warnings" in r and not _fit_warned(r)
                for r in rs
            )
            recorded = any("warnings" in r for r in rs)
            extra = ", ".join(filter(None, [
                f"{n_err} raised" if n_err else "", f"{n_nan} NaN" if n_nan else "",
                f"{n_silent} wrong without a warning" if recorded else "",
            ]))
            cells.append(f"{n_right}/{len(rs)}" + (f" ({extra})" if extra else ""))
        lines.append(f"| {g} | " + " | ".join(cells) + " |")
        if g == "UHAGuide":
            cells = []
            for lr in lrs:
                rs = [by_key.get((m, g, lr, s)) for m in usable for s in seeds]
                rs = [r for r in rs if r is not None]
                cells.append(f"{sum(bool(r.get('resampled', {}).get('right')) for r in rs)}/{len(rs)}")
            lines.append("| UHAGuide IR | " + " | ".join(cells) + " |")
    checked = [r for r in runs if "fit_checks" in r and r["status"] == "ok"]
    if checked:
        lines += ["", "Which of `UHAFitWarning`'s checks spoke (runs with `fit_checks` recorded; "
                  "right / wrong by the cell's criterion):", ""]
        for tag in [*FIT_CHECK_TAGS, *DRAWS_OFF_TAGS.values()]:
            spoke = [r for r in checked if tag in r["fit_checks"]]
            if spoke:
                right = sum(bool(r.get("right")) for r in spoke)
                names = ", ".join(sorted({f"{r['model']} ({_lr_label(r['lr'])})" for r in spoke}))
                lines.append(f"- {tag}: {len(spoke)} run(s), {right} right / "
                             f"{len(spoke) - right} wrong: {names}")
    failures = [r for r in runs if r["status"] in ("error", "nan")]
    if failures:
        lines += ["", "Failed runs:", ""]
        for r in failures:
            what = (f"`{r['error_type']}`: {r['error'][:300]}" if r["status"] == "error"
                    else f"{r['nan_losses']} NaN losses")
            lines.append(f"- {r['model']}, {r['guide']}, lr {_lr_label(r['lr'])}, seed {r['seed']}: {what}")
    refused = [m for m in models if m in refs and not refs[m]["ok"]]
    if refused:
        lines += ["", "References refused (max R-hat > 1.01 or min bulk ESS < 400): "
                  + ", ".join(f"{m} (R-hat {refs[m]['max_rhat']:.3f}, ESS {refs[m]['min_ess_bulk']:.0f})"
                              for m in refused)]
    if payload.get("note"):
        lines += ["", payload["note"]]
    if payload.get("sources"):
        lines += ["", "Merged from:", ""]
        for s in payload["sources"]:
            dirty = s.get("uncommitted_package_changes")
            lines.append(f"- `{s['command']}` (commit {s['git_commit']}, {s['machine']}, started {s['started']}"
                         + (f"; uncommitted changes in {', '.join(dirty)}" if dirty else "") + ")")
    return "\n".join(lines)


def _reference_summary(names, model_set="zoo"):
    out = {}
    for m in names:
        _, record = load_reference(m, model_set)
        if record is not None:
            out[m] = {k: record[k] for k in ("max_rhat", "min_ess_bulk", "ok", "divergences", "command")}
    return out


def _dirty_package():
    """Files of the package that differ from the commit at start (others may be editing
    the tree while a long benchmark runs; the modules were imported at start)."""
    import subprocess

    try:
        out = subprocess.run(["git", "status", "--porcelain", "numpyro_uha"], capture_output=True, text=True,
                             cwd=Path(__file__).parent.parent, check=False).stdout
    except OSError:
        return None
    return [line[3:] for line in out.splitlines()]


def merge(args):
    runs, sources, num_draws = [], [], None
    seen = {}
    for name in args.merge:
        path = results_dir() / f"{name}.json"
        if path.exists():
            payload = json.loads(path.read_text())
            env = payload["environment"]
            sources.append({**{k: env.get(k) for k in ("command", "git_commit", "machine", "started")},
                            "uncommitted_package_changes": payload.get("uncommitted_package_changes")})
            num_draws = payload["num_draws"]
            runs_in = payload["runs"]
        else:  # the runs an interrupted process had finished, one JSON line each
            runs_in = [json.loads(line) for line in (results_dir() / f"{name}.partial.jsonl").read_text().splitlines()]
            sources.append({"command": f"(interrupted run: the {len(runs_in)} runs in {name}.partial.jsonl)",
                            "git_commit": "see note", "machine": "this machine", "started": "see note"})
        for r in runs_in:
            seen[(r["model"], r["guide"], r["lr"], r["seed"], r["steps"])] = r
    runs = list(seen.values())
    payload = {"num_draws": num_draws, "sources": sources, "runs": runs,
               "references": _reference_summary({r["model"] for r in runs}, args.set)}
    if args.set != "zoo":
        payload["set"] = args.set
    return payload


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", default="zoo", choices=list(SETS),
                   help="the model zoo (default) or its hold-out set (benchmarks/zoo_holdout.py)")
    p.add_argument("--models", nargs="+", default=None, choices=list(ZOO) + list(HOLDOUT),
                   help="default: every model of --set")
    p.add_argument("--guides", nargs="+", default=list(GUIDES), choices=list(GUIDES) + list(ABLATIONS))
    p.add_argument("--lrs", nargs="+", type=float, default=[1e-3, 1e-2, 3e-2])
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--num-draws", type=int, default=2000)
    p.add_argument("--name", default=None)
    p.add_argument("--smoke", action="store_true", help=f"models {', '.join(SMOKE_MODELS)} (hold-out set: "
                   f"{', '.join(HOLDOUT_SMOKE_MODELS)}), 30 steps, seconds")
    p.add_argument("--nuts", action="store_true", help="compute and cache the NUTS references instead")
    p.add_argument("--nuts-chains", type=int, default=4)
    p.add_argument("--nuts-warmup", type=int, default=2000)
    p.add_argument("--nuts-samples", type=int, default=2000)
    p.add_argument("--merge", nargs="+", default=None, help="merge these result files into --name")
    p.add_argument("--timeout", type=float, default=None,
                   help="run each fit in its own process and give up after this many seconds")
    p.add_argument("--note", default=None, help="a note for the merged table (e.g. on interrupted runs)")
    args = p.parse_args(argv)
    model_set = SETS[args.set]
    if args.models is None:
        args.models = list(model_set["models"])
    unknown = [m for m in args.models if m not in model_set["models"]]
    if unknown:
        p.error(f"not in --set {args.set}: {', '.join(unknown)}")

    if args.nuts:
        compute_references(args)
        return
    if args.merge:
        payload = merge(args)
        payload["note"] = args.note
        name = args.name or model_set["name"]
        path = write_results(name, payload, render(payload))
        print(path.read_text())
        return
    if args.smoke:
        args.models = list(model_set["smoke"])
        args.steps = 30
        args.lrs = [1e-2]
        args.num_draws = 100
    name = args.name or (f"{model_set['name']}_smoke" if args.smoke else model_set["name"])
    payload = {"num_draws": args.num_draws, "runs": [], "uncommitted_package_changes": _dirty_package()}
    if args.set != "zoo":
        payload["set"] = args.set
    partial = results_dir() / f"{name}.partial.jsonl"
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_text("")
    for model_name in args.models:
        entry = model_set["models"][model_name]
        moments, record = load_reference(model_name, args.set)
        for seed in args.seeds:
            for lr in args.lrs:
                for kind in args.guides:
                    if args.timeout:
                        run = run_isolated(model_name, kind, lr, args.steps, seed, args.num_draws, args.smoke,
                                           args.timeout, args.set)
                    else:
                        run = run_one(entry, kind, lr, args.steps, seed, args.num_draws, moments, args.smoke)
                    payload["runs"].append(run)
                    with partial.open("a") as f:
                        f.write(json.dumps(run) + "\n")
                    summary = (f"{run['error_type']}: {run['error'][:120]}" if run["status"] == "error" else
                               f"{run.get('max_mean_err')} / {run.get('mean_log_sd_ratio')} right={run.get('right')}"
                               f" nan={run.get('nan_losses')}")
                    print(f"{model_name:28s} {kind:24s} lr={lr:g} seed={seed}: {summary} ({run['seconds']} s)",
                          flush=True)
    payload["references"] = _reference_summary(args.models, args.set)
    path = write_results(name, payload, render(payload))
    partial.unlink()
    print(path.read_text())


if __name__ == "__main__":
    main()
