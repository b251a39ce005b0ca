"""Prompt encoding for the non-Qwen families, and each family's image tensors per sample and batch.

:class:`FamilyProcessor` puts transformers' own processor of a checkpoint (Gemma3Processor,
Idefics3Processor, SmolVLMProcessor, ...) behind the interface of mmrl's Qwen
:class:`~mmrl.vlm.processing.VLMProcessor`: chat template, batch encoding (left-padded, the
family's placeholder expansion done by transformers), decoding, saving. Qwen-VL keeps its own
processor (see :mod:`mmrl.vlm.processing` for why).

A rollout keeps each sample's image tensors so the same sequence can be re-scored;
:func:`split_images` cuts a batch encoding into samples and :func:`join_images` puts samples
back into one batch, following the family's ``image_layout`` (:mod:`mmrl.vlm.families`). Clips
go through the family's own video processor (:mod:`mmrl.vlm.family_video`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

import torch

from . import family_video
from .families import VLMFamily, family_of, row_tokens
from .processing import batch_vision_inputs, join_videos, split_patches

# Idefics3 / SmolVLM mark each tile of a split image with one of these.
_TILE_TOKEN = re.compile(r"^<row_\d+_col_\d+>$")


class FamilyProcessor:
    """A non-Qwen family's transformers processor with :class:`VLMProcessor`'s interface."""

    def __init__(self, processor, family: VLMFamily, model_type: str):
        self.hf = processor
        self.family = family
        self.model_type = model_type
        self.tokenizer = processor.tokenizer
        self.image_processor = processor.image_processor
        self.chat_template = processor.chat_template or getattr(self.tokenizer, "chat_template", None)
        if self.chat_template is None:
            raise ValueError("the checkpoint has no chat template (chat_template.jinja / tokenizer_config.json)")
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.image_token_id = getattr(processor, "image_token_id", None)
        self.video_token_id = getattr(processor, "video_token_id", None)
        # GLM-4.1V: a clip's frames are image tokens between these two (its token type 2)
        self.video_span = (getattr(processor, "video_start_id", None), getattr(processor, "video_end_id", None))
        # merged patches per video token (GLM-4.1V's grid)
        self.merge_size = int(getattr(getattr(processor, "video_processor", None), "merge_size", 1) or 1)
        # InternVL: image tokens per tile (its pixel_values are the batch's tiles, in order)
        self.tokens_per_tile = int(getattr(processor, "image_seq_length", 0) or 0)
        tiles = [t for t in self.tokenizer.get_vocab() if _TILE_TOKEN.match(t)]
        self.vision_token_ids = row_tokens(self.tokenizer, [*family.vision_tokens, *tiles])

    @classmethod
    def from_pretrained(cls, path: str | Path, model_type: str) -> FamilyProcessor:
        from transformers import AutoProcessor

        from .processing import torchvision_available

        try:
            processor = AutoProcessor.from_pretrained(str(path))
        except (ImportError, TypeError, ValueError) as exc:
            if torchvision_available():
                raise
            # LLaVA-OneVision, InternVL, SmolVLM and GLM-4.1V processors hold a video processor
            raise ImportError(f"the {family_of(model_type).name} processor could not be built without torchvision "
                              f"(its video processor needs it): pip install -e \".[video]\" ({exc})") from exc
        return cls(processor, family_of(model_type), model_type)

    def set_pixel_budget(self, min_pixels: int | None, max_pixels: int | None,
                         video_min_pixels: int | None = None, video_max_pixels: int | None = None) -> None:
        if min_pixels is not None or max_pixels is not None:
            raise ValueError(f"vlm.min_pixels / vlm.max_pixels are Qwen-VL's image budget; {self.family.name} "
                             "resizes images its own way (its image processor's size): remove the keys")
        if video_min_pixels is not None or video_max_pixels is not None:
            raise ValueError(f"vlm.video_min_pixels / vlm.video_max_pixels are Qwen-VL's per-frame budget; "
                             f"{self.family.name} resizes frames its own way (its video processor's size, "
                             "video_preprocessor_config.json): remove the keys, or set "
                             "vlm.video_min_pixels=null vlm.video_max_pixels=null")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def __call__(self, texts: Sequence[str], images: Sequence[Sequence[Any]] | None = None,
                 videos: Sequence[Sequence[Any]] | None = None) -> dict:
        """``texts`` (chat-formatted) with their images and clips (:class:`~mmrl.media.video.Clip`)
        as the family's model inputs, left-padded."""
        texts = list(texts)
        images = [list(ims) for ims in images] if images else [[] for _ in texts]
        videos = [list(cs) for cs in videos] if videos and any(videos) else None
        kwargs: dict[str, Any] = {"text": texts, "return_tensors": "pt", "padding": True, "add_special_tokens": False}
        if any(images):
            kwargs["images"] = images
        if videos:
            family_video.check_clips(self, images, videos)
            kwargs.update(family_video.video_kwargs(videos))
        enc = dict(self.hf(**kwargs))
        if videos and family_video.frames_share_image_keys(self.hf):  # SmolVLM2: frames laid out as its tiles
            rows = [i for i, ims in enumerate(images) if ims]
            alone = dict(self.hf(text=[texts[i] for i in rows], images=[images[i] for i in rows], return_tensors="pt",
                                 padding=True, add_special_tokens=False)) if rows else None
            enc = family_video.frames_as_rows(enc, images, videos, alone)
        enc.update(self.token_inputs(enc["input_ids"]))
        return {k: v for k, v in enc.items() if isinstance(v, torch.Tensor)}

    def token_inputs(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The inputs derived from token ids (Gemma 3: ``token_type_ids``, 1 on image tokens;
        GLM-4.1V: ``mm_token_type_ids``, 1 on image and 2 on clip tokens)."""
        if self.family.token_types is None:
            return {}
        return {self.family.token_types: self.token_types(input_ids)}

    def token_types(self, input_ids: torch.Tensor) -> torch.Tensor:
        start, end = self.video_span
        if start is None or end is None:
            return (input_ids == self.image_token_id).long()
        return family_video.video_token_types(input_ids, self.image_token_id, start, end)

    def split_videos(self, enc: dict) -> list[dict[str, torch.Tensor] | None]:
        """Each sample's video inputs in a batch encoding (None without a clip, or where its frames
        are among its image tensors)."""
        return family_video.split_clips(enc, self)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def save_pretrained(self, path: str | Path) -> None:
        self.hf.save_pretrained(str(path))


def split_images(enc: dict, images_per_sample: list[int], processor) -> list[dict[str, Any]]:
    """Each sample's image tensors (its family's ``image_keys``; values None for a sample without
    images) in a batch encoding made by ``processor``."""
    family = processor.family
    empty = {k: None for k in family.image_keys}
    if "pixel_values" not in enc:
        return [dict(empty) for _ in images_per_sample]
    if family.image_layout == "grid":
        return [dict(zip(family.image_keys, pair)) for pair in split_patches(enc, images_per_sample)]
    out, start = [], 0
    for row, k in enumerate(images_per_sample):
        # per_tile and per_row: a clip's frames are images too, so the encoding says what a row holds
        if family.image_layout == "per_tile":  # the row's tiles: its image tokens / tokens per tile
            k = int((enc["input_ids"][row] == processor.image_token_id).sum()) // processor.tokens_per_tile
        elif family.image_layout == "per_row":  # the row's tiles, without the all-zero ones that pad the batch
            real = enc["pixel_values"][row].flatten(1).ne(0).any(-1)
            k = int(real.sum())
        if not k:
            out.append(dict(empty))
        elif family.image_layout == "per_row":
            out.append({key: enc[key][row][real] for key in family.image_keys})
        else:
            out.append({key: enc[key][start:start + k] for key in family.image_keys})
            start += k
    return out


def join_images(payload: dict, family: VLMFamily) -> dict[str, torch.Tensor]:
    """A batch's image (and video) inputs from its samples', in sample order (samples without
    images skipped): the inverse of :func:`split_images`."""
    family_video.check_batch(payload, family)  # refuses what the model cannot take
    if family.image_layout == "grid":
        return batch_vision_inputs(payload)
    out = join_videos(payload.get("video") or [])  # per_video (LLaVA-OneVision); as_images: among the images
    rows = [i for i, x in enumerate(payload["pixel_values"]) if x is not None]
    if not rows:
        return out
    for key in family.image_keys:
        parts = [payload[key][i] for i in rows]
        joined = torch.cat(_padded(parts))
        # per_row: the model reads (rows, tiles, ...) and drops all-zero tiles, so all tiles in one row do
        out[key] = joined[None] if family.image_layout == "per_row" else joined
    if family.images_per_row:  # how many of the images each row owns (single- and multi-image rows differ)
        out[family.images_per_row] = torch.tensor([len(payload["pixel_values"][i]) for i in rows])
    return out


def _padded(parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """Zero-pad every dimension after the first to the largest (LLaVA-style patch counts)."""
    shape = [max(p.shape[d] for p in parts) for d in range(1, parts[0].dim())]
    out = []
    for p in parts:
        pad = [x for d in reversed(range(1, p.dim())) for x in (0, shape[d - 1] - p.shape[d])]
        out.append(torch.nn.functional.pad(p, pad) if any(pad) else p)
    return out
