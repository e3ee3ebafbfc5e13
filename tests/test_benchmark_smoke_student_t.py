"""Smoke run of `python -m benchmarks.student_t --smoke`: tiny sizes, keeps the benchmark alive."""

import json



def test_student_t_smoke(tmp_path, monkeypatch):
    from benchmarks import student_t

    monkeypatch.setenv("NUMPYRO_UHA_RESULTS_DIR", str(tmp_path))
    student_t.main(["--smoke", "--name", "smoke"])
    payload = json.loads((tmp_path / "smoke.json").read_text())
    assert payload["environment"]["versions"]["numpyro"]
    assert (tmp_path / "smoke.md").read_text().startswith("# smoke")
