"""Length shaping on the reward side (pure functions; the objective is untouched).

From "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (Yu et al., 2025):

- *Overlong filtering*: a truncated sample (it hit the length limit before finishing) gets a
  reward for an answer it never gave, which is noise; DAPO drops such samples from the loss.
  :func:`overlong_mask` is the per-sample multiplier of the action mask.
- *Soft overlong punishment*: a length-aware penalty added to the reward, zero up to
  ``max_len - buffer_len``, then linear down to ``-penalty`` at ``max_len``
  (:func:`soft_overlong_penalty`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

__all__ = ["overlong_mask", "soft_overlong_penalty"]


def overlong_mask(truncated: Optional[Any], n: Optional[int] = None) -> Tensor:
    """(N,) float multiplier: 0.0 for truncated samples, 1.0 otherwise (DAPO overlong filtering).

    Apply it to the action mask *before* computing the normalisers, so the dropped samples add
    neither loss nor tokens: ``mask = action_mask * overlong_mask(batch.truncated)[:, None]``;
    ``num_tokens = mask.sum()``. ``truncated=None`` (unknown) keeps every sample; pass ``n``
    for its length.
    """
    if truncated is None:
        if n is None:
            raise ValueError("truncated=None needs n, the number of samples")
        return torch.ones(n)
    t = torch.as_tensor(truncated).bool()
    return (~t).float()


def soft_overlong_penalty(lengths: Any, max_len: int, buffer_len: int, penalty: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment, added to the task reward. With ``L`` the completion
    length and ``start = max_len - buffer_len``:

        R_len(L) = 0                                   if L <= start
                 = -(L - start) / buffer_len * penalty  if start < L <= max_len
                 = -penalty                             if L > max_len

    Continuous at both ends (``-penalty`` exactly at ``max_len``). Returns an (N,) float tensor.
    """
    if not 0 < buffer_len <= max_len:
        raise ValueError(f"need 0 < buffer_len <= max_len, got buffer_len={buffer_len}, max_len={max_len}")
    L = torch.as_tensor(lengths, dtype=torch.float64)
    start = max_len - buffer_len
    ramp = -(L - start) / buffer_len * penalty
    beyond = torch.full_like(L, -penalty)
    out = torch.where(L <= start, torch.zeros_like(L), torch.where(L <= max_len, ramp, beyond))
    return out.to(torch.get_default_dtype())
