"""The built-in tiny video generator: a Wan-architecture text-to-video flow transformer in pixel space.

Real classes with small configs, built locally (no hub): diffusers' ``WanTransformer3DModel`` (the
DiT of Wan 2.1: 3-D patches, 3-D RoPE, cross-attention to the text) predicts the flow, transformers'
``UMT5EncoderModel`` (Wan's text encoder family) encodes the prompt through a word-level tokenizer
over the synthetic prompts' words, and ``FlowMatchEulerDiscreteScheduler`` gives the sigmas. Like the
tiny image generator (:mod:`mmrl.diffusion.tiny`) it works in pixel space with no VAE: a clip of
4 frames of 16x16 is already as small as a Wan latent, so latents are ``(3, F, H, W)`` in [-1, 1],
the layout Wan's transformer takes, and ``decode`` gives ``(B, F, 3, H, W)`` as the Wan adapter does.

Pretrained by :func:`mmrl.diffusion.pretrain.pretrain_tiny_video_generator` on the clips of
:mod:`mmrl.data.motion_t2v` ("a red circle moving left") whose captions name the wrong direction
half the time, so it draws moving shapes but follows the prompt's direction only about half the
time; RL with the ``motion`` reward closes that gap (``configs/diffusion/motion_t2v_tiny.yaml``).

The same weights do image-to-video (``model.path=tiny-i2v``, or ``"conditioning": "first_frame"`` in a
directory's ``mmrl_generator.json``): the given first frame replaces the first frame of the
transformer's input with timestep 0 on its tokens, and its velocity is pinned to land on the given
frame, as Wan 2.2 TI2V conditions (:mod:`mmrl.diffusion.first_frame`). No new asset: Wan's
transformer takes a timestep per token. The weights never saw a clean frame beside noisy ones; measured
(docs/generators.md, "Image-to-video"), the clip starts on the given frame and moves the right way
three times as often as from text alone, and keeps the object in the later frames no better.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from ..data.motion_t2v import CLIP_SIZE, DIRECTIONS, NUM_FRAMES
from ..data.shapes_t2i import COLORS, SHAPES
from .first_frame import pinned_velocity, token_timesteps, with_first_frame
from .tiny import MARKER, MAX_PROMPT_TOKENS, TinyFlowPipeline, build_tokenizer, save_tiny

FAMILY = "tiny-wan"
FIRST_FRAME = "first_frame"  # the one conditioning the tiny video generator takes
VIDEO_WORDS = ["a", *COLORS, *SHAPES, "moving", *DIRECTIONS]


def tiny_video_configs(heads: int = 2, head_dim: int = 32, layers: int = 2, text_dim: int = 32,
                       patch_size: int = 2) -> dict:
    """Configs of the tiny video generator's models (sizes chosen so RL runs on a 2-core CPU)."""
    from transformers import UMT5Config

    width = heads * head_dim
    transformer = dict(patch_size=(1, patch_size, patch_size), num_attention_heads=heads, attention_head_dim=head_dim,
                       in_channels=3, out_channels=3, text_dim=text_dim, freq_dim=64, ffn_dim=2 * width,
                       num_layers=layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
    text = UMT5Config(vocab_size=len(VIDEO_WORDS) + 3, d_model=text_dim, d_kv=text_dim // 2, d_ff=2 * text_dim,
                      num_layers=2, num_heads=2, relative_attention_num_buckets=8, dropout_rate=0.0,
                      pad_token_id=0, eos_token_id=2, decoder_start_token_id=0)
    return {"transformer": transformer, "text_encoder": text}


def new_tiny_video_models(seed: int = 0, **sizes):
    """Randomly initialised (transformer, text encoder, tokenizer, scheduler)."""
    return TinyWanPipeline.new_models(tiny_video_configs(**sizes), build_tokenizer(VIDEO_WORDS), seed)


def save_tiny_video(out: Path, transformer, text_encoder, tokenizer, scheduler, info: dict | None = None,
                    size: int = CLIP_SIZE, num_frames: int = NUM_FRAMES) -> Path:
    return save_tiny(out, transformer, text_encoder, tokenizer, scheduler,
                     {"family": FAMILY, "height": size, "width": size, "num_frames": num_frames, **(info or {})})


class TinyWanPipeline(TinyFlowPipeline):
    """The tiny video generator behind the :class:`FlowPipeline` contract."""

    family = FAMILY
    is_video = True
    lora_targets = ["to_q", "to_k", "to_v", "to_out.0"]  # WanAttention: self- (attn1) and cross-attention (attn2)
    transformer_class = "WanTransformer3DModel"
    text_encoder_class = "UMT5EncoderModel"
    conditionings = (None, FIRST_FRAME)

    def __init__(self, transformer, text_encoder, tokenizer, scheduler, info: dict | None = None):
        super().__init__(transformer, text_encoder, tokenizer, scheduler, info)
        self.default_height = int(self.info.get("height", CLIP_SIZE))
        self.default_width = int(self.info.get("width", CLIP_SIZE))
        self.default_num_frames = int(self.info.get("num_frames", NUM_FRAMES))

    def condition_on(self, conditioning: str) -> None:
        """Generate from a given first frame (image-to-video) from now on (module docstring)."""
        if conditioning != FIRST_FRAME:
            raise ValueError(f"{MARKER}: conditioning {conditioning!r} is not one the tiny video generator takes; "
                             f"use {FIRST_FRAME!r} (image-to-video) or leave it out (text-to-video)")
        self.conditioning = conditioning

    def encode_text(self, prompts) -> dict[str, Tensor]:
        ids = self.tokenize(prompts)
        return {"hidden": self.text_encoder(input_ids=ids).last_hidden_state}

    def transformer_output(self, latents: Tensor, timestep: Tensor, embeds: dict[str, Tensor]) -> Tensor:
        """Image-to-video: ``embeds["image"]``, the first frames in [-1, 1] (B, 3, H, W) that the shared
        ``velocity`` adds, replace the first frame, whose tokens get timestep 0."""
        if "image" in embeds:
            latents = with_first_frame(latents, embeds["image"][:, :, None])
            timestep = token_timesteps(timestep, latents, tuple(self.transformer.config.patch_size[1:]))
        return self.transformer(hidden_states=latents, timestep=timestep, encoder_hidden_states=embeds["hidden"],
                                return_dict=False)[0]

    def velocity(self, latents: Tensor, sigma: Tensor, prompts, guidance_scale: float = 1.0,
                 images: Tensor | None = None) -> Tensor:
        """Text-to-video, or image-to-video (``conditioning``) given ``images`` (B, 3, H, W) in [0, 1], the
        first frames: the transformer sees them as the first frame (``transformer_output``; guidance's
        unconditional branch keeps them) and the first frame's velocity is pinned to them."""
        v = super().velocity(latents, sigma, prompts, guidance_scale, images)
        if images is None:
            return v
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=latents.device).expand(latents.shape[0])
        return pinned_velocity(v, latents, self.encode_images(images.to(latents.device))[:, :, None], sigma)

    def final_latents(self, latents: Tensor, images: Tensor | None = None) -> Tensor:
        """Image-to-video: the given frames put back over the first frame, as Wan 2.2 TI2V's pipeline does."""
        if images is None:
            return latents
        return with_first_frame(latents, self.encode_images(images.to(latents.device))[:, :, None])

    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        frames = self.default_num_frames if num_frames is None else int(num_frames)
        return (self.transformer.config.in_channels, frames, height, width)

    def decode(self, latents: Tensor) -> Tensor:
        """(B, 3, F, H, W) in [-1, 1] -> clips (B, F, 3, H, W) in [0, 1]."""
        return (latents.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4).contiguous()

    def encode_images(self, clips: Tensor) -> Tensor:
        """The inverse of ``decode``: clips (B, F, 3, H, W) in [0, 1] -> latents (B, 3, F, H, W); a frame
        each (B, 3, H, W) (the first frames of image-to-video) -> (B, 3, H, W) in [-1, 1]."""
        if clips.dim() == 4:
            return clips.float() * 2 - 1
        return (clips.float() * 2 - 1).permute(0, 2, 1, 3, 4).contiguous()


__all__ = ["FAMILY", "FIRST_FRAME", "MAX_PROMPT_TOKENS", "TinyWanPipeline", "new_tiny_video_models", "save_tiny_video",
           "tiny_video_configs"]
