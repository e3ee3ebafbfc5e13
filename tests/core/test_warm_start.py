"""The warm start driven from Python around a compiled oracle (issue 16, item 1).

* the Python-driven run and the run traced into ``lax`` loops (under ``jit``) are the
  same computation;
* its VI stage is ``vmap`` of :func:`fit_gaussian` over the starts (same draws, same
  Adam), mean-field and full rank;
* the batched line-search L-BFGS finds the exact mode of a badly scaled Gaussian
  posterior (normal equations) and a stationary point of a logistic regression;
* for a full-rank q the Laplace start carries the whole inverse Hessian: a strongly
  correlated Gaussian posterior is fitted before VI moves (the Hessian read from the
  same Hessian-vector products equals ``jax.hessian``);
* the log density is compiled twice in all (value-and-gradient, Hessian-vector
  products), and a second warm start of the same shapes compiles nothing;
* the guide's oracle (:func:`difference_oracle`: products by central differences of the
  one compiled gradient program) matches exact products, and a warm start on it compiles
  the log density once.
"""

import logging
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest

from numpyro_uha.core import fit_gaussian
from numpyro_uha.core.warm_start import (
    CURVATURE_ITERS,
    QUICK_MAX_ELEMENTS,
    _lanczos_step,
    _fit_starts,
    curvature_scale,
    difference_oracle,
    find_mode,
    LAPLACE_TOLERANCE,
    hessian_matrix,
    laplace_close,
    max_curvature,
    quick_compiler_options,
    rows_oracle,
    small_jit,
    warm_start,
)

from tests._compat import enable_x64

SCALES = np.array([1e3, 1e1, 1.0, 1e-1, 1e-2])
NOISE, PRIOR_SD = 0.5, 1000.0


def _regression():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, SCALES.size)) * SCALES
    beta = rng.normal(size=SCALES.size) / SCALES
    y = X @ beta + NOISE * rng.normal(size=60)
    return jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32), X, y


X, Y, X64, Y64 = _regression()


def regression(z):
    return dist.Normal(0.0, PRIOR_SD).log_prob(z).sum() + dist.Normal(X @ z, NOISE).log_prob(Y).sum()


def logistic(z):
    rng = np.random.default_rng(5)
    A = jnp.asarray(rng.normal(size=(80, 4)), jnp.float32)
    t = jnp.asarray(rng.random(80) < 0.5, jnp.float32)
    return dist.Normal(0.0, 3.0).log_prob(z).sum() + dist.Bernoulli(logits=A @ z).log_prob(t).sum()


INIT = jnp.asarray(np.random.default_rng(0).uniform(-2, 2, size=5), jnp.float32)


