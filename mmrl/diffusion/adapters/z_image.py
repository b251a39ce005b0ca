"""Z-Image (``ZImagePipeline``: Z-Image-Turbo and the base Z-Image) as a FlowPipeline."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .diffusers_base import DiffusersAdapter


class ZImageAdapter(DiffusersAdapter):
    """Z-Image (``ZImagePipeline``): a single-stream DiT over latents ``(16, H/8, W/8)`` (2x2 patches inside
    the transformer), prompts through Qwen3 with its chat template, the second-to-last hidden state of the
    prompt's tokens only (no padding: one variable-length embedding per prompt, as the pipeline passes a list).

    What ``__call__`` does that the other families do not: the transformer takes LISTS (one ``(C, 1, H, W)``
    latent and one ``(L_i, D)`` caption per sample), its timestep is ``(1000 - t) / 1000`` = ``1 - sigma``
    (time runs from noise at 0 to data at 1) and its output is the negated velocity. The schedule is
    ``linspace(1, 1/n, n)`` shifted by the scheduler (static shift, or ``mu`` of the token count).

    Guidance, in mmrl's convention (``guidance_scale > 1``: CFG ``uncond + s * (cond - uncond)``, 1: off):
    the pipeline writes ``cond + g * (cond - uncond)`` with CFG on for ``g > 0``, so mmrl's
    ``diffusion.guidance_scale`` is the pipeline's ``guidance_scale + 1`` (Z-Image-Turbo's 0.0 is mmrl's 1.0).
    ``cfg_normalization`` (caps the guided prediction's norm at that multiple of the conditional one's; 0: off)
    and ``cfg_truncation`` (no guidance where ``1 - sigma`` exceeds it; 1.0: never) are the pipeline's options
    with its defaults, per sample."""

    family = "z_image"
    pipeline_class_name = "ZImagePipeline"
    # ZSingleStreamAttnProcessor's projections (noise / context refiners and the main layers)
    lora_targets = ["to_q", "to_k", "to_v", "to_out.0"]
    default_guidance_scale = 6.0  # ZImagePipeline.__call__'s guidance_scale=5.0 (cond + 5 (cond - uncond))
    max_sequence_length = 512  # ZImagePipeline.__call__'s default
    cfg_normalization = 0.0  # ZImagePipeline.__call__'s default (False)
    cfg_truncation = 1.0  # ZImagePipeline.__call__'s default
    patch_size = 2  # the transformer's default patch (ZImagePipeline passes none)

    def __init__(self, pipe, device=None, max_sequence_length: int | None = None,
                 cfg_normalization: float | None = None, cfg_truncation: float | None = None):
        super().__init__(pipe, device, max_sequence_length)
        self.vae_scale_factor = self._image_vae_scale()
        if cfg_normalization is not None:
            self.cfg_normalization = float(cfg_normalization)
        if cfg_truncation is not None:
            self.cfg_truncation = float(cfg_truncation)

    def sigmas(self, num_steps: int, latent_shape: tuple[int, ...]) -> Tensor:
        from diffusers.pipelines.z_image.pipeline_z_image import calculate_shift, get_default_z_image_sigmas

        config = self.scheduler.config
        h, w = latent_shape[-2:]
        mu = calculate_shift(
            (h // 2) * (w // 2), config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5), config.get("max_shift", 1.15),
        )
        return self._schedule(num_steps, sigmas=get_default_z_image_sigmas(num_steps), mu=mu)

    def _encode_prompts(self, prompts: list[str]) -> list[dict[str, Tensor]]:
        embeds, _ = self.pipe.encode_prompt(prompt=list(prompts), device=self.device, do_classifier_free_guidance=False,
                                            max_sequence_length=self.max_sequence_length)
        return [{"prompt_embeds": e[None].detach().clone()} for e in embeds]  # (1, L_i, D): lengths differ

    def captions(self, prompts: Sequence[str]) -> list[Tensor]:
        """One cached ``(L_i, D)`` embedding per prompt (variable lengths: fetched one by one)."""
        return [self.prompt_cache.get([p])["prompt_embeds"][0].to(self.device, self.dtype) for p in prompts]

    def guidance_scales(self, sigma: Tensor, guidance_scale: float) -> Tensor:
        """The per-sample scale of ``cond - uncond`` in the pipeline's form (``cond + g (cond - uncond)``):
        ``guidance_scale - 1``, zero where CFG is off or truncated (``(1000 - t) / 1000 > cfg_truncation``)."""
        g = torch.full_like(sigma, max(float(guidance_scale) - 1.0, 0.0))
        if self.cfg_truncation <= 1:
            g = torch.where(self._time(sigma) > self.cfg_truncation, torch.zeros_like(g), g)
        return g

    def _time(self, sigma: Tensor) -> Tensor:
        """The transformer's time ``(1000 - t) / 1000`` of the scheduler's timestep ``t = sigma * T``."""
        return (1000 - sigma * self.num_train_timesteps) / 1000

    def velocity(self, latents: Tensor, sigma, prompts: Sequence[str], guidance_scale: float = 1.0) -> Tensor:
        batch = latents.shape[0]
        if len(prompts) != batch:
            raise ValueError(f"{len(prompts)} prompts for a batch of {batch} latents")
        sigma = self._sigma(sigma, batch)
        g = self.guidance_scales(sigma, guidance_scale)
        guided = (g > 0).nonzero().flatten().tolist()
        x = list(latents.to(self.device, self.dtype).unsqueeze(2).unbind(0))
        captions = self.captions(prompts)
        time = self._time(sigma)
        if guided:  # the pipeline's order: conditional samples first, then the unconditional ones
            uncond = self.captions([""] * len(guided))
            x, captions = x + [x[i] for i in guided], captions + uncond
            time = torch.cat([time, time[guided]])
        out = self.transformer(x, time, captions, return_dict=False)[0]
        pred = torch.stack([o.float() for o in out[:batch]])
        if guided:
            cond = pred[guided]
            neg = torch.stack([o.float() for o in out[batch:]])
            scale = g[guided].view(-1, *[1] * (cond.dim() - 1))
            new = cond + scale * (cond - neg)
            if self.cfg_normalization > 0:  # the guided prediction's norm capped at a multiple of cond's
                cap = torch.linalg.vector_norm(cond.flatten(1), dim=1) * self.cfg_normalization
                norm = torch.linalg.vector_norm(new.flatten(1), dim=1)
                factor = torch.where(norm > cap, cap / norm, torch.ones_like(norm))
                new = new * factor.view_as(scale)
            pred = pred.index_put((torch.tensor(guided, device=pred.device),), new)
        return -pred.squeeze(2)  # the transformer predicts x0 - noise

    def decode(self, latents: Tensor) -> Tensor:
        return self._decode_image(latents)

    # -- mmrl plan (mmrl.diffusion.memory_shape): the transformer's call from configs alone ---------------
    @classmethod
    def plan_latent_shape(cls, configs: dict, height: int, width: int, num_frames: int | None = None) -> tuple:
        """:meth:`latent_shape` from the components' configs (``{"transformer": {...}, "vae": {...}}``)."""
        f = 2 ** len(configs["vae"]["block_out_channels"])  # the VAE's factor x the 2x2 patches
        if int(height) % f or int(width) % f:
            raise ValueError(f"Z-Image generates sizes that are multiples of {f} (VAE x 2x2 patches), got "
                             f"{height}x{width}: set diffusion.height and diffusion.width to multiples of {f}")
        return (int(configs["transformer"]["in_channels"]), 2 * (int(height) // f), 2 * (int(width) // f))

    @classmethod
    def plan_inputs(cls, configs: dict, batch: int, latent_shape: tuple, text_tokens: int, dtype, device) -> dict:
        """The transformer's arguments as :meth:`velocity` passes them (lists, one entry per sample; random values)."""
        config = configs["transformer"]
        return {"x": [torch.randn(latent_shape[0], 1, *latent_shape[1:], device=device, dtype=dtype)
                      for _ in range(batch)],
                "t": torch.rand(batch, device=device, dtype=dtype),
                "cap_feats": [torch.randn(text_tokens, int(config["cap_feat_dim"]), device=device, dtype=dtype)
                              for _ in range(batch)], "return_dict": False}
