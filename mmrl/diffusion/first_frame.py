"""First-frame conditioning as Wan 2.2 TI2V does it (``WanImageToVideoPipeline`` with ``expand_timesteps``).

The given frame's latent replaces the first latent frame of the transformer's input, and that frame's
tokens get timestep 0 (clean), while the other frames are denoised as usual; diffusers then puts the
given frame back over the first frame before decoding. Here the policy owns the sampling loop and
its initial noise; the velocity of the first frame is *pinned*: ``(x - first) / sigma``, the exact
flow velocity of a sample whose clean value is known to be ``first``. An Euler step along it stays
on the straight line from the noise to ``first`` and the last step (to sigma 0) lands on ``first``,
so the loop's output equals the pipeline's; the pinned part has no parameters, so it adds nothing to
a log-ratio. A stochastic (SDE) last step adds its noise to the first frame as to every frame, so the
pipeline's ``final_latents`` puts the frame back before decoding, as diffusers does (the trajectory
the log-probs score is left as sampled).

Used by the tiny video generator (:mod:`mmrl.diffusion.tiny_video`, ``model.path=tiny-i2v``) and by
the Wan image-to-video adapter on a TI2V checkpoint (:mod:`mmrl.diffusion.adapters.wan_i2v`).
Latents are Wan's layout ``(B, C, F, H, W)``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def first_frame_mask(latents: Tensor) -> Tensor:
    """``(1, 1, F, H, W)``: 0 on the first frame, 1 elsewhere (diffusers' ``first_frame_mask``)."""
    mask = torch.ones(1, 1, *latents.shape[2:], dtype=latents.dtype, device=latents.device)
    mask[:, :, 0] = 0
    return mask


def with_first_frame(latents: Tensor, first: Tensor) -> Tensor:
    """The transformer's input: ``latents`` with the first frame replaced by ``first`` ``(B, C, 1, H, W)``,
    written as diffusers writes it, ``(1 - mask) * first + mask * latents``."""
    mask = first_frame_mask(latents)
    return (1 - mask) * first.to(latents.dtype) + mask * latents


def token_timesteps(timestep: Tensor, latents: Tensor, patch: tuple[int, int]) -> Tensor:
    """Per-token timesteps ``(B, F * H/ph * W/pw)``: ``timestep`` (B,) on every token but the first
    frame's, which get 0 (diffusers: ``first_frame_mask[0][0][:, ::2, ::2] * t``, patch 2x2)."""
    ph, pw = patch
    per_token = first_frame_mask(latents)[0, 0][:, ::ph, ::pw].flatten().to(timestep.dtype)
    return timestep[:, None] * per_token[None, :]


def pinned_velocity(velocity: Tensor, latents: Tensor, first: Tensor, sigma: Tensor) -> Tensor:
    """``velocity`` with the first frame's replaced by ``(latents - first) / sigma`` (module docstring);
    ``sigma`` (B,) is never 0 where a velocity is asked (the schedule's last sigma is only a target)."""
    s = sigma.float().reshape(-1, 1, 1, 1, 1)
    out = velocity.float().clone()
    out[:, :, :1] = (latents[:, :, :1].float() - first.float()) / s
    return out
