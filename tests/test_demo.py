import math

from numpyro_uha import demo


def test_demo_runs_end_to_end_on_tiny_settings(capsys):
    estimates = demo.main(
        ["--dim", "3", "--K", "2", "--vi-steps", "50", "--uha-steps", "20",
         "--num-draws", "200", "--no-progress-bar"]
    )
    assert set(estimates) == {"plain VI", "UHA (K=2)"}
    for est in estimates.values():
        assert math.isfinite(est.elbo) and math.isfinite(est.iw) and est.num_draws == 200
    out = capsys.readouterr().out
    assert "true log Z" in out and "UHA (K=2)" in out
