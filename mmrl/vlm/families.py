"""What differs between the vision-language families mmrl trains, declared once per family.

The policy code is one path for every family (:mod:`mmrl.vlm.policy`); what a family changes is
declared here and read where it matters: which processor encodes its prompts, which of its
encoding's tensors a sample carries (``image_keys``) and how they split per sample and join per
batch (``image_layout``), the vision tokens never sampled, the token that ends an assistant turn,
how its model reads a clip (``video_layout``), LoRA targets, and which of mmrl's exact speed-ups its
architecture allows: the vision tower once
per distinct image (:mod:`mmrl.vlm.vision_once`), one prompt pass per group
(:mod:`mmrl.vlm.shared_prefix`), packed rows (:mod:`mmrl.vlm.packing`). A speed-up a family does
not allow is off for it, and asking for it is refused with the reason stated here. The coordinate
frame each family answers in is declared in :mod:`mmrl.media.coords`.

Families are looked up by the checkpoint's ``config.model_type``; every class is transformers'
own (no ``trust_remote_code``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mmrl.registry import VLM_FAMILIES

# The language model's attention and MLP projections: the same names in every family here.
LM_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class VLMFamily:
    """One family's declarations (module docstring). ``*_off``: None where mmrl's speed-up
    applies, else why it does not (the message a run that asks for it gets)."""

    name: str
    model_types: tuple[str, ...]
    # "qwen": mmrl's own VLMProcessor; "transformers": the checkpoint's transformers processor
    processor: str
    # the encoding's image tensors a sample keeps for re-scoring
    image_keys: tuple[str, ...]
    # "grid": Qwen-style patches split by image_grid_thw; "per_image": first dim one entry per
    # image; "per_row": first dim one entry per prompt row (Idefics3's tiles, padded per batch);
    # "per_tile": first dim one entry per tile, a row's tiles counted from its image tokens (InternVL)
    image_layout: str
    vision_tokens: tuple[str, ...]  # placeholders and markers: never sampled, masked in scoring
    end_of_turn: str  # what the chat template closes an assistant turn with
    # token-type inputs derived from input_ids: "mm_token_type_ids" (Qwen: M-RoPE), "token_type_ids"
    # (Gemma 3: bidirectional attention over image tokens) or None
    token_types: str | None = None
    # a batch input holding each row's number of images (LLaVA-OneVision's batch_num_images), or None
    images_per_row: str | None = None
    lora_targets: tuple[str, ...] = LM_PROJECTIONS
    vision_once_off: str | None = None  # on: split per image by the grid, or per pixel row ("per_image")
    shared_prefix_off: str | None = None
    packing_off: str | None = None
    # how a clip reaches the model (None: no video, ``video_off`` says why): "grid", Qwen-style
    # pixel_values_videos split by video_grid_thw (a sample keeps them as its "video"); "per_video",
    # pixel_values_videos with one (frames, C, H, W) entry per clip (LLaVA-OneVision); "as_images",
    # each frame one more image among the sample's image tensors (SmolVLM2, InternVL)
    video_layout: str | None = None
    video_off: str | None = None
    # why one forward cannot hold both images and clips (None: it can)
    video_with_images_off: str | None = None
    # why the clips of one batch need equal frame counts (None: they need not)
    unequal_frames_off: str | None = None


_NOT_MROPE = "its packed rows need M-RoPE position ids (get_rope_index), which only the Qwen-VL families have"
_QWEN_PREFIX = ("the shared prompt pass is written for Qwen-VL's inputs (M-RoPE positions, mm_token_type_ids) "
                "and not verified for {}; the plain forward runs")
_NO_VISION_ONCE = ("{} has no per-image grid for mmrl's vision-once wrapper to split the pixels by (it reads "
                   "Qwen-VL's image_grid_thw), so each sample's images go through the tower")

QWEN_VL = VLMFamily(
    name="Qwen2-VL / Qwen2.5-VL / Qwen3-VL", model_types=("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"),
    processor="qwen", image_keys=("pixel_values", "image_grid_thw"), image_layout="grid",
    vision_tokens=("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"),
    end_of_turn="<|im_end|>", token_types="mm_token_type_ids", video_layout="grid")

GEMMA3 = VLMFamily(
    name="Gemma 3", model_types=("gemma3",), processor="transformers", image_keys=("pixel_values",),
    image_layout="per_image", vision_tokens=("<start_of_image>", "<end_of_image>", "<image_soft_token>"),
    end_of_turn="<end_of_turn>", token_types="token_type_ids",
    shared_prefix_off="Gemma 3 interleaves sliding-window layers, whose cache keeps only the window",
    packing_off=_NOT_MROPE,
    video_off="Gemma 3 takes images, not video")

IDEFICS3 = VLMFamily(
    name="SmolVLM / SmolVLM2 / Idefics3", model_types=("idefics3", "smolvlm"), processor="transformers",
    image_keys=("pixel_values", "pixel_attention_mask"), image_layout="per_row",
    vision_tokens=("<image>", "<fake_token_around_image>", "<global-img>", "<video>"), end_of_turn="<end_of_utterance>",
    vision_once_off=_NO_VISION_ONCE.format("Idefics3 / SmolVLM (tiles padded per batch)"),
    shared_prefix_off=_QWEN_PREFIX.format("Idefics3 / SmolVLM"),
    packing_off=_NOT_MROPE, video_layout="as_images")

LLAVA_ONEVISION = VLMFamily(
    name="LLaVA-OneVision", model_types=("llava_onevision",), processor="transformers",
    image_keys=("pixel_values", "image_sizes"), image_layout="per_image", vision_tokens=("<image>", "<video>"),
    end_of_turn="<|im_end|>", images_per_row="batch_num_images",
    vision_once_off=_NO_VISION_ONCE.format("LLaVA-OneVision (anyres crops padded per batch)"),
    shared_prefix_off=_QWEN_PREFIX.format("LLaVA-OneVision"),
    packing_off=_NOT_MROPE, video_layout="per_video",
    unequal_frames_off="its model takes a batch's clips as one (clips, frames, C, H, W) tensor")

INTERNVL = VLMFamily(
    name="InternVL 3", model_types=("internvl",), processor="transformers", image_keys=("pixel_values",),
    image_layout="per_tile", vision_tokens=("<IMG_CONTEXT>", "<img>", "</img>", "<video>"), end_of_turn="<|im_end|>",
    vision_once_off=_NO_VISION_ONCE.format("InternVL (dynamic tiles, counted only by their tokens)"),
    shared_prefix_off=_QWEN_PREFIX.format("InternVL"),
    packing_off=_NOT_MROPE, video_layout="as_images",
    unequal_frames_off="transformers' InternVLProcessor stacks a batch's clips into one tensor")

GLM4V = VLMFamily(
    name="GLM-4.1V", model_types=("glm4v",), processor="transformers", image_keys=("pixel_values", "image_grid_thw"),
    image_layout="grid", vision_tokens=("<|image|>", "<|begin_of_image|>", "<|end_of_image|>", "<|video|>",
                                        "<|begin_of_video|>", "<|end_of_video|>"),
    end_of_turn="<|user|>", token_types="mm_token_type_ids",
    # GLM-4's MLP is one fused gate_up_proj
    lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"),
    packing_off="its packed rows are built for Qwen-VL's 4-row positions and not verified for GLM-4.1V",
    video_layout="grid",
    video_with_images_off="transformers' Glm4vModel writes a clip's frames with the image token <|image|> and "
                          "checks each modality's features against every <|image|> of the batch, so images and "
                          "clips cannot share one forward (put image and video prompts in separate batches)")

for _family in (QWEN_VL, GEMMA3, IDEFICS3, LLAVA_ONEVISION, INTERNVL, GLM4V):
    for _model_type in _family.model_types:
        VLM_FAMILIES.register(_model_type, _family)


def family_of(model_type: str | None) -> VLMFamily:
    """The family of a checkpoint's ``config.model_type``; a clear error for others."""
    if model_type in VLM_FAMILIES:
        return VLM_FAMILIES.get(model_type)
    raise ValueError(f"model_type {model_type!r} is not a vision-language family mmrl trains (known: "
                     f"{', '.join(VLM_FAMILIES.names())}); see docs/models.md")


def row_tokens(tokenizer, names) -> list[int]:
    """The ids of the token strings ``names`` that ``tokenizer`` has (unknown ones skipped)."""
    out = set()
    for name in names:
        i = tokenizer.convert_tokens_to_ids(name)
        if i is not None and i != tokenizer.unk_token_id:
            out.add(int(i))
    return sorted(out)
