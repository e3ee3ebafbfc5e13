"""XLA compile options the running jaxlib does not know are left out, not passed on.

XLA adds and retires its debug options between jaxlib releases, and ``jax.jit`` with an
option it does not know fails at the first call ("No such compile option"). The quick
options of the warm start's model-free steps and of NumPyro's compiled initial search
(``quick_compiler_options``) name one CPU option that a later jaxlib may not have
(``xla_cpu_use_fusion_emitters``); an option made up here stands for it.
"""

import json
import os
import subprocess
import sys

import jax
import pytest

from numpyro_uha.core import warm_start
from numpyro_uha.core.warm_start import known_compiler_options

UNKNOWN = "xla_cpu_option_no_jaxlib_has"


def test_an_option_xla_does_not_know_is_left_out(monkeypatch):
    # jaxlib itself rejects it (else this test could not fail)
    with pytest.raises(Exception, match="compile option"):
        jax.jit(lambda x: x + 1, compiler_options={UNKNOWN: True})(1.0)
    monkeypatch.setattr(warm_start, "_KNOWN_OPTIONS", {})
    both = {"xla_backend_optimization_level": 0, UNKNOWN: True}
    assert known_compiler_options("cpu", both) == {"xla_backend_optimization_level": 0}
    assert known_compiler_options("cpu", {UNKNOWN: True}) is None
    assert known_compiler_options("cpu", {"xla_backend_optimization_level": 0}) == {
        "xla_backend_optimization_level": 0
    }
    # the answers are kept for the process
    assert warm_start._KNOWN_OPTIONS == {
        ("cpu", "xla_backend_optimization_level", 0): True, ("cpu", UNKNOWN, True): False,
    }


_CHILD = r"""
import json, sys
import jax, jax.numpy as jnp, numpyro, optax
import numpyro.distributions as dist
from numpyro.infer import SVI, Trace_ELBO
from numpyro_uha import UHAGuide
from numpyro_uha.core import warm_start

warm_start.QUICK_CPU_OPTIONS = {**warm_start.QUICK_CPU_OPTIONS, sys.argv[1]: True}

def model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    with numpyro.plate("groups", y.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)

y = jnp.array([1.0, -0.5, 2.0, 0.3, 1.2, -1.0])
svi = SVI(model, UHAGuide(model, K=4), optax.adam(1e-3), Trace_ELBO())
state = svi.init(jax.random.PRNGKey(0), y)
state, loss = svi.update(state, y)
draws = svi.guide.sample_posterior(jax.random.PRNGKey(1), svi.get_params(state), y,
                                   sample_shape=(50,))
print(json.dumps({
    "loss": float(loss), "mu": float(draws["mu"].mean()),
    "probed": [list(k) + [v] for k, v in warm_start._KNOWN_OPTIONS.items()],
}))
"""


def test_the_guide_sets_up_where_a_quick_option_is_unknown(tmp_path):
    # a fresh process: the compiled steps of this one were made with the real options
    env = dict(os.environ, NUMPYRO_UHA_CACHE_DIR=str(tmp_path), JAX_PLATFORMS="cpu")
    run = subprocess.run(
        [sys.executable, "-c", _CHILD, UNKNOWN], env=env, capture_output=True, text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert all(map(lambda v: v == v and abs(v) < 1e6, (out["loss"], out["mu"])))
    # the warm start asked for the made-up option and was told XLA does not know it
    assert ["cpu", UNKNOWN, True, False] in out["probed"]


@pytest.mark.parametrize("flag", ["0", "1", None])
def test_quick_options_on_a_gpu_follow_the_environment(monkeypatch, flag):
    """On a GPU the quick options are QUICK_GPU_OPTIONS (those XLA knows) where
    NUMPYRO_UHA_QUICK_GPU_OPTIONS is 1 (by default: QUICK_GPU_DEFAULT), none where 0;
    the CPU's are unaffected."""
    asked = []
    monkeypatch.setattr(warm_start, "known_compiler_options",
                        lambda platform, options: asked.append(platform) or dict(options))
    if flag is None:
        monkeypatch.delenv("NUMPYRO_UHA_QUICK_GPU_OPTIONS", raising=False)
    else:
        monkeypatch.setenv("NUMPYRO_UHA_QUICK_GPU_OPTIONS", flag)
    on = (warm_start.QUICK_GPU_DEFAULT if flag is None else flag) == "1"
    got = warm_start.quick_compiler_options("gpu")
    assert got == (warm_start.QUICK_GPU_OPTIONS if on else None)
    assert asked == (["gpu"] if on else [])
    assert warm_start.quick_compiler_options("cpu") == warm_start.QUICK_CPU_OPTIONS
    assert warm_start.quick_compiler_options("tpu") is None
