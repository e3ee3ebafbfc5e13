"""The image data of the VAE benchmark: packaged digits, the idx loader, binarization, splits."""

import gzip
import pickle

import jax
import numpy as np
import pytest

from numpyro_uha.datasets import (
    FASHION_MNIST_DIR,
    IDX_FILES,
    binarize,
    load_digits,
    load_fashion_mnist,
    load_idx_images,
    split_indices,
)


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    monkeypatch.delenv("NUMPYRO_UHA_DATA_DIR", raising=False)


def test_digits_shape_range_and_labels():
    images, labels = load_digits()
    assert images.shape == (1797, 64) and images.dtype == np.float32
    assert labels.shape == (1797,)
    assert images.min() == 0.0 and images.max() == 1.0
    # The stored counts are integers 0..16, so every intensity is a multiple of 1/16.
    np.testing.assert_array_equal(images * 16, np.round(images * 16))
    # scikit-learn's copy: 10 classes of 174 to 183 images (its documented class sizes).
    counts = np.bincount(labels)
    assert counts.tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    # The first ten rows are the digits 0..9 in order, as in scikit-learn's copy.
    assert labels[:10].tolist() == list(range(10))


def test_digits_missing_under_data_dir_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="digits.npz"):
        load_digits(data_dir=tmp_path)


def _idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    return header + array.astype(np.uint8).tobytes()


def _write_idx_folder(folder, compress, n_train=5, n_test=3, rows=4, cols=3, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, rows, cols), dtype=np.uint8),
        "train_labels": rng.integers(0, 10, n_train, dtype=np.uint8),
        "test_images": rng.integers(0, 256, (n_test, rows, cols), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    # Pixels 0 and 255 are present, so the scaling's ends are checked too.
    arrays["train_images"][0, 0, 0], arrays["train_images"][0, 0, 1] = 0, 255
    folder.mkdir(parents=True, exist_ok=True)
    for key, name in IDX_FILES.items():
        data = _idx_bytes(arrays[key])
        if compress:
            with gzip.open(folder / f"{name}.gz", "wb") as file:
                file.write(data)
        else:
            (folder / name).write_bytes(data)
    return arrays


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gz"])
def test_idx_loader_reads_what_was_written(tmp_path, compress):
    arrays = _write_idx_folder(tmp_path / "idx", compress)
    data = load_idx_images(tmp_path / "idx")
    for split in ("train", "test"):
        images = getattr(data, f"{split}_images")
        labels = getattr(data, f"{split}_labels")
        raw = arrays[f"{split}_images"]
        assert images.dtype == np.float32 and images.shape == (raw.shape[0], 12)
        np.testing.assert_array_equal(images * 255, raw.reshape(raw.shape[0], -1).astype(np.float32))
        np.testing.assert_array_equal(labels, arrays[f"{split}_labels"])
    assert data.train_images.min() == 0.0 and data.train_images.max() == 1.0


def test_idx_header_that_disagrees_with_the_data_is_an_error(tmp_path):
    _write_idx_folder(tmp_path, compress=False)
    path = tmp_path / IDX_FILES["train_images"]
    raw = bytearray(path.read_bytes())
    raw[4:8] = np.asarray([6], ">u4").tobytes()  # says 6 images, holds 5
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"header gives shape \(6, 4, 3\)"):
        load_idx_images(tmp_path)


def test_idx_wrong_magic_number_is_an_error(tmp_path):
    _write_idx_folder(tmp_path, compress=True)
    with gzip.open(tmp_path / f"{IDX_FILES['test_labels']}.gz", "wb") as file:
        file.write(_idx_bytes(np.zeros((3, 2), np.uint8)))  # 2-D where labels are 1-D
    with pytest.raises(ValueError, match="magic number is 00000802, expected 00000801"):
        load_idx_images(tmp_path)


def test_idx_image_and_label_counts_must_agree(tmp_path):
    _write_idx_folder(tmp_path, compress=False)
    (tmp_path / IDX_FILES["test_labels"]).write_bytes(_idx_bytes(np.zeros(4, np.uint8)))
    with pytest.raises(ValueError, match="holds 3 images but t10k-labels-idx1-ubyte 4 labels"):
        load_idx_images(tmp_path)


