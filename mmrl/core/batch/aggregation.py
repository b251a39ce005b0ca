"""Combine several reward components into the one reward per sample the advantage needs.

A task's rewards (``format``, ``iou``, ``count`` ...) come on different scales. A plain weighted
sum lets the component with the widest spread dominate the advantage; standardising each
component first (what flow_grpo users ask for with several reward models) gives every component
the influence its weight says, whatever its units.
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor

from ..advantages import constant_groups, group_stats

__all__ = ["AGGREGATION_MODES", "aggregate_rewards"]

AGGREGATION_MODES = ("weighted_sum", "zscore", "group_zscore")


def _standardise(x: Tensor, ids: Tensor, eps: float) -> Tensor:
    """``(x - mean) / (std + eps)`` within each id (unbiased std, float64 statistics); a constant
    set gives exactly 0 (the advantages' constant-group rule)."""
    mean, std, _ = group_stats(x, ids)
    z = (x.to(mean.dtype) - mean) / (std + eps)
    return torch.where(constant_groups(x, ids), torch.zeros_like(z), z).to(x.dtype)


def aggregate_rewards(
    components: Mapping[str, Tensor],
    weights: Mapping[str, float],
    mode: str = "weighted_sum",
    group_ids: Tensor | None = None,
    eps: float = 1e-6,
) -> Tensor:
    """The total reward (N,) from ``components`` (name -> (N,) scores) and ``weights``.

    - ``weighted_sum``: ``R_i = sum_k w_k r_{k,i}`` (what :class:`RewardComputer` returns).
    - ``zscore``: ``R_i = sum_k w_k (r_{k,i} - mean_B(r_k)) / (std_B(r_k) + eps)``, each
      component standardised over the batch first; a component constant over the batch adds 0.
    - ``group_zscore``: the same with mean and std taken within each group (``group_ids``
      required); a component constant within a group adds 0 to that group.

    Stds are unbiased (one value has std 0, hence contributes 0). ``weights`` must name exactly
    the components.
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown reward aggregation mode {mode!r}; choose one of {AGGREGATION_MODES}")
    if set(components) != set(weights):
        raise ValueError(
            f"weights and reward components must name the same rewards: components "
            f"{sorted(components)}, weights {sorted(weights)}"
        )
    if not components:
        raise ValueError("no reward components to aggregate")
    tensors = {k: torch.as_tensor(v) for k, v in components.items()}
    tensors = {k: v if v.is_floating_point() else v.float() for k, v in tensors.items()}
    shapes = {tuple(v.shape) for v in tensors.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise ValueError(f"reward components must all be 1-D of one length, got shapes {sorted(shapes)}")
    first = next(iter(tensors.values()))
    n, device, dtype = first.numel(), first.device, torch.float32
    for v in tensors.values():
        dtype = torch.promote_types(dtype, v.dtype)

    if mode == "weighted_sum":
        ids = None
    elif mode == "zscore":
        ids = torch.zeros(n, dtype=torch.long, device=device)
    else:
        if group_ids is None:
            raise ValueError("group_zscore needs group_ids")
        ids = torch.as_tensor(group_ids, device=device)

    total = torch.zeros(n, dtype=dtype, device=device)
    for name, scores in tensors.items():
        scores = scores.to(device=device, dtype=dtype)
        if ids is not None:
            scores = _standardise(scores, ids, eps)
        total = total + float(weights[name]) * scores
    return total
