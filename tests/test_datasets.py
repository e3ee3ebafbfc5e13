import hashlib
import re
from pathlib import Path

import numpy as np
import pytest

from numpyro_uha import datasets
from numpyro_uha.datasets import DATASETS, load_logistic_regression, resolve_data_dir

ROWS = {"sonar": 208, "ionosphere": 351, "australian": 690, "a1a": 1605, "madelon": 2000}


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    """Every test starts from the default (packaged) data, whatever the caller's shell set."""
    monkeypatch.delenv("NUMPYRO_UHA_DATA_DIR", raising=False)


def test_default_is_the_packaged_copy():
    data = resolve_data_dir()
    assert str(data) == str(Path(datasets.__file__).parent / "data")
    for name in DATASETS:
        assert (data / f"{name}.npz").is_file(), name
    assert (data / "PROVENANCE.md").is_file()


def test_packaged_files_match_the_recorded_checksums():
    data = resolve_data_dir()
    recorded = dict(
        (name, digest)
        for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+\.npz)$", (data / "PROVENANCE.md").read_text(), re.M)
    )
    assert sorted(recorded) == sorted(f"{name}.npz" for name in [*DATASETS, "digits"])
    for file, digest in recorded.items():
        assert hashlib.sha256((data / file).read_bytes()).hexdigest() == digest, file


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_dataset_loads_standardized_with_intercept(name):
    X, y = load_logistic_regression(name)
    assert X.shape == (ROWS[name], DATASETS[name]) and y.shape == (ROWS[name],)
    np.testing.assert_allclose(np.asarray(X[:, 0]), 1.0)
    np.testing.assert_allclose(np.asarray(X[:, 1:]).mean(0), 0.0, atol=1e-5)
    assert set(np.unique(np.asarray(y))) == {0.0, 1.0}


def test_unknown_dataset_is_named():
    with pytest.raises(ValueError, match="Unknown dataset 'nope'"):
        load_logistic_regression("nope")


def test_missing_file_under_data_dir_names_the_path_and_the_default(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_logistic_regression("sonar", data_dir=tmp_path)
    message = str(err.value)
    assert str(tmp_path / "sonar.npz") in message
    assert "data_dir=" in message and "packaged copy" in message


def test_missing_file_under_the_environment_variable_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMPYRO_UHA_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        load_logistic_regression("sonar")
    message = str(err.value)
    assert str(tmp_path / "sonar.npz") in message
    assert "NUMPYRO_UHA_DATA_DIR" in message and "packaged copy" in message


def test_environment_variable_sets_the_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMPYRO_UHA_DATA_DIR", str(tmp_path))
    assert resolve_data_dir() == tmp_path


def test_overrides_are_read_in_order(tmp_path, monkeypatch):
    # data_dir= beats the environment variable, which beats the packaged copy.
    env_dir, arg_dir = tmp_path / "env", tmp_path / "arg"
    for folder, rows in ((env_dir, 3), (arg_dir, 5)):
        folder.mkdir()
        np.savez(folder / "sonar.npz", X=np.arange(rows * 2, dtype=np.float32).reshape(rows, 2),
                 Y=np.resize([-1.0, 1.0], rows))
    monkeypatch.setenv("NUMPYRO_UHA_DATA_DIR", str(env_dir))
    assert resolve_data_dir(arg_dir) == arg_dir
    assert load_logistic_regression("sonar", data_dir=arg_dir)[0].shape == (5, 3)
    assert load_logistic_regression("sonar")[0].shape == (3, 3)
    monkeypatch.setenv("NUMPYRO_UHA_DATA_DIR", "")
    assert load_logistic_regression("sonar")[0].shape == (208, 61)


def test_nothing_points_at_a_data_folder_beside_the_checkout():
    # The data used to live in a folder next to the repository; a fresh clone has none.
    root = Path(__file__).resolve().parents[1]
    shared = "shared"  # split so that this file does not match itself
    patterns = ("../" + shared, f'"{shared}" / "data"', f"'{shared}' / 'data'")
    files = [root / "README.md", root / "pyproject.toml", root / "mkdocs.yml"]
    for folder in ("numpyro_uha", "tests", "docs", "notebooks", "benchmarks", ".ci"):
        files += [p for p in (root / folder).rglob("*") if p.is_file() and p.suffix != ".npz"
                  and "__pycache__" not in p.parts]
    offenders = [
        str(p.relative_to(root)) for p in files
        if any(pattern in p.read_text(encoding="utf-8", errors="replace") for pattern in patterns)
    ]
    assert not offenders, offenders
