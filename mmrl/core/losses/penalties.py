"""Per-token penalty terms that the objective adds to the policy-gradient term: the KL to the
reference (estimated from samples, or in closed form for Gaussian actions), KL-Cov's penalty on
high-covariance tokens, and the entropy bonus.

Papers (titles, so they can be looked up):

- KL estimators k1/k2/k3: John Schulman, "Approximating KL Divergence" (blog, 2020); k3 clamped
  as verl's ``low_var_kl``.
- Closed-form KL of Gaussian steps: "Flow-GRPO: Training Flow Matching Models via Online RL"
  (``||mu - mu_ref||^2 / (2 sigma^2)``).
- KL-Cov: "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
  (Cui et al., 2025).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from .config import KL_ESTIMATORS, check_choice

__all__ = ["GaussianActions", "kl_penalty", "gaussian_kl", "reference_kl", "kl_cov_penalty", "entropy_bonus"]

K3_LOG_RATIO_CLAMP = 20.0  # verl's low_var_kl bounds
K3_VALUE_CLAMP = 10.0


def _k3(log_ratio: Tensor) -> Tensor:
    log_ratio = log_ratio.clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return (torch.exp(log_ratio) - 1 - log_ratio).clamp(max=K3_VALUE_CLAMP)


_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {  # of log_ratio = ref_logps - logps
    "k1": lambda log_ratio: -log_ratio,
    "k2": lambda log_ratio: 0.5 * log_ratio**2,
    "k3": _k3,
}


def kl_penalty(logps: Tensor, ref_logps: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL
    Divergence"). With ``log_ratio = ref_logps - logps``:

    - ``k1 = -log_ratio``: unbiased, high variance, can be negative.
    - ``k2 = 0.5 * log_ratio**2``: biased, low variance, always >= 0.
    - ``k3 = exp(log_ratio) - 1 - log_ratio``: unbiased and always >= 0 (the GRPO paper's choice).
      As verl's ``low_var_kl``, the log-ratio is clamped to [-20, 20] and k3 to at most 10, so
      a token the reference finds wildly unlikely cannot blow the loss up (exp(20) ~ 5e8); the
      clamped tokens pass no gradient.
    """
    check_choice(estimator, KL_ESTIMATORS, "kl_estimator")
    return _ESTIMATORS[estimator](ref_logps - logps)


@dataclass(frozen=True)
class GaussianActions:
    """Per-action Gaussian distributions of the policy and of the reference, with a shared std
    (a generator's SDE steps): ``mean`` (B, T, *event) with gradient, ``ref_mean`` (B, T, *event),
    ``std`` (B, T). A policy whose actions have them hands them to the objective
    (``gaussians=``), which then computes the KL in closed form (:func:`gaussian_kl`)."""

    mean: Tensor
    ref_mean: Tensor
    std: Tensor


def gaussian_kl(mean: Tensor, ref_mean: Tensor, std: Tensor) -> Tensor:
    """KL(N(mean, std^2 I) || N(ref_mean, std^2 I)) per action, as Flow-GRPO computes it:

        KL = ||mean - ref_mean||^2 / (2 std^2)

    with ``||.||^2`` the *mean* over the event dims (matching the "mean" reduction of the step
    log-prob). ``mean``/``ref_mean`` (B, T, *event), ``std`` (B, T) (clamped to >= 1e-12);
    returns (B, T). E.g. mean [0.2, 0.4], ref [0, 0], std 0.5: (0.04 + 0.16) / 2 / 0.5 = 0.2."""
    sq = (mean - ref_mean) ** 2
    if sq.dim() > 2:
        sq = sq.flatten(2).mean(-1)
    return sq / (2 * std.clamp(min=1e-12) ** 2)


def reference_kl(
    cfg,
    logps: Optional[Tensor],
    ref_logps: Optional[Tensor] = None,
    kl: Optional[Tensor] = None,
    gaussians: Optional[GaussianActions] = None,
) -> Optional[Tensor]:
    """The per-action KL to the reference that the objective adds as ``beta * KL``, or ``None``
    when ``cfg.beta <= 0``. From the first that is given: ``kl`` (computed by the caller),
    ``gaussians`` (:func:`gaussian_kl`), ``ref_logps`` (:func:`kl_penalty` with
    ``cfg.kl_estimator``); none of them with ``beta > 0`` is an error."""
    if cfg.beta <= 0:
        return None
    if kl is not None:
        return kl
    if gaussians is not None:
        return gaussian_kl(gaussians.mean, gaussians.ref_mean, gaussians.std)
    if ref_logps is None:
        raise ValueError(
            f"beta={cfg.beta} > 0 needs ref_logps (reference-model log-probs); "
            "pass them or set beta=0"
        )
    return kl_penalty(logps, ref_logps, cfg.kl_estimator)


def kl_cov_penalty(logps: Tensor, old_logps: Tensor, selected: Tensor, coef: float) -> Tensor:
    """KL-Cov's per-token penalty ("The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models"): ``coef * |logp - old_logp|`` on the ``selected`` (bool (B, T)) high-covariance
    tokens, 0 elsewhere. E.g. logp [-1.0, -2.0], old [-1.5, -1.5], selected [True, False],
    coef 2: [2 * 0.5, 0] = [1.0, 0.0]."""
    return coef * (selected.to(logps.dtype) * (logps - old_logps).abs())


def entropy_bonus(entropies: Tensor, coef: float) -> Tensor:
    """The entropy bonus as a per-token loss term, ``-coef * H``: minimising the loss raises the
    policy's entropy. E.g. H [0.5, 2.0], coef 0.1: [-0.05, -0.2]."""
    return -coef * entropies
