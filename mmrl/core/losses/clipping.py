"""Clip modes of the policy loss: the bounds of the ratio, the clipped surrogate (with dual-clip)
and the clip events its metrics count.

Papers (titles, so they can be looked up):

- Clipped surrogate: "Proximal Policy Optimization Algorithms" (Schulman et al., 2017), with the
  decoupled clip range of "DAPO: An Open-Source LLM Reinforcement Learning System at Scale".
- Asymmetric clipping: "NGRPO: Negative-enhanced Group Relative Policy Optimization" (2025).
- Dual-clip: "Mastering Complex Control in MOBA Games with Deep Reinforcement Learning"
  (Ye et al., 2020), in verl's form.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

__all__ = ["Bound", "clip_bounds", "clipped_surrogate", "clip_events"]

Bound = Union[float, Tensor]


def clip_bounds(
    advantages: Tensor,
    epsilon: float,
    epsilon_high: float,
    clip_pos: Optional[tuple[float, float]] = None,
    clip_neg: Optional[tuple[float, float]] = None,
) -> tuple[Bound, Bound]:
    """Ratio bounds ``(low, high)`` of the clipped surrogate.

    Without overrides: the python floats ``1 - epsilon, 1 + epsilon_high`` (the PPO/DAPO path,
    unchanged). Asymmetric clipping (NGRPO, "NGRPO: Negative-enhanced Group Relative Policy
    Optimization": looser updates for positive samples): ``clip_pos = (eps_low, eps_high)`` is
    used where A >= 0 and ``clip_neg = (eps_low, eps_high)`` where A < 0; a side left ``None``
    falls back to ``(epsilon, epsilon_high)``. The result is then a tensor broadcastable to the
    ratio. Under the PPO ``min`` only the upper bound binds for A > 0 and only the lower bound
    for A < 0, so effectively ``clip_pos[1]`` and ``clip_neg[0]`` matter there (CISPO clips its
    weight on both sides, so both numbers matter for it).
    """
    if clip_pos is None and clip_neg is None:
        return 1 - epsilon, 1 + epsilon_high
    pos = clip_pos if clip_pos is not None else (epsilon, epsilon_high)
    neg = clip_neg if clip_neg is not None else (epsilon, epsilon_high)
    is_pos = advantages >= 0
    like = advantages
    low = torch.where(is_pos, like.new_tensor(1 - pos[0]), like.new_tensor(1 - neg[0]))
    high = torch.where(is_pos, like.new_tensor(1 + pos[1]), like.new_tensor(1 + neg[1]))
    return low, high


def clipped_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    low: Bound,
    high: Bound,
    dual_clip_c: Optional[float] = None,
) -> tuple[Tensor, Optional[Tensor]]:
    """Per-token clipped surrogate loss ``-min(ratio*A, clamp(ratio, low, high)*A)``.

    Dual-clip ("Mastering Complex Control in MOBA Games with Deep Reinforcement Learning", as in
    verl): for A < 0 the PPO loss ``|A| * max(ratio, clamp(ratio))`` is unbounded in the ratio;
    with ``dual_clip_c = c > 1`` it is capped at ``c * |A|``:

        pg = min(pg_clip, -c * A)   where A < 0;   pg = pg_clip  otherwise

    and the capped tokens get no gradient. Returns ``(pg, dual_clipped)``, the second a bool
    (B, T) mask of capped tokens (``None`` without dual-clip).
    """
    pg = -torch.min(ratio * advantages, torch.clamp(ratio, low, high) * advantages)
    if dual_clip_c is None:
        return pg, None
    cap = -advantages * dual_clip_c
    dual = (advantages < 0) & (pg > cap)
    return torch.where(advantages < 0, torch.min(pg, cap), pg), dual


def clip_events(
    ratio: Tensor, advantages: Tensor, low: Bound, high: Bound, both_sides: bool = False
) -> tuple[Tensor, Tensor]:
    """Bool (B, T) masks ``(clipped_low, clipped_high)`` of the tokens whose ratio the clip holds:
    under the PPO ``min`` a bound binds only where it lowers the objective, i.e. ``A < 0`` and
    ``ratio < low``, or ``A > 0`` and ``ratio > high``; with ``both_sides`` (CISPO clips its IS
    weight whatever the sign of A) ``ratio < low`` and ``ratio > high``. E.g. ratio [0.7, 1.3],
    A [-1, -1], bounds [0.8, 1.2]: low [True, False], high [False, False] (both_sides: [False, True])."""
    below, above = ratio < low, ratio > high
    if both_sides:
        return below, above
    return (advantages < 0) & below, (advantages > 0) & above
