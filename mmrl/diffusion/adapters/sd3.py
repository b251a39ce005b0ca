"""Stable Diffusion 3 / 3.5 (``StableDiffusion3Pipeline``) as a :class:`~mmrl.diffusion.base.FlowPipeline`."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .diffusers_base import DiffusersAdapter


class SD3Adapter(DiffusersAdapter):
    """Stable Diffusion 3 / 3.5 (``StableDiffusion3Pipeline``): MMDiT over (C, H/8, W/8) latents, timestep
    ``sigma * num_train_timesteps``, CFG with the empty prompt batched as ``[uncond, cond]``."""

    family = "sd3"
    pipeline_class_name = "StableDiffusion3Pipeline"
    lora_targets = ["to_k", "to_q", "to_v", "to_out.0"]
    default_guidance_scale = 4.5  # SD3.5-Medium's Flow-GRPO evaluation setting
    max_sequence_length = 256  # StableDiffusion3Pipeline.__call__'s default

    def __init__(self, pipe, device=None, max_sequence_length: int | None = None):
        super().__init__(pipe, device, max_sequence_length)
        self.vae_scale_factor = self._image_vae_scale()
        self.patch_size = int(self.transformer_config.patch_size)
        # Flow-GRPO trains SD3.5 at 512 px; small models at their native size
        size = min(512, int(self.transformer_config.sample_size) * self.vae_scale_factor)
        self.default_height = self.default_width = size

    def sigmas(self, num_steps: int, latent_shape: tuple[int, ...]) -> Tensor:
        config = self.scheduler.config
        kwargs = {}
        if config.get("use_dynamic_shifting", False):
            from diffusers.pipelines.flux.pipeline_flux import calculate_shift

            h, w = latent_shape[-2:]
            seq_len = (h // self.patch_size) * (w // self.patch_size)
            kwargs["mu"] = calculate_shift(
                seq_len, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
                config.get("base_shift", 0.5), config.get("max_shift", 1.16),
            )
        return self._schedule(num_steps, **kwargs)

    def _encode_prompts(self, prompts: list[str]) -> list[dict[str, Tensor]]:
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=prompts, prompt_3=prompts, do_classifier_free_guidance=False,
            device=self.device, max_sequence_length=self.max_sequence_length,
        )
        return self._split({"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}, len(prompts))

    def velocity(self, latents: Tensor, sigma, prompts: Sequence[str], guidance_scale: float = 1.0) -> Tensor:
        batch = latents.shape[0]
        cfg = guidance_scale > 1.0
        timestep = self._sigma(sigma, batch) * self.num_train_timesteps
        emb = self._embeddings(prompts, batch, cfg)
        x = latents.to(self.device, self.dtype)
        if cfg:
            x, timestep = torch.cat([x, x]), torch.cat([timestep, timestep])
        out = self.transformer(
            hidden_states=x, timestep=timestep, encoder_hidden_states=emb["prompt_embeds"],
            pooled_projections=emb["pooled_prompt_embeds"], return_dict=False,
        )[0].float()
        return self._guide(out, guidance_scale) if cfg else out

    def decode(self, latents: Tensor) -> Tensor:
        return self._decode_image(latents)

    # -- mmrl plan (mmrl.diffusion.memory_shape): the transformer's call from configs alone ---------------
    @classmethod
    def plan_latent_shape(cls, configs: dict, height: int, width: int, num_frames: int | None = None) -> tuple:
        """:meth:`latent_shape` from the components' configs (``{"transformer": {...}, "vae": {...}}``)."""
        f = 2 ** (len(configs["vae"]["block_out_channels"]) - 1)
        return (int(configs["transformer"]["in_channels"]), int(height) // f, int(width) // f)

    @classmethod
    def plan_text_tokens(cls, configs: dict) -> int:
        """The prompt embedding's length: 77 CLIP tokens joined to ``max_sequence_length`` T5 tokens."""
        return 77 + cls.max_sequence_length

    @classmethod
    def plan_inputs(cls, configs: dict, batch: int, latent_shape: tuple, text_tokens: int, dtype, device) -> dict:
        """The transformer's forward kwargs as :meth:`velocity` passes them, at these shapes (random values)."""
        config = configs["transformer"]
        return {"hidden_states": torch.randn(batch, int(config["in_channels"]), *latent_shape[1:], device=device,
                                             dtype=dtype),
                "timestep": torch.rand(batch, device=device) * 1000,
                "encoder_hidden_states": torch.randn(batch, text_tokens, int(config["joint_attention_dim"]),
                                                     device=device, dtype=dtype),
                "pooled_projections": torch.randn(batch, int(config["pooled_projection_dim"]), device=device,
                                                  dtype=dtype),
                "return_dict": False}