@pytest.mark.parametrize("full_rank", [False, True], ids=["diagonal", "full-rank"])
def test_python_driven_and_traced_runs_agree(full_rank):
    key = jax.random.PRNGKey(0)
    # the Laplace check runs only where the loops run in Python (the full-rank Laplace
    # start is exact here and would end the host run before its VI)
    host = warm_start(
        key, None, INIT, 0.1, num_steps=300, oracle=rows_oracle(regression), full_rank=full_rank,
        laplace_tolerance=None,
    )
    traced = jax.jit(
        lambda k: warm_start(k, regression, INIT, 0.1, num_steps=300, full_rank=full_rank)
    )(key)
    assert int(host.start) == int(traced.start)
    np.testing.assert_allclose(host.loc, traced.loc, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(host.scale, traced.scale, rtol=1e-4)
    np.testing.assert_allclose(host.losses, traced.losses, rtol=1e-4)
    np.testing.assert_allclose(host.log_weights, traced.log_weights, rtol=1e-4)


def _starts():
    starts = jnp.stack([INIT, 0.5 * INIT, 2.0 * INIT])
    scales = jnp.stack([jnp.ones(5), jnp.full(5, 0.01), jnp.full(5, 0.1)])
    units = jnp.stack([jnp.full(5, 0.1), jnp.ones(5), jnp.full(5, 0.5)])
    return starts, scales, units


def test_vi_stage_is_fit_gaussian_over_the_starts():
    key = jax.random.PRNGKey(4)
    starts, scales, units = _starts()
    for full_rank in (False, True):
        (loc_u, raw_u), _, losses, _, _ = _fit_starts(
            rows_oracle(regression), True, key, starts, scales, units, full_rank, 200, 0.01, 8
        )

        def reference(start, s, unit):
            init_scale = jnp.diag(unit) if full_rank else unit
            fit = fit_gaussian(
                key, lambda u: regression(start + s * u), jnp.zeros(5), init_scale, num_steps=200
            )
            return fit.loc, fit.scale, fit.losses

        ref_loc, ref_scale, ref_losses = jax.vmap(reference)(starts, scales, units)
        np.testing.assert_allclose(losses.T, ref_losses, rtol=1e-4)
        np.testing.assert_allclose(loc_u, ref_loc, rtol=1e-4, atol=1e-5)
        raw_scale = jnp.exp(raw_u) if not full_rank else jax.vmap(
            lambda r: jnp.tril(r, -1) + jnp.diag(jnp.exp(jnp.diagonal(r)))
        )(raw_u)
        np.testing.assert_allclose(raw_scale, ref_scale, rtol=1e-4, atol=1e-6)


def test_line_search_lbfgs_finds_the_exact_mode():
    precision = X64.T @ X64 / NOISE**2 + np.eye(5) / PRIOR_SD**2
    mean = np.linalg.solve(precision, X64.T @ Y64 / NOISE**2)
    sd = np.sqrt(np.diag(np.linalg.inv(precision)))
    oracle = rows_oracle(regression)
    s0 = curvature_scale(None, INIT, 0.1, oracle=oracle)
    # the curvature diagonal is the precision's (a quadratic: exact at any point)
    np.testing.assert_allclose(s0, 1.0 / np.sqrt(np.diag(precision)), rtol=1e-3)
    mode, value = find_mode(None, INIT, s0, oracle=oracle)
    np.testing.assert_array_less(np.abs(np.asarray(mode) - mean) / sd, 1e-2)
    assert abs(float(value) - float(regression(jnp.asarray(mean, jnp.float32)))) < 1e-2
    # a non-quadratic objective: the gradient vanishes at the mode found
    mode, _ = find_mode(None, jnp.zeros(4), jnp.ones(4), oracle=rows_oracle(logistic))
    assert float(jnp.max(jnp.abs(jax.grad(logistic)(mode)))) < 1e-3
    # traced into lax loops: the same point
    traced, _ = jax.jit(lambda z: find_mode(logistic, z, jnp.ones(4)))(jnp.zeros(4))
    np.testing.assert_allclose(traced, mode, atol=1e-4)  # float32 stopping points


def test_batched_power_iteration_matches_each_point():
    oracle = rows_oracle(logistic)
    points = jax.random.normal(jax.random.PRNGKey(1), (7, 4))
    scale = jnp.asarray([1.0, 0.5, 2.0, 0.1])
    batch = max_curvature(None, points, scale, num_iters=100, oracle=oracle)
    for z, lam in zip(points, batch):
        h = -jax.hessian(logistic)(z)
        exact = np.linalg.eigvalsh(np.asarray(scale[:, None] * h * scale[None, :]))[-1]
        np.testing.assert_allclose(lam, exact, rtol=1e-3)


def _quadratic(eigenvalues, vectors):
    precision = jnp.asarray((vectors * eigenvalues) @ vectors.T, jnp.float32)
    return lambda z: -0.5 * z @ precision @ z


def test_max_curvature_finds_a_contrast_the_ones_vector_misses():
    # the largest eigenvalue's eigenvector z1 - z2 is orthogonal to (1, ..., 1): power
    # iteration from the normalized ones vector stayed at the next eigenvalue (1)
    d = 6
    u = np.zeros(d)
    u[:2] = [1.0, -1.0]
    q, _ = np.linalg.qr(np.column_stack([u, np.eye(d)[:, 1:]]))
    eigenvalues = np.r_[100.0, np.ones(d - 1)]
    lam = max_curvature(None, jnp.zeros((3, d)), jnp.ones(d), oracle=rows_oracle(_quadratic(eigenvalues, q)))
    np.testing.assert_allclose(lam, 100.0, rtol=1e-3)


def test_max_curvature_settles_in_fewer_products_than_its_cap():
    # a wide spectrum (condition number 400) in 200 dimensions: the estimate within 1 %
    # of the largest eigenvalue, stopping early on every row together
    rng = np.random.default_rng(0)
    d = 200
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    eigenvalues = np.exp(rng.uniform(-3.0, 3.0, d))
    oracle = rows_oracle(_quadratic(eigenvalues, q))
    calls = []

    def hvp(zs, vs):
        calls.append(1)
        return oracle.hvp(zs, vs)

    counted = oracle._replace(hvp=hvp)
    points = jnp.asarray(rng.normal(size=(5, d)), jnp.float32)
    lam = max_curvature(None, points, jnp.ones(d), oracle=counted)
    np.testing.assert_allclose(lam, eigenvalues.max(), rtol=1e-2)
    assert np.all(np.asarray(lam) <= eigenvalues.max() * (1 + 1e-4))  # Ritz values: never above
    assert len(calls) < CURVATURE_ITERS
    # traced (a lax loop of the cap's length): the same estimate
    traced = jax.jit(lambda z: max_curvature(None, z, jnp.ones(d), oracle=rows_oracle(_quadratic(eigenvalues, q), compiled=False)))(points)
    np.testing.assert_allclose(traced, eigenvalues.max(), rtol=1e-2)


def test_max_curvature_of_an_isotropic_target_stops_at_once():
    # the Krylov space of a multiple of the identity is one vector: β₀ = 0, exact after
    # one product, and no product of a zero vector afterwards
    oracle = rows_oracle(lambda z: -1.5 * jnp.sum(z**2))
    norms = []

    def hvp(zs, vs):
        norms.append(np.linalg.norm(np.asarray(vs), axis=-1))
        return oracle.hvp(zs, vs)

    lam = max_curvature(None, jnp.zeros((4, 10)), jnp.full(10, 2.0), oracle=oracle._replace(hvp=hvp))
    np.testing.assert_allclose(lam, 12.0, rtol=1e-5)  # S H S = 4 · 3 I
    np.testing.assert_allclose(np.array(norms), 2.0, rtol=1e-5)  # S v for unit vectors v


def test_max_curvature_of_an_indefinite_hessian_is_the_largest_magnitude():
    # a direction where log p̄ curves up (a funnel's tail) limits the leapfrog as well
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.normal(size=(8, 8)))
    eigenvalues = np.r_[-50.0, np.linspace(1.0, 10.0, 7)]
    lam = max_curvature(None, jnp.zeros((2, 8)), jnp.ones(8), oracle=rows_oracle(_quadratic(eigenvalues, q)))
    np.testing.assert_allclose(lam, 50.0, rtol=1e-3)


