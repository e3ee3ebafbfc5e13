"""Smoke run of `python -m benchmarks.evaluation_report --smoke`: tiny sizes, keeps the benchmark alive."""

import json

import pytest

from numpyro_uha.datasets import resolve_data_dir

pytestmark = pytest.mark.skipif(
    not (resolve_data_dir() / "sonar.npz").is_file(), reason="benchmark data directory not present"
)


def test_evaluation_report_smoke(tmp_path, monkeypatch):
    from benchmarks import evaluation_report

    monkeypatch.setenv("NUMPYRO_UHA_RESULTS_DIR", str(tmp_path))
    evaluation_report.main(["--smoke", "--name", "smoke"])
    payload = json.loads((tmp_path / "smoke.json").read_text())
    assert payload["environment"]["versions"]["numpyro"]
    assert (tmp_path / "smoke.md").read_text().startswith("# smoke")
