"""Importance ratios of the policy loss: the token ratio, GSPO's sequence ratio, and the weight that
corrects for a rollout engine sampling from slightly different log-probs than the trainer computes.

Papers (titles, so they can be looked up):

- Token ratio ``pi / pi_old``: "Proximal Policy Optimization Algorithms" (Schulman et al., 2017).
- Sequence ratio: "Group Sequence Policy Optimization" (GSPO, Zheng et al., 2025).
- Rollout correction: "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
  (Yao et al., 2025), in TRL's four modes.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["seq_mean", "token_ratio", "gspo_ratio", "rollout_is_weight"]


def seq_mean(x: Tensor, mask: Tensor) -> Tensor:
    """(B,) masked mean over T (0 for a sequence with no tokens)."""
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def token_ratio(logps: Tensor, old_logps: Tensor) -> Tensor:
    """Per-token importance ratio ``exp(logp - old_logp)`` (B, T), with gradient through ``logps``:
    the ratio of the clipped surrogate of "Proximal Policy Optimization Algorithms". E.g. logp
    -1.0 against old -1.5: ``exp(0.5) = 1.6487``."""
    return torch.exp(logps - old_logps)


def gspo_ratio(logps: Tensor, old_logps: Tensor, mask: Tensor) -> Tensor:
    """GSPO-token importance ratio ("Group Sequence Policy Optimization"), shape (B, T).

    The sequence ratio is length-normalised, a geometric mean of the token ratios:

        s_i = (pi(y_i) / pi_old(y_i)) ** (1/|y_i|) = exp( (1/|y_i|) sum_t (logp - old_logp) )

    and the token form ``s_{i,t} = sg[s_i] * pi(y_it) / sg[pi(y_it)]`` has the *value* s_i on
    every token of sequence i while its gradient flows through token t only:
    ``d s_{i,t} / d logp_t = s_i``. Used in the clipped surrogate with a sequence advantage this
    is exactly GSPO (the whole sequence is clipped or not); with per-token advantages it is the
    paper's GSPO-token.
    """
    seq_log_ratio = seq_mean(logps - old_logps, mask)
    return torch.exp(logps - logps.detach() + seq_log_ratio.detach().unsqueeze(-1))


@torch.no_grad()
def rollout_is_weight(old_logps: Tensor, rollout_logps: Tensor, mask: Tensor, cfg) -> Tensor:
    """Importance weight of the rollout engine's samples, "Your Efficient RL Framework Secretly
    Brings You Off-Policy RL Training" (Yao et al., 2025), in TRL's four modes
    (``cfg.vllm_importance_sampling_mode``): ``rho = exp(old_logps - rollout_logps)`` per token
    (``token_*``) or per sequence (``sequence_*``: the sum over the sequence's tokens; (B, 1)), then
    ``*_truncate`` clamps it to ``[clip_min, clip_max]`` and ``*_mask`` zeroes it outside that
    range. E.g. token_truncate with clip_max 2: log-ratios [0.1, 1.0] -> weights [e^0.1, 2.0] =
    [1.1052, 2.0]. A NaN engine log-prob (not reported) counts as no mismatch (weight 1). The
    objective multiplies the policy-gradient term by it (not the penalties)."""
    diff = torch.nan_to_num((old_logps - rollout_logps.to(old_logps.dtype)) * mask, nan=0.0)
    mode = cfg.vllm_importance_sampling_mode
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    rho = torch.exp(diff)
    lo = -float("inf") if cfg.vllm_importance_sampling_clip_min is None else cfg.vllm_importance_sampling_clip_min
    hi = float("inf") if cfg.vllm_importance_sampling_clip_max is None else cfg.vllm_importance_sampling_clip_max
    if mode.endswith("truncate"):
        return rho.clamp(min=lo, max=hi)
    return rho.masked_fill((rho < lo) | (rho > hi), 0.0)