def test_lanczos_step_after_an_invariant_subspace_keeps_a_nonzero_vector():
    # v = e1 an exact eigenvector: β₀ = 0 exactly; the row is done, its estimate 4, and the
    # next products' input is still S v (a zero vector would be differenced for nothing)
    v = jnp.asarray([[1.0, 0.0, 0.0]])
    carry = (jnp.zeros_like(v), v, jnp.zeros((1, 3)), jnp.zeros((1, 3)), jnp.zeros(1, bool))
    carry, sv, lam = _lanczos_step(carry, -4.0 * v, jnp.ones(3), np.int32(0), host=True)
    np.testing.assert_allclose(lam, [4.0])
    np.testing.assert_allclose(sv, v)
    assert bool(carry[4][0])
    carry, sv, lam = _lanczos_step(carry, jnp.zeros_like(v), jnp.ones(3), np.int32(1), host=True)
    np.testing.assert_allclose(lam, [4.0])  # frozen
    np.testing.assert_allclose(sv, v)


def test_model_free_steps_on_large_arrays_compile_at_the_default_optimization(monkeypatch):
    # the quick options (lowest optimization) only where every array is small: at the
    # lowest level a step on 24 x 5000 draws ran slower than it compiled faster
    jitted = []
    real_jit = jax.jit
    monkeypatch.setattr(
        jax, "jit", lambda fn, **kw: jitted.append(kw.get("compiler_options")) or real_jit(fn, **kw)
    )

    @small_jit()
    def double(x):
        return 2.0 * x

    small = np.ones(QUICK_MAX_ELEMENTS - 1, np.float32)
    large = np.ones(QUICK_MAX_ELEMENTS, np.float32)
    np.testing.assert_array_equal(double(small, host=True), 2.0 * small)
    np.testing.assert_array_equal(double(large, host=True), 2.0 * large)
    double(small, host=True)
    assert jitted == [quick_compiler_options(), None]


def test_log_density_compiled_twice_and_a_second_run_compiles_nothing(caplog):
    oracle = rows_oracle(logistic)
    init = jnp.zeros(4)
    fit = warm_start(jax.random.PRNGKey(0), None, init, 0.1, num_steps=100, oracle=oracle)
    max_curvature(None, jnp.broadcast_to(fit.loc, (65, 4)), fit.scale, oracle=oracle)
    assert oracle.value_and_grad._cache_size() == 1
    assert oracle.hvp._cache_size() == 1
    key, other = jax.random.PRNGKey(1), init + 0.5
    with caplog.at_level(logging.WARNING, logger="jax"), jax.log_compiles(True):
        warm_start(key, None, other, 0.2, num_steps=100, oracle=oracle)
    compiled = [r.getMessage() for r in caplog.records if "Finished XLA compilation" in r.getMessage()]
    assert compiled == []


