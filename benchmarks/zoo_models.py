"""The model zoo: NumPyro models written the way users write them (issue 14).

Each :class:`ZooModel` holds a model, its data (small, synthetic, generated here with a
fixed seed; nothing is downloaded) and how its NUTS reference is produced. Where NUTS on
the model as written is known to mix badly (centered eight schools, Neal's funnel, a
centered stochastic-volatility model), the reference runs NUTS on the *same posterior*
written non-centered and maps the draws back to the zoo model's sites (``nuts_model`` and
``nuts_sites``); the reference file records this.

The models were written for this zoo from textbook and NumPyro-example descriptions
(eight schools: Gelman et al., *Bayesian Data Analysis*, 5.5; the funnel: Neal 2003;
GARCH(1,1) and stochastic volatility: the Stan User's Guide's time-series chapter; GP
regression: Rasmussen & Williams, ch. 2; marginalized mixtures: the Stan User's Guide's
"Finite mixtures").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.contrib.control_flow import scan
from numpyro.distributions import constraints
from numpyro.infer.initialization import init_to_uniform, init_to_value
from numpyro.infer.reparam import LocScaleReparam


@dataclass
class ZooModel:
    """One zoo entry.

    Attributes:
        name: short identifier (file names, CLI).
        model: the NumPyro model, called as ``model(*args)``.
        args: the model's arguments (the data).
        features: what the entry exercises, for the tables.
        nuts_model: the model NUTS runs for the reference (default: ``model``); its draws
            are mapped to ``model``'s latent sites by ``nuts_sites``.
        nuts_sites: ``samples -> {site: draws}`` for ``model``'s latent sites (default:
            the samples of ``model``'s latent sites, by name).
        nuts_kwargs: extra keyword arguments of ``numpyro.infer.NUTS``.
        nuts_scale: multiplies the reference's warm-up and sample counts.
    """

    name: str
    model: Callable
    args: tuple
    features: str
    nuts_model: Callable | None = None
    nuts_sites: Callable | None = None
    nuts_kwargs: dict = field(default_factory=dict)
    nuts_scale: int = 1
    note: str = ""


def latent_sites(model, args) -> dict:
    """``{name: shape}`` of the model's latent (unobserved) sample sites, in trace order."""
    # Traced under the init strategy, as NumPyro's autoguides do: ImproperUniform cannot sample.
    traced = handlers.substitute(handlers.seed(model, 0), substitute_fn=init_to_uniform)
    tr = handlers.trace(traced).get_trace(*args)
    return {
        name: tuple(site["value"].shape)
        for name, site in tr.items()
        if site["type"] == "sample" and not site["is_observed"]
    }


# ------------------------------------------------------------------------------ data
def _rng(seed):
    return np.random.default_rng(seed)


def _f32(x):
    return jnp.asarray(np.asarray(x, np.float32))


# ----------------------------------------------------------------- improper (flat) priors
def improper_real(y):
    """Two group means with a flat prior on the real line; half-normal noise scale."""
    mu = numpyro.sample("mu", dist.ImproperUniform(constraints.real, (), (2,)))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def improper_positive(x, y):
    """Simple regression with flat priors everywhere: intercept and slope on the real line
    and the noise scale flat on (0, ∞) (``ImproperUniform(positive)``)."""
    alpha = numpyro.sample("alpha", dist.ImproperUniform(constraints.real, (), ()))
    beta = numpyro.sample("beta", dist.ImproperUniform(constraints.real, (), ()))
    sigma = numpyro.sample("sigma", dist.ImproperUniform(constraints.positive, (), ()))
    numpyro.sample("y", dist.Normal(alpha + beta * x, sigma), obs=y)


# ------------------------------------------------------------ unstandardized regressions
def regression_tight(X, y):
    """Six parameters: five coefficients under N(0, 10²) pinned to ±0.001 by the data
    (features of scale 100), and the noise scale (issue 14's regression)."""
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(10.0))
    numpyro.sample("y", dist.Normal(X @ beta, sigma), obs=y)


def regression_scales(X, y):
    """Unstandardized regression: coefficients from 1e-3 to 1e3 (features from 1e3 to
    1e-2 in scale), posterior sds from 2e-4 to 20, one wide N(0, 1000²) prior for all."""
    intercept = numpyro.sample("intercept", dist.Normal(0.0, 1000.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 1000.0).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(10.0))
    numpyro.sample("y", dist.Normal(intercept + X @ beta, sigma), obs=y)


