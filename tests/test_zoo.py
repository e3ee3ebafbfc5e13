"""The model zoo (benchmarks/zoo.py, benchmarks/zoo_models.py): its smoke run, and its
cached NUTS references (no NUTS runs here)."""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from benchmark_smoke import ROOT, run_smoke
from numpyro import handlers
from numpyro.distributions import biject_to
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import log_density, potential_energy

sys.path.insert(0, str(ROOT))
from benchmarks.zoo import HOLDOUT_REFERENCE_DIR, MAX_RHAT, MIN_ESS, REFERENCE_DIR, load_reference  # noqa: E402
from benchmarks.zoo_holdout import HOLDOUT  # noqa: E402
from benchmarks.zoo_models import ZOO  # noqa: E402

NAMES = sorted(ZOO)


def _latent_supports(model, args):
    traced = handlers.substitute(handlers.seed(model, 0), substitute_fn=init_to_uniform)
    tr = handlers.trace(traced).get_trace(*args)
    return {
        name: (site["fn"].support, jnp.shape(site["value"]))
        for name, site in tr.items()
        if site["type"] == "sample" and not site["is_observed"]
    }


def test_zoo_has_twenty_models():
    assert len(ZOO) >= 20


@pytest.mark.slow  # ~70 s on 2 cores: four guides on three models
def test_zoo_smoke(tmp_path):
    run_smoke("zoo", tmp_path)
    payload = json.loads((tmp_path / "smoke.json").read_text())
    assert {r["guide"] for r in payload["runs"]} == {"UHAGuide", "AutoNormal", "AutoMultivariateNormal", "AutoDAIS"}
    for run in payload["runs"]:
        assert run["status"] in ("ok", "nan", "error")
        if run["status"] == "error":
            assert run["error_type"] and run["error"]
        else:
            assert run["max_mean_err"] is None or np.isfinite(run["max_mean_err"])


@pytest.mark.parametrize("name", NAMES)
def test_reference_exists_and_is_good(name):
    moments, record = load_reference(name)
    assert moments is not None, f"no NUTS reference for {name} in {REFERENCE_DIR}"
    assert record["max_rhat"] <= MAX_RHAT, record["max_rhat"]
    assert record["min_ess_bulk"] >= MIN_ESS, record["min_ess_bulk"]
    assert record["ok"]
    assert record["command"].startswith("python -m benchmarks.zoo --nuts")
    assert record["settings"]["chains"] >= 4 and record["settings"]["samples"] >= 2000


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.slow
def test_log_density_finite_at_reference_median(name):
    """At NUTS's posterior median, taken coordinate-wise in unconstrained space (the
    constrained median for scalar sites; a point of the support for simplex and LKJ
    sites, whose coordinate-wise constrained median is not), the model's log density and
    potential energy are finite."""
    entry = ZOO[name]
    moments, _ = load_reference(name)
    supports = _latent_supports(entry.model, entry.args)
    assert set(moments) == set(supports)
    data = np.load(REFERENCE_DIR / f"{name}.npz")
    unconstrained, median = {}, {}
    for k, (support, shape) in supports.items():
        draws = jnp.asarray(data[f"draws/{k}"], jnp.float32)
        assert draws.shape[2:] == shape, (k, draws.shape, shape)
        draws = draws.reshape((-1,) + shape)
        t = biject_to(support)
        unconstrained[k] = jnp.median(t.inv(draws), axis=0)
        median[k] = t(unconstrained[k])
        assert bool(jnp.all(support(median[k]))), f"{name}: the median of {k} is outside its support"
        if not shape:
            np.testing.assert_allclose(median[k], moments[k][2], rtol=0, atol=0.1 * float(moments[k][1]))
    # one compiled program each (op by op, every operation of the model would be compiled)
    log_joint = jax.jit(lambda v: log_density(entry.model, entry.args, {}, v)[0])(median)
    assert np.isfinite(float(log_joint)), f"{name}: log density {log_joint} at the NUTS median"
    energy = jax.jit(lambda u: potential_energy(entry.model, entry.args, {}, u))(unconstrained)
    assert np.isfinite(float(energy)), f"{name}: potential energy {energy} at the NUTS median"


