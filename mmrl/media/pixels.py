"""Pixels as the model's own libraries read them: the one conversion of a decoded image to 8-bit RGB.

Transparency. transformers' ``convert_to_rgb`` (``image_transforms``; what Qwen-VL image processors
run with ``do_convert_rgb``) composites an image with an alpha band or a transparent colour (RGBA,
LA, PA, a palette or grey PNG with ``tRNS``) onto WHITE; qwen-vl-utils' ``to_rgb`` pastes RGBA on
white too. PIL's bare ``convert("RGB")`` drops the alpha instead, showing the colour a transparent
pixel happens to store (usually black). :func:`to_rgb` does what transformers does, so training,
evaluation, the demo and a model served through transformers see the same pixels.

16-bit greyscale (PNG, mode ``I;16``, or ``I`` as older Pillow opens it). PIL's conversions clip
every value above 255 to 255, and transformers and qwen-vl-utils convert through PIL, so nearly all
of such an image turns white (measured with Pillow 12.3, transformers 5.25: 256, 1000, 65535 all
give 255). No library that serves the model scales them, so no choice matches them and keeps the
picture; mmrl scales ``value >> 8`` (the full 16-bit range onto 0-255, as torchvision's
``to_dtype(uint8, scale=True)`` does) and warns once that a model served through those libraries
would see the clipped image: convert such files to 8 bits for the same pixels everywhere.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

WHITE = (255, 255, 255, 255)
_warned_16bit = False


def has_transparency(image: Any) -> bool:
    """An alpha band or a transparent colour (``tRNS``): transformers' own test in ``convert_to_rgb``."""
    return "A" in image.getbands() or image.info.get("transparency") is not None


def to_rgb(image: Any) -> Any:
    """``image`` (a PIL image) as 8-bit RGB: transparency composited on white, 16-bit grey scaled by
    ``>> 8`` (see the module docstring); an RGB image without transparency is returned as it is."""
    from PIL import Image

    if image.mode.startswith("I"):  # I;16, I;16B, I;16L, I (Pillow < 10 opens 16-bit PNGs so)
        return _scaled_16bit(image).convert("RGB")
    if has_transparency(image):
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, WHITE), rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def _scaled_16bit(image: Any) -> Any:
    """A 16-bit grey image as 8-bit ``L``: each value ``>> 8`` (values outside 0-65535 clipped first)."""
    import numpy as np
    from PIL import Image

    global _warned_16bit
    if not _warned_16bit:
        _warned_16bit = True
        name = getattr(image, "filename", "") or "a 16-bit greyscale image"
        log.warning("%s is 16-bit greyscale (mode %s): mmrl scales it to 8 bits (value >> 8); PIL, transformers "
                    "and qwen-vl-utils clip such values to 255 (white), so a model served through them sees "
                    "another image: convert these files to 8 bits for the same pixels everywhere",
                    name, image.mode)
    values = np.asarray(image).astype(np.int64)
    return Image.fromarray((np.clip(values, 0, 65535) >> 8).astype(np.uint8))
