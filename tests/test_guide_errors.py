"""Bad input to UHAGuide gets a clear error that names the argument or the site."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Predictive, Trace_ELBO

from numpyro_uha import UHAGuide
from numpyro_uha.guide import UHADivergenceError, UHADivergenceWarning


def normal_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


Y = jnp.array([0.5, -0.3, 1.2])


def assert_all_finite(tree):
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        assert bool(jnp.all(jnp.isfinite(leaf))), f"non-finite values at {path}"


def svi_for(model, guide, loss=None, lr=1e-2):
    return SVI(model, guide, optax.adam(lr), loss or Trace_ELBO())


# ---------------------------------------------------------------------- constructor

BAD_ARGUMENTS = [
    pytest.param({"K": 0}, r"^K must be", id="K=0"),
    pytest.param({"K": -1}, r"^K must be", id="K=-1"),
    pytest.param({"K": 1.5}, r"^K must be", id="K=1.5"),
    pytest.param({"K": True}, r"^K must be", id="K=True"),
    pytest.param({"num_leapfrog_steps": 0}, "num_leapfrog_steps", id="num_leapfrog_steps=0"),
    pytest.param({"init_step_size": 0.0}, "init_step_size", id="init_step_size=0"),
    pytest.param({"init_step_size": -0.1}, "init_step_size", id="init_step_size<0"),
    pytest.param(
        {"init_step_size": 1.0, "max_step_size": 1.0}, "init_step_size", id="init_step_size=max"
    ),
    pytest.param(
        {"init_step_size": 2.0, "max_step_size": 1.0}, "init_step_size", id="init_step_size>max"
    ),
    pytest.param({"max_step_size": 0.0}, "max_step_size", id="max_step_size=0"),
    pytest.param({"max_step_size": -1.0}, "max_step_size", id="max_step_size<0"),
    pytest.param({"init_damping": 1.0}, "damping", id="init_damping=1"),
    pytest.param({"init_damping": -0.1}, "damping", id="init_damping<0"),
    pytest.param({"init_scale": 0.0}, "init_scale", id="init_scale=0"),
    pytest.param({"init_scale": -1.0}, "init_scale", id="init_scale<0"),
    pytest.param({"init_scale": float("inf")}, "init_scale", id="init_scale=inf"),
    pytest.param({"base_dist": "full"}, "base_dist", id="base_dist=full"),
    pytest.param({"warm_start_steps": -1}, "warm_start_steps", id="warm_start_steps<0"),
    pytest.param({"sample_batch_size": 0}, "sample_batch_size", id="sample_batch_size=0"),
    pytest.param(
        {"warm_start_learning_rate": 0.0},
        "warm_start_learning_rate",
        id="warm_start_learning_rate=0",
    ),
    pytest.param({"init_from": "vi"}, "init_from", id="init_from-not-a-pair"),
    pytest.param({"decenter": True}, "decenter must be 'auto'", id="decenter=True"),
    pytest.param({"decenter": 1}, "decenter must be 'auto'", id="decenter=1"),
    pytest.param(
        {"integrator": "leapfrog"}, "integrator must be one of.*position_verlet",
        id="integrator-unknown",
    ),
]


@pytest.mark.parametrize("kwargs, match", BAD_ARGUMENTS)
def test_bad_constructor_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        UHAGuide(normal_model, **kwargs)


@pytest.mark.parametrize(
    "model, prefix, match",
    [(None, "auto", "model must be a callable"), (3, "auto", "model must be a callable"),
     (normal_model, 3, "prefix must be a non-empty string"),
     (normal_model, "", "prefix must be a non-empty string")],
)
def test_a_model_that_is_not_callable_or_a_prefix_that_is_not_a_string(model, prefix, match):
    with pytest.raises(TypeError, match=match):
        UHAGuide(model, prefix=prefix)


def test_unknown_frozen_group_is_listed():
    with pytest.raises(ValueError, match="foo") as info:
        UHAGuide(normal_model, frozen=("foo", "q"))
    message = str(info.value)
    assert "frozen" in message and "'q'" in message.split("Valid groups")[1]
    assert "['foo']" in message  # only the unknown name is reported as unknown


@pytest.mark.parametrize(
    "frozen, fixed",
    [
        pytest.param("q", {"auto_loc", "auto_scale"}, id="q"),
        pytest.param("damping", {"auto_damping"}, id="damping"),
    ],
)
def test_frozen_as_a_single_string(frozen, fixed):
    # a string is one group name, not an iterable of one-letter names: only that group
    # stays fixed under training
    guide = UHAGuide(normal_model, K=2, warm_start_steps=0, frozen=frozen)
    assert guide.frozen == frozenset({frozen})
    svi = svi_for(normal_model, guide)
    state = svi.init(jax.random.PRNGKey(0), Y)
    before = svi.get_params(state)
    for _ in range(3):
        state, _ = svi.update(state, Y)
    after = svi.get_params(state)
    changed = {n for n in before if not np.array_equal(before[n], after[n])}
    assert not fixed & changed
    assert {"auto_step_size", "auto_beta_logits"} <= changed


def test_valid_boundary_arguments_are_accepted():
    guide = UHAGuide(normal_model, K=np.int64(1), init_damping=0.0, num_leapfrog_steps=3)
    assert guide.K == 1 and 0.0 < guide.init_damping < 1e-3  # nudged inside (0, 1)


def test_a_small_max_step_size_alone_lowers_the_default_initial_step():
    # the divergence errors advise a smaller max_step_size; below the default initial ε
    # it no longer needs init_step_size too
    from numpyro_uha import UHALocalGuide

    assert UHAGuide(normal_model).init_step_size == 0.25
    assert UHAGuide(normal_model, max_step_size=0.01).init_step_size == 0.005
    assert UHAGuide(normal_model, max_step_size=0.01, init_step_size=0.002).init_step_size == 0.002
    assert UHALocalGuide(normal_model, max_step_size=0.01).init_step_size == 0.005
    with pytest.raises(ValueError, match="init_step_size must satisfy"):
        UHAGuide(normal_model, max_step_size=0.01, init_step_size=0.25)


@pytest.mark.parametrize(
    "name, value",
    [
        pytest.param("init_step_size", np.float32(0.1), id="init_step_size-float32"),
        pytest.param("max_step_size", np.float32(0.5), id="max_step_size-float32"),
        pytest.param("init_damping", np.float32(0.5), id="init_damping-float32"),
        pytest.param("init_scale", np.float32(0.5), id="init_scale-float32"),
        pytest.param("init_step_size", jnp.asarray(0.1), id="init_step_size-jax-scalar"),
    ],
)
def test_numpy_and_jax_scalar_arguments_are_accepted(name, value):
    guide = UHAGuide(normal_model, **{name: value})
    stored = guide._init_scale if name == "init_scale" else getattr(guide, name)
    assert type(stored) is float and stored == pytest.approx(float(value))


@pytest.mark.parametrize(
    "name, value",
    [
        pytest.param("init_step_size", True, id="init_step_size=True"),
        pytest.param("init_scale", [0.5], id="init_scale-list"),
        pytest.param("init_damping", np.array([0.5, 0.5]), id="init_damping-array"),
        pytest.param("max_step_size", "1.0", id="max_step_size-str"),
    ],
)
def test_non_scalar_real_arguments_are_rejected(name, value):
    with pytest.raises(ValueError, match=name):
        UHAGuide(normal_model, **{name: value})


# ------------------------------------------------------------------ model validation


def discrete_model(y):
    # a discrete site with infinite support: it cannot be summed out (tests/test_enumerate.py
    # for those that can)
    k = numpyro.sample("k", dist.Poisson(0.5))
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu + k, 1.0), obs=y)


def subsampled_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", 100, subsample_size=10):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def all_observed_model(y):
    numpyro.sample("y", dist.Normal(0.0, 1.0).expand([y.shape[0]]).to_event(1), obs=y)


@pytest.mark.parametrize(
    "model, args, match",
    [
        pytest.param(discrete_model, (Y,), r"'k'.*discrete", id="discrete-latent"),
        pytest.param(
            subsampled_model, (jnp.zeros(10),), r"plate 'data' subsamples.*UHALocalGuide",
            id="subsampling-plate",
        ),
        pytest.param(
            all_observed_model, (Y,), "no continuous latent sample site", id="no-latent-site"
        ),
    ],
)
def test_unsupported_model_fails_at_init(model, args, match):
    guide = UHAGuide(model, K=2, warm_start_steps=0)
    with pytest.raises(ValueError, match=match):
        svi_for(model, guide).init(jax.random.PRNGKey(0), *args)


def minus_inf_model():
    x = numpyro.sample("x", dist.Normal(0.0, 1.0))
    numpyro.factor("bad", jnp.where(x > -100.0, -jnp.inf, 0.0))


WARM_STARTS = [
    pytest.param({"warm_start_steps": 0}, id="no-warm-start"),
    pytest.param({}, id="default-warm-start"),
]


@pytest.mark.parametrize("kwargs", WARM_STARTS)
def test_non_finite_initial_log_density_fails_at_init(kwargs):
    # numpyro's initialize_model finds no finite point; the guide turns its generic
    # RuntimeError into a ValueError naming the offending site, before any warm start
    guide = UHAGuide(minus_inf_model, K=2, **kwargs)
    with pytest.raises(ValueError, match=r"log density.*\['bad'\]"):
        svi_for(minus_inf_model, guide).init(jax.random.PRNGKey(0))
    with pytest.raises(RuntimeError, match="not been initialized"):  # nothing was set up
        guide.sample_posterior(jax.random.PRNGKey(0), {})


# ------------------------------------------------------------------------- sampling


def test_sample_posterior_before_setup_raises():
    guide = UHAGuide(normal_model)
    with pytest.raises(RuntimeError, match="not been initialized"):
        guide.sample_posterior(jax.random.PRNGKey(0), {}, Y)
    with pytest.raises(RuntimeError, match="not been initialized"):
        guide.sample_posterior_with_log_weights(jax.random.PRNGKey(0), {}, Y)
    with pytest.raises(RuntimeError, match="not been initialized"):
        guide.get_annealing_params({})


def test_median_and_quantiles_before_setup_raise_not_initialized():
    guide = UHAGuide(normal_model)
    with pytest.raises(RuntimeError, match="not been initialized"):
        guide.median({})
    with pytest.raises(RuntimeError, match="not been initialized"):
        guide.quantiles({}, [0.5], Y)


@pytest.fixture(scope="module")
def initialized():
    guide = UHAGuide(normal_model, K=2, warm_start_steps=0)
    svi = svi_for(normal_model, guide)
    return guide, svi.get_params(svi.init(jax.random.PRNGKey(0), Y))


@pytest.mark.parametrize("shape", [(-1,), (2.5,), (2, "3"), None, (True,)])
def test_bad_sample_shape_is_named(initialized, shape):
    guide, params = initialized
    with pytest.raises(ValueError, match="sample_shape must be a tuple of non-negative"):
        guide.sample_posterior(jax.random.PRNGKey(0), params, Y, sample_shape=shape)


def test_an_int_sample_shape_is_one_dimensional_and_num_samples_must_be_positive(initialized):
    guide, params = initialized
    draws = guide.sample_posterior(jax.random.PRNGKey(0), params, Y, sample_shape=np.int64(3))
    assert all(v.shape[0] == 3 for v in draws.values())
    for method in (guide.median, lambda *a, **k: guide.quantiles(a[0], [0.5], *a[1:], **k)):
        with pytest.raises(ValueError, match="num_samples must be an integer >= 1, got 0"):
            method(params, Y, num_samples=0)


@pytest.mark.parametrize("name", ["auto_loc", "auto_step_size"])
def test_sample_posterior_with_nan_params_names_the_param(initialized, name):
    guide, params = initialized
    bad = dict(params, **{name: jnp.full_like(params[name], jnp.nan)})
    with pytest.raises(FloatingPointError, match=name):
        guide.sample_posterior(jax.random.PRNGKey(0), bad, Y)
    with pytest.raises(FloatingPointError, match=name):
        guide.sample_posterior_with_log_weights(jax.random.PRNGKey(0), bad, Y)


@pytest.mark.parametrize(
    "name, value", [("auto_step_size", -0.1), ("auto_damping", 1.5), ("auto_momentum_scale", -1.0)]
)
def test_a_hand_set_param_outside_its_constraint_is_named_not_put_down_to_the_lr(
    initialized, name, value
):
    # where SVI would hold NaN for it and every step would diverge, with advice to lower
    # the learning rate
    guide, params = initialized
    bad = dict(params, **{name: jnp.full_like(params[name], value)})
    match = f"params\\['{name}'\\] has a value {value:g} outside"
    with pytest.raises(ValueError, match=match):
        svi_for(normal_model, guide).run(
            jax.random.PRNGKey(1), 2, Y, progress_bar=False, init_params=bad
        )
    for call in (
        lambda: guide.sample_posterior(jax.random.PRNGKey(0), bad, Y),
        lambda: Predictive(normal_model, guide=guide, params=bad, num_samples=3)(
            jax.random.PRNGKey(0), Y
        ),
    ):
        with pytest.raises(ValueError, match=match):
            call()


def test_params_on_their_constraints_bounds_are_accepted(initialized):
    # a trained value can round onto a bound (sigmoid(20) is 1 in float32)
    guide, params = initialized
    edge = dict(params, auto_step_size=jnp.float32(guide.max_step_size), auto_damping=jnp.float32(1.0))
    guide.get_annealing_params(edge)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Predictive(normal_model, guide=guide, params=edge, num_samples=3)(jax.random.PRNGKey(0), Y)


def test_a_step_at_a_cap_that_float32_rounds_up_is_accepted_and_extrapolated():
    # float32(0.3) is 0.30000001 (above the cap 0.3); extrapolate rescales a step at its
    # cap by a float64 factor: both are the fit's own values, not values set by hand
    guide = UHAGuide(normal_model, K=4, warm_start_steps=0, max_step_size=0.3)
    svi = svi_for(normal_model, guide)
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), Y))
    at_cap = dict(params, auto_step_size=jnp.float32(0.3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # (whether the draws diverge at these steps is not the question here)
        guide.sample_posterior(jax.random.PRNGKey(0), at_cap, Y, sample_shape=(3,), nonfinite="keep")
        new, new_params = guide.extrapolate(at_cap, 16)
        new.sample_posterior(jax.random.PRNGKey(0), new_params, Y, sample_shape=(3,), nonfinite="keep")


def test_params_are_checked_again_when_they_change_in_place_or_are_replaced(initialized):
    """The check's result is remembered for the last params seen, by identity of their
    (immutable) JAX arrays only: NumPy params changed in place, and a new JAX array in
    the same dict structure, are checked again."""
    guide, params = initialized
    guide.sample_posterior(jax.random.PRNGKey(0), params, Y)
    guide.sample_posterior(jax.random.PRNGKey(0), params, Y)  # the same: remembered
    host = {k: np.array(v) for k, v in params.items()}
    guide.sample_posterior(jax.random.PRNGKey(0), host, Y)
    host["auto_loc"][0] = np.nan
    with pytest.raises(FloatingPointError, match="auto_loc"):
        guide.sample_posterior(jax.random.PRNGKey(0), host, Y)
    replaced = dict(params, auto_loc=params["auto_loc"].at[0].set(jnp.nan))
    with pytest.raises(FloatingPointError, match="auto_loc"):
        guide.sample_posterior(jax.random.PRNGKey(0), replaced, Y)
    guide.sample_posterior(jax.random.PRNGKey(0), params, Y)  # the good ones again


def test_nan_data_at_draw_time_names_the_site_not_the_dynamics(initialized):
    """Set up on finite data, drawn with a NaN in y: every weight is non-finite because
    of the data, and the error says so (it used to blame the step size)."""
    guide, params = initialized
    with pytest.raises(ValueError, match=r"data are not finite: observed site\(s\) 'y' "
                       r"\(NaN or inf at flat index \[1\]\)"):
        guide.sample_posterior(jax.random.PRNGKey(0), params, Y.at[1].set(jnp.nan),
                               sample_shape=(8,))




def masked_normal_model(y, seen):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y, obs_mask=seen)


@pytest.mark.parametrize("call", ["predictive", "svi_update", "svi_run"])
def test_nan_data_in_a_call_of_the_guide_names_the_site(initialized, call):
    """Set up on finite data, called with a NaN in y by Predictive (which returned NaN
    draws, silently), by svi.update (a NumPyro error about the model's loc) and by
    svi.run's compiled step: the error names the site and the entry."""
    guide, params = initialized
    bad = Y.at[1].set(jnp.nan)
    match = r"data are not finite: observed site\(s\) 'y' \(NaN or inf at flat index \[1\]\)"
    with pytest.raises(ValueError, match=match):
        if call == "predictive":
            Predictive(normal_model, guide=guide, params=params, num_samples=4)(
                jax.random.PRNGKey(1), bad
            )
        else:
            svi = svi_for(normal_model, guide)
            state = svi.init(jax.random.PRNGKey(0), Y)
            if call == "svi_update":
                svi.update(state, bad)
            else:
                svi.run(jax.random.PRNGKey(0), 2, bad, init_state=state, progress_bar=False)


def test_nan_data_masked_out_is_not_refused():
    """NaN entries masked out by obs_mask are no error: Predictive's draws are finite."""
    y, seen = Y.at[1].set(jnp.nan), jnp.array([True, False, True])
    guide = UHAGuide(masked_normal_model, K=2, warm_start_steps=0)
    svi = svi_for(masked_normal_model, guide)
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), y, seen))
    draws = Predictive(masked_normal_model, guide=guide, params=params, num_samples=4,
                       return_sites=["mu"])(jax.random.PRNGKey(1), y, seen)
    assert np.all(np.isfinite(draws["mu"]))

