"""Weight-free image rewards: JPEG (in)compressibility, brightness, closeness to a colour.

They need no checkpoint, so they are the smoke tests of an image-generator RL setup: a reward
that any policy can move quickly, to check the loop learns before paying for a learned scorer.
Each returns None for a completion that is not a PIL image. All are declared ``media="image"``, so a
video generator's clips are scored frame by frame and reduced by ``task.reward_kwargs.<name>.frames``
(``mean`` or ``min``; :mod:`mmrl.media.clips`).
"""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image

from mmrl import register_reward
from mmrl.data.shapes_t2i import COLORS
from mmrl.measures.batch import score_each


def _each_image(name: str, completions, examples, score) -> list:
    """``score(image, example)`` for each completion that is a PIL image, None for the others."""
    return score_each(name, completions, examples,
                      lambda im, ex: score(im, ex) if isinstance(im, Image.Image) else None, items="images")


def _pixels(image: Image.Image) -> np.ndarray:
    """(H, W, 3) float64 RGB in 0..255."""
    return np.asarray(image.convert("RGB"), dtype=np.float64)


def jpeg_size_kb(image: Image.Image, quality: int = 95) -> float:
    """Size in kB (1000 bytes) of the image saved as JPEG at ``quality``, as DDPO measures it."""
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=quality)
    return buffer.tell() / 1000


@register_reward("jpeg_compressibility", media="image")
def jpeg_compressibility(completions, examples, scale: float = 1.0, quality: int = 95) -> list:
    """``-scale * size_kb`` of the JPEG (quality 95): the compressibility reward of "Training
    Diffusion Models with Reinforcement Learning" (Black et al., 2023). ``scale`` brings the value
    near a unit range (a 512x512 image is ~10-100 kB; a 32x32 one ~1 kB). A non-image completion
    (None) scores the registry default 0, above every real score: only a broken generator yields
    one, never a policy's choice, so it cannot be exploited."""
    return _each_image("jpeg_compressibility", completions, examples, lambda im, _: -scale * jpeg_size_kb(im, quality))


@register_reward("jpeg_incompressibility", media="image")
def jpeg_incompressibility(completions, examples, scale: float = 1.0, quality: int = 95) -> list:
    """``+scale * size_kb`` of the JPEG (quality 95), DDPO's incompressibility reward."""
    return _each_image("jpeg_incompressibility", completions, examples, lambda im, _: scale * jpeg_size_kb(im, quality))


@register_reward("brightness", media="image")
def brightness(completions, examples, target: float | None = None) -> list:
    """Mean of all RGB values / 255, in [0, 1]; with ``target``, ``1 - |mean - target|`` instead
    (a reward that peaks at a brightness rather than growing without end)."""

    def score(im, _):
        mean = float(_pixels(im).mean() / 255.0)
        return mean if target is None else 1.0 - abs(mean - float(target))

    return _each_image("brightness", completions, examples, score)


def parse_color(color) -> np.ndarray:
    """A palette name of :mod:`mmrl.data.shapes_t2i` (``"red"``) or ``[r, g, b]`` in 0..255."""
    if isinstance(color, str):
        if color not in COLORS:
            raise ValueError(f"unknown colour name {color!r}; use one of {tuple(COLORS)} or [r, g, b]")
        return np.array(COLORS[color], dtype=np.float64)
    rgb = np.asarray(color, dtype=np.float64)
    if rgb.shape != (3,):
        raise ValueError(f"a colour is a palette name or [r, g, b], got {color!r}")
    return rgb


@register_reward("color_target", media="image")
def color_target(completions, examples, color=None) -> list:
    """``1 - mean_pixels(||rgb - color||) / (255 * sqrt(3))``, in [0, 1] (1: every pixel is the
    colour). The colour is the example's ``target_color`` when it has one (per-prompt targets),
    else the ``color`` kwarg; None when neither is given."""

    def score(im, ex):
        target = ex.get("target_color", color) if isinstance(ex, dict) else color
        if target is None:
            return None
        dist = np.linalg.norm(_pixels(im) - parse_color(target), axis=-1).mean()
        return float(1.0 - dist / (255.0 * math.sqrt(3)))

    return _each_image("color_target", completions, examples, score)
