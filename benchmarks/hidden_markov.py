"""Hidden Markov models written with ``scan``, as NumPyro users write them: UHAGuide
(trained with Trace_ELBO; it sums the states out and draws them from their prior, see
docs/how-to/discrete.md) against the exact evidence and posterior means by quadrature
(a two-state chain with two continuous latents) and against NUTS (a three-state
Gaussian HMM with Dirichlet transitions, 11 continuous latents).

    python -m benchmarks.hidden_markov            # 3000 steps, K = 8
    python -m benchmarks.hidden_markov --smoke    # the two-state chain, 20 steps

It also records what NumPyro's own ``TraceEnum_ELBO`` gives for the two-state chain at
fixed continuous values with a continuous-only guide (the states left to the model), next
to the forward algorithm's log density: the reason the guide refuses TraceEnum_ELBO on
scanned states.
"""

from __future__ import annotations

import argparse
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.contrib.control_flow import scan
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO, TraceEnum_ELBO
from scipy.special import logsumexp
from scipy.stats import beta as beta_dist
from scipy.stats import norm

from benchmarks.common import write_results
from numpyro_uha import UHAGuide
from numpyro_uha.evaluation import log_z, psis_khat

OFFSETS = np.array([-1.5, 1.5])


def two_state(y):
    """A sticky two-state chain: a common shift and the stay probability are latent."""
    shift = numpyro.sample("shift", dist.Normal(0.0, 2.0))
    stay = numpyro.sample("stay", dist.Beta(2.0, 2.0))
    transition = jnp.stack([jnp.stack([stay, 1 - stay]), jnp.stack([1 - stay, stay])])

    def step(c, y_t):
        c = numpyro.sample("c", dist.Categorical(transition[c]))
        numpyro.sample("y", dist.Normal(shift + jnp.asarray(OFFSETS)[c], 1.0), obs=y_t)
        return c, None

    scan(step, 0, y)


def three_state(y):
    """A three-state Gaussian HMM: ordered means (a base and two positive gaps), a common
    noise scale and a Dirichlet row per state."""
    base = numpyro.sample("base", dist.Normal(-2.0, 2.0))
    gaps = numpyro.sample("gaps", dist.LogNormal(0.0, 0.5).expand([2]).to_event(1))
    means = numpyro.deterministic(
        "means", base + jnp.concatenate([jnp.zeros(1), jnp.cumsum(gaps)])
    )
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    transition = numpyro.sample(
        "transition", dist.Dirichlet(jnp.ones(3) + 4 * jnp.eye(3)).to_event(1)
    )

    def step(c, y_t):
        c = numpyro.sample("c", dist.Categorical(transition[c]))
        numpyro.sample("y", dist.Normal(means[c], sigma), obs=y_t)
        return c, None

    scan(step, 0, y)


def _chain(probs, length, rng):
    states = [0]
    for _ in range(length - 1):
        states.append(int(rng.choice(len(probs), p=probs[states[-1]])))
    return np.array(states)


def two_state_data(length=60, seed=3):
    rng = np.random.default_rng(seed)
    states = _chain(np.array([[0.85, 0.15], [0.15, 0.85]]), length, rng)
    return jnp.asarray(0.4 + OFFSETS[states] + rng.normal(size=length), jnp.float32)


def three_state_data(length=100, seed=5):
    rng = np.random.default_rng(seed)
    probs = np.array([[0.9, 0.05, 0.05], [0.1, 0.8, 0.1], [0.05, 0.15, 0.8]])
    states = _chain(probs, length, rng)
    return jnp.asarray(np.array([-2.0, 0.0, 1.5])[states] + 0.5 * rng.normal(size=length),
                       jnp.float32)


