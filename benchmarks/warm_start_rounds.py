"""The warm start's further VI rounds (``numpyro_uha.core.warm_start.VI_MAX_ROUNDS``) on
every zoo and hold-out model: ``svi.init`` of ``UHAGuide(model, K=4)`` with one round
(``max_rounds=1``, the behaviour before the rounds) and with the default, in one
process; the start ELBO (the mean log weight of the q UHA starts from, ± its standard
error), the VI steps the kept start ran, and the seconds of ``svi.init``.

    python -m benchmarks.warm_start_rounds             # 36 models, ~10 min
    python -m benchmarks.warm_start_rounds --smoke     # two models

Each model is set up first with one round, then with the default: the second setup
finds the model's programs compiled, so the seconds favour it and are not a cost
comparison (``benchmarks.startup`` is).
"""

from __future__ import annotations

import argparse
import time
import warnings

import jax
import numpy as np
import optax
from numpyro.infer import SVI, Trace_ELBO

import numpyro_uha.core.warm_start as ws
from benchmarks.common import write_results
from benchmarks.zoo_holdout import HOLDOUT
from benchmarks.zoo_models import ZOO
from numpyro_uha import UHAGuide


def _setup(zm, rounds):
    ws.warm_start.__kwdefaults__["max_rounds"] = rounds
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            guide = UHAGuide(zm.model, K=4)
            svi = SVI(zm.model, guide, optax.adam(1e-3), Trace_ELBO())
            start = time.perf_counter()
            svi.init(jax.random.PRNGKey(0), *zm.args)
            seconds = time.perf_counter() - start
    finally:
        ws.warm_start.__kwdefaults__["max_rounds"] = ws.VI_MAX_ROUNDS
    fit = getattr(guide, "warm_start_result", None)
    return {
        "elbo": float(guide._start_elbo[0]), "elbo_se": float(guide._start_elbo[1]),
        "vi_steps": None if fit is None else int(np.asarray(fit.losses).shape[0]),
        "seconds": seconds,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=None)
    parser.add_argument("--smoke", action="store_true", help="two models")
    parser.add_argument("--name", default="warm_start_rounds")
    args = parser.parse_args(argv)
    models = {**ZOO, **HOLDOUT}
    names = args.models or list(models)
    if args.smoke:
        names = ["improper_real", "eight_schools_centered"]
    rows = []
    for name in names:
        one, default = _setup(models[name], 1), _setup(models[name], ws.VI_MAX_ROUNDS)
        rows.append({"model": name, "one_round": one, "default": default})
        print(f"{name:28s} {one['elbo']:9.2f} -> {default['elbo']:9.2f}  "
              f"({one['vi_steps']} -> {default['vi_steps']} steps)", flush=True)
    lines = [
        f"`svi.init` of `UHAGuide(model, K=4)`, seed 0, one VI round against the default "
        f"(at most {ws.VI_MAX_ROUNDS}), in one process (the second setup of each model "
        "finds its programs compiled: the seconds are not a cost comparison). Start ELBO ± "
        "SE (256 draws); VI steps of the kept start (0: the Laplace approximation was "
        "kept without VI).",
        "",
        "| model | start ELBO, one round | start ELBO, default | gain (nats) | VI steps | s (one / default) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, b = r["one_round"], r["default"]
        lines.append(
            f"| {r['model']} | {a['elbo']:.2f} ± {a['elbo_se']:.2f} | {b['elbo']:.2f} ± "
            f"{b['elbo_se']:.2f} | {b['elbo'] - a['elbo']:+.2f} | {a['vi_steps']} → "
            f"{b['vi_steps']} | {a['seconds']:.1f} / {b['seconds']:.1f} |"
        )
    more = [r for r in rows if (r["default"]["vi_steps"] or 0) > (r["one_round"]["vi_steps"] or 0)]
    lines += ["", f"Further rounds ran on {len(more)} of {len(rows)} models."]
    path = write_results(args.name, {"rows": rows, "args": vars(args)}, "\n".join(lines))
    print(path)


if __name__ == "__main__":
    main()