def test_missing_folder_says_how_to_get_the_data(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_idx_images(tmp_path / "nowhere")
    message = str(err.value)
    assert str(tmp_path / "nowhere") in message
    assert "sudo apt-get install dataset-fashion-mnist" in message
    assert str(FASHION_MNIST_DIR) in message and "MNIST" in message
    assert "benchmarks.mnist_pickle_to_idx" in message  # MNIST offline


def test_missing_file_is_named(tmp_path):
    _write_idx_folder(tmp_path, compress=True)
    (tmp_path / f"{IDX_FILES['train_labels']}.gz").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks train-labels-idx1-ubyte\[\.gz\]\. .*apt-get install"):
        load_idx_images(tmp_path)


@pytest.mark.skipif(not FASHION_MNIST_DIR.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist_from_the_debian_package():
    data = load_fashion_mnist()
    assert data.train_images.shape == (60000, 784) and data.test_images.shape == (10000, 784)
    assert data.train_images.dtype == np.float32
    assert data.train_images.min() == 0.0 and data.train_images.max() == 1.0
    # Fashion-MNIST is balanced: 6000 training and 1000 test images per class.
    assert np.bincount(data.train_labels).tolist() == [6000] * 10
    assert np.bincount(data.test_labels).tolist() == [1000] * 10


def test_binarize_is_binary_with_the_intensities_as_means():
    images = load_digits().images[:4]  # 256 pixels, intensities in multiples of 1/16
    n = 4000
    draws = np.asarray(binarize(jax.random.PRNGKey(0), np.broadcast_to(images, (n, *images.shape))))
    assert draws.dtype == np.float32 and draws.shape == (n, *images.shape)
    assert set(np.unique(draws)) <= {0.0, 1.0}
    mean = draws.mean(axis=0)
    # Pixels at 0 or 1 are deterministic; the others are within 4 binomial standard errors.
    np.testing.assert_array_equal(mean[images == 0.0], 0.0)
    np.testing.assert_array_equal(mean[images == 1.0], 1.0)
    se = np.sqrt(images * (1 - images) / n)
    inner = (images > 0) & (images < 1)
    assert inner.sum() > 50
    z = np.abs(mean[inner] - images[inner]) / se[inner]
    assert z.max() < 4.0, z.max()
    # and the draws are not all the same across repetitions (fresh noise per row).
    assert draws[:, inner].std(axis=0).min() > 0


def test_binarize_rejects_values_outside_the_unit_interval():
    with pytest.raises(ValueError, match=r"images must be intensities in \[0, 1\]"):
        binarize(jax.random.PRNGKey(0), np.array([0.5, 255.0]))


def test_split_indices_is_a_deterministic_partition():
    test, val, train = split_indices(1797, [297, 300], seed=3)
    assert (len(test), len(val), len(train)) == (297, 300, 1200)
    np.testing.assert_array_equal(np.sort(np.concatenate([test, val, train])), np.arange(1797))
    again = split_indices(1797, [297, 300], seed=3)
    for a, b in zip((test, val, train), again):
        np.testing.assert_array_equal(a, b)
    other = split_indices(1797, [297, 300], seed=4)
    assert not np.array_equal(test, other[0])
    with pytest.raises(ValueError, match="num_items=10"):
        split_indices(10, [6, 5])


def _mnist_pickle(path, seed=0, sizes=(6, 2, 3)):
    """A small pickle laid out like the classic mnist.pkl.gz (byte / 256 intensities)."""
    rng = np.random.default_rng(seed)
    splits = []
    for n in sizes:
        counts = rng.integers(0, 256, size=(n, 784))
        splits.append(((counts / 256.0).astype(np.float32), rng.integers(0, 10, size=n)))
    with gzip.open(path, "wb") as file:
        pickle.dump(tuple(splits), file)
    return splits


def test_mnist_pickle_becomes_idx_files_byte_for_byte(tmp_path):
    from benchmarks.mnist_pickle_to_idx import convert

    (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = _mnist_pickle(tmp_path / "m.pkl.gz")
    convert(tmp_path / "m.pkl.gz", tmp_path / "idx")
    data = load_idx_images(tmp_path / "idx")
    # train then validation, as MNIST's official 60 000 training images; bytes / 255 on load
    expected_train = np.rint(np.concatenate([train_x, valid_x]) * 256) / 255
    np.testing.assert_allclose(data.train_images, expected_train, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(data.train_labels, np.concatenate([train_y, valid_y]))
    np.testing.assert_allclose(data.test_images, np.rint(test_x * 256) / 255, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(data.test_labels, test_y)


def test_mnist_pickle_with_other_intensities_is_refused(tmp_path):
    from benchmarks.mnist_pickle_to_idx import convert

    splits = _mnist_pickle(tmp_path / "m.pkl.gz")
    splits[2] = (splits[2][0] * 0.999, splits[2][1])  # not whole multiples of 1/256
    with gzip.open(tmp_path / "m.pkl.gz", "wb") as file:
        pickle.dump(tuple(splits), file)
    with pytest.raises(ValueError, match="test: intensities are not whole multiples of 1/256"):
        convert(tmp_path / "m.pkl.gz", tmp_path / "idx")
