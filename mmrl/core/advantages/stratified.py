"""Stratified GRPO: group residuals standardised within strata (e.g. the tasks of a mixture)."""

from __future__ import annotations

import torch
from torch import Tensor

from mmrl.registry import register_advantage

from .base import as_float_tensor, constant_groups, finalize_advantages, group_stats, whiten_batch


@register_advantage("stratified_grpo", inputs=("task_ids",))
def stratified_grpo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    eps: float = 1e-6,
    task_ids: Tensor | None = None,
    strata: Tensor | None = None,
    alpha: float = 1.0,
) -> Tensor:
    """Stratified advantage normalisation, blended with global normalisation.

    After "Stratified GRPO: Handling Structural Heterogeneity in Reinforcement Learning of LLM
    Search Agents" (Zhu et al., 2025): standardising one batch that mixes structurally different
    trajectories lets the high-variance kind set the scale for all; normalising within strata
    of similar trajectories removes that cross-stratum bias. Here, for a stratum label c_i
    (``strata``, else ``task_ids``):

        u_i        = r_i - mean_g(r)                                  (group-mean residual)
        A_strat_i  = (u_i - mean_{c_i}(u)) / (std_{c_i}(u) + eps)     (within the stratum)
        A_global_i = (u_i - mean_B(u)) / (std_B(u) + eps)             (over the batch)
        A_i        = alpha * A_strat_i + (1 - alpha) * A_global_i

    ``alpha=1`` (default) is purely stratified, so each task of a mixed-task batch gets unit
    std whatever its reward scale. Without labels the result is ``A_global``. The paper's strata
    are structural (e.g. the number of search calls of an agent trajectory) and it normalises
    raw rewards within strata; we subtract the group mean first so the prompt's difficulty is
    removed before pooling groups, and take any integer label as the stratum (task id, tool-call
    count, ...). An all-equal group gets exactly 0 (its residuals are 0; the stratum and batch
    means of residuals are 0 up to rounding, which float64 and the constant-group rule remove).
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"stratified_grpo alpha must be in [0, 1], got {alpha}")
    r = as_float_tensor(rewards)
    mean_g, _, _ = group_stats(r, group_ids)
    u = r.to(torch.float64) - mean_g
    zero = constant_groups(r, group_ids)
    a_global = whiten_batch(u, eps).to(torch.float64)
    labels = strata if strata is not None else task_ids
    if labels is None:
        return finalize_advantages(a_global, r, zero)
    labels = torch.as_tensor(labels, device=r.device)
    if labels.shape != r.shape:
        raise ValueError(
            f"task_ids/strata must have one label per sample: {tuple(labels.shape)} vs {tuple(r.shape)}"
        )
    mean_c, std_c, _ = group_stats(u, labels)
    a_strat = (u - mean_c) / (std_c + eps)
    return finalize_advantages(alpha * a_strat + (1 - alpha) * a_global, r, zero)
