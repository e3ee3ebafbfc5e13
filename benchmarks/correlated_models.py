"""Correlated posteriors written as users write them (the twenty-first hunt, docs/zoo.md).

Twelve NumPyro models on synthetic data (fixed seed), chosen for the correlations users'
own parameterizations create: polynomials on a raw predictor, B-spline bases, collinear
predictors, nonlinear curves (Michaelis-Menten, exponential decay), an AR(2) near a unit
root with its mean far from zero, an intercept beside unpooled group effects, a latent GP
with a long length scale, a logistic regression and a Weibull survival model on raw ages.
``MODELS[name] = (model, args)``; run by :mod:`benchmarks.correlated_hunt`.
"""
import numpy as np
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist

rng = np.random.default_rng(21)
MODELS = {}


def reg(name, args):
    def deco(f):
        MODELS[name] = (f, args)
        return f
    return deco


# 1-2 cubic polynomial on raw x in [0, 10] and on standardized x
_x = np.sort(rng.uniform(0, 10, 40))
_y = 1.0 + 0.8 * _x - 0.15 * _x**2 + 0.01 * _x**3 + rng.normal(0, 0.5, 40)


def _poly(x, y):
    b = numpyro.sample("b", dist.Normal(0, 10).expand([4]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    mu = b[0] + b[1] * x + b[2] * x**2 + b[3] * x**3
    with numpyro.plate("n", x.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


reg("poly_raw", (jnp.asarray(_x, jnp.float32), jnp.asarray(_y, jnp.float32)))(_poly)
_xs = (_x - _x.mean()) / _x.std()
MODELS["poly_centred"] = (_poly, (jnp.asarray(_xs, jnp.float32), jnp.asarray(_y, jnp.float32)))


# 3 B-spline regression, 12 basis functions (degree 3), random-walk-free N(0, 3) coefficients
def _bspline_basis(x, n_basis, degree=3):
    inner = np.linspace(x.min(), x.max(), n_basis - degree + 1)
    t = np.concatenate([[inner[0]] * degree, inner, [inner[-1]] * degree])
    B = np.zeros((x.size, len(t) - 1))
    for i in range(len(t) - 1):
        B[:, i] = (t[i] <= x) & (x < t[i + 1])
    B[x == x.max(), np.nonzero(t[:-1] < t[1:])[0][-1]] = 1.0
    for k in range(1, degree + 1):
        Bn = np.zeros((x.size, len(t) - 1 - k))
        for i in range(len(t) - 1 - k):
            a = (x - t[i]) / (t[i + k] - t[i]) if t[i + k] > t[i] else 0.0
            c = (t[i + k + 1] - x) / (t[i + k + 1] - t[i + 1]) if t[i + k + 1] > t[i + 1] else 0.0
            Bn[:, i] = a * B[:, i] + c * B[:, i + 1]
        B = Bn
    return B


_xb = np.sort(rng.uniform(0, 1, 80))
_B = _bspline_basis(_xb, 12)
_yb = np.sin(6 * _xb) + rng.normal(0, 0.3, 80)


@reg("bspline", (jnp.asarray(_B, jnp.float32), jnp.asarray(_yb, jnp.float32)))
def bspline(B, y):
    w = numpyro.sample("w", dist.Normal(0, 3).expand([B.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("n", B.shape[0]):
        numpyro.sample("y", dist.Normal(B @ w, sigma), obs=y)


# 4-5 collinear standardized predictors, pairwise rho
def _collinear(rho, n=100, p=5):
    cov = rho * np.ones((p, p)) + (1 - rho) * np.eye(p)
    X = rng.multivariate_normal(np.zeros(p), cov, n)
    X = (X - X.mean(0)) / X.std(0)
    y = 0.5 + X @ np.array([1.0, -0.5, 0.3, 0.0, 0.2]) + rng.normal(0, 1.0, n)
    return jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)


def _linreg(X, y):
    a = numpyro.sample("alpha", dist.Normal(0, 5))
    beta = numpyro.sample("beta", dist.Normal(0, 2.5).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.Exponential(1.0))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.Normal(a + X @ beta, sigma), obs=y)


MODELS["collinear_95"] = (_linreg, _collinear(0.95))
MODELS["collinear_995"] = (_linreg, _collinear(0.995))

# 6 Michaelis-Menten
_s = np.array([0.02, 0.02, 0.06, 0.06, 0.11, 0.11, 0.22, 0.22, 0.56, 0.56, 1.1, 1.1])
_v = 200 * _s / (0.06 + _s) + rng.normal(0, 10, _s.size)


@reg("michaelis_menten", (jnp.asarray(_s, jnp.float32), jnp.asarray(_v, jnp.float32)))
def michaelis_menten(s, v):
    vmax = numpyro.sample("vmax", dist.LogNormal(jnp.log(100.0), 1.0))
    km = numpyro.sample("km", dist.LogNormal(jnp.log(0.1), 1.0))
    sigma = numpyro.sample("sigma", dist.HalfCauchy(10.0))
    with numpyro.plate("n", s.shape[0]):
        numpyro.sample("v", dist.Normal(vmax * s / (km + s), sigma), obs=v)


# 7 AR(2) near a unit root, mean far from zero
_T = 120
_ar = np.zeros(_T)
for t in range(2, _T):
    _ar[t] = 1.6 * _ar[t - 1] - 0.65 * _ar[t - 2] + rng.normal(0, 1)
_ar = _ar + 50.0


@reg("ar2", (jnp.asarray(_ar, jnp.float32),))
def ar2(y):
    mu = numpyro.sample("mu", dist.Normal(0, 100))
    phi = numpyro.sample("phi", dist.Normal(0, 1).expand([2]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    pred = mu + phi[0] * (y[1:-1] - mu) + phi[1] * (y[:-2] - mu)
    with numpyro.plate("t", y.shape[0] - 2):
        numpyro.sample("y", dist.Normal(pred, sigma), obs=y[2:])


# 8 redundant intercept: mu + unpooled group effects with wide priors
_g = np.repeat(np.arange(6), 8)
_yg = 3.0 + rng.normal(0, 1, 6)[_g] + rng.normal(0, 1, _g.size)


@reg("redundant_intercept", (jnp.asarray(_g), jnp.asarray(_yg, jnp.float32)))
def redundant_intercept(g, y):
    mu = numpyro.sample("mu", dist.Normal(0, 10))
    with numpyro.plate("groups", 6):
        a = numpyro.sample("a", dist.Normal(0, 10))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu + a[g], sigma), obs=y)


# 9 exponential decay
_t = np.linspace(0, 10, 25)
_ye = 5.0 * np.exp(-0.3 * _t) + rng.normal(0, 0.2, _t.size)


@reg("exp_decay", (jnp.asarray(_t, jnp.float32), jnp.asarray(_ye, jnp.float32)))
def exp_decay(t, y):
    A = numpyro.sample("A", dist.HalfNormal(10.0))
    k = numpyro.sample("k", dist.HalfNormal(1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("n", t.shape[0]):
        numpyro.sample("y", dist.Normal(A * jnp.exp(-k * t), sigma), obs=y)


# 10 latent GP, long lengthscale, centred, Poisson counts
_xg = np.linspace(0, 1, 20)
_Kg = 1.0 * np.exp(-0.5 * (_xg[:, None] - _xg[None, :]) ** 2 / 0.5**2) + 1e-4 * np.eye(20)
_fg = np.linalg.cholesky(_Kg) @ rng.normal(size=20)
_yp = rng.poisson(np.exp(1.0 + _fg))


@reg("gp_long", (jnp.asarray(_Kg, jnp.float32), jnp.asarray(_yp, jnp.float32)))
def gp_long(K, y):
    c = numpyro.sample("c", dist.Normal(0, 2))
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(K.shape[0]), covariance_matrix=K))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Poisson(jnp.exp(c + f)), obs=y)


# 11 logistic regression on raw age
_age = rng.uniform(20, 80, 200)
_py = 1 / (1 + np.exp(-(-4.0 + 0.07 * _age)))
_yl = (rng.uniform(size=200) < _py).astype(np.float32)


@reg("logistic_raw", (jnp.asarray(_age, jnp.float32), jnp.asarray(_yl)))
def logistic_raw(age, y):
    a = numpyro.sample("a", dist.Normal(0, 10))
    b = numpyro.sample("b", dist.Normal(0, 1))
    with numpyro.plate("n", age.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=a + b * age), obs=y)


# 12 Weibull survival, age in decades, right censoring through a factor
_agew = rng.uniform(3, 8, 80)
_scale = np.exp(3.0 - 0.3 * _agew)
_tw = _scale * rng.weibull(1.5, 80)
_cens = _tw > 8.0
_tobs = np.minimum(_tw, 8.0)


@reg("weibull", (jnp.asarray(_agew, jnp.float32), jnp.asarray(_tobs, jnp.float32), jnp.asarray(_cens)))
def weibull(age, t, censored):
    a = numpyro.sample("a", dist.Normal(0, 5))
    b = numpyro.sample("b", dist.Normal(0, 1))
    k = numpyro.sample("k", dist.Gamma(2.0, 1.0))
    scale = jnp.exp(a + b * age)
    d = dist.Weibull(scale, k)
    with numpyro.plate("n", t.shape[0]):
        numpyro.sample("t", d.mask(~censored), obs=t)
        numpyro.factor("cens", jnp.where(censored, -((t / scale) ** k), 0.0))


# ---------------------------------------------------------------------------------------
# WIDE: more than FULL_RANK_MAX_DIM = 32 coordinates, where base_dist="auto" gives a
# diagonal q (run with --models ... --base-dist auto cholesky).
WIDE = {}

_wide_rng = np.random.default_rng(33)


def _collinear_wide(rho, n=200, p=40):
    cov = rho * np.ones((p, p)) + (1 - rho) * np.eye(p)
    X = _wide_rng.multivariate_normal(np.zeros(p), cov, n)
    X = (X - X.mean(0)) / X.std(0)
    beta = _wide_rng.normal(0, 0.3, p)
    y = 0.5 + X @ beta + _wide_rng.normal(0, 1.0, n)
    return jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)


def linreg(X, y):
    a = numpyro.sample("alpha", dist.Normal(0, 5))
    beta = numpyro.sample("beta", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.Exponential(1.0))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.Normal(a + X @ beta, sigma), obs=y)