def _correlated():
    """A Gaussian with sds from 1e-2 to 1e2 and correlations 0.99 between neighbours'
    standardized coordinates (an AR(1) correlation matrix)."""
    sd = np.array([1e-2, 1.0, 1e2, 0.5, 3.0])
    corr = 0.99 ** np.abs(np.subtract.outer(np.arange(5), np.arange(5)))
    cov = corr * np.outer(sd, sd)
    precision = jnp.asarray(np.linalg.inv(cov), jnp.float32)
    mean = jnp.asarray([1.0, -2.0, 50.0, 0.0, 3.0], jnp.float32)

    def logdensity(z):
        r = z - mean
        return -0.5 * r @ precision @ r

    return logdensity, cov, np.asarray(mean)


def test_hessian_from_products_is_jax_hessian():
    z = jax.random.normal(jax.random.PRNGKey(2), (4,))
    for rows in (65, 3):  # one chunk, and two chunks (the second one partly padding)
        hessian = hessian_matrix(None, z, oracle=rows_oracle(logistic), rows=rows)
        np.testing.assert_allclose(hessian, jax.hessian(logistic)(z), rtol=1e-4, atol=1e-5)


def test_full_rank_laplace_start_fits_a_correlated_gaussian_before_vi():
    logdensity, cov, mean = _correlated()
    # 20 VI steps at a tiny learning rate: the fit is (almost) the start it was given
    fit = warm_start(
        jax.random.PRNGKey(0), None, jnp.zeros(5), 0.1, full_rank=True, num_steps=20,
        learning_rate=1e-5, oracle=rows_oracle(logdensity),
    )
    assert int(fit.start) == 2  # the Laplace start has the lowest loss
    L = np.asarray(fit.scale, np.float64)
    sd = np.sqrt(np.diag(cov))
    np.testing.assert_allclose(np.sqrt(np.diag(L @ L.T)), sd, rtol=0.02)
    np.testing.assert_allclose((L @ L.T) / np.outer(sd, sd), cov / np.outer(sd, sd), atol=0.01)
    np.testing.assert_array_less(np.abs(np.asarray(fit.loc) - mean) / sd, 0.05)
    # ... while a diagonal start's sds are the conditional ones, ~0.1 of the marginal sds
    diagonal = warm_start(
        jax.random.PRNGKey(0), None, jnp.zeros(5), 0.1, num_steps=20,
        learning_rate=1e-5, oracle=rows_oracle(logdensity),
    )
    assert np.all(np.asarray(diagonal.scale) < 0.3 * sd)


def _difference(logdensity, width=24):
    return difference_oracle(rows_oracle(logdensity).value_and_grad, width)


def test_difference_products_match_exact_ones():
    """Central differences of the gradient against forward-over-reverse products: on the
    logistic regression (not quadratic), at 65 rows (six chunks of 24, the last partly
    padding), for unit vectors and for scaled random directions."""
    key_z, key_v = jax.random.split(jax.random.PRNGKey(4))
    zs = jax.random.normal(key_z, (65, 4))
    exact, approx = rows_oracle(logistic), _difference(logistic)
    for vs in (jnp.tile(jnp.eye(4), (17, 1))[:65], 0.3 * jax.random.normal(key_v, (65, 4))):
        want, got = exact.hvp(zs, vs), approx.hvp(zs, vs)
        scale = np.max(np.abs(np.asarray(want)), axis=-1, keepdims=True)
        np.testing.assert_array_less(np.abs(np.asarray(got - want)) / scale, 1e-3)
    # the Hessian read from them, one chunk and several
    z = zs[0]
    for width in (24, 5):
        hessian = hessian_matrix(None, z, oracle=_difference(logistic, width))
        np.testing.assert_allclose(hessian, jax.hessian(logistic)(z), rtol=2e-3, atol=2e-3)


def test_difference_products_are_exact_on_a_quadratic():
    logdensity, cov, mean = _correlated()
    precision = np.linalg.inv(cov)
    z = jnp.asarray(mean + 0.1, jnp.float32)
    hessian = np.asarray(hessian_matrix(None, z, oracle=_difference(logdensity)))
    # the gradient is linear: the differences are exact up to float32 rounding
    np.testing.assert_allclose(hessian, -precision, rtol=1e-3, atol=1e-3 * np.abs(precision).max())


