"""The registered policy losses of the core: per-token surrogates on (B, T) log-probs.

A loss is a pure function registered with ``@register_loss(name)`` and looked up by
``algo.loss_type``; :func:`mmrl.core.losses.objective.policy_loss` composes it with what every loss
shares (off-policy shaping, token selections, the rollout IS weight, penalties, aggregation).
Signature:

    fn(logps, old_logps, advantages, mask, cfg, **inputs) -> Surrogate

with (B, T) tensors (advantages (B, 1) or (B, T)) and ``cfg`` the :class:`ObjectiveConfig`;
``inputs`` are extra per-action tensors a likelihood-free loss declared in ``requires``.
``requires`` names what a policy must provide: ``logps``; ``whole_sequences`` for losses over a
sequence's mean log-ratio (GSPO, Reg-GRPO), which a policy that computes one action per call (a
generator's per-timestep backward) cannot give. A loss builds on the pieces of :mod:`.ratios`
(its ratio) and :mod:`.clipping` (its clip mode).

Papers (titles, so they can be looked up):

- Clipped surrogate: "Proximal Policy Optimization Algorithms" (Schulman et al., 2017), with the
  decoupled clip range of "DAPO: An Open-Source LLM Reinforcement Learning System at Scale".
- GSPO: "Group Sequence Policy Optimization" (Zheng et al., 2025).
- Reg-GRPO: "DeepVideo-R1: Video Reinforcement Fine-Tuning via Difficulty-aware Regressive GRPO"
  (Park et al., 2025).
- CISPO: "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention" (MiniMax, 2025).
- KL-Cov's unclipped surrogate: "The Entropy Mechanism of Reinforcement Learning for Reasoning
  Language Models" (Cui et al., 2025).
- Off-policy guidance: "TempSamp-R1: Effective Temporal Sampling with Reinforcement Fine-Tuning
  for Video LLMs", weighted with the policy shaping of "Learning to Reason under Off-Policy
  Guidance" (LUFFY, Yan et al., 2025).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor

from mmrl.registry import register_loss

from .clipping import Bound, clip_bounds, clipped_surrogate
from .ratios import gspo_ratio, seq_mean, token_ratio

__all__ = [
    "Surrogate",
    "reg_grpo_loss",
    "cispo_loss",
    "off_policy_shaped_loss",
    "off_policy_rows",
    "shape_off_policy_rows",
]


@dataclass
class Surrogate:
    """A loss's per-token policy-gradient term ``pg`` (B, T) and what its metrics need:
    ``clip_ratio`` (the ratio whose clip events are reported; None = no clip fractions),
    ``low``/``high`` (the bounds), ``clip_both_sides`` (CISPO clips its weight whatever the sign
    of A), ``dual`` (dual-clip capped tokens) and ``metrics`` (extra keys, e.g. seq_ratio_mean)."""

    pg: Tensor
    clip_ratio: Optional[Tensor] = None
    low: Any = None
    high: Any = None
    clip_both_sides: bool = False
    dual: Optional[Tensor] = None
    metrics: dict[str, Tensor] = field(default_factory=dict)


def reg_grpo_loss(
    logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, reg_scale: float
) -> Tensor:
    """Reg-GRPO ("DeepVideo-R1: Video Reinforcement Fine-Tuning via Difficulty-aware Regressive
    GRPO"): regress the advantage directly, with no clip and no min.

    The KL-regularised optimum ``pi* ∝ pi_old * exp(A / beta)`` says the (length-normalised)
    log-ratio of sequence i should equal ``A_i / beta``. With
    ``r_i = (1/|y_i|) sum_t (logp - old_logp)`` and ``beta = reg_scale``:

        l_i = (reg_scale / 2) * (r_i - A_i / reg_scale) ** 2
            = (reg_scale * r_i - A_i) ** 2 / (2 * reg_scale)

    i.e. the squared error between the predicted advantage ``reg_scale * r_i`` and A_i, scaled by
    ``1 / (2 * reg_scale)`` so that on-policy (r_i = 0) the gradient is exactly GRPO's
    ``-A_i * grad r_i`` (learning rates transfer); past the target the gradient reverses, which is
    the built-in trust region that replaces the clip. ``l_i`` is broadcast to every token of
    sequence i; with ``seq_mean_token_mean`` the loss is ``mean_i l_i``. (B, T) advantages are
    reduced to their per-sequence masked mean.
    """
    if advantages.shape[-1] != 1:
        adv = seq_mean(advantages, mask)
    else:
        adv = advantages.squeeze(-1)
    r = seq_mean(logps - old_logps, mask)
    per_seq = 0.5 * reg_scale * (r - adv / reg_scale) ** 2
    return per_seq.unsqueeze(-1).expand_as(logps)


def cispo_loss(ratio: Tensor, logps: Tensor, advantages: Tensor, low: Bound, high: Bound) -> Tensor:
    """CISPO ("MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention"):
    clip the importance-sampling *weight*, never drop a token's gradient:

        J = sum_t sg[clamp(ratio, low, high)] * A * log pi(y_t)

    Per token we return ``-A * sg[w] * (1 + logp - sg[logp])`` with ``w = clamp(ratio)``: its
    gradient is the paper's ``-A * w * grad logp`` and its value is the readable ``-A * w``
    (MiniMax/verl's ``-A * w * logp`` differs only by a constant for the gradient). The paper
    uses no lower bound: set ``epsilon = 1`` (low = 0) and tune ``epsilon_high``.
    """
    w = torch.clamp(ratio, low, high).detach()
    return -advantages * w * (1 + logps - logps.detach())


def off_policy_shaped_loss(logps: Tensor, advantages: Tensor, gamma: float) -> Tensor:
    """Per-token policy-gradient loss of off-policy samples (B, T): completions the policy did not
    generate, e.g. the ground-truth solutions that "TempSamp-R1: Effective Temporal Sampling with
    Reinforcement Fine-Tuning for Video LLMs" injects into each GRPO group.

    Importance weighting of "Learning to Reason under Off-Policy Guidance" (LUFFY): the behaviour
    probability of an off-policy token is taken as 1, so its importance weight is the current
    token probability ``p = exp(logp)``, regularised by policy shaping ``f(p) = p / (p + gamma)``
    and never clipped:

        pg_off = -f(p) * A = -A * p / (p + gamma)
        d pg_off / d logp = -A * gamma * p / (p + gamma) ** 2

    Plain ``-p * A`` would give gradient ``-A * p``, vanishing on the low-probability tokens
    that the guidance should teach; the shaping moves the gradient's peak to ``p = gamma``
    (``gamma = 0.1`` in LUFFY), up-weighting them. E.g. p = 0.5, gamma = 0.1, A = 2:
    ``pg_off = -2 * 0.5 / 0.6 = -1.6667`` and the gradient is ``-2 * 0.1 * 0.5 / 0.36 = -0.2778``.

    ``advantages`` is (B,), (B, 1) or (B, T); the result has the shape of ``logps``.
    """
    if advantages.dim() == 1 and logps.dim() == 2:
        advantages = advantages.unsqueeze(-1)
    p = torch.exp(logps)
    return -(p / (p + gamma)) * advantages.to(logps.dtype)


def off_policy_rows(off_policy: Optional[Tensor], like: Tensor) -> Optional[Tensor]:
    """The (B,) bool marks of off-policy rows as a (B, 1) bool tensor on ``like``'s device (None
    stays None); a mark per row of ``like`` (B, T) or the error says the shapes."""
    if off_policy is None:
        return None
    if off_policy.shape != like.shape[:1]:
        raise ValueError(f"off_policy must have shape (B,) = {tuple(like.shape[:1])}, "
                         f"got {tuple(off_policy.shape)}")
    return off_policy.to(device=like.device, dtype=torch.bool).unsqueeze(-1)


def shape_off_policy_rows(pg: Tensor, logps: Tensor, advantages: Tensor, rows: Optional[Tensor],
                          gamma: float) -> Tensor:
    """``pg`` with the rows marked in ``rows`` (B, 1) replaced by :func:`off_policy_shaped_loss`
    (no clip); ``pg`` itself when no row is marked. E.g. pg [[0.3], [0.3]], rows [[False], [True]],
    logp 0 (p = 1), A 1, gamma 0.1: [[0.3], [-1 / 1.1]] = [[0.3], [-0.9091]]."""
    if rows is None or not bool(rows.any()):
        return pg
    return torch.where(rows, off_policy_shaped_loss(logps, advantages, gamma), pg)


# ---- the registered losses ------------------------------------------------------------------------


def _bounds(advantages: Tensor, cfg) -> tuple[Bound, Bound]:
    return clip_bounds(advantages, cfg.epsilon, cfg.clip_high, cfg.clip_pos, cfg.clip_neg)


@register_loss("clip")
def clip_loss(logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, cfg) -> Surrogate:
    """PPO / GRPO / DAPO: ``-min(ratio A, clamp(ratio, low, high) A)`` (asymmetric bounds with
    ``clip_pos``/``clip_neg``, dual-clip with ``dual_clip_c``). With KL-Cov in the paper's form
    (``kl_cov_ratio`` set, ``kl_cov_clip`` off) the unclipped ``-A ratio``: the KL-Cov penalty on
    the high-covariance tokens is then the trust region."""
    ratio = token_ratio(logps, old_logps)
    if cfg.unclipped:
        return Surrogate(-advantages * ratio)
    low, high = _bounds(advantages, cfg)
    pg, dual = clipped_surrogate(ratio, advantages, low, high, cfg.dual_clip_c)
    return Surrogate(pg, ratio, low, high, dual=dual)


@register_loss("gspo", requires=("logps", "whole_sequences"))
def gspo_loss(logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, cfg) -> Surrogate:
    """GSPO: the clipped surrogate on the length-normalised sequence ratio (:func:`gspo_ratio`);
    the clip fractions refer to the sequence ratio."""
    seq_ratio = gspo_ratio(logps, old_logps, mask)
    low, high = _bounds(advantages, cfg)
    pg, dual = clipped_surrogate(seq_ratio, advantages, low, high, cfg.dual_clip_c)
    return Surrogate(pg, seq_ratio, low, high, dual=dual, metrics={"seq_ratio_mean": seq_ratio})


@register_loss("cispo")
def cispo(logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, cfg) -> Surrogate:
    """CISPO: the clipped importance weight times the log-prob gradient (:func:`cispo_loss`)."""
    ratio = token_ratio(logps, old_logps)
    low, high = _bounds(advantages, cfg)
    return Surrogate(cispo_loss(ratio, logps, advantages, low, high), ratio, low, high, clip_both_sides=True)


@register_loss("reg_grpo", requires=("logps", "whole_sequences"))
def reg_grpo(logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, cfg) -> Surrogate:
    """Reg-GRPO: regress the advantage, no clip (:func:`reg_grpo_loss`)."""
    return Surrogate(reg_grpo_loss(logps, old_logps, advantages, mask, cfg.reg_scale))
