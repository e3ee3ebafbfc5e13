"""The VAE benchmark's exact parts (benchmarks/vae.py): the NumPyro model against the plain
JAX log joint, the DReG gradient against the IWAE bound's, Hamiltonian AIS and BDMC on a
tiny Bernoulli model whose log p(x) is computed by quadrature, and the training loop's
early stopping. Monte Carlo checks use fixed seeds and tolerances of a few standard
errors computed from the draws."""

import math
import sys
from pathlib import Path
from statistics import NormalDist

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro import handlers
from numpyro.infer.util import log_density

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import vae as V  # noqa: E402

TINY = V.Architecture(data_dim=6, latent_dim=2, hidden=5)


def tiny_params(seed=0, weight_scale=2.5, arch=TINY):
    """Random parameters: the decoder's weights ``weight_scale`` times Glorot's, so that
    the posterior differs clearly from the prior and from q; the encoder's as initialized
    (q's scales near 1); small random biases instead of zeros."""
    params = V.init_params(jax.random.PRNGKey(seed), arch)
    keys = jax.random.split(jax.random.PRNGKey(seed + 100), len(params))
    out = {}
    for (name, value), key in zip(sorted(params.items()), keys):
        if "_w" in name:
            out[name] = value * (weight_scale if name.startswith("decoder_") else 1.0)
        else:
            out[name] = 0.3 * jax.random.normal(key, value.shape)
    return out


def binary_images(seed, n, dim):
    return (jax.random.uniform(jax.random.PRNGKey(seed), (n, dim)) < 0.4).astype(jnp.float32)


# ---------------------------------------------------------------------------------------
# The NumPyro model and encoder
# ---------------------------------------------------------------------------------------


def test_numpyro_model_log_density_is_the_plain_log_joint():
    arch = V.Architecture(data_dim=7, latent_dim=3, hidden=4)
    params = tiny_params(1, arch=arch)
    x = binary_images(0, 5, 7)
    z = jax.random.normal(jax.random.PRNGKey(2), (5, 3))
    num_data = 40
    model = V.make_vae_model(latent_dim=3, hidden=4)
    decoder = {k: v for k, v in params.items() if k.startswith("decoder_")}
    log_p, trace = log_density(handlers.seed(model, 0), (x, num_data), {}, {**decoder, "z": z})
    expected = num_data / 5 * jnp.sum(V.log_joint(V.decoder_params(params), x, z))
    np.testing.assert_allclose(log_p, expected, rtol=1e-5)
    assert {name for name, site in trace.items() if site["type"] == "param"} == set(decoder)

    guide = V.make_vae_guide(V.make_encoder(latent_dim=3, hidden=4))
    encoder = {k: v for k, v in params.items() if k.startswith("encoder_")}
    log_q, trace = log_density(handlers.seed(guide, 0), (x, num_data), {}, {**encoder, "z": z})
    loc, scale = V.encode(V.encoder_params(params), x)
    np.testing.assert_allclose(log_q, num_data / 5 * jnp.sum(V.gaussian_log_prob(z, loc, scale)), rtol=1e-5)
    assert {name for name, site in trace.items() if site["type"] == "param"} == set(encoder)


def test_registered_initial_values_have_the_pure_jax_shapes():
    arch = V.Architecture(data_dim=7, latent_dim=3, hidden=4)
    x = binary_images(0, 2, 7)
    model = V.make_vae_model(latent_dim=3, hidden=4, pixel_mean=jnp.full(7, 0.25))
    trace = handlers.trace(handlers.seed(model, 0)).get_trace(x, 10)
    reference = V.init_params(jax.random.PRNGKey(0), arch, jnp.full(7, 0.25))
    for name, site in trace.items():
        if site["type"] == "param":
            assert site["value"].shape == reference[name].shape, name
    # The output bias starts at the logit of the mean intensity.
    np.testing.assert_allclose(trace["decoder_b2"]["value"], math.log(0.25 / 0.75), rtol=1e-6)


def test_bad_architecture_is_named():
    with pytest.raises(ValueError, match="latent_dim must be a positive integer"):
        V.init_params(jax.random.PRNGKey(0), V.Architecture(6, 0, 5))
    with pytest.raises(ValueError, match=r"pixel_mean must have shape \(6,\)"):
        V.decoder_initializers(TINY, pixel_mean=np.ones(5) / 2)


# ---------------------------------------------------------------------------------------
# DReG
# ---------------------------------------------------------------------------------------


def _split(tree, prefix):
    return {k: v for k, v in tree.items() if k.startswith(prefix)}


