"""Hidden Markov chains: discrete states the guide sums out but cannot draw exactly.

NumPyro's ``infer_discrete`` fails inside ``scan`` and, for a ``markov`` loop, builds the
whole chain's joint table, so the guide cannot draw the states from p(c | z, x). It draws
them from their prior p(c | z) with log p(c | z, x) = log p(x, z, c) - log p(x, z) in its
density (``numpyro_uha/_enumerate.py``, ``draw_discrete_from_prior``): every ELBO's term is
still the UHA log weight on the marginal, and the states are left out of its posterior
draws.

A two-state sticky chain with one shift and one stay probability latent (the model of
``benchmarks.hidden_markov.two_state``): the chain's target is checked against that
benchmark's forward algorithm, and the evidence against its quadrature over (shift, stay)
in float64.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.contrib.control_flow import scan
from numpyro.infer import SVI, Predictive, Trace_ELBO, TraceEnum_ELBO
from scipy.special import expit, logsumexp
from scipy.stats import beta as beta_dist
from scipy.stats import norm

from benchmarks.hidden_markov import OFFSETS, forward, two_state_exact
from numpyro_uha import UHAGuide, _enumerate
from numpyro_uha.evaluation import psis_khat, to_inference_data

from tests.test_guide_weights import elbo_terms_and_core_weights, trace_enum_terms

SHIFT_SD = 2.0  # as in benchmarks.hidden_markov.two_state, whose reference is used here


def _data(length, seed=0):
    rng = np.random.default_rng(seed)
    states = [0]
    for _ in range(length - 1):
        states.append(states[-1] if rng.random() < 0.85 else 1 - states[-1])
    return jnp.asarray(0.4 + OFFSETS[np.array(states)] + rng.normal(size=length), jnp.float32)


Y = _data(16)


def _transition(stay):
    return jnp.stack([jnp.stack([stay, 1 - stay]), jnp.stack([1 - stay, stay])])


def scanned_chain(y):
    shift = numpyro.sample("shift", dist.Normal(0.0, SHIFT_SD))
    stay = numpyro.sample("stay", dist.Beta(2.0, 2.0))
    transition = _transition(stay)

    def step(c, y_t):
        c = numpyro.sample("c", dist.Categorical(transition[c]))
        level = numpyro.deterministic("level", shift + jnp.asarray(OFFSETS)[c])
        numpyro.sample("y", dist.Normal(level, 1.0), obs=y_t)
        return c, None

    scan(step, 0, y)
    numpyro.deterministic("double_shift", 2 * shift)


def looped_chain(y):
    """The same chain as a Python loop under ``markov`` (no scan)."""
    from numpyro.contrib.funsor import markov

    shift = numpyro.sample("shift", dist.Normal(0.0, SHIFT_SD))
    stay = numpyro.sample("stay", dist.Beta(2.0, 2.0))
    transition = _transition(stay)
    c = 0
    for t in markov(range(y.shape[0])):
        c = numpyro.sample(f"c_{t}", dist.Categorical(transition[c]))
        numpyro.sample(f"y_{t}", dist.Normal(shift + jnp.asarray(OFFSETS)[c], 1.0), obs=y[t])


def exact(y):
    """log Z, E[shift | y] and E[stay | y] by quadrature over (shift, stay)."""
    log_z, means = two_state_exact(y)
    return log_z, means["shift"], means["stay"]


def _setup(model, y, **model_kwargs):
    guide = UHAGuide(model, K=4, warm_start_steps=0)
    svi = SVI(model, guide, optax.adam(3e-3), Trace_ELBO())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = svi.init(jax.random.PRNGKey(0), y, **model_kwargs)
    return guide, svi, state, [str(w.message) for w in caught]


@pytest.fixture(scope="module")
def set_up():
    """The scanned chain's guide right after ``svi.init`` (warm start off), its SVI, its
    state and the warnings the setup gave."""
    return _setup(scanned_chain, Y)


@pytest.fixture(scope="module")
def fitted():
    guide = UHAGuide(scanned_chain, K=4, warm_start_steps=0)
    svi = SVI(scanned_chain, guide, optax.adam(3e-3), Trace_ELBO())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the setup's, checked above; NumPyro's on Trace_ELBO
        params = svi.run(jax.random.PRNGKey(1), 1500, Y, progress_bar=False).params
    return guide, params


def test_a_scanned_chain_sets_up_and_says_why_its_states_are_not_drawn(set_up):
    guide, svi, state, messages = set_up
    said = [m for m in messages if "cannot draw them from their conditional" in m]
    assert len(said) == 1, messages
    assert "['c']" in said[0] and "infer_discrete" in said[0] and "['level']" in said[0]


def test_the_target_is_the_forward_algorithms_marginal(set_up):
    """The chain's log density at unconstrained (shift, logit stay): the prior, the
    forward algorithm's likelihood and the logit's Jacobian."""
    guide, svi, state, _ = set_up
    logdensity_fn = guide.get_logdensity_fn(svi.get_params(state), Y)
    for shift, u in [(0.3, 0.2), (-1.0, 1.5), (2.0, -0.7)]:
        stay = expit(u)
        by_hand = (
            norm.logpdf(shift, 0.0, SHIFT_SD) + beta_dist.logpdf(stay, 2.0, 2.0)
            + np.log(stay * (1 - stay)) + forward(Y, shift, stay)
        )
        z = guide.latent_from_samples({"shift": jnp.array(shift), "stay": jnp.array(stay)}, Y)
        np.testing.assert_allclose(float(logdensity_fn(z)), by_hand, rtol=1e-5)


@pytest.mark.slow
def test_trace_elbos_term_is_the_marginals_log_weight_draw_by_draw(fitted):
    """The states drawn from their prior enter the model's and the guide's terms alike,
    so Trace_ELBO's term is the core's log weight on the marginal, key by key."""
    guide, params = fitted
    terms, log_w, _ = elbo_terms_and_core_weights(
        guide, params, scanned_chain, Y, num_keys=4, keys_drawn=2
    )
    np.testing.assert_allclose(terms, log_w, rtol=1e-5, atol=2e-3)
    assert np.std(log_w) > 1e-3


def test_weights_estimate_the_exact_evidence_and_posterior_means(fitted):
    """Trained with Trace_ELBO: the weights' mean is the evidence and the weighted draws'
    means the posterior's, by quadrature; tolerances from the Monte Carlo standard
    errors."""
    guide, params = fitted
    draws = guide.sample_posterior_with_log_weights(
        jax.random.PRNGKey(2), params, Y, sample_shape=(4000,)
    )
    log_z, shift_mean, stay_mean = exact(Y)
    assert psis_khat(draws.log_weights) < 0.7  # the standard errors below mean something
    log_w = np.asarray(draws.log_weights, np.float64)
    w = np.exp(log_w - log_w.max())
    rel_se = w.std() / w.mean() / np.sqrt(w.size)
    assert abs(np.log(w.mean()) + log_w.max() - log_z) < 4 * rel_se + 1e-3
    normalized = w / w.sum()
    ess = 1.0 / np.sum(normalized**2)
    assert ess > 500, ess
    for name, mean in [("shift", shift_mean), ("stay", stay_mean)]:
        x = np.asarray(draws.samples[name], np.float64)
        weighted = normalized @ x
        sd = np.sqrt(normalized @ (x - weighted) ** 2)
        assert abs(weighted - mean) < 4 * sd / np.sqrt(ess), (name, weighted, mean)


def test_the_draws_leave_out_the_states_and_what_depends_on_them(fitted):
    guide, params = fitted
    draws = guide.sample_posterior(jax.random.PRNGKey(3), params, Y, sample_shape=(5,))
    assert set(draws) == {"shift", "stay", "double_shift"}
    np.testing.assert_allclose(draws["double_shift"], 2 * draws["shift"], rtol=1e-6)


def test_trace_enum_elbo_is_refused_on_a_scanned_chain(set_up):
    """NumPyro's enumerated scan does not replay the guide's draws of the states. (At
    the set-up params: the refusal does not depend on training.)"""
    guide, svi, state, _ = set_up
    params = svi.get_params(state)
    with pytest.raises(ValueError, match=r"TraceEnum_ELBO cannot train.*\['c'\].*scan"):
        TraceEnum_ELBO().loss(jax.random.PRNGKey(0), params, scanned_chain, guide, Y)


def test_predictive_warns_that_the_states_are_prior_draws(set_up):
    guide, svi, state, _ = set_up
    params = svi.get_params(state)
    with pytest.warns(UserWarning, match=r"in Predictive, the discrete latent site\(s\) \['c'\]"):
        out = Predictive(scanned_chain, guide=guide, params=params, num_samples=3)(
            jax.random.PRNGKey(4), Y
        )
    assert out["y"].shape == (3, Y.shape[0])


def test_the_pointwise_log_likelihood_is_refused_with_a_reason(fitted):
    guide, params = fitted
    with pytest.raises(ValueError, match=r"'y' depends on the discrete latent site\(s\) \['c'\]"):
        to_inference_data(guide, jax.random.PRNGKey(5), params, Y, num_samples=8)


@pytest.mark.slow
def test_a_long_markov_loop_every_elbos_term_is_the_log_weight(monkeypatch):
    """A ``markov`` loop whose states infer_discrete would draw through a table larger
    than the guide allows (2^5 entries against a limit lowered to 2^3 here; 2^30 for 30
    states against the real 2^27): the guide draws them from their prior; Trace_ELBO's
    and TraceEnum_ELBO's terms (no scan: replayed) are the core's log weights key by
    key."""
    monkeypatch.setattr(_enumerate, "MAX_SAMPLER_ELEMENTS", 2**3)
    y = _data(5, seed=1)
    guide, svi, state, messages = _setup(looped_chain, y)
    assert any("needs an array of" in m for m in messages), messages
    params = svi.get_params(state)
    terms, log_w, _ = elbo_terms_and_core_weights(
        guide, params, looped_chain, y, num_keys=3, keys_drawn=2
    )
    enum_terms = trace_enum_terms(guide, params, looped_chain, y, num_keys=3)
    np.testing.assert_allclose(terms, log_w, rtol=1e-5, atol=2e-3)
    np.testing.assert_allclose(enum_terms, log_w, rtol=1e-5, atol=2e-3)
    assert set(guide.sample_posterior(jax.random.PRNGKey(6), params, y, sample_shape=(2,))) == {
        "shift", "stay"
    }


def test_svi_init_under_jit_sets_up_as_the_eager_call(set_up):
    """The choice to draw the states from their prior is made from the traced program,
    so it holds when the setup itself runs under ``jax.jit``."""
    eager_guide, svi, state, _ = set_up
    guide = UHAGuide(scanned_chain, K=4, warm_start_steps=0)
    svi_jit = SVI(scanned_chain, guide, optax.adam(3e-3), Trace_ELBO())
    with pytest.warns(UserWarning, match="cannot draw them from their conditional"):
        jit_state = jax.jit(svi_jit.init)(jax.random.PRNGKey(0), Y)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        svi_jit.get_params(jit_state), svi.get_params(state),
    )
    key = jax.random.PRNGKey(7)
    np.testing.assert_allclose(
        Trace_ELBO().loss(key, svi_jit.get_params(jit_state), scanned_chain, guide, Y),
        Trace_ELBO().loss(key, svi.get_params(state), scanned_chain, eager_guide, Y),
        rtol=1e-5,
    )


def padded_sequences(y, lengths):
    """Several chains of different lengths in the columns of ``y``, padded to the longest
    and masked past each length (NumPyro's ``hmm_enum`` example's layout): a plate inside
    the scan step, and masked-out states."""
    stay = numpyro.sample("stay", dist.Beta(2.0, 2.0))
    loc = numpyro.sample("loc", dist.Normal(jnp.asarray(OFFSETS), 1.0).to_event(1))
    transition = _transition(stay)

    def step(carry, y_t):
        c_prev, t = carry
        with numpyro.plate("sequences", y.shape[1], dim=-1):
            with numpyro.handlers.mask(mask=t < lengths):
                c = numpyro.sample("c", dist.Categorical(transition[c_prev]))
                numpyro.sample("y", dist.Normal(loc[c], 0.7), obs=y_t)
        return (c, t + 1), None

    scan(step, (jnp.zeros(y.shape[1], jnp.int32), 0), y)


@pytest.mark.slow
def test_padded_sequences_target_each_chains_own_forward_algorithm():
    """The padding steps (states and observations masked out) count nothing: the target
    is the sum over sequences of each one's forward algorithm over its own length (summed
    out, a masked state would count log 2 per step: 13 log 2 = 9.01 nats here), and
    Trace_ELBO's term is the core's log weight."""
    rng = np.random.default_rng(2)
    lengths = jnp.array([12, 8, 10, 5, 12])
    y = jnp.asarray(rng.normal(size=(12, 5)) * 0.7 + np.where(rng.random((12, 5)) < 0.5, -1, 1),
                    jnp.float32)
    guide, svi, state, _ = _setup(padded_sequences, y, lengths=lengths)
    params = svi.get_params(state)
    logdensity_fn = guide.get_logdensity_fn(params, y, lengths)

    def each_chain(stay, loc):
        log_t = np.log(np.array([[stay, 1 - stay], [1 - stay, stay]]))
        total = 0.0
        for n, length in enumerate(np.asarray(lengths)):
            alpha = log_t[0] + norm.logpdf(float(y[0, n]), loc, 0.7)
            for t in range(1, int(length)):
                alpha = logsumexp(alpha[:, None] + log_t, axis=0) + norm.logpdf(float(y[t, n]), loc, 0.7)
            total += logsumexp(alpha)
        return total

    for u, loc in [(0.3, np.array([-0.8, 1.2])), (-1.0, np.array([0.5, 0.1]))]:
        stay = expit(u)
        by_hand = (beta_dist.logpdf(stay, 2.0, 2.0) + np.log(stay * (1 - stay))
                   + norm.logpdf(loc, OFFSETS, 1.0).sum() + each_chain(stay, loc))
        z = guide.latent_from_samples(
            {"stay": jnp.array(stay), "loc": jnp.asarray(loc, jnp.float32)}, y, lengths
        )
        np.testing.assert_allclose(float(logdensity_fn(z)), by_hand, rtol=1e-5)
    terms, log_w, _ = elbo_terms_and_core_weights(
        guide, params, padded_sequences, y, lengths, num_keys=3, keys_drawn=2
    )
    np.testing.assert_allclose(terms, log_w, rtol=1e-5, atol=2e-3)