@pytest.mark.filterwarnings("ignore:.*Out-of-support")
@pytest.mark.parametrize("kwargs", WARM_STARTS)
def test_nan_data_at_set_up_names_the_site_and_the_entry(kwargs):
    """A NaN in the data at set-up: no initial point is finite, and the error says the
    data are why (naming the site and the entry), not the model or init_loc_fn."""
    guide = UHAGuide(normal_model, K=2, **kwargs)
    with pytest.raises(ValueError, match=r"because the data are not: observed site\(s\) "
                       r"'y' \(NaN or inf at flat index \[2\]\).*obs_mask"):
        svi_for(normal_model, guide).init(jax.random.PRNGKey(0), Y.at[2].set(jnp.nan))

def basis_model(x, y, n_basis):
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([n_basis]).to_event(1))
    features = jnp.stack([x**j for j in range(n_basis)], -1)
    numpyro.sample("y", dist.Normal(features @ beta, 1.0), obs=y)


def test_a_latent_that_changed_shape_is_named():
    """A Python int argument sizes a latent: another value after set-up is named."""
    x = jnp.linspace(-1, 1, 5)
    guide = UHAGuide(basis_model, K=2, warm_start_steps=0)
    svi = svi_for(basis_model, guide)
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), x, x, 3))
    with pytest.raises(ValueError, match=r"'beta' from \(3,\) to \(2,\)"):
        guide.sample_posterior(jax.random.PRNGKey(0), params, x, x, 2, sample_shape=(4,))