def test_dreg_decoder_gradient_is_the_iwae_bound_gradient_for_the_same_noise():
    params = tiny_params(3)
    x = binary_images(1, 4, TINY.data_dim)
    eps = jax.random.normal(jax.random.PRNGKey(4), (4, 7, TINY.latent_dim))
    grads, bound = V.dreg_gradients(params, x, eps)
    reference = jax.grad(lambda p: jnp.mean(V.iwae_bound(p, x, eps)))(params)
    np.testing.assert_allclose(bound, V.iwae_bound(params, x, eps), rtol=1e-6)
    for name in _split(params, "decoder_"):
        np.testing.assert_allclose(grads[name], reference[name], rtol=2e-5, atol=1e-6, err_msg=name)
    assert set(grads) == set(params)


def _dreg_textbook(params, x, eps):
    """Tucker et al.'s surrogate written out with stop_gradient: the encoder's gradient
    of Σ_k w̃_k² log w_k with q's parameters and the decoder held fixed."""
    stop = jax.lax.stop_gradient
    loc, scale = V.encode(V.encoder_params(params), x)
    z = loc[:, None] + scale[:, None] * eps
    log_w = V.log_joint(stop(V.decoder_params(params)), x[:, None], z) - V.gaussian_log_prob(
        z, stop(loc)[:, None], stop(scale)[:, None]
    )
    w = stop(jax.nn.softmax(log_w, axis=-1))
    return jnp.mean(jnp.sum(w**2 * log_w, axis=-1))


def test_dreg_encoder_gradient_is_the_textbook_surrogate_for_the_same_noise():
    params = tiny_params(5)
    x = binary_images(2, 4, TINY.data_dim)
    eps = jax.random.normal(jax.random.PRNGKey(6), (4, 7, TINY.latent_dim))
    grads, _ = V.dreg_gradients(params, x, eps)
    reference = jax.grad(_dreg_textbook)(params, x, eps)
    for name in _split(params, "encoder_"):
        np.testing.assert_allclose(grads[name], reference[name], rtol=2e-5, atol=1e-6, err_msg=name)


def test_dreg_encoder_gradient_is_unbiased_for_the_iwae_bound_gradient():
    """E[DReG] = ∇_φ E[IWAE bound] = E[plain reparameterized IWAE gradient]: per encoder
    coordinate, the mean difference of the two estimators on the same noise is within
    a Bonferroni-corrected number of its standard errors (family-wise level 1e-3).

    The w̃ → w̃² reweighting is what makes DReG unbiased: the path-only estimator with
    w̃ (the mutation "drop the second w̃") is biased for K > 1 and fails here."""
    params = tiny_params(7)
    x = binary_images(3, 2, TINY.data_dim)
    K, S = 5, 40_000

    def both(key):
        eps = jax.random.normal(key, (2, K, TINY.latent_dim))
        dreg, _ = V.dreg_gradients(params, x, eps)
        iwae = jax.grad(lambda p: jnp.mean(V.iwae_bound(p, x, eps)))(params)
        flat = lambda g: jnp.concatenate([g[k].ravel() for k in sorted(_split(params, "encoder_"))])
        return flat(dreg), flat(iwae)

    dreg, iwae = jax.jit(jax.vmap(both))(jax.random.split(jax.random.PRNGKey(8), S))
    dreg, iwae = np.asarray(dreg, np.float64), np.asarray(iwae, np.float64)
    diff = dreg - iwae
    se = diff.std(axis=0, ddof=1) / math.sqrt(S)
    live = se > 1e-9  # a coordinate with no gradient at all (a dead ReLU unit) has se = 0
    assert live.sum() > 20
    np.testing.assert_array_equal(diff.mean(axis=0)[~live], 0.0)
    t = np.abs(diff.mean(axis=0)[live]) / se[live]
    threshold = NormalDist().inv_cdf(1 - 1e-3 / (2 * live.sum()))
    assert t.max() < threshold, (t.max(), threshold)
    # The reason DReG exists: a smaller variance for the encoder than the plain estimator
    # (here about half of it).
    assert dreg.var(axis=0).sum() < iwae.var(axis=0).sum()


# ---------------------------------------------------------------------------------------
# Hamiltonian AIS and BDMC against quadrature
# ---------------------------------------------------------------------------------------


