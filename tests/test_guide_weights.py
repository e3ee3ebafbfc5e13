"""The guide's ELBO term is the core's UHA log weight, draw by draw, and Appendix D's
extrapolation scales every per-coordinate step by the same factor.

The equality is checked against NumPyro's own :class:`~numpyro.infer.Trace_ELBO` on the
model (its log joint in constrained space plus the guide's Jacobian terms), not against
the guide's factor: the weight comes from :func:`numpyro_uha.core.annealed_sample`,
called with the key the guide drew, the guide's log density and its annealing params.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO, TraceEnum_ELBO
from numpyro.primitives import Messenger

from numpyro_uha import UHAGuide
from numpyro_uha.core import annealed_sample

X = jnp.linspace(-1.0, 1.0, 12)
Y = 0.5 + 1.5 * X + 0.4 * jnp.asarray(np.random.default_rng(0).normal(size=12), jnp.float32)


def constrained_model(x, y):
    """Latent sites on three supports: a positive scale (LogNormal), a positive
    hierarchical scale (HalfNormal) and real coefficients (Normal)."""
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    coef = numpyro.sample("coef", dist.Normal(0.0, tau).expand([2]).to_event(1))
    noise = numpyro.sample("noise", dist.LogNormal(-0.5, 0.5))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(coef[0] + coef[1] * x, noise), obs=y)


class RecordKeys(Messenger):
    """Records every key handed out by ``numpyro.prng_key()`` inside the wrapped call."""

    def __init__(self, fn=None):
        self.keys = []
        super().__init__(fn)

    def postprocess_message(self, msg):
        if msg["type"] == "prng_key":
            self.keys.append(msg["value"])


def perturbed_params(guide, params, seed):
    """Every learnable group moved away from its initial value (constrained values)."""
    rng = np.random.default_rng(seed)
    d, K = guide.latent_dim, guide.K
    new = dict(params)
    new["auto_loc"] = params["auto_loc"] + 0.3 * rng.normal(size=d)
    scale = guide._param_name("scale")  # a vector, or a Cholesky factor (rows scaled)
    factor = rng.uniform(0.7, 1.5, d)
    new[scale] = params[scale] * (factor if params[scale].ndim == 1 else factor[:, None])
    new["auto_step_size"] = jnp.asarray(0.3 * guide.max_step_size)
    new["auto_step_size_slope"] = jnp.asarray(rng.normal())
    new["auto_damping"] = jnp.asarray(rng.uniform(0.3, 0.95))
    new["auto_momentum_scale"] = params["auto_momentum_scale"] * rng.uniform(0.5, 2.0, d)
    new["auto_beta_logits"] = jnp.asarray(0.5 * rng.normal(size=K + 1))
    new["auto_bridge_loc_slope"] = jnp.asarray(0.3 * rng.normal(size=d))
    new["auto_bridge_log_scale_slope"] = jnp.asarray(0.3 * rng.normal(size=d))
    new["auto_drift_scale"] = jnp.asarray(rng.uniform(0.5, 2.0, d))
    return {k: jnp.asarray(v, jnp.float32) for k, v in new.items()}


def elbo_terms_and_core_weights(guide, params, model, *args, num_keys=6, keys_drawn=1):
    """For ``num_keys`` keys: Trace_ELBO's term on ``model`` with the guide, and the
    core's log weight (and its info) from the key the guide drew first (the chain's),
    its log density and its annealing params: ``(elbo_terms, log_weights, infos)``.
    ``keys_drawn``: how many keys the guide draws (2 with discrete sites: the chain's,
    then the one for the discrete draw)."""
    annealing = guide.get_annealing_params(params)
    logdensity_fn = guide.get_logdensity_fn(params, *args)

    @jax.jit
    def elbo_term_and_key(rng_key):
        recorder = RecordKeys(guide)
        loss = Trace_ELBO().loss(rng_key, params, model, recorder, *args)
        assert len(recorder.keys) == keys_drawn  # the first is the one the core gets
        return -loss, recorder.keys[0]

    core = jax.jit(lambda key: annealed_sample(
        key, logdensity_fn, annealing,
        num_leapfrog_steps=guide.num_leapfrog_steps, integrator=guide.integrator,
    ))
    elbo, log_w, infos = [], [], []
    for seed in range(num_keys):
        elbo_term, key = elbo_term_and_key(jax.random.PRNGKey(seed))
        _, core_log_w, info = core(key)
        elbo.append(float(elbo_term))
        log_w.append(float(core_log_w))
        infos.append(info)
    return elbo, log_w, infos


def trace_enum_terms(guide, params, model, *args, num_keys=6):
    """TraceEnum_ELBO's term on ``model`` with the guide for the same keys as
    :func:`elbo_terms_and_core_weights` (it seeds the guide as Trace_ELBO does)."""
    term = jax.jit(lambda key: -TraceEnum_ELBO().loss(key, params, model, guide, *args))
    return [float(term(jax.random.PRNGKey(seed))) for seed in range(num_keys)]


def setup_guide(integrator, K=5, decenter="auto"):
    guide = UHAGuide(
        constrained_model, K=K, integrator=integrator, warm_start_steps=0, decenter=decenter
    )
    svi = SVI(constrained_model, guide, optax.adam(1e-3), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), X, Y)
    return guide, svi.get_params(state)


@pytest.mark.parametrize("decenter", ["auto", False])
@pytest.mark.parametrize("integrator", ["velocity_verlet", "position_verlet"])
def test_trace_elbo_term_is_the_core_log_weight_draw_by_draw(integrator, decenter):
    """With ``decenter="auto"`` the chain runs in coef = tau · coef~ (coef's scale is the
    latent tau): Trace_ELBO, on the model as written, must still get the core's weight,
    so the guide's Jacobian for coef is checked too."""
    guide, params = setup_guide(integrator, decenter=decenter)
    assert guide.decentered_sites == (("coef",) if decenter else ())
    params = perturbed_params(guide, params, seed=1)
    assert not np.allclose(guide.get_annealing_params(params).drift_scale, 1.0)
    elbo, log_w, infos = elbo_terms_and_core_weights(guide, params, constrained_model, X, Y)
    for info in infos:
        assert np.any(np.abs(info.momentum_log_ratio) > 1e-2)  # the dynamics did something
    np.testing.assert_allclose(elbo, log_w, rtol=1e-5, atol=2e-4)
    # Different keys give different weights: the comparison is draw by draw.
    assert np.std(log_w) > 0.1