def forward(y, shift, stay):
    """log p(y | shift, stay) of ``two_state``, the states summed out (float64;
    broadcasts over shift and stay)."""
    y = np.asarray(y, np.float64)
    shift, stay = np.asarray(shift, np.float64)[..., None], np.asarray(stay, np.float64)
    log_stay, log_move = np.log(stay)[..., None], np.log1p(-stay)[..., None]
    alpha = np.concatenate([log_stay, log_move], -1) + norm.logpdf(y[0], shift + OFFSETS)
    for t in range(1, y.shape[0]):
        to_0 = np.logaddexp(alpha[..., :1] + log_stay, alpha[..., 1:] + log_move)
        to_1 = np.logaddexp(alpha[..., :1] + log_move, alpha[..., 1:] + log_stay)
        alpha = np.concatenate([to_0, to_1], -1) + norm.logpdf(y[t], shift + OFFSETS)
    return logsumexp(alpha, axis=-1)


def two_state_exact(y):
    """log Z and the posterior means of shift and stay, by quadrature."""
    shift = np.linspace(-10.0, 10.0, 2001)[:, None]
    stay = (np.arange(800) + 0.5) / 800
    log_post = (norm.logpdf(shift, 0.0, 2.0) + beta_dist.logpdf(stay, 2.0, 2.0)
                + forward(y, shift, stay))
    log_z_exact = logsumexp(log_post) + np.log((shift[1, 0] - shift[0, 0]) / 800)
    post = np.exp(log_post - logsumexp(log_post))
    return log_z_exact, {"shift": float((post * shift).sum()), "stay": float((post * stay).sum())}


def trace_enum_at_fixed_values(y, shift=0.3, stay=0.8):
    """NumPyro's TraceEnum_ELBO on ``two_state`` with a guide of Delta sites at fixed
    continuous values (its ELBO is then the model's marginal log density there), and the
    forward algorithm's value with the priors."""
    def guide(y):
        numpyro.sample("shift", dist.Delta(jnp.asarray(shift)))
        numpyro.sample("stay", dist.Delta(jnp.asarray(stay)))

    elbo = -float(TraceEnum_ELBO().loss(jax.random.PRNGKey(0), {}, two_state, guide, y))
    exact = float(norm.logpdf(shift, 0.0, 2.0) + beta_dist.logpdf(stay, 2.0, 2.0)
                  + forward(y, shift, stay))
    return elbo, exact


def _weighted_means(draws, names):
    log_w = np.asarray(draws.log_weights, np.float64)
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    return {n: np.tensordot(w, np.asarray(draws.samples[n], np.float64), 1) for n in names}


def _fit(model, y, args):
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the guide's note that the states are not drawn
        guide = UHAGuide(model, K=args.K)
        svi = SVI(model, guide, optax.adam(args.lr), Trace_ELBO())
        params = svi.run(jax.random.PRNGKey(0), args.steps, y, progress_bar=False).params
        seconds = time.perf_counter() - start
        est = log_z(guide, jax.random.PRNGKey(1), params, y, num_draws=args.draws)
        draws = guide.sample_posterior_with_log_weights(
            jax.random.PRNGKey(2), params, y, sample_shape=(args.draws,)
        )
    return est, draws, seconds


