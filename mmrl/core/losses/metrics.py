"""The metrics of one objective call: masked token means of what each piece computed (see
:func:`mmrl.core.losses.objective.policy_loss`'s Returns for the keys)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .clipping import clip_events
from .ratios import token_ratio
from .selection import TokenSelection
from .surrogates import Surrogate

__all__ = ["loss_metrics"]


@torch.no_grad()
def loss_metrics(
    sur: Surrogate,
    logps: Optional[Tensor],
    old_logps: Optional[Tensor],
    advantages: Tensor,
    mask: Tensor,
    pg: Tensor,
    loss: Tensor,
    *,
    kl: Optional[Tensor] = None,
    entropies: Optional[Tensor] = None,
    selection: Optional[TokenSelection] = None,
    off_rows: Optional[Tensor] = None,
    is_weight: Optional[Tensor] = None,
) -> dict[str, float]:
    """Python floats, each a masked mean over this call's tokens (so a caller averages them over
    micro-batches), except ``loss`` (the returned value). A key is present when its piece is: the
    ratio (``ratio_mean``), the surrogate's clip (``clip_frac_low``/``clip_frac_high``, on-policy
    rows only; ``clip_frac_dual``) and extra keys, off-policy rows (``off_policy_frac``), the KL,
    the entropies, each token selection (``entropy_keep_frac``, ``clip_cov_frac``,
    ``kl_cov_frac``) and the rollout IS weight (``rollout_is_ratio``)."""
    n = mask.sum().clamp(min=1)

    def token_mean(x: Tensor) -> float:
        return float((x.to(mask.dtype) * mask).sum() / n)

    def on_policy(x: Tensor) -> Tensor:  # clip events of on-policy rows only
        return x if off_rows is None else x & ~off_rows

    metrics: dict[str, float] = {}
    if logps is not None:
        metrics["ratio_mean"] = token_mean(token_ratio(logps, old_logps))
    if sur.clip_ratio is not None:
        low, high = clip_events(sur.clip_ratio, advantages, sur.low, sur.high, sur.clip_both_sides)
        metrics["clip_frac_low"] = token_mean(on_policy(low))
        metrics["clip_frac_high"] = token_mean(on_policy(high))
    for key, value in sur.metrics.items():
        metrics[key] = token_mean(value)
    if sur.dual is not None:
        metrics["clip_frac_dual"] = token_mean(on_policy(sur.dual))
    if off_rows is not None:
        metrics["off_policy_frac"] = token_mean(off_rows)
    metrics["pg_loss"] = token_mean(pg)
    metrics["loss"] = float(loss)
    if kl is not None:
        metrics["kl"] = token_mean(kl)
    if entropies is not None:
        metrics["entropy"] = token_mean(entropies)
    if selection is not None:
        for key, sel in (("entropy_keep_frac", selection.entropy_keep),
                         ("clip_cov_frac", selection.clip_cov),
                         ("kl_cov_frac", selection.kl_cov)):
            if sel is not None:
                metrics[key] = token_mean(sel)
    if is_weight is not None:
        metrics["rollout_is_ratio"] = token_mean(is_weight)
    return metrics
