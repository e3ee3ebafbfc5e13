"""``UHALocalGuide(decenter=...)``: local sites of a centered hierarchy run non-centered.

Where each data point's latents are weakly informed, the global guide fitted with
centered locals comes out several times too narrow (benchmarks/local_globals.py); run
non-centered (``z = mu + tau · z̃``) each q_i follows the globals. Tested here: which sites
are non-centered, that the guide still speaks the model's own sites, that each data
point's ELBO under Trace_ELBO is exactly its UHA log weight (the Jacobian |dz/dz̃| in the
guide's density), that the weights are unbiased for p(x_i | globals), pickling, errors.
"""

import math
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro import handlers
from numpyro.infer import SVI, Predictive, Trace_ELBO
from scipy.stats import norm

from numpyro_uha import UHALocalGuide

N, BATCH, SIGMA = 24, 6, 0.8
_rng = np.random.default_rng(7)
YBAR = jnp.asarray(0.3 + 0.9 * _rng.normal(size=N) + SIGMA * _rng.normal(size=N), jnp.float32)


def hierarchy(ybar, batch):
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    with numpyro.plate("groups", N, subsample_size=batch) as idx:
        w = numpyro.sample("w", dist.Normal(0.0, 1.0))  # constant loc and scale: as written
        z = numpyro.sample("z", dist.Normal(mu, tau))
        numpyro.sample("ybar", dist.Normal(z + 0.1 * w, SIGMA), obs=ybar[idx])


def fit(model, guide, steps=30):
    return SVI(model, guide, optax.adam(1e-2), Trace_ELBO()).run(
        jax.random.PRNGKey(0), steps, YBAR, BATCH, progress_bar=False
    ).params


@pytest.fixture(scope="module")
def fitted():
    # q_i at the prior's sd in the non-centered coordinates (where the weights of the
    # unbiasedness test are light-tailed)
    guide = UHALocalGuide(hierarchy, K=3, decenter=True, init_scale=1.0)
    return guide, fit(hierarchy, guide)


def test_true_decenters_the_local_sites_whose_loc_or_scale_depends_on_latents(fitted):
    guide, _ = fitted
    assert guide.decentered_sites == ("z",)
    assert UHALocalGuide(hierarchy, K=3).requested_decenter is False


def test_the_guide_speaks_the_models_own_sites(fitted):
    guide, params = fitted
    idx = jnp.arange(BATCH)
    draws = guide.sample_posterior(
        jax.random.PRNGKey(1), params, YBAR, BATCH, subsample_idx=idx, sample_shape=(5,)
    )
    assert set(draws) == {"mu", "tau", "w", "z"}
    assert draws["z"].shape == (5, BATCH)
    # Predictive runs the guide's __call__ (the SVI path), which emits z itself
    predictive = Predictive(
        hierarchy, guide=guide, params=params, num_samples=4, return_sites=["z", "ybar"]
    )(jax.random.PRNGKey(2), YBAR, BATCH)
    assert predictive["z"].shape == (4, BATCH) and np.all(np.isfinite(predictive["z"]))
    # pickled, it draws the same
    loaded = pickle.loads(pickle.dumps(guide))
    again = loaded.sample_posterior(
        jax.random.PRNGKey(1), params, YBAR, BATCH, subsample_idx=idx, sample_shape=(5,)
    )
    assert loaded.decentered_sites == ("z",)
    for name in draws:
        np.testing.assert_allclose(again[name], draws[name], rtol=1e-5, atol=1e-6)


SUB = {"groups": jnp.asarray([0, 3, 7, 11, 19, 23])}  # the minibatch of the identities


