"""UHALocalGuide's minibatch sharded over devices (issues 15 and 16): four forced host CPU
devices in a subprocess (tests/sharding_worker.py ``local``). Keys are split before
sharding, so sharded and single-device runs compute the same numbers, to float32 rounding.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from test_sharding import ATOL, RTOL, _run, _wait


# The whole file is slow (a 4-device subprocess, about 45 s on 2 cores): test_sharding.py
# checks the same mechanism for UHAGuide in the default suite; run with `pytest -m slow`.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_four_devices(tmp_path_factory):
    out = tmp_path_factory.mktemp("local_sharding") / "local.json"
    _wait(_run(["local", out], {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}))
    return json.loads(out.read_text())


def test_sharded_minibatch_training_and_draws_equal_single_device(local_four_devices):
    result = local_four_devices
    assert result["device_count"] == 4
    single, sharded = result["single"], result["sharded"]
    np.testing.assert_allclose(sharded["losses"], single["losses"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(sharded["z"], single["z"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(sharded["mu"], single["mu"], rtol=RTOL, atol=ATOL)


def test_the_minibatch_chains_are_partitioned(local_four_devices):
    """XLA compiled the sharded training step's model at 2 of the 8 data points per
    device (blocks [5, 2]) and never at all 8; the single-device step at all 8."""
    sharded = local_four_devices["sharded"]["step_hlo"]
    single = local_four_devices["single"]["step_hlo"]
    assert sharded["per_device_rows"] > 0 and sharded["all_rows"] == 0, sharded
    assert single["all_rows"] > 0, single
