"""The policy-gradient objective shared by every modality: a registered loss plus what all losses share.

A "token" here is any action with a log-probability: a generated token for a VLM, a denoising
transition for a diffusion/flow generator. Inputs are (B, T) per-action log-probs and a (B, T)
mask of real actions; a policy computes them per micro-batch and calls :class:`Objective`, so the
loss math exists once. The surrogate itself is looked up in the loss registry by
``cfg.loss_type`` (:mod:`.surrogates` for the core's, :mod:`mmrl.diffusion.losses` for AWM and
DiffusionNFT); this module adds off-policy shaping, token selections, KL-Cov, the KL penalty,
the entropy bonus and the aggregation.

References:

- KL estimators k1/k2/k3: John Schulman, "Approximating KL Divergence" (blog, 2020); k3 clamped
  as verl's ``low_var_kl``.
- Token-level mean: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale".
- Constant-normaliser aggregation (``seq_mean_token_sum_norm``): "Understanding R1-Zero-Like
  Training: A Critical Perspective" (Dr. GRPO, Liu et al., 2025).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from mmrl.registry import LOSSES

from .config import KL_ESTIMATORS, LOSS_AGG_MODES, ObjectiveConfig, check_choice
from .selection import TokenSelection, select_tokens
from .surrogates import off_policy_shaped_loss

__all__ = ["Objective", "policy_loss", "aggregate", "count_sequences", "kl_penalty", "rollout_is_weight"]

K3_LOG_RATIO_CLAMP = 20.0  # verl's low_var_kl bounds
K3_VALUE_CLAMP = 10.0


def kl_penalty(logps: Tensor, ref_logps: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL
    Divergence"). With ``log_ratio = ref_logps - logps``:

    - ``k1 = -log_ratio``: unbiased, high variance, can be negative.
    - ``k2 = 0.5 * log_ratio**2``: biased, low variance, always >= 0.
    - ``k3 = exp(log_ratio) - 1 - log_ratio``: unbiased and always >= 0 (the GRPO paper's choice).
      As verl's ``low_var_kl``, the log-ratio is clamped to [-20, 20] and k3 to at most 10, so
      a token the reference finds wildly unlikely cannot blow the loss up (exp(20) ~ 5e8); the
      clamped tokens pass no gradient.
    """
    check_choice(estimator, KL_ESTIMATORS, "kl_estimator")
    log_ratio = ref_logps - logps
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    log_ratio = log_ratio.clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return (torch.exp(log_ratio) - 1 - log_ratio).clamp(max=K3_VALUE_CLAMP)


def _at_least_one(n: Any, like: Tensor) -> Tensor:
    return torch.as_tensor(n, dtype=like.dtype, device=like.device).clamp(min=1)


def count_sequences(mask: Tensor) -> float:
    """The number of rows of a (B, T) action mask with at least one action: the ``num_seqs``
    normaliser of the sequence-mean aggregations."""
    return float((torch.as_tensor(mask).sum(-1) > 0).sum())


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
    masked = per_token * mask
    if num_seqs is None:
        num_seqs = count_sequences(mask)
    if mode == "token_mean":
        if num_tokens is None:
            num_tokens = mask.sum()
        return masked.sum() / _at_least_one(num_tokens, masked)
    seq_sums = masked.sum(dim=-1)
    if mode == "seq_mean_token_sum":
        return seq_sums.sum() / _at_least_one(num_seqs, masked)
    if mode == "seq_mean_token_mean":
        per_seq = seq_sums / mask.sum(dim=-1).clamp(min=1)
        return per_seq.sum() / _at_least_one(num_seqs, masked)
    if max_completion_length is None:
        raise ValueError(
            "loss_agg_mode 'seq_mean_token_sum_norm' needs max_completion_length "
            "(the constant per-sequence normaliser)"
        )
    return seq_sums.sum() / (_at_least_one(num_seqs, masked) * max_completion_length)