def _nuts(model, y, args):
    mcmc = MCMC(NUTS(model), num_warmup=args.nuts_warmup, num_samples=args.nuts_samples,
                num_chains=2, chain_method="sequential", progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NumPyro's FutureWarning on unmarked enumeration
        mcmc.run(jax.random.PRNGKey(0), y)
    return {n: np.asarray(v) for n, v in mcmc.get_samples().items()}


def _fmt(x):
    """Flattened (row by row), on one line: a cell of the markdown table."""
    return np.array2string(np.ravel(np.asarray(x)), precision=3, separator=", ",
                           max_line_width=10**6)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--K", type=int, default=8)
    parser.add_argument("--draws", type=int, default=4000)
    parser.add_argument("--nuts-warmup", type=int, default=1000)
    parser.add_argument("--nuts-samples", type=int, default=1000)
    parser.add_argument("--smoke", action="store_true", help="the two-state chain, 20 steps")
    parser.add_argument("--name", default="hidden_markov")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.draws, args.K = 20, 64, 2
        args.nuts_warmup, args.nuts_samples = 20, 20

    rows = []
    y2 = two_state_data()
    exact_log_z, exact_means = two_state_exact(y2)
    est, draws, seconds = _fit(two_state, y2, args)
    means = _weighted_means(draws, ["shift", "stay"])
    nuts = _nuts(two_state, y2, args)
    enum_elbo, enum_exact = trace_enum_at_fixed_values(y2)
    rows.append({
        "model": "two_state (60 steps)", "seconds": seconds, "elbo": est.elbo,
        "elbo_se": est.elbo_se, "iw_log_z": est.iw, "iw_log_z_se": est.iw_se, "ess": est.ess,
        "khat": float(psis_khat(draws.log_weights)), "exact_log_z": exact_log_z,
        "sites": {
            n: {"uha": float(means[n]), "exact": exact_means[n],
                "nuts": float(nuts[n].mean()), "nuts_sd": float(nuts[n].std())}
            for n in means
        },
        "trace_enum_elbo_at_fixed_values": enum_elbo, "forward_algorithm": enum_exact,
    })
    print(f"two_state: IW log Z {est.iw:.4f} ± {est.iw_se:.4f} (exact {exact_log_z:.4f}); "
          f"TraceEnum_ELBO at fixed values {enum_elbo:.2f} vs {enum_exact:.2f}", flush=True)
    if not args.smoke:
        y3 = three_state_data()
        est, draws, seconds = _fit(three_state, y3, args)
        names = ["base", "gaps", "sigma", "means", "transition"]
        means = _weighted_means(draws, names)
        nuts = _nuts(three_state, y3, args)
        rows.append({
            "model": "three_state (100 steps)", "seconds": seconds, "elbo": est.elbo,
            "elbo_se": est.elbo_se, "iw_log_z": est.iw, "iw_log_z_se": est.iw_se,
            "ess": est.ess, "khat": float(psis_khat(draws.log_weights)),
            "exact_log_z": None,
            "sites": {
                n: {"uha": np.asarray(means[n]).tolist(), "exact": None,
                    "nuts": nuts[n].mean(0).tolist(), "nuts_sd": nuts[n].std(0).tolist()}
                for n in names
            },
        })
        print(f"three_state: IW log Z {est.iw:.4f} ± {est.iw_se:.4f}", flush=True)

    lines = [
        f"UHAGuide(K={args.K}), Trace_ELBO, Adam {args.lr}, {args.steps} steps, seed 0; "
        f"log Z and importance-weighted means from {args.draws} draws; NUTS: 2 chains of "
        f"{args.nuts_warmup} + {args.nuts_samples}. Reference: quadrature over (shift, "
        "stay) for the two-state chain, NUTS for the three-state one. Gap: |UHA − "
        "reference| in NUTS posterior sds (largest over a site's entries).",
        "",
        "| model | ELBO | IW log Z | exact log Z | ESS | k̂ | s | site: UHA / reference (NUTS) | largest gap (NUTS sds) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        parts, gaps = [], []
        for n, s in r["sites"].items():
            ref = s["exact"] if s["exact"] is not None else s["nuts"]
            parts.append(f"{n}: {_fmt(s['uha'])} / {_fmt(ref)} ({_fmt(s['nuts'])})")
            gaps.append(np.max(np.abs(np.asarray(s["uha"]) - np.asarray(ref))
                               / np.asarray(s["nuts_sd"])))
        exact = f"{r['exact_log_z']:.4f}" if r["exact_log_z"] is not None else "–"
        lines.append(
            f"| {r['model']} | {r['elbo']:.4f} ± {r['elbo_se']:.4f} | {r['iw_log_z']:.4f} ± "
            f"{r['iw_log_z_se']:.4f} | {exact} | {r['ess']:.0f} | {r['khat']:.2f} | "
            f"{r['seconds']:.0f} | {'; '.join(parts)} | {max(gaps):.2f} |"
        )
    first = rows[0]
    lines += [
        "",
        f"NumPyro's `TraceEnum_ELBO` on the two-state chain with a guide of Delta sites at "
        f"shift = 0.3, stay = 0.8 (the states left to the model's enumeration): "
        f"{first['trace_enum_elbo_at_fixed_values']:.4f}; the forward algorithm: "
        f"{first['forward_algorithm']:.4f}.",
    ]
    path = write_results(args.name, {"rows": rows, "args": vars(args)}, "\n".join(lines))
    print(path)


if __name__ == "__main__":
    main()
