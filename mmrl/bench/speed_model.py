"""The models ``mmrl bench speed`` runs: the shipped tiny Qwen2.5-VL, or a Qwen2.5-VL-3B-shaped one.

Why a 3B *shape* and not the checkpoint: nothing here downloads weights, and speed and memory
depend on the shapes, not the values. The 3B-shaped model is a real
``Qwen2_5_VLForConditionalGeneration`` with Qwen2.5-VL-3B-Instruct's text and vision dimensions and
random weights, saved with the tiny asset's tokenizer, image processor, chat template and
generation config (its special-token ids copied), so both trainers load it like any checkpoint
directory. Random weights never emit a stop token; the bench forces every completion to full length
anyway. The tiny tokenizer has 1,024 tokens; the model keeps the real 151,936-row vocabulary
(the LM head's cost is part of the shape), and sampled ids beyond the tokenizer decode to nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

# Qwen2.5-VL-3B-Instruct's config.json, the parts that set the cost of a step.
QWEN2_5_VL_3B_TEXT = dict(
    hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
    intermediate_size=11008, vocab_size=151936, max_position_embeddings=128000, rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
    tie_word_embeddings=True, hidden_act="silu",
)
QWEN2_5_VL_3B_VISION = dict(
    depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
    fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2, hidden_act="silu", in_channels=3,
)
# Files of the tiny asset reused as they are (everything but the weights and the model config).
_PROCESSOR_FILES = ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json",
                    "chat_template.jinja", "generation_config.json")
_SPECIAL_IDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def model_dir(shape: str, out_dir: Path) -> Path:
    """The checkpoint directory of ``shape``: the shipped tiny asset, or the 3B-shaped model built
    once under ``out_dir/model-3b`` (reused when its recorded shape matches)."""
    from ..vlm.loading import resolve_model_path

    if shape == "tiny":
        return resolve_model_path("tiny")
    if shape == "3b":
        return build_shaped_model(Path(out_dir) / "model-3b")
    raise ValueError(f"--shape must be tiny or 3b, got {shape!r}")


def build_shaped_model(path: Path, text: dict | None = None, vision: dict | None = None,
                       dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Path:
    """A randomly initialised Qwen2.5-VL with the given text/vision dimensions (default: 3B's),
    saved in ``dtype`` at ``path`` with the tiny asset's processor files. Built on the GPU when
    there is one (initialising 3.8B parameters on a CPU takes minutes)."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    text = {**QWEN2_5_VL_3B_TEXT, **(text or {})}
    vision = {**QWEN2_5_VL_3B_VISION, **(vision or {})}
    path = Path(path)
    shape = {"text": text, "vision": vision, "dtype": str(dtype), "seed": seed}
    marker = path / "speed_shape.json"
    if marker.exists() and (path / "config.json").exists() and json.loads(marker.read_text()) == shape:
        return path
    config = shaped_config(text, vision)
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialise straight in the saved dtype: half the memory
    try:
        with torch.device(device):
            model = Qwen2_5_VLForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(default)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    model.to(dtype).save_pretrained(path, safe_serialization=True)
    del model
    _copy_processor(path)
    marker.write_text(json.dumps(shape, indent=2))
    return path


def shaped_config(text: dict, vision: dict):
    """The Qwen2.5-VL config of the given text/vision dimensions, with the tiny asset's special-token ids."""
    from transformers import Qwen2_5_VLConfig

    from ..vlm.loading import resolve_model_path

    tiny_cfg = json.loads((resolve_model_path("tiny") / "config.json").read_text())
    tiny_text = tiny_cfg["text_config"]
    return Qwen2_5_VLConfig(
        text_config={**text, **{k: tiny_text[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}},
        vision_config=vision, tie_word_embeddings=text["tie_word_embeddings"], **{k: tiny_cfg[k] for k in _SPECIAL_IDS},
    )


def write_shaped_config(path: Path, text: dict | None = None, vision: dict | None = None) -> Path:
    """A checkpoint directory without weights: the shaped model's config.json and the tiny asset's
    processor files, all ``mmrl plan`` reads (default: the 3B shape)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    shaped_config({**QWEN2_5_VL_3B_TEXT, **(text or {})}, {**QWEN2_5_VL_3B_VISION, **(vision or {})}).save_pretrained(path)
    _copy_processor(path)
    return path


def _copy_processor(path: Path) -> None:
    from ..vlm.loading import resolve_model_path

    tiny = resolve_model_path("tiny")
    for name in _PROCESSOR_FILES:
        if (tiny / name).exists():
            shutil.copy(tiny / name, path / name)
