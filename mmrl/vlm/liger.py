"""``train.use_liger_loss``: the LM head, the token log-probs and the clipped GRPO loss in one
fused, chunked pass (Liger's ``LigerFusedLinearGRPOLoss``, ``liger_kernel.chunked_loss``), on CUDA.

Why: the lean path (:mod:`mmrl.vlm.logprobs`) already never holds the (B, T, V) logits, but it
keeps each chunk's hidden states for the recomputation and builds the loss from (B, T) log-probs
with autograd. Liger computes each row's loss and its gradients in the forward pass, streaming
the vocabulary in 4,096-token slices, and keeps only the gradients ("Liger Kernel: Efficient Triton
Kernels for LLM Training", Hsu et al., 2024; TRL's former ``GRPOConfig.use_liger_loss``).

Only where Liger computes what the core objective computes (:func:`check_liger`, at setup): the
``clip`` loss (``-min(ratio A, clamp(ratio, 1 - epsilon, 1 + epsilon_high) A)``), no KL term
(Liger's k3 has no clamp; the core's follows verl's ``low_var_kl``), no entropy term or token
selection, no asymmetric or dual clip, no off-policy rows, sequence advantages. How the settings
map (:func:`fused_loss`):

- every ``algo.loss_agg_mode``: Liger's ``bnpo`` (``token_mean``), ``grpo``
  (``seq_mean_token_mean``) or ``dr_grpo`` (the two ``seq_mean_token_sum`` modes, with divisor 1 or
  ``max_completion_length``) normalise by the micro-batch's tokens or rows; the result is rescaled
  to the mini-batch's ``num_tokens`` / ``num_seqs`` (a constant factor, so the gradients scale with
  it), which keeps gradient accumulation exact as in the core's aggregation;
- the tokens the policy never samples (vision placeholders, masked out of the distribution on the
  lean path) get a bias of -1e30 in the head: their probability is exactly 0 in float32, as with
  -inf, without Liger's ``-inf * 0``;
- the rollout engine's importance weight (``algo.vllm_importance_sampling_correction``) is the
  core's :func:`~mmrl.core.losses.ratios.rollout_is_weight`, handed over as Liger's
  ``vllm_is_ratio`` (it multiplies the clipped term, as in the core).

Metrics: ``loss``, ``pg_loss`` (the same, with no penalty) and ``clip_frac`` (the tokens clipped on
either side, i.e. ``clip_frac_low + clip_frac_high`` of the lean path); the ratio is not returned by
Liger, so ``ratio_mean`` is not logged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..core.losses.ratios import rollout_is_weight

SUPPRESSED_BIAS = -1e30  # exp(-1e30 - lse) is 0 in float32, and -1e30 * 0 is 0 (not NaN, as -inf * 0)

# algo.loss_agg_mode -> Liger's loss_type (see the module docstring for the rescaling)
LIGER_LOSS_TYPES = {"token_mean": "bnpo", "seq_mean_token_mean": "grpo", "seq_mean_token_sum": "dr_grpo",
                    "seq_mean_token_sum_norm": "dr_grpo"}


def check_liger(cfg, device: torch.device) -> None:
    """Stop at setup, naming the key, where ``train.use_liger_loss`` cannot compute what the lean
    path does."""
    from mmrl.config import ConfigError

    algo = cfg.algo

    def refuse(why: str) -> None:
        raise ConfigError(f"train.use_liger_loss=true: {why}")

    if device.type != "cuda":
        refuse(f"Liger's fused loss is for CUDA and this run trains on {device}; set train.use_liger_loss=false")
    try:
        import liger_kernel.chunked_loss  # noqa: F401
    except ImportError:
        refuse("liger-kernel is not installed: pip install 'mmrl[fit]' (or liger-kernel), or set it false")
    if algo.loss_type != "clip":
        refuse(f"algo.loss_type={algo.loss_type!r}: only the clip loss is fused; use clip or set it false")
    for key, off in (("beta", 0.0), ("entropy_coef", 0.0), ("top_entropy_quantile", None),
                     ("clip_cov_ratio", None), ("kl_cov_ratio", None), ("clip_pos", None), ("clip_neg", None),
                     ("dual_clip_c", None), ("off_policy_guidance", 0)):
        if getattr(algo, key) not in (off, None):
            refuse(f"algo.{key}={getattr(algo, key)!r} is not in Liger's loss (it computes the clip loss alone); "
                   f"set algo.{key} to {off} or train.use_liger_loss=false")


def fused_loss(hidden: Tensor, lm_head: torch.nn.Module, targets: Tensor, mask: Tensor, advantages: Tensor,
               old_logps: Tensor | None, rollout_logps: Tensor | None, cfg, num_tokens: Any, num_seqs: Any,
               temperature: float, suppressed_ids, compiled: bool = True) -> tuple[Tensor, dict[str, float]]:
    """The core objective's ``(loss, metrics)`` on one micro-batch, computed by Liger from the
    hidden states (B, T, H) that predict ``targets`` (B, T) under ``lm_head``; ``cfg`` the
    :class:`~mmrl.core.losses.ObjectiveConfig` (checked by :func:`check_liger`)."""
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    if (cfg.likelihood or cfg.loss_type != "clip" or cfg.beta > 0 or cfg.needs_entropy or cfg.needs_selection
            or cfg.clip_pos or cfg.clip_neg or cfg.dual_clip_c):
        raise ValueError("train.use_liger_loss=true fuses the clip loss alone (no KL, entropy, token selection or "
                         "other clip; not mmrl sft's likelihood): set train.use_liger_loss=false for this objective")
    if advantages.dim() != 1:
        raise ValueError("train.use_liger_loss=true takes one advantage per sequence; this estimator gives one "
                         "per token: set train.use_liger_loss=false")
    if lm_head.bias is not None:
        raise ValueError("train.use_liger_loss=true: this model's LM head has a bias, which the fused loss "
                         "does not train; set train.use_liger_loss=false")
    mask = mask.to(torch.float32)
    B, T = mask.shape
    is_ratio = None
    if rollout_logps is not None and cfg.vllm_importance_sampling_correction:
        if old_logps is None:
            raise ValueError("train.use_liger_loss=true with algo.vllm_importance_sampling_correction needs the old "
                             "log-probs (the fused loss does not return the current ones): set "
                             "algo.vllm_importance_sampling_correction=false or train.use_liger_loss=false")
        is_ratio = rollout_is_weight(old_logps.float(), rollout_logps, mask, cfg)
    bias = torch.zeros(lm_head.weight.shape[0], dtype=torch.float32, device=hidden.device)
    if suppressed_ids:
        bias[torch.tensor(list(suppressed_ids), device=hidden.device)] = SUPPRESSED_BIAS
    mode = cfg.loss_agg_mode
    loss_fn = LigerFusedLinearGRPOLoss(
        beta=0.0, compiled=compiled, use_ref_model=False, chunk_size=1, epsilon_low=cfg.epsilon,
        epsilon_high=cfg.clip_high, loss_type=LIGER_LOSS_TYPES[mode],
        max_completion_length=cfg.max_completion_length if mode == "seq_mean_token_sum_norm" else 1,
        temperature=temperature if temperature > 0 else 1.0)
    loss, liger_metrics = loss_fn(hidden, lm_head.weight, targets, mask, advantages.float(), bias=bias,
                                  old_per_token_logps=None if old_logps is None else old_logps.float(),
                                  vllm_is_ratio=is_ratio)
    # Liger's normaliser is the micro-batch's (its tokens, or its B rows); the core's the mini-batch's.
    def at_least_one(n) -> float:
        return max(float(n), 1.0)

    if mode == "token_mean":
        scale = at_least_one(mask.sum()) / at_least_one(num_tokens if num_tokens is not None else mask.sum())
    else:
        rows = float((mask.sum(-1) > 0).sum())
        scale = B / at_least_one(num_seqs if num_seqs is not None else rows)
    loss = loss * scale
    value = float(loss.detach())
    return loss, {"loss": value, "pg_loss": value, "clip_frac": float(liger_metrics[-1])}
