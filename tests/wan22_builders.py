"""A tiny random Wan 2.2 A14B-shaped pipeline (``WanPipeline`` with two noise-level experts) built locally.

The shapes follow diffusers' own ``tests/pipelines/wan/test_wan_22.py`` ``Wan22PipelineFastTests``
``get_dummy_components``: the Wan VAE (8x spatial, 4x temporal, 16 latent channels), a UMT5 text encoder of
width 32, two ``WanTransformer3DModel`` experts of 2 layers and ``boundary_ratio=0.875`` (Wan2.2-T2V-A14B's).
Differences, each for a reason: the tokenizer is built here (the hub's tiny T5 is not reachable); the two
experts get different seeds (diffusers' test seeds both 0, so it cannot tell them apart); the scheduler is
``FlowMatchEulerDiscreteScheduler(shift=3.0)`` instead of UniPC with ``flow_shift=3.0`` (the same sigmas; Euler,
so that the pipeline's ``__call__`` is the deterministic loop mmrl samples with). With 3 or 4 steps the first
step (t = 1000) is the high-noise expert's and the rest (t = 750 / 857 and below) the low-noise one's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmrl.bench.shaped_generator import t5_tokenizer

BOUNDARY_RATIO = 0.875  # Wan2.2-T2V-A14B's model_index.json


def tiny_wan_expert(seed: int):
    """diffusers' dummy Wan 2.2 expert (``WanTransformer3DModel``, 2 layers, width 24)."""
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )


def build_tiny_wan22(path, boundary_ratio: float = BOUNDARY_RATIO, shift: float = 3.0) -> Path:
    """``WanPipeline`` with ``transformer`` (high noise), ``transformer_2`` (low noise) and ``boundary_ratio``,
    saved at ``path``: 9 frames of 16x16 -> latents (16, 3, 2, 2)."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    torch.manual_seed(1)
    text_encoder = UMT5EncoderModel(UMT5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
        dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    ))
    pipe = WanPipeline(
        tokenizer=t5_tokenizer(), text_encoder=text_encoder, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=shift), transformer=tiny_wan_expert(2),
        transformer_2=tiny_wan_expert(3), boundary_ratio=boundary_ratio,
    )
    pipe.save_pretrained(path)
    return Path(path)


@pytest.fixture(scope="session")
def wan22_dir(tmp_path_factory):
    return build_tiny_wan22(tmp_path_factory.mktemp("tiny-wan22"))