WIDE["collinear40_90"] = (linreg, _collinear_wide(0.9))

# random walk (centred) latent trend, Gaussian observations, 50 steps
_T = 50
_trend = np.cumsum(_wide_rng.normal(0, 0.3, _T))
_yrw = _trend + _wide_rng.normal(0, 0.5, _T)


def random_walk(y):
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    x = numpyro.sample("x", dist.GaussianRandomWalk(s, y.shape[0]))
    with numpyro.plate("t", y.shape[0]):
        numpyro.sample("y", dist.Normal(x, 0.5), obs=y)


WIDE["random_walk50"] = (random_walk, (jnp.asarray(_yrw, jnp.float32),))

# intercept + 40 unpooled group effects, wide priors
_g = np.repeat(np.arange(40), 5)
_yg = 3.0 + _wide_rng.normal(0, 1, 40)[_g] + _wide_rng.normal(0, 1, _g.size)


def redundant40(g, y):
    mu = numpyro.sample("mu", dist.Normal(0, 10))
    with numpyro.plate("groups", 40):
        a = numpyro.sample("a", dist.Normal(0, 10))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu + a[g], sigma), obs=y)


WIDE["redundant40"] = (redundant40, (jnp.asarray(_g), jnp.asarray(_yg, jnp.float32)))
