"""Sharding over devices and processes (issue 16, item 3).

JAX fixes the device count and the distributed setup when it starts, so each
configuration runs in a subprocess (tests/sharding_worker.py): four forced host CPU
devices, and two processes on localhost with CPU collectives.

Sharded and single-device runs use the same keys (split before sharding), so they compute
the same numbers; XLA may order a reduction differently, so "equal" is to float32
rounding (relative 1e-5), far below any Monte Carlo error of these estimates.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SUITE_XLA_FLAGS

WORKER = Path(__file__).with_name("sharding_worker.py")
RTOL, ATOL = 1e-5, 1e-5


def _run(args, env_extra=None, timeout=240):
    # the run's own XLA_FLAGS replaced (a forced device count would change the worker's
    # configuration); backend optimizations off, as for the suite's other programs
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env_extra = dict(env_extra or {})
    flags = [*SUITE_XLA_FLAGS, env_extra.pop("XLA_FLAGS", "")]
    env.update({"JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(filter(None, flags)), **env_extra})
    return subprocess.Popen(
        [sys.executable, str(WORKER), *map(str, args)], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ), timeout


def _wait(proc_timeout):
    proc, timeout = proc_timeout
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


# The four-device worker (about 70 s: a new JAX process compiling every program twice,
# once per device count) runs on demand (`pytest -m slow`); the default suite keeps the
# two-process test below, which checks sharded log Z across processes.
FOUR_DEVICES_SLOW = pytest.mark.slow


@pytest.fixture(scope="module")
def four_devices(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharding") / "devices.json"
    _wait(_run(["devices", out], {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}))
    return json.loads(out.read_text())


@FOUR_DEVICES_SLOW
def test_four_devices_were_used(four_devices):
    assert four_devices["device_count"] == 4


@FOUR_DEVICES_SLOW
def test_sharded_training_equals_single_device(four_devices):
    single, sharded = four_devices["single"], four_devices["sharded"]
    np.testing.assert_allclose(sharded["losses"], single["losses"], rtol=RTOL, atol=ATOL)


@FOUR_DEVICES_SLOW
def test_sharded_draws_equal_single_device(four_devices):
    single, sharded = four_devices["single"], four_devices["sharded"]
    np.testing.assert_allclose(sharded["w"], single["w"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(sharded["log_weights"], single["log_weights"], rtol=RTOL, atol=ATOL)


@FOUR_DEVICES_SLOW
def test_sharded_estimators_equal_single_device(four_devices):
    single, sharded = four_devices["single"], four_devices["sharded"]
    np.testing.assert_allclose(sharded["log_z"], single["log_z"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(sharded["hais"], single["hais"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(sharded["sandwich"], single["sandwich"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(sharded["bracket"], single["bracket"], rtol=RTOL, atol=ATOL)


@FOUR_DEVICES_SLOW
def test_draws_and_steps_are_partitioned(four_devices):
    """The chains run split over the devices, not replicated on each: a one-chunk call's
    draws come back spread over the four devices, 64 of 256 on each, and XLA compiled
    the training step's model at 2 of the 8 particles per device."""
    assert four_devices["draw_sharding"] == {"num_devices": 4, "shard_shape": [64]}
    # sandwich's reverse chains too: 16 of a chunk of 64 on each device; sandwich and
    # log_z_bracket built only their sharded programs
    assert four_devices["reverse_sharding"] == {"num_devices": 4, "shard_shape": [16]}
    assert four_devices["programs"] == [["bracket", True], ["reverse", True]]
    step = four_devices["step_hlo"]
    assert step["per_device_logits"] > 0 and step["all_particle_logits"] == 0, step


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_compute_the_single_process_log_z(tmp_path):
    """Two processes (jax.distributed on localhost, gloo CPU collectives), one device
    each, shard one log Z estimate's draws between them; both get the estimate one
    process computes alone."""
    port = _free_port()
    procs = [_run(["process", tmp_path / f"p{i}.json", i, 2, port]) for i in range(2)]
    single = _run(["process", tmp_path / "single.json", 0, 1, 0])
    for p in (*procs, single):
        _wait(p)
    results = [json.loads((tmp_path / f"p{i}.json").read_text()) for i in range(2)]
    reference = json.loads((tmp_path / "single.json").read_text())
    for r in results:
        assert r["process_count"] == 2 and r["device_count"] == 2 and r["local_device_count"] == 1
        np.testing.assert_allclose(r["log_z"], reference["log_z"], rtol=RTOL, atol=ATOL)
    assert reference["process_count"] == 1