def test_missing_param_is_a_clear_keyerror(initialized):
    guide, params = initialized
    params = {k: v for k, v in params.items() if k != "auto_damping"}
    with pytest.raises(KeyError, match="auto_damping"):
        guide.get_annealing_params(params)


# -------------------------------------------------------------- diverging training


def nan_outside_model():
    """Finite (and flat) for |x| < 3, NaN outside, in value *and* gradient."""
    x = numpyro.sample("x", dist.Normal(0.0, 1.0))
    numpyro.factor("nan_outside", 0.0 * jnp.sqrt(9.0 - x**2))


def nan_value_model():
    """NaN value for |x| > 3 but a zero gradient everywhere (jnp.where of constants)."""
    x = numpyro.sample("x", dist.Normal(0.0, 1.0))
    numpyro.factor("nan_outside", jnp.where(jnp.abs(x) > 3.0, jnp.nan, 0.0))


def diverging_guide(model, **kwargs):
    # q starts 3 sds wide around a point in (-2, 2) and ε is near its maximum, so the
    # draws leave |x| < 3 in the first steps.
    return UHAGuide(
        model,
        K=2,
        warm_start_steps=0,
        init_scale=3.0,
        init_step_size=0.9,
        max_step_size=1.0,
        **kwargs,
    )


