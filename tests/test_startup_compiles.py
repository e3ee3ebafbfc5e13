"""``svi.init`` compiles the warm start's model-free steps in a background thread
(``numpyro_uha.core.warm_start.precompile``) while NumPyro traces the model.

Checked in fresh processes (a process compiles each step once, so only a fresh one shows
who compiled it), from JAX's own compile log: every model-free step (the functions
decorated by ``small_jit``, in the warm start and the guide) that the setup needs is
compiled by the rehearsal thread, none by the main thread; so the rehearsal makes the
same calls, with the same shapes, dtypes and static arguments, as the real setup. The
model itself is compiled once (its value and gradient), and ``svi.init``'s own draw is
q's, not the chain's; a later concrete call runs the chain. And the rehearsal changes
nothing the setup computes.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import numpyro
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

import numpyro_uha.guide as guide_module
from numpyro_uha import UHAGuide
from numpyro_uha.datasets import load_logistic_regression, logistic_regression_model

_CHILD = r"""
import json, logging, re, sys, threading
import jax, optax
jax.config.update("jax_log_compiles", True)
compiled = []

class Record(logging.Handler):
    def emit(self, record):
        m = re.search(r"Finished XLA compilation of jit\((\w+)\)", record.getMessage())
        if m:
            compiled.append((m.group(1), threading.current_thread().name))

log = logging.getLogger("jax")
log.handlers[:] = [Record()]
log.setLevel(logging.DEBUG)
log.propagate = False

from numpyro.infer import SVI, Trace_ELBO
import numpyro_uha.core.warm_start as warm_start_module
import numpyro_uha.guide as guide_module
from numpyro_uha import UHAGuide
from numpyro_uha.datasets import load_logistic_regression, logistic_regression_model

X, y = load_logistic_regression("australian")
X = X[:, : int(sys.argv[1])]  # d = columns + 1: full-rank q up to 32, diagonal above
options = json.loads(sys.argv[2])
guide = UHAGuide(logistic_regression_model, K=4, **options)
svi = SVI(logistic_regression_model, guide, optax.adam(1e-3), Trace_ELBO())
svi.init(jax.random.PRNGKey(0), X, y)
at_init = list(compiled)
import numpyro
numpyro.handlers.seed(guide, 1)(X, y)  # a later concrete call: the chain runs
compiled, later = at_init, compiled[len(at_init):]
steps = sorted({
    name for module in (warm_start_module, guide_module)
    for name, fn in vars(module).items() if getattr(fn, "small_jit", False)
})
result = {"compiled": compiled, "later": later, "steps": steps, "base": guide.base_dist}
print("RESULT", json.dumps(result))
"""


def _compiles(columns, **options):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(columns), json.dumps(options)],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(out.stderr[-3000:])


@pytest.mark.parametrize(
    "columns, options, base",
    [
        (14, {"warm_start_steps": 30}, "cholesky"),  # the default warm start, full rank
        # a diagonal q's steps (other shapes and static arguments); on demand, to keep the
        # default suite short on 2 cores
        pytest.param(
            14, {"warm_start_steps": 30, "base_dist": "diagonal"}, "diagonal",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_the_main_thread_compiles_no_model_free_step(columns, options, base):
    result = _compiles(columns, **options)
    assert result["base"] == base
    steps = set(result["steps"])
    assert {"_vi_step", "_mode_step", "_start_arrays"} <= steps  # the markers are found
    by_main = sorted({n for n, thread in result["compiled"] if n in steps and thread == "MainThread"})
    rehearsed = {n for n, thread in result["compiled"] if n in steps and thread != "MainThread"}
    assert not by_main, f"compiled by the main thread, not rehearsed: {by_main}"
    # the warm start's whole path was rehearsed (not only some of it)
    assert {"_prepare", "_mode_step", "_vi_begin", "_vi_step", "_pick", "_score_finish",
            "_curvature_max", "_all_finite", "_start_arrays", "_q_log_density"} <= rehearsed
    if base == "cholesky":  # the Cholesky parameter's inverse transform, at svi.init
        assert ("_scale_corr_inverse", "MainThread") not in map(tuple, result["compiled"])
        assert "_scale_corr_inverse" in {n for n, _ in result["compiled"]}
    # and the model's own program, its value and gradient (Hessian-vector products by
    # differences of it), was compiled once; svi.init's own values are NumPyro's initial
    # point with its log q (the setup call), not the chain's, whose program no training
    # step reuses
    programs = ("_oracle_impl", "_draw_one_impl")
    model_programs = [n for n, t in result["compiled"] if n in programs]
    assert model_programs == ["_oracle_impl"]
    # a later concrete call (the guide set up) runs the chain
    assert [n for n, t in result["later"] if n in programs] == ["_draw_one_impl"]


def test_the_rehearsal_changes_nothing_the_setup_computes(monkeypatch):
    X, y = load_logistic_regression("australian")

    def init_values():
        guide = UHAGuide(logistic_regression_model, K=4, warm_start_steps=30)
        svi = SVI(logistic_regression_model, guide, optax.adam(1e-3), Trace_ELBO())
        params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, y))
        return guide._start_elbo, {k: np.asarray(v) for k, v in params.items()}

    with_rehearsal = init_values()
    monkeypatch.setattr(guide_module, "precompile", lambda signature, rehearsal, width=None, step_device=None: None)
    without = init_values()
    assert with_rehearsal[0] == without[0]
    assert with_rehearsal[1].keys() == without[1].keys()
    for name, value in with_rehearsal[1].items():
        np.testing.assert_array_equal(value, without[1][name], err_msg=name)


def test_the_concrete_draw_has_no_host_callback_and_a_training_step_has(monkeypatch):
    """A concrete call (not a training step: ``svi.init``'s, a direct call) records no
    divergence on the host, so its program holds no host callback and JAX's persistent
    compilation cache may keep it; a training step still records
    (``_divergence.finite_guard``)."""
    import numpyro_uha._divergence as divergence_module

    traced = []
    pure_callback = jax.pure_callback

    def counting(*args, **kwargs):
        traced.append(args[0])
        return pure_callback(*args, **kwargs)

    monkeypatch.setattr(divergence_module.jax, "pure_callback", counting)
    X, y = load_logistic_regression("australian")
    guide = UHAGuide(logistic_regression_model, K=2, warm_start_steps=30)
    svi = SVI(logistic_regression_model, guide, optax.adam(1e-3), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), X, y)
    numpyro.handlers.seed(guide, 1)(X, y)  # a concrete call that runs the chain
    assert traced == [], "a concrete draw traced a host callback"
    jax.jit(svi.update).lower(state, X, y)
    assert traced, "the training step no longer records divergences on the host"
