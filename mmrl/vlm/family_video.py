"""Clips for the non-Qwen families: what their transformers processors need, and where each
sample keeps the video inputs so the same sequence can be re-scored.

A :class:`~mmrl.media.video.Clip` goes to the family's own video processor as its uint8 frames,
already sampled (``do_sample_frames=False``), with a ``VideoMetadata`` that gives each frame's time
in the source: GLM-4.1V writes a timestamp after each pair of frames and SmolVLM2 one before each
frame, from it. How the model then reads a clip is the family's ``video_layout``
(:mod:`mmrl.vlm.families`):

- ``grid`` (GLM-4.1V): ``pixel_values_videos`` patches and ``video_grid_thw``, split per sample as
  Qwen-VL's (:func:`~mmrl.vlm.processing.split_videos`), the frames' tokens found by their token
  type (GLM writes them with the image token, inside ``<|begin_of_video|>`` .. ``<|end_of_video|>``);
- ``per_video`` (LLaVA-OneVision): ``pixel_values_videos`` of shape (clips, frames, C, H, W), one
  entry per clip, whose pooled frame tokens the model counts from the frames: the clips of one
  forward need equal frame counts;
- ``as_images`` (SmolVLM2, InternVL): each frame one image among the sample's image tensors
  (SmolVLM2's frames laid out per prompt row like its tiles, :func:`frames_as_rows`; InternVL's
  processor already puts them among the tiles in prompt order).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .processing import split_videos


def clip_metadata(clip):
    """transformers' ``VideoMetadata`` of a clip: its frames' source indices and fps give the
    times (``indices[i] / source_fps``, the clip's own ``timestamps``) the processors write."""
    from transformers.video_utils import VideoMetadata

    height, width = clip.frames.shape[-2:]
    return VideoMetadata(total_num_frames=max(len(clip.indices), round(clip.duration * clip.source_fps)),
                         fps=float(clip.source_fps), width=int(width), height=int(height),
                         duration=float(clip.duration), frames_indices=list(clip.indices))


def check_clips(processor, images: Sequence[Sequence[Any]], videos: Sequence[Sequence[Any]]) -> None:
    """Refuse, with the reason, a batch of clips the family's processor or model cannot take."""
    family = processor.family
    if family.video_layout is None:
        raise ValueError(f"video prompts: {family.video_off}")
    if getattr(processor.hf, "video_processor", None) is None:
        raise ValueError(f"video prompts: {type(processor.hf).__name__} ({processor.model_type}) has no video "
                         f"processor in transformers, so {processor.model_type} checkpoints take images only; "
                         "SmolVLM2 checkpoints (model_type smolvlm) take clips")
    if family.video_with_images_off and any(images):
        raise ValueError(f"a batch of image and video prompts: {family.video_with_images_off}")
    if frames_share_image_keys(processor.hf) and any(ims and cs for ims, cs in zip(images, videos)):
        raise ValueError(f"a {family.name} prompt with both images and a clip: transformers' "
                         f"{type(processor.hf).__name__} returns both as pixel_values, so mmrl encodes image prompts "
                         "and video prompts apart; give a prompt either images or a clip")
    frames = sorted({len(clip.frames) for cs in videos for clip in cs})
    if len(frames) > 1 and family.unequal_frames_off:
        raise ValueError(f"{family.name} clips of {frames} frames in one batch: {family.unequal_frames_off}, so "
                         "they need equal frame counts; read the clips with a fixed count (read_video's nframes, "
                         "e.g. task.options.video.nframes=8)")


def frames_share_image_keys(hf_processor) -> bool:
    """Whether the video processor returns frames under the image processor's key (SmolVLM2's
    ``pixel_values``), so one processor call cannot carry a batch's images and clips."""
    video_processor = getattr(hf_processor, "video_processor", None)
    return "pixel_values" in getattr(video_processor, "model_input_names", ())


def video_kwargs(videos: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """The processor call's ``videos`` and ``videos_kwargs`` for the batch's clips (in prompt order)."""
    clips = [clip for cs in videos for clip in cs]
    return {"videos": [clip.frames for clip in clips],
            "videos_kwargs": {"do_sample_frames": False, "video_metadata": [clip_metadata(c) for c in clips]}}


def frames_as_rows(enc: dict, images: Sequence[Sequence[Any]], videos: Sequence[Sequence[Any]],
                   image_enc: dict | None) -> dict:
    """SmolVLM2: the video processor's (clips, frames, ...) ``pixel_values`` and
    ``pixel_attention_mask`` laid out as its image processor lays out tiles, one entry per prompt
    row, zero-padded, so a row's frames are that sample's images. In a batch that also has image
    prompts, ``image_enc`` is the encoding of those prompts alone (in order), whose tiles fill their rows."""
    keys = ("pixel_values", "pixel_attention_mask")
    rows: list[dict[str, torch.Tensor] | None] = []
    clip, image_row = 0, 0
    for ims, clips in zip(images, videos):
        if clips:
            rows.append({k: torch.cat([enc[k][clip + i, :len(c.frames)] for i, c in enumerate(clips)]) for k in keys})
            clip += len(clips)
        elif ims:
            rows.append({k: image_enc[k][image_row] for k in keys})
            image_row += 1
        else:
            rows.append(None)
    present = [r for r in rows if r is not None]
    width = max(len(r["pixel_values"]) for r in present)
    out = dict(enc)
    for k in keys:
        like = present[0][k]
        padded = like.new_zeros((len(rows), width, *like.shape[1:]))
        for i, r in enumerate(rows):
            if r is not None:
                padded[i, :len(r[k])] = r[k]
        out[k] = padded
    return out


def video_token_types(input_ids: torch.Tensor, image_token_id: int, start_id: int, end_id: int) -> torch.Tensor:
    """GLM-4.1V's token types: 1 on an image's ``<|image|>`` tokens, 2 on a clip's (those between
    ``<|begin_of_video|>`` and ``<|end_of_video|>``), 0 elsewhere (its processor's rule)."""
    image = (input_ids == image_token_id).long()
    inside = (input_ids == start_id).cumsum(-1) > (input_ids == end_id).cumsum(-1)
    return image + image * inside.long()


def split_clips(enc: dict, processor) -> list[dict[str, torch.Tensor] | None]:
    """Each sample's video inputs in a batch encoding (None without a clip, and for ``as_images``
    families, whose frames are among the sample's image tensors)."""
    family = processor.family
    rows = len(enc["input_ids"])
    if family.video_layout == "grid":
        return split_videos(enc, None, processor.merge_size, processor.token_types(enc["input_ids"]) == 2)
    if family.video_layout != "per_video" or "pixel_values_videos" not in enc:
        return [None] * rows
    clips = enc["pixel_values_videos"]
    tokens = (enc["input_ids"] == processor.video_token_id).sum(-1).tolist()
    per_clip = sum(tokens) // len(clips)  # equal frame counts: every clip has as many tokens
    out, start = [], 0
    for t in tokens:
        k = t // per_clip
        out.append({"pixel_values_videos": clips[start:start + k]} if k else None)
        start += k
    return out


def check_batch(payload: dict, family) -> None:
    """Refuse, with the reason, a batch of samples (:func:`split_clips`) whose clips the family's
    model cannot take in one forward: images with clips (GLM-4.1V), unequal frame counts (LLaVA-OneVision)."""
    present = [x for x in payload.get("video") or [] if x is not None]
    if not present:
        return
    if family.video_with_images_off and any(x is not None for x in payload["pixel_values"]):
        raise ValueError(f"a batch of image and video samples: {family.video_with_images_off}")
    if family.video_layout == "per_video":  # one (clips, frames, C, H, W) tensor
        frames = sorted({int(x["pixel_values_videos"].shape[1]) for x in present})
        if len(frames) > 1:
            raise ValueError(f"{family.name} samples with clips of {frames} frames in one forward: "
                             f"{family.unequal_frames_off}; read the clips with a fixed count "
                             "(task.options.video.nframes)")
