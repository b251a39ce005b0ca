"""The policy-gradient objective shared by every modality, composed from the loss's pieces.

A "token" here is any action with a log-probability: a generated token for a VLM, a denoising
transition for a diffusion/flow generator. Inputs are (B, T) per-action log-probs and a (B, T)
mask of real actions; a policy computes them per micro-batch and calls :class:`Objective`, so the
loss math exists once. Per token, the loss is

    l = w * rho * pg  +  kl_cov_coef * |logp - old_logp| * [t in KL-Cov]  +  beta * KL  -  entropy_coef * H

then reduced to a scalar in ``cfg.loss_agg_mode``. Each piece lives in its own module and is
tested alone:

- ``pg``: the registered surrogate of ``cfg.loss_type`` (:mod:`.surrogates` for the core's,
  :mod:`mmrl.diffusion.losses` for AWM and DiffusionNFT, or a plugin's ``register_loss``), built on
  a ratio (:mod:`.ratios`) and a clip mode (:mod:`.clipping`); on off-policy rows LUFFY's shaped
  loss (:func:`~.surrogates.shape_off_policy_rows`);
- ``w``: the token selections, 0 outside the top-entropy tokens or on Clip-Cov's (:mod:`.selection`);
- ``rho``: the rollout engine's importance-sampling weight (:func:`~.ratios.rollout_is_weight`);
- the penalties: KL-Cov, the KL to the reference, the entropy bonus (:mod:`.penalties`);
- the aggregation (:mod:`.aggregation`) and the metrics (:mod:`.metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from mmrl.registry import LOSSES

from .aggregation import aggregate
from .config import ObjectiveConfig
from .metrics import loss_metrics
from .penalties import GaussianActions, entropy_bonus, kl_cov_penalty, reference_kl
from .ratios import rollout_is_weight
from .selection import TokenSelection, select_tokens
from .surrogates import off_policy_rows, shape_off_policy_rows

__all__ = ["Objective", "policy_loss"]


def policy_loss(
    logps: Optional[Tensor],
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
    gaussians: Optional[GaussianActions] = None,
) -> tuple[Tensor, dict[str, float]]:
    """The loss of the module docstring on one (micro-)batch; ``(loss, metrics)``.

    ``logps``/``old_logps``/``ref_logps``/``mask`` are (B, T); ``advantages`` is (B,) (one per
    sequence, broadcast over T) or (B, T). ``old_logps=None`` means a single optimisation
    iteration: old = ``logps.detach()``, so the ratio is exactly 1 but the gradient still flows
    through ``logps`` (as TRL does). With the defaults of ``cfg`` this is the clipped surrogate
    of PPO / GRPO / DAPO, ``-min(ratio A, clamp(ratio, 1 - epsilon, 1 + epsilon_high) A)``.

    What each optional argument feeds:

    - ``inputs``: extra per-action tensors of a likelihood-free loss (declared by the loss's
      ``requires``; e.g. DiffusionNFT's positive/negative velocity errors), passed to the
      surrogate by keyword. ``logps`` may then be None: the ratio metrics are left out.
    - ``off_policy`` (B,) bool: rows the policy did not generate (TempSamp-R1's injected
      solutions); their ``pg`` is :func:`~.surrogates.off_policy_shaped_loss` (no clip).
      Everything else applies to them as to the others; ``None`` or all ``False`` changes nothing.
    - ``selection``: :func:`select_tokens` of the whole mini-batch, sliced to this call's rows.
      When ``cfg.needs_selection`` and it is ``None``, the selection is made from this call's
      tokens (``generator`` seeds Clip-Cov), so gradient accumulation is then exact only for one
      micro-batch per mini-batch. Tokens it drops still count in the normaliser, as in the
      papers' verl code.
    - ``entropies`` (B, T): the current policy's per-token entropy, required when
      ``cfg.needs_entropy``.
    - ``rollout_logps`` (B, T): the rollout engine's own log-probs (vLLM); with
      ``cfg.vllm_importance_sampling_correction`` they give ``rho``.
    - the KL (only when ``beta > 0``; :func:`~.penalties.reference_kl`): ``kl`` (B, T) computed
      by the caller, else ``gaussians`` (the closed form of Gaussian actions, a generator's SDE
      steps), else the estimator ``cfg.kl_estimator`` on ``ref_logps``.
    - ``num_tokens``/``num_seqs``: the mini-batch's normalisers (:func:`~.aggregation.aggregate`),
      so that with gradient accumulation the micro-batch losses *sum* to the mini-batch loss.

    With ``cfg.likelihood`` (``mmrl sft``: the actions are reference completions) the per-token
    loss is ``-logps`` alone, aggregated the same way, and ``loss`` is its only metric.

    Metrics (python floats; :func:`~.metrics.loss_metrics`) are masked means over this call's
    tokens, so a caller averages them over micro-batches; ``loss`` is the returned value. The
    keys depend on ``cfg`` alone: ``ratio_mean``, ``clip_frac_low`` (A < 0 and ratio < low),
    ``clip_frac_high`` (A > 0 and ratio > high), ``pg_loss``, ``loss``; ``kl`` when beta > 0,
    ``entropy`` whenever ``entropies`` is given, and the zoo's keys when its option is on
    (``seq_ratio_mean`` for gspo, whose clip fractions refer to the sequence ratio;
    ``clip_frac_dual``; ``entropy_keep_frac``, ``clip_cov_frac``, ``kl_cov_frac``;
    ``off_policy_frac``, with the clip fractions then counting on-policy tokens only;
    ``rollout_is_ratio``). reg_grpo and KL-Cov's unclipped ``clip`` report no clip fractions.
    """
    if cfg.likelihood:  # reference completions (mmrl sft): l = -logp, the rest of the formula is off
        loss = aggregate(-logps, mask, cfg.loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                         max_completion_length=cfg.max_completion_length)
        return loss, {"loss": float(loss.detach())}
    like = logps if logps is not None else mask
    if logps is not None and old_logps is None:
        old_logps = logps.detach()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(like.dtype)
    mask = mask.to(like.dtype)
    off_rows = off_policy_rows(off_policy, like)
    if cfg.needs_entropy and entropies is None:
        raise ValueError(
            "entropy_coef / top_entropy_quantile need per-token entropies of the current policy "
            "(pass entropies=...; cfg.needs_entropy tells the policy to compute them)"
        )

    # pg: the registered surrogate (its ratio and clip mode); LUFFY's shaped loss on off-policy rows
    sur = LOSSES.get(cfg.loss_type)(logps, old_logps, advantages, mask, cfg, **(inputs or {}))
    pg = shape_off_policy_rows(sur.pg, logps, advantages, off_rows, cfg.off_policy_gamma)

    # w * rho: the token selections' weight and the rollout engine's importance-sampling weight
    if selection is None and cfg.needs_selection:
        selection = select_tokens(cfg, logps, old_logps, advantages, mask, entropies, generator)
    weight = None if selection is None else selection.pg_weight(pg)
    if weight is not None:
        pg = pg * weight
    is_weight = None
    if rollout_logps is not None and cfg.vllm_importance_sampling_correction:
        is_weight = rollout_is_weight(old_logps, rollout_logps, mask, cfg)
        pg = pg * is_weight

    # the penalties
    per_token = pg
    if selection is not None and selection.kl_cov is not None:
        per_token = per_token + kl_cov_penalty(logps, old_logps, selection.kl_cov, cfg.kl_cov_coef)
    kl = reference_kl(cfg, logps, ref_logps, kl, gaussians)
    if kl is not None:
        per_token = per_token + cfg.beta * kl
    if cfg.entropy_coef != 0:
        per_token = per_token + entropy_bonus(entropies, cfg.entropy_coef)

    loss = aggregate(per_token, mask, cfg.loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                     max_completion_length=cfg.max_completion_length)
    metrics = loss_metrics(sur, logps, old_logps, advantages, mask, pg, loss, kl=kl, entropies=entropies,
                           selection=selection, off_rows=off_rows, is_weight=is_weight)
    return loss, metrics


@dataclass(frozen=True)
class Objective:
    """The core loss bound to its config. Policies call it like :func:`policy_loss` and read
    ``cfg.needs_entropy`` / ``cfg.needs_selection`` / ``cfg.needs_reference`` / ``requires`` to
    know what to compute."""

    cfg: ObjectiveConfig

    @property
    def requires(self) -> tuple[str, ...]:
        """What the configured loss needs the policy to compute (``register_loss(requires=)``)."""
        return self.cfg.requires

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Tensor, dict[str, float]]:
        return policy_loss(*args, cfg=self.cfg, **kwargs)
