"""Compare UHA's posterior moments with a NUTS reference.

NUTS (NumPyro's :class:`~numpyro.infer.NUTS`) run long enough is the usual "ground
truth" for posterior moments; :func:`compare_with_nuts` puts UHA's per-element means,
standard deviations and covariance next to it, with the Monte Carlo standard errors of
both, so that a discrepancy can be told apart from sampling noise.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np
from numpyro import handlers

from numpyro_uha._keywords import check_model_keywords, model_of
from numpyro_uha._weights import _check_log_weights
from numpyro_uha.evaluation.arviz import (
    _check_positive_int,
    _joint_draws,
    _latent_sites,
    _require_uha_guide,
)

__all__ = ["NUTSComparison", "compare_with_nuts", "plot_nuts_comparison"]


class NUTSComparison(NamedTuple):
    """UHA's posterior moments next to NUTS', per scalar element of every latent site.

    Attributes:
        table: :class:`pandas.DataFrame`, one row per scalar element of every latent
            site (in the guide's site order, elements in C order), with columns
            ``site``, ``index`` (a label such as ``"beta[3]"`` or ``"L[0,1]"``; the
            site name for a scalar site), ``nuts_mean``, ``nuts_std``, ``uha_mean``,
            ``uha_std``, ``mean_abs_error`` (|uha_mean - nuts_mean|), ``std_abs_error``
            (|uha_std - nuts_std|), ``mean_error_in_sd`` ((uha_mean - nuts_mean) /
            nuts_std, signed; 0 on an element NUTS holds constant, as the support fixes
            L[0,0] = 1 of an LKJ Cholesky factor, where UHA's mean is that constant),
            ``nuts_se_of_mean`` (NUTS' Monte Carlo standard error of
            its mean, from its effective sample size) and ``uha_se_of_mean`` (the same
            for UHA's mean: std / sqrt(draws) for independent draws, or the
            delta-method standard error of the self-normalized estimate when
            weighted).
        summary: :class:`pandas.DataFrame` indexed by site: ``num_elements``,
            ``mean_abs_error`` and ``std_abs_error`` (averaged over the site's
            elements) and ``max_abs_mean_error_in_sd``.
        cov_mae: mean absolute error, over all d² entries, of UHA's covariance matrix
            of the flattened constrained latent vector (all latent sites concatenated,
            dimension d) against NUTS'.
        mean_mae: ``mean_abs_error`` averaged over all scalar elements.
        std_mae: ``std_abs_error`` averaged over all scalar elements.
        nuts_samples: dict site -> numpy array (NUTS draws, one leading draw dimension).
        uha_samples: dict site -> numpy array (UHA draws, one leading draw dimension).
        mcmc_se_of_mean: dict site -> numpy array of the site's shape, NUTS' Monte
            Carlo standard error of each mean: nuts_std / sqrt(ESS).
        uha_log_weights: the UHA draws' log importance weights.
        weighted: whether UHA's moments are self-normalized importance-weighted.
    """

    table: object
    summary: object
    cov_mae: float
    mean_mae: float
    std_mae: float
    nuts_samples: dict
    uha_samples: dict
    mcmc_se_of_mean: dict
    uha_log_weights: np.ndarray
    weighted: bool = False

    def __str__(self) -> str:
        kind = "weighted" if self.weighted else "unweighted"
        return (
            f"UHA ({kind}) vs NUTS: mean MAE {self.mean_mae:.4g}, std MAE "
            f"{self.std_mae:.4g}, covariance MAE {self.cov_mae:.4g}\n\n"
            f"Per site:\n{self.summary.to_string()}\n\n"
            f"Per element:\n{self.table.to_string(index=False)}"
        )

    def __repr__(self) -> str:
        return self.__str__()


def _element_labels(name, shape):
    if shape == ():
        return [name]
    return [f"{name}[{','.join(map(str, idx))}]" for idx in np.ndindex(*shape)]


def _model_params(guide, params):
    """The model's own ``numpyro.param`` values among ``params``."""
    return {
        name: params[name]
        for name, site in guide.prototype_trace.items()
        if site["type"] == "param" and name in params
    }


def _compared_elements(guide, name, shape):
    """Which elements of site ``name`` (of ``shape``) the comparison covers: all but the
    guide's completed entries (``completed_entries``, over the site's batch shape)."""
    entries = (getattr(guide, "completed_entries", None) or {}).get(name)
    if entries is None:
        return np.ones(shape, bool)
    entries = np.asarray(entries, bool)
    return ~np.broadcast_to(entries.reshape(entries.shape + (1,) * (len(shape) - entries.ndim)), shape)


def _error_in_sd(uha_mean, nuts_mean, nuts_std):
    """(uha_mean − nuts_mean) / nuts_std; where NUTS' draws are constant (an element the
    support fixes, as the diagonal's first entry and the upper triangle of an LKJ
    Cholesky factor), 0 if UHA's mean is that constant to single-precision rounding,
    else ±inf (a real disagreement), never 0 / 0."""
    diff = uha_mean - nuts_mean
    same = np.abs(diff) <= 1e-5 * np.maximum(1.0, np.abs(nuts_mean))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = diff / nuts_std
    return np.where(nuts_std > 0, ratio, np.where(same, 0.0, np.copysign(np.inf, diff)))


def compare_with_nuts(
    guide,
    rng_key,
    params,
    *args,
    num_samples=2000,
    num_warmup=1000,
    num_chains=1,
    mcmc_samples=None,
    num_draws=2000,
    weighted=False,
    **kwargs,
) -> NUTSComparison:
    """Compare UHA's posterior means, standard deviations and covariance with NUTS'.

    Runs NumPyro's NUTS on the guide's model (unless ``mcmc_samples`` is given), draws
    ``num_draws`` UHA draws, and compares the moments of every latent site
    (constrained), element by element. The model's own ``numpyro.param`` values are
    taken from ``params`` for NUTS as well. Entries the model masks out and nothing
    depends on (``guide.completed_entries``: ``obs_mask``'s ``"<name>_unobserved"``
    where the data are observed) are left out of the table and the covariance: no
    sampler's values there mean anything.

    Both sides are Monte Carlo estimates: compare an error with ``nuts_se_of_mean`` and
    ``uha_se_of_mean`` in :attr:`NUTSComparison.table` before blaming UHA for it.

    Args:
        guide: a trained :class:`~numpyro_uha.UHAGuide`, or a
            :class:`~numpyro_uha.UHALocalGuide` (its draws as they are, for the whole
            data: pass the model's arguments without a subsample).
        rng_key: JAX random key (split between NUTS and UHA).
        params: the trained parameters, e.g. ``svi_result.params``.
        *args: the model's positional arguments (the data used in training).
        num_samples: NUTS draws per chain.
        num_warmup: NUTS warm-up iterations per chain.
        num_chains: NUTS chains. Chains run sequentially unless JAX sees several
            devices. With ``mcmc_samples`` given, the number of chains its (flat)
            draws come from, in order, used for the effective sample size.
        mcmc_samples: reference draws to use instead of running NUTS: dict site ->
            array with one leading draw dimension (``mcmc.get_samples()``), holding at
            least every latent site of the guide.
        num_draws: number of UHA draws.
        weighted: use self-normalized importance-weighted UHA moments (the UHA log
            weights as importance weights) instead of plain draw averages (not for a
            ``UHALocalGuide``, whose draws have no joint weights).
        **kwargs: the model's keyword arguments.

    Returns:
        NUTSComparison: the per-element table, per-site summary, MAEs, draws and NUTS'
        Monte Carlo standard errors.

    Raises:
        TypeError: if ``guide`` is not a UHAGuide or UHALocalGuide.
        ValueError: if ``mcmc_samples`` lacks a latent site, a site's shape differs from
            UHA's, sites have different numbers of draws, or the draws cannot be split
            into ``num_chains`` chains; or if a count is not a positive integer.
        FloatingPointError: if a UHA log weight is NaN or +inf.
    """
    _require_uha_guide(guide, "compare_with_nuts")
    check_model_keywords(model_of(guide), kwargs, compare_with_nuts)
    import pandas as pd
    from numpyro.diagnostics import effective_sample_size

    if getattr(guide, "prototype_trace", None) is None:
        raise RuntimeError(
            "compare_with_nuts: the guide has not been set up; train it first "
            "(svi.run(...)) so its latent sites are known."
        )
    num_chains = _check_positive_int("num_chains", num_chains)
    num_draws = _check_positive_int("num_draws", num_draws)
    if num_draws < 2:
        raise ValueError("compare_with_nuts: num_draws must be at least 2.")
    # the model's own sites (``x``, not the non-centered ``x_decentered`` the guide runs):
    # what its draws, NUTS on its model and users' reference draws all hold
    sites = _latent_sites(guide)
    nuts_key, uha_key = jax.random.split(rng_key)

    draws, _ = _joint_draws(
        guide, uha_key, params, args, kwargs, num_draws, "compare_with_nuts", weighted
    )
    uha = {name: np.asarray(draws.samples[name], dtype=np.float64) for name in sites}
    log_w = _check_log_weights(draws.log_weights, "compare_with_nuts")

    if mcmc_samples is None:
        from numpyro.infer import MCMC, NUTS

        num_samples = _check_positive_int("num_samples", num_samples)
        num_warmup = _check_positive_int("num_warmup", num_warmup)
        model = guide.model
        model_params = _model_params(guide, params)
        if model_params:
            model = handlers.substitute(model, data=model_params)
        mcmc = MCMC(
            NUTS(model),
            num_warmup=num_warmup,
            num_samples=num_samples,
            num_chains=num_chains,
            progress_bar=False,
        )
        mcmc.run(nuts_key, *args, **kwargs)
        mcmc_samples = mcmc.get_samples()
    if not isinstance(mcmc_samples, dict):
        raise ValueError(
            "compare_with_nuts: mcmc_samples must be a dict site -> draws, e.g. "
            f"mcmc.get_samples(); got {type(mcmc_samples).__name__}."
        )
    missing = [name for name in sites if name not in mcmc_samples]
    if missing:
        raise ValueError(
            f"compare_with_nuts: mcmc_samples has no draws for latent site(s) {missing}; "
            f"it must hold every latent site of the guide ({sites})."
        )
    nuts = {name: np.asarray(mcmc_samples[name], dtype=np.float64) for name in sites}
    num_mcmc = None
    for name in sites:
        expected = uha[name].shape[1:]
        if nuts[name].ndim < 1 or nuts[name].shape[1:] != expected:
            raise ValueError(
                f"compare_with_nuts: mcmc_samples['{name}'] has shape {nuts[name].shape}; "
                f"expected (num_draws,) + {expected} (one leading draw dimension, then "
                f"the site's shape)."
            )
        if num_mcmc is None:
            num_mcmc = nuts[name].shape[0]
        elif nuts[name].shape[0] != num_mcmc:
            raise ValueError(
                f"compare_with_nuts: mcmc_samples['{name}'] has {nuts[name].shape[0]} draws "
                f"but '{sites[0]}' has {num_mcmc}."
            )
    if num_mcmc < 2 * num_chains or num_mcmc % num_chains:
        raise ValueError(
            f"compare_with_nuts: {num_mcmc} reference draws cannot be split into "
            f"num_chains={num_chains} chains of at least 2 draws each."
        )

    if weighted:
        w = np.exp(log_w - np.max(log_w))
        w = w / np.sum(w)
    else:
        w = np.full(num_draws, 1.0 / num_draws)

    # entries the model masks out and nothing depends on (guide.completed_entries):
    # their values mean nothing, on either side (NUTS wanders there without bound)
    keep = {name: _compared_elements(guide, name, uha[name].shape[1:]) for name in sites}
    rows, mcmc_se = [], {}
    for name in sites:
        x_n, x_u = nuts[name], uha[name]
        shape = x_u.shape[1:]
        nuts_mean, nuts_std = x_n.mean(0), x_n.std(0)
        wb = w.reshape((num_draws,) + (1,) * len(shape))
        uha_mean = np.sum(wb * x_u, 0)
        uha_std = np.sqrt(np.sum(wb * (x_u - uha_mean) ** 2, 0))
        if weighted:
            uha_se = np.sqrt(np.sum(wb**2 * (x_u - uha_mean) ** 2, 0))
        else:
            uha_se = x_u.std(0, ddof=1) / np.sqrt(num_draws)
        by_chain = x_n.reshape((num_chains, num_mcmc // num_chains) + shape)
        with np.errstate(divide="ignore", invalid="ignore"):  # constant elements: 0 / 0
            ess = np.asarray(effective_sample_size(by_chain))
        constant = nuts_std == 0  # fixed by the support (an LKJ Cholesky factor's L[0,0], zeros)
        se = np.where(constant, 0.0, nuts_std / np.sqrt(np.maximum(np.nan_to_num(ess), 1.0)))
        mcmc_se[name] = se
        in_sd = _error_in_sd(uha_mean, nuts_mean, nuts_std)
        for j, label in enumerate(_element_labels(name, shape)):
            if not keep[name].ravel()[j]:
                continue
            rows.append(
                {
                    "site": name,
                    "index": label,
                    "nuts_mean": nuts_mean.ravel()[j],
                    "nuts_std": nuts_std.ravel()[j],
                    "uha_mean": uha_mean.ravel()[j],
                    "uha_std": uha_std.ravel()[j],
                    "mean_abs_error": abs(uha_mean.ravel()[j] - nuts_mean.ravel()[j]),
                    "std_abs_error": abs(uha_std.ravel()[j] - nuts_std.ravel()[j]),
                    "mean_error_in_sd": in_sd.ravel()[j],
                    "nuts_se_of_mean": se.ravel()[j],
                    "uha_se_of_mean": uha_se.ravel()[j],
                }
            )
    table = pd.DataFrame(rows)
    summary = table.groupby("site", sort=False).agg(
        num_elements=("index", "size"),
        mean_abs_error=("mean_abs_error", "mean"),
        std_abs_error=("std_abs_error", "mean"),
        max_abs_mean_error_in_sd=("mean_error_in_sd", lambda e: float(np.max(np.abs(e)))),
    )

    flat_n = np.concatenate(
        [nuts[name].reshape(num_mcmc, -1)[:, keep[name].ravel()] for name in sites], axis=1
    )
    flat_u = np.concatenate(
        [uha[name].reshape(num_draws, -1)[:, keep[name].ravel()] for name in sites], axis=1
    )
    cov_n = np.atleast_2d(np.cov(flat_n, rowvar=False))
    centered = flat_u - np.sum(w[:, None] * flat_u, 0)
    cov_u = (w[:, None] * centered).T @ centered
    if not weighted:
        cov_u = cov_u * num_draws / (num_draws - 1)  # unbiased, like np.cov
    return NUTSComparison(
        table=table,
        summary=summary,
        cov_mae=float(np.mean(np.abs(cov_u - cov_n))),
        mean_mae=float(table["mean_abs_error"].mean()),
        std_mae=float(table["std_abs_error"].mean()),
        nuts_samples=nuts,
        uha_samples=uha,
        mcmc_se_of_mean=mcmc_se,
        uha_log_weights=log_w,
        weighted=bool(weighted),
    )


def plot_nuts_comparison(comparison, ax=None, max_elements=50):
    """Scatter UHA's per-element means and standard deviations against NUTS'.

    Two panels, one point per scalar element: UHA mean vs NUTS mean (with horizontal
    error bars of ±2 NUTS Monte Carlo standard errors) and UHA std vs NUTS std, each
    with the line y = x; the titles give the mean absolute errors. Does not call
    ``plt.show()``.

    Args:
        comparison: a :class:`NUTSComparison` from :func:`compare_with_nuts`.
        ax: two matplotlib Axes to draw on (a sequence); by default a new figure with
            two panels is created.
        max_elements: plot at most this many elements (the first ones, in table order).

    Returns:
        matplotlib.figure.Figure: the figure holding the two panels.

    Raises:
        ValueError: if ``ax`` is not two Axes or ``max_elements`` is not a positive
            integer.
    """
    max_elements = _check_positive_int("max_elements", max_elements)
    if ax is None:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(10, 4.5), layout="constrained")
        axes = fig.subplots(1, 2)
    else:
        axes = list(np.ravel(ax)) if not hasattr(ax, "plot") else [ax]
        if len(axes) != 2:
            raise ValueError(
                f"plot_nuts_comparison: ax must be two matplotlib Axes, got {len(axes)}."
            )
        fig = axes[0].figure
    table = comparison.table
    total = len(table)
    table = table.iloc[:max_elements]
    shown = "" if total <= max_elements else f" (first {max_elements} of {total})"

    panels = [
        (axes[0], "nuts_mean", "uha_mean", "mean", comparison.mean_mae),
        (axes[1], "nuts_std", "uha_std", "std", comparison.std_mae),
    ]
    for axis, x_col, y_col, what, mae in panels:
        x, y = table[x_col].to_numpy(), table[y_col].to_numpy()
        if what == "mean" and "nuts_se_of_mean" in table:
            xerr = 2 * table["nuts_se_of_mean"].to_numpy()
            axis.errorbar(x, y, xerr=xerr, fmt="o", ms=4, capsize=2, label="±2 NUTS MC SE")
            axis.legend(loc="upper left", fontsize="small")
        else:
            axis.plot(x, y, "o", ms=4)
        finite = np.concatenate([x, y])
        finite = finite[np.isfinite(finite)]
        if finite.size:
            lo, hi = float(finite.min()), float(finite.max())
            pad = 0.05 * (hi - lo) if hi > lo else 0.5
            axis.plot([lo - pad, hi + pad], [lo - pad, hi + pad], "k--", lw=1)
        axis.set_xlabel(f"NUTS posterior {what}")
        axis.set_ylabel(f"UHA posterior {what}")
        axis.set_title(f"{what}: MAE {mae:.3g}{shown}")
    if ax is None:
        fig.suptitle(f"UHA vs NUTS (covariance MAE {comparison.cov_mae:.3g})")
    return fig
