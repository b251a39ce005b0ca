"""Policy-ratio fixes and likelihood-free objectives for RL on flow-matching models.

Conventions as in :mod:`mmrl.diffusion.sde`: ``x_sigma = (1 - sigma) x0 + sigma noise``, the model
predicts the velocity ``v = noise - x0``. All math in float32; latents of any shape (B, ...);
per-sample results are (B,) tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmrl.core.losses.surrogates import Surrogate, clip_loss
from mmrl.diffusion.sde import per_sample
from mmrl.registry import register_loss


def _mean_latent(x: Tensor) -> Tensor:
    """Mean over all non-batch dims -> (B,)."""
    return x.mean(tuple(range(1, x.ndim))) if x.ndim > 1 else x


def guard_log_ratio(log_prob: Tensor, old_log_prob: Tensor, mean: Tensor, old_mean: Tensor, step_std) -> Tensor:
    """RatioNorm of "GRPO-Guard: Mitigating Implicit Over-Optimization in Flow Matching via Regulated
    Clipping" (2025): the step log-ratio, re-centred and put on a common scale across denoising steps.

    Derivation, for a step Gaussian with std ``s`` and the action drawn from the old policy,
    ``x' = old_mean + s eps``, ``Delta = mean - old_mean``:
      ``log r = [(x' - old_mean)^2 - (x' - mean)^2] / (2 s^2) = eps Delta / s - Delta^2 / (2 s^2)``;
      so ``E[log r] = -||Delta||^2 / (2 s^2)`` (always < 0: the clip window is hit asymmetrically) and
      ``std[log r] ~ ||Delta|| / s`` (blows up at the low-noise steps);
      corrected: ``(log r + mse / (2 s^2)) * s = log r * s + mse / (2 s)``, mean 0, std ~ ||Delta||.
    ``mse`` = mean over non-batch dims of ``(mean - old_mean)^2`` (||.||^2 as a mean, matching the
    "mean" log-prob reduction). Gradients flow through both terms. Where ``s == 0`` returns 0.
    """
    log_ratio = (log_prob.float() - old_log_prob.float()).reshape(-1)
    s = per_sample(step_std, log_ratio).reshape(-1).expand_as(log_ratio)
    mse = _mean_latent((mean.float() - old_mean.float()) ** 2)
    stochastic = s > 0
    safe = torch.where(stochastic, s, torch.ones_like(s))
    out = log_ratio * safe + mse / (2 * safe)
    return torch.where(stochastic, out, torch.zeros_like(out))


def flow_matching_target(x0: Tensor, noise: Tensor) -> Tensor:
    """Rectified-flow velocity target, "Flow Matching for Generative Modeling" (Lipman et al., 2023) /
    "Flow Straight and Fast" (Liu et al., 2022): ``v* = noise - x0``."""
    return noise.float() - x0.float()


def noised(x0: Tensor, noise: Tensor, sigma) -> Tensor:
    """Forward (noising) process of rectified flow, "Flow Straight and Fast" (Liu et al., 2022):
    ``x_sigma = (1 - sigma) x0 + sigma noise``; sigma a float, 0-d or (B,) tensor."""
    x0 = x0.float()
    s = per_sample(sigma, x0)
    return (1 - s) * x0 + s * noise.float()


def awm_log_likelihood(velocity_pred: Tensor, x0: Tensor, noise: Tensor) -> Tensor:
    """Flow-matching log-likelihood proxy of "Advantage Weighted Matching: Aligning RL with Pretraining
    in Diffusion Models" (2025): ``log p(x0) ~ -mean((v_pred - (noise - x0))^2)`` over non-batch dims,
    (B,). The policy uses ``exp(new - old)`` of it as the PPO ratio."""
    return -_mean_latent((velocity_pred.float() - flow_matching_target(x0, noise)) ** 2)


def nft_optimality(advantages: Tensor, adv_clip_max: float = 5.0) -> Tensor:
    """Optimality probability of "DiffusionNFT: Online Diffusion Reinforcement with Forward Process"
    (Zheng et al., 2025): ``r = clip(A / adv_clip_max / 2 + 0.5, 0, 1)`` -- A = 0 -> 1/2, A >= +max -> 1
    (pure positive), A <= -max -> 0 (pure negative)."""
    a = torch.as_tensor(advantages, dtype=torch.float32)
    return (a / adv_clip_max / 2 + 0.5).clamp(0.0, 1.0)


def nft_errors(velocity_pred: Tensor, old_velocity: Tensor, x0: Tensor, noise: Tensor,
               beta: float = 1.0) -> tuple[Tensor, Tensor]:
    """Per-sample (B,) squared errors of DiffusionNFT's implicit positive and negative policies
    ("DiffusionNFT: Online Diffusion Reinforcement with Forward Process", Zheng et al., 2025), in
    velocity space: ``target = noise - x0``, ``v+ = beta v + (1 - beta) v_old``,
    ``v- = (1 + beta) v_old - beta v``; returns ``(mean((v+ - target)^2), mean((v- - target)^2))``.
    ``old_velocity`` (the sampling policy's prediction at the same x_sigma) is detached."""
    v = velocity_pred.float()
    v_old = old_velocity.float().detach()
    target = flow_matching_target(x0, noise)
    v_plus = beta * v + (1 - beta) * v_old
    v_minus = (1 + beta) * v_old - beta * v
    return _mean_latent((v_plus - target) ** 2), _mean_latent((v_minus - target) ** 2)


# -- the generator losses, registered like the core's and computed through the same objective ----------


@register_loss("awm", requires=("flow_matching_logps",))
def awm(logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, cfg) -> Surrogate:
    """"Advantage Weighted Matching: Aligning RL with Pretraining in Diffusion Models": the clipped
    surrogate over the flow-matching log-likelihood :func:`awm_log_likelihood` of the final sample
    (the policy's ``flow_matching_logps``, passed as ``logps``)."""
    return clip_loss(logps, old_logps, advantages, mask, cfg)


@register_loss("nft", requires=("nft_errors",))
def nft(logps, old_logps, advantages: Tensor, mask: Tensor, cfg, *, positive: Tensor, negative: Tensor,
        adv_max: float) -> Surrogate:
    """"DiffusionNFT: Online Diffusion Reinforcement with Forward Process" (Zheng et al., 2025),
    likelihood-free, in velocity space: ``r(A) * positive + (1 - r(A)) * negative`` per action, with
    the positive / negative velocity errors of :func:`nft_errors` (B, T) (the policy's
    ``nft_errors``; ``logps`` is None) and ``r = clip(A / adv_max / 2 + 0.5, 0, 1)``
    (:func:`nft_optimality`).

    The official code writes the same losses on x0-predictions ``x0_hat = x_sigma - sigma v``; since
    ``x0_hat - x0 = -sigma (v - target)`` that is this loss times ``sigma^2`` per sample, further divided
    by a detached per-sample ``mean|x0_hat - x0|`` (adaptive weighting) and scaled by
    ``adv_clip_max / beta``. Those are per-sample loss weights a caller can apply; the unweighted velocity
    form is kept here so that with ``r = 1, beta = 1`` it is exactly the flow-matching loss."""
    r = nft_optimality(advantages, adv_max).to(positive.device).reshape(advantages.shape)
    return Surrogate(r * positive + (1 - r) * negative)