# ------------------------------------------------------------------------ eight schools
EIGHT_Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0], np.float32)
EIGHT_SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0], np.float32)


def eight_schools_centered(sigma, y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", y.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def eight_schools_noncentered(sigma, y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", y.shape[0]):
        theta_tilde = numpyro.sample("theta_tilde", dist.Normal(0.0, 1.0))
        theta = numpyro.deterministic("theta", mu + tau * theta_tilde)
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


# ------------------------------------------------------------------------ Neal's funnel
FUNNEL_DIM = 4


def funnel(n):
    """Neal's funnel, centered: v ~ N(0, 3²), x_i | v ~ N(0, exp(v/2)²), i = 1..n."""
    v = numpyro.sample("v", dist.Normal(0.0, 3.0))
    numpyro.sample("x", dist.Normal(0.0, jnp.exp(v / 2)).expand([n]).to_event(1))


def funnel_noncentered(n):
    v = numpyro.sample("v", dist.Normal(0.0, 3.0))
    x_raw = numpyro.sample("x_raw", dist.Normal(0.0, 1.0).expand([n]).to_event(1))
    numpyro.deterministic("x", jnp.exp(v / 2) * x_raw)


# --------------------------------------------------------------- heavy-tailed likelihood
def student_t_regression(x, y):
    """Robust regression: Student-t errors with unknown degrees of freedom."""
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 10.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    nu = numpyro.sample("nu", dist.Gamma(2.0, 0.1))
    numpyro.sample("y", dist.StudentT(nu, alpha + beta * x, sigma), obs=y)


# ---------------------------------------------------------------------- GP regression
def gp_rbf(x, y):
    """GP regression, RBF kernel, latent amplitude, lengthscale and noise (f marginalized)."""
    amplitude = numpyro.sample("amplitude", dist.LogNormal(0.0, 1.0))
    lengthscale = numpyro.sample("lengthscale", dist.LogNormal(0.0, 1.0))
    noise = numpyro.sample("noise", dist.LogNormal(-1.0, 1.0))
    d2 = (x[:, None] - x[None, :]) ** 2
    k = amplitude**2 * jnp.exp(-0.5 * d2 / lengthscale**2) + (noise**2 + 1e-6) * jnp.eye(x.shape[0])
    numpyro.sample("y", dist.MultivariateNormal(jnp.zeros(x.shape[0]), covariance_matrix=k), obs=y)


