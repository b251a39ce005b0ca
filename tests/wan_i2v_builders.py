"""Tiny randomly initialised Wan image-to-video pipelines, built locally (no downloads).

The configs are diffusers' own ``get_dummy_components`` of ``tests/pipelines/wan/test_wan_image_to_video.py``
(Wan 2.1 I2V: a 36-channel transformer with ``image_dim``, a CLIP vision encoder and its processor;
``CLIPVisionModel``, the class the pipeline declares, where the dummy uses the projection variant) and of
``test_wan_22_image_to_video.py``'s ``Wan225BImageToVideoPipelineFastTests`` (Wan 2.2 TI2V-5B: the
48-channel Wan 2.2 VAE with 16x spatial compression, ``expand_timesteps``) and
``Wan22ImageToVideoPipelineFastTests`` (Wan 2.2 I2V A14B: two experts, no image encoder), except that the text encoder
is a tiny UMT5 with a locally built tokenizer (as ``tests/diffusion_fixtures.build_tiny_wan``) and the
scheduler is the flow-matching Euler one mmrl samples with. Each builder saves the pipeline with
``save_pretrained(dir)`` and returns ``dir``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mmrl.bench.shaped_generator import t5_tokenizer


def _umt5():
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(UMT5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
        dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    ))


def _transformer(channels_in: int, channels_out: int, image_dim: int | None):
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=channels_in,
        out_channels=channels_out, text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32, image_dim=image_dim,
    )


def build_tiny_wan21_i2v(path, shift: float = 7.0) -> Path:
    """Wan 2.1 I2V: VAE z 16 (8x spatial, 4x temporal), transformer 36 -> 16 channels with CLIP image
    features (image_dim 4, a 32-px CLIP vision tower): 9 frames of 16x16 -> latents (16, 3, 2, 2)."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    torch.manual_seed(1)
    text_encoder = _umt5()
    torch.manual_seed(2)
    transformer = _transformer(36, 16, image_dim=4)
    torch.manual_seed(3)
    image_encoder = CLIPVisionModel(CLIPVisionConfig(
        hidden_size=4, projection_dim=4, num_hidden_layers=2, num_attention_heads=2, image_size=32,
        intermediate_size=16, patch_size=1,
    ))
    pipe = WanImageToVideoPipeline(
        tokenizer=t5_tokenizer(), text_encoder=text_encoder, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=shift),
        image_processor=CLIPImageProcessor(crop_size=32, size=32),
        image_encoder=image_encoder, transformer=transformer,
    )
    pipe.save_pretrained(path)
    return Path(path)


def build_tiny_wan22_ti2v(path, shift: float = 5.0) -> Path:
    """Wan 2.2 TI2V-5B shape: the Wan 2.2 VAE (z 48, patchified, 16x spatial), a 48 -> 48 transformer,
    no image encoder, ``expand_timesteps``: 9 frames of 32x32 -> latents (48, 3, 2, 2)."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline

    torch.manual_seed(0)
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=48, in_channels=12, out_channels=12, is_residual=True, patch_size=2,
        latents_mean=[0.0] * 48, latents_std=[1.0] * 48, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        scale_factor_spatial=16, scale_factor_temporal=4, temperal_downsample=[False, True, True],
    )
    torch.manual_seed(1)
    text_encoder = _umt5()
    torch.manual_seed(2)
    transformer = _transformer(48, 48, image_dim=None)
    pipe = WanImageToVideoPipeline(
        tokenizer=t5_tokenizer(), text_encoder=text_encoder, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=shift), transformer=transformer, expand_timesteps=True,
    )
    pipe.save_pretrained(path)
    return Path(path)


def build_tiny_wan22_i2v_a14b(path, shift: float = 3.0, boundary_ratio: float = 0.875) -> Path:
    """Wan 2.2 I2V A14B shape (``Wan22ImageToVideoPipelineFastTests``): two 36 -> 16 experts split at
    ``boundary_ratio``, no image encoder; 9 frames of 16x16 -> latents (16, 3, 2, 2). At shift 3 and 3 steps
    the timesteps are 1000, 857, 600: one high-noise step, two low-noise ones."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    torch.manual_seed(1)
    text_encoder = _umt5()
    torch.manual_seed(2)
    transformer = _transformer(36, 16, image_dim=None)
    torch.manual_seed(3)
    transformer_2 = _transformer(36, 16, image_dim=None)
    pipe = WanImageToVideoPipeline(
        tokenizer=t5_tokenizer(), text_encoder=text_encoder, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=shift), transformer=transformer, transformer_2=transformer_2,
        boundary_ratio=boundary_ratio,
    )
    pipe.save_pretrained(path)
    return Path(path)
