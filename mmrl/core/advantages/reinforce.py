"""REINFORCE++: batch (token-level) advantage normalisation."""

from __future__ import annotations

import torch
from torch import Tensor

from mmrl.registry import register_advantage

from .base import as_float_tensor, constant_groups, finalize_advantages, group_stats, whiten_batch


@register_advantage("reinforce_pp", inputs=("lengths",))
def reinforce_pp(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    eps: float = 1e-6,
    group_baseline: bool = True,
    lengths: Tensor | None = None,
    whiten: str = "token",
) -> Tensor:
    """REINFORCE++ outcome advantage: normalisation over the whole batch, not per group.

    From "REINFORCE++: Stabilizing Critic-Free Policy Optimization with Global Advantage
    Normalization" (Hu et al., 2025; first titled "REINFORCE++: A Simple and Efficient Approach
    for Aligning Large Language Models"). No critic and no per-group std: the batch supplies the
    baseline and the scale. With outcome rewards every token of sequence i carries the same
    advantage, and the paper normalises *token* advantages over the global batch (its eq. 10):

        mean_B = sum_i L_i u_i / sum_i L_i,  var_B = sum_i L_i (u_i - mean_B)^2 / (sum_i L_i - 1)
        A_i    = (u_i - mean_B) / (sqrt(var_B) + eps)

    with L_i the number of actions (tokens) of sample i (``lengths``; the trainer passes them),
    the Bessel correction over the token count, as OpenRLHF's and verl's ``masked_whiten`` do.
    ``whiten="sequence"`` (or no ``lengths``) weights every sequence once instead.

    - ``group_baseline=False`` (REINFORCE++, k >= 1 samples per prompt): ``u_i = r_i``.
    - ``group_baseline=True`` (default; "REINFORCE++ w/ baseline", verl's
      ``reinforce_plus_plus_baseline``): ``u_i = r_i - mean_g(r)``. A group of one sample has no
      group mean to subtract; its baseline is the batch mean ``mean_B(r)`` (verl uses 0 there).
      An all-equal group of two or more samples gets exactly 0 (its residuals are 0 and carry
      no ranking; float64 statistics keep the rounding residue of the group mean out).

    A batch with no spread whitens to exactly 0.
    """
    if whiten not in ("token", "sequence"):
        raise ValueError(f"reinforce_pp whiten must be 'token' or 'sequence', got {whiten!r}")
    r = as_float_tensor(rewards)
    mean_g, _, count = group_stats(r, group_ids)
    u = r.to(torch.float64)
    zero = None
    if group_baseline:
        u = u - torch.where(count > 1, mean_g, u.mean())
        zero = constant_groups(r, group_ids) & (count > 1)
    weights = None
    if whiten == "token" and lengths is not None:
        weights = torch.as_tensor(lengths, dtype=torch.float64, device=r.device)
        if weights.shape != r.shape:
            raise ValueError(f"reinforce_pp: lengths must have one entry per sample, got {tuple(weights.shape)} "
                             f"for {r.numel()} samples")
    return finalize_advantages(whiten_batch(u, eps, weights).to(torch.float64), r, zero)
