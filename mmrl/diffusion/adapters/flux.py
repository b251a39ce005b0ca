"""FLUX.1 (``FluxPipeline``: dev with its guidance embedding, schnell with true CFG) as a FlowPipeline."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from ...core.library_internals import flux_latent_ids, flux_pack_latents, flux_unpack_latents
from .diffusers_base import DiffusersAdapter


class FluxAdapter(DiffusersAdapter):
    """FLUX.1 (``FluxPipeline``). Policy-facing latents are UNPACKED ``(C, H/8, W/8)``; ``velocity`` packs them
    into 2x2 patches (``_pack_latents``) for the transformer and unpacks its output. Timestep ``sigma``.
    FLUX-dev (``guidance_embeds``): the guidance scale goes to the distilled guidance embedding, no CFG batch;
    FLUX-schnell: no guidance input, and ``guidance_scale > 1`` is true CFG with the empty prompt."""

    family = "flux"
    pipeline_class_name = "FluxPipeline"
    lora_targets = ["to_k", "to_q", "to_v", "to_out.0"]
    default_guidance_scale = 3.5
    max_sequence_length = 512  # FluxPipeline.__call__'s default

    def __init__(self, pipe, device=None, max_sequence_length: int | None = None):
        super().__init__(pipe, device, max_sequence_length)
        self.vae_scale_factor = self._image_vae_scale()
        self.guidance_embeds = bool(self.transformer_config.get("guidance_embeds", False))
        if not self.guidance_embeds:
            self.default_guidance_scale = 1.0  # schnell is guidance-distilled: no CFG by default
        size = min(512, int(getattr(pipe, "default_sample_size", 64)) * self.vae_scale_factor)
        self.default_height = self.default_width = size

    def sigmas(self, num_steps: int, latent_shape: tuple[int, ...]) -> Tensor:
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        config = self.scheduler.config
        h, w = latent_shape[-2:]
        seq_len = (h // 2) * (w // 2)  # packed tokens
        sigmas = None if config.get("use_flow_sigmas", False) else np.linspace(1.0, 1 / num_steps, num_steps)
        mu = calculate_shift(
            seq_len, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5), config.get("max_shift", 1.15),
        )
        return self._schedule(num_steps, sigmas=sigmas, mu=mu)

    def _encode_prompts(self, prompts: list[str]) -> list[dict[str, Tensor]]:
        embeds, pooled, _text_ids = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=prompts, device=self.device, max_sequence_length=self.max_sequence_length,
        )
        return self._split({"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}, len(prompts))

    def pack(self, latents: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, H/2 * W/2, 4C), as the pipeline packs them."""
        return flux_pack_latents(latents)

    def unpack(self, packed: Tensor, height: int, width: int) -> Tensor:
        """(B, H/2 * W/2, 4C) -> (B, C, H, W) for latent ``height``/``width``, as the pipeline unpacks them."""
        f = self.vae_scale_factor
        return flux_unpack_latents(packed, height * f, width * f, f)

    def velocity(self, latents: Tensor, sigma, prompts: Sequence[str], guidance_scale: float = 1.0) -> Tensor:
        cfg = (not self.guidance_embeds) and guidance_scale > 1.0
        return self._velocity(latents, sigma, self._embeddings(prompts, latents.shape[0], cfg), guidance_scale, cfg)

    def _velocity(self, latents: Tensor, sigma, emb: dict[str, Tensor], guidance_scale: float, cfg: bool,
                  context: Tensor | None = None, context_ids: Tensor | None = None) -> Tensor:
        """The transformer's velocity for prompt embeddings ``emb`` (``[uncond, cond]`` when ``cfg``).
        ``context``: packed tokens placed after the noisy ones (FLUX.1-Kontext's source image), ``(n, L, 4C)``
        with their ``(L, 3)`` ids; the transformer's output is cut back to the noisy tokens, as the pipeline does."""
        batch, _, height, width = latents.shape
        n = 2 * batch if cfg else batch
        timestep = self._sigma(sigma, batch).to(self.dtype)  # the pipeline passes t / 1000 = sigma
        x = self.pack(latents.to(self.device, self.dtype))
        img_ids = flux_latent_ids(batch, height // 2, width // 2, self.device, self.dtype)
        txt_ids = torch.zeros(emb["prompt_embeds"].shape[1], 3, device=self.device, dtype=self.dtype)
        guidance = (
            torch.full([n], guidance_scale, device=self.device, dtype=torch.float32) if self.guidance_embeds else None
        )
        if cfg:
            x, timestep = torch.cat([x, x]), torch.cat([timestep, timestep])
        tokens = x.shape[1]
        if context is not None:
            x, img_ids = torch.cat([x, context.to(self.dtype)], dim=1), torch.cat([img_ids, context_ids.to(self.dtype)])
        out = self.transformer(
            hidden_states=x, timestep=timestep, guidance=guidance, pooled_projections=emb["pooled_prompt_embeds"],
            encoder_hidden_states=emb["prompt_embeds"], txt_ids=txt_ids, img_ids=img_ids, return_dict=False,
        )[0][:, :tokens].float()
        if cfg:
            out = self._guide(out, guidance_scale)
        return self.unpack(out, height, width)

    def decode(self, latents: Tensor) -> Tensor:
        return self._decode_image(latents)

    # -- mmrl plan (mmrl.diffusion.memory_shape): the transformer's call from configs alone ---------------
    @classmethod
    def plan_latent_shape(cls, configs: dict, height: int, width: int, num_frames: int | None = None) -> tuple:
        """:meth:`latent_shape` from the components' configs (``{"transformer": {...}, "vae": {...}}``)."""
        f = 2 ** len(configs["vae"]["block_out_channels"])  # the VAE's factor x the 2x2 packing
        return (int(configs["transformer"]["in_channels"]) // 4, 2 * (int(height) // f), 2 * (int(width) // f))

    @classmethod
    def plan_inputs(cls, configs: dict, batch: int, latent_shape: tuple, text_tokens: int, dtype, device) -> dict:
        """The transformer's forward kwargs as :meth:`velocity` passes them, at these shapes (random values)."""
        config = configs["transformer"]
        tokens = (latent_shape[-2] // 2) * (latent_shape[-1] // 2)
        return {"hidden_states": torch.randn(batch, tokens, int(config["in_channels"]), device=device, dtype=dtype),
                "timestep": torch.rand(batch, device=device, dtype=dtype),
                "guidance": torch.full([batch], 3.5, device=device) if config.get("guidance_embeds") else None,
                "pooled_projections": torch.randn(batch, int(config["pooled_projection_dim"]), device=device,
                                                  dtype=dtype),
                "encoder_hidden_states": torch.randn(batch, text_tokens, int(config["joint_attention_dim"]),
                                                     device=device, dtype=dtype),
                "txt_ids": torch.zeros(text_tokens, 3, device=device, dtype=dtype),
                "img_ids": torch.zeros(tokens, 3, device=device, dtype=dtype), "return_dict": False}
