"""Smoke run of `python -m benchmarks.speed --smoke`: tiny sizes, keeps the benchmark alive."""

import json

import pytest

from numpyro_uha.datasets import resolve_data_dir

pytestmark = pytest.mark.skipif(
    not (resolve_data_dir() / "sonar.npz").is_file(), reason="benchmark data directory not present"
)


def test_speed_smoke(tmp_path, monkeypatch):
    from benchmarks import speed

    monkeypatch.setenv("NUMPYRO_UHA_RESULTS_DIR", str(tmp_path))
    speed.main(["--smoke", "--name", "smoke"])
    payload = json.loads((tmp_path / "smoke.json").read_text())
    assert payload["environment"]["versions"]["numpyro"]
    assert (tmp_path / "smoke.md").read_text().startswith("# smoke")
