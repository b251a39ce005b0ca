"""Wan image-to-video (``WanImageToVideoPipeline``) as a FlowPipeline conditioned on the first frame."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ..base import ConditionCache
from ..conditions import to_pil
from ..first_frame import pinned_velocity, token_timesteps, with_first_frame
from .wan import WanAdapter


class WanI2VAdapter(WanAdapter):
    """``WanImageToVideoPipeline``: the text-to-video Wan adapter given the first frame (``images``).

    Two checkpoint shapes, as the pipeline's ``__call__`` branches:

    - Wan 2.1 I2V 14B (480P / 720P; transformer ``in_channels`` 36, ``image_dim`` set): the frame
      followed by ``num_frames - 1`` black frames goes through the Wan VAE (its latent mode,
      normalised by ``latents_mean`` / ``latents_std``); 4 temporal-mask channels (1 on the first
      latent frame) and those 16 channels are concatenated on channels to the noisy latents, and the
      CLIP image encoder's penultimate hidden states are ``encoder_hidden_states_image``.
    - ``expand_timesteps`` (Wan 2.2 TI2V-5B, its ``model_index.json`` ``_class_name`` set to this
      pipeline): the frame's latent replaces the first latent frame, whose tokens get timestep 0,
      and its velocity is pinned to it (:mod:`mmrl.diffusion.first_frame`).

    Both are cached per image with a :class:`ConditionCache` (the VAE and CLIP encoders run once per
    first frame, keyed also by the frame count, which shapes the conditioning video). Guidance's
    unconditional branch is the empty prompt with the same image, as the pipeline's (with
    ``negative_prompt=""``). Wan 2.2 I2V A14B (two experts, ``transformer_2`` / ``boundary_ratio``, no CLIP)
    goes through the text-to-video adapter's expert routing and ``guide`` (``guidance_scale_2``).
    Not covered: ``last_image`` (first-last-frame).
    The CLIP encoder sees the frame at the output size (the policy resizes it), where the pipeline
    resizes the original image for CLIP: the same only when the frame is given at the output size.
    """

    family = "wan-i2v"
    pipeline_class_name = "WanImageToVideoPipeline"
    conditioning = "first_frame"

    def __init__(self, pipe, device=None, max_sequence_length: int | None = None):
        super().__init__(pipe, device, max_sequence_length)
        self.uses_image_encoder = self.transformer_config.get("image_dim") is not None
        if self.uses_image_encoder and (pipe.image_encoder is None or pipe.image_processor is None):
            raise ValueError("this Wan image-to-video transformer takes CLIP image features (transformer config "
                             "image_dim is set) but the pipeline directory has no image_encoder / image_processor: "
                             "download the checkpoint's image_encoder/ and image_processor/ folders too")
        self.condition_cache = ConditionCache(self._encode_conditions)

    def _encode_conditions(self, keys: list[str], images: Tensor) -> list[dict[str, Tensor]]:
        """Per first frame: ``first`` (its latent, expand_timesteps) or ``condition`` (mask + latents of the
        frame and black frames) and ``image_embeds`` (CLIP). ``keys`` are ``"frames=N"``."""
        from diffusers.pipelines.wan.pipeline_wan_i2v import retrieve_latents

        out = []
        vae = self.vae
        mean, std = self._latent_statistics(torch.empty(0, device=self.device))  # float32, as the pipeline's
        inv_std = 1.0 / std
        for key, image in zip(keys, images):
            frames = int(key.removeprefix("frames="))
            pixels = (image.float() * 2 - 1)[None, :, None].to(self.device)  # (1, 3, 1, H, W) in [-1, 1]
            if not self.expand_timesteps:  # the frame, then black frames
                pixels = torch.cat([pixels, pixels.new_zeros(1, 3, frames - 1, *pixels.shape[-2:])], dim=2)
            latent = retrieve_latents(vae.encode(pixels.to(vae.device, vae.dtype)), sample_mode="argmax").float()
            latent = (latent - mean.to(latent.device)) * inv_std.to(latent.device)
            if self.expand_timesteps:
                out.append({"first": latent})
                continue
            mask = torch.zeros(1, self.vae_scale_factor_temporal, *latent.shape[2:], device=latent.device)
            mask[:, :, 0] = 1  # the pipeline's mask_lat_size: the first frame, repeated over the temporal factor
            entry = {"condition": torch.cat([mask, latent], dim=1)}
            if self.uses_image_encoder:
                entry["image_embeds"] = self.pipe.encode_image(to_pil(image), self.device).float()
            out.append(entry)
        return out

    def velocity(self, latents: Tensor, sigma, prompts: Sequence[str], guidance_scale: float = 1.0,
                 images: Tensor | None = None) -> Tensor:
        if images is None:
            raise ValueError("the Wan image-to-video model needs the first frame of every clip (images=)")
        batch = latents.shape[0]
        cfg = guidance_scale > 1.0
        cond = {k: v.to(self.device, self.dtype) for k, v in self._conditions(latents, images).items()}
        s = self._sigma(sigma, batch)
        timestep = s * self.num_train_timesteps
        emb = self._embeddings(prompts, batch, cfg)
        x = latents.to(self.device, self.dtype)
        if self.expand_timesteps:
            x = with_first_frame(x, cond["first"])
            timestep = token_timesteps(timestep, x, tuple(self.transformer_config.patch_size[1:]))
        else:
            x = torch.cat([x, cond["condition"]], dim=1)
        image_embeds = cond.get("image_embeds")
        if cfg:
            x, timestep = torch.cat([x, x]), torch.cat([timestep, timestep])
            image_embeds = None if image_embeds is None else torch.cat([image_embeds, image_embeds])
        out = self.transformer(
            hidden_states=x, timestep=timestep, encoder_hidden_states=emb["prompt_embeds"],
            encoder_hidden_states_image=image_embeds, return_dict=False,
        )[0].float()
        v = self.guide(out, timestep[:batch], guidance_scale) if cfg else out
        return pinned_velocity(v, latents, cond["first"], s) if self.expand_timesteps else v

    def final_latents(self, latents: Tensor, images: Tensor | None = None) -> Tensor:
        """Wan 2.2 TI2V (``expand_timesteps``): the given frame's latent put back over the first latent frame
        before decoding, as ``WanImageToVideoPipeline`` does; Wan 2.1 / 2.2 I2V leave the latents as sampled."""
        if not self.expand_timesteps or images is None:
            return latents
        return with_first_frame(latents, self._conditions(latents, images)["first"].to(latents.device)).float()

    def _conditions(self, latents: Tensor, images: Tensor) -> dict[str, Tensor]:
        """The cached conditions of ``images`` for clips of ``latents``' frame count (the cache key)."""
        frames = (latents.shape[2] - 1) * self.vae_scale_factor_temporal + 1
        return self.condition_cache.get([f"frames={frames}"] * latents.shape[0], images)

    # -- mmrl plan (mmrl.diffusion.memory_shape) ----------------------------------------------------------
    CLIP_TOKENS = 257  # Wan 2.1 I2V's CLIP ViT-H/14 at 224 px: 16 x 16 patches and the class token

    @classmethod
    def plan_latent_shape(cls, configs: dict, height: int, width: int, num_frames: int | None = None) -> tuple:
        """:meth:`latent_shape` from the components' configs: the VAE's channels (the noisy latents)."""
        return (int(configs["vae"]["z_dim"]), *super().plan_latent_shape(configs, height, width, num_frames)[1:])

    @classmethod
    def plan_inputs(cls, configs: dict, batch: int, latent_shape: tuple, text_tokens: int, dtype, device) -> dict:
        """Wan's call with the condition channels and, when the transformer takes them, the CLIP image features."""
        config = configs["transformer"]
        inputs = super().plan_inputs(configs, batch, latent_shape, text_tokens, dtype, device)
        if config.get("image_dim") is not None:
            inputs["encoder_hidden_states_image"] = torch.randn(batch, cls.CLIP_TOKENS, int(config["image_dim"]),
                                                                device=device, dtype=dtype)
        return inputs
