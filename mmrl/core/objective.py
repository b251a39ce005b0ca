"""The clipped policy-gradient objective, shared by every modality.

A "token" here is any action with a log-probability: a generated token for a VLM, a denoising
transition for a diffusion/flow generator. Inputs are (B, T) per-action log-probs and a (B, T)
mask of real actions; the modality-specific ``Policy.train_step`` computes them and calls
:func:`policy_loss`, so the loss math exists once.

References:

- PPO clipped surrogate: "Proximal Policy Optimization Algorithms" (Schulman et al., 2017).
- Decoupled clip range ("clip-higher") and token-level mean: "DAPO: An Open-Source LLM
  Reinforcement Learning System at Scale" (Yu et al., 2025).
- KL estimators k1/k2/k3: John Schulman, "Approximating KL Divergence" (blog, 2020).
- Constant-normaliser aggregation (``seq_mean_token_sum_norm``): "Understanding R1-Zero-Like
  Training: A Critical Perspective" (Dr. GRPO, Liu et al., 2025).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

__all__ = [
    "ObjectiveConfig",
    "kl_penalty",
    "aggregate",
    "policy_loss",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
]

KL_ESTIMATORS = ("k1", "k2", "k3")
LOSS_AGG_MODES = (
    "token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_mean",
    "seq_mean_token_sum_norm",
)


def _check_choice(value: str, valid: tuple[str, ...], what: str) -> None:
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid values: {', '.join(valid)}")


@dataclass
class ObjectiveConfig:
    """Hyper-parameters of :func:`policy_loss`."""

    epsilon: float = 0.2  # lower clip: ratio >= 1 - epsilon
    epsilon_high: Optional[float] = None  # upper clip: ratio <= 1 + epsilon_high; None -> epsilon
    beta: float = 0.0  # KL weight; 0 disables the KL term (no reference model needed)
    kl_estimator: str = "k3"  # k1 | k2 | k3
    loss_agg_mode: str = "token_mean"  # see LOSS_AGG_MODES
    max_completion_length: Optional[int] = None  # constant divisor for seq_mean_token_sum_norm

    def __post_init__(self) -> None:
        # Fail when the config is built, not on the first training step.
        _check_choice(self.kl_estimator, KL_ESTIMATORS, "kl_estimator")
        _check_choice(self.loss_agg_mode, LOSS_AGG_MODES, "loss_agg_mode")

    @property
    def clip_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @classmethod
    def from_algo(cls, algo: Any, max_completion_length: Optional[int] = None) -> "ObjectiveConfig":
        """Build from an object with ``epsilon, epsilon_high, beta, kl_estimator, loss_agg_mode``
        attributes (e.g. the run's ``AlgoConfig``)."""
        return cls(
            epsilon=algo.epsilon,
            epsilon_high=algo.epsilon_high,
            beta=algo.beta,
            kl_estimator=algo.kl_estimator,
            loss_agg_mode=algo.loss_agg_mode,
            max_completion_length=max_completion_length,
        )


def kl_penalty(logps: Tensor, ref_logps: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL
    Divergence"). With ``log_ratio = ref_logps - logps``:

    - ``k1 = -log_ratio``: unbiased, high variance, can be negative.
    - ``k2 = 0.5 * log_ratio**2``: biased, low variance, always >= 0.
    - ``k3 = exp(log_ratio) - 1 - log_ratio``: unbiased and always >= 0 (the GRPO paper's choice).
    """
    _check_choice(estimator, KL_ESTIMATORS, "kl_estimator")
    log_ratio = ref_logps - logps
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    return torch.exp(log_ratio) - 1 - log_ratio


def _at_least_one(n: Any, like: Tensor) -> Tensor:
    return torch.as_tensor(n, dtype=like.dtype, device=like.device).clamp(min=1)


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    mode: str,
    *,
    num_tokens: Any = None,
    num_seqs: Any = None,
    max_completion_length: Optional[int] = None,
) -> Tensor:
    """Reduce a (B, T) per-token loss over the masked tokens to a scalar.

    - ``token_mean``: sum(l*m) / num_tokens. Every token weighs the same, so long answers are not
      under-weighted (DAPO).
    - ``seq_mean_token_sum``: sum_i sum_t(l*m) / num_seqs.
    - ``seq_mean_token_mean``: sum_i [sum_t(l*m) / sum_t(m)] / num_seqs, the original GRPO
      formula; a sequence with no tokens contributes 0.
    - ``seq_mean_token_sum_norm``: sum_i sum_t(l*m) / (num_seqs * max_completion_length). A
      constant normaliser removes GRPO's length bias (Dr. GRPO).

    ``num_tokens`` (default: this call's sum(mask)) and ``num_seqs`` (default: B) exist for
    gradient accumulation: when a mini-batch is split into micro-batches, pass the mini-batch
    totals to every micro-batch call, and the sum of the micro-batch losses (and of their
    gradients) equals the loss of the whole mini-batch. Normalisers are clamped to >= 1 so an
    empty batch yields 0, not NaN.
    """
    _check_choice(mode, LOSS_AGG_MODES, "loss_agg_mode")
    mask = mask.to(per_token.dtype)
    masked = per_token * mask
    if num_seqs is None:
        num_seqs = per_token.shape[0]
    if mode == "token_mean":
        if num_tokens is None:
            num_tokens = mask.sum()
        return masked.sum() / _at_least_one(num_tokens, masked)
    seq_sums = masked.sum(dim=-1)
    if mode == "seq_mean_token_sum":
        return seq_sums.sum() / _at_least_one(num_seqs, masked)
    if mode == "seq_mean_token_mean":
        per_seq = seq_sums / mask.sum(dim=-1).clamp(min=1)
        return per_seq.sum() / _at_least_one(num_seqs, masked)
    if max_completion_length is None:
        raise ValueError(
            "loss_agg_mode 'seq_mean_token_sum_norm' needs max_completion_length "
            "(the constant per-sequence normaliser)"
        )
    return seq_sums.sum() / (_at_least_one(num_seqs, masked) * max_completion_length)


def policy_loss(
    logps: Tensor,
    old_logps: Optional[Tensor],
    advantages: Tensor,
    mask: Tensor,
    cfg: ObjectiveConfig,
    ref_logps: Optional[Tensor] = None,
    num_tokens: Any = None,
    num_seqs: Any = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate loss (PPO / GRPO / DAPO) plus an optional KL penalty.

    Per token, with ``ratio = exp(logps - old_logps)``:

        pg = -min(ratio * A, clamp(ratio, 1 - epsilon, 1 + epsilon_high) * A)
        l  = pg + beta * KL_k(pi || pi_ref)          (KL only when beta > 0)

    then ``l`` is reduced with :func:`aggregate` in ``cfg.loss_agg_mode``.

    ``logps``/``old_logps``/``ref_logps``/``mask`` are (B, T); ``advantages`` is (B,) (one per
    sequence, broadcast over T) or (B, T). ``old_logps=None`` means a single optimisation
    iteration: old = ``logps.detach()``, so the ratio is exactly 1 but the gradient still flows
    through ``logps`` (as TRL does).

    Returns ``(loss, metrics)``. Metrics are python floats. ``ratio_mean``, ``clip_frac_low``
    (A < 0 and ratio < 1 - epsilon), ``clip_frac_high`` (A > 0 and ratio > 1 + epsilon_high),
    ``kl`` (only when beta > 0) and ``pg_loss`` are masked means over this call's tokens, so a
    caller averages them over micro-batches. ``loss`` is the returned loss value, scaled by the
    given normalisers, so with gradient accumulation it *sums* over micro-batches.
    """
    if old_logps is None:
        old_logps = logps.detach()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(logps.dtype)
    mask = mask.to(logps.dtype)

    ratio = torch.exp(logps - old_logps)
    low, high = 1 - cfg.epsilon, 1 + cfg.clip_high
    pg = -torch.min(ratio * advantages, torch.clamp(ratio, low, high) * advantages)
    per_token = pg

    kl = None
    if cfg.beta > 0:
        if ref_logps is None:
            raise ValueError(
                f"beta={cfg.beta} > 0 needs ref_logps (reference-model log-probs); "
                "pass them or set beta=0"
            )
        kl = kl_penalty(logps, ref_logps, cfg.kl_estimator)
        per_token = pg + cfg.beta * kl

    loss = aggregate(
        per_token,
        mask,
        cfg.loss_agg_mode,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        max_completion_length=cfg.max_completion_length,
    )

    with torch.no_grad():
        n = mask.sum().clamp(min=1)

        def token_mean(x: Tensor) -> float:
            return float((x.to(mask.dtype) * mask).sum() / n)

        metrics = {
            "ratio_mean": token_mean(ratio),
            "clip_frac_low": token_mean((advantages < 0) & (ratio < low)),
            "clip_frac_high": token_mean((advantages > 0) & (ratio > high)),
            "pg_loss": token_mean(pg),
            "loss": float(loss),
        }
        if kl is not None:
            metrics["kl"] = token_mean(kl)
    return loss, metrics
