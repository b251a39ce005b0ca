"""Tiny random Qwen-Image and Qwen-Image-Edit pipelines built locally, no downloads.

The configs are diffusers' own ``get_dummy_components`` (tests/pipelines/qwenimage/test_qwenimage.py and
test_qwenimage_edit.py): a 2-block ``QwenImageTransformer2DModel`` of width 48, a Qwen2.5-VL text encoder of
width 16, an ``AutoencoderKLQwenImage`` with 4 latent channels and 4x downsampling (32 px -> 8x8 latents -> 16
packed tokens). Differences, each on purpose:

- the tokenizer is a ``Qwen2Tokenizer`` built here (byte-level BPE trained on the pipelines' prompt templates,
  so the templates' words are single tokens as in Qwen's vocabulary: the system prefix is 34 tokens, the edit
  template's 64, exactly the pipelines' ``prompt_template_encode_start_idx``), not fetched from the hub;
- the edit pipeline's ``Qwen2VLProcessor`` wraps that tokenizer and a Qwen2-VL image processor with a small
  pixel budget (56x56 to 112x112 px: 4 to 16 vision tokens);
- the VAE's ``latents_mean`` / ``latents_std`` are not 0 / 1, so that the (de)normalisation is exercised;
- the scheduler is Qwen-Image's own (``Qwen/Qwen-Image`` scheduler_config.json: dynamic exponential shift,
  ``shift_terminal`` 0.02).
"""

from __future__ import annotations

from pathlib import Path

import torch

# The words of QwenImagePipeline's and QwenImageEditPipeline's prompt templates and of the tests' prompts: the
# tokenizer learns them as tokens, as Qwen's vocabulary has them.
_CORPUS = [
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n"
    "<|im_start|>assistant\n",
    "a red cat", "two dogs on grass", "a blue square left of a green circle", "make the square red",
    "add a yellow triangle", "move the circle to the right",
]
# Qwen/Qwen-Image scheduler/scheduler_config.json
QWEN_IMAGE_SCHEDULER = dict(
    base_image_seq_len=256, base_shift=0.5, max_image_seq_len=8192, max_shift=0.9, num_train_timesteps=1000,
    shift=1.0, shift_terminal=0.02, time_shift_type="exponential", use_dynamic_shifting=True,
)
LATENTS_MEAN = [-0.1, 0.05, 0.2, -0.3]
LATENTS_STD = [0.8, 1.2, 0.6, 1.5]


def qwen_tokenizer(vocab_size: int = 1024):
    """A ``Qwen2Tokenizer`` (byte-level BPE with Qwen's special tokens) trained on the templates' words."""
    import json

    from transformers import Qwen2Tokenizer

    from mmrl.vlm.tiny import SPECIAL_TOKENS, build_tokenizer

    trained = json.loads(build_tokenizer(_CORPUS, vocab_size=vocab_size).backend_tokenizer.to_str())["model"]
    tok = Qwen2Tokenizer(vocab=trained["vocab"], merges=[tuple(m) for m in trained["merges"]], unk_token=None,
                         eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    return tok


def qwen_processor(tokenizer):
    """Qwen2-VL's processor around ``tokenizer``, 56x56 to 112x112 px per image."""
    from transformers import Qwen2VLProcessor, Qwen2VLVideoProcessor

    try:
        from transformers import Qwen2VLImageProcessorPil as ImageProcessor
    except ImportError:  # older transformers: the slow processor is the PIL one
        from transformers import Qwen2VLImageProcessor as ImageProcessor
    return Qwen2VLProcessor(image_processor=ImageProcessor(min_pixels=56 * 56, max_pixels=112 * 112),
                            tokenizer=tokenizer, video_processor=Qwen2VLVideoProcessor())


def _text_encoder(tokenizer):
    """diffusers' tiny Qwen2.5-VL (width 16, 2 layers, 2-layer vision tower), sized to ``tokenizer``."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in
           ("<|endoftext|>", "<|im_end|>", "<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")}
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=16, intermediate_size=16, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [1, 1, 2]},
            bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(depth=2, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=16),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def _components(tokenizer) -> dict:
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel

    torch.manual_seed(0)
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=3,
        joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4),
    )
    torch.manual_seed(1)
    vae = AutoencoderKLQwenImage(base_dim=4 * 6, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                 temperal_downsample=[False, True], latents_mean=LATENTS_MEAN, latents_std=LATENTS_STD)
    torch.manual_seed(2)
    return dict(transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER),
                text_encoder=_text_encoder(tokenizer), tokenizer=tokenizer)


def build_tiny_qwen_image(path) -> Path:
    """QwenImagePipeline, saved at ``path``: 32 px -> latents (4, 8, 8) -> 16 packed tokens."""
    from diffusers import QwenImagePipeline

    QwenImagePipeline(**_components(qwen_tokenizer())).save_pretrained(path)
    return Path(path)


def build_tiny_qwen_image_edit(path) -> Path:
    """QwenImageEditPipeline (the same components and a Qwen2-VL processor), saved at ``path``."""
    from diffusers import QwenImageEditPipeline

    tokenizer = qwen_tokenizer()
    QwenImageEditPipeline(processor=qwen_processor(tokenizer), **_components(tokenizer)).save_pretrained(path)
    return Path(path)
