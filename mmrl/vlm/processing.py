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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

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

    def __init__(self, tokenizer, image_processor, chat_template: str | None = None,
                 min_pixels: int | None = None, max_pixels: int | None = None,
                 device: torch.device | None = None):
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.device = device
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        if self.chat_template is None:
            raise ValueError("the checkpoint has no chat template (chat_template.jinja / tokenizer_config.json)")
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.set_pixel_budget(min_pixels, max_pixels)
        self.image_token_id = self.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        self.video_token_id = self.tokenizer.convert_tokens_to_ids(VIDEO_PAD)

    def token_types(self, input_ids: torch.Tensor) -> torch.Tensor:
        return mm_token_type_ids(input_ids, self.image_token_id, self.video_token_id)

    @classmethod
    def from_pretrained(cls, path: str | Path, min_pixels: int | None = None, max_pixels: int | None = None,
                        backend: str = "pil", device: torch.device | None = None):
        """``backend``: ``pil`` or ``torchvision`` (transformers' two image-processor backends);
        ``device`` only with torchvision."""
        from transformers import AutoImageProcessor, AutoTokenizer

        path = str(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        image_processor = AutoImageProcessor.from_pretrained(path, backend=backend)
        template = getattr(tokenizer, "chat_template", None)
        jinja = Path(path) / "chat_template.jinja"
        if template is None and jinja.exists():
            template = jinja.read_text()
        return cls(tokenizer, image_processor, template, min_pixels, max_pixels, device)

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

    # -- text ---------------------------------------------------------------------------------
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            messages, chat_template=self.chat_template, tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    # -- batch encoding -------------------------------------------------------------------------
    def __call__(self, texts: Sequence[str], images: Sequence[Sequence[Any]] | None = None) -> dict:
        """Encode ``texts`` (already chat-formatted) with their images, left-padded.

        ``images[i]`` is the list of PIL images of ``texts[i]``, in placeholder order.
        Returns ``input_ids``, ``attention_mask``, ``mm_token_type_ids`` and, when there are
        images, ``pixel_values`` and ``image_grid_thw`` (the tensors Qwen-VL models take).
        """
        texts = list(texts)
        flat = [im for ims in (images or []) for im in ims]
        out: dict[str, torch.Tensor] = {}
        if flat:
            vision = self._encode_images(flat)
            out["pixel_values"] = vision["pixel_values"]
            out["image_grid_thw"] = vision["image_grid_thw"].cpu()
            counts = (vision["image_grid_thw"].prod(-1) // (self.merge_size**2)).tolist()
            texts = _expand_placeholders(texts, counts)
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
        tensors = [pil_to_tensor(im.convert("RGB")).to(self.device, non_blocking=True) for im in images]
        return self.image_processor(images=tensors, return_tensors="pt", device=self.device)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def save_pretrained(self, path: str | Path) -> None:
        self.tokenizer.save_pretrained(path)
        self.image_processor.save_pretrained(path)
        Path(path, "chat_template.jinja").write_text(self.chat_template)


def _expand_placeholders(texts: list[str], counts: list[int]) -> list[str]:
    """Replace the k-th ``<|image_pad|>`` (over the whole batch) by ``counts[k]`` copies."""
    it = iter(counts)
    expanded = []
    for text in texts:
        parts = text.split(IMAGE_PAD)
        pieces = [parts[0]]
        for part in parts[1:]:
            try:
                n = next(it)
            except StopIteration:
                raise ValueError("more image placeholders in the prompts than images given") from None
            pieces.append(IMAGE_PAD * n + part)
        expanded.append("".join(pieces))
    if next(it, None) is not None:
        raise ValueError("more images given than image placeholders in the prompts")
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