LOSSES = [
    pytest.param(Trace_ELBO(), id="one-particle"),
    pytest.param(Trace_ELBO(num_particles=4, vectorize_particles=True), id="vectorized-4"),
]


@pytest.mark.parametrize(
    "loss, progress_bar",
    # each loss and each driver (one scan, or a Python loop with a progress bar) by
    # default; the other two pairings with `pytest -m slow`
    [
        pytest.param(LOSSES[0].values[0], False, id="one-particle-scan"),
        pytest.param(LOSSES[1].values[0], True, id="vectorized-4-progress-bar"),
        pytest.param(
            LOSSES[0].values[0], True, id="one-particle-progress-bar", marks=pytest.mark.slow
        ),
        pytest.param(LOSSES[1].values[0], False, id="vectorized-4-scan", marks=pytest.mark.slow),
    ],
)
def test_diverging_training_warns_then_draws_raise(loss, progress_bar):
    # Nothing is raised inside the compiled step (undefined behaviour in JAX, swallowed
    # on GPU): svi.run warns at its end (svi.get_params, values concrete), keeps finite
    # parameters, and the fit's draws, which diverge, raise a plain FloatingPointError
    # holding the parameters of the first diverging step.
    guide = diverging_guide(nan_value_model)
    svi = svi_for(nan_value_model, guide, loss=loss)
    with pytest.warns(UHADivergenceWarning, match="non-finite log weight"):
        result = svi.run(jax.random.PRNGKey(0), 20, progress_bar=progress_bar)
    assert_all_finite(result.params)
    with pytest.raises(FloatingPointError, match="non-finite log weight") as info:
        guide.sample_posterior(
            jax.random.PRNGKey(1), result.params, sample_shape=(200,), nonfinite="raise"
        )
    assert type(info.value) is UHADivergenceError
    assert "max_step_size" in str(info.value) and "init_params" in str(info.value)
    assert "draws from its prior" not in str(info.value)  # its prior reaches no NaN
    assert info.value.params is guide.last_finite_params
    assert_all_finite(info.value.params)


