"""The zoo's hold-out set: eleven NumPyro models kept out of the tuning of UHAGuide's
defaults (issue 14).

The defaults of ``UHAGuide`` are tuned on the 25 models of :mod:`benchmarks.zoo_models`;
the result has to be checked again, independently, on posteriors the tuning never saw.
These models were written separately from the zoo (not derived from its code), the way
users write them, from the usual sources: Stan's case studies and posteriordb, Gelman et
al., *Bayesian Data Analysis* (BDA) and McElreath, *Statistical Rethinking*. Data are
small, synthetic and generated here with fixed seeds (nothing is downloaded).

    python -m benchmarks.zoo --set holdout --nuts      # the NUTS references
    python -m benchmarks.zoo --set holdout --smoke     # two models, 30 steps

What each model adds over the zoo: a count likelihood with an overdispersion parameter
(negative binomial), a shrinkage prior with heavy-tailed local scales (a regularized
horseshoe-type prior), varying slopes and intercepts with half-Cauchy scales, a change
point (a location parameter that enters the likelihood through a smooth switch), an
ordered-vector site (ordinal cutpoints), a censored likelihood (survival, ``factor`` and
``mask`` together), a 73-dimensional Beta–binomial rate model with a Pareto prior, and
two nested plates (``dim=-2`` and ``dim=-1``). Three more are hierarchical models written
*centered*, as users write them (group effects ``x ~ Normal(loc, scale)`` whose loc and
scale are latent: radon-style varying intercepts with very unequal group sizes, binomial
hospital mortality, two nested levels coded with index arrays under a Student-t
likelihood); their references run NUTS on the same posterior written non-centered and
map the draws back to the centered sites (``nuts_model`` / ``nuts_sites``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.distributions.transforms import OrderedTransform

from benchmarks.zoo_models import ZooModel


def _f32(x):
    return jnp.asarray(np.asarray(x, np.float32))


# ------------------------------------------------------------- negative-binomial counts
def negbinom_regression(X, treated, y):
    """Overdispersed counts (e.g. roach counts after a pest treatment, as in Gelman, Hill
    & Vehtari's *Regression and Other Stories*): log-linear mean, NegativeBinomial2 with
    concentration φ; the prior is on 1/√φ (Stan's prior-choice recommendation), so that
    the Poisson limit is at 0."""
    intercept = numpyro.sample("intercept", dist.Normal(0.0, 2.5))
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    treatment = numpyro.sample("treatment", dist.Normal(0.0, 1.0))
    inv_sqrt_phi = numpyro.sample("inv_sqrt_phi", dist.HalfNormal(1.0))
    phi = 1.0 / inv_sqrt_phi**2
    mu = jnp.exp(intercept + X @ beta + treatment * treated)
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.NegativeBinomial2(mu, phi), obs=y)


# ---------------------------------------------- regularized shrinkage prior, logistic
def _half_t(df, scale):
    return dist.FoldedDistribution(dist.StudentT(df, 0.0, scale))


def shrinkage_logistic(X, y):
    """Sparse logistic regression with a regularized horseshoe-type prior (Piironen &
    Vehtari 2017), non-centered: β = z τ λ̃, λ̃² = c² λ² / (c² + τ² λ²); global τ with
    scale τ₀ from a guess of 2 relevant predictors of 8, local λ_j, slab c² ~ Inv-Gamma(5,
    20) (a t₁₀ slab of scale 2). The global and local scales are half-t₅, their
    "hierarchical shrinkage" variant, rather than half-Cauchy: under half-Cauchy scales
    τ and λ_j have posteriors with no mean (the likelihood flattens once the slab
    saturates), and this benchmark compares means and standard deviations."""
    n, p = X.shape
    p0 = 2.0
    tau0 = p0 / (p - p0) * 2.0 / np.sqrt(n)  # pseudo-sigma 2 for the logit link
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 2.5))
    tau = numpyro.sample("tau", _half_t(5.0, tau0))
    c2 = numpyro.sample("c2", dist.InverseGamma(5.0, 20.0))
    with numpyro.plate("predictors", p):
        lam = numpyro.sample("lambda", _half_t(5.0, 1.0))
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
    lam_tilde = jnp.sqrt(c2 * lam**2 / (c2 + tau**2 * lam**2))
    beta = numpyro.deterministic("beta", z * tau * lam_tilde)
    with numpyro.plate("obs", n):
        numpyro.sample("y", dist.Bernoulli(logits=alpha + X @ beta), obs=y)


# ------------------------------------------------------------ varying slopes, Cauchy
def varying_slopes(county, x, y, num_counties):
    """Varying intercepts *and* slopes by group (the radon model of Gelman & Hill,
    ch. 13, without the correlation), both non-centered; the group scales have
    half-Cauchy priors, the residual scale a half-normal one."""
    mu_a = numpyro.sample("mu_a", dist.Normal(0.0, 5.0))
    mu_b = numpyro.sample("mu_b", dist.Normal(0.0, 5.0))
    sigma_a = numpyro.sample("sigma_a", dist.HalfCauchy(1.0))
    sigma_b = numpyro.sample("sigma_b", dist.HalfCauchy(1.0))
    sigma_y = numpyro.sample("sigma_y", dist.HalfNormal(2.0))
    with numpyro.plate("county", num_counties):
        a_raw = numpyro.sample("a_raw", dist.Normal(0.0, 1.0))
        b_raw = numpyro.sample("b_raw", dist.Normal(0.0, 1.0))
    a = mu_a + sigma_a * a_raw
    b = mu_b + sigma_b * b_raw
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(a[county] + b[county] * x, sigma_y), obs=y)


# ---------------------------------------------------------- change point, smooth switch
SWITCH_WIDTH = 0.25


def changepoint_regression(x, y):
    """Piecewise-linear ("hockey stick") regression whose slope switches from β₁ to β₂
    at an unknown change point: the switch is a sigmoid of width 0.25 in x, so the mean
    is smooth in the change point (its integral, a softplus, keeps the line continuous)."""
    cp = numpyro.sample("cp", dist.Uniform(0.0, 10.0))
    level = numpyro.sample("level", dist.Normal(0.0, 10.0))
    slope_before = numpyro.sample("slope_before", dist.Normal(0.0, 2.0))
    slope_after = numpyro.sample("slope_after", dist.Normal(0.0, 2.0))
    sigma = numpyro.sample("sigma", dist.Exponential(1.0))
    u = x - cp
    mean = level + slope_before * u + (slope_after - slope_before) * SWITCH_WIDTH * jax.nn.softplus(u / SWITCH_WIDTH)
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(mean, sigma), obs=y)


# ------------------------------------------------------------- ordinal (cumulative logit)
def ordinal_regression(X, y, num_categories):
    """Ordered-logistic regression (Statistical Rethinking, ch. 12): K − 1 ordered
    cutpoints whose prior is a normal pushed through ``OrderedTransform`` (their site's
    support is ``constraints.ordered_vector``), two slopes."""
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    cutpoints = numpyro.sample(
        "cutpoints",
        dist.TransformedDistribution(dist.Normal(0.0, 2.0).expand([num_categories - 1]).to_event(1),
                                     OrderedTransform()),
    )
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.OrderedLogistic(X @ beta, cutpoints), obs=y)


# ----------------------------------------------------------- censored Weibull survival
def weibull_survival(X, time, event):
    """Weibull accelerated-failure-time model with right-censoring: observed failures
    through the Weibull density under ``handlers.mask``, censored ones through their log
    survival −(t/scale)^k in ``numpyro.factor``."""
    b0 = numpyro.sample("b0", dist.Normal(0.0, 5.0))
    b = numpyro.sample("b", dist.Normal(0.0, 2.0).expand([X.shape[1]]).to_event(1))
    k = numpyro.sample("k", dist.Gamma(2.0, 1.0))
    scale = jnp.exp(b0 + X @ b)
    with numpyro.plate("obs", time.shape[0]):
        with handlers.mask(mask=event):
            numpyro.sample("time", dist.Weibull(scale, k), obs=time)
    numpyro.factor("censored", jnp.sum(jnp.where(event, 0.0, -((time / scale) ** k))))


# ------------------------------------------------------------- rat tumours (BDA ch. 5)
def rats_beta_binomial(n, y):
    """Rat tumours (BDA 5.3): θ_j ~ Beta(φκ, (1 − φ)κ) per experiment, y_j ~ Bin(n_j, θ_j);
    population mean φ ~ U(0, 1), prior count κ ~ Pareto(1, 1.5) (p(α, β) ∝ (α + β)^-5/2
    in the mean / count parametrization), the 71 rates kept as latent sites."""
    phi = numpyro.sample("phi", dist.Beta(1.0, 1.0))
    kappa = numpyro.sample("kappa", dist.Pareto(1.0, 1.5))
    with numpyro.plate("experiment", y.shape[0]):
        theta = numpyro.sample("theta", dist.Beta(phi * kappa, (1.0 - phi) * kappa))
        numpyro.sample("y", dist.Binomial(n, probs=theta), obs=y)


# ------------------------------------------------------------ two nested plates
def nested_plates(y):
    """Measurements within sites within regions, ``y[k, r, s]``: region effects under
    ``plate("region", dim=-2)``, site effects under it in ``plate("site", dim=-1)``,
    replicates in a third plate; both levels non-centered."""
    num_reps, num_regions, num_sites = y.shape
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    tau_region = numpyro.sample("tau_region", dist.HalfNormal(2.0))
    tau_site = numpyro.sample("tau_site", dist.HalfNormal(2.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("region", num_regions, dim=-2):
        region_raw = numpyro.sample("region_raw", dist.Normal(0.0, 1.0))
        with numpyro.plate("site", num_sites, dim=-1):
            site_raw = numpyro.sample("site_raw", dist.Normal(0.0, 1.0))
            mean = mu + tau_region * region_raw + tau_site * site_raw
            with numpyro.plate("rep", num_reps, dim=-3):
                numpyro.sample("y", dist.Normal(mean, sigma), obs=y)


# ------------------------------------------------------ centered varying intercepts (radon)
def radon_centered(county, floor, y, num_counties):
    """Radon-style varying intercepts (Gelman & Hill, ch. 12), written centered:
    a_j ~ N(μ_a, σ_a) per county, a common floor slope, y ~ N(a[county] + b·floor, σ_y).
    Counties have 1 to 25 houses and σ_a is small next to σ_y, so the posterior has a
    funnel in (σ_a, a)."""
    mu_a = numpyro.sample("mu_a", dist.Normal(0.0, 5.0))
    sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 2.0))
    sigma_y = numpyro.sample("sigma_y", dist.HalfNormal(1.0))
    with numpyro.plate("county", num_counties):
        a = numpyro.sample("a", dist.Normal(mu_a, sigma_a))
    with numpyro.plate("house", y.shape[0]):
        numpyro.sample("y", dist.Normal(a[county] + b * floor, sigma_y), obs=y)


def radon_noncentered(county, floor, y, num_counties):
    mu_a = numpyro.sample("mu_a", dist.Normal(0.0, 5.0))
    sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 2.0))
    sigma_y = numpyro.sample("sigma_y", dist.HalfNormal(1.0))
    with numpyro.plate("county", num_counties):
        a_std = numpyro.sample("a_std", dist.Normal(0.0, 1.0))
        a = numpyro.deterministic("a", mu_a + sigma_a * a_std)
    with numpyro.plate("house", y.shape[0]):
        numpyro.sample("y", dist.Normal(a[county] + b * floor, sigma_y), obs=y)


# ------------------------------------------------- hospital mortality (BUGS "Surgical")
def surgical_centered(n, deaths):
    """Surgical mortality in 12 hospitals (the BUGS "Surgical" example, random-effects
    version), centered: logit rates b_i ~ N(μ, τ), deaths_i ~ Bin(n_i, logit⁻¹ b_i)."""
    mu = numpyro.sample("mu", dist.Normal(-2.5, 1.5))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    with numpyro.plate("hospital", n.shape[0]):
        b = numpyro.sample("b", dist.Normal(mu, tau))
        numpyro.sample("deaths", dist.Binomial(n, logits=b), obs=deaths)


def surgical_noncentered(n, deaths):
    mu = numpyro.sample("mu", dist.Normal(-2.5, 1.5))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    with numpyro.plate("hospital", n.shape[0]):
        b_std = numpyro.sample("b_std", dist.Normal(0.0, 1.0))
        b = numpyro.deterministic("b", mu + tau * b_std)
        numpyro.sample("deaths", dist.Binomial(n, logits=b), obs=deaths)


# ------------------------------------------- two nested levels by index arrays, Student-t
def nested_centered(region_of_site, site, y, num_regions):
    """Measurements within sites within regions, centered at both levels and coded with
    index arrays: region effects r ~ N(μ, τ_region), site effects
    s ~ N(r[region_of_site], τ_site), y ~ t₄(s[site], σ)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    tau_region = numpyro.sample("tau_region", dist.HalfNormal(1.0))
    tau_site = numpyro.sample("tau_site", dist.HalfNormal(1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("regions", num_regions):
        r = numpyro.sample("r", dist.Normal(mu, tau_region))
    with numpyro.plate("sites", region_of_site.shape[0]):
        s = numpyro.sample("s", dist.Normal(r[region_of_site], tau_site))
    with numpyro.plate("measurements", y.shape[0]):
        numpyro.sample("y", dist.StudentT(4.0, s[site], sigma), obs=y)


def nested_noncentered(region_of_site, site, y, num_regions):
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    tau_region = numpyro.sample("tau_region", dist.HalfNormal(1.0))
    tau_site = numpyro.sample("tau_site", dist.HalfNormal(1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("regions", num_regions):
        r_std = numpyro.sample("r_std", dist.Normal(0.0, 1.0))
        r = numpyro.deterministic("r", mu + tau_region * r_std)
    with numpyro.plate("sites", region_of_site.shape[0]):
        s_std = numpyro.sample("s_std", dist.Normal(0.0, 1.0))
        s = numpyro.deterministic("s", r[region_of_site] + tau_site * s_std)
    with numpyro.plate("measurements", y.shape[0]):
        numpyro.sample("y", dist.StudentT(4.0, s[site], sigma), obs=y)


def _sites(*names):
    """``nuts_sites`` for a non-centered reference model: its draws of ``names``."""
    return lambda samples: {k: samples[k] for k in names}


# ------------------------------------------------------------------------- the datasets
def _data():
    d = {}
    r = np.random.default_rng(101)
    X = r.standard_normal((120, 2))
    treated = (r.random(120) < 0.5).astype(float)
    mu = np.exp(1.5 + X @ np.array([0.6, -0.3]) - 0.5 * treated)
    y = r.negative_binomial(3.0, 3.0 / (3.0 + mu))  # NB2 with concentration 3
    d["negbinom_regression"] = (_f32(X), _f32(treated), _f32(y))

    r = np.random.default_rng(102)
    X = r.standard_normal((150, 8))
    beta = np.array([1.5, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    y = (r.random(150) < 1 / (1 + np.exp(-(-0.3 + X @ beta)))).astype(float)
    d["shrinkage_logistic"] = (_f32(X), _f32(y))

    r = np.random.default_rng(103)
    J = 8
    county = np.repeat(np.arange(J), r.integers(4, 10, J))
    a = 1.0 + 0.6 * r.standard_normal(J)
    b = -0.7 + 0.3 * r.standard_normal(J)
    x = r.integers(0, 2, county.size).astype(float) + 0.3 * r.standard_normal(county.size)
    y = a[county] + b[county] * x + 0.7 * r.standard_normal(county.size)
    d["varying_slopes"] = (jnp.asarray(county), _f32(x), _f32(y), J)

    r = np.random.default_rng(104)
    x = np.sort(r.uniform(0.0, 10.0, 60))
    y = 2.0 + 0.3 * (x - 6.0) + np.where(x > 6.0, -1.2 * (x - 6.0), 0.0) + 0.5 * r.standard_normal(60)
    d["changepoint_regression"] = (_f32(x), _f32(y))

    r = np.random.default_rng(105)
    X = r.standard_normal((200, 2))
    eta = X @ np.array([0.8, -0.5]) + r.logistic(size=200)
    y = np.searchsorted(np.array([-1.5, -0.3, 0.6, 1.8]), eta)  # 5 categories, 0..4
    d["ordinal_regression"] = (_f32(X), jnp.asarray(y), 5)

    r = np.random.default_rng(106)
    X = np.stack([(r.random(100) < 0.5).astype(float), r.standard_normal(100)], 1)
    t_true = np.exp(1.0 + X @ np.array([0.5, -0.3])) * r.weibull(1.5, 100)
    t_cens = r.uniform(1.0, 6.0, 100)
    event = t_true <= t_cens
    d["weibull_survival"] = (_f32(X), _f32(np.minimum(t_true, t_cens)), jnp.asarray(event))

    r = np.random.default_rng(107)
    n = r.integers(14, 53, 71)
    theta = r.beta(2.3, 14.0, 71)
    d["rats_beta_binomial"] = (_f32(n), _f32(r.binomial(n, theta)))

    r = np.random.default_rng(108)
    region = 0.8 * r.standard_normal((4, 1))
    site = 0.5 * r.standard_normal((4, 5))
    d["nested_plates"] = (_f32(3.0 + region + site + 0.6 * r.standard_normal((3, 4, 5))),)

    r = np.random.default_rng(109)
    sizes = np.array([1, 1, 2, 2, 3, 4, 6, 8, 12, 16, 20, 25])  # 100 houses in 12 counties
    county = np.repeat(np.arange(sizes.size), sizes)
    floor = (r.random(county.size) < 0.3).astype(float)
    a = 1.3 + 0.3 * r.standard_normal(sizes.size)
    y = a[county] - 0.6 * floor + 0.8 * r.standard_normal(county.size)
    d["radon_centered"] = (jnp.asarray(county), _f32(floor), _f32(y), int(sizes.size))

    r = np.random.default_rng(110)
    n = np.array([47, 62, 97, 119, 148, 160, 196, 211, 256, 360, 520, 800])
    b = -2.5 + 0.4 * r.standard_normal(n.size)
    d["surgical_centered"] = (_f32(n), _f32(r.binomial(n, 1 / (1 + np.exp(-b)))))

    r = np.random.default_rng(111)
    region_of_site = np.array([0, 0, 0, 1, 1, 2, 2, 2, 3, 3])
    region = 1.0 + 0.6 * r.standard_normal(4)
    site_effect = region[region_of_site] + 0.4 * r.standard_normal(region_of_site.size)
    site = np.repeat(np.arange(region_of_site.size), r.integers(3, 7, region_of_site.size))
    y = site_effect[site] + 0.5 * r.standard_t(4.0, site.size)
    d["nested_centered"] = (jnp.asarray(region_of_site), jnp.asarray(site), _f32(y), 4)
    return d


def _holdout() -> list[ZooModel]:
    d = _data()
    hier = {"target_accept_prob": 0.95}
    return [
        ZooModel("negbinom_regression", negbinom_regression, d["negbinom_regression"],
                 "negative-binomial regression, overdispersion 1/√φ"),
        ZooModel("shrinkage_logistic", shrinkage_logistic, d["shrinkage_logistic"],
                 "logistic regression, regularized horseshoe-type prior (half-t₅ scales, non-centered)",
                 nuts_kwargs={"target_accept_prob": 0.99}),
        ZooModel("varying_slopes", varying_slopes, d["varying_slopes"],
                 "varying intercepts and slopes (non-centered), half-Cauchy scales", nuts_kwargs=hier),
        ZooModel("changepoint_regression", changepoint_regression, d["changepoint_regression"],
                 "change point with a sigmoid slope switch, Uniform(0, 10) location"),
        ZooModel("ordinal_regression", ordinal_regression, d["ordinal_regression"],
                 "ordered logistic, ordered_vector cutpoints (OrderedTransform)"),
        ZooModel("weibull_survival", weibull_survival, d["weibull_survival"],
                 "Weibull survival, right-censoring via mask + factor"),
        ZooModel("rats_beta_binomial", rats_beta_binomial, d["rats_beta_binomial"],
                 "Beta-binomial rats (BDA 5), 71 latent rates, Pareto prior"),
        ZooModel("nested_plates", nested_plates, d["nested_plates"],
                 "two nested plates (dim -2, -1), non-centered", nuts_kwargs={"target_accept_prob": 0.99}),
        ZooModel("radon_centered", radon_centered, d["radon_centered"],
                 "centered varying intercepts, 12 groups of 1 to 25 observations, small group scale",
                 nuts_model=radon_noncentered, nuts_sites=_sites("mu_a", "sigma_a", "b", "sigma_y", "a"),
                 nuts_kwargs=hier, note="reference: NUTS on the non-centered model, a = μ_a + σ_a ã"),
        ZooModel("surgical_centered", surgical_centered, d["surgical_centered"],
                 "centered logit-normal random effects, binomial counts (BUGS Surgical)",
                 nuts_model=surgical_noncentered, nuts_sites=_sites("mu", "tau", "b"),
                 nuts_kwargs=hier, note="reference: NUTS on the non-centered model, b = μ + τ b̃"),
        ZooModel("nested_centered", nested_centered, d["nested_centered"],
                 "two centered levels by index arrays (region → site), Student-t likelihood",
                 nuts_model=nested_noncentered,
                 nuts_sites=_sites("mu", "tau_region", "tau_site", "sigma", "r", "s"), nuts_kwargs=hier,
                 note="reference: NUTS on the non-centered model, r = μ + τ_r r̃, s = r[region] + τ_s s̃"),
    ]


HOLDOUT: dict[str, ZooModel] = {m.name: m for m in _holdout()}
SMOKE_MODELS = ("negbinom_regression", "ordinal_regression")
