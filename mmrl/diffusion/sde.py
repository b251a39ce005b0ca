"""Stochastic denoising steps that report the log-density of the step they took.

GRPO-style RL on a diffusion/flow model treats every denoising step as a Gaussian policy
``pi(x_next | x) = N(mean(x; theta), std^2 I)``: sampling draws ``x_next`` from it and training
recomputes ``log pi(x_next | x)`` under the current parameters (pass ``prev_sample=``).

Conventions (diffusers' ``FlowMatchEulerDiscreteScheduler``): ``x_sigma = (1 - sigma) x0 + sigma
noise``, the model predicts ``v = noise - x0``, sigma runs from ~1 to 0, ``dt = sigma_next - sigma
< 0`` and a deterministic Euler step is ``x_next = x + dt v``. Everything is computed in float32;
latents may have any shape (B, ...); per-sample scalars (sigma, std, ...) may be Python floats,
0-d tensors or (B,) tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from mmrl.registry import SDE_SAMPLERS, register_sde_sampler

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass
class StepOutput:
    prev_sample: Tensor  # the next latent x_{t-1} (the action taken)
    log_prob: Tensor  # (B,) log-density of prev_sample under the step's Gaussian
    mean: Tensor  # the Gaussian mean, shape of sample
    std: Tensor  # (B,) std of prev_sample given sample; 0 for a deterministic step


def per_sample(x, like: Tensor) -> Tensor:
    """A float32 tensor on ``like``'s device that broadcasts against ``like`` (B, ...): a Python
    float or 0-d tensor stays 0-d, a (B,) tensor becomes (B, 1, ..., 1)."""
    x = torch.as_tensor(x, dtype=torch.float32, device=like.device)
    if x.ndim == 1 and like.ndim > 1:
        x = x.reshape(-1, *([1] * (like.ndim - 1)))
    return x


def _flat(x: Tensor, batch: int) -> Tensor:
    """A per-sample scalar (0-d or (B, 1, ...)) as a (B,) tensor."""
    return x.reshape(-1).expand(batch) if x.numel() == 1 else x.reshape(batch)


def gaussian_log_prob(x: Tensor, mean: Tensor, std, reduction: str = "mean") -> Tensor:
    """Log-density of ``x`` under N(mean, std^2 I), reduced to (B,) -- the per-step policy log-prob
    of "Training Diffusion Models with Reinforcement Learning" (DDPO) and "Flow-GRPO".

    Elementwise ``log N(x; m, s^2) = -(x - m)^2 / (2 s^2) - log s - 0.5 log(2 pi)``, then reduced over
    all non-batch dims: ``"mean"`` (Flow-GRPO's convention: per-step log-ratios stay O(1) whatever the
    latent size) or ``"sum"`` (the true log-density). Where ``std == 0`` (a deterministic step) the
    density is a point mass and the step carries no log-prob: those samples get 0.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    x, mean = x.float(), mean.float()
    s = per_sample(std, x)
    stochastic = s > 0
    safe = torch.where(stochastic, s, torch.ones_like(s))  # no 0/0, no NaN gradients
    lp = -((x - mean) ** 2) / (2 * safe**2) - torch.log(safe) - _LOG_SQRT_2PI
    if lp.ndim > 1:
        dims = tuple(range(1, lp.ndim))
        lp = lp.mean(dims) if reduction == "mean" else lp.sum(dims)
    return torch.where(_flat(stochastic, x.shape[0]), lp, torch.zeros_like(lp))


def _finish(mean, std, noise, prev_sample, generator, reduction) -> StepOutput:
    """prev = mean + std * noise (noise given or drawn) unless ``prev_sample`` is given; its log-prob is
    taken with ``prev_sample`` detached: the action is fixed, gradients flow through ``mean`` only."""
    if prev_sample is None:
        if noise is None:
            noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=torch.float32)
        prev_sample = mean + std * noise.float()
    else:
        prev_sample = prev_sample.float()
    log_prob = gaussian_log_prob(prev_sample.detach(), mean, std, reduction)
    return StepOutput(prev_sample, log_prob, mean, _flat(std, mean.shape[0]).clone())