def _loss_and_log_weights(model, guide, params, key):
    """Trace_ELBO's loss at ``key`` on the minibatch ``SUB``, and the chains' log weights
    of the same draw (Trace_ELBO seeds the guide with the second half of ``key``)."""
    guide_key = jax.random.split(key)[1]
    _, log_w, _ = handlers.seed(
        handlers.substitute(lambda: guide._body((YBAR, BATCH), {}), data={**params, **SUB}),
        guide_key,
    )()
    loss = Trace_ELBO().loss(
        key, params, handlers.substitute(model, data=SUB), handlers.substitute(guide, data=SUB),
        YBAR, BATCH,
    )
    return loss, log_w


def test_each_points_elbo_is_its_log_weight_with_the_jacobian():
    """Trace_ELBO's loss on the model as written (centered z) is exactly -(N/B) Σ_i log w_i
    of the non-centered chains, plus the conditioned globals' prior terms: the guide's
    density of z includes -log |dz/dz̃| = -log tau per point (dropping it moves the loss by
    (N/B) · B · log tau)."""
    mu, tau = 0.2, 0.35
    model = handlers.condition(hierarchy, {"mu": mu, "tau": tau})
    guide = UHALocalGuide(model, K=3, decenter=["z"])
    params = fit(model, guide, steps=20)
    assert guide.decentered_sites == ("z",)
    loss, log_w = _loss_and_log_weights(model, guide, params, jax.random.PRNGKey(11))
    globals_ = float(norm.logpdf(mu, 0.0, 3.0) + np.log(2.0) + norm.logpdf(tau, 0.0, 2.0))
    np.testing.assert_allclose(loss, -(N / BATCH) * float(jnp.sum(log_w)) - globals_, rtol=1e-5)


def _check_loss_is_global_terms_and_log_weights(model, guide, params, seed):
    """Trace_ELBO's loss on the minibatch ``SUB`` is -(log p(mu, tau) - log q(mu, tau))
    - (N/B) Σ_i log w_i for the same draw (the globals latent, AutoNormal)."""
    key = jax.random.PRNGKey(seed)
    guide_key = jax.random.split(key)[1]  # Trace_ELBO seeds the guide with this
    seeded = handlers.seed(handlers.substitute(guide, data={**params, **SUB}), guide_key)
    guide_trace = handlers.trace(seeded).get_trace(YBAR, BATCH)
    model_trace = handlers.trace(
        handlers.replay(handlers.substitute(model, data=SUB), guide_trace)
    ).get_trace(YBAR, BATCH)
    global_terms = sum(
        float(model_trace[n]["fn"].log_prob(model_trace[n]["value"]))
        - float(guide_trace[n]["fn"].log_prob(guide_trace[n]["value"]))
        for n in ("mu", "tau")
    )
    loss, log_w = _loss_and_log_weights(model, guide, params, key)
    np.testing.assert_allclose(
        loss, -(N / BATCH) * float(jnp.sum(log_w)) - global_terms, rtol=1e-5
    )


def test_the_loss_with_latent_globals_is_the_global_terms_and_the_log_weights(fitted):
    """With the globals latent (AutoNormal): Trace_ELBO's loss is exactly
    -(log p(mu, tau) - log q(mu, tau)) - (N/B) Σ_i log w_i for the same draw."""
    guide, params = fitted
    _check_loss_is_global_terms_and_log_weights(hierarchy, guide, params, 12)


def _family_hierarchy(family, seen=lambda z: z):
    """``z ~ family(mu, tau)`` per point, ``seen(z)`` observed (the sum of a vector z's
    entries, for a local with an event)."""
    def model(ybar, batch):
        mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
        tau = numpyro.sample("tau", dist.HalfNormal(2.0))
        with numpyro.plate("groups", N, subsample_size=batch) as idx:
            z = numpyro.sample("z", family(mu, tau))
            numpyro.sample("ybar", dist.Normal(seen(z), SIGMA), obs=ybar[idx])

    return model


