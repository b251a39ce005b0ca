"""Aggregation of the per-token loss to a scalar (``algo.loss_agg_mode``), one small function per
mode, and the normalisers that make gradient accumulation exact.

Papers (titles, so they can be looked up):

- Token-level mean: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale".
- Constant-normaliser aggregation (``seq_mean_token_sum_norm``): "Understanding R1-Zero-Like
  Training: A Critical Perspective" (Dr. GRPO, Liu et al., 2025).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

from .config import LOSS_AGG_MODES, check_choice

__all__ = ["aggregate", "count_sequences"]


def _at_least_one(n: Any, like: Tensor) -> Tensor:
    return torch.as_tensor(n, dtype=like.dtype, device=like.device).clamp(min=1)


def count_sequences(mask: Tensor) -> float:
    """The number of rows of a (B, T) action mask with at least one action: the ``num_seqs``
    normaliser of the sequence-mean aggregations."""
    return float((torch.as_tensor(mask).sum(-1) > 0).sum())


# Each mode: (masked per-token loss (B, T), mask (B, T), num_tokens, num_seqs, max_completion_length) -> scalar.


def _token_mean(masked: Tensor, mask: Tensor, num_tokens: Any, num_seqs: Any, max_len: Optional[int]) -> Tensor:
    return masked.sum() / _at_least_one(mask.sum() if num_tokens is None else num_tokens, masked)


def _seq_mean_token_sum(masked: Tensor, mask: Tensor, num_tokens: Any, num_seqs: Any, max_len: Optional[int]) -> Tensor:
    return masked.sum(-1).sum() / _at_least_one(num_seqs, masked)


def _seq_mean_token_mean(masked: Tensor, mask: Tensor, num_tokens: Any, num_seqs: Any, max_len: Optional[int]) -> Tensor:
    per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / _at_least_one(num_seqs, masked)


def _seq_mean_token_sum_norm(masked: Tensor, mask: Tensor, num_tokens: Any, num_seqs: Any,
                             max_len: Optional[int]) -> Tensor:
    if max_len is None:
        raise ValueError(
            "loss_agg_mode 'seq_mean_token_sum_norm' needs max_completion_length "
            "(the constant per-sequence normaliser)"
        )
    return masked.sum(-1).sum() / (_at_least_one(num_seqs, masked) * max_len)


_MODES: dict[str, Callable[..., Tensor]] = {  # keyed by config.LOSS_AGG_MODES (a test checks they agree)
    "token_mean": _token_mean,
    "seq_mean_token_sum": _seq_mean_token_sum,
    "seq_mean_token_mean": _seq_mean_token_mean,
    "seq_mean_token_sum_norm": _seq_mean_token_sum_norm,
}


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

    ``num_tokens`` (default: this call's sum(mask)) and ``num_seqs`` (default: the rows with at
    least one action) exist for gradient accumulation: when a mini-batch is split into
    micro-batches, pass the mini-batch totals to every micro-batch call (:func:`count_sequences`),
    and the sum of the micro-batch losses (and of their gradients) equals the loss of the whole
    mini-batch. Normalisers are clamped to >= 1 so an empty batch yields 0, not NaN.

    A fully masked row (an overlong-filtered sample, DAPO) is left out of the loss, so it is not
    counted in ``num_seqs`` either: it must not dilute the other sequences' weight (verl's
    ``agg_loss`` counts only non-empty rows too). verl's ``seq-mean-token-sum-norm`` divides by
    the constant alone (no 1/B, verl issue #3741); mmrl averages over sequences as Dr. GRPO's
    formula does.
    """
    check_choice(mode, LOSS_AGG_MODES, "loss_agg_mode")
    mask = mask.to(per_token.dtype)
    if num_seqs is None:
        num_seqs = count_sequences(mask)
    return _MODES[mode](per_token * mask, mask, num_tokens, num_seqs, max_completion_length)
