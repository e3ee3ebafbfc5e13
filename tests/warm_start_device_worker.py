"""Subprocess side of tests/test_warm_start_device.py: the warm start's model-free steps
on a CPU device (``warm_start_device``) while the model stays on the default device: two
forced host CPU devices (the flag must be set before JAX starts), or on a GPU machine the
GPU and its host. Writes to
``OUT`` (JSON) where the steps ran and whether every result equals the one computed with
everything on the default device.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def model(X, y):
    import numpyro
    import numpyro.distributions as dist

    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    numpyro.sample("y", dist.Normal(X @ w, s), obs=y)


def main(out):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from numpyro.infer import SVI, Trace_ELBO

    from numpyro_uha import UHAGuide
    from numpyro_uha.core import warm_start as ws

    # the model's device (the default) and the steps' (a CPU; on a GPU machine its host)
    default = jax.devices()[0]
    other = [d for d in jax.devices("cpu") if d != default][0]
    result = {"default_device": str(default), "other_device": str(other)}

    # where each model-free step ran: the devices of its arguments as it was called
    ran_on = set()
    on_device = ws._on_device

    def recording(args, static_argnums, device):
        placed = on_device(args, static_argnums, device)
        for x in jax.tree.leaves(placed):
            if isinstance(x, jax.Array):
                ran_on.update(str(d) for d in x.devices())
        return placed

    ws._on_device = recording

    # the core: warm_start on a difference oracle of a Gaussian's log density
    def logdensity(z):
        return -0.5 * jnp.sum(((z - jnp.arange(3.0)) / jnp.array([0.1, 1.0, 10.0])) ** 2)

    program = jax.jit(jax.vmap(jax.value_and_grad(logdensity)))
    model_rows = set()

    def value_and_grad(zs):
        model_rows.update(str(d) for d in zs.devices())
        return program(zs)

    fits = {}
    for name, device in (("default", None), ("other", other)):
        oracle = ws.difference_oracle(value_and_grad, 24, step_device=device)
        fits[name] = ws.warm_start(
            jax.random.PRNGKey(0), None, jnp.zeros(3), 1.0, num_steps=20, oracle=oracle,
        )
    result["core_equal"] = all(
        np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(jax.tree.leaves(fits["default"]), jax.tree.leaves(fits["other"]))
    )
    result["core_result_devices"] = sorted({str(d) for d in fits["other"].loc.devices()})
    result["core_model_rows_on"] = sorted(model_rows)
    result["core_steps_on"] = sorted(ran_on)
    ran_on.clear()

    # the guide: the same setup and first training step with the steps on either device
    rng = np.random.RandomState(0)
    X = rng.randn(40, 3).astype(np.float32)
    y = (X @ np.array([1.0, -0.5, 0.2]) + 0.3 * rng.randn(40)).astype(np.float32)
    runs = {}
    for name, device in (("default", None), ("other", other)):
        guide = UHAGuide(model, K=4, warm_start_steps=50, warm_start_device=device)
        svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
        state = svi.init(jax.random.PRNGKey(1), X, y)
        params = svi.get_params(state)
        state, loss = jax.jit(svi.update)(state, X, y)
        runs[name] = (params, svi.get_params(state), float(loss), guide._start_elbo)
        if device is not None:
            result["guide_param_placement"] = sorted({
                (str(sorted(str(d) for d in v.devices())), bool(v.committed))
                for v in params.values()
            })
    a, b = runs["default"], runs["other"]
    result["guide_equal"] = (
        all(np.array_equal(np.asarray(a[0][k]), np.asarray(b[0][k])) for k in a[0])
        and all(np.array_equal(np.asarray(a[1][k]), np.asarray(b[1][k])) for k in a[1])
        and a[2] == b[2] and a[3] == b[3]
    )
    result["guide_steps_on"] = sorted(ran_on)
    result["start_elbos"] = [a[3], b[3]]  # (ELBO, its standard error) each
    result["same_platform"] = default.platform == other.platform
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