# ------------------------------------------------------------------- the hold-out set
HOLDOUT_NAMES = sorted(HOLDOUT)


def test_holdout_has_eleven_models_outside_the_zoo():
    assert len(HOLDOUT) == 11
    assert not set(HOLDOUT) & set(ZOO)
    assert not {m.model for m in HOLDOUT.values()} & {m.model for m in ZOO.values()}


@pytest.mark.parametrize("name", HOLDOUT_NAMES)
def test_holdout_reference_loads_and_is_good(name):
    moments, record = load_reference(name, "holdout")
    assert moments is not None, f"no NUTS reference for {name} in {HOLDOUT_REFERENCE_DIR}"
    assert record["ok"] and record["max_rhat"] <= MAX_RHAT and record["min_ess_bulk"] >= MIN_ESS, record
    assert record["command"].startswith("python -m benchmarks.zoo") and "--set holdout" in record["command"]
    assert "--nuts" in record["command"]
    assert record["settings"]["chains"] >= 4 and record["settings"]["samples"] >= 2000
    assert load_reference(name)[0] is None  # not in the zoo's references


@pytest.mark.parametrize("name", HOLDOUT_NAMES)
@pytest.mark.slow
def test_holdout_log_density_finite_at_reference_mean(name):
    """At NUTS's posterior mean (constrained space: every hold-out support is convex, so
    the mean lies in it) the model's log density and potential energy are finite."""
    entry = HOLDOUT[name]
    moments, _ = load_reference(name, "holdout")
    supports = _latent_supports(entry.model, entry.args)
    assert set(moments) == set(supports)
    data = np.load(HOLDOUT_REFERENCE_DIR / f"{name}.npz")
    mean, unconstrained = {}, {}
    for k, (support, shape) in supports.items():
        assert data[f"draws/{k}"].shape[2:] == shape, (k, data[f"draws/{k}"].shape, shape)
        mean[k] = jnp.asarray(moments[k][0], jnp.float32)
        assert mean[k].shape == shape
        assert bool(jnp.all(support(mean[k]))), f"{name}: the mean of {k} is outside its support"
        unconstrained[k] = biject_to(support).inv(mean[k])
    # one compiled program each (op by op, every operation of the model would be compiled)
    log_joint = jax.jit(lambda v: log_density(entry.model, entry.args, {}, v)[0])(mean)
    assert np.isfinite(float(log_joint)), f"{name}: log density {log_joint} at the NUTS mean"
    energy = jax.jit(lambda u: potential_energy(entry.model, entry.args, {}, u))(unconstrained)
    assert np.isfinite(float(energy)), f"{name}: potential energy {energy} at the NUTS mean"


def test_the_fit_checks_are_told_apart_by_kind_and_phrase(fitted_conjugate_warnings):
    """benchmarks.zoo records which fit checks spoke: the guide's real warnings (the
    draws' checks are UHADrawsOffWarning, worse-than-start UHAWorseThanStartWarning, both
    kinds of UHAFitWarning) are tagged, and such runs count as warned."""
    from benchmarks.zoo import _fit_warned, fit_checks

    log = fitted_conjugate_warnings
    names = sorted({w.category.__name__ for w in log})
    assert names == ["UHADrawsOffWarning", "UHAWorseThanStartWarning"]
    assert fit_checks(log) == ["mean_shift", "worse_than_start"]
    assert _fit_warned({"warnings": names})
    assert not _fit_warned({"warnings": ["UHAMemoryMapWarning"]})


@pytest.fixture(scope="module")
def fitted_conjugate_warnings():
    """The conjugate model's fitted guide, q's mean moved 0.6 sd (the draws' mean check
    speaks), then judged against a start placed above its ELBO (worse than start)."""
    import warnings

    import conjugate_model as cm

    guide, params = cm.fit_guide()
    moved = cm.mean_moved(params)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        draws = guide.sample_posterior_with_log_weights(
            jax.random.PRNGKey(1), moved, cm.Y, sample_shape=(1000,)
        )
        guide._start_elbo = (float(np.mean(draws.log_weights)) + 5.0, 1e-3)
        guide.warn_if_worse_than_start(draws.log_weights)
    return caught