@register_sde_sampler("flow_sde")
def flow_sde_step(velocity, sample, sigma, sigma_next, noise_level=0.7, sigma_max=None, *,
                  noise=None, prev_sample=None, generator=None, reduction="mean") -> StepOutput:
    """ODE-to-SDE step of "Flow-GRPO: Training Flow Matching Models via Online RL" (Liu et al., 2025).

    ``std_t = a sqrt(sigma / (1 - sigma))`` (at sigma == 1 the denominator uses ``sigma_max``, the
    schedule's second sigma, as flow_grpo does), ``dt = sigma_next - sigma``,
    ``mean = x (1 + std_t^2 dt / (2 sigma)) + v (1 + std_t^2 (1 - sigma) / (2 sigma)) dt``,
    ``prev = mean + std_t sqrt(-dt) noise``. With ``a = 0`` this is exactly the Euler step.
    """
    v, x = velocity.float(), sample.float()
    sig, sig_next = per_sample(sigma, x), per_sample(sigma_next, x)
    dt = sig_next - sig
    denom = sig
    if bool((sig == 1).any()):
        if sigma_max is None:
            raise ValueError("flow_sde_step at sigma == 1 needs sigma_max (the schedule's second sigma); pass sigma_max=")
        denom = torch.where(sig == 1, per_sample(sigma_max, x), sig)
    std_t = per_sample(noise_level, x) * torch.sqrt(sig / (1 - denom))
    mean = x * (1 + std_t**2 / (2 * sig) * dt) + v * (1 + std_t**2 * (1 - sig) / (2 * sig)) * dt
    return _finish(mean, std_t * torch.sqrt(-dt), noise, prev_sample, generator, reduction)


@register_sde_sampler("cps")
def cps_step(velocity, sample, sigma, sigma_next, noise_level=0.8, *,
             noise=None, prev_sample=None, generator=None, reduction="mean") -> StepOutput:
    """Coefficients-preserving sampling, "Coefficients-Preserving Sampling for Reinforcement Learning
    with Flow Matching" (Wang & Yu, 2025).

    ``std = sigma_next sin(a pi / 2)``, ``x0_hat = x - sigma v``, ``x1_hat = x + (1 - sigma) v``,
    ``mean = (1 - sigma_next) x0_hat + sqrt(sigma_next^2 - std^2) x1_hat``, ``prev = mean + std noise``:
    the noise coefficient of prev stays exactly sigma_next. At sigma_next = 0 std = 0 (deterministic
    last step, log_prob 0); with a = 0 it is the Euler step.

    Log-probability: the authors' definition (their ``sde_step_with_logprob``, "remove all
    constants"), ``log_prob = -mean((prev - mean)^2)`` over the latent dims (``-sum`` with
    ``reduction="sum"``), :func:`cps_log_prob`. It drops the Gaussian's ``1 / (2 std^2)`` as well,
    so a step's log-ratio is ``2 std^2`` times the Gaussian log-ratio (of :func:`gaussian_log_prob`):
    e.g. 1.45 at sigma_next = 0.9 and 0.018 at sigma_next = 0.1 for a = 0.8. The clip range therefore
    acts like Flow-GRPO's at the high-noise steps and hardly at all at the low-noise ones, where the
    Gaussian ratio would swing hardest; the authors train with Flow-GRPO's clip range on it.
    """
    v, x = velocity.float(), sample.float()
    sig, sig_next = per_sample(sigma, x), per_sample(sigma_next, x)
    std = sig_next * torch.sin(per_sample(noise_level, x) * (math.pi / 2))
    x0_hat = x - sig * v
    x1_hat = x + (1 - sig) * v
    mean = x0_hat * (1 - sig_next) + x1_hat * torch.sqrt((sig_next**2 - std**2).clamp_min(0))
    out = _finish(mean, std, noise, prev_sample, generator, reduction)
    out.log_prob = cps_log_prob(out.prev_sample.detach(), mean, std, reduction)
    return out