def naive_logistic(x, y):
    """A logistic likelihood written by hand: in float32 p is exactly 1 where a + b x
    passes about 17, and (1 - y) log(1 - p) is then 0 * -inf = NaN (at most of the
    posterior's draws for these data)."""
    a = numpyro.sample("a", dist.Normal(0.0, 5.0))
    b = numpyro.sample("b", dist.Normal(0.0, 5.0))
    p = jax.nn.sigmoid(a + b * x)
    numpyro.factor("loglik", jnp.sum(y * jnp.log(p) + (1 - y) * jnp.log(1 - p)))


def _logistic_data():
    rng = np.random.default_rng(3)
    x = rng.normal(0.0, 3.0, size=60)
    y = rng.uniform(size=60) < 1 / (1 + np.exp(-(0.5 + 3.0 * x)))
    return jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)


@pytest.mark.parametrize("warm_start_steps", [1000, 0])
def test_a_nan_in_the_models_arithmetic_is_named_not_put_down_to_the_step_size(
    warm_start_steps,
):
    # the warm start diverges and says why (the site whose log probability is NaN at
    # draws from the prior); without a warm start the draws' error finds it; either
    # way the error names the site instead of advising a smaller learning rate
    x, y = _logistic_data()
    guide = UHAGuide(naive_logistic, K=4, warm_start_steps=warm_start_steps)
    svi = svi_for(naive_logistic, guide)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = svi.run(jax.random.PRNGKey(0), 50, x, y, progress_bar=False)
    named = r"NaN at \d+ of 16 draws from its prior, from site\(s\) \['loglik'\]"
    fallback = [str(w.message) for w in caught if "warm start diverged" in str(w.message)]
    if warm_start_steps:
        assert len(fallback) == 1 and re.search(named, fallback[0])
    with pytest.raises(UHADivergenceError, match=named) as info:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            guide.sample_posterior(jax.random.PRNGKey(1), result.params, x, y, sample_shape=(200,))
    assert "diverge at these parameters" not in str(info.value)  # not the step-size error


@pytest.mark.parametrize(
    "loss",
    [LOSSES[0], pytest.param(LOSSES[1].values[0], id="vectorized-4", marks=pytest.mark.slow)],
)
def test_diverging_user_loop_keeps_the_last_finite_fit(loss):
    # nan_outside_model is NaN in value *and* gradient: without the gate NaN would reach
    # the parameters at the first diverging step.
    guide = diverging_guide(nan_outside_model)
    svi = svi_for(nan_outside_model, guide, loss=loss)
    state = svi.init(jax.random.PRNGKey(0))
    update = jax.jit(svi.update)
    raw = [svi.optim.get_params(state.optim_state)]
    losses = []
    for _ in range(15):
        state, loss_value = update(state)
        losses.append(float(loss_value))
        raw.append(svi.optim.get_params(state.optim_state))
    first = next(i for i, value in enumerate(losses) if not np.isfinite(value))
    # the optimizer's own (unconstrained) values stay finite at every step
    for values in raw:
        assert_all_finite(values)
    # the latch is off before the first diverging step and on from then on
    latch = [float(values["auto_diverged"]) for values in raw]
    assert all(v == 0 for v in latch[: first + 1]) and all(v != 0 for v in latch[first + 1 :])
    # the record holds the parameters the diverging step started from
    before = svi.constrain_fn(raw[first])
    for name, value in guide.last_finite_params.items():
        np.testing.assert_allclose(value, before[name], rtol=1e-6)
    # concrete uses warn; draws that diverge raise, with the same parameters attached
    with pytest.warns(UHADivergenceWarning):
        svi.get_params(state)
    with pytest.raises(UHADivergenceError) as info:
        guide.sample_posterior(
            jax.random.PRNGKey(1), svi.constrain_fn(raw[-1]), sample_shape=(200,)
        )
    assert info.value.params is guide.last_finite_params
    # resuming from the last finite fit with a smaller step works
    resumed = svi.run(
        jax.random.PRNGKey(2), 5, progress_bar=False,
        init_params={
            **info.value.params,
            "auto_step_size": jnp.asarray(0.05),
            "auto_scale": jnp.asarray([0.3]),
        },
    )
    assert_all_finite(resumed.params)


def nan_beyond_model():
    """N(0, 1), but NaN in value and gradient for |x| > 2.2: q's tails diverge rarely."""
    x = numpyro.sample("x", dist.Normal(0.0, 1.0))
    numpyro.factor("nan_beyond", 0.0 * jnp.sqrt(2.2**2 - x**2))


def test_rare_divergences_do_not_stop_training():
    # About 3 % of the draws from q = N(0, 1) leave |x| < 2.2 at some point of their
    # trajectory; each such step is skipped and training goes on (it used to freeze every
    # parameter at the first one).
    guide = UHAGuide(nan_beyond_model, K=4, warm_start_steps=0, init_scale=1.0)
    svi = svi_for(nan_beyond_model, guide)
    state = svi.init(jax.random.PRNGKey(0))
    update = jax.jit(svi.update)
    raw, finite = [], []
    for _ in range(300):
        state, loss_value = update(state)
        raw.append(svi.optim.get_params(state.optim_state))
        finite.append(bool(np.isfinite(float(loss_value))))
    assert 0 < finite.count(False) < 60, finite.count(False)
    first = finite.index(False)
    for values in raw:
        assert_all_finite(values)
    # parameters keep moving after the first diverging step (with training frozen there,
    # Adam's momentum would have decayed to 0.9^100 of a step by first + 100)
    assert first < 150, first
    after = np.array([float(values["auto_loc"][0]) for values in raw[first + 100 :]])
    assert np.ptp(after) > 1e-3, np.ptp(after)
    assert guide._divergence.count == finite.count(False)
    with pytest.warns(UHADivergenceWarning, match=f"{finite.count(False)} training step"):
        params = svi.get_params(state)
    assert_all_finite(params)


