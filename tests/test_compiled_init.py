"""``numpyro_uha._compiled_init``: NumPyro's initial point through its compiled (batched)
path during ``UHAGuide``'s setup (issue 16, item 1: a fast ``svi.init``).

* within the block, one raw key is searched as a batch of one: the same initial values,
  potential energy and gradient as NumPyro's single-key path;
* a model that cannot be traced (Python control flow on a latent value) falls back to
  the single-key path, with the same result as without the block;
* typed keys pass through unchanged; the function is restored after the block, also
  when the block raises; a nested block keeps the routing;
* ``svi.init`` of ``UHAGuide`` takes the batched path, and its parameters equal those of a
  setup without the block.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import numpyro.infer.util as infer_util
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import initialize_model

import numpyro_uha._compiled_init as compiled_init_module
import numpyro_uha.guide as guide_module
from numpyro_uha import UHAGuide
from numpyro_uha._compiled_init import compiled_initialization


def model(y=jnp.array([0.3, -1.2, 2.0, 0.7])):
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.StudentT(4.0, mu, sigma), obs=y)


def zeta_model():
    """Sites whose trace order is not their sorted order (zeta, alpha, mid)."""
    zeta = numpyro.sample("zeta", dist.Normal(0.0, 1.0))
    alpha = numpyro.sample("alpha", dist.HalfNormal(1.0).expand([3]).to_event(1))
    numpyro.sample("mid", dist.Normal(zeta, alpha.sum()), obs=0.5)


def branching_model():
    x = numpyro.sample("x", dist.Normal(0.0, 1.0))
    if x > 0:  # Python control flow on a latent value: not traceable
        numpyro.factor("f", -x)


def _init(model_fn, key):
    info = initialize_model(key, model_fn, init_strategy=init_to_uniform)
    return info.param_info


def _record_keys(monkeypatch):
    shapes = []
    original = infer_util.find_valid_initial_params

    def recording(rng_key, *args, **kwargs):
        shapes.append(jnp.shape(rng_key))
        return original(rng_key, *args, **kwargs)

    monkeypatch.setattr(infer_util, "find_valid_initial_params", recording)
    return shapes


def _plain_and_routed(monkeypatch, model_fn, key):
    """NumPyro's initialization of ``model_fn`` without and with the block, and the key
    shapes NumPyro's function saw in the routed one."""
    want = _init(model_fn, key)
    shapes = _record_keys(monkeypatch)
    with compiled_initialization():
        got = _init(model_fn, key)
    return want, got, shapes


def test_one_key_is_searched_as_a_batch_of_one_with_the_same_result(monkeypatch):
    want, got, shapes = _plain_and_routed(monkeypatch, zeta_model, jax.random.PRNGKey(3))
    assert shapes == [(1, 2)]  # NumPyro's batched (compiled) path
    assert list(got.z) == list(want.z) == ["zeta", "alpha"]  # the model's order
    assert list(got.z_grad) == list(want.z_grad)
    for name in want.z:
        np.testing.assert_array_equal(got.z[name], want.z[name])
        np.testing.assert_allclose(got.z_grad[name], want.z_grad[name], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.potential_energy, want.potential_energy, rtol=1e-6)
    assert jnp.shape(got.potential_energy) == jnp.shape(want.potential_energy)


def test_an_untraceable_model_falls_back_to_the_single_key_path(monkeypatch):
    want, got, shapes = _plain_and_routed(monkeypatch, branching_model, jax.random.PRNGKey(0))
    assert shapes == [(1, 2), (2,)]  # tried batched, then the single-key path
    np.testing.assert_array_equal(got.z["x"], want.z["x"])


def walk(y):
    """A random walk written as a Python loop: one site written ``len(y)`` times."""
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    prev = 0.0
    for t in range(y.shape[0]):
        prev = numpyro.sample(f"z{t}", dist.Normal(prev, s))
        numpyro.sample(f"y{t}", dist.Normal(prev, 0.5), obs=y[t])


def test_a_program_of_one_site_written_many_times_is_run_op_by_op(monkeypatch):
    # a 20-site Python loop: about 1 900 equations of some 40 distinct operations, which
    # took longer to compile at XLA's lowest level (1.4 ms an equation) than to run op
    # by op (each distinct operation compiled once, 30-50 ms); 60 sites: 7.8 s against
    # 1.4 s. Its search runs op by op, as NumPyro's single-key path; a vectorized model's
    # is compiled
    y = jnp.linspace(-1.0, 1.0, 20)
    key = jax.random.PRNGKey(0)
    want, got, shapes = _plain_and_routed(monkeypatch, lambda: walk(y), key)
    assert shapes == [(1, 2), (2,)]  # traced, measured, then the single-key path
    for name in want.z:
        np.testing.assert_array_equal(got.z[name], want.z[name])
    closed = jax.make_jaxpr(lambda k: initialize_model(k, lambda: walk(y))[0].z)(key)
    assert not compiled_init_module._compiling_pays(closed.jaxpr)
    closed = jax.make_jaxpr(lambda k: initialize_model(k, model)[0].z)(key)
    assert compiled_init_module._compiling_pays(closed.jaxpr)
    _, _, shapes = _plain_and_routed(monkeypatch, model, key)
    assert shapes == [(1, 2)]