def test_guide_weights_from_sample_posterior_are_the_core_weights():
    """``sample_posterior_with_log_weights`` splits its key into one key per draw and
    hands each to the core: same weights, same final positions."""
    guide, params = setup_guide("position_verlet")
    params = perturbed_params(guide, params, seed=2)
    draws = guide.sample_posterior_with_log_weights(
        jax.random.PRNGKey(3), params, X, Y, sample_shape=(4,)
    )
    logdensity_fn = guide.get_logdensity_fn(params, X, Y)
    annealing = guide.get_annealing_params(params)
    core = jax.jit(lambda key: annealed_sample(
        key, logdensity_fn, annealing, integrator=guide.integrator
    ))
    for key, log_w, latent in zip(
        jax.random.split(jax.random.PRNGKey(3), 4), draws.log_weights, draws.latent
    ):
        z, core_log_w, _ = core(key)
        np.testing.assert_allclose(log_w, core_log_w, rtol=1e-5, atol=2e-4)
        np.testing.assert_allclose(latent, z, rtol=1e-5, atol=1e-5)


def step_curve(betas, step_size, slope, max_step_size):
    """ε(β) = ε_max · sigmoid(logit(ε(0) / ε_max) + slope · β), written out here."""
    base = np.log(step_size / (max_step_size - step_size))
    return max_step_size / (1.0 + np.exp(-(base + slope * np.asarray(betas, np.float64))))


