"""Tiny randomly initialised generators built locally, no downloads: diffusers pipelines (SD3, FLUX,
Wan) and mmrl's own tiny flow generator (``build_tiny_flow``).

The configs follow diffusers' own ``get_dummy_components`` in its pipeline tests, except that the
tokenizers are built here from a few-dozen-token vocabulary instead of being fetched from the hub,
and the VAEs downsample (scale factor 2 for the image VAEs) so that the adapters' scale-factor
arithmetic is exercised. Each ``build_tiny_*`` saves the pipeline with ``save_pretrained(dir)``
and returns ``dir``. The fixtures at the end (``sd3_dir``, ``wan_dir``, ``tiny_flow_dir`` ...) are
registered for every test by ``tests/conftest.py`` (``pytest_plugins``); each generator is built once
a session, and only when a test asks for it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmrl.bench.shaped_generator import TINY_TRANSFORMER, clip_tokenizer, t5_tokenizer


def _clip_config(eos_token_id: int = 1):
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        bos_token_id=0, eos_token_id=eos_token_id, pad_token_id=1, hidden_size=32, intermediate_size=37,
        layer_norm_eps=1e-05, num_attention_heads=4, num_hidden_layers=2, vocab_size=100, hidden_act="gelu",
        projection_dim=32, max_position_embeddings=77,
    )


def _t5_config():
    from transformers import T5Config

    return T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
        dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )


def _image_vae(latent_channels: int):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4, 8),
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), layers_per_block=1,
        latent_channels=latent_channels, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
        shift_factor=0.0609, scaling_factor=1.5035,
    )


def build_tiny_sd3(path, shift: float = 3.0) -> Path:
    """StableDiffusion3Pipeline: 2 CLIPs + T5, MMDiT with patch 2, VAE scale factor 2 (16 px -> 8x8 latents)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection, T5EncoderModel

    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(**TINY_TRANSFORMER)
    torch.manual_seed(1)
    text_encoder = CLIPTextModelWithProjection(_clip_config())
    torch.manual_seed(2)
    text_encoder_2 = CLIPTextModelWithProjection(_clip_config())
    torch.manual_seed(3)
    text_encoder_3 = T5EncoderModel(_t5_config())
    torch.manual_seed(4)
    vae = _image_vae(latent_channels=4)
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=shift), vae=vae,
        text_encoder=text_encoder, tokenizer=clip_tokenizer(), text_encoder_2=text_encoder_2,
        tokenizer_2=clip_tokenizer(), text_encoder_3=text_encoder_3, tokenizer_3=t5_tokenizer(),
    )
    pipe.save_pretrained(path)
    return Path(path)


def build_tiny_flux(path, schnell: bool = False) -> Path:
    """FluxPipeline: CLIP + T5, FLUX transformer, 1-channel VAE with scale factor 2, so 16 px -> latents
    (1, 8, 8) -> 16 packed tokens. FLUX.1-dev style (guidance embedding, dynamic shifting), or with
    ``schnell=True`` FLUX.1-schnell style (no guidance embedding, static shift 1)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5EncoderModel

    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8],
        guidance_embeds=not schnell,
    )
    torch.manual_seed(1)
    text_encoder = CLIPTextModel(_clip_config())
    torch.manual_seed(2)
    text_encoder_2 = T5EncoderModel(_t5_config())
    torch.manual_seed(3)
    vae = _image_vae(latent_channels=1)
    if schnell:
        scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=False)
    else:  # FLUX.1-dev's scheduler: resolution-dependent dynamic shifting
        scheduler = FlowMatchEulerDiscreteScheduler(
            shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
            max_image_seq_len=4096,
        )
    pipe = FluxPipeline(
        transformer=transformer, scheduler=scheduler, vae=vae, text_encoder=text_encoder,
        tokenizer=clip_tokenizer(), text_encoder_2=text_encoder_2, tokenizer_2=t5_tokenizer(),
    )
    pipe.save_pretrained(path)
    return Path(path)


def build_tiny_wan(path) -> Path:
    """WanPipeline (2.1-style): UMT5 + Wan transformer + Wan VAE (8x spatial, 4x temporal), so 9 frames of
    16x16 -> latents (16, 3, 2, 2)."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    torch.manual_seed(1)
    text_encoder = UMT5EncoderModel(UMT5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
        dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    ))
    torch.manual_seed(2)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )
    pipe = WanPipeline(tokenizer=t5_tokenizer(), text_encoder=text_encoder, vae=vae,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), transformer=transformer)
    pipe.save_pretrained(path)
    return Path(path)


def build_tiny_flow(path, prediction: str = "sample") -> Path:
    """mmrl's tiny generator architecture (``model.path=tiny``'s), randomly initialised and smaller:
    SD3 transformer of width 32, one layer, 16x16 pixels in 2-px patches; a directory that
    ``load_generator`` reads like the shipped one."""
    from mmrl.diffusion.tiny import new_tiny_models, save_tiny

    models = new_tiny_models(seed=0, width=32, layers=1, image_size=16, patch_size=2)
    return save_tiny(Path(path), *models, info={"prediction": prediction})


# -- fixtures (registered by tests/conftest.py) ----------------------------------------------------

@pytest.fixture(scope="module")
def one_thread():
    """These models are tiny: a second (shared, contended) thread only adds synchronisation cost."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def sd3_dir(tmp_path_factory):
    return build_tiny_sd3(tmp_path_factory.mktemp("tiny-sd3"))


@pytest.fixture(scope="session")
def flux_dir(tmp_path_factory):
    return build_tiny_flux(tmp_path_factory.mktemp("tiny-flux-dev"))


@pytest.fixture(scope="session")
def schnell_dir(tmp_path_factory):
    return build_tiny_flux(tmp_path_factory.mktemp("tiny-flux-schnell"), schnell=True)


@pytest.fixture(scope="session")
def wan_dir(tmp_path_factory):
    return build_tiny_wan(tmp_path_factory.mktemp("tiny-wan"))


@pytest.fixture(scope="session")
def tiny_flow_dir(tmp_path_factory):
    return build_tiny_flow(tmp_path_factory.mktemp("tiny-flow"))
