"""Pure-JAX core of numpyro-uha. Nothing in this package imports numpyro.

Everything works on a ``logdensity_fn(z) -> scalar`` over a flat vector ``z``; the
``*_rows`` samplers run one chain per row of ``Z`` on a target that factorizes over rows
(local latent variables), ``logdensity_fn(Z) -> (B,)``.
"""

from numpyro_uha.core.annealing import (
    INTEGRATORS,
    AnnealingInfo,
    AnnealingParams,
    annealed_sample,
    annealed_sample_rows,
    check_integrator,
    hais_sample,
    hais_sample_rows,
    make_params,
    reverse_annealed_sample,
    reverse_annealed_sample_rows,
    uha_sample,
    uha_sample_rows,
)
from numpyro_uha.core.gaussian import (
    bridge_gaussian,
    bridge_gaussian_parts,
    gaussian_grad_logpdf,
    gaussian_logpdf,
    gaussian_logpdf_of_draw,
    gaussian_sample,
)
from numpyro_uha.core.integrators import (
    IntegratorState,
    drift_kick_drift,
    kinetic_log_density,
    leapfrog,
)
from numpyro_uha.core.parametrization import (
    betas_from_logits,
    interpolate_betas,
    logits_from_betas,
    step_sizes_from_beta,
    step_sizes_under_ceiling,
)
from numpyro_uha.core.sharding import leading_axis_sharding, shard_particles
from numpyro_uha.core.vi import GaussianFit, fit_gaussian, gaussian_elbo, gaussian_log_weights

__all__ = [
    "INTEGRATORS",
    "AnnealingInfo",
    "AnnealingParams",
    "GaussianFit",
    "IntegratorState",
    "annealed_sample",
    "annealed_sample_rows",
    "betas_from_logits",
    "bridge_gaussian",
    "bridge_gaussian_parts",
    "check_integrator",
    "drift_kick_drift",
    "fit_gaussian",
    "gaussian_elbo",
    "gaussian_log_weights",
    "gaussian_grad_logpdf",
    "gaussian_logpdf",
    "gaussian_logpdf_of_draw",
    "gaussian_sample",
    "hais_sample",
    "hais_sample_rows",
    "interpolate_betas",
    "kinetic_log_density",
    "leading_axis_sharding",
    "leapfrog",
    "logits_from_betas",
    "make_params",
    "reverse_annealed_sample",
    "reverse_annealed_sample_rows",
    "shard_particles",
    "step_sizes_from_beta",
    "step_sizes_under_ceiling",
    "uha_sample",
    "uha_sample_rows",
]