def policy_loss(
    logps: Tensor,
    old_logps: Optional[Tensor],
    advantages: Tensor,
    mask: Tensor,
    cfg: ObjectiveConfig,
    ref_logps: Optional[Tensor] = None,
    num_tokens: Any = None,
    num_seqs: Any = None,
    entropies: Optional[Tensor] = None,
    selection: Optional[TokenSelection] = None,
    generator: Optional[torch.Generator] = None,
    off_policy: Optional[Tensor] = None,
    kl: Optional[Tensor] = None,
    inputs: Optional[dict[str, Any]] = None,
    rollout_logps: Optional[Tensor] = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate loss (PPO / GRPO / DAPO) plus an optional KL penalty.

    Per token, with ``ratio = exp(logps - old_logps)``:

        pg = -min(ratio * A, clamp(ratio, 1 - epsilon, 1 + epsilon_high) * A)
        l  = pg + beta * KL_k(pi || pi_ref)          (KL only when beta > 0)

    then ``l`` is reduced with :func:`aggregate` in ``cfg.loss_agg_mode``.

    ``logps``/``old_logps``/``ref_logps``/``mask`` are (B, T); ``advantages`` is (B,) (one per
    sequence, broadcast over T) or (B, T). ``old_logps=None`` means a single optimisation
    iteration: old = ``logps.detach()``, so the ratio is exactly 1 but the gradient still flows
    through ``logps`` (as TRL does).

    Zoo options of ``cfg`` (all off by default; formulas in :mod:`mmrl.core.losses`):
    ``loss_type`` replaces ``pg`` (``gspo``: sequence ratio; ``reg_grpo``: advantage regression;
    ``cispo``: clipped IS weight), ``clip_pos``/``clip_neg``/``dual_clip_c`` change the clip, and
    the full per-token loss is

        l = w * pg + kl_cov_coef * |logp - old_logp| * [t in KL-Cov] + beta * KL - entropy_coef * H

    With KL-Cov (``kl_cov_ratio``) and ``loss_type=clip``, ``pg`` is the unclipped ``-A * ratio``
    on every token, the objective of "The Entropy Mechanism of Reinforcement Learning for
    Reasoning Language Models" (and verl's ``compute_policy_loss_kl_cov``): the penalty on the
    selected high-covariance tokens replaces the clip, and no clip fractions are reported.
    ``kl_cov_clip=True`` keeps the PPO clip as well.

    where ``w`` is 0 on tokens outside the top-entropy quantile or picked by Clip-Cov (1
    otherwise). Those tokens still count in the normaliser (``mask`` is unchanged), as in the
    papers' verl code. ``entropies`` (B, T) is the current policy's per-token entropy, required
    when ``cfg.needs_entropy``. ``selection`` is :func:`select_tokens` computed on the whole
    mini-batch and sliced to this call's rows; when ``cfg.needs_selection`` and it is ``None``,
    the selection is made from this call's tokens only (``generator`` seeds Clip-Cov), so
    gradient accumulation is then exact only for one micro-batch per mini-batch.

    ``off_policy`` (B,) bool marks rows the policy did not generate (off-policy guidance, as in
    "TempSamp-R1: Effective Temporal Sampling with Reinforcement Fine-Tuning for Video LLMs":
    ground-truth solutions injected into the groups). Their ``pg`` is, instead of the surrogate
    of ``loss_type``, the shaped loss of "Learning to Reason under Off-Policy Guidance" (LUFFY;
    :func:`~mmrl.core.losses.off_policy_shaped_loss`): behaviour probability 1,
    importance weight ``p = exp(logp)`` shaped by ``f(p) = p / (p + off_policy_gamma)``, no clip,

        pg_off = -f(p) * A

    Everything else (token-selection weights, KL-Cov, KL, entropy bonus, aggregation) applies to
    those rows as to the others. ``None`` or all ``False`` gives exactly the loss without it.

    ``inputs``: extra per-action tensors of a likelihood-free loss (declared by the loss's
    ``requires``; e.g. DiffusionNFT's positive/negative velocity errors). ``logps`` may then be
    None: the ratio metrics are left out.

    ``rollout_logps`` (B, T): the rollout engine's own log-probs of the sampled tokens (vLLM). With
    ``cfg.vllm_importance_sampling_correction`` the policy-gradient term is weighted by
    :func:`rollout_is_weight` (truncated importance sampling of "Your Efficient RL Framework
    Secretly Brings You Off-Policy RL Training"), correcting for the engine sampling from a slightly
    different distribution than the trainer's forward computes; ``rollout_is_ratio`` is logged.

    ``kl`` (B, T): a per-action KL to the reference that the policy computed in closed form (a
    diffusion policy's KL between the Gaussian step distributions of policy and reference, Flow-GRPO's
    ``||mu - mu_ref||^2 / (2 sigma^2)``); when given it replaces the estimator on ``ref_logps``.

    Returns ``(loss, metrics)``. Metrics are python floats. ``ratio_mean``, ``clip_frac_low``
    (A < 0 and ratio < 1 - epsilon), ``clip_frac_high`` (A > 0 and ratio > 1 + epsilon_high),
    ``kl`` (only when beta > 0) and ``pg_loss`` are masked means over this call's tokens, so a
    caller averages them over micro-batches. ``loss`` is the returned loss value, scaled by the
    given normalisers, so with gradient accumulation it *sums* over micro-batches. The zoo adds
    (only when its option is on, so the keys depend on ``cfg`` alone): ``seq_ratio_mean``
    (gspo; the clip fractions then refer to the sequence ratio), ``clip_frac_dual``,
    ``entropy`` (whenever ``entropies`` is given), ``entropy_keep_frac``, ``clip_cov_frac``,
    ``kl_cov_frac``; reg_grpo reports no clip fractions. With ``off_policy`` given, the clip
    fractions (``clip_frac_low``/``clip_frac_high``/``clip_frac_dual``) count on-policy tokens
    only (off-policy tokens are never clipped), still divided by all of this call's tokens, and
    ``off_policy_frac`` is the fraction of this call's tokens that lie in off-policy rows.
    """
    surrogate_fn = LOSSES.get(cfg.loss_type)
    like = logps if logps is not None else mask
    if logps is not None and old_logps is None:
        old_logps = logps.detach()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(like.dtype)
    mask = mask.to(like.dtype)
    off_rows: Optional[Tensor] = None  # (B, 1) bool
    if off_policy is not None:
        if off_policy.shape != like.shape[:1]:
            raise ValueError(f"off_policy must have shape (B,) = {tuple(like.shape[:1])}, "
                             f"got {tuple(off_policy.shape)}")
        off_rows = off_policy.to(device=like.device, dtype=torch.bool).unsqueeze(-1)
    if cfg.needs_entropy and entropies is None:
        raise ValueError(
            "entropy_coef / top_entropy_quantile need per-token entropies of the current policy "
            "(pass entropies=...; cfg.needs_entropy tells the policy to compute them)"
        )

    sur = surrogate_fn(logps, old_logps, advantages, mask, cfg, **(inputs or {}))
    pg = sur.pg
    if off_rows is not None and bool(off_rows.any()):
        # Off-policy rows: LUFFY's shaped importance weight replaces the surrogate (no clip).
        pg = torch.where(off_rows, off_policy_shaped_loss(logps, advantages, cfg.off_policy_gamma), pg)
    per_token = pg

    if selection is None and cfg.needs_selection:
        selection = select_tokens(cfg, logps, old_logps, advantages, mask, entropies, generator)
    weight = None if selection is None else selection.pg_weight(pg)
    if weight is not None:
        pg = pg * weight
        per_token = pg
    is_weight = None
    if rollout_logps is not None and cfg.vllm_importance_sampling_correction:
        is_weight = rollout_is_weight(old_logps, rollout_logps, mask, cfg)
        pg = pg * is_weight
        per_token = pg
    if selection is not None and selection.kl_cov is not None:
        kl_cov = selection.kl_cov.to(pg.dtype) * (logps - old_logps).abs()
        per_token = per_token + cfg.kl_cov_coef * kl_cov

    if cfg.beta <= 0:
        kl = None
    elif kl is None:  # else: the policy's closed-form KL
        if ref_logps is None:
            raise ValueError(
                f"beta={cfg.beta} > 0 needs ref_logps (reference-model log-probs); "
                "pass them or set beta=0"
            )
        kl = kl_penalty(logps, ref_logps, cfg.kl_estimator)
    if kl is not None:
        per_token = per_token + cfg.beta * kl
    if cfg.entropy_coef != 0:
        per_token = per_token - cfg.entropy_coef * entropies

    loss = aggregate(
        per_token,
        mask,
        cfg.loss_agg_mode,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        max_completion_length=cfg.max_completion_length,
    )
    metrics = _metrics(cfg, sur, logps, old_logps, advantages, mask, pg, loss, kl, entropies, selection, off_rows)
    if is_weight is not None:
        with torch.no_grad():
            metrics["rollout_is_ratio"] = float((is_weight.expand_as(mask) * mask).sum() / mask.sum().clamp(min=1))
    return loss, metrics


@torch.no_grad()
def rollout_is_weight(old_logps: Tensor, rollout_logps: Tensor, mask: Tensor, cfg: ObjectiveConfig) -> Tensor:
    """Importance weight of the rollout engine's samples, "Your Efficient RL Framework Secretly
    Brings You Off-Policy RL Training" (Yao et al., 2025), in TRL's four modes:
    ``rho = exp(old_logps - rollout_logps)`` per token (``token_*``) or per sequence
    (``sequence_*``: the sum over the sequence's tokens), then ``*_truncate`` clamps it to
    ``[clip_min, clip_max]`` and ``*_mask`` zeroes it outside that range. E.g. token_truncate with
    clip_max 2: log-ratios [0.1, 1.0] -> weights [e^0.1, 2.0] = [1.1052, 2.0]. A NaN engine log-prob
    (not reported) counts as no mismatch (weight 1)."""
    diff = torch.nan_to_num((old_logps - rollout_logps.to(old_logps.dtype)) * mask, nan=0.0)
    mode = cfg.vllm_importance_sampling_mode
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    rho = torch.exp(diff)
    lo = -float("inf") if cfg.vllm_importance_sampling_clip_min is None else cfg.vllm_importance_sampling_clip_min
    hi = float("inf") if cfg.vllm_importance_sampling_clip_max is None else cfg.vllm_importance_sampling_clip_max
    if mode.endswith("truncate"):
        return rho.clamp(min=lo, max=hi)
    return rho.masked_fill((rho < lo) | (rho > hi), 0.0)


@torch.no_grad()
def _metrics(cfg, sur, logps, old_logps, advantages, mask, pg, loss, kl, entropies, selection, off_rows) -> dict:
    """Masked token means of this call (see :func:`policy_loss`'s Returns)."""
    n = mask.sum().clamp(min=1)

    def token_mean(x: Tensor) -> float:
        return float((x.to(mask.dtype) * mask).sum() / n)

    def on_policy(x: Tensor) -> Tensor:  # clip events of on-policy rows only
        return x if off_rows is None else x & ~off_rows

    metrics: dict[str, float] = {}
    if logps is not None:
        metrics["ratio_mean"] = token_mean(torch.exp(logps - old_logps))
    if sur.clip_ratio is not None:
        low, high, r = sur.low, sur.high, sur.clip_ratio
        if sur.clip_both_sides:  # CISPO: the IS weight is clipped whatever the sign of A
            metrics["clip_frac_low"] = token_mean(on_policy(r < low))
            metrics["clip_frac_high"] = token_mean(on_policy(r > high))
        else:
            metrics["clip_frac_low"] = token_mean(on_policy((advantages < 0) & (r < low)))
            metrics["clip_frac_high"] = token_mean(on_policy((advantages > 0) & (r > high)))
    for key, value in sur.metrics.items():
        metrics[key] = token_mean(value)
    if sur.dual is not None:
        metrics["clip_frac_dual"] = token_mean(on_policy(sur.dual))
    if off_rows is not None:
        metrics["off_policy_frac"] = token_mean(off_rows.expand_as(mask))
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
    return metrics


@dataclass(frozen=True)
class Objective:
    """The core loss bound to its config. Policies call it like :func:`policy_loss` and read
    ``cfg.needs_entropy`` / ``cfg.needs_selection`` / ``requires`` to know what to compute."""

    cfg: ObjectiveConfig

    @property
    def requires(self) -> tuple[str, ...]:
        """What the configured loss needs the policy to compute (``register_loss(requires=)``)."""
        return LOSSES.get(self.cfg.loss_type).loss_requires

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Tensor, dict[str, float]]:
        return policy_loss(*args, cfg=self.cfg, **kwargs)