def quadrature_log_px(params, x, half_width=8.0, num=401):
    """log p(x) = log ∫ N(z; 0, I) Π_j Bernoulli(x_j | decoder(z)) dz for a 2-D z on a
    grid (trapezoid-free Riemann sum, the integrand being negligible at the edges),
    in float64 NumPy, independent of the benchmark's own log density."""
    dec = {k: np.asarray(v, np.float64) for k, v in V.decoder_params(params).items()}
    grid = np.linspace(-half_width, half_width, num)
    za, zb = np.meshgrid(grid, grid, indexing="ij")
    z = np.stack([za.ravel(), zb.ravel()], axis=1)
    logits = np.maximum(z @ dec["w1"] + dec["b1"], 0.0) @ dec["w2"] + dec["b2"]
    log_prior = -0.5 * np.sum(z**2, axis=1) - np.log(2 * np.pi)
    # log σ(l) = -log(1 + e^-l), log(1 - σ(l)) = -log(1 + e^l)
    log_on, log_off = -np.logaddexp(0, -logits), -np.logaddexp(0, logits)
    base = log_prior + 2 * np.log(grid[1] - grid[0]) + log_off.sum(axis=1)
    joint = base + np.asarray(x, np.float64) @ (log_on - log_off).T  # (N, grid points)
    top = joint.max(axis=1, keepdims=True)
    return (top + np.log(np.exp(joint - top).sum(axis=1, keepdims=True)))[:, 0]


def test_quadrature_is_converged():
    """A wider, finer grid changes log p(x) by < 1e-4, far below the AIS tests' Monte
    Carlo errors (0.01 and up)."""
    params = tiny_params(9)
    x = binary_images(5, 3, TINY.data_dim)
    finer = quadrature_log_px(params, x, half_width=10.0, num=1001)
    np.testing.assert_allclose(quadrature_log_px(params, x), finer, atol=1e-4)


def test_hais_recovers_log_px_within_monte_carlo_error():
    """Each HAIS weight is unbiased for p(x): per image, the mean of w / p(x) over the
    chains is 1 within 4 standard errors, p(x) from quadrature. q is the untrained
    encoder's Gaussian, not the posterior: the weights vary (log w has a standard
    deviation near 1 here), and a wrong log density or weight shows as a bias."""
    params = tiny_params(9)
    x = binary_images(5, 4, TINY.data_dim)
    truth = quadrature_log_px(params, x)
    loc, scale = V.encode(V.encoder_params(params), x)
    ais = V.AISOptions(
        num_transitions=100, num_leapfrog_steps=4, step_size=0.25, damping=0.8, num_chains=2000
    )
    log_w, accept = V.ais_log_weights(jax.random.PRNGKey(10), V.decoder_params(params), x, loc, scale, ais)
    assert log_w.shape == (4, 2000) and 0.5 < accept.mean() < 1.0
    ratio = np.exp(log_w.astype(np.float64) - truth[:, None])
    se = ratio.std(axis=1, ddof=1) / math.sqrt(ratio.shape[1])
    assert np.all(np.abs(ratio.mean(axis=1) - 1.0) < 4 * se), (ratio.mean(axis=1), se)
    assert se.max() < 0.05  # the check is sharp: a 20 % bias in p(x) would fail it
    est, mc_se = V.log_likelihood_estimate(log_w)
    np.testing.assert_array_less(np.abs(est - truth), 4 * mc_se)


def test_bdmc_bounds_bracket_the_quadrature_log_px():
    """On images simulated from the decoder, the forward HAIS bound lies below log p(x)
    and the reverse one (from the exact z) above, on average over images (within 4
    standard errors over images); so their gap is positive. A short AIS (5 transitions)
    keeps the bounds apart from log p(x), so each side's check has teeth."""
    params = tiny_params(11)
    ais = V.AISOptions(num_transitions=5, num_leapfrog_steps=2, step_size=0.25, damping=0.8, num_chains=4)
    summary, arrays = V.bdmc(jax.random.PRNGKey(12), params, 200, ais)
    truth = quadrature_log_px(params, arrays["x"])
    lower = V.logmeanexp(arrays["forward_log_w"])
    upper = -V.logmeanexp(-arrays["reverse_log_w"])
    n = len(truth)

    def mean_se(values):
        return values.mean(), values.std(ddof=1) / math.sqrt(n)

    below, below_se = mean_se(truth - lower)
    above, above_se = mean_se(upper - truth)
    assert below > -4 * below_se, (below, below_se)
    assert above > -4 * above_se, (above, above_se)
    assert summary["gap"] > 4 * summary["gap_se"], summary
    np.testing.assert_allclose(summary["lower"], lower.mean(), rtol=1e-6)
    np.testing.assert_allclose(summary["upper"], upper.mean(), rtol=1e-6)
    # The simulated images are draws from the decoder at the returned z.
    assert set(np.unique(arrays["x"])) <= {0.0, 1.0}