def _far_regression(intercept):
    """A Gaussian regression in single precision whose intercept's posterior sits at
    ``intercept`` with sd ~3.5e3 (y ≈ 3e5 + 2e4 x + N(0, 5e4²), 200 points, priors
    N(0, 1e6²) and N(0, 1e5²)): its exact Hessian, constant."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=200)
    y = intercept + 2e4 * x + 5e4 * rng.normal(size=200)
    xs, ys = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)

    def logdensity(z):
        prior = dist.Normal(0.0, 1e6).log_prob(z[0]) + dist.Normal(0.0, 1e5).log_prob(z[1])
        return prior + dist.Normal(z[0] + z[1] * xs, 5e4).log_prob(ys).sum()

    design = np.stack([np.ones(200), x], 1)
    precision = np.diag([1e-12, 1e-10]) + design.T @ design / 5e4**2
    mode = np.linalg.solve(precision, design.T @ y / 5e4**2)
    return logdensity, -precision, mode


@pytest.mark.parametrize("intercept, where", [(1e5, "mode"), (3e5, "mode"), (3e5, "origin")])
def test_difference_products_are_resolved_far_from_the_origin_in_single_precision(
    intercept, where
):
    """Far from the origin (a mode at 1e5, where z + 1e-2 rounds to z + 0.0078, or at
    3e5, where it rounds back to z) and far from the mode (at the origin: gradients ~0.02,
    their differences ~1e-9, at single precision's resolution) the central differences
    with a fixed step were off by a fifth, 0, or rounding noise; the products must be the
    exact Hessian's within 1 % of its largest entry (the warm start's scales and step
    ceiling come from them)."""
    logdensity, hessian, mode = _far_regression(intercept)
    z = jnp.asarray(mode if where == "mode" else [0.3, -0.2], jnp.float32)
    got = np.asarray(_difference(logdensity).hvp(jnp.stack([z, z]), jnp.eye(2, dtype=jnp.float32)))
    np.testing.assert_allclose(got, hessian, atol=0.01 * np.abs(hessian).max())


def test_a_widened_step_that_leaves_the_domain_keeps_the_first_product():
    """A row whose difference is below the gradients' rounding is differenced again at a
    wider step; where that step leaves the log density's domain (sqrt(1 - z), z > 1)
    the product stays the first, finite one (rounding noise, as before the widening),
    not NaN (which would reach the warm start's scales and the step ceiling)."""

    def logdensity(z):
        return jnp.sum(1e-3 * jnp.sqrt(1.0 - z) + 1e4 * z)

    got = _difference(logdensity).hvp(
        jnp.asarray([[0.5, 0.2]], jnp.float32), jnp.asarray([[1.0, 0.0]], jnp.float32)
    )
    assert np.all(np.isfinite(np.asarray(got)))


def test_a_warm_start_from_the_origin_fits_a_posterior_3e5_away_in_single_precision():
    """The guide's case (a regression's intercept near 3e5, float32): the curvature at the
    start was rounding noise, the start scale fell back to 0.1 against a posterior sd of
    3.5e3 and the mode search never left the origin; q ended 3.7e3 sds from the mean
    with 0.014 of its sd, and nothing warned."""
    logdensity, hessian, mode = _far_regression(3e5)
    sd = np.sqrt(np.diag(np.linalg.inv(-hessian)))
    fit = warm_start(
        jax.random.PRNGKey(0), None, jnp.asarray([0.18, 1.26]), 0.1, full_rank=True,
        num_steps=300, oracle=_difference(logdensity),
    )
    scale = np.asarray(fit.scale, np.float64)
    np.testing.assert_array_less(np.abs(np.asarray(fit.loc) - mode) / sd, 0.2)
    np.testing.assert_allclose(np.sqrt(np.diag(scale @ scale.T)) / sd, 1.0, atol=0.1)


def _steep_poisson(dtype):
    """A Poisson regression with an unstandardized covariate (x up to 1000, rate
    e^(a + b x), b ≈ 0.002, priors N(0, 10²)) and its mode and Laplace sds (Newton in
    double precision from the origin)."""
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 1000, 80)
    y = rng.poisson(np.exp(0.5 + 0.002 * x)).astype(float)
    xs, ys = jnp.asarray(x, dtype), jnp.asarray(y, dtype)

    def logdensity(z):
        eta = z[0] + z[1] * xs
        return -0.5 * jnp.sum((z / 10.0) ** 2) + jnp.sum(ys * eta - jnp.exp(eta))

    design, m = np.stack([np.ones_like(x), x], 1), np.zeros(2)
    for _ in range(100):
        rate = np.exp(design @ m)
        precision = design.T @ (rate[:, None] * design) + np.eye(2) / 100.0
        m = m + np.linalg.solve(precision, design.T @ (y - rate) - m / 100.0)
    return logdensity, m, np.sqrt(np.diag(np.linalg.inv(precision)))


