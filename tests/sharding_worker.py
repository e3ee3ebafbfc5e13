"""Subprocess side of tests/test_sharding.py: JAX's device count and distributed setup
are fixed at start-up, so each configuration runs in its own process.

``python tests/sharding_worker.py devices OUT``: under
``XLA_FLAGS=--xla_force_host_platform_device_count=N``, trains the same guide with its
particles on one device and sharded over a mesh of all N, draws and estimates log Z
both ways, and writes the results and what XLA compiled to ``OUT`` (JSON).

``python tests/sharding_worker.py local OUT``: the same for ``UHALocalGuide``, its
minibatch's chains sharded over the devices (one data point's chain per row).

``python tests/sharding_worker.py process OUT PROCESS_ID NUM_PROCESSES PORT``: one of
``NUM_PROCESSES`` processes (``jax.distributed.initialize`` on localhost, CPU
collectives); together they estimate log Z with the draws sharded over every process's
device (``NUM_PROCESSES`` = 1: the single-process reference).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def model(X, y):
    import numpyro
    import numpyro.distributions as dist

    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


def data():
    import numpy as np

    rng = np.random.RandomState(0)
    X = rng.randn(60, 3).astype(np.float32)
    y = (X[:, 0] + 0.5 * rng.randn(60) > 0).astype(np.float32)
    return X, y


def devices(out):
    import numpy as np
    import optax
    from numpyro.infer import SVI, Trace_ELBO

    from numpyro_uha import UHAGuide, shard_particles
    from numpyro_uha.evaluation import hais, log_z, log_z_bracket, sandwich
    from numpyro_uha.evaluation.estimators import _GUIDE_PROGRAMS, _build_reverse, _guide_program
    from numpyro_uha.guide import _split_static

    X, y = data()
    mesh = jax.make_mesh((jax.device_count(),), ("draws",))
    result = {"device_count": jax.device_count()}
    posterior = None  # the single-device run's draws stand in for exact posterior draws
    for name, sharding in (("single", None), ("sharded", mesh)):
        guide = UHAGuide(model, K=4, warm_start_steps=100, sharding=sharding)
        vectorize = True if sharding is None else shard_particles(mesh)
        svi = SVI(model, guide, optax.adam(1e-2),
                  Trace_ELBO(num_particles=8, vectorize_particles=vectorize))
        run = svi.run(jax.random.PRNGKey(0), 30, X, y, progress_bar=False)
        draws = guide.sample_posterior_with_log_weights(
            jax.random.PRNGKey(1), run.params, X, y, sample_shape=(200,)
        )
        est = log_z(guide, jax.random.PRNGKey(2), run.params, X, y, num_draws=300)
        h = hais(guide, jax.random.PRNGKey(3), run.params, X, y, num_draws=256)
        posterior = posterior or {"w": np.asarray(draws.samples["w"])}
        # 200 reverse chains in chunks of 64 (the last one filled up)
        sw = sandwich(guide, jax.random.PRNGKey(4), run.params, posterior, X, y,
                      num_draws=64, batch_size=64)
        br = log_z_bracket(guide, jax.random.PRNGKey(5), run.params, posterior, X, y,
                           num_q_draws=1000, batch_size=256)
        result[name] = {
            "losses": np.asarray(run.losses).tolist(),
            "w": np.asarray(draws.samples["w"]).tolist(),
            "log_weights": np.asarray(draws.log_weights).tolist(),
            "log_z": [est.elbo, est.iw],
            "hais": [h.log_z.elbo, h.log_z.iw],
            "sandwich": [sw.lower.elbo, sw.upper, sw.upper_iw],
            "bracket": [br.lower, br.upper],
        }
        if sharding is not None:
            # where the draws are: a 256-draw call is one chunk, returned as computed
            one_chunk = guide.sample_posterior_with_log_weights(
                jax.random.PRNGKey(1), run.params, X, y, sample_shape=(256,)
            ).log_weights
            result["draw_sharding"] = {
                "num_devices": len(one_chunk.sharding.device_set),
                "shard_shape": list(one_chunk.sharding.shard_shape(one_chunk.shape)),
            }
            # where sandwich's reverse chains run: its program on one chunk of 64
            _, spec = _split_static(((X, y), {}))
            reverse = _guide_program(guide, "reverse", spec, _build_reverse,
                                     corrected=False, sharding=guide.sharding)
            # host inputs: only the program's own constraints split the chains
            chunk = reverse(jax.random.PRNGKey(4), np.arange(64, dtype=np.uint32),
                            np.zeros((64, 3), np.float32), run.params, (X, y))
            result["reverse_sharding"] = {
                "num_devices": len(chunk.sharding.device_set),
                "shard_shape": list(chunk.sharding.shard_shape(chunk.shape)),
            }
            # the programs sandwich and log_z_bracket built: (kind, sharded)
            result["programs"] = sorted({
                (key[0], dict(key[4]).get("sharding") is not None)
                for key in _GUIDE_PROGRAMS[guide] if key[0] in ("reverse", "bracket")
            })
            # what XLA compiled for a training step: the model's logits, (particles, 60)
            state = svi.init(jax.random.PRNGKey(0), X, y)
            text = jax.jit(svi.update).lower(state, X, y).compile().as_text()
            per_device = 8 // jax.device_count()
            result["step_hlo"] = {
                "per_device_logits": len(re.findall(rf"\[{per_device},60\]", text)),
                "all_particle_logits": len(re.findall(r"\[8,60\]", text)),
            }
    Path(out).write_text(json.dumps(result))


def process(out, process_id, num_processes, port):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if num_processes > 1:
        jax.distributed.initialize(
            coordinator_address=f"localhost:{port}", num_processes=num_processes,
            process_id=process_id,
        )
    import optax
    from numpyro.infer import SVI, Trace_ELBO

    from numpyro_uha import UHAGuide
    from numpyro_uha.evaluation import log_z

    X, y = data()
    mesh = jax.make_mesh((jax.device_count(),), ("draws",))
    # no warm start: the test is about the sharded estimate, and each process saves
    # the warm start's compilation (three processes share the CI's two cores)
    guide = UHAGuide(model, K=4, warm_start_steps=0, sharding=mesh)
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    # every process trains the same replicated parameters (same key, same data)
    run = svi.run(jax.random.PRNGKey(0), 30, X, y, progress_bar=False)
    est = log_z(guide, jax.random.PRNGKey(2), run.params, X, y, num_draws=300)
    Path(out).write_text(json.dumps({
        "process_count": jax.process_count(), "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(), "log_z": [est.elbo, est.iw],
    }))


def local(out):
    import jax.numpy as jnp
    import numpy as np
    import numpyro
    import numpyro.distributions as dist
    import optax
    from numpyro.infer import SVI, Trace_ELBO

    from numpyro_uha import UHALocalGuide

    num_data, batch = 24, 8
    x = jnp.asarray(np.random.RandomState(0).randn(num_data).astype(np.float32) * 1.5)

    def local_model(x, batch):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", num_data, subsample_size=batch) as idx:
            z = numpyro.sample("z", dist.Normal(mu, 1.0))
            # 5 observations per data point, so a per-device block is recognizable: [2,5]
            numpyro.sample("x", dist.Normal(z, 0.5).expand([5, batch]), obs=jnp.tile(x[idx], (5, 1)))

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    result = {"device_count": jax.device_count()}
    idx = jnp.arange(8, 16)
    for name, sharding in (("single", None), ("sharded", mesh)):
        guide = UHALocalGuide(local_model, K=3, sharding=sharding)
        svi = SVI(local_model, guide, optax.adam(1e-2), Trace_ELBO())
        run = svi.run(jax.random.PRNGKey(0), 20, x, batch, progress_bar=False)
        draws = guide.sample_posterior(
            jax.random.PRNGKey(1), run.params, x, batch, sample_shape=(16,), subsample_idx=idx
        )
        result[name] = {
            "losses": np.asarray(run.losses).tolist(),
            "z": np.asarray(draws["z"]).tolist(),
            "mu": np.asarray(draws["mu"]).tolist(),
        }
        state = svi.init(jax.random.PRNGKey(0), x, batch)
        text = jax.jit(svi.update, static_argnums=2).lower(state, x, batch).compile().as_text()
        per_device = batch // jax.device_count()
        result[name]["step_hlo"] = {
            "per_device_rows": len(re.findall(rf"\[5,{per_device}\]", text)),
            "all_rows": len(re.findall(rf"\[5,{batch}\]", text)),
        }
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    if sys.argv[1] == "devices":
        devices(sys.argv[2])
    elif sys.argv[1] == "local":
        local(sys.argv[2])
    else:
        process(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
