import numpy as np
import pytest

from numpyro_uha.datasets import DATASETS, load_logistic_regression, resolve_data_dir

HAVE_DATA = (resolve_data_dir() / "sonar.npz").is_file()


@pytest.mark.skipif(not HAVE_DATA, reason="benchmark data directory not present")
def test_sonar_is_standardized_with_intercept():
    X, y = load_logistic_regression("sonar")
    assert X.shape == (208, DATASETS["sonar"]) and y.shape == (208,)
    np.testing.assert_allclose(np.asarray(X[:, 0]), 1.0)
    np.testing.assert_allclose(np.asarray(X[:, 1:]).mean(0), 0.0, atol=1e-5)
    assert set(np.unique(np.asarray(y))) == {0.0, 1.0}


def test_unknown_and_missing_datasets_are_named(tmp_path):
    with pytest.raises(ValueError, match="Unknown dataset 'nope'"):
        load_logistic_regression("nope")
    with pytest.raises(FileNotFoundError, match="sonar.npz"):
        load_logistic_regression("sonar", data_dir=tmp_path)


def test_environment_variable_sets_the_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMPYRO_UHA_DATA_DIR", str(tmp_path))
    assert resolve_data_dir() == tmp_path