# Laplace, Cauchy and Logistic take the same path as Normal (loc and scale only) and run
# with -m slow (7-8 s each); StudentT's kept df stays in the default suite
@pytest.mark.parametrize(
    "family",
    [
        lambda m, s: dist.StudentT(4.0, m, s),
        pytest.param(dist.Laplace, marks=pytest.mark.slow),
        pytest.param(dist.Cauchy, marks=pytest.mark.slow),
        pytest.param(dist.Logistic, marks=pytest.mark.slow),
    ],
    ids=["StudentT", "Laplace", "Cauchy", "Logistic"],
)
def test_every_loc_scale_family_keeps_each_points_elbo_its_log_weight(family):
    """The other loc-scale families (StudentT keeps its df): decentered, and Trace_ELBO's
    loss is -(global terms) - (N/B) Σ_i log w_i draw by draw."""
    model = _family_hierarchy(family)
    guide = UHALocalGuide(model, K=2, decenter=True, init_scale=1.0)
    params = fit(model, guide, steps=5)
    assert guide.decentered_sites == ("z",)
    _check_loss_is_global_terms_and_log_weights(model, guide, params, 13)


@pytest.mark.parametrize(
    "family",
    [
        lambda m, s: dist.Normal(m, s).expand([2]).to_event(1),
        pytest.param(
            lambda m, s: dist.MultivariateNormal(
                jnp.stack([m, -m]), scale_tril=s * jnp.array([[1.0, 0.0], [0.6, 0.8]])
            ),
            # 18 s; a global MVN's log |det| is checked by default (test_decenter.py)
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda m, s: dist.MultivariateStudentT(
                4.0, jnp.stack([m, -m]), s * jnp.array([[1.5, 0.0], [-0.6, 0.5]])
            ),
            marks=pytest.mark.slow,  # 14 s
        ),
    ],
    ids=["Normal.to_event", "MultivariateNormal", "MultivariateStudentT"],
)
def test_vector_local_sites_keep_each_points_elbo_its_log_weight(family):
    """A local site with an event (a vector per point): its Jacobian is summed over the
    event before the rows (an event-wise log scale was read as the data axis), and a
    multivariate one's is log |det scale_tril|."""
    model = _family_hierarchy(family, seen=lambda z: z.sum(-1))  # z: a 2-vector per point
    guide = UHALocalGuide(model, K=2, decenter=True, init_scale=1.0)
    params = fit(model, guide, steps=5)
    assert guide.decentered_sites == ("z",)
    _check_loss_is_global_terms_and_log_weights(model, guide, params, 14)


def test_weights_are_unbiased_for_the_likelihood_given_the_globals(fitted):
    """E[w_i] = p(ybar_i | mu, tau) = ∫ N(ybar_i; z + 0.1 w, σ) N(z; mu, tau) N(w; 0, 1):
    ybar_i ~ N(mu, sqrt(tau² + 0.01 + σ²)); within 4 Monte Carlo standard errors."""
    guide, params = fitted
    mu, tau = 0.4, 0.6
    idx = jnp.asarray([1, 5, 8, 13, 17, 21])
    log_w = np.asarray(
        guide.log_weights(
            jax.random.PRNGKey(5), params, YBAR, BATCH, num_samples=3000, subsample_idx=idx,
            global_values={"mu": jnp.asarray(mu), "tau": jnp.asarray(tau)},
        ),
        np.float64,
    )
    exact = norm.logpdf(np.asarray(YBAR)[np.asarray(idx)], mu, math.sqrt(tau**2 + 0.01 + SIGMA**2))
    ratio = np.exp(log_w - exact[None])
    mean, se = ratio.mean(0), ratio.std(0, ddof=1) / math.sqrt(ratio.shape[0])
    assert np.all(np.abs(mean - 1.0) < 4.0 * se), (mean, se)


