"""Turn chat messages with images into model inputs for Qwen-VL-family checkpoints.

Why not just ``AutoProcessor``: in transformers 5.x the Qwen-VL processors insist on a video
processor, and every video processor needs torchvision, whose PyPI wheels pull a CUDA build of
torch (several GB). mmrl's image path needs only the tokenizer, the (PIL) image processor and the
chat template, all real transformers objects loaded from the checkpoint directory; this module
does the one thing the processor adds on top: expanding each ``<|image_pad|>`` placeholder into
one token per merged vision patch. A parity test compares the result with the HF processor
wherever torchvision is installed.

Two image-processor backends, both transformers' own: ``pil`` (portable, CPU) and
``torchvision``, which resizes, normalises and patchifies uint8 tensors on a ``device`` (the
training GPU), so preprocessing does not bound a step (see :func:`choose_image_backend`).

Videos (:class:`mmrl.media.video.Clip`, frames already sampled) go through transformers' own
Qwen2-VL video processor (it needs torchvision: the ``video`` extra), built on first use with the
checkpoint's patch sizes; ``second_per_grid_ts`` (Qwen2.5-VL's absolute-time M-RoPE) is
``temporal_patch_size / sample_fps`` per clip, as transformers' Qwen2.5-VL processor computes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from ..media.pixels import to_rgb
from .families import QWEN_VL, row_tokens

IMAGE_BACKENDS = ("auto", "pil", "torchvision")
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"


def mm_token_type_ids(input_ids: torch.Tensor, image_token_id: int, video_token_id: int | None) -> torch.Tensor:
    """0 for text, 1 for image and 2 for video placeholder tokens (the HF processor's convention).

    Qwen-VL models in transformers >= 5 compute their multimodal (3D) rotary positions only when
    this is passed; without it they silently fall back to 1D text positions for image tokens.
    """
    types = (input_ids == image_token_id).long()
    if video_token_id is not None:
        types = types + 2 * (input_ids == video_token_id).long()
    return types


def torchvision_available() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # not installed, or a build that does not match torch
        return False
    return True


def choose_image_backend(backend: str, device: torch.device) -> tuple[str, torch.device | None]:
    """``(backend, device)`` for ``vlm.image_processor_backend``: ``auto`` is torchvision on the
    training device when that is a GPU and torchvision imports (PIL on a CPU: the same numbers as
    ever, and no faster there), else pil; ``torchvision`` runs on the training device."""
    if backend not in IMAGE_BACKENDS:
        raise ValueError(f"vlm.image_processor_backend={backend!r}: one of {', '.join(IMAGE_BACKENDS)}")
    if backend == "auto":
        backend = "torchvision" if device.type != "cpu" and torchvision_available() else "pil"
    if backend == "torchvision" and not torchvision_available():
        raise ValueError("vlm.image_processor_backend=torchvision needs torchvision: pip install -e \".[video]\" "
                         "(or set vlm.image_processor_backend=pil)")
    return backend, (device if backend == "torchvision" else None)


class VLMProcessor:
    """Tokenizer + image processor + chat template of a Qwen2-VL/2.5-VL/3-VL checkpoint.

    ``device``: where a torchvision-backed image processor works (None: its default, the CPU);
    images then go to it as uint8 tensors and ``pixel_values`` come back on it."""

    family = QWEN_VL  # what mmrl.vlm.families declares for these checkpoints

    def __init__(self, tokenizer, image_processor, chat_template: str | None = None,
                 min_pixels: int | None = None, max_pixels: int | None = None,
                 device: torch.device | None = None, video_processor=None,
                 video_min_pixels: int | None = None, video_max_pixels: int | None = None):
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.device = device
        self._video_processor = video_processor
        self.video_budget = (video_min_pixels, video_max_pixels)
        self.model_type: str | None = None  # the checkpoint's family (set by load_vlm)
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        if self.chat_template is None:
            raise ValueError("the checkpoint has no chat template (chat_template.jinja / tokenizer_config.json)")
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.set_pixel_budget(min_pixels, max_pixels)
        self.image_token_id = self.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        self.video_token_id = self.tokenizer.convert_tokens_to_ids(VIDEO_PAD)
        self.vision_token_ids = row_tokens(self.tokenizer, self.family.vision_tokens)

    def token_types(self, input_ids: torch.Tensor) -> torch.Tensor:
        return mm_token_type_ids(input_ids, self.image_token_id, self.video_token_id)

    def token_inputs(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The inputs derived from token ids: ``mm_token_type_ids`` (what M-RoPE reads)."""
        return {"mm_token_type_ids": self.token_types(input_ids)}

    def split_videos(self, enc: dict) -> list[dict[str, torch.Tensor] | None]:
        """Each sample's video inputs in a batch encoding (None without video)."""
        return split_videos(enc, self.video_token_id, self.merge_size)

    @classmethod
    def from_pretrained(cls, path: str | Path, min_pixels: int | None = None, max_pixels: int | None = None,
                        backend: str = "pil", device: torch.device | None = None,
                        video_min_pixels: int | None = None, video_max_pixels: int | None = None):
        """``backend``: ``pil`` or ``torchvision`` (transformers' two image-processor backends);
        ``device`` only with torchvision. ``video_*_pixels``: the per-frame budget of videos."""
        from transformers import AutoImageProcessor, AutoTokenizer

        path = str(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        image_processor = AutoImageProcessor.from_pretrained(path, backend=backend)
        template = getattr(tokenizer, "chat_template", None)
        jinja = Path(path) / "chat_template.jinja"
        if template is None and jinja.exists():
            template = jinja.read_text()
        return cls(tokenizer, image_processor, template, min_pixels, max_pixels, device,
                   video_min_pixels=video_min_pixels, video_max_pixels=video_max_pixels)

    # -- configuration ----------------------------------------------------------------------
    @property
    def merge_size(self) -> int:
        return int(getattr(self.image_processor, "merge_size", 2))

    @property
    def patch_size(self) -> int:
        return int(getattr(self.image_processor, "patch_size", 14))

    def set_pixel_budget(self, min_pixels: int | None, max_pixels: int | None) -> None:
        """Apply ``min_pixels``/``max_pixels`` (the Qwen-VL image budget) to the image processor."""
        size = dict(getattr(self.image_processor, "size", None) or {})
        if min_pixels is not None:
            size["shortest_edge"] = int(min_pixels)
            if hasattr(self.image_processor, "min_pixels"):
                self.image_processor.min_pixels = int(min_pixels)
        if max_pixels is not None:
            size["longest_edge"] = int(max_pixels)
            if hasattr(self.image_processor, "max_pixels"):
                self.image_processor.max_pixels = int(max_pixels)
        if size:
            self.image_processor.size = size

    @property
    def video_processor(self):
        """transformers' Qwen2-VL video processor with this checkpoint's patch, merge and temporal
        patch sizes and the ``vlm.video_*_pixels`` budget; built on first use (needs torchvision)."""
        if self._video_processor is None:
            if not torchvision_available():
                raise ImportError("video inputs need torchvision (transformers' video processor): "
                                  "pip install -e \".[video]\"")
            from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

            ip = self.image_processor
            kwargs = {"patch_size": self.patch_size, "merge_size": self.merge_size,
                      "temporal_patch_size": int(getattr(ip, "temporal_patch_size", 2) or 2),
                      "image_mean": list(ip.image_mean), "image_std": list(ip.image_std)}
            if hasattr(Qwen2VLVideoProcessor, "cap_pixels_per_frame"):  # qwen-vl-utils' per-frame cap
                kwargs["cap_pixels_per_frame"] = True
            lo, hi = self.video_budget
            if lo is not None:
                kwargs["min_pixels"] = int(lo)
            if hi is not None:
                kwargs["max_pixels"] = int(hi)
            self._video_processor = Qwen2VLVideoProcessor(**kwargs)
        return self._video_processor

    # -- text ---------------------------------------------------------------------------------
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            messages, chat_template=self.chat_template, tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    # -- batch encoding -------------------------------------------------------------------------
    def __call__(self, texts: Sequence[str], images: Sequence[Sequence[Any]] | None = None,
                 videos: Sequence[Sequence[Any]] | None = None) -> dict:
        """Encode ``texts`` (already chat-formatted) with their images and videos, left-padded.

        ``images[i]`` is the list of PIL images of ``texts[i]``, ``videos[i]`` its list of
        :class:`~mmrl.media.video.Clip`, each in placeholder order. Returns ``input_ids``,
        ``attention_mask``, ``mm_token_type_ids`` and, when there are images, ``pixel_values``
        and ``image_grid_thw``; with videos ``pixel_values_videos``, ``video_grid_thw`` and
        ``second_per_grid_ts`` (the tensors Qwen-VL models take).
        """
        texts = list(texts)
        flat = [im for ims in (images or []) for im in ims]
        clips = [clip for cs in (videos or []) for clip in cs]
        out: dict[str, torch.Tensor] = {}
        if flat:
            vision = self._encode_images(flat)
            out["pixel_values"] = vision["pixel_values"]
            out["image_grid_thw"] = vision["image_grid_thw"].cpu()
            counts = (vision["image_grid_thw"].prod(-1) // (self.merge_size**2)).tolist()
            texts = _expand_placeholders(texts, counts)
        if clips:
            out.update(self._encode_videos(clips))
            counts = (out["video_grid_thw"].prod(-1) // (self.merge_size**2)).tolist()
            texts = _expand_placeholders(texts, counts, VIDEO_PAD)
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        out["input_ids"] = enc["input_ids"]
        out["attention_mask"] = enc["attention_mask"]
        out["mm_token_type_ids"] = self.token_types(enc["input_ids"])
        return out

    def _encode_images(self, images: list) -> dict:
        if self.device is None:
            return self.image_processor(images=images, return_tensors="pt")
        from torchvision.transforms.functional import pil_to_tensor

        # uint8 tensors on the device: the resize and normalisation run there, not in PIL
        tensors = [pil_to_tensor(to_rgb(im)).to(self.device, non_blocking=True) for im in images]
        return self.image_processor(images=tensors, return_tensors="pt", device=self.device)

    def _encode_videos(self, clips: list) -> dict[str, torch.Tensor]:
        """``pixel_values_videos``, ``video_grid_thw`` and ``second_per_grid_ts`` of sampled clips
        (frames resized again only where they fall outside the video budget)."""
        if self.model_type and self.model_type.startswith("qwen3"):
            raise ValueError(f"video prompts for {self.model_type} checkpoints are not supported in this version "
                             "(Qwen3-VL writes a timestamp before each frame, which this processor does not); "
                             "Qwen2-VL and Qwen2.5-VL checkpoints take videos")
        vp = self.video_processor
        frames = [clip.frames if self.device is None else clip.frames.to(self.device) for clip in clips]
        kwargs = {"device": self.device} if self.device is not None else {}
        enc = vp(videos=frames, return_tensors="pt", do_sample_frames=False, **kwargs)
        out = {"pixel_values_videos": enc["pixel_values_videos"], "video_grid_thw": enc["video_grid_thw"].cpu()}
        if self.model_type != "qwen2_vl":  # Qwen2-VL's M-RoPE counts frames, not seconds
            seconds = [vp.temporal_patch_size / clip.sample_fps for clip in clips]
            out["second_per_grid_ts"] = torch.tensor(seconds, dtype=torch.float32)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def save_pretrained(self, path: str | Path) -> None:
        self.tokenizer.save_pretrained(path)
        self.image_processor.save_pretrained(path)
        Path(path, "chat_template.jinja").write_text(self.chat_template)


def _expand_placeholders(texts: list[str], counts: list[int], pad: str = IMAGE_PAD) -> list[str]:
    """Replace the k-th ``pad`` placeholder (over the whole batch) by ``counts[k]`` copies."""
    kind = "video" if pad == VIDEO_PAD else "image"
    it = iter(counts)
    expanded = []
    for text in texts:
        parts = text.split(pad)
        pieces = [parts[0]]
        for part in parts[1:]:
            try:
                n = next(it)
            except StopIteration:
                raise ValueError(f"more {kind} placeholders in the prompts than {kind}s given") from None
            pieces.append(pad * n + part)
        expanded.append("".join(pieces))
    if next(it, None) is not None:
        raise ValueError(f"more {kind}s given than {kind} placeholders in the prompts")
    return expanded


def split_patches(enc: dict, images_per_sample: list[int]) -> list[tuple[torch.Tensor | None, torch.Tensor | None]]:
    """Per-sample ``(pixel_values, image_grid_thw)`` out of a batch encoding.

    The processor concatenates every image's patches along one axis; sample i owns the next
    ``images_per_sample[i]`` images, each with ``t*h*w`` patches from its grid row.
    """
    if "pixel_values" not in enc:
        return [(None, None)] * len(images_per_sample)
    grid = enc["image_grid_thw"]
    sizes = grid.prod(-1).tolist()
    out, p, g = [], 0, 0
    for k in images_per_sample:
        npatch = int(sum(sizes[g:g + k]))
        out.append((enc["pixel_values"][p:p + npatch], grid[g:g + k]) if k else (None, None))
        p += npatch
        g += k
    return out



def split_videos(enc: dict, video_token_id: int | None, merge_size: int,
                 video_mask: torch.Tensor | None = None) -> list[dict[str, torch.Tensor] | None]:
    """Per-sample video inputs (``pixel_values_videos``, ``video_grid_thw`` and, but for
    Qwen2-VL, ``second_per_grid_ts``) out of a batch encoding, None for a sample without video. Which
    videos a row owns follows from its video placeholder tokens (``input_ids == video_token_id``, or
    ``video_mask`` where the family writes frames with another token): videos are consumed in order
    until their token counts add up to the row's."""
    rows = len(enc["input_ids"])
    if "video_grid_thw" not in enc:
        return [None] * rows
    grid = enc["video_grid_thw"]
    tokens = (grid.prod(-1) // merge_size**2).tolist()
    patches = grid.prod(-1).tolist()
    out: list[dict[str, torch.Tensor] | None] = []
    v, p = 0, 0
    for row in range(rows):
        need = int((enc["input_ids"][row] == video_token_id if video_mask is None else video_mask[row]).sum())
        first, got = v, 0
        while got < need:
            got += tokens[v]
            v += 1
        if got != need:
            raise ValueError(f"row {row}: {need} video tokens do not match its videos' {got}")
        if v == first:
            out.append(None)
            continue
        n = int(sum(patches[first:v]))
        mine = {"pixel_values_videos": enc["pixel_values_videos"][p:p + n], "video_grid_thw": grid[first:v]}
        if "second_per_grid_ts" in enc:
            mine["second_per_grid_ts"] = enc["second_per_grid_ts"][first:v]
        out.append(mine)
        p += n
    return out


def join_videos(parts: Sequence[dict[str, torch.Tensor] | None]) -> dict[str, torch.Tensor]:
    """The batch inputs of per-sample video inputs (:func:`split_videos`), {} when none has one."""
    present = [x for x in parts if x is not None]
    return {k: torch.cat([x[k] for x in present]) for k in present[0]} if present else {}


def batch_vision_inputs(payload: dict) -> dict[str, torch.Tensor]:
    """A batch's images and videos as model inputs, in sample order (samples without any skipped):
    ``pixel_values`` / ``image_grid_thw`` and the joined video inputs."""
    out: dict[str, torch.Tensor] = {}
    pixels = [x for x in payload["pixel_values"] if x is not None]
    if pixels:
        out["pixel_values"] = torch.cat(pixels)
        out["image_grid_thw"] = torch.cat([g for g in payload["image_grid_thw"] if g is not None])
    out.update(join_videos(payload.get("video") or []))
    return out