@pytest.mark.parametrize("frozen", [(), ("step_size",)], ids=["all", "frozen-step"])
def test_extrapolation_scales_every_per_coordinate_step_by_the_factor(frozen):
    """K = 8 → 26: factor log 9 / log 27 = 2/3. Every per-coordinate step ε_m δ_i / σ_i
    (the leapfrog's step in units of the momentum scale, drift and kick alike) of the
    new guide is 2/3 of the tuned guide's step at the same β; δ, Σ, q, η and the bridges
    are carried over unchanged, and the new schedule runs through the old one."""
    guide = UHAGuide(constrained_model, K=8, warm_start_steps=0, frozen=frozen)
    svi = SVI(constrained_model, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, Y))
    params = perturbed_params(guide, params, seed=4)
    if "step_size" in frozen:
        del params["auto_step_size"]
    old = guide.get_annealing_params(params)
    new_guide, new_params = guide.extrapolate(params, 26)
    new = new_guide.get_annealing_params(new_params)
    factor = math.log(9) / math.log(27)
    assert new.betas.shape == (26,) and abs(factor - 2 / 3) < 1e-12

    def per_coordinate(p):
        return np.asarray(p.step_sizes)[:, None] * np.asarray(p.drift_scale) / np.asarray(
            p.momentum_scale
        )

    old_steps, new_steps = per_coordinate(old), per_coordinate(new)
    # At the old knots (β'_{3j} = β_j, since 3j / 27 = j / 9) the steps are 2/3 of the
    # old ones, coordinate by coordinate.
    np.testing.assert_allclose(new.betas[2::3], old.betas, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_steps[2::3], factor * old_steps, rtol=1e-4)
    # Everywhere else the new steps follow 2/3 of the old ε(β) curve (slope included).
    step0 = guide._init_values["step_size"] if "step_size" in frozen else params["auto_step_size"]
    expected = factor * step_curve(
        new.betas, float(step0), float(params["auto_step_size_slope"]), guide.max_step_size
    )
    np.testing.assert_allclose(new.step_sizes, expected, rtol=1e-4)
    assert np.all(np.asarray(new.step_sizes) < new_guide.max_step_size)
    for name in ("loc", "scale", "damping", "momentum_scale", "drift_scale",
                 "bridge_loc_slope", "bridge_log_scale_slope"):
        np.testing.assert_array_equal(getattr(new, name), getattr(old, name), err_msg=name)
    # The extrapolated guide runs, and its ELBO term is still its core weight.
    loss = Trace_ELBO().loss(jax.random.PRNGKey(5), new_params, constrained_model, new_guide, X, Y)
    assert np.isfinite(float(loss))


def test_extrapolation_to_the_same_k_changes_nothing():
    guide, params = setup_guide("position_verlet", K=6)
    params = perturbed_params(guide, params, seed=6)
    same_guide, same_params = guide.extrapolate(params, 6)
    old, new = guide.get_annealing_params(params), same_guide.get_annealing_params(same_params)
    for a, b in zip(old, new):
        if a is None:  # e.g. no force bound without a warm start
            assert b is None
            continue
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


Y_BOUNDED = jnp.array([0.5, 1.9, 2.4, 1.7, -0.3, 0.8])


def bounded_by_a_latent(y):
    """x's support, (0, b), moves with the latent b."""
    b = numpyro.sample("b", dist.Exponential(0.5))
    x = numpyro.sample("x", dist.Uniform(0.0, b))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(x, 1.0), obs=y)


def bounded_by_the_data(y):
    """x's support, (max y, ∞), moves with the data (a censoring bound)."""
    x = numpyro.sample("x", dist.TruncatedNormal(0.0, 3.0, low=jnp.max(y)))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(x, 1.0), obs=y)


