"""``bridge_gaussian_parts``: the bridge's log density and gradient with a full-rank
factor's inverse computed once for every β, against ``bridge_gaussian`` followed by the
solve-based ``gaussian_logpdf`` / ``gaussian_grad_logpdf`` (float64), for one β and for a
β per row, mean-field and full rank, with nonzero slopes."""

import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_uha.core import (
    bridge_gaussian,
    bridge_gaussian_parts,
    gaussian_grad_logpdf,
    gaussian_logpdf,
)

from tests._compat import enable_x64

D = 5


@pytest.mark.parametrize("full_rank", [False, True])
@pytest.mark.parametrize("per_row", [False, True])
def test_parts_equal_the_solved_bridge(full_rank, per_row):
    rng = np.random.default_rng(11)
    with enable_x64():
        loc = jnp.asarray(rng.normal(size=D))
        scale = (
            jnp.asarray(np.tril(rng.normal(size=(D, D)), -1) + np.diag(rng.uniform(0.5, 2.0, D)))
            if full_rank else jnp.asarray(rng.uniform(0.5, 2.0, D))
        )
        loc_slope, log_scale_slope = jnp.asarray(rng.normal(size=D)), jnp.asarray(0.5 * rng.normal(size=D))
        z = jnp.asarray(rng.normal(size=(3, D)))
        betas = jnp.asarray([0.0, 0.3, 0.9])
        parts = bridge_gaussian_parts(loc, scale, loc_slope, log_scale_slope)
        if per_row:
            logpdf, grad = parts(betas)
            got_value, got_grad = logpdf(z), grad(z)
        else:
            got_value = jnp.stack([parts(b)[0](z[i]) for i, b in enumerate(betas)])
            got_grad = jnp.stack([parts(b)[1](z[i]) for i, b in enumerate(betas)])
        want_value, want_grad = [], []
        for i, b in enumerate(betas):
            bl, bs = bridge_gaussian(b, loc, scale, loc_slope, log_scale_slope)
            want_value.append(gaussian_logpdf(z[i], bl, bs))
            want_grad.append(gaussian_grad_logpdf(z[i], bl, bs))
        np.testing.assert_allclose(got_value, jnp.stack(want_value), rtol=1e-10)
        np.testing.assert_allclose(got_grad, jnp.stack(want_grad), rtol=1e-9, atol=1e-12)
