"""A tiny random Z-Image pipeline (``ZImagePipeline``) built locally, no downloads.

The shapes follow diffusers' own ``tests/pipelines/z_image/test_z_image.py`` ``get_dummy_components``
(a 2-layer ``ZImageTransformer2DModel`` of width 32 with one noise / context refiner layer, a Qwen3
text encoder of width 16 feeding ``cap_feat_dim=16``, FLUX's 16-channel VAE scaling), except that
the tokenizer is a byte-level BPE trained here with Qwen3's chat template (the hub's Qwen tokenizer is
not reachable) and the VAE is narrower (scale factor 2: 16 px -> 8x8 latents -> 16 tokens of 2x2
patches). The scheduler is Z-Image-Turbo's (``FlowMatchEulerDiscreteScheduler(shift=3.0)``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# Qwen3's chat template, the part a one-message prompt uses: ``enable_thinking=False`` adds the empty
# think block (ZImagePipeline passes ``enable_thinking=True``: no block).
QWEN3_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)

CORPUS = ["a red cat", "two dogs on grass", "blue sky at night", "a photo of a green apple", "dance monkey",
          "user assistant system"]


def qwen3_tokenizer():
    """A byte-level BPE tokenizer (Qwen's family) over a few prompts, with Qwen3's chat template,
    padded on the right as Qwen3's."""
    from mmrl.vlm.tiny import build_tokenizer

    tokenizer = build_tokenizer(CORPUS, vocab_size=300)
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    tokenizer.padding_side = "right"
    return tokenizer


def tiny_z_image_transformer(seed: int = 0):
    """diffusers' dummy ``ZImageTransformer2DModel`` (pad tokens fixed, as its test does: they are
    ``torch.empty``)."""
    from diffusers import ZImageTransformer2DModel

    torch.manual_seed(seed)
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32, n_layers=2, n_refiner_layers=1,
        n_heads=2, n_kv_heads=2, norm_eps=1e-5, qk_norm=True, cap_feat_dim=16, rope_theta=256.0, t_scale=1000.0,
        axes_dims=[8, 4, 4], axes_lens=[256, 32, 32],
    )
    with torch.no_grad():
        transformer.x_pad_token.copy_(torch.ones_like(transformer.x_pad_token))
        transformer.cap_pad_token.copy_(torch.ones_like(transformer.cap_pad_token))
    return transformer


def build_tiny_z_image(path, shift: float = 3.0) -> Path:
    """``ZImagePipeline`` saved at ``path``: Qwen3 (2 layers, width 16) + Z-Image transformer + a
    16-channel AutoencoderKL with scale factor 2 (Z-Image's 16 px -> latents (16, 8, 8))."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline
    from transformers import Qwen3Config, Qwen3Model

    transformer = tiny_z_image_transformer()
    torch.manual_seed(1)
    vae = AutoencoderKL(
        sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4, 8),
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), layers_per_block=1, latent_channels=16,
        norm_num_groups=1, scaling_factor=0.3611, shift_factor=0.1159,
    )
    tokenizer = qwen3_tokenizer()
    torch.manual_seed(2)
    text_encoder = Qwen3Model(Qwen3Config(
        hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        head_dim=8, vocab_size=len(tokenizer), max_position_embeddings=512,
    ))
    pipe = ZImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=shift), vae=vae, text_encoder=text_encoder,
                          tokenizer=tokenizer, transformer=transformer)
    pipe.save_pretrained(path)
    return Path(path)


@pytest.fixture(scope="session")
def z_image_dir(tmp_path_factory):
    return build_tiny_z_image(tmp_path_factory.mktemp("tiny-z-image"))
