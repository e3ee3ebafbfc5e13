"""A guide's setup clears JAX's caches before the process runs out of memory mappings.

Every compiled CPU program maps memory, JAX keeps every program it compiled, and at
Linux's cap (``vm.max_map_count``) XLA's compiler fails and the process segfaults: a loop
of about 55 ``UHAGuide`` fits in one process did (checked by hand with the cap lowered to
6000: the third fit crashed; with the guard, eight fits ran). The cap cannot be lowered
from a test, so these tests give the guard the counts it reads.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import UHAGuide, UHALocalGuide, UHAMemoryMapWarning
from numpyro_uha import _memory_maps
from numpyro_uha.core import executables


@pytest.fixture
def counts(monkeypatch):
    """Set what the guard reads: (mappings, cap); a fresh 'not warned yet' state."""
    state = {"value": (10, 1000)}
    monkeypatch.setattr(_memory_maps, "_count_and_cap", lambda: state["value"])
    monkeypatch.setattr(_memory_maps, "_warned", False)
    return state


def _compiled_program():
    f = jax.jit(lambda x: jnp.sin(x) * 3.0)
    f(jnp.ones(3))
    assert f._cache_size() == 1
    return f


def test_the_count_is_read_on_linux():
    state = _memory_maps._count_and_cap()
    if state is None:
        pytest.skip("no /proc here")
    count, cap = state
    assert 0 < count < cap


def test_below_the_fraction_nothing_is_cleared(counts):
    f = _compiled_program()
    counts["value"] = (499, 1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not _memory_maps.relieve("here")
    assert f._cache_size() == 1


def test_past_the_fraction_caches_are_cleared_and_the_first_time_warned(counts):
    f = _compiled_program()
    steps = executables.register({"a step's signature": "its executable"})
    counts["value"] = (501, 1000)
    with pytest.warns(UHAMemoryMapWarning, match=r"here: .*501 memory mappings.*jax.clear_caches"):
        assert _memory_maps.relieve("here")
    assert f._cache_size() == 0  # the program is compiled again when next called
    assert steps == {}  # and the warm start's steps held in memory (core/executables.py)
    np.testing.assert_allclose(f(jnp.ones(3)), 3 * np.sin(1.0), rtol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        assert _memory_maps.relieve("here")
    assert f._cache_size() == 0


def _model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    with numpyro.plate("data", y.shape[0]):
        z = numpyro.sample("z", dist.Normal(mu, 1.0))
        numpyro.sample("y", dist.Normal(z, 1.0), obs=y)


@pytest.mark.parametrize(
    "guide_class", [pytest.param(UHAGuide, marks=pytest.mark.slow), UHALocalGuide]
)
def test_a_guide_setup_runs_the_guard_and_still_sets_up(counts, guide_class):
    y = jnp.linspace(-1.0, 1.0, 6)
    f = _compiled_program()
    counts["value"] = (900, 1000)
    guide = guide_class(_model, K=2)
    svi = SVI(_model, guide, optax.adam(1e-3), Trace_ELBO())
    with pytest.warns(UHAMemoryMapWarning, match=guide_class.__name__):
        state = svi.init(jax.random.PRNGKey(0), y)
    assert f._cache_size() == 0
    counts["value"] = (10, 1000)
    _, loss = svi.update(state, y)
    assert np.isfinite(loss)