def test_check_finite_false_lets_nan_reach_params():
    guide = diverging_guide(nan_outside_model, check_finite=False)
    svi = svi_for(nan_outside_model, guide)
    result = svi.run(jax.random.PRNGKey(0), 20, progress_bar=False)
    assert not bool(jnp.all(jnp.isfinite(result.losses)))
    assert not bool(jnp.all(jnp.isfinite(result.params["auto_loc"])))
    with pytest.raises(FloatingPointError, match="auto_loc"):
        guide.sample_posterior(jax.random.PRNGKey(1), result.params, sample_shape=(10,))


def test_check_finite_false_with_nan_value_only_fails_at_sampling():
    # jnp.where of constants has a zero gradient, so training goes on with NaN losses
    # but finite parameters; the non-finite log weights are caught when sampling. With
    # this seed the velocity Verlet draws end outside |x| < 3 (the position Verlet ones
    # happen to stay inside: max |x| 2.94 of 200), and the check is about the guard.
    guide = diverging_guide(nan_value_model, check_finite=False, integrator="velocity_verlet")
    svi = svi_for(nan_value_model, guide)
    result = svi.run(jax.random.PRNGKey(0), 20, progress_bar=False)
    assert not bool(jnp.all(jnp.isfinite(result.losses)))
    for value in result.params.values():
        assert bool(jnp.all(jnp.isfinite(value)))
    with pytest.raises(FloatingPointError, match="non-finite log weight"):
        guide.sample_posterior(jax.random.PRNGKey(1), result.params, sample_shape=(200,))


def nan_near_model():
    """N(0, 1), but NaN in value and gradient for |x| > 0.5: every warm start diverges."""
    x = numpyro.sample("x", dist.Normal(0.0, 1.0))
    numpyro.factor("nan_near", 0.0 * jnp.sqrt(0.25 - x**2))


def test_diverging_warm_start_warns_and_falls_back():
    guide = UHAGuide(nan_near_model, K=2, warm_start_steps=50, init_scale=3.0)
    svi = svi_for(nan_near_model, guide)
    with pytest.warns(RuntimeWarning, match="warm start diverged"):
        params = svi.get_params(svi.init(jax.random.PRNGKey(0)))
    # q falls back to init_loc_fn and init_scale
    np.testing.assert_allclose(params["auto_scale"], 3.0, rtol=1e-5)
    assert bool(jnp.all(jnp.isfinite(params["auto_loc"])))


def narrow_model():
    """N(0, 0.01²): a leapfrog step of 0.9 in units of q = N(·, 1) is 90 posterior sds."""
    numpyro.sample("x", dist.Normal(0.0, 0.01))


def test_a_finite_but_exploded_trajectory_gives_no_gradient():
    # The unstable leapfrog multiplies the energy by ~10^5 per step: after 2 steps the
    # log weight is about -1e14, finite, and its gradient about as large (1e11 to 1e15).
    # Such a particle (energy error > 1000 nats, NUTS's rule) counts as diverged: no
    # gradient from it, or Adam's second moment would freeze training for thousands of
    # steps. Only the energy rule marks it: its weight and gradients are finite (with the
    # threshold at 1e30 every gradient here is nonzero and the latch's is 0).
    guide = UHAGuide(narrow_model, K=2, warm_start_steps=0, init_scale=1.0, init_step_size=0.3)
    svi = svi_for(narrow_model, guide)
    state = svi.init(jax.random.PRNGKey(0))
    raw = svi.optim.get_params(state.optim_state)

    def loss(raw_params, key):
        return Trace_ELBO().loss(key, svi.constrain_fn(raw_params), narrow_model, guide)

    value, grads = jax.jit(jax.value_and_grad(loss))(raw, jax.random.PRNGKey(1))
    assert np.isfinite(float(value)) and float(value) > 1e6
    for name, g in grads.items():
        if name != "auto_diverged":
            assert bool(jnp.all(g == 0)), (name, g)
    assert float(grads["auto_diverged"]) == 1.0  # the latch sees the diverged particle


@pytest.mark.parametrize("branch", [False, True])
def test_a_models_own_error_at_setup_is_shown_once_and_not_chained(branch):
    """A modelling mistake (shapes that do not broadcast) raised at ``svi.init`` showed
    the guide's own abstract probe failing first ("During handling of the above
    exception, another exception occurred"), led by an unrelated
    TracerBoolConversionError where the model also branches on a latent value."""
    x = np.linspace(-1.0, 1.0, 50)

    def model(x, y=None):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        if branch and a > 0:  # Python control flow on a latent: not traceable
            pass
        b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([3]))
        numpyro.sample("y", dist.Normal(a + b * x, 1.0), obs=y)  # (3,) * (50,)

    svi = SVI(model, UHAGuide(model, K=2), optax.adam(1e-3), Trace_ELBO())
    with pytest.raises(TypeError, match="broadcast") as info:
        svi.init(jax.random.PRNGKey(0), x, 2 * x)
    chain, error = [], info.value
    while error is not None:
        chain.append(type(error).__name__)
        error = error.__cause__ or error.__context__
    assert chain == ["TypeError"], chain


def test_forward_mode_training_says_the_guide_is_trained_in_reverse_mode():
    """svi.run(forward_mode_differentiation=True) (NumPyro's option for models with a
    while_loop) meets the guide's reverse-mode gradient guards inside JAX: its TypeError
    must say so and what to do, not only that custom_vjp has no JVP."""
    svi = svi_for(normal_model, UHAGuide(normal_model, K=2, warm_start_steps=0))
    with pytest.raises(TypeError) as info:
        svi.run(jax.random.PRNGKey(0), 2, Y, progress_bar=False, forward_mode_differentiation=True)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "reverse-mode differentiation only" in notes and "Train without that option" in notes