def test_a_model_of_many_sites_is_not_traced_to_find_out(monkeypatch):
    # tracing the batched search of a 60-site loop only to run it op by op took 3.4 s
    traced = []
    original = compiled_init_module._run_quick
    monkeypatch.setattr(
        compiled_init_module, "_run_quick", lambda *a: traced.append(1) or original(*a)
    )
    y = jnp.linspace(-1.0, 1.0, compiled_init_module.MAX_SITES)  # one more latent site
    _, _, shapes = _plain_and_routed(monkeypatch, lambda: walk(y), jax.random.PRNGKey(0))
    assert shapes == [(2,)] and traced == []
    y = jnp.linspace(-1.0, 1.0, compiled_init_module.MAX_SITES - 1)  # at the bound: traced
    _plain_and_routed(monkeypatch, lambda: walk(y), jax.random.PRNGKey(0))
    assert traced == [1]


def test_the_decenter_probe_of_a_loop_model_runs_op_by_op_with_the_same_sites(monkeypatch):
    from numpyro_uha import _decenter

    def hierarchy(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        tau = numpyro.sample("tau", dist.HalfNormal(1.0))
        for g in range(y.shape[0]):
            theta = numpyro.sample(f"theta{g}", dist.Normal(mu, tau))
            numpyro.sample(f"y{g}", dist.Normal(theta, 1.0), obs=y[g])

    y = jnp.linspace(-1.0, 1.0, 40)
    compiled = []
    original = _decenter._run_quick

    def recording(*a):
        try:
            out = original(*a)
        except compiled_init_module.OpByOpCheaper:
            compiled.append(False)
            raise
        compiled.append(True)
        return out

    monkeypatch.setattr(_decenter, "_run_quick", recording)
    found = _decenter.find_decenterable(hierarchy, (y,), {})
    assert compiled == [False]
    assert sorted(found) == sorted(f"theta{g}" for g in range(40))


def test_typed_keys_pass_through_and_the_function_is_restored(monkeypatch):
    shapes = _record_keys(monkeypatch)
    patched = infer_util.find_valid_initial_params
    with compiled_initialization():
        _init(model, jax.random.key(1))
        _init(model, jax.random.split(jax.random.key(1), 2))  # typed keys, a batch of 2
        with compiled_initialization():  # nested: still routed, restored once
            assert getattr(infer_util.find_valid_initial_params, "uha_batched", False)
    assert shapes == [(), (2,)]
    assert infer_util.find_valid_initial_params is patched
    with pytest.raises(RuntimeError, match="inside"):
        with compiled_initialization():
            raise RuntimeError("inside")
    assert infer_util.find_valid_initial_params is patched


def test_uha_setup_takes_the_batched_path_with_the_same_parameters(monkeypatch):
    def init_params():
        guide = UHAGuide(zeta_model, K=2, warm_start_steps=30)
        svi = SVI(zeta_model, guide, optax.adam(1e-3), Trace_ELBO())
        params = svi.get_params(svi.init(jax.random.PRNGKey(0)))
        return guide._init_latent, params

    shapes = _record_keys(monkeypatch)
    routed_latent, routed = init_params()
    assert shapes == [(1, 2)]
    # the same setup with the block doing nothing
    monkeypatch.setattr(guide_module, "compiled_initialization", _no_routing)
    plain_latent, plain = init_params()
    assert shapes == [(1, 2), (2,)]
    # the same flat latent layout (sites in the model's order, not sorted by name)
    np.testing.assert_array_equal(routed_latent, plain_latent)
    assert routed.keys() == plain.keys()
    for name in routed:
        np.testing.assert_allclose(routed[name], plain[name], rtol=1e-5, atol=1e-6, err_msg=name)


class _no_routing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_module_names_numpyro_function_it_routes():
    # the routing works through this module attribute: NumPyro's initialize_model
    # looks it up at call time (a NumPyro that moved it would make the block a no-op)
    assert compiled_init_module._infer_util is infer_util
    assert "find_valid_initial_params" in initialize_model.__code__.co_names


class _RecordingJax:
    """``jax`` as ``_compiled_init`` sees it, recording what its ``jit`` compiles."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return getattr(jax, name)

    def jit(self, fn, **options):
        jitted = jax.jit(fn, **options)

        def call(*args):
            self.calls.append((options, args))
            return jitted(*args)

        return call


def test_the_batched_search_is_compiled_quick_with_the_data_as_inputs(monkeypatch):
    # run once: compiled at XLA's lowest CPU level, the model's data an argument of the
    # program (a constant baked into it would be compiled into every instruction using it)
    y = jnp.linspace(-1.0, 2.0, 50)
    recording = _RecordingJax()
    want = _init(lambda: model(y), jax.random.PRNGKey(3))
    monkeypatch.setattr(compiled_init_module, "jax", recording)
    with compiled_initialization():
        got = _init(lambda: model(y), jax.random.PRNGKey(3))
    (options, args), = recording.calls
    assert options == {"compiler_options": compiled_init_module.quick_compiler_options()}
    inputs = jax.tree.leaves(args)
    assert any(jnp.shape(x) == y.shape and np.array_equal(x, y) for x in inputs)
    for name in want.z:
        np.testing.assert_array_equal(got.z[name], want.z[name])
    np.testing.assert_allclose(got.potential_energy, want.potential_energy, rtol=1e-6)


def test_data_traced_with_a_concrete_key_is_searched_inline():
    # svi.init under the user's jit with only the data traced: NumPyro's batched search,
    # traced into the caller's program, with the eager setup's initial values
    y = jnp.array([0.3, -1.2, 2.0, 0.7, 1.1])

    def init(y):
        guide = UHAGuide(model, K=2, warm_start_steps=0)
        svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
        return svi.get_params(svi.init(jax.random.PRNGKey(0), y))

    traced = jax.jit(init)(y)
    eager = init(y)
    assert traced.keys() == eager.keys()
    for name in eager:
        np.testing.assert_allclose(traced[name], eager[name], rtol=1e-5, atol=1e-6, err_msg=name)
