"""NGRPO: a virtual max-reward sample in every group's statistics."""

from __future__ import annotations

import torch
from torch import Tensor

from mmrl.registry import register_advantage

from .base import as_float_tensor, finalize_advantages, group_index


@register_advantage("ngrpo", inputs=("r_max",))
def ngrpo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    eps: float = 1e-6,
    r_max: float = 1.0,
    num_virtual: int = 1,
    scale_rewards: bool = True,
) -> Tensor:
    """NGRPO advantage calibration: a virtual max-reward sample joins every group's statistics.

    From "NGRPO: Negative-enhanced Group Relative Policy Optimization" (Nan et al., 2025). With
    ``k = num_virtual`` virtual samples of reward ``r_max`` added to group g of n real samples:

        mean'_g = (sum_{i in g} r_i + k * r_max) / (n + k)
        std'_g  = sqrt((sum_{i in g} (r_i - mean'_g)^2 + k * (r_max - mean'_g)^2) / (n + k - 1))
        A_i     = (r_i - mean'_g) / (std'_g + eps)

    The virtual samples get no advantage of their own. An all-wrong group (all 0, r_max = 1) now
    gets negative advantages instead of zeros; an all-correct group at ``r_max`` still gets 0.
    The unbiased std over n + k values and k = 1 match the authors' code; with 8 samples of
    which one is correct this gives +1.76 / -0.50 (GRPO: +2.47 / -0.35), the paper's numbers.
    ``scale_rewards=False`` drops the std division (``A_i = r_i - mean'_g``). The paper's other
    half, asymmetric clipping, belongs to the objective (``epsilon`` < ``epsilon_high``).

    An all-equal group of n samples at r (by design the exception to "no signal"): with one
    virtual sample, ``mean' = (n r + r_max) / (n + 1)``, ``std' = |r_max - r| / sqrt(n + 1)``, so
    ``A = (r - r_max) / (n + 1) / (|r_max - r| / sqrt(n + 1) + eps)`` (-1/sqrt(n+1) for r < r_max,
    exactly 0 at r = r_max); statistics in float64 give that value without a rounding residue.
    """
    if int(num_virtual) != num_virtual or num_virtual < 0:
        raise ValueError(f"num_virtual must be a non-negative integer, got {num_virtual!r}")
    r_in = as_float_tensor(rewards)
    r = r_in.to(torch.float64)  # float64: an all-equal group gets exactly the formula's value
    inverse, num_groups = group_index(r, group_ids)
    k = float(num_virtual)
    count = torch.zeros(num_groups, dtype=r.dtype, device=r.device).index_add_(
        0, inverse, torch.ones_like(r)
    ) + k
    total = torch.zeros_like(count).index_add_(0, inverse, r) + k * r_max
    mean = total / count
    sq = torch.zeros_like(count).index_add_(0, inverse, (r - mean[inverse]) ** 2)
    sq = sq + k * (r_max - mean) ** 2
    std = (sq / (count - 1).clamp(min=1)).sqrt()
    centred = r - mean[inverse]
    return finalize_advantages(centred / (std[inverse] + eps) if scale_rewards else centred, r_in)
