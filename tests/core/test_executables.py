"""The on-disk cache of the warm start's model-free executables (core/executables.py).

A later process loads what an earlier one compiled, and computes exactly what it would
have computed; the key separates programs (shapes, options, environment); a damaged file
is compiled again, not trusted; the cache is off when asked, and stands aside when JAX's
own persistent cache is on. The whole-guide checks run in fresh processes (a process
keeps its executables in memory, so only a new one reads the disk) without the JAX cache
the test suite turns on (tests/conftest.py).
"""

import json
import os
import pickle
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_uha.core import executables

_CHILD = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np, numpyro, optax
import numpyro.distributions as dist
from numpyro.infer import SVI, Trace_ELBO
from numpyro_uha import UHAGuide
from numpyro_uha.core import executables
from numpyro_uha._precondition import _scale_corr_inverse

def model(x, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    numpyro.sample("y", dist.Normal(x @ w, s), obs=y)

x = np.linspace(-1.0, 1.0, 60).reshape(20, 3)
y = x @ np.array([0.5, -1.0, 2.0]) + 0.3 * np.cos(np.arange(20.0))
guide = UHAGuide(model, K=2, warm_start_steps=30)
svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
params = svi.get_params(svi.init(jax.random.PRNGKey(0), x, y))
# a cached step called under a JAX transform (the Cholesky parameter's inverse, traced)
chol = np.linalg.cholesky(np.array([[2.0, 0.3], [0.3, 1.0]]))
traced = jax.jit(lambda c: _scale_corr_inverse(c, jnp.eye(2), host=True))(chol)
eager = _scale_corr_inverse(chol, jnp.eye(2), host=True)
print("RESULT", json.dumps({
    "params": {k: np.asarray(v).tolist() for k, v in params.items()},
    "start_elbo": guide._start_elbo, "stats": executables.stats,
    "traced": np.asarray(traced).tolist(), "eager": np.asarray(eager).tolist(),
}))
"""


def _child(cache, jax_cache=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_PERSISTENT_CACHE")}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    if jax_cache is not None:
        env["JAX_COMPILATION_CACHE_DIR"] = str(jax_cache)
    env["NUMPYRO_UHA_CACHE_DIR"] = str(cache)
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env,
        timeout=600, check=False,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(out.stderr[-3000:])


def test_a_later_process_loads_the_steps_and_computes_the_same(tmp_path):
    cache = tmp_path / "cache"
    first = _child(cache)
    files = sorted(p.name for p in cache.iterdir())
    assert first["stats"]["loaded"] == 0 and first["stats"]["failed"] == 0
    # every model-free step of the setup was compiled through the cache and written
    assert first["stats"]["compiled"] >= 20 and len(files) == first["stats"]["compiled"]
    second = _child(cache)
    assert second["stats"] == {"compiled": 0, "loaded": first["stats"]["compiled"], "failed": 0}
    assert sorted(p.name for p in cache.iterdir()) == files  # nothing new written
    # the same start, bit for bit, and the same as with the cache off
    off = _child("")
    assert off["stats"] == {"compiled": 0, "loaded": 0, "failed": 0}
    for other in (second, off):
        assert other["start_elbo"] == first["start_elbo"]
        assert other["params"] == first["params"]
    # a cached step under jax.jit is traced into the caller's program, as jit's is
    np.testing.assert_allclose(first["traced"], first["eager"], rtol=1e-6)


def test_the_cache_stands_aside_when_jaxs_own_cache_is_on(tmp_path):
    result = _child(tmp_path / "ours", jax_cache=tmp_path / "jax")
    assert result["stats"] == {"compiled": 0, "loaded": 0, "failed": 0}
    assert not (tmp_path / "ours").exists()


def _step(x, n):
    return jnp.cumsum(x[:n] ** 2) * 0.5


def test_the_key_separates_programs_and_a_damaged_file_is_compiled_again(tmp_path, monkeypatch):
    monkeypatch.setattr(executables, "stats", {"compiled": 0, "loaded": 0, "failed": 0})
    jitted = jax.jit(_step, static_argnums=(1,))
    x3, x4 = jnp.arange(3.0), jnp.arange(4.0)

    def run(x, n, options=None, fn=jitted):
        exe = executables.load_or_compile(fn, (x, n), tmp_path, options)
        return np.asarray(exe(x))

    np.testing.assert_array_equal(run(x3, 2), _step(x3, 2))
    np.testing.assert_array_equal(run(x4, 2), _step(x4, 2))  # another shape
    np.testing.assert_array_equal(run(x4, 3), _step(x4, 3))  # another static argument
    options = {"xla_backend_optimization_level": 0}
    quick = jax.jit(_step, static_argnums=(1,), compiler_options=options)
    np.testing.assert_array_equal(run(x4, 3, options, quick), _step(x4, 3))  # other options
    assert executables.stats == {"compiled": 4, "loaded": 0, "failed": 0}
    assert len(list(tmp_path.iterdir())) == 4
    np.testing.assert_array_equal(run(x4, 3), _step(x4, 3))
    assert executables.stats["loaded"] == 1
    # another machine's or version's file is never read: the environment is in the key
    here = executables._environment()
    monkeypatch.setattr(executables, "_fingerprint", "jax 0.0.0 on another machine")
    np.testing.assert_array_equal(run(x4, 3), _step(x4, 3))
    assert executables.stats == {"compiled": 5, "loaded": 1, "failed": 0}
    monkeypatch.setattr(executables, "_fingerprint", here)
    # a damaged file: compiled again, the result right, the file replaced by a good one
    for path in tmp_path.iterdir():
        path.write_bytes(b"not an executable")
    np.testing.assert_array_equal(run(x3, 2), _step(x3, 2))
    assert executables.stats == {"compiled": 6, "loaded": 1, "failed": 1}
    np.testing.assert_array_equal(run(x3, 2), _step(x3, 2))
    assert executables.stats == {"compiled": 6, "loaded": 2, "failed": 1}


def test_a_damaged_executable_is_never_handed_to_xla(tmp_path, monkeypatch):
    # a file whose pickle is intact but whose executable bytes are damaged killed the
    # process inside XLA (an illegal instruction, an LLVM abort) in a later run, and
    # every run after it: the file's checksum is checked before XLA sees its bytes
    monkeypatch.setattr(executables, "stats", {"compiled": 0, "loaded": 0, "failed": 0})
    seen = []
    load = executables.serialize_executable.deserialize_and_load

    def recording(payload, *trees, **kwargs):
        seen.append(bytes(payload))
        return load(payload, *trees, **kwargs)

    monkeypatch.setattr(executables.serialize_executable, "deserialize_and_load", recording)
    jitted = jax.jit(_step, static_argnums=(1,))
    x3 = jnp.arange(3.0)

    def run():
        exe = executables.load_or_compile(jitted, (x3, 2), tmp_path, None, call="_step")
        return np.asarray(exe(x3))

    run()
    (path,) = tmp_path.iterdir()
    stored = path.read_bytes()
    payload = pickle.loads(stored[len(executables._MAGIC) + 32:])[0]
    at = stored.index(payload) + len(payload) // 2  # inside the executable's own bytes
    damaged = stored[:at] + bytes(b ^ 0xFF for b in stored[at:at + 16]) + stored[at + 16:]
    pickle.loads(damaged[len(executables._MAGIC) + 32:])  # the pickle itself still loads
    path.write_bytes(damaged)
    np.testing.assert_array_equal(run(), _step(x3, 2))
    assert seen == [] and executables.stats == {"compiled": 2, "loaded": 0, "failed": 1}
    assert path.read_bytes() != damaged  # written anew, whole
    np.testing.assert_array_equal(run(), _step(x3, 2))
    assert len(seen) == 1 and executables.stats["loaded"] == 1


def test_the_key_holds_the_versions_of_the_packages_the_steps_trace(tmp_path, monkeypatch):
    # the steps run optax's and NumPyro's code when traced: an executable an older optax
    # traced must not be loaded under a newer one
    counts = {"compiled": 0, "loaded": 0, "failed": 0}
    monkeypatch.setattr(executables, "stats", counts)
    jitted = jax.jit(_step, static_argnums=(1,))
    x3 = jnp.arange(3.0)

    def run():
        executables.load_or_compile(jitted, (x3, 2), tmp_path, None, call="_step")

    run()
    run()
    assert counts == {"compiled": 1, "loaded": 1, "failed": 0}
    for name in executables.TRACED_PACKAGES:
        version = executables._package_version(name)
        assert f"{name} {version}" in executables._environment()
        monkeypatch.setattr(executables, "_fingerprint", None)
        monkeypatch.setattr(
            executables, "_package_version",
            lambda n, name=name, real=executables._package_version: (
                "0.0.0" if n == name else real(n)
            ),
        )
        run()
        monkeypatch.undo()
        monkeypatch.setattr(executables, "stats", counts)
    assert counts == {"compiled": 1 + len(executables.TRACED_PACKAGES), "loaded": 1, "failed": 0}
    assert executables._package_version("optax") not in ("unknown", "0.0.0")


def test_the_fast_key_names_the_call_its_sources_and_jax_options(tmp_path, monkeypatch):
    # the steps' files are keyed without lowering them (a later process then traces
    # nothing to load them): by the call's description, this package's sources and the
    # JAX options that change tracing; a change to any of them compiles anew
    monkeypatch.setattr(executables, "stats", {"compiled": 0, "loaded": 0, "failed": 0})
    jitted = jax.jit(_step, static_argnums=(1,))
    x3 = jnp.arange(3.0)

    def run(call):
        exe = executables.load_or_compile(jitted, (x3, 2), tmp_path, None, call=call)
        return np.asarray(exe(x3))

    np.testing.assert_array_equal(run("_step 2 f32[3]"), _step(x3, 2))
    np.testing.assert_array_equal(run("_step 2 f32[3]"), _step(x3, 2))
    assert executables.stats == {"compiled": 1, "loaded": 1, "failed": 0}
    run("_step 2 f32[4]")  # another call
    assert executables.stats["compiled"] == 2
    assert executables._source_digest() is not None
    monkeypatch.setattr(executables, "_digest", ["an edited package"])
    run("_step 2 f32[3]")
    assert executables.stats["compiled"] == 3
    monkeypatch.setattr(executables, "_digest", [None])  # sources unreadable: lowered text
    run("_step 2 f32[3]")
    run("_step 2 f32[3]")
    assert executables.stats == {"compiled": 4, "loaded": 2, "failed": 0}
    monkeypatch.undo()
    monkeypatch.setattr(executables, "stats", {"compiled": 0, "loaded": 0, "failed": 0})
    with jax.default_matmul_precision("highest"):  # a JAX option in the key
        run("_step 2 f32[3]")
    assert executables.stats == {"compiled": 1, "loaded": 0, "failed": 0}
    assert len(list(tmp_path.iterdir())) == 5


def test_the_folder_is_chosen_by_environment_and_override(monkeypatch, tmp_path):
    monkeypatch.setattr(executables, "_dir_override", executables._UNSET)
    monkeypatch.setenv("NUMPYRO_UHA_CACHE_DIR", str(tmp_path))
    assert executables.cache_dir() == tmp_path
    monkeypatch.setenv("NUMPYRO_UHA_CACHE_DIR", "")
    assert executables.cache_dir() is None
    monkeypatch.delenv("NUMPYRO_UHA_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert executables.cache_dir() == tmp_path / "xdg" / "numpyro_uha" / "executables"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert executables.cache_dir() == tmp_path / "home" / ".cache" / "numpyro_uha" / "executables"
    monkeypatch.setattr(executables.os.path, "expanduser", lambda path: path)  # no home known
    assert executables.cache_dir() is None
    executables.set_cache_dir(None)
    assert executables.cache_dir() is None
    executables.set_cache_dir(tmp_path / "mine")
    assert executables.cache_dir() == tmp_path / "mine"


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_other_backends_are_not_cached(platform):
    assert executables.active(platform) is None


def test_processes_of_jax_distributed_are_not_cached(monkeypatch, tmp_path):
    # (a program of a multi-process run spans every process's devices: a loaded one
    # failed there, "CopyArrays only supports destination device list of the same size")
    monkeypatch.setattr(executables, "_dir_override", tmp_path)
    monkeypatch.setattr(executables, "_jax_cache_on", lambda: False)  # as outside the tests
    assert executables.active("cpu") == tmp_path
    monkeypatch.setattr(executables.jax, "process_count", lambda: 2)
    assert executables.active("cpu") is None


_LOADER_CHILD = r"""
import sys
import jax, jax.numpy as jnp
from jax.experimental import serialize_executable
from numpyro_uha.core import executables

def step(x, n):
    return jnp.cumsum(x[:n] ** 2) * 0.5

folder, x = sys.argv[1], jnp.arange(4.0)
jitted = jax.jit(step, static_argnums=(1,))
executables.load_or_compile(jitted, (x, 3), executables.Path(folder))  # compiled, written
raw = serialize_executable.serialize(jitted.lower(x, 3).compile())

def phase(name, load):
    print(f"PHASE {name}", file=sys.stderr, flush=True)
    exe = load()
    assert float(exe(x)[-1]) == 2.5
    print(f"END {name}", file=sys.stderr, flush=True)

phase("raw", lambda: serialize_executable.deserialize_and_load(*raw))
phase("cache", lambda: executables.load_or_compile(jitted, (x, 3), executables.Path(folder)))
phase("raw_after", lambda: serialize_executable.deserialize_and_load(*raw))
print("LOADED", executables.stats["loaded"], file=sys.stderr, flush=True)
"""


def test_loading_from_the_cache_prints_no_loader_alarm_and_the_log_level_comes_back(tmp_path):
    """XLA:CPU's loader logs a "could lead to ... SIGILL" error for every executable
    compiled on this very host on some CPUs (tuning flags it cannot see on the host side).
    Loads from the cache are silent; a load outside it, after, logs as before."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    for name in ("TF_CPP_MIN_LOG_LEVEL", "JAX_COMPILATION_CACHE_DIR"):
        env.pop(name, None)  # JAX's own cache (the suite's) would log its loads too
    out = subprocess.run([sys.executable, "-c", _LOADER_CHILD, str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=300, check=True)

    def logged(name):
        block = out.stderr.split(f"PHASE {name}\n", 1)[1].split(f"END {name}\n", 1)[0]
        return [line for line in block.splitlines() if "cpu_aot_loader" in line]

    assert "LOADED 1" in out.stderr, out.stderr[-2000:]
    raw = logged("raw")
    if not raw:
        pytest.skip("XLA's loader logs nothing on this host: nothing to silence")
    assert logged("cache") == []
    assert len(logged("raw_after")) == len(raw)  # the process's level is back


def test_the_quiet_loader_counts_nested_loads_and_puts_the_process_level_back(monkeypatch):
    levels = []
    monkeypatch.setattr(executables, "_set_log_level", levels.append)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    with executables._QuietLoader():
        with executables._QuietLoader():  # a second thread's load, inside the first
            pass
        assert levels == [3]  # still quiet: the first load has not finished
    assert levels == [3, 2]
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    jax.config.update("jax_logging_level", "ERROR")
    try:
        with executables._QuietLoader():
            pass
    finally:
        jax.config.update("jax_logging_level", "NOTSET")
    assert levels == [3, 2, 3, 2]  # JAX's own setting wins over the environment
    with executables._QuietLoader():
        pass
    assert levels == [3, 2, 3, 2, 3, 0]
