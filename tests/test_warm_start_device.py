"""``UHAGuide(warm_start_device=...)``: the warm start's model-free steps on another
device than the model's (on a GPU machine: the host CPU, where the tiny steps compile at
the quick setting). Two forced host CPU devices stand in for the two (a subprocess,
tests/warm_start_device_worker.py, as the flag must be set before JAX starts): a step
left on the wrong device, a result not moved back, or a copy that changes a value fails
here as it would beside a GPU."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import jax
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_uha import UHAGuide
from tests.conftest import SUITE_XLA_FLAGS

WORKER = Path(__file__).with_name("warm_start_device_worker.py")


def _model():
    numpyro.sample("x", dist.Normal(0.0, 1.0))


@pytest.mark.slow
def test_steps_run_on_the_other_device_with_the_same_results(tmp_path):
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["XLA_FLAGS"] = " ".join(["--xla_force_host_platform_device_count=2", *SUITE_XLA_FLAGS])
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(out)], env=env, capture_output=True, text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    default, other = r["default_device"], r["other_device"]
    assert default != other
    # the core: the steps on the other device, the model's rows copied to the default
    # one, the results on the other
    assert r["core_steps_on"] == [other]
    assert r["core_model_rows_on"] == [default]
    assert r["core_result_devices"] == [other]
    # the guide: its steps on the other device, its parameters back on the default one
    # and uncommitted (as without the option)
    assert r["guide_steps_on"] == [other]
    assert r["guide_param_placement"] == [[str([default]), False]]
    if r["same_platform"]:
        # the same programs on the same kind of device: bit for bit the same setup and
        # first training step
        assert r["core_equal"] and r["guide_equal"]
    else:
        # a GPU and its host CPU round differently: the same start ELBO within its
        # Monte Carlo error (4 standard errors of the difference)
        (a, se_a), (b, se_b) = r["start_elbos"]
        assert abs(a - b) < 4 * (se_a**2 + se_b**2) ** 0.5, r["start_elbos"]


@pytest.mark.parametrize("bad", ["no_such_platform", 3, object()])
def test_bad_warm_start_device_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="warm_start_device"):
        UHAGuide(_model, warm_start_device=bad)


def test_a_device_pickles_as_its_platform():
    guide = UHAGuide(_model, warm_start_device=jax.devices()[0])
    copy = pickle.loads(pickle.dumps(guide))
    assert copy.warm_start_device == jax.devices()[0].platform
    assert UHAGuide(_model, warm_start_device="cpu").warm_start_device == "cpu"
