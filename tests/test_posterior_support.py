"""The setup warns where the posterior's support is narrower than the latent sites
declare: points near q, inside every latent site's support, where the model's log
density is -inf (observations ``y ~ Uniform(0, theta)`` rule out every theta below
max(y)). A Gaussian q puts mass there, and chains that reach it diverge whatever the
step size: the warning names the site that rules the points out, and the draws' error
says so instead of advising a smaller step. Such a region's zero gradient is not taken
for an improper (flat) direction."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO, init_to_value
from numpyro.infer.autoguide import AutoNormal

from numpyro_uha import (
    UHADivergenceError,
    UHAGuide,
    UHAImproperPosteriorWarning,
    UHASupportWarning,
)

Y = jnp.array([10.0, 50.0, 70.0, 33.0, 61.0])


def serial_numbers(y):
    """The German tank problem: the posterior of theta is Pareto(6, 70), theta > 70."""
    theta = numpyro.sample("theta", dist.Pareto(20.0, 1.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Uniform(0.0, theta), obs=y)


def flat_prior(y):
    """theta with a flat prior on the real line: where the data rule it out, the log
    density's gradient is exactly zero too."""
    theta = numpyro.sample("theta", dist.ImproperUniform(dist.constraints.real, (), ()))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Uniform(0.0, theta), obs=y)


def bounded_above(y):
    """The same declared as a bound: theta = max(y) + excess, every value possible."""
    excess = numpyro.sample("excess", dist.HalfNormal(50.0))
    theta = numpyro.deterministic("theta", jnp.max(y) + excess)
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Uniform(0.0, theta), obs=y)


def _setup(model, **options):
    guide = UHAGuide(model, K=2, warm_start_steps=50, **options)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = svi.init(jax.random.PRNGKey(0), Y)
    return guide, svi, state, caught


def test_points_ruled_out_by_the_likelihood_are_named_at_setup():
    # theta starts at 75: q's draws at 2 sds reach below 70
    guide, _, _, caught = _setup(
        serial_numbers, init_loc_fn=init_to_value(values={"theta": 75.0})
    )
    support = [w for w in caught if w.category is UHASupportWarning]
    assert len(support) == 1, [str(w.message)[:80] for w in caught]
    message = str(support[0].message)
    assert "site(s) ['y'] rule them out" in message
    # its zero gradient there is not flatness
    assert not [w for w in caught if w.category is UHAImproperPosteriorWarning]


def test_the_draws_error_gives_the_cause_not_a_smaller_step():
    guide, svi, state, _ = _setup(
        serial_numbers, init_loc_fn=init_to_value(values={"theta": 75.0})
    )
    params = dict(svi.get_params(state))
    params["auto_loc"] = jnp.log(jnp.array([40.0]))  # q's mean at theta = 60 < max(y)
    with pytest.raises(UHADivergenceError, match="UHASupportWarning") as err:
        guide.sample_posterior(jax.random.PRNGKey(1), params, Y, sample_shape=(200,))
    assert "smaller learning rate" not in str(err.value)


def test_the_bound_declared_in_the_model_is_not_warned():
    _, _, _, caught = _setup(bounded_above)
    assert not [w for w in caught if issubclass(w.category, (UHASupportWarning,
                                                               UHAImproperPosteriorWarning))]


def test_a_q_wholly_outside_the_support_is_said_so_and_not_called_flat():
    """q (here from init_from) where every point near it is ruled out, and the gradient
    exactly zero at all of them (a flat prior): that is not an improper direction."""
    at_75 = init_to_value(values={"theta": 75.0})
    normal = AutoNormal(flat_prior, init_loc_fn=at_75)
    svi = SVI(flat_prior, normal, optax.adam(1e-3), Trace_ELBO())
    params = dict(svi.get_params(svi.init(jax.random.PRNGKey(0), Y)))
    params["theta_auto_loc"] = jnp.array(5.0)  # below every y: each log p(y_i | theta) = -inf
    params["theta_auto_scale"] = jnp.array(1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guide = UHAGuide(flat_prior, K=2, init_from=(normal, params), init_loc_fn=at_75)
        SVI(flat_prior, guide, optax.adam(1e-3), Trace_ELBO()).init(jax.random.PRNGKey(0), Y)
    support = [str(w.message) for w in caught if w.category is UHASupportWarning]
    assert len(support) == 1 and "q's mean is one of them" in support[0], support
    assert not [w for w in caught if w.category is UHAImproperPosteriorWarning]


def _factor_nowhere_finite(y):
    numpyro.sample("theta", dist.HalfNormal(1.0))
    numpyro.factor("never", -jnp.inf)


def test_no_valid_start_from_the_data_alone_says_to_declare_the_bound():
    """NumPyro's initialization finds no point (theta drawn below max(y)): the error
    names the observed site and the bound; a factor that is -inf everywhere does not
    get that advice."""
    with pytest.raises(ValueError, match=r"\['y'\].*declare that bound in the model"):
        _setup(serial_numbers)
    with pytest.raises(ValueError, match=r"\['never'\]") as err:
        _setup(_factor_nowhere_finite)
    assert "declare that bound" not in str(err.value)


def test_a_failed_setup_lets_the_process_exit_cleanly():
    """The setup compiles model-free steps in a background thread; a setup that fails
    waits for it, so a script that catches the error exits normally (a process exiting
    while XLA compiles in a thread aborts: 'terminate called ...')."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import jax, optax\n"
        "from numpyro.infer import SVI, Trace_ELBO\n"
        "from numpyro_uha import UHAGuide\n"
        "from test_posterior_support import Y, serial_numbers\n"
        "guide = UHAGuide(serial_numbers, K=2)\n"
        "try:\n"
        "    SVI(serial_numbers, guide, optax.adam(1e-3), Trace_ELBO()).init(\n"
        "        jax.random.PRNGKey(0), Y)\n"
        "except ValueError:\n"
        "    print('caught')\n"
    )
    # without the suite's compilation cache: the thread must still be compiling when
    # the setup fails, as in a user's fresh process
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-c", script, str(Path(__file__).parent)], env=env,
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "caught", proc.stderr[-2000:]
    assert "terminate called" not in proc.stderr