@pytest.mark.slow
def test_an_encoder_amortizes_the_non_centered_coordinates():
    """With an encoder, q_i's (loc, scale) are in the non-centered coordinates; the guide
    trains and draws the model's sites."""
    def encoder(ybar):
        a = numpyro.param("enc_a", jnp.zeros(2))
        loc = jnp.stack([a[0] * ybar, a[1] * ybar], -1)
        return loc, jnp.full_like(loc, 0.5)

    guide = UHALocalGuide(hierarchy, K=2, decenter=True, encoder=encoder)
    params = fit(hierarchy, guide, steps=10)
    assert guide.decentered_sites == ("z",) and "enc_a" in params
    draws = guide.sample_posterior(
        jax.random.PRNGKey(3), params, YBAR, BATCH, subsample_idx=jnp.arange(BATCH),
        sample_shape=(3,),
    )
    assert set(draws) == {"mu", "tau", "w", "z"} and np.all(np.isfinite(draws["z"]))


def masked_gamma(ybar, batch):
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    with numpyro.plate("groups", N, subsample_size=batch) as idx:
        g = numpyro.sample("g", dist.Gamma(2.0, jnp.exp(mu)))
        numpyro.sample("ybar", dist.Normal(g, SIGMA), obs=ybar[idx])


@pytest.mark.parametrize(
    "model, decenter, match",
    [
        (hierarchy, "z", "decenter must be True, False or a list"),
        (hierarchy, 3, "decenter must be True, False or a list"),
        (hierarchy, ["mu"], "not a latent site of the plate 'groups'"),
        (hierarchy, ["nope"], "not a latent site of the plate 'groups'"),
        (masked_gamma, ["g"], "only loc-scale families"),
    ],
)
def test_bad_decenter_arguments_are_named(model, decenter, match):
    with pytest.raises(ValueError, match=match):
        guide = UHALocalGuide(model, K=2, decenter=decenter)
        SVI(model, guide, optax.adam(1e-2), Trace_ELBO()).init(
            jax.random.PRNGKey(0), YBAR, BATCH
        )


def scaled_hierarchy(ybar, batch):
    """hierarchy's z under handlers.scale (a tempered prior on the group effects)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    with numpyro.plate("groups", N, subsample_size=batch) as idx:
        with handlers.scale(scale=0.5):
            z = numpyro.sample("z", dist.Normal(mu, tau))
        numpyro.sample("ybar", dist.Normal(z, SIGMA), obs=ybar[idx])


@pytest.mark.slow
def test_a_scaled_non_centered_local_keeps_the_loss_the_global_terms_and_the_weights():
    """z = mu + tau · z̃ under scale 0.5: the model scores 0.5 · log p(z), the guide's
    density of z carries the whole Jacobian log tau, so each chain's target adds
    (1 − 0.5) · log tau to 0.5 · log p(z̃); the loss is the global terms and the weights."""
    guide = UHALocalGuide(scaled_hierarchy, K=3, decenter=True)
    params = fit(scaled_hierarchy, guide)
    assert guide.decentered_sites == ("z",)
    _check_loss_is_global_terms_and_log_weights(scaled_hierarchy, guide, params, 12)


X_DATA = jnp.asarray(np.random.default_rng(5).normal(size=N), jnp.float32)


def data_and_latent_locs(ybar, x, batch):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("groups", N, subsample_size=batch) as idx:
        from_data = numpyro.sample("from_data", dist.Normal(x[idx], 1.0))
        from_latent = numpyro.sample("from_latent", dist.Normal(mu, 1.0))
        numpyro.sample("ybar", dist.Normal(from_data + from_latent, SIGMA), obs=ybar[idx])


def test_true_leaves_a_local_whose_loc_reads_only_the_data_on_a_minibatch():
    # the probe traced the model at two random points, each with its own random
    # subsample: x[idx] differed between them as if the loc depended on a latent
    guide = UHALocalGuide(data_and_latent_locs, K=2, decenter=True)
    handlers.seed(guide, 0)(YBAR, X_DATA, BATCH)
    assert guide.decentered_sites == ("from_latent",)