def cps_log_prob(x: Tensor, mean: Tensor, std, reduction: str = "mean") -> Tensor:
    """The CPS authors' step log-probability, (B,): ``-mean((x - mean)^2)`` over the non-batch dims
    (``-sum`` for ``reduction="sum"``), 0 where ``std == 0`` (a deterministic step)."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    sq = -((x.float() - mean.float()) ** 2)
    if sq.ndim > 1:
        dims = tuple(range(1, sq.ndim))
        sq = sq.mean(dims) if reduction == "mean" else sq.sum(dims)
    stochastic = _flat(per_sample(std, x) > 0, x.shape[0])
    return torch.where(stochastic, sq, torch.zeros_like(sq))


@register_sde_sampler("dance")
def dance_flow_step(velocity, sample, sigma, sigma_next, eta=0.3, *,
                    noise=None, prev_sample=None, generator=None, reduction="mean") -> StepOutput:
    """SDE step of "DanceGRPO: Unleashing GRPO on Visual Generation" (Xue et al., 2025), its ``flux_step``.

    ``dsigma = sigma_next - sigma``, ``x0_hat = x - sigma v``,
    ``score = -(x - (1 - sigma) x0_hat) / sigma^2``,
    ``mean = x + dsigma v - 0.5 eta^2 score dsigma``, ``std = eta sqrt(sigma - sigma_next)``,
    ``prev = mean + std noise``. The log-prob is the full Gaussian log-density averaged over the
    latent dims, as DanceGRPO's ``flux_step`` computes it (with its ``-log std`` and
    ``-log sqrt(2 pi)`` terms, which cancel in the ratio).
    """
    v, x = velocity.float(), sample.float()
    sig, sig_next = per_sample(sigma, x), per_sample(sigma_next, x)
    eta = per_sample(eta, x)
    dsig = sig_next - sig
    x0_hat = x - sig * v
    score = -(x - (1 - sig) * x0_hat) / sig**2
    mean = x + dsig * v - 0.5 * eta**2 * score * dsig
    return _finish(mean, eta * torch.sqrt(-dsig), noise, prev_sample, generator, reduction)


def ddim_step(eps, sample, alpha_bar_t, alpha_bar_prev, eta=1.0, *, clip_sample_range=None,
              noise=None, prev_sample=None, generator=None, reduction="mean") -> StepOutput:
    """DDIM step with log-prob for epsilon-prediction models, as in DDPO ("Training Diffusion Models with
    Reinforcement Learning", Black et al., 2023), following DDIM (Song et al., eq. 12/16).

    ``x0_hat = (x - sqrt(1 - ab_t) eps) / sqrt(ab_t)``,
    ``std = eta sqrt((1 - ab_prev) / (1 - ab_t) (1 - ab_t / ab_prev))``,
    ``mean = sqrt(ab_prev) x0_hat + sqrt(1 - ab_prev - std^2) eps``, ``prev = mean + std noise``.
    ``clip_sample_range=r`` clamps ``x0_hat`` to [-r, r] first, as diffusers' ``DDIMScheduler`` (and
    ddpo-pytorch) do when the scheduler config sets ``clip_sample``; pass the scheduler's
    ``clip_sample_range`` then (``None``: no clamp). The mean's eps term keeps the model's eps,
    as both do.
    """
    e, x = eps.float(), sample.float()
    ab_t, ab_prev = per_sample(alpha_bar_t, x), per_sample(alpha_bar_prev, x)
    x0_hat = (x - torch.sqrt(1 - ab_t) * e) / torch.sqrt(ab_t)
    if clip_sample_range is not None:
        x0_hat = x0_hat.clamp(-float(clip_sample_range), float(clip_sample_range))
    variance = (1 - ab_prev) / (1 - ab_t) * (1 - ab_t / ab_prev)
    std = per_sample(eta, x) * torch.sqrt(variance)
    mean = torch.sqrt(ab_prev) * x0_hat + torch.sqrt((1 - ab_prev - std**2).clamp_min(0)) * e
    return _finish(mean, std, noise, prev_sample, generator, reduction)


def ode_step(velocity, sample, sigma, sigma_next) -> StepOutput:
    """Deterministic Euler step of the probability-flow ODE (rectified flow, "Flow Straight and Fast",
    Liu et al., 2022): ``x_next = x + (sigma_next - sigma) v``; std 0, log_prob 0. Used outside the
    SDE window (MixGRPO-style mixed ODE/SDE sampling)."""
    v, x = velocity.float(), sample.float()
    mean = x + (per_sample(sigma_next, x) - per_sample(sigma, x)) * v
    zeros = torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
    return StepOutput(mean, zeros, mean, zeros.clone())


# Each sampler's noise parameter: what ``diffusion.noise_level`` sets.
flow_sde_step.noise_param = cps_step.noise_param = "noise_level"
dance_flow_step.noise_param = "eta"


def sde_step(kind: str, velocity, sample, sigma, sigma_next, noise_level, **kw) -> StepOutput:
    """The registered SDE sampler ``kind`` (``diffusion.sampler``); ``noise_level`` is that step's
    noise parameter (``noise_level`` for flow_sde / cps, ``eta`` for dance)."""
    fn = SDE_SAMPLERS.get(kind)
    return fn(velocity, sample, sigma, sigma_next, **{fn.noise_param: noise_level}, **kw)
