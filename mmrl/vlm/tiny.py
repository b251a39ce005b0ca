"""The built-in tiny vision-language model: a real Qwen2.5-VL architecture with a small config.

Everything is built locally (no hub access): a byte-level BPE tokenizer trained on the text the
synthetic tasks produce, the Qwen2-VL image processor, the Qwen2.5-VL chat template, and a
randomly initialised ``Qwen2_5_VLForConditionalGeneration``. The result is saved as an ordinary
transformers checkpoint directory, so the tiny model and a real one load through the same code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch

# The special tokens of the Qwen2-VL / Qwen2.5-VL vocabulary that the processor and template use.
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Qwen2.5-VL's own chat template (images and videos as content items, default system prompt).
QWEN_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Image budget of the tiny default: 112x112 pixels -> 8x8 patches of 14 px -> 16 merged tokens.
TINY_IMAGE_SIZE = 112
TINY_MIN_PIXELS = 56 * 56
TINY_MAX_PIXELS = 112 * 112


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 1024):
    """Train a byte-level BPE tokenizer (Qwen's tokenizer family) on ``corpus``.

    Byte-level means any string can be encoded, so rewards and parsers see the same kind of
    arbitrary text a real model produces.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(sorted(set(corpus)), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        model_max_length=4096,
    )
    fast.chat_template = QWEN_CHAT_TEMPLATE
    return fast


def build_processor(tokenizer):
    """mmrl's :class:`VLMProcessor` around ``tokenizer`` and the real Qwen2-VL image processor."""
    try:
        from transformers import Qwen2VLImageProcessorPil as ImageProcessor
    except ImportError:  # older transformers: the slow processor is the PIL one
        from transformers import Qwen2VLImageProcessor as ImageProcessor
    from .processing import VLMProcessor

    image_processor = ImageProcessor(min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS)
    return VLMProcessor(tokenizer, image_processor, QWEN_CHAT_TEMPLATE)


def build_model(tokenizer, seed: int = 0, hidden_size: int = 128, layers: int = 4):
    """A randomly initialised Qwen2.5-VL with a small config, sized to ``tokenizer``."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    heads = 4
    head_dim = hidden_size // heads
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=hidden_size * 3,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                # M-RoPE splits head_dim/2 frequencies over (time, height, width).
                "mrope_section": [head_dim // 8, head_dim * 3 // 16, head_dim * 3 // 16],
            },
            tie_word_embeddings=True,
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(
            depth=2,
            hidden_size=64,
            intermediate_size=128,
            num_heads=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=56,
            out_hidden_size=hidden_size,
            fullatt_block_indexes=[1],
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    # As in Qwen's own generation_config: either end-of-turn or end-of-text stops a completion.
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.generation_config.bos_token_id = ids["<|endoftext|>"]
    return model


def save_tiny(model, processor, path: str | Path) -> Path:
    """Save model and processor as an ordinary transformers checkpoint directory."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    processor.save_pretrained(path)
    return path
