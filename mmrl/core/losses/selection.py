"""Batch-dependent token selections: Beyond 80/20's top-entropy tokens, Clip-Cov and KL-Cov.

Computed once per mini-batch (:func:`select_tokens`) and sliced per micro-batch, so gradient
accumulation stays exact. Papers: "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
Effective Reinforcement Learning for LLM Reasoning" (Wang et al., 2025); "The Entropy Mechanism
of Reinforcement Learning for Reasoning Language Models" (Cui et al., 2025), the token choices
as in the authors' verl code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from .clipping import clip_bounds

__all__ = ["token_covariance", "top_entropy_mask", "clip_cov_mask", "kl_cov_mask", "TokenSelection", "select_tokens"]


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def token_covariance(logps: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Centred per-token covariance term of "The Entropy Mechanism of Reinforcement Learning for
    Reasoning Language Models": ``cov_t = (logp_t - mean(logp)) * (A_t - mean(A))``, means over
    the masked tokens of the batch (a sequence advantage counts once per token). (B, T), no grad.
    """
    logps, advantages = logps.detach(), advantages.detach().expand_as(logps)
    return (logps - _masked_mean(logps, mask)) * (advantages - _masked_mean(advantages, mask))


def top_entropy_mask(entropies: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """Tokens in the top ``quantile`` fraction of entropy among the masked tokens ("Beyond the
    80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement Learning for LLM
    Reasoning"): ``H_t >= tau``, ``tau`` = the ``1 - quantile`` quantile of ``H[mask]`` with
    linear interpolation (``torch.quantile``'s default; ties at tau are kept). Padding never counts toward tau nor is selected.
    Returns a bool (B, T) mask.
    """
    valid = mask > 0
    if not bool(valid.any()):
        return valid
    h = entropies.detach().to(torch.promote_types(entropies.dtype, torch.float32))
    # torch.quantile's "linear" rule, by sorting (torch.quantile refuses inputs > 2**24 elements)
    v = h[valid].sort().values
    pos = (1 - quantile) * (v.numel() - 1)
    lo = int(pos)
    hi = min(lo + 1, v.numel() - 1)
    tau = v[lo] + (pos - lo) * (v[hi] - v[lo])
    return (h >= tau) & valid


def clip_cov_mask(
    cov: Tensor,
    mask: Tensor,
    clipped: Tensor,
    ratio: float,
    lb: float,
    ub: float,
    generator: Optional[torch.Generator] = None,
) -> Tensor:
    """Clip-Cov token choice (authors' verl code): among masked tokens not already clipped by
    PPO with ``lb < cov < ub``, pick ``min(max(int(ratio * n_tokens), 1), n_candidates)``
    uniformly at random (``torch.randperm`` with ``generator``). Returns a bool (B, T) mask of the
    tokens whose policy-gradient term is dropped."""
    valid = mask > 0
    cand = valid & ~clipped & (cov > lb) & (cov < ub)
    out = torch.zeros_like(valid)
    idx = cand.flatten().nonzero().squeeze(-1)
    if idx.numel() == 0:
        return out
    k = min(max(int(ratio * int(valid.sum())), 1), idx.numel())
    device = generator.device if generator is not None else "cpu"
    perm = torch.randperm(idx.numel(), generator=generator, device=device)
    out.view(-1)[idx[perm[:k].to(idx.device)]] = True
    return out


def kl_cov_mask(cov: Tensor, mask: Tensor, ratio: float) -> Tensor:
    """KL-Cov token choice (authors' verl code): the ``max(int(ratio * n_tokens), 1)`` masked tokens
    with the largest covariance (``torch.topk``). Returns a bool (B, T) mask."""
    valid = mask > 0
    out = torch.zeros_like(valid)
    n = int(valid.sum())
    if n == 0:
        return out
    idx = valid.flatten().nonzero().squeeze(-1)
    k = max(int(ratio * n), 1)
    top = torch.topk(cov.flatten()[idx], k, largest=True).indices
    out.view(-1)[idx[top]] = True
    return out


@dataclass
class TokenSelection:
    """Batch-dependent token choices, computed once on a whole mini-batch by :func:`select_tokens`
    and sliced per micro-batch (``sel[rows]``) so gradient accumulation stays exact.

    Each field is a bool (B, T) mask or ``None`` (not used):

    - ``entropy_keep``: top-entropy tokens; the others get no policy-gradient term.
    - ``clip_cov``: Clip-Cov tokens; their policy-gradient term is dropped.
    - ``kl_cov``: KL-Cov tokens; they get the extra ``kl_cov_coef * |logp - old_logp|``.
    """

    entropy_keep: Optional[Tensor] = None
    clip_cov: Optional[Tensor] = None
    kl_cov: Optional[Tensor] = None

    def pg_weight(self, like: Tensor) -> Optional[Tensor]:
        """(B, T) 0/1 multiplier of the policy-gradient term, or ``None`` for all ones."""
        w = None
        if self.entropy_keep is not None:
            w = self.entropy_keep.to(like.dtype)
        if self.clip_cov is not None:
            keep = (~self.clip_cov).to(like.dtype)
            w = keep if w is None else w * keep
        return w

    def _map(self, fn: Any) -> "TokenSelection":
        return TokenSelection(*(None if x is None else fn(x)
                                for x in (self.entropy_keep, self.clip_cov, self.kl_cov)))

    def __getitem__(self, rows: Any) -> "TokenSelection":
        return self._map(lambda x: x[rows])

    def to(self, device: Any) -> "TokenSelection":
        return self._map(lambda x: x.to(device))


@torch.no_grad()
def select_tokens(
    cfg: Any,
    logps: Tensor,
    old_logps: Optional[Tensor],
    advantages: Tensor,
    mask: Tensor,
    entropies: Optional[Tensor] = None,
    generator: Optional[torch.Generator] = None,
) -> TokenSelection:
    """The batch-dependent token selections that ``cfg`` asks for (top-entropy, Clip-Cov,
    KL-Cov), from (B, T) values of the whole mini-batch. Call it before micro-batching and pass
    ``selection=sel[rows]`` to each :func:`~mmrl.core.losses.policy_loss` call: the quantile
    threshold and the covariance means then come from the mini-batch, and the micro-batch losses
    sum to the mini-batch loss exactly. (Without it, ``policy_loss`` selects within each call,
    as verl does per micro-batch.)

    ``logps`` are the current policy's log-probs (values only); ``old_logps=None`` means
    on-policy (ratio 1: nothing is PPO-clipped). ``entropies`` are needed for
    ``top_entropy_quantile``. ``generator`` seeds Clip-Cov's random pick.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    logps = logps.detach()
    advantages = advantages.to(logps.dtype)
    mask = mask.to(logps.dtype)
    sel = TokenSelection()
    if cfg.top_entropy_quantile is not None:
        if entropies is None:
            raise ValueError("top_entropy_quantile needs per-token entropies (cfg.needs_entropy)")
        sel.entropy_keep = top_entropy_mask(entropies, mask, cfg.top_entropy_quantile)
    if cfg.clip_cov_ratio is not None or cfg.kl_cov_ratio is not None:
        cov = token_covariance(logps, advantages, mask)
        if cfg.clip_cov_ratio is not None:
            if old_logps is None:
                clipped = torch.zeros_like(mask, dtype=torch.bool)
            else:
                r = torch.exp(logps - old_logps.detach())
                low, high = clip_bounds(advantages, cfg.epsilon, cfg.clip_high, cfg.clip_pos, cfg.clip_neg)
                pg1, pg2 = -advantages * r, -advantages * torch.clamp(r, low, high)
                clipped = pg2 > pg1
            sel.clip_cov = clip_cov_mask(cov, mask, clipped, cfg.clip_cov_ratio, cfg.clip_cov_lb,
                                         cfg.clip_cov_ub, generator)
        if cfg.kl_cov_ratio is not None:
            sel.kl_cov = kl_cov_mask(cov, mask, cfg.kl_cov_ratio)
    return sel
