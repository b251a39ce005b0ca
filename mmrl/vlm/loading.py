"""Loading a Qwen-VL-family checkpoint from a local directory or a hub id's cached snapshot (:mod:`mmrl.config.hub`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .families import family_of
from .processing import VLMProcessor, choose_image_backend
from .quantization import FourBit

# LoRA targets when model.lora.target_modules is unset: the language model's attention and MLP.
VLM_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# Where a family's model keeps its vision tower (the attribute moved between versions and families).
VISION_TOWER_NAMES = ("visual", "vision_tower", "vision_model")

# Left unquantized under a 4-bit base (mmrl.vlm.quantization says why): the LM head and the vision tower,
# as transformers' llm_int8_skip_modules patterns (matched from the start of a module's name).
UNQUANTIZED = ("lm_head", rf"(?:.*\.)?(?:{'|'.join(VISION_TOWER_NAMES)})")


def resolve_model_path(path: str, revision: str | None = None) -> Path:
    """``"tiny"`` is the built-in tiny Qwen2.5-VL, ``"tiny-video"`` the same warm-started on clips
    and ``"tiny-gui"`` on the synthetic phone's screens (``"tiny-gui-grounding"``: taught more
    clicks; ``"tiny-zoom"``: to zoom on a named cell, :mod:`mmrl.tools.tiny_zoom`); anything else is a local directory, or a hub id ``org/name`` at ``revision``: its
    snapshot in the Hugging Face cache (:func:`mmrl.config.hub.resolve_checkpoint`, downloaded unless offline)."""
    from mmrl.config.hub import resolve_checkpoint
    from mmrl.config.tiny_models import tiny_checkpoints

    tiny = tiny_checkpoints("vlm")
    if path in tiny and not revision:
        from mmrl.assets import asset_path

        name, command = tiny[path]
        p = asset_path(name)
        if not (p / "config.json").exists():
            raise FileNotFoundError(f"the built-in {path} model is missing at {p}; rebuild it with `{command}`")
        return p
    p = resolve_checkpoint(path, revision)
    if (p / "model_index.json").exists() or (p / "mmrl_generator.json").exists():
        raise ValueError(f"model.path={path!r} is an image or video generator (a diffusers pipeline), not a "
                         f"vision-language model: train it with `mmrl train diffusion model.path={path}`")
    if not (p / "config.json").exists():
        raise FileNotFoundError(
            f"model.path={path!r} is not a local checkpoint directory (no config.json in {p}). "
            "Pass a downloaded checkpoint's directory, a hub id (org/name, docs/hub-ids.md), "
            "or model.path=tiny for the built-in model."
        )
    return p


def load_vlm(path: str, device: torch.device, dtype: torch.dtype = torch.float32,
             attn_implementation: str | None = None, min_pixels: int | None = None,
             max_pixels: int | None = None, image_backend: str = "auto",
             video_min_pixels: int | None = None, video_max_pixels: int | None = None,
             revision: str | None = None, four_bit: FourBit | None = None):
    """Model (weights in ``dtype``) and :class:`VLMProcessor` with the given image and video
    budgets and image-processor backend (``vlm.image_processor_backend``, see
    ``choose_image_backend``); ``revision``: a hub id's branch, tag or commit (``model.revision``);
    ``four_bit``: the language model's Linear layers quantized to 4 bits as they load, on ``device``
    (all but :data:`UNQUANTIZED`), computing in ``dtype``."""
    from transformers import AutoModelForImageTextToText

    where = resolve_model_path(path, revision)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if four_bit is not None:
        from mmrl.core.library_internals import keep_4bit_weights_unpacked

        kwargs.update(quantization_config=four_bit.transformers_config(dtype, UNQUANTIZED),
                      device_map={"": torch.device(device)})  # quantized on the device, not moved there after
        model = AutoModelForImageTextToText.from_pretrained(str(where), **kwargs)
        keep_4bit_weights_unpacked(model)
    else:
        model = AutoModelForImageTextToText.from_pretrained(str(where), **kwargs).to(device)
    if family_of(model.config.model_type).processor != "qwen":  # transformers' own processor (families.py)
        from .family_processing import FamilyProcessor

        processor = FamilyProcessor.from_pretrained(where, model.config.model_type)
        processor.set_pixel_budget(min_pixels, max_pixels, video_min_pixels, video_max_pixels)
        return model, processor
    backend, image_device = choose_image_backend(image_backend, torch.device(device))
    processor = VLMProcessor.from_pretrained(where, min_pixels, max_pixels, backend, image_device,
                                             video_min_pixels, video_max_pixels)
    processor.model_type = model.config.model_type
    return model, processor


def vision_tower(model) -> torch.nn.Module | None:
    """The vision encoder of a Qwen-VL-family model (its attribute moved between versions)."""
    for owner in (getattr(model, "model", None), model):
        for name in VISION_TOWER_NAMES:
            module = getattr(owner, name, None) if owner is not None else None
            if isinstance(module, torch.nn.Module):
                return module
    return None