def test_params_of_another_k_name_the_extrapolate_call(initialized):
    """The message's call must be the method's own: extrapolate(params, K), on the guide
    that made the fit (the message once said extrapolate(K, params))."""
    guide, params = initialized
    other = UHAGuide(normal_model, K=5, warm_start_steps=0)
    svi_for(normal_model, other).init(jax.random.PRNGKey(0), Y)
    with pytest.raises(ValueError, match=r"old_guide\.extrapolate\(params, 5\)"):
        other.sample_posterior(jax.random.PRNGKey(0), params, Y, sample_shape=(3,))
    # and the call it names works: the K = 2 fit carried over to K = 5
    new_guide, new_params = guide.extrapolate(params, 5)
    draws = new_guide.sample_posterior(jax.random.PRNGKey(0), new_params, Y, sample_shape=(3,))
    assert draws["mu"].shape == (3,)


def test_a_warm_start_with_infinite_losses_says_so_not_that_its_loss_fell_by_nan():
    """A factor of -inf cuts the support (a < b): some of the warm start's draws from q
    fall outside it and its loss is infinite at some steps. The warning said the loss
    'fell by nan ± nan nats' (and NumPy warned of invalid values): it must say the loss
    was not finite, and no NaN may appear in it."""

    def cut_model():
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        numpyro.factor("c", jnp.where(a < b, 0.0, -jnp.inf))

    guide = UHAGuide(cut_model, K=2, warm_start_steps=200)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        svi_for(cut_model, guide).init(jax.random.PRNGKey(0))
    messages = [str(w.message) for w in caught]
    assert any("warm start's loss was not finite at" in m for m in messages), messages
    assert not any("nan" in m.lower().replace("-inf or nan", "") for m in messages), messages


def test_a_gradient_that_is_not_finite_at_the_start_is_named():
    """The log density is finite at w = 0 but the gradient of ||w|| is NaN there: the
    setup's error said no site had a non-finite log probability and to 'check factors
    and gradients'; it must name the site whose gradient is not finite."""
    from numpyro.infer.initialization import init_to_value

    def lasso(y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        numpyro.factor("penalty", -3.0 * jnp.linalg.norm(w))
        numpyro.sample("y", dist.Normal(w.sum(), 1.0), obs=y)

    guide = UHAGuide(lasso, K=2, init_loc_fn=init_to_value(values={"w": jnp.zeros(3)}))
    with pytest.raises(ValueError, match=r"its gradient is not, in latent site\(s\) \['w'\]"):
        svi_for(lasso, guide).init(jax.random.PRNGKey(0), Y)


def test_an_invalid_parameter_at_numpyros_first_values_says_why_and_what_to_do():
    """A negative binomial regression on a raw covariate (x up to 500): NumPyro's
    initialization meets exp(a + b x) = inf and its Gamma raises 'got invalid rate
    parameter' (AutoNormal the same); the error must say where that comes from and how
    to start, and init_to_value at a finite point must then set the guide up."""
    from numpyro.infer.initialization import init_to_value

    def negbin(x, y):
        a = numpyro.sample("a", dist.Normal(0.0, 10.0))
        b = numpyro.sample("b", dist.Normal(0.0, 10.0))
        phi = numpyro.sample("phi", dist.HalfNormal(10.0))
        numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(a + b * x), phi), obs=y)

    x = jnp.linspace(0.0, 500.0, 40)
    y = jnp.round(jnp.exp(1.0 + 0.004 * x))
    with pytest.raises(ValueError, match="got invalid") as info:
        svi_for(negbin, UHAGuide(negbin, K=2)).init(jax.random.PRNGKey(0), x, y)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "NumPyro's initialization of the model failed" in notes and "init_to_value" in notes
    start = init_to_value(values={"a": 0.0, "b": 0.0})
    guide = UHAGuide(negbin, K=2, warm_start_steps=50, init_loc_fn=start)
    svi_for(negbin, guide).init(jax.random.PRNGKey(0), x, y)


def predictive_model(y, z=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)
    numpyro.sample("z", dist.Normal(mu, 1.0), obs=z)  # latent where z is None


def masked_model(y, mask=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y, obs_mask=mask)


@pytest.mark.parametrize("case", ["observed now", "obs_mask left out"])
def test_a_site_latent_at_setup_and_given_now_is_refused_not_ignored(case):
    # before: the value given was ignored, the draws and log Z those of the model without
    # it (z = 5 ignored: mu's draws were its posterior given y alone), silently
    from numpyro_uha.evaluation import log_z

    y = jnp.asarray([0.5, 1.0, 1.5, 2.0])
    if case == "observed now":
        model, trained, now, name = predictive_model, {}, {"z": 5.0}, "'z'"
    else:
        mask = jnp.asarray([True, False, True, True])
        model, trained, now, name = masked_model, {"mask": mask}, {}, "'y_unobserved'"
    guide = UHAGuide(model, K=2, warm_start_steps=0)
    svi = svi_for(model, guide)
    state = svi.init(jax.random.PRNGKey(0), y, **trained)
    params = svi.get_params(state)
    guide.sample_posterior(jax.random.PRNGKey(1), params, y, sample_shape=(4,), **trained)
    match = rf"site\(s\) \[{name}\] are (observed|not in the model) in this call, but were latent"
    for call in (
        lambda: guide.sample_posterior(jax.random.PRNGKey(1), params, y, sample_shape=(4,), **now),
        lambda: log_z(guide, jax.random.PRNGKey(1), params, y, num_draws=8, **now),
        lambda: Predictive(model, guide=guide, params=params, num_samples=4)(
            jax.random.PRNGKey(1), y, **now
        ),
        lambda: svi.update(state, y, **now),
    ):
        with pytest.raises(ValueError, match=match):
            call()


