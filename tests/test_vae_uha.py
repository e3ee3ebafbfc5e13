"""The VAE benchmark's UHA rows (benchmarks/vae.py): the reported test ELBO is what
``UHALocalGuide.log_weights`` computes, and the paper's row trains the decoder and UHA's
ε, η, β, Σ with the encoder (and the frozen groups) left exactly as they started."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import vae as V  # noqa: E402

TINY = V.Architecture(data_dim=6, latent_dim=2, hidden=5)


def _toy_data(n_train=200, dim=TINY.data_dim):
    images = jax.random.uniform(jax.random.PRNGKey(0), (n_train, dim))

    def binary(seed, n):
        return (jax.random.uniform(jax.random.PRNGKey(seed), (n, dim)) < 0.4).astype(jnp.float32)

    return V.VAEData("toy", images, binary(1, 10), binary(2, 12), images.mean(0))


def _init(data):
    return V.init_params(jax.random.PRNGKey(3), TINY, data.pixel_mean)


# Marked slow (40-50 s each on 2 cores, training the benchmark's rows) to keep the default
# suite short; run with `pytest -m slow`.
@pytest.mark.slow
def test_uha_row_test_elbo_is_the_mean_of_the_guides_log_weights():
    data = _toy_data()
    K, S = 3, 5
    options = V.TrainOptions(epochs=2, batch_size=20, lr=1e-2)
    result = V.train_uha(jax.random.PRNGKey(0), data, TINY, K, options, _init(data))
    guide = result.aux["guide"]
    assert guide.K == K and result.params["local_beta_logits"].shape == (K + 1,)
    key = jax.random.PRNGKey(7)
    row = V._uha_bound_eval(key, result, data.test, K, S)
    # The evaluator's key for the (single) chunk of test images; num_data = the chunk.
    log_w = np.asarray(guide.log_weights(
        jax.random.fold_in(jax.random.fold_in(key, 0), 0), result.params, data.test,
        data.test.shape[0], num_samples=S,
    ), np.float64)
    assert log_w.shape == (S, data.test.shape[0]) and np.all(np.isfinite(log_w))
    per_image = log_w.mean(axis=0)
    np.testing.assert_allclose(row["test_elbo"], per_image.mean(), rtol=1e-5)
    np.testing.assert_allclose(row["test_bound"], per_image.mean(), rtol=1e-5)
    np.testing.assert_allclose(row["test_elbo_se"], per_image.std(ddof=1) / np.sqrt(len(per_image)), rtol=1e-4)
    np.testing.assert_allclose(row["_bound_per_image"], per_image, rtol=1e-5)
    np.testing.assert_allclose(row["test_is_log_lik"], V.logmeanexp(log_w, axis=0).mean(), rtol=1e-5)
    # The row's ELBO is the UHA bound, not q's plain ELBO (which it reports separately).
    assert abs(row["q_elbo"] - row["test_elbo"]) > 1e-3
    # Chunking the test images gives the same per-image bound as one chunk (keys aside):
    # the evaluator does not mix images across chunks.
    two = V.uha_log_weights(key, guide, result.params, data.test, 200, batch=5)
    one = V.uha_log_weights(key, guide, result.params, data.test, 200, batch=12)
    assert two.shape == one.shape == (200, 12)
    np.testing.assert_allclose(two.mean(0), one.mean(0), atol=6 * one.std(0).max() / np.sqrt(200))


def _changed(a, b):
    return not np.array_equal(np.asarray(a), np.asarray(b))


# Marked slow (40-50 s each on 2 cores, training the benchmark's rows) to keep the default
# suite short; run with `pytest -m slow`.
@pytest.mark.slow
def test_paper_uha_row_freezes_the_encoder_and_the_untuned_groups():
    data = _toy_data()
    init = _init(data)
    options = V.TrainOptions(epochs=3, batch_size=20, lr=1e-2)
    result = V.train_uha(jax.random.PRNGKey(0), data, TINY, 4, options, init)
    assert result.best_epoch > 0, result.validation  # the kept parameters are trained ones
    params = result.params
    for name in init:
        if name.startswith("encoder_"):
            np.testing.assert_array_equal(params[name], init[name], err_msg=name)
    assert all(_changed(params[n], init[n]) for n in init if n.startswith("decoder_"))
    for name in ("local_step_size", "local_damping", "local_momentum_scale", "local_beta_logits"):
        assert _changed(params[name], result.aux["guide"]._init_values[name[len("local_"):]]), name
    assert 0 < float(params["local_step_size"]) < V.UHA_MAX_STEP_SIZE
    # The groups the paper does not tune stay at their initial values.
    np.testing.assert_array_equal(params["local_step_size_slope"], 0.0)
    for name in ("local_bridge_loc_slope", "local_bridge_log_scale_slope"):
        np.testing.assert_array_equal(params[name], np.zeros(TINY.latent_dim), err_msg=name)
    np.testing.assert_allclose(params["local_drift_scale"], np.ones(TINY.latent_dim), rtol=1e-6)

    # The second row trains the encoder too, from the same start.
    trained = V.train_uha(jax.random.PRNGKey(0), data, TINY, 4, options, init, train_encoder=True)
    assert all(_changed(trained.params[n], init[n]) for n in init if n.startswith("encoder_"))


def test_uha_rows_use_the_iwae_seeds_and_are_registered():
    assert set(V.METHODS) >= {"vae", "iwae", "uha", "uha_enc"}
    assert V.SEED_AS["uha"] == V.SEED_AS["uha_enc"] == "iwae"
    assert V.resolve_args(["--quick"]).methods == ["vae", "iwae", "uha", "uha_enc"]


def test_uha_initial_step_size_is_an_option():
    assert V.resolve_args(["--quick"]).uha_init_step_size == 0.02
    args = V.resolve_args(["--quick", "--uha-init-step-size", "0.04"])
    assert args.uha_init_step_size == 0.04
    _, guide = V.make_uha_guide(TINY, 3, None, args.uha_init_step_size)
    assert guide.init_step_size == 0.04 and guide.max_step_size == V.UHA_MAX_STEP_SIZE == 0.05
    assert guide.frozen == frozenset(V.UHA_FROZEN)


def test_uha_optimizer_rates_and_the_guide_rate_decay():
    """Adam with a constant gradient moves each coordinate by its rate per step: the
    decoder at lr, the guide's own parameters at lr × scale (decaying to lr × scale ×
    decay over num_steps), the frozen encoder not at all."""
    params = {"decoder_w": jnp.ones(3), "encoder_w": jnp.ones(3), "local_step_size": jnp.ones(())}
    grads = jax.tree.map(jnp.ones_like, params)
    lr, scale, decay, num_steps = 1e-3, 10.0, 0.01, 100
    opt = V.uha_optimizer(lr, scale, param_lr_decay=decay, num_steps=num_steps)
    state = opt.init(params)
    moves = []
    for _ in range(num_steps + 1):
        updates, state = opt.update(grads, state, params)
        moves.append({k: float(jnp.max(jnp.abs(v))) for k, v in updates.items()})
    for step in (0, 50, 100):
        np.testing.assert_allclose(moves[step]["decoder_w"], lr, rtol=1e-3)
        np.testing.assert_allclose(
            moves[step]["local_step_size"], lr * scale * decay ** (step / num_steps), rtol=1e-3
        )
        assert moves[step]["encoder_w"] == 0.0
    constant = V.uha_optimizer(lr, scale)
    updates, _ = constant.update(grads, constant.init(params), params)
    np.testing.assert_allclose(float(updates["local_step_size"]), -lr * scale, rtol=1e-3)
    with pytest.raises(ValueError, match="param_lr_decay"):
        V.uha_optimizer(lr, scale, param_lr_decay=0.0, num_steps=10)


def test_uha_precondition_and_decay_are_options():
    args = V.resolve_args(["--quick"])
    assert args.uha_precondition is False and args.uha_param_lr_decay is None
    args = V.resolve_args(["--quick", "--uha-precondition", "--uha-param-lr-decay", "0.1"])
    assert args.uha_precondition is True and args.uha_param_lr_decay == 0.1
    assert V.make_uha_guide(TINY, 3)[1].precondition is False
    assert V.make_uha_guide(TINY, 3, precondition=True)[1].precondition is True
