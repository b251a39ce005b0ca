"""FLUX.2 (``Flux2Pipeline``: dev, a Mistral-3 text encoder and a guidance embedding) and FLUX.2 [klein]
(``Flux2KleinPipeline``: a Qwen3 text encoder, true classifier-free guidance) as FlowPipelines."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .diffusers_base import DiffusersAdapter


class Flux2Adapter(DiffusersAdapter):
    """FLUX.2 (``Flux2Pipeline``). Policy-facing latents are the pipeline's own noise: PATCHIFIED
    ``(in_channels, H/16, W/16)`` (the VAE's 2x2 patches already folded into channels, as
    ``prepare_latents`` draws them), so packing is a reshape to ``(H/16 * W/16, in_channels)`` tokens with
    ids ``(0, row, column, 0)``; text tokens get ``(0, 0, 0, position)``. The prompt embedding is the text
    encoder's hidden states at ``text_encoder_out_layers`` stacked along the width, as ``encode_prompt``
    computes them (through the pipeline's chat template); the schedule's shift is FLUX.2's empirical
    ``mu`` of the token count and the step count; decoding undoes the VAE's batch-norm statistics and
    the 2x2 patches. Timestep ``sigma``; the guidance scale goes to the guidance embedding (no CFG batch)."""

    family = "flux2"
    pipeline_class_name = "Flux2Pipeline"
    # Double-stream blocks: attention projections; single-stream blocks (most of the model) fuse their
    # QKV with the MLP input into ``to_qkv_mlp_proj`` (diffusers' own FLUX.2 LoRA tests target it too).
    lora_targets = ["to_q", "to_k", "to_v", "to_out.0", "to_qkv_mlp_proj"]
    default_guidance_scale = 4.0  # Flux2Pipeline.__call__'s default
    max_sequence_length = 512  # Flux2Pipeline.__call__'s default
    text_encoder_out_layers: tuple[int, ...] = (10, 20, 30)  # Flux2Pipeline.__call__'s default
    true_cfg = False  # guidance-distilled: the scale is embedded

    def __init__(self, pipe, device=None, max_sequence_length: int | None = None,
                 text_encoder_out_layers: Sequence[int] | None = None):
        super().__init__(pipe, device, max_sequence_length)
        if text_encoder_out_layers is not None:
            self.text_encoder_out_layers = tuple(int(i) for i in text_encoder_out_layers)
        layers = int(pipe.text_encoder.config.get_text_config().num_hidden_layers)
        if max(self.text_encoder_out_layers) > layers:
            raise ValueError(
                f"{type(self).__name__} reads the text encoder's hidden states {self.text_encoder_out_layers} (as "
                f"{self.pipeline_class_name} does), but this pipeline's text_encoder has {layers} layers: use the "
                "checkpoint's own text_encoder/ (or pass text_encoder_out_layers=... to the adapter)")
        self.vae_scale_factor = self._image_vae_scale()
        self.guidance_embeds = bool(self.transformer_config.get("guidance_embeds", True))
        size = min(512, int(getattr(pipe, "default_sample_size", 64)) * self.vae_scale_factor)
        self.default_height = self.default_width = size

    def sigmas(self, num_steps: int, latent_shape: tuple[int, ...]) -> Tensor:
        from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

        h, w = latent_shape[-2:]
        flow_sigmas = self.scheduler.config.get("use_flow_sigmas", False)  # the pipeline then lets the scheduler pick
        sigmas = None if flow_sigmas else np.linspace(1.0, 1 / num_steps, num_steps)
        return self._schedule(num_steps, sigmas=sigmas, mu=compute_empirical_mu(h * w, num_steps))

    def _encode_prompts(self, prompts: list[str]) -> list[dict[str, Tensor]]:
        embeds, _text_ids = self.pipe.encode_prompt(
            prompt=prompts, device=self.device, max_sequence_length=self.max_sequence_length,
            text_encoder_out_layers=self.text_encoder_out_layers,
        )
        return self._split({"prompt_embeds": embeds}, len(prompts))

    @staticmethod
    def pack(latents: Tensor) -> Tensor:
        """(B, C, h, w) -> (B, h * w, C): the pipeline's ``_pack_latents``, tokens row by row."""
        return latents.flatten(2).transpose(1, 2)

    @staticmethod
    def unpack(tokens: Tensor, height: int, width: int) -> Tensor:
        """(B, h * w, C) -> (B, C, h, w), the inverse of :meth:`pack` (the pipeline scatters by the ids,
        which for its own row-major ids is this reshape)."""
        return tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], height, width)

    @staticmethod
    def positions(time: int, height: int, width: int, length: int, device) -> Tensor:
        """The (time * height * width * length, 4) ids ``(t, row, column, l)`` of a token grid, row-major
        (``torch.cartesian_prod`` as the pipeline's ``_prepare_latent_ids`` / ``_prepare_text_ids``)."""
        axes = [torch.arange(n, device=device) for n in (time, height, width, length)]
        return torch.cartesian_prod(*axes)

    def velocity(self, latents: Tensor, sigma, prompts: Sequence[str], guidance_scale: float = 1.0) -> Tensor:
        batch, _, height, width = latents.shape
        cfg = self.true_cfg and guidance_scale > 1.0
        n = 2 * batch if cfg else batch
        timestep = self._sigma(sigma, batch).to(self.dtype)  # the pipeline passes t / 1000 = sigma
        emb = self._embeddings(prompts, batch, cfg)
        x = self.pack(latents.to(self.device, self.dtype))
        img_ids = self.positions(1, height, width, 1, self.device)
        txt_ids = self.positions(1, 1, 1, emb["prompt_embeds"].shape[1], self.device)
        guidance = (torch.full([n], guidance_scale, device=self.device, dtype=torch.float32)
                    if self.guidance_embeds else None)
        if cfg:
            x, timestep = torch.cat([x, x]), torch.cat([timestep, timestep])
        out = self.transformer(
            hidden_states=x, timestep=timestep, guidance=guidance, encoder_hidden_states=emb["prompt_embeds"],
            txt_ids=txt_ids, img_ids=img_ids, return_dict=False,
        )[0].float()
        if cfg:
            out = self._guide(out, guidance_scale)
        return self.unpack(out, height, width)

    def decode(self, latents: Tensor) -> Tensor:
        """The pipeline's decode: ``x * sqrt(bn.running_var + eps) + bn.running_mean`` (the VAE's
        batch-norm statistics of the patchified latents), the 2x2 patches unfolded, the VAE decoder."""
        vae = self.vae
        x = latents.to(vae.device, vae.dtype)
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(x.device, x.dtype)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(x.device, x.dtype)
        # the pipeline's _unpatchify_latents: channel 4c + 2i + j -> pixel (2h + i, 2w + j) of channel c
        x = F.pixel_shuffle(x * std + mean, 2)
        image = vae.decode(x, return_dict=False)[0]
        return (image.float() * 0.5 + 0.5).clamp(0, 1)

    # -- mmrl plan (mmrl.diffusion.memory_shape): the transformer's call from configs alone ---------------
    @classmethod
    def plan_latent_shape(cls, configs: dict, height: int, width: int, num_frames: int | None = None) -> tuple:
        """:meth:`latent_shape` from the components' configs (``{"transformer": {...}, "vae": {...}}``)."""
        f = 2 ** len(configs["vae"]["block_out_channels"])  # the VAE's factor x the 2x2 patches
        return (int(configs["transformer"]["in_channels"]), int(height) // f, int(width) // f)

    @classmethod
    def plan_inputs(cls, configs: dict, batch: int, latent_shape: tuple, text_tokens: int, dtype, device) -> dict:
        """The transformer's forward kwargs as :meth:`velocity` passes them, at these shapes (random values)."""
        config = configs["transformer"]
        tokens = latent_shape[-2] * latent_shape[-1]
        return {"hidden_states": torch.randn(batch, tokens, int(config["in_channels"]), device=device, dtype=dtype),
                "timestep": torch.rand(batch, device=device, dtype=dtype),
                "guidance": torch.full([batch], 4.0, device=device) if config.get("guidance_embeds", True) else None,
                "encoder_hidden_states": torch.randn(batch, text_tokens, int(config["joint_attention_dim"]),
                                                     device=device, dtype=dtype),
                "txt_ids": torch.zeros(text_tokens, 4, device=device, dtype=torch.long),
                "img_ids": torch.zeros(tokens, 4, device=device, dtype=torch.long), "return_dict": False}


class Flux2KleinAdapter(Flux2Adapter):
    """FLUX.2 [klein] (``Flux2KleinPipeline``): FLUX.2's transformer without a guidance embedding, the
    prompt through a Qwen3 chat template (hidden states 9, 18, 27). The base checkpoints take true
    classifier-free guidance with the empty prompt (``guidance_scale > 1``, as the pipeline); the
    step-distilled ones (``is_distilled`` in model_index.json) take none, as the pipeline ignores it."""

    family = "flux2_klein"
    pipeline_class_name = "Flux2KleinPipeline"
    text_encoder_out_layers = (9, 18, 27)  # Flux2KleinPipeline.__call__'s default

    def __init__(self, pipe, device=None, max_sequence_length: int | None = None,
                 text_encoder_out_layers: Sequence[int] | None = None):
        super().__init__(pipe, device, max_sequence_length, text_encoder_out_layers)
        self.true_cfg = not bool(pipe.config.get("is_distilled", False))
        self.guidance_embeds = False  # the pipeline passes no guidance
        self.default_guidance_scale = 4.0 if self.true_cfg else 1.0