def test_difference_products_stay_local_on_a_steep_coordinate():
    """At the mode of the steep Poisson regression the slope's posterior sd is 2e-4: the
    fixed step 1e-2 spanned 50 sds, across which the rate changes e^10-fold, and the
    products came out 300 times the curvature (the Laplace start a tenth of the sd).
    They must be the exact Hessian within 1 %."""
    logdensity, mode, _ = _steep_poisson(jnp.float32)
    z = jnp.asarray(mode, jnp.float32)
    got = np.asarray(_difference(logdensity).hvp(jnp.stack([z, z]), jnp.eye(2, dtype=jnp.float32)))
    want = np.asarray(jax.hessian(logdensity)(z), np.float64)
    np.testing.assert_allclose(got, want, rtol=0.01)


def test_a_narrowed_step_below_the_gradients_rounding_keeps_the_resolved_product():
    """A quadratic under a large linear term (gradient 1e9, curvature 1e4, sd 0.01): the
    step 1e-2 is below the gradients' rounding (a difference of 200 where float32's
    spacing is 64), the widened step 10.24 resolves it but spans 1 000 sds, and the
    narrowed step (0.05 sd) is below the rounding again (a difference of 10). The
    resolved product, exact on a quadratic up to 0.1 %, must be the one returned, not
    the last one."""

    def logdensity(z):
        return jnp.sum(1e9 * z - 5e3 * z**2)

    z = jnp.zeros((1, 1), jnp.float32)
    got = _difference(logdensity).hvp(z, jnp.ones((1, 1), jnp.float32))
    np.testing.assert_allclose(np.asarray(got), -1e4, rtol=0.01)


@pytest.mark.parametrize(
    "dtype, start",
    # the guide's first points (init_to_uniform) on this model in single and double
    # precision: rates e^56 and e^244, log densities -1.6e25 and -7e102
    [(jnp.float32, [1.9473495, 0.05664539]), (jnp.float64, [-1.41492482, 0.24436243])],
    ids=["float32", "float64"],
)
def test_a_warm_start_far_out_in_a_steep_tail_reaches_the_posterior(dtype, start):
    """From a start where the rate is e^56 the curvature gives scales of 1e-12 (below
    float32's resolution at z = 0.06): the mode search never moved, q was a point at a
    log density of -1.6e25 and training could not move it, silently. In double precision
    (e^244) the search stopped 2 500 nats below the mode, its gradient test passed in
    the start's units. q must reach the posterior's mode and scales."""
    with enable_x64(dtype == jnp.float64):
        logdensity, mode, sd = _steep_poisson(dtype)
        fit = warm_start(
            jax.random.PRNGKey(0), None, jnp.asarray(start, dtype), 0.1, full_rank=True,
            num_steps=300, oracle=_difference(logdensity),
        )
        loc, scale = np.asarray(fit.loc, np.float64), np.asarray(fit.scale, np.float64)
    np.testing.assert_array_less(np.abs(loc - mode) / sd, 0.3)
    np.testing.assert_allclose(np.sqrt(np.diag(scale @ scale.T)) / sd, 1.0, atol=0.2)