def _two_observations(y1=None, y2=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("first", 3):
        numpyro.sample("y1", dist.Normal(mu, 1.0), obs=y1)
    numpyro.sample("y2", dist.Normal(mu, 2.0), obs=y2)


def _one_latent_per_point(y=None, n=None):
    n = y.shape[0] if y is not None else n
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", n):
        z = numpyro.sample("z", dist.Normal(mu, 1.0))
        numpyro.sample("y", dist.Normal(z, 0.5), obs=y)


def test_predictive_withholding_only_some_data_names_the_site():
    """Predictive may leave out all the observed data (the guide then draws from the
    setup's posterior), not only some: y1 given, y2 left out is refused by name."""
    guide = UHAGuide(_two_observations, K=2, warm_start_steps=0)
    svi = svi_for(_two_observations, guide)
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), Y, jnp.array(0.3)))
    predictive = Predictive(
        _two_observations, guide=guide, params=params, num_samples=4, return_sites=["mu"]
    )
    with pytest.raises(ValueError, match=r"\['y2'\] are unobserved in this call"):
        predictive(jax.random.PRNGKey(1), Y)
    both = predictive(jax.random.PRNGKey(1), Y, jnp.array(0.3))
    np.testing.assert_array_equal(predictive(jax.random.PRNGKey(1))["mu"], both["mu"])


def test_predictive_without_data_names_a_latent_sized_by_the_data():
    """One latent z per data point: left without y at the training size, Predictive
    draws them from the setup's posterior; at another size they have none, and the
    error names the site and both shapes."""
    guide = UHAGuide(_one_latent_per_point, K=2, warm_start_steps=0)
    svi = svi_for(_one_latent_per_point, guide)
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), Y))
    predictive = Predictive(
        _one_latent_per_point, guide=guide, params=params, num_samples=4,
        return_sites=["z", "y"],
    )
    given = predictive(jax.random.PRNGKey(1), Y)
    withheld = predictive(jax.random.PRNGKey(1), None, 3)
    np.testing.assert_array_equal(withheld["z"], given["z"])
    assert withheld["y"].shape == (4, 3)
    with pytest.raises(ValueError, match=r"'z' \(5,\) instead of \(3,\)"):
        predictive(jax.random.PRNGKey(1), None, 5)


def _sized_masked(y=None, seen=None, n=3):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0] if y is not None else n):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y, obs_mask=seen)


def _with_a_factor(y=None, n=3):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    numpyro.factor("shrink", -0.5 * mu**2)  # an observed site, but not data
    with numpyro.plate("data", y.shape[0] if y is not None else n):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def _with_a_factor_in_a_plate(y=None, n=3):
    """``_with_a_factor`` with its scalar factor inside a plate (an ExpandedDistribution
    of Unit)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("one", 1):
        numpyro.factor("shrink", -0.5 * mu**2)
    with numpyro.plate("data", y.shape[0] if y is not None else n):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


@pytest.mark.parametrize("model, data", [
    pytest.param(_sized_masked, (Y, jnp.array([True, False, True])), id="obs_mask"),
    pytest.param(_with_a_factor, (Y,), id="factor"),
    pytest.param(_with_a_factor_in_a_plate, (Y,), id="factor in a plate"),
])
def test_predictive_without_data_with_a_mask_or_a_factor(model, data):
    """Without the data, an obs_mask model's y (its entries left out were the latent
    y_unobserved) is all predicted, and a numpyro.factor term (an observed site) is not
    data the call kept: both draw mu from the setup's posterior."""
    guide = UHAGuide(model, K=2, warm_start_steps=0)
    svi = svi_for(model, guide)
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), *data))
    predictive = Predictive(model, guide=guide, params=params, num_samples=4,
                            return_sites=["mu", "y"])
    given = predictive(jax.random.PRNGKey(1), *data)
    predicted = predictive(jax.random.PRNGKey(1), n=5)
    np.testing.assert_array_equal(predicted["mu"], given["mu"])
    assert predicted["y"].shape == (4, 5) and np.all(np.isfinite(predicted["y"]))


def _factor_likelihood(y=None, n=3):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    if y is not None:  # a likelihood written as a factor
        numpyro.factor("log_lik", dist.Normal(mu, 1.0).log_prob(y).sum())
    numpyro.deterministic("mean", mu * jnp.ones(n if y is None else y.shape[0]))


def _factor_likelihood_in_a_plate(y=None, n=3):
    """``_factor_likelihood`` with its scalar factor inside a plate."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    if y is not None:
        with numpyro.plate("one", 1):
            numpyro.factor("log_lik", dist.Normal(mu, 1.0).log_prob(y).sum())
    numpyro.deterministic("mean", mu * jnp.ones(n if y is None else y.shape[0]))


@pytest.mark.parametrize("model", [_factor_likelihood, _factor_likelihood_in_a_plate])
def test_a_likelihood_written_as_a_factor_is_the_data(model):
    """A numpyro.factor likelihood left out: Predictive draws mu from the setup's
    posterior (as where y= is left out), and sample_posterior, whose chains would
    otherwise target the prior, names the factor."""
    guide = UHAGuide(model, K=2, warm_start_steps=0)
    svi = svi_for(model, guide)
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), Y * 10.0))
    predictive = Predictive(model, guide=guide, params=params, num_samples=4,
                            return_sites=["mu", "mean"])
    given = predictive(jax.random.PRNGKey(1), Y * 10.0)
    predicted = predictive(jax.random.PRNGKey(1), n=5)
    np.testing.assert_array_equal(predicted["mu"], given["mu"])
    assert predicted["mean"].shape == (4, 5)
    with pytest.raises(ValueError, match=r"factor site\(s\) \['log_lik'\] were in the model"):
        guide.sample_posterior(jax.random.PRNGKey(1), params, None, 5, sample_shape=(4,))