# ------------------------------------------------------------------------------- AR(1)
def _ar1_priors():
    c = numpyro.sample("c", dist.Normal(0.0, 5.0))
    phi = numpyro.sample("phi", dist.Uniform(-1.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    return c, phi, sigma


def ar1_vectorized(y):
    """AR(1), conditional on the first value, one vectorized observation statement."""
    c, phi, sigma = _ar1_priors()
    numpyro.sample("y", dist.Normal(c + phi * y[:-1], sigma), obs=y[1:])


def ar1_scan(y):
    """The same AR(1) written with ``numpyro.contrib.control_flow.scan``."""
    c, phi, sigma = _ar1_priors()

    def transition(prev, y_t):
        y_t = numpyro.sample("y", dist.Normal(c + phi * prev, sigma), obs=y_t)
        return y_t, None

    scan(transition, y[0], y[1:])


# --------------------------------------------------------------------------- GARCH(1,1)
GARCH_SIGMA1 = 1.0


def _garch_priors():
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    omega = numpyro.sample("omega", dist.HalfNormal(1.0))
    alpha = numpyro.sample("alpha", dist.Uniform(0.0, 1.0))
    u = numpyro.sample("u", dist.Uniform(0.0, 1.0))
    beta = numpyro.deterministic("beta", (1.0 - alpha) * u)  # alpha + beta < 1
    return mu, omega, alpha, beta


def garch_vectorized(r):
    """GARCH(1,1): the variance recursion in plain ``jax.lax.scan``, one observation
    statement for the whole series."""
    mu, omega, alpha, beta = _garch_priors()

    def step(s2, r_prev):
        s2 = omega + alpha * (r_prev - mu) ** 2 + beta * s2
        return s2, s2

    _, s2 = jax.lax.scan(step, jnp.asarray(GARCH_SIGMA1**2, r.dtype), r[:-1])
    s2 = jnp.concatenate([jnp.full((1,), GARCH_SIGMA1**2, r.dtype), s2])
    numpyro.sample("r", dist.Normal(mu, jnp.sqrt(s2)), obs=r)


def garch_scan(r):
    """The same GARCH(1,1) with an observation statement inside
    ``numpyro.contrib.control_flow.scan``."""
    mu, omega, alpha, beta = _garch_priors()
    numpyro.sample("r0", dist.Normal(mu, GARCH_SIGMA1), obs=r[0])

    def step(carry, r_t):
        s2, r_prev = carry
        s2 = omega + alpha * (r_prev - mu) ** 2 + beta * s2
        numpyro.sample("r", dist.Normal(mu, jnp.sqrt(s2)), obs=r_t)
        return (s2, r_t), None

    scan(step, (jnp.asarray(GARCH_SIGMA1**2, r.dtype), r[0]), r[1:])


# ----------------------------------------------------------------- stochastic volatility
def _sv_priors():
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    phi = numpyro.sample("phi", dist.Uniform(-1.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    return mu, phi, sigma


def stochvol_vectorized(y):
    """Stochastic volatility, centered log-volatilities h, vectorized: h0 from the
    stationary law, h[1:] | h[:-1] in one statement."""
    mu, phi, sigma = _sv_priors()
    h0 = numpyro.sample("h0", dist.Normal(mu, sigma / jnp.sqrt(1.0 - phi**2)))
    h = numpyro.sample("h", ARLatent(mu, phi, sigma, h0, y.shape[0] - 1))
    numpyro.sample("y", dist.Normal(0.0, jnp.exp(jnp.concatenate([h0[None], h]) / 2)), obs=y)


class ARLatent(dist.Distribution):
    """The joint law of h_1..h_n with h_t | h_{t-1} ~ N(mu + phi (h_{t-1} - mu), sigma),
    h_0 given: a vector site whose log density is vectorized over t."""

    support = constraints.real_vector

    def __init__(self, mu, phi, sigma, h0, n):
        self.mu, self.phi, self.sigma, self.h0 = mu, phi, sigma, h0
        super().__init__(batch_shape=(), event_shape=(n,))

    def sample(self, key, sample_shape=()):
        eps = jax.random.normal(key, sample_shape + self.event_shape)

        def step(h, e):
            h = self.mu + self.phi * (h - self.mu) + self.sigma * e
            return h, h

        _, hs = jax.lax.scan(step, jnp.broadcast_to(self.h0, sample_shape), jnp.moveaxis(eps, -1, 0))
        return jnp.moveaxis(hs, 0, -1)

    def log_prob(self, value):
        prev = jnp.concatenate([jnp.broadcast_to(self.h0, value.shape[:-1])[..., None], value[..., :-1]], -1)
        return dist.Normal(self.mu + self.phi * (prev - self.mu), self.sigma).log_prob(value).sum(-1)


def stochvol_scan(y):
    """The same model with the log-volatilities drawn inside
    ``numpyro.contrib.control_flow.scan`` (a latent random walk in ``scan``)."""
    mu, phi, sigma = _sv_priors()
    h0 = numpyro.sample("h0", dist.Normal(mu, sigma / jnp.sqrt(1.0 - phi**2)))
    numpyro.sample("y0", dist.Normal(0.0, jnp.exp(h0 / 2)), obs=y[0])

    def step(h_prev, y_t):
        h_t = numpyro.sample("h", dist.Normal(mu + phi * (h_prev - mu), sigma))
        numpyro.sample("y", dist.Normal(0.0, jnp.exp(h_t / 2)), obs=y_t)
        return h_t, None

    scan(step, h0, y[1:])


def stochvol_noncentered(y):
    """Reference parametrization of both SV models (same posterior): standardized
    innovations, h0 and h deterministic."""
    mu, phi, sigma = _sv_priors()
    h0_raw = numpyro.sample("h0_raw", dist.Normal(0.0, 1.0))
    eps = numpyro.sample("eps", dist.Normal(0.0, 1.0).expand([y.shape[0] - 1]).to_event(1))
    h0 = mu + sigma / jnp.sqrt(1.0 - phi**2) * h0_raw

    def step(h, e):
        h = mu + phi * (h - mu) + sigma * e
        return h, h

    _, h = jax.lax.scan(step, h0, eps)
    numpyro.deterministic("h0", h0)
    numpyro.deterministic("h", h)
    numpyro.sample("y", dist.Normal(0.0, jnp.exp(jnp.concatenate([h0[None], h]) / 2)), obs=y)


# ------------------------------------------------------------------ simplex, LKJ, bounds
def dirichlet_categorical(y):
    """Category probabilities on the simplex (Dirichlet prior), categorical data."""
    p = numpyro.sample("p", dist.Dirichlet(jnp.ones(4)))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Categorical(probs=p), obs=y)


def lkj_mvn(y):
    """Multivariate normal with an LKJ prior on the correlation's Cholesky factor."""
    d = y.shape[1]
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0).expand([d]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(3.0).expand([d]).to_event(1))
    L = numpyro.sample("L_omega", dist.LKJCholesky(d, concentration=2.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.MultivariateNormal(mu, scale_tril=sigma[:, None] * L), obs=y)


def truncated(y):
    """A truncated-normal latent (``TruncatedNormal``) and a likelihood truncated at zero
    with a latent location (``TruncatedDistribution``)."""
    mu = numpyro.sample("mu", dist.TruncatedNormal(1.0, 2.0, low=0.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.TruncatedDistribution(dist.Normal(mu, sigma), low=0.0), obs=y)


def interval_uniform(xy):
    """Bivariate normal with interval-constrained sites: a correlation ~ Uniform(-1, 1)
    and scales ~ Uniform(0, 10)."""
    m = numpyro.sample("m", dist.Normal(0.0, 5.0).expand([2]).to_event(1))
    s = numpyro.sample("s", dist.Uniform(0.0, 10.0).expand([2]).to_event(1))
    rho = numpyro.sample("rho", dist.Uniform(-1.0, 1.0))
    cov = jnp.array([[s[0] ** 2, rho * s[0] * s[1]], [rho * s[0] * s[1], s[1] ** 2]])
    with numpyro.plate("n", xy.shape[0]):
        numpyro.sample("xy", dist.MultivariateNormal(m, covariance_matrix=cov), obs=xy)


# ----------------------------------------------------------------- masks, params, reparam
def masked_regression(x, y, observed):
    """Regression whose missing responses are masked out with ``handlers.mask``."""
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 5.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("n", x.shape[0]), handlers.mask(mask=observed):
        numpyro.sample("y", dist.Normal(alpha + beta * x, sigma), obs=y)


def param_deterministic(x, y):
    """Regression with the noise scale a model ``numpyro.param`` (type-II maximum
    likelihood under SVI) and the regression line a ``numpyro.deterministic`` site."""
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 10.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0))
    sigma = numpyro.param("sigma", 1.0, constraint=constraints.positive)
    mean = numpyro.deterministic("mean", alpha + beta * x)
    numpyro.sample("y", dist.Normal(mean, sigma), obs=y)


def _hierarchical_intercepts(group, x, y, num_groups):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("group", num_groups):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    numpyro.sample("y", dist.Normal(a[group] + beta * x, sigma), obs=y)


def hierarchical_reparam(group, x, y):
    """Varying-intercept regression, few observations per group, non-centered by
    ``handlers.reparam`` with ``LocScaleReparam(centered=0)`` on the intercepts."""
    reparam_model = handlers.reparam(_hierarchical_intercepts, config={"a": LocScaleReparam(centered=0)})
    reparam_model(group, x, y, 8)


def gaussian_mixture(y):
    """Two-component 1-D Gaussian mixture, the assignments marginalized (logsumexp), no
    discrete latents; priors on the locations break the label symmetry."""
    w = numpyro.sample("w", dist.Dirichlet(jnp.array([2.0, 2.0])))
    loc = numpyro.sample("loc", dist.Normal(jnp.array([-2.0, 2.0]), 1.5).to_event(1))
    scale = numpyro.sample("scale", dist.HalfNormal(2.0))
    lp = jnp.log(w) + dist.Normal(loc, scale).log_prob(y[:, None])
    numpyro.factor("y", jax.nn.logsumexp(lp, axis=-1).sum())


def hierarchical_logistic(group, X, y):
    """Hierarchical logistic regression: centered varying intercepts, two slopes."""
    mu_a = numpyro.sample("mu_a", dist.Normal(0.0, 2.0))
    sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 2.5).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("group", 6):
        a = numpyro.sample("a", dist.Normal(mu_a, sigma_a))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=a[group] + X @ b), obs=y)