def test_warm_start_on_difference_products_compiles_the_log_density_once():
    oracle = _difference(logistic)
    fit = warm_start(jax.random.PRNGKey(0), None, jnp.zeros(4), 0.1, num_steps=100, oracle=oracle)
    max_curvature(None, jnp.broadcast_to(fit.loc, (65, 4)), fit.scale, oracle=oracle)
    assert oracle.value_and_grad._cache_size() == 1
    exact = warm_start(
        jax.random.PRNGKey(0), None, jnp.zeros(4), 0.1, num_steps=100, oracle=rows_oracle(logistic)
    )
    # the same fit as with exact products (the mode by L-BFGS, VI from the same draws)
    np.testing.assert_allclose(fit.loc, exact.loc, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(fit.scale, exact.scale, rtol=1e-2)


def test_line_search_points_stay_within_a_reach_that_grows_only_as_needed():
    """Every line search is one call at all its points, as slow as the slowest: a model
    whose cost grows with its parameters (an adaptive ODE solver) hung on points 2⁸
    directions away. The first line search stays within 8 standardized units of the
    start (INITIAL_REACH_SDS); the reach doubles only when the farthest point was the best, so
    a nearby mode is found without far points, and a far one (15 000 sds: the badly
    scaled regression above) is still reached."""
    from numpyro_uha.core.warm_start import RowsOracle

    def recording(logdensity_fn, seen):
        inner = rows_oracle(logdensity_fn)

        def value_and_grad(zs):
            seen.append(np.asarray(zs))
            return inner.value_and_grad(zs)

        return RowsOracle(value_and_grad, inner.hvp, True)

    # the mode 3 sds from the start along every coordinate; the gradient there is 3
    def near(z):
        return -0.5 * jnp.sum((z - 3.0) ** 2)

    seen = []
    mode, _ = find_mode(None, jnp.zeros(3), jnp.ones(3), oracle=recording(near, seen))
    np.testing.assert_allclose(mode, 3.0, atol=1e-4)
    # the first search's farthest point was not its best: the reach never grew
    assert max(np.max(np.abs(z)) for z in seen) <= 8.0 * (1 + 1e-6)
    # far: the regression's mode, thousands of sds from INIT in its first coordinate
    seen = []
    oracle = recording(regression, seen)
    s0 = curvature_scale(None, INIT, 0.1, oracle=rows_oracle(regression))
    precision = X64.T @ X64 / NOISE**2 + np.eye(5) / PRIOR_SD**2
    mean = np.linalg.solve(precision, X64.T @ Y64 / NOISE**2)
    assert np.max(np.abs((mean - np.asarray(INIT)) / np.asarray(s0))) > 1e3
    mode, _ = find_mode(None, INIT, s0, oracle=oracle)
    sd = np.sqrt(np.diag(np.linalg.inv(precision)))
    np.testing.assert_array_less(np.abs(np.asarray(mode) - mean) / sd, 1e-2)


def _gamma_posterior(shape):
    """log density of log x for x ~ Gamma(shape, 1): skewed for a small shape, nearly
    Gaussian for a large one (the Laplace approximation's KL falls as 1/shape)."""
    def logdensity(z):
        return jnp.sum(shape * z - jnp.exp(z))

    return logdensity


@pytest.mark.parametrize("full_rank", [False, True], ids=["diagonal", "full-rank"])
def test_an_exact_laplace_approximation_skips_the_vi(full_rank):
    """A Gaussian posterior: the Laplace start is the posterior, so no VI can improve it;
    the warm start returns it with the log weights it was checked with (their variance
    is zero), without running any VI step."""
    if full_rank:
        logdensity, cov, mean = _correlated()
    else:  # a diagonal q is exact only where the posterior's coordinates are independent
        sd = jnp.asarray([1e-2, 1.0, 1e2, 0.5, 3.0])

        def logdensity(z):
            return -0.5 * jnp.sum(((z - 1.0) / sd) ** 2)
    calls = []
    oracle = rows_oracle(logdensity)
    counted = oracle._replace(value_and_grad=lambda z: calls.append(z.shape) or oracle.value_and_grad(z))
    fit = warm_start(jax.random.PRNGKey(0), None, jnp.zeros(5), 0.1, full_rank=full_rank,
                     num_steps=500, oracle=counted)
    assert fit.losses.shape == (0,) and int(fit.start) == 2 and bool(fit.converged)
    # far fewer value-and-gradient calls than one per VI step (mode search + scoring)
    assert len(calls) < 250
    lw = np.asarray(fit.log_weights, np.float64)
    assert lw.shape == (256,) and np.std(lw) < 1e-2  # log Z = log p̄'s normalizer, exactly
    # the q returned is the posterior itself
    scale = np.asarray(fit.scale, np.float64)
    if full_rank:
        marginal = np.sqrt(np.diag(cov))
        norm = np.outer(marginal, marginal)
        np.testing.assert_allclose(scale @ scale.T / norm, cov / norm, atol=0.01)
        np.testing.assert_array_less(np.abs(np.asarray(fit.loc) - mean) / marginal, 0.01)
    else:
        np.testing.assert_allclose(scale, sd, rtol=1e-3)
        np.testing.assert_allclose(fit.loc, np.ones(5), atol=1e-3 * float(sd.max()))
    ref = warm_start(jax.random.PRNGKey(0), None, jnp.zeros(5), 0.1, full_rank=full_rank,
                     num_steps=500, oracle=oracle, laplace_tolerance=None)
    assert ref.losses.shape == (500,)
    # the kept q is scored at the same draws either way: the skipped VI loses nothing
    assert np.mean(lw) >= np.mean(np.asarray(ref.log_weights)) - 2 * np.std(lw) / 16


def test_a_skewed_posterior_runs_the_vi_and_a_nearly_gaussian_one_does_not():
    key, init = jax.random.PRNGKey(1), jnp.zeros(3)
    skewed = warm_start(key, None, init, 1.0, num_steps=300, oracle=rows_oracle(_gamma_posterior(2.0)))
    assert skewed.losses.shape == (300,)
    close = warm_start(key, None, init, 1.0, num_steps=300, oracle=rows_oracle(_gamma_posterior(2000.0)))
    assert close.losses.shape == (0,)
    # shape 20: a Laplace KL of about 0.03 nats, above the default tolerance, below 0.2
    middle = rows_oracle(_gamma_posterior(20.0))
    assert warm_start(key, None, init, 1.0, num_steps=300, oracle=middle).losses.shape == (300,)
    loose = warm_start(key, None, init, 1.0, num_steps=300, oracle=middle, laplace_tolerance=0.2)
    assert loose.losses.shape == (0,)


def test_laplace_close_bounds_half_the_variance_and_the_bounds_gap():
    rng = np.random.default_rng(0)
    e = rng.normal(size=4000)
    tol = LAPLACE_TOLERANCE
    # half the variance (KL to second order) just below the tolerance passes ...
    assert laplace_close(-3.0 + np.sqrt(2 * tol * 0.8) * e, tol)
    # ... and just above it does not; nor within two standard errors of it at 256 draws
    assert not laplace_close(-3.0 + np.sqrt(2 * tol * 1.1) * e, tol)
    assert not laplace_close(np.sqrt(2 * tol * 0.9) * e[:256], tol)
    assert laplace_close(np.sqrt(2 * tol * 0.6) * e[:256], tol)
    # one draw far out in the right tail: the variance may pass, the bounds' gap does not
    tail = np.sqrt(2 * tol * 0.3) * e[:2000]
    tail[0] = 9.0
    assert 0.5 * np.var(tail) > tol or not laplace_close(tail, tol)
    spike = np.sqrt(2 * tol * 0.1) * e[:2000]
    spike[0] = 4.0
    assert 0.5 * np.var(spike) <= tol and not laplace_close(spike, tol)
    # a diverged draw, or a single one: never close
    bad = np.zeros(256)
    bad[3] = -np.inf
    assert not laplace_close(bad, tol) and not laplace_close(np.zeros(1), tol)
    assert laplace_close(np.zeros(256), tol)


def test_laplace_close_on_weights_far_apart_warns_of_nothing():
    """A posterior far from its Laplace approximation (a funnel, centered eight schools)
    gives log weights thousands of nats apart: the check says no without NumPy's overflow
    warnings reaching the user's svi.init."""
    lw = np.array([0.0, -5000.0, 2000.0, -1e30, 3.0] * 60)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not laplace_close(lw, LAPLACE_TOLERANCE)
        # one weight e^900 above a million others: half the variance, with its standard
        # errors, is 1.2 nats, under a tolerance of 10; the bounds' gap (886) says no
        spike = np.zeros(10**6)
        spike[0] = 900.0
        assert not laplace_close(spike, 10.0)


def test_the_laplace_q_is_kept_where_the_vi_ends_worse():
    """On a correlated Gaussian posterior the Laplace q is exact; Adam at a learning rate
    far too large for 10 steps leaves every VI start worse than it. The warm start then
    returns the Laplace q itself (start 2, no losses) and its log weights are those of an
    exact q (all log Z = 0 here, up to float32 rounding). Without the check the VI's
    fit from the Laplace start is kept (start 2 with 10 losses, its mean moved)."""
    rng = np.random.default_rng(7)
    A = rng.normal(size=(6, 6))
    cov = A @ A.T / 6 + 0.2 * np.eye(6)
    precision = jnp.asarray(np.linalg.inv(cov), jnp.float32)
    log_norm = -0.5 * (6 * np.log(2 * np.pi) + np.linalg.slogdet(cov)[1])

    def logdensity(z):
        return -0.5 * z @ precision @ z + log_norm

    fit = warm_start(
        jax.random.PRNGKey(0), None, jnp.ones(6), 1.0, full_rank=True, num_steps=10,
        learning_rate=0.5, oracle=rows_oracle(logdensity), laplace_tolerance=1e-9,
    )
    assert int(fit.start) == 2 and fit.losses.shape == (0,)
    np.testing.assert_allclose(np.asarray(fit.log_weights), 0.0, atol=1e-2)
