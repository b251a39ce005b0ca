"""FLUX.1-Kontext (``FluxKontextPipeline``: image editing) as a conditioned FlowPipeline."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ...core.library_internals import flux_latent_ids
from ..base import ConditionCache
from .flux import FluxAdapter


class FluxKontextAdapter(FluxAdapter):
    """FLUX.1-Kontext (``FluxKontextPipeline``), ``conditioning = "image"``: FLUX.1's transformer, text
    encoders, schedule and decoding (:class:`FluxAdapter`), with the source image's VAE latents
    (``(vae(2x - 1).mode - shift) * scale``, packed in 2x2 patches) appended after the noisy tokens, their
    ids ``(1, row, column)``, and the output cut back to the noisy tokens. Kontext-dev embeds the guidance
    scale; a checkpoint without the embedding takes true CFG with the empty prompt and the SAME image.
    Text embeddings are cached per text, the image latents per (text, image) pair.

    What it expects: ``images`` (B, 3, H, W) in [0, 1] at the OUTPUT's size (the policy resizes the
    task's image to ``diffusion.height`` x ``diffusion.width``), both multiples of 16. It never resizes:
    the pipeline's ``_auto_resize`` (on by default) moves the source to the nearest of Kontext's preferred
    ~1 MP resolutions; choose such a size in the config to match it, or call the pipeline with
    ``_auto_resize=False`` to compare."""

    family = "flux_kontext"
    pipeline_class_name = "FluxKontextPipeline"
    conditioning = "image"

    def __init__(self, pipe, device=None, max_sequence_length: int | None = None):
        super().__init__(pipe, device, max_sequence_length)
        self.condition_cache = ConditionCache(self._encode_conditions)

    def _encode_conditions(self, texts: list[str], images: Tensor) -> list[dict[str, Tensor]]:
        """Per (text, image) pair: the image's packed VAE latents, as the pipeline's ``prepare_latents``
        computes them (the text's embeddings stay in the prompt cache: one copy per text)."""
        cfg = self.vae.config
        pixels = (images.float() * 2 - 1).to(self.vae.device, self.vae.dtype)  # VaeImageProcessor.normalize
        latents = self.vae.encode(pixels).latent_dist.mode()  # retrieve_latents(sample_mode="argmax")
        latents = (latents - cfg.shift_factor) * cfg.scaling_factor
        return self._split({"image_latents": self.pack(latents)}, len(texts))

    def velocity(self, latents: Tensor, sigma, prompts: Sequence[str], guidance_scale: float = 1.0,
                 images: Tensor | None = None) -> Tensor:
        batch, _, height, width = latents.shape
        if images is None or images.dim() != 4 or images.shape[0] != batch:
            raise ValueError(f"FLUX.1-Kontext edits an image: velocity needs images (B={batch}, 3, H, W) in [0, 1], "
                             f"got {None if images is None else tuple(images.shape)}; its task's prompt(ex) must "
                             "return mmrl.GenerationPrompt(text, image)")
        f = self.vae_scale_factor * 2
        if images.shape[-2] % f or images.shape[-1] % f:
            raise ValueError(f"FLUX.1-Kontext packs the source image's latents in 2x2 patches: its size must be a "
                             f"multiple of {f} px, got {tuple(images.shape[-2:])}; set diffusion.height and "
                             f"diffusion.width to multiples of {f}")
        cfg = (not self.guidance_embeds) and guidance_scale > 1.0
        prompts = list(prompts)
        if cfg:  # the unconditional branch keeps the image: [("", image), (prompt, image)]
            prompts, images = [""] * batch + prompts, torch.cat([images, images])
        emb = {k: v.to(self.device, self.dtype) for k, v in self.prompt_cache.get(prompts).items()}
        context = self.condition_cache.get(prompts, images)["image_latents"].to(self.device, self.dtype)
        ids = flux_latent_ids(batch, images.shape[-2] // f, images.shape[-1] // f, self.device, self.dtype)
        ids[..., 0] = 1  # the pipeline's image ids: the latent ids with the first coordinate 1
        return self._velocity(latents, sigma, emb, guidance_scale, cfg, context, ids)

    @classmethod
    def plan_inputs(cls, configs: dict, batch: int, latent_shape: tuple, text_tokens: int, dtype, device) -> dict:
        """FLUX.1's call with the source image's tokens (at the output's size, as the policy gives it) appended."""
        inputs = super().plan_inputs(configs, batch, latent_shape, text_tokens, dtype, device)
        inputs["hidden_states"] = torch.cat([inputs["hidden_states"]] * 2, dim=1)
        inputs["img_ids"] = torch.cat([inputs["img_ids"]] * 2)
        return inputs
