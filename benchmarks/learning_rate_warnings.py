"""Does a fit degraded by a large learning rate warn? (docs/zoo.md, "Learning rates,
checked again")

Three regressions written for this check (ordinal logistic, negative-binomial, Weibull;
150 simulated points, seed 1), each fitted by ``UHAGuide(K=8)`` for 1500 Adam steps at
the learning rate given, 2000 draws of ``sample_posterior``, against NUTS (500 + 1000):
prints one JSON line with the gaps of the draws' means in NUTS sds, their sd ratios, and
the warnings of the fit and of the draws.

Run: ``python -m benchmarks.learning_rate_warnings MODEL LR`` (MODEL: ordinal, negbin,
weibull); ``benchmarks/results/learning_rate_warnings.jsonl`` holds the six runs of
2026-11-30 (LR 1e-2 and 1e-1; 2-core CPU, jax 0.10.1, numpyro 0.22.0, commit 5da8c12).
"""
import sys, warnings, json
import numpy as np, jax, jax.numpy as jnp, optax
import numpyro, numpyro.distributions as dist
from numpyro.infer import SVI, Trace_ELBO, MCMC, NUTS
from numpyro_uha import UHAGuide

rng = np.random.default_rng(1)
n = 150
X = rng.normal(size=(n, 3)).astype(np.float32)

def ordinal(X, y=None):
    b = numpyro.sample("b", dist.Normal(0, 2).expand([3]).to_event(1))
    c = numpyro.sample("c", dist.TransformedDistribution(dist.Normal(0, 3).expand([3]).to_event(1), dist.transforms.OrderedTransform()))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.OrderedLogistic(X @ b, c), obs=y)

def negbin(X, y=None):
    b = numpyro.sample("b", dist.Normal(0, 1).expand([3]).to_event(1))
    a = numpyro.sample("a", dist.Normal(0, 2))
    phi = numpyro.sample("phi", dist.Gamma(2.0, 0.5))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(a + X @ b), phi), obs=y)

def weibull(X, y=None):
    b = numpyro.sample("b", dist.Normal(0, 1).expand([3]).to_event(1))
    k = numpyro.sample("k", dist.LogNormal(0.0, 0.5))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("y", dist.Weibull(jnp.exp(0.5 + X @ b), k), obs=y)

true_b = np.array([0.8, -0.5, 0.3])
eta = X @ true_b
ys = {
    "ordinal": np.digitize(eta + rng.logistic(size=n), [-1.0, 0.5, 2.0]).astype(np.int32),
    "negbin": rng.negative_binomial(3.0, 3.0 / (3.0 + np.exp(0.5 + eta))).astype(np.float32),
    "weibull": (np.exp(0.5 + eta) * rng.weibull(1.5, size=n)).astype(np.float32),
}
models = {"ordinal": ordinal, "negbin": negbin, "weibull": weibull}
name, lr = sys.argv[1], float(sys.argv[2])
model, y = models[name], jnp.asarray(ys[name])
Xj = jnp.asarray(X)
mc = MCMC(NUTS(model), num_warmup=500, num_samples=1000, progress_bar=False)
mc.run(jax.random.PRNGKey(0), Xj, y)
ref = {k: np.asarray(v) for k, v in mc.get_samples().items()}
guide = UHAGuide(model, K=8)
svi = SVI(model, guide, optax.adam(lr), Trace_ELBO())
with warnings.catch_warnings(record=True) as fitw:
    warnings.simplefilter("always")
    res = svi.run(jax.random.PRNGKey(1), 1500, Xj, y, progress_bar=False)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    draws = guide.sample_posterior(jax.random.PRNGKey(2), res.params, Xj, y, sample_shape=(2000,))
gaps = {}
for k in ref:
    d = np.asarray(draws[k]).reshape(2000, -1); r = ref[k].reshape(1000, -1)
    gaps[k] = [round(float(x), 2) for x in (d.mean(0) - r.mean(0)) / r.std(0)]
    gaps[k + "_sdratio"] = [round(float(x), 2) for x in d.std(0) / r.std(0)]
print(json.dumps({"model": name, "lr": lr, "final_loss": float(np.mean(res.losses[-100:])),
                  "gaps_in_nuts_sds": gaps,
                  "fit_warnings": [str(x.message)[:100] for x in fitw],
                  "draw_warnings": [str(x.message)[:160] for x in w]}))
