"""A Stable-Diffusion-3.5-Medium-shaped diffusers pipeline with random weights, built locally, for
``mmrl bench gpu``'s generator group (and, at tiny sizes, the tests' SD3 pipelines).

Why a shape: nothing here downloads weights, and a step's time and memory depend on the trained
transformer's shape. The transformer is diffusers' ``SD3Transformer2DModel`` with SD3.5-Medium's
config (24 MMDiT blocks of width 1536, 2.2B parameters); the text encoders are one-layer CLIP-L-,
CLIP-G- and T5-shaped models whose outputs have the real widths (prompt embeddings 4096, pooled
2048), since prompt embeddings are cached and only their shapes reach the transformer; the VAE has
SD3's 16 latent channels and 8x downsampling with narrow blocks. The tokenizers are character-level
ones built here (a CLIP BPE tokenizer without merges, a unigram T5 tokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

_CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789")

# stabilityai/stable-diffusion-3.5-medium transformer/config.json, the parts that set the cost.
SD35_MEDIUM_TRANSFORMER = dict(
    sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24, attention_head_dim=64,
    num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536, pooled_projection_dim=2048,
    pos_embed_max_size=384, dual_attention_layers=tuple(range(13)), qk_norm="rms_norm",
)
# diffusers' get_dummy_components sizes: ``--tiny`` and the tests' SD3 pipeline (tests/diffusion_fixtures.py).
TINY_TRANSFORMER = dict(sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=8,
                        num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
                        pooled_projection_dim=64)


def clip_tokenizer(max_length: int = 77):
    """A character-level CLIP BPE tokenizer (no merges): ``<|startoftext|>`` = 0, ``<|endoftext|>`` = 1
    (also pad and unk), then ``a``..``9`` and ``a</w>``..``9</w>``."""
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for suffix in ("", "</w>"):
        for c in _CHARS:
            vocab[c + suffix] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length)


def t5_tokenizer(max_length: int = 64):
    """A unigram T5 tokenizer over single characters: ``<pad>`` = 0, ``</s>`` = 1, ``<unk>`` = 2."""
    from transformers import T5TokenizerFast

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(c, -3.0) for c in _CHARS] + [("\u2581" + c, -2.5) for c in _CHARS]
    return T5TokenizerFast(vocab=pieces, extra_ids=0, model_max_length=max_length)


def _clip(hidden: int, projection: int, layers: int = 1):
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    heads = max(1, hidden // 64)
    return CLIPTextModelWithProjection(CLIPTextConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=hidden, intermediate_size=hidden,
        num_attention_heads=heads, num_hidden_layers=layers, vocab_size=100, projection_dim=projection,
        max_position_embeddings=77, hidden_act="gelu"))


def _t5(d_model: int):
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(vocab_size=100, d_model=d_model, d_kv=64, d_ff=256, num_layers=1, num_heads=8,
                                   relative_attention_num_buckets=8, dropout_rate=0.0, pad_token_id=0,
                                   eos_token_id=1, decoder_start_token_id=0))


def _vae(latent_channels: int, downsamplings: int, width: int):
    from diffusers import AutoencoderKL

    blocks = downsamplings + 1  # AutoencoderKL halves the size after every block but the last
    return AutoencoderKL(
        sample_size=32, in_channels=3, out_channels=3, block_out_channels=(width,) * blocks,
        down_block_types=("DownEncoderBlock2D",) * blocks, up_block_types=("UpDecoderBlock2D",) * blocks,
        layers_per_block=1, latent_channels=latent_channels, norm_num_groups=min(width, 32), use_quant_conv=False,
        use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5305)


def build_sd3_shaped(path: Path, tiny: bool = False, seed: int = 0) -> Path:
    """The SD3.5-Medium-shaped pipeline (``tiny``: the tests' tiny SD3 sizes) saved at ``path``;
    reused when its recorded shape matches. Built on the GPU when there is one, saved in bf16
    (float32 when tiny)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    path = Path(path)
    transformer_cfg = TINY_TRANSFORMER if tiny else SD35_MEDIUM_TRANSFORMER
    shape = {"transformer": {k: list(v) if isinstance(v, tuple) else v for k, v in transformer_cfg.items()},
             "seed": seed}
    marker = path / "mmrl_shape.json"
    if marker.exists() and json.loads(marker.read_text()) == shape:
        return path
    dtype = torch.float32 if tiny else torch.bfloat16
    device = "cuda" if torch.cuda.is_available() and not tiny else "cpu"
    torch.manual_seed(seed)
    with torch.device(device):
        transformer = SD3Transformer2DModel(**transformer_cfg).to(dtype)
        # CLIP-L and CLIP-G widths (768 + 1280 = the pooled 2048), T5's 4096; tiny: 32 / 32 / 32
        clip_l, clip_g = (_clip(32, 32), _clip(32, 32)) if tiny else (_clip(768, 768), _clip(1280, 1280))
        t5 = _t5(32 if tiny else 4096)
        vae = _vae(4 if tiny else 16, 1 if tiny else 3, 8 if tiny else 32)
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae.to(dtype),
        text_encoder=clip_l.to(dtype), tokenizer=clip_tokenizer(), text_encoder_2=clip_g.to(dtype),
        tokenizer_2=clip_tokenizer(), text_encoder_3=t5.to(dtype), tokenizer_3=t5_tokenizer())
    pipe.save_pretrained(path)
    marker.write_text(json.dumps(shape))
    return path
