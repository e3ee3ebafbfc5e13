"""`benchmarks/reference_log_z.py`: the smoke run, and its Gaussian bracket on a target
whose log Z is known, fed exact posterior draws (no NUTS)."""

import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from benchmark_smoke import run_smoke

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.reference_log_z import gaussian_bracket  # noqa: E402


def test_reference_log_z_smoke(tmp_path):
    run_smoke("reference_log_z", tmp_path)


def test_gaussian_bracket_holds_the_known_log_z():
    # Unnormalized correlated Gaussian: p̄(z) = c · N(z; m, S), so log Z = log c.
    d, log_c = 6, 3.7
    rng = np.random.default_rng(0)
    a = rng.normal(size=(d, d))
    cov = a @ a.T / d + 0.5 * np.eye(d)
    mean = rng.normal(size=d)
    chol = np.linalg.cholesky(cov)
    prec = jnp.asarray(np.linalg.inv(cov))
    log_norm = -0.5 * d * math.log(2 * math.pi) - np.sum(np.log(np.diag(chol)))

    def logdensity_fn(z):
        r = z - mean
        return log_c + log_norm - 0.5 * r @ prec @ r

    draws = (mean + rng.normal(size=(2, 4000, d)) @ chol.T).astype(np.float32)
    b = gaussian_bracket(jax.random.PRNGKey(0), logdensity_fn, draws, num_q_draws=20000)
    # Each end within 4 of its own standard errors of log Z, from the right side; the
    # upper end exceeds log Z by KL(p ‖ q̂) only, small for a q fitted to 8000 draws.
    assert b["lower"] - 4 * b["lower_se"] <= log_c <= b["upper"] + 4 * b["upper_se"]
    assert abs(b["lower"] - log_c) < 4 * b["lower_se"] + 1e-3
    assert b["upper"] - log_c < 4 * b["upper_se"] + 0.01
    # And the bracket is not trivially wide: the ELBO of q is below log Z by KL(q̂ ‖ p).
    assert b["q_elbo"] <= log_c + 4 * b["q_elbo_se"]
