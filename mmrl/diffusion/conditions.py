"""Images in and out of a generator: the prompts as the pipeline takes them (the texts, and for a
conditioned pipeline, an editing or image-to-video model (``FlowPipeline.conditioning``), the prompts'
input images (:class:`~mmrl.task.GenerationPrompt`) as one tensor at the output size), and the
generated pixels as PIL images."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from PIL import Image

from ..media.pixels import to_rgb
from .base import CONDITIONINGS, FlowPipeline


def condition_tensor(image, height: int, width: int) -> torch.Tensor:
    """A task's input image (PIL) as the pipeline's condition: float32 (3, height, width) in [0, 1],
    resized (bicubic) when it is not already the output's size."""
    image = to_rgb(image)
    if image.size != (width, height):
        image = image.resize((width, height), Image.BICUBIC)
    return torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1).contiguous()


def prompt_conditions(prompts: Sequence, pipe: FlowPipeline, size: tuple[int, int], model: str,
                      task: str) -> tuple[list[str], torch.Tensor | None]:
    """The prompts' texts, and their input images as one (B, 3, H, W) tensor at ``size`` (height,
    width); None for a text-only pipeline. A text-only pipeline given images, or a conditioned one
    given none, is a configuration error naming ``model`` and ``task``: the two do not fit."""
    texts = [str(p) for p in prompts]
    images = [getattr(p, "image", None) for p in prompts]
    given = sum(image is not None for image in images)
    wanted = getattr(pipe, "conditioning", None)
    if wanted is None:
        if given:
            raise ValueError(f"{model} generates from text alone, but {task} gives an input image with its "
                             "prompts: use an editing or image-to-video model (docs/generators.md)")
        return texts, None
    if wanted not in CONDITIONINGS:
        raise ValueError(f"{type(pipe).__name__}.conditioning={wanted!r}; valid: {CONDITIONINGS}")
    if given < len(images):
        what = "a source image" if wanted == "image" else "a first frame"
        raise ValueError(f"{model} needs {what} with every prompt, but {task} gives text alone: use a task whose "
                         "prompts carry images (image_edit, motion_i2v) or a text-to-image model")
    height, width = size
    return texts, torch.stack([condition_tensor(image, height, width) for image in images])


def rows_of(images: torch.Tensor | None, rows) -> torch.Tensor | None:
    """The condition images of some samples (None stays None: a text-only run)."""
    return None if images is None else images[rows]


def to_pil(pixels: torch.Tensor) -> Image.Image | list[Image.Image]:
    """[0, 1] (3, H, W) -> an RGB image; (F, 3, H, W) -> a list of frames."""
    if pixels.dim() == 4:
        return [to_pil(f) for f in pixels]
    array = (pixels.detach().float().clamp(0, 1).permute(1, 2, 0).cpu().numpy() * 255).round().astype(np.uint8)
    return Image.fromarray(array)
