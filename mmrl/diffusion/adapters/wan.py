"""Wan 2.1 and Wan 2.2 text-to-video (``WanPipeline``: one transformer, or Wan 2.2 A14B's two noise-level
experts) as a FlowPipeline."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .diffusers_base import DiffusersAdapter
from .wan_experts import WanExperts, high_noise


class WanAdapter(DiffusersAdapter):
    """Wan text-to-video (``WanPipeline``): latents ``(C, F_lat, H/8, W/8)`` with
    ``F_lat = (num_frames - 1) // 4 + 1``, timestep ``sigma * num_train_timesteps``, CFG with the empty prompt.
    ``decode`` gives ``(B, F, 3, H, W)`` in [0, 1].

    Wan 2.2 A14B (``transformer_2`` and ``boundary_ratio`` in the pipeline): the trained ``transformer`` is
    :class:`~.wan_experts.WanExperts`, both experts behind one module, each timestep ``t = sigma * T`` denoised
    by ``transformer`` when ``t >= boundary_ratio * T`` and by ``transformer_2`` below, as ``WanPipeline``
    switches; LoRA goes on both. The low-noise expert's steps are guided by ``guidance_scale_2`` (the
    pipeline's argument; None: ``guidance_scale``, as the pipeline), CFG on when ``guidance_scale > 1``."""

    family = "wan"
    pipeline_class_name = "WanPipeline"
    is_video = True
    # WanAttention (self-attention attn1 and cross-attention attn2 of every block)
    lora_targets = ["to_q", "to_k", "to_v", "to_out.0"]
    default_guidance_scale = 5.0
    default_height = 480
    default_width = 832
    default_num_frames = 81
    max_sequence_length = 512  # WanPipeline.__call__'s default

    guidance_scale_2: float | None = None  # WanPipeline.__call__'s default

    def __init__(self, pipe, device=None, max_sequence_length: int | None = None,
                 guidance_scale_2: float | None = None):
        boundary_ratio = pipe.config.get("boundary_ratio")
        two_experts = getattr(pipe, "transformer_2", None) is not None
        if (boundary_ratio is not None) != two_experts or (two_experts and getattr(pipe, "transformer", None) is None):
            raise ValueError(
                "a Wan 2.2 two-expert pipeline needs transformer/, transformer_2/ and boundary_ratio in its "
                f"model_index.json (found transformer_2: {two_experts}, boundary_ratio: {boundary_ratio}); a "
                "pipeline with one of them missing is not a checkpoint mmrl can train"
            )
        super().__init__(pipe, device, max_sequence_length)
        self.expand_timesteps = bool(pipe.config.get("expand_timesteps", False))
        self.vae_scale_factor_temporal = int(pipe.vae_scale_factor_temporal)
        self.vae_scale_factor_spatial = int(pipe.vae_scale_factor_spatial)
        # WanPipeline: boundary_ratio * scheduler.config.num_train_timesteps
        self.boundary_timestep = None if boundary_ratio is None else float(boundary_ratio) * self.num_train_timesteps
        if two_experts:
            self.transformer = WanExperts(pipe.transformer, pipe.transformer_2, self.boundary_timestep)
        if guidance_scale_2 is not None:
            self.guidance_scale_2 = float(guidance_scale_2)

    def sigmas(self, num_steps: int, latent_shape: tuple[int, ...]) -> Tensor:
        return self._schedule(num_steps)  # WanPipeline: scheduler.set_timesteps(num_inference_steps)

    def _encode_prompts(self, prompts: list[str]) -> list[dict[str, Tensor]]:
        embeds, _ = self.pipe.encode_prompt(
            prompt=prompts, negative_prompt=None, do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length, device=self.device,
        )
        return self._split({"prompt_embeds": embeds}, len(prompts))

    def velocity(self, latents: Tensor, sigma, prompts: Sequence[str], guidance_scale: float = 1.0) -> Tensor:
        batch = latents.shape[0]
        cfg = guidance_scale > 1.0
        timestep = self._sigma(sigma, batch) * self.num_train_timesteps
        if self.expand_timesteps:  # Wan 2.2 TI2V: one timestep per (2x2-patched) token, all equal for text-to-video
            _, _, frames, height, width = latents.shape
            tokens = frames * ((height + 1) // 2) * ((width + 1) // 2)
            timestep = timestep[:, None].expand(batch, tokens)
        emb = self._embeddings(prompts, batch, cfg)
        x = latents.to(self.device, self.dtype)
        if cfg:
            x, timestep = torch.cat([x, x]), torch.cat([timestep, timestep])
        out = self.transformer(
            hidden_states=x, timestep=timestep, encoder_hidden_states=emb["prompt_embeds"], return_dict=False,
        )[0].float()
        return self.guide(out, timestep[:batch], guidance_scale) if cfg else out

    def guide(self, out: Tensor, timestep: Tensor, guidance_scale: float) -> Tensor:
        """Classifier-free guidance of the ``[uncond, cond]`` batch ``out`` at the samples' ``timestep``: with
        two experts, the low-noise expert's samples (``t < boundary``) take ``guidance_scale_2``."""
        if self.boundary_timestep is None or self.guidance_scale_2 is None:
            return self._guide(out, guidance_scale)
        scale = torch.where(high_noise(timestep, self.boundary_timestep), float(guidance_scale),
                            float(self.guidance_scale_2))
        uncond, cond = out.chunk(2)
        return uncond + scale.to(out.dtype).view(-1, *[1] * (out.dim() - 1)) * (cond - uncond)

    def decode(self, latents: Tensor) -> Tensor:
        x = latents.to(self.vae.device, self.vae.dtype)
        mean, std = self._latent_statistics(x)
        x = x / (1.0 / std) + mean  # as WanPipeline (which divides by the reciprocal std)
        video = self.vae.decode(x, return_dict=False)[0]  # (B, 3, F, H, W) in [-1, 1]
        return (video.float() * 0.5 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4).contiguous()

    # -- mmrl plan (mmrl.diffusion.memory_shape): the transformer's call from configs alone ---------------
    @classmethod
    def plan_latent_shape(cls, configs: dict, height: int, width: int, num_frames: int | None = None) -> tuple:
        """:meth:`latent_shape` from the components' configs (``{"transformer": {...}, "vae": {...}}``)."""
        vae = configs["vae"]
        frames = cls.default_num_frames if num_frames is None else int(num_frames)
        s = int(vae.get("scale_factor_spatial") or 8)  # AutoencoderKLWan's defaults, as the pipeline reads them
        return (int(configs["transformer"]["in_channels"]), (frames - 1) // int(vae.get("scale_factor_temporal") or 4)
                + 1, int(height) // s, int(width) // s)

    @classmethod
    def plan_inputs(cls, configs: dict, batch: int, latent_shape: tuple, text_tokens: int, dtype, device) -> dict:
        """The transformer's forward kwargs as :meth:`velocity` passes them, at these shapes (random values);
        ``in_channels`` as the transformer takes them (an image-to-video model's condition channels included)."""
        config = configs["transformer"]
        return {"hidden_states": torch.randn(batch, int(config["in_channels"]), *latent_shape[1:], device=device,
                                             dtype=dtype),
                "timestep": torch.rand(batch, device=device) * 1000,
                "encoder_hidden_states": torch.randn(batch, text_tokens, int(config["text_dim"]), device=device,
                                                     dtype=dtype), "return_dict": False}