def poisson_glm(X, exposure, y):
    """Poisson regression, log link, log-exposure offset."""
    b0 = numpyro.sample("b0", dist.Normal(0.0, 5.0))
    b = numpyro.sample("b", dist.Normal(0.0, 5.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Poisson(jnp.exp(jnp.log(exposure) + b0 + X @ b)), obs=y)


# ------------------------------------------------------------------------- the datasets
def _data():
    d = {}
    r = _rng(1)
    d["improper_real"] = (_f32(np.array([1.5, -3.0]) + 2.0 * r.standard_normal((30, 2))),)
    r = _rng(2)
    x = r.uniform(-2, 2, 25)
    d["improper_positive"] = (_f32(x), _f32(0.5 + 1.5 * x + 0.8 * r.standard_normal(25)))
    r = _rng(3)
    X = 100.0 * r.standard_normal((100, 5))
    beta = np.array([1.2, -0.7, 0.3, 2.0, -1.5])
    d["regression_tight"] = (_f32(X), _f32(X @ beta + 1.0 * r.standard_normal(100)))
    r = _rng(4)
    scales = np.array([0.01, 1.0, 10.0, 1000.0])
    X = r.standard_normal((100, 4)) * scales
    beta = np.array([800.0, 5.0, 0.3, 0.002])
    d["regression_scales"] = (_f32(X), _f32(50.0 + X @ beta + 2.0 * r.standard_normal(100)))
    d["eight_schools_centered"] = (_f32(EIGHT_SIGMA), _f32(EIGHT_Y))
    d["eight_schools_noncentered"] = d["eight_schools_centered"]
    d["funnel"] = (FUNNEL_DIM,)
    r = _rng(5)
    x = r.uniform(-3, 3, 40)
    d["student_t_regression"] = (_f32(x), _f32(1.0 + 2.0 * x + 0.5 * r.standard_t(3, 40)))
    r = _rng(6)
    x = np.sort(r.uniform(0, 10, 20))
    d["gp_rbf"] = (_f32(x), _f32(np.sin(x) + 0.2 * r.standard_normal(20)))
    r = _rng(7)
    y = np.zeros(100)
    for t in range(1, 100):
        y[t] = 0.5 + 0.7 * y[t - 1] + r.standard_normal()
    d["ar1_vectorized"] = d["ar1_scan"] = (_f32(y),)
    r = _rng(8)
    T, ret, s2 = 200, np.zeros(200), GARCH_SIGMA1**2
    ret[0] = 0.2 + GARCH_SIGMA1 * r.standard_normal()
    for t in range(1, T):
        s2 = 0.1 + 0.15 * (ret[t - 1] - 0.2) ** 2 + 0.75 * s2
        ret[t] = 0.2 + np.sqrt(s2) * r.standard_normal()
    d["garch_vectorized"] = d["garch_scan"] = (_f32(ret),)
    r = _rng(9)
    T, mu, phi, sig = 60, -1.0, 0.8, 0.5
    h = np.zeros(T)
    h[0] = mu + sig / np.sqrt(1 - phi**2) * r.standard_normal()
    for t in range(1, T):
        h[t] = mu + phi * (h[t - 1] - mu) + sig * r.standard_normal()
    d["stochvol_vectorized"] = d["stochvol_scan"] = (_f32(np.exp(h / 2) * r.standard_normal(T)),)
    r = _rng(10)
    d["dirichlet_categorical"] = (jnp.asarray(r.choice(4, 60, p=[0.5, 0.3, 0.15, 0.05]), jnp.int32),)
    r = _rng(11)
    corr = np.array([[1.0, 0.6, -0.3], [0.6, 1.0, 0.2], [-0.3, 0.2, 1.0]])
    sd = np.array([1.0, 2.0, 0.5])
    d["lkj_mvn"] = (_f32(r.multivariate_normal([1.0, -1.0, 0.0], corr * np.outer(sd, sd), 60)),)
    r = _rng(12)
    z = r.normal(0.5, 1.0, 400)
    d["truncated"] = (_f32(z[z > 0][:50]),)
    r = _rng(13)
    d["interval_uniform"] = (_f32(r.multivariate_normal([0.0, 1.0], [[1.0, 1.2], [1.2, 4.0]], 40)),)
    r = _rng(14)
    x = r.uniform(-2, 2, 50)
    y = 1.0 - 0.5 * x + 0.7 * r.standard_normal(50)
    observed = np.ones(50, bool)
    observed[r.choice(50, 15, replace=False)] = False
    y[~observed] = 0.0  # placeholder values; masked out
    d["masked_regression"] = (_f32(x), _f32(y), jnp.asarray(observed))
    r = _rng(15)
    x = r.uniform(-2, 2, 30)
    d["param_deterministic"] = (_f32(x), _f32(0.3 + 1.1 * x + 1.0 * r.standard_normal(30)))
    r = _rng(16)
    group = np.repeat(np.arange(8), 3)
    a = 1.0 + 0.5 * r.standard_normal(8)
    x = r.standard_normal(24)
    d["hierarchical_reparam"] = (jnp.asarray(group), _f32(x), _f32(a[group] + 0.8 * x + 0.8 * r.standard_normal(24)))
    r = _rng(17)
    comp = r.random(100) < 0.3
    d["gaussian_mixture"] = (_f32(np.where(comp, r.normal(-2.0, 0.7, 100), r.normal(1.5, 0.7, 100))),)
    r = _rng(18)
    group = np.repeat(np.arange(6), 40)
    a = -0.5 + 1.0 * r.standard_normal(6)
    X = r.standard_normal((240, 2))
    logits = a[group] + X @ np.array([1.0, -0.5])
    d["hierarchical_logistic"] = (
        jnp.asarray(group), _f32(X), _f32((r.random(240) < 1 / (1 + np.exp(-logits))).astype(float)),
    )
    r = _rng(19)
    X = r.standard_normal((80, 2))
    exposure = r.uniform(0.5, 3.0, 80)
    d["poisson_glm"] = (_f32(X), _f32(exposure), _f32(r.poisson(exposure * np.exp(0.5 + X @ np.array([0.4, -0.3])))))
    return d


def _param_ml_sigma(x, y):
    """Type-II maximum-likelihood noise scale of ``param_deterministic`` (α, β ~ N(0, 10²)
    integrated out): the value SVI's ``numpyro.param`` converges to under an exact guide.
    The NUTS reference conditions on it."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    A = np.stack([np.ones_like(x), x], 1)
    prior = 100.0 * A @ A.T

    def neg_log_marginal(s):
        cov = prior + s**2 * np.eye(len(y))
        _, logdet = np.linalg.slogdet(cov)
        return 0.5 * (logdet + y @ np.linalg.solve(cov, y))

    grid = np.linspace(0.3, 3.0, 2701)
    return float(grid[np.argmin([neg_log_marginal(s) for s in grid])])


def _zoo() -> list[ZooModel]:
    d = _data()
    sigma_ml = _param_ml_sigma(*d["param_deterministic"])

    def from_noncentered_eight(s):
        return {"mu": s["mu"], "tau": s["tau"], "theta": s["theta"]}

    entries = [
        ZooModel("improper_real", improper_real, d["improper_real"], "ImproperUniform(real) prior"),
        ZooModel("improper_positive", improper_positive, d["improper_positive"],
                 "flat priors, ImproperUniform(positive) scale"),
        ZooModel("regression_tight", regression_tight, d["regression_tight"],
                 "coefficients ±0.001 under N(0, 10²)"),
        ZooModel("regression_scales", regression_scales, d["regression_scales"],
                 "unstandardized, coefficients 1e-3…1e3"),
        ZooModel("eight_schools_centered", eight_schools_centered, d["eight_schools_centered"],
                 "centered hierarchical", nuts_model=eight_schools_noncentered,
                 nuts_sites=from_noncentered_eight, nuts_kwargs={"target_accept_prob": 0.95},
                 note="reference: NUTS on the non-centered model, θ = μ + τ θ̃"),
        ZooModel("eight_schools_noncentered", eight_schools_noncentered, d["eight_schools_noncentered"],
                 "non-centered hierarchical, deterministic site", nuts_kwargs={"target_accept_prob": 0.95}),
        ZooModel("funnel", funnel, d["funnel"], "Neal's funnel (d = 5), centered",
                 nuts_model=funnel_noncentered, nuts_sites=lambda s: {"v": s["v"], "x": s["x"]},
                 note="reference: NUTS on the non-centered funnel, x = exp(v/2) x_raw"),
        ZooModel("student_t_regression", student_t_regression, d["student_t_regression"],
                 "Student-t likelihood, latent ν"),
        ZooModel("gp_rbf", gp_rbf, d["gp_rbf"], "GP regression, RBF kernel"),
        ZooModel("ar1_vectorized", ar1_vectorized, d["ar1_vectorized"], "AR(1), vectorized"),
        ZooModel("ar1_scan", ar1_scan, d["ar1_scan"], "AR(1), contrib scan"),
        ZooModel("garch_vectorized", garch_vectorized, d["garch_vectorized"],
                 "GARCH(1,1), lax.scan recursion, deterministic site"),
        ZooModel("garch_scan", garch_scan, d["garch_scan"], "GARCH(1,1), contrib scan"),
        ZooModel("stochvol_vectorized", stochvol_vectorized, d["stochvol_vectorized"],
                 "stochastic volatility (d = 63), centered, vectorized",
                 nuts_model=stochvol_noncentered,
                 nuts_sites=lambda s: {k: s[k] for k in ("mu", "phi", "sigma", "h0", "h")},
                 nuts_kwargs={"target_accept_prob": 0.99},
                 note="reference: NUTS on the non-centered SV model"),
        ZooModel("stochvol_scan", stochvol_scan, d["stochvol_scan"],
                 "stochastic volatility (d = 63), latent random walk in contrib scan",
                 nuts_model=stochvol_noncentered,
                 nuts_sites=lambda s: {k: s[k] for k in ("mu", "phi", "sigma", "h0", "h")},
                 nuts_kwargs={"target_accept_prob": 0.99},
                 note="reference: NUTS on the non-centered SV model"),
        ZooModel("dirichlet_categorical", dirichlet_categorical, d["dirichlet_categorical"], "simplex (Dirichlet)"),
        ZooModel("lkj_mvn", lkj_mvn, d["lkj_mvn"], "LKJCholesky correlation"),
        ZooModel("truncated", truncated, d["truncated"], "TruncatedNormal latent, truncated likelihood",
                 nuts_kwargs={"target_accept_prob": 0.99}),
        ZooModel("interval_uniform", interval_uniform, d["interval_uniform"], "Uniform(a, b) sites"),
        ZooModel("masked_regression", masked_regression, d["masked_regression"], "handlers.mask"),
        ZooModel("param_deterministic", param_deterministic, d["param_deterministic"],
                 "model numpyro.param, deterministic site",
                 nuts_model=handlers.substitute(param_deterministic, data={"sigma": sigma_ml}),
                 note=f"reference: NUTS with the param at its type-II ML value σ = {sigma_ml:.3f}"),
        ZooModel("hierarchical_reparam", hierarchical_reparam, d["hierarchical_reparam"],
                 "LocScaleReparam via handlers.reparam", nuts_kwargs={"target_accept_prob": 0.95}),
        ZooModel("gaussian_mixture", gaussian_mixture, d["gaussian_mixture"], "marginalized mixture (factor)",
                 nuts_kwargs={"init_strategy": init_to_value(values={"loc": jnp.array([-2.0, 1.5])})},
                 note="reference: NUTS chains started in the dominant mode (the label-swapped mode, "
                      "about e^-6 of the mass under the location priors, holds chains started there)"),
        ZooModel("hierarchical_logistic", hierarchical_logistic, d["hierarchical_logistic"],
                 "hierarchical logistic regression", nuts_kwargs={"target_accept_prob": 0.95}),
        ZooModel("poisson_glm", poisson_glm, d["poisson_glm"], "Poisson GLM, offset"),
    ]
    return entries


ZOO: dict[str, ZooModel] = {m.name: m for m in _zoo()}
SMOKE_MODELS = ("improper_real", "ar1_scan")