def test_ais_options_are_checked_by_name():
    params = tiny_params(0)
    x = binary_images(0, 2, TINY.data_dim)
    with pytest.raises(ValueError, match="damping must be in"):
        V.evaluate_log_likelihood(jax.random.PRNGKey(0), params, x, V.AISOptions(10, 1, 0.1, 1.0, 2))
    with pytest.raises(ValueError, match="num_chains must be a positive integer"):
        V.evaluate_log_likelihood(jax.random.PRNGKey(0), params, x, V.AISOptions(10, 1, 0.1, 0.5, 0))
    with pytest.raises(ValueError, match="schedule must be"):
        V.ais_betas(10, "cosine")


def test_sigmoid_schedule_is_increasing_inside_the_unit_interval():
    betas = V.ais_betas(50, "sigmoid")
    assert betas.shape == (50,) and np.all(np.diff(betas) > 0) and 0 < betas[0] and betas[-1] < 1


# ---------------------------------------------------------------------------------------
# The training loop
# ---------------------------------------------------------------------------------------


def _toy_data(n_train=40, dim=TINY.data_dim):
    images = jax.random.uniform(jax.random.PRNGKey(0), (n_train, dim))
    return V.VAEData("toy", images, binary_images(1, 10, dim), binary_images(2, 10, dim), images.mean(0))


def test_early_stopping_keeps_the_best_parameters_and_stops_after_patience():
    """A fake trainer whose "parameters" are the number of epochs trained and whose
    validation score is read from a table: the loop must keep epoch 2's parameters (the
    best score) and stop once 3 validations in a row have not beaten it."""
    scores = [0.0, 1.0, 3.0, 2.5, 2.9, 2.0, 10.0]  # the score after epoch i
    data = _toy_data(40)  # 4 steps of 10 images per epoch

    def step(state, x_batch):
        assert x_batch.shape == (10, TINY.data_dim)
        return state + 1, jnp.float32(0.0)

    def get_params(state):
        return {"epochs": jnp.asarray(state // 4)}

    def validate(params):
        return scores[int(params["epochs"])]

    options = V.TrainOptions(epochs=6, batch_size=10, patience=3)
    result = V.train_loop(jax.random.PRNGKey(0), data, options, step, 0, get_params, validate)
    assert result.best_epoch == 2 and int(result.params["epochs"]) == 2
    # Epochs 3, 4 and 5 do not beat 3.0, so epoch 6 (which would score 10) never runs.
    assert result.epochs_run == 5 and len(result.epoch_seconds) == 5
    assert result.validation == [(e, scores[e]) for e in range(6)]


@pytest.mark.slow  # ~20 s; the smoke run trains every method too
def test_training_improves_the_validation_bound():
    data = _toy_data(200)
    options = V.TrainOptions(epochs=3, batch_size=20, lr=1e-2)
    vae = V.train_vae(jax.random.PRNGKey(0), data, TINY, options)
    iwae = V.train_iwae(jax.random.PRNGKey(1), data, TINY, 4, options, init=vae.params)
    for result in (vae, iwae):
        first, best = result.validation[0][1], max(s for _, s in result.validation)
        assert best > first + 0.1, result.validation
        assert result.epochs_run == 3 and len(result.train_objective) == 3


def test_bad_training_options_are_named():
    data = _toy_data()
    with pytest.raises(ValueError, match=r"batch_size must be an integer in \[1, 40\]"):
        V.train_iwae(jax.random.PRNGKey(0), data, TINY, 2, V.TrainOptions(epochs=1, batch_size=41))
    with pytest.raises(ValueError, match="K must be a positive integer"):
        V.train_iwae(jax.random.PRNGKey(0), data, TINY, 0, V.TrainOptions(epochs=1, batch_size=10))
    with pytest.raises(ValueError, match="test_subset must be in"):
        V.load_vae_data("digits", test_subset=1000)
    with pytest.raises(ValueError, match="dataset must be"):
        V.load_vae_data("cifar")


def test_a_quick_run_does_not_take_a_real_runs_default_name():
    """``--quick`` without ``--name`` writes ``vae_<dataset>_quick``, not the committed
    ``vae_<dataset>`` results of a real run."""
    assert V.resolve_args(["--quick"]).name == "vae_digits_quick"
    assert V.resolve_args(["--dataset", "fashion-mnist", "--smoke"]).name == "vae_fashion_mnist_quick"
    assert V.resolve_args([]).name == "vae_digits"
    assert V.resolve_args(["--quick", "--name", "mine"]).name == "mine"