@pytest.mark.parametrize("model", [bounded_by_a_latent, bounded_by_the_data])
def test_the_elbo_term_is_the_log_weight_where_a_support_moves(model):
    """The guide maps the chain's end through the support the model draws there (not
    the one at setup) and counts that map's Jacobian: Trace_ELBO's term is the core's
    weight. bounded_by_the_data is set up on one data set and evaluated on another,
    whose bound is larger."""
    guide = UHAGuide(model, K=3, warm_start_steps=0, decenter=False)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    params = perturbed_params(guide, svi.get_params(svi.init(jax.random.PRNGKey(0), Y_BOUNDED)), 2)
    y = Y_BOUNDED if model is bounded_by_a_latent else Y_BOUNDED + 1.0
    elbo, log_w, _ = elbo_terms_and_core_weights(guide, params, model, y, num_keys=4)
    assert np.all(np.isfinite(elbo))
    np.testing.assert_allclose(elbo, log_w, rtol=1e-5, atol=2e-4)
    assert np.std(log_w) > 0.1


def scaled_latent(y):
    """A latent site and the likelihood under handlers.scale (a tempered prior)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    with numpyro.handlers.scale(scale=0.5):
        s = numpyro.sample("s", dist.HalfNormal(2.0))
    with numpyro.plate("data", y.shape[0]), numpyro.handlers.scale(scale=2.0):
        numpyro.sample("y", dist.Normal(mu, s), obs=y)


def test_a_scaled_latent_sites_jacobian_is_not_scaled():
    """Trace_ELBO's term is 0.5 · log p(s) + log |det J| + ... − log q (the guide's
    density of s carries the whole Jacobian): the chain's target counts the Jacobian
    unscaled too (NumPyro's potential_energy scales it), so the term is the core's
    weight; the target at a point is written out by hand."""
    guide = UHAGuide(scaled_latent, K=3, warm_start_steps=0, decenter=False)
    svi = SVI(scaled_latent, guide, optax.adam(1e-3), Trace_ELBO())
    params = perturbed_params(guide, svi.get_params(svi.init(jax.random.PRNGKey(0), Y_BOUNDED)), 3)
    mu, u = 0.7, -0.4
    z = jnp.zeros(guide.latent_dim).at[0].set(mu).at[1].set(u)
    assert list(guide._unpack_latent(z)) == ["mu", "s"]
    s = jnp.exp(u)
    expected = (
        dist.Normal(0.0, 3.0).log_prob(mu) + 0.5 * dist.HalfNormal(2.0).log_prob(s) + u
        + 2.0 * jnp.sum(dist.Normal(mu, s).log_prob(Y_BOUNDED))
    )
    np.testing.assert_allclose(guide.get_logdensity_fn(params, Y_BOUNDED)(z), expected, rtol=1e-6)
    elbo, log_w, _ = elbo_terms_and_core_weights(guide, params, scaled_latent, Y_BOUNDED, num_keys=4)
    np.testing.assert_allclose(elbo, log_w, rtol=1e-5, atol=2e-4)
    assert np.std(log_w) > 0.1


def scaled_group_effects(y):
    """Group effects under handlers.scale, run non-centered."""
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    with numpyro.plate("groups", 4), numpyro.handlers.scale(scale=0.5):
        theta = numpyro.sample("theta", dist.Normal(0.0, tau))
    numpyro.sample("y", dist.Normal(theta[jnp.arange(6) % 4], 1.0), obs=y)


def test_a_scaled_non_centered_sites_jacobian_is_not_scaled():
    """theta = tau · theta~ under scale 0.5: the model scores 0.5 · log p(theta), the
    guide's density of theta carries the whole Jacobian (4 log tau), so the chain's
    target adds (1 − 0.5) · 4 log tau to 0.5 · log p(theta~): the ELBO's term is the
    core's weight."""
    guide = UHAGuide(scaled_group_effects, K=3, warm_start_steps=0, decenter=["theta"])
    svi = SVI(scaled_group_effects, guide, optax.adam(1e-3), Trace_ELBO())
    params = perturbed_params(guide, svi.get_params(svi.init(jax.random.PRNGKey(0), Y_BOUNDED)), 4)
    assert guide.decentered_sites == ("theta",)
    elbo, log_w, _ = elbo_terms_and_core_weights(
        guide, params, scaled_group_effects, Y_BOUNDED, num_keys=4
    )
    np.testing.assert_allclose(elbo, log_w, rtol=1e-5, atol=2e-4)
    assert np.std(log_w) > 0.1
