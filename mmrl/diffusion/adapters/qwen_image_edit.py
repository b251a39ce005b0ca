"""Qwen-Image-Edit (``QwenImageEditPipeline``): Qwen-Image conditioned on a source image, as a
:class:`~mmrl.diffusion.base.FlowPipeline` with ``conditioning = "image"``."""

from __future__ import annotations

from typing import Sequence

import torch
from PIL import Image
from torch import Tensor

from ...core.library_internals import flux_pack_latents
from ..base import ConditionCache
from ..conditions import to_pil
from .qwen_image import QwenImageAdapter


class QwenImageEditAdapter(QwenImageAdapter):
    """Qwen-Image-Edit (``QwenImageEditPipeline``): the source image conditions the generation twice, as the
    pipeline's ``__call__`` does:

    - the instruction goes through Qwen2.5-VL WITH the image, in the pipeline's edit template (the image's vision
      tokens are part of the prompt embedding), so the embedding depends on the (text, image) pair: encoded once
      per pair (:class:`ConditionCache`);
    - the image's VAE latents (the latent distribution's mode, normalised by ``latents_mean`` / ``latents_std``),
      packed into 2x2 patches, are appended to the noisy tokens (``img_shapes`` gets their grid); the
      transformer's output is cut back to the noisy tokens.

    CFG's unconditional branch is the empty instruction with the same image, then the pipeline's norm rescale.

    What it expects: ``velocity``'s ``images`` are (B, 3, H, W) in [0, 1] at the output size, as the diffusion
    policy gives them. The pipeline resizes the image it is given (Lanczos, its image processor) to the target area
    ``condition_area`` (1024 x 1024 px) at the image's aspect ratio in multiples of 32 (``calculate_dimensions``)
    and conditions on that whatever the output size; so does the adapter, from the image it is given: the identity
    when the output has that size (the pipeline's default output size). ``condition_area=None`` conditions on the
    image at the output size (cheaper when training below 1 MP; not what the pipeline does).
    """

    family = "qwen_image_edit"
    pipeline_class_name = "QwenImageEditPipeline"
    conditioning = "image"
    condition_area: int | None = 1024 * 1024  # QwenImageEditPipeline.__call__'s calculate_dimensions target

    def __init__(self, pipe, device=None, max_sequence_length: int | None = None,
                 condition_area: int | None = 1024 * 1024):
        super().__init__(pipe, device, max_sequence_length)
        self.condition_area = condition_area
        self.condition_cache = ConditionCache(self._encode_conditions)

    def condition_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) in pixels at which a ``height`` x ``width`` source image conditions (class docstring)."""
        if self.condition_area is None:
            m = self.vae_scale_factor * 2
            return height // m * m, width // m * m
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

        cond_width, cond_height, _ = calculate_dimensions(self.condition_area, width / height)
        if min(cond_width, cond_height) < 32:
            raise ValueError(f"condition_area={self.condition_area} gives a {cond_width}x{cond_height} px condition "
                             f"for a {width}x{height} image (calculate_dimensions rounds to multiples of 32): give an "
                             "area of at least 32x32 px, or None to condition at the output size")
        return int(cond_height), int(cond_width)

    def _source(self, image: Tensor) -> Image.Image:
        """The source image as the pipeline conditions on it: a PIL image resized to ``condition_size``."""
        height, width = self.condition_size(*image.shape[-2:])
        return self.pipe.image_processor.resize(to_pil(image), height, width)

    def _encode_conditions(self, texts: list[str], images: Tensor) -> list[dict[str, Tensor]]:
        """Per (text, image) pair: the prompt embedding of the text with the image, and the image's packed latents."""
        out = []
        for text, image in zip(texts, images):
            source = self._source(image)
            embeds, mask = self.pipe.encode_prompt(prompt=[text], image=source, device=self.device)
            part = self._unpadded(embeds, mask)[0]
            width, height = source.size
            pixels = self.pipe.image_processor.preprocess(source, height, width).unsqueeze(2)  # (1, 3, 1, H, W)
            latents = self.vae.encode(pixels.to(self.vae.device, self.vae.dtype)).latent_dist.mode()
            mean, std = self._latent_statistics(latents)
            part["image_latents"] = flux_pack_latents(((latents - mean) / std)[:, :, 0]).detach().clone()
            out.append(part)
        return out

    def velocity(self, latents: Tensor, sigma, prompts: Sequence[str], guidance_scale: float = 1.0,
                 images: Tensor | None = None) -> Tensor:
        batch = len(latents)
        if images is None or len(images) != batch:
            raise ValueError(f"{type(self).__name__} edits a source image: velocity needs one image per latent "
                             f"({batch}), got {'none' if images is None else len(images)}")
        prompts = list(prompts)
        if len(prompts) != batch:
            raise ValueError(f"{len(prompts)} prompts for a batch of {batch} latents")
        cfg = guidance_scale > 1.0
        texts, sources = ([""] * batch + prompts, torch.cat([images, images])) if cfg else (prompts, images)
        parts = [self.condition_cache.get([text], image[None]) for text, image in zip(texts, sources)]
        condition = torch.cat([part["image_latents"] for part in parts[-batch:]])
        m = self.vae_scale_factor * 2
        height, width = self.condition_size(*images.shape[-2:])
        return self._denoise(latents, sigma, parts, guidance_scale, condition, (height // m, width // m))

    # -- mmrl plan (mmrl.diffusion.memory_shape) ----------------------------------------------------------
    VISION_PIXELS = 28  # Qwen2.5-VL: 14 px patches merged 2 x 2 per vision token of the prompt

    @classmethod
    def plan_condition(cls, height: int, width: int, multiple: int = 16) -> tuple[int, int]:
        """(height, width) in pixels of the condition at ``condition_area`` (:meth:`condition_size`; None: the
        output's size in multiples of ``multiple``, the VAE's factor x the 2x2 packing)."""
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

        if cls.condition_area is None:
            return height // multiple * multiple, width // multiple * multiple

        cond_width, cond_height, _ = calculate_dimensions(cls.condition_area, width / height)
        return int(cond_height), int(cond_width)

    @classmethod
    def plan_inputs(cls, configs: dict, batch: int, latent_shape: tuple, text_tokens: int, dtype, device,
                    condition_grid: tuple[int, int] | None = None) -> dict:
        """Qwen-Image's call with the source image's latent tokens at ``condition_area`` appended, and the
        prompt embedding holding the image's vision tokens (Qwen2.5-VL's, one per 28 x 28 px) before the text."""
        f = 2 ** len(configs["vae"]["temperal_downsample"])  # the pipeline's vae_scale_factor
        cond_h, cond_w = cls.plan_condition(*(f * n for n in latent_shape[-2:]), 2 * f)
        vision = round(cond_h / cls.VISION_PIXELS) * round(cond_w / cls.VISION_PIXELS)
        return super().plan_inputs(configs, batch, latent_shape, text_tokens + vision, dtype, device,
                                   (cond_h // (2 * f), cond_w // (2 * f)))
