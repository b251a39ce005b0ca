"""Drawing for task visualisations (rollout samples, eval galleries): upscale, then draw boxes
and labels, and a font that renders the same on every machine.

Public (:mod:`mmrl.public`): every task's ``visualize`` draws with these, so galleries of different
tasks share colours (green = truth, red = prediction) and layout.
"""

from __future__ import annotations

import functools

from PIL import Image, ImageDraw, ImageFont

VIS_SCALE = 4  # 112 px -> 448 px so boxes and labels are easy to see
TRUE = (0, 200, 0)
PRED = (255, 0, 0)


FOOTER = 18  # pixels of white strip under the image for a label


def canvas(image: Image.Image, scale: int = VIS_SCALE, footer: int = 0) -> tuple[Image.Image, ImageDraw.ImageDraw]:
    """An upscaled (nearest-neighbour) RGB copy of ``image``, with an optional white strip of
    ``footer`` pixels below it for labels, and a drawer for it."""
    w, h = image.size
    big = Image.new("RGB", (w * scale, h * scale + footer), (255, 255, 255))
    big.paste(image.convert("RGB").resize((w * scale, h * scale), resample=Image.NEAREST))
    return big, ImageDraw.Draw(big)


def draw_box(draw: ImageDraw.ImageDraw, box, color, scale: int = VIS_SCALE) -> None:
    """A box given in original-image pixels (right/bottom exclusive); wild values are clamped."""
    x1, y1, x2, y2 = (max(-1e6, min(1e6, float(v))) * scale for v in box)
    draw.rectangle([x1, y1, max(x1, x2 - 1), max(y1, y2 - 1)], outline=color, width=2)


def draw_point(draw: ImageDraw.ImageDraw, point, color, scale: int = VIS_SCALE, radius: int = 6) -> None:
    """A click at ``point`` given in original-image pixels: a ring with a centre dot (wild values
    clamped), visible on any background."""
    x, y = (max(-1e6, min(1e6, float(v))) * scale for v in point)
    draw.ellipse([x - radius, y - radius, x + radius, y + radius], outline=color, width=2)
    draw.ellipse([x - 1, y - 1, x + 1, y + 1], fill=color)


def draw_label(draw: ImageDraw.ImageDraw, text: str, color=(0, 0, 0)) -> None:
    """Write ``text`` in the footer strip made by ``canvas(..., footer=FOOTER)``."""
    height = draw.im.size[1]
    draw.text((4, height - FOOTER + 3), text, fill=color)


@functools.lru_cache(maxsize=1)
def bitmap_font():
    """PIL's built-in bitmap font (6 px a character). ``load_default()`` returns a FreeType font
    when FreeType is available (Pillow >= 10.1), whose rendering can differ between builds; the
    bitmap one cannot, so images drawn with it (OCR codes, chart labels) are identical everywhere."""
    loader = getattr(ImageFont, "load_default_imagefont", None)
    return loader() if loader is not None else ImageFont.load_default()


def bitmap_text(text: str) -> str:
    """``text`` as the bitmap font can draw it: that font encodes Latin-1 only (PIL raises
    UnicodeEncodeError on anything else, and a model's completion may hold any character), so
    each other character becomes ``?``."""
    return str(text).encode("latin-1", "replace").decode("latin-1")


TIMELINE = 14  # pixels of a timeline bar under a frame strip


def frame_strip(frames, scale: int = 2, max_frames: int = 8, footer: int = 0) -> tuple[Image.Image, ImageDraw.ImageDraw]:
    """A clip's frames side by side (at most ``max_frames``, evenly picked), upscaled by ``scale``,
    with ``footer`` white pixels below for timelines and labels; and a drawer for it."""
    frames = list(frames)
    if len(frames) > max_frames:
        frames = [frames[round(i * (len(frames) - 1) / (max_frames - 1))] for i in range(max_frames)]
    w, h = frames[0].size
    strip = Image.new("RGB", (len(frames) * (w * scale + 2), h * scale + footer), (255, 255, 255))
    for i, frame in enumerate(frames):
        strip.paste(frame.convert("RGB").resize((w * scale, h * scale), resample=Image.NEAREST), (i * (w * scale + 2), 0))
    return strip, ImageDraw.Draw(strip)


def draw_segment(draw: ImageDraw.ImageDraw, segment, duration: float, top: int, color) -> None:
    """A time segment ``(start, end)`` in seconds as a bar across the strip's width at ``top``
    (the whole width is ``duration`` seconds); wild values are clamped to the clip."""
    width = draw.im.size[0]
    start, end = (max(0.0, min(float(duration), float(v))) for v in segment)
    draw.rectangle([0, top, width - 1, top + TIMELINE - 4], outline=(200, 200, 200))
    draw.rectangle([round(start / duration * (width - 1)), top + 1, round(end / duration * (width - 1)), top + TIMELINE - 5],
                   fill=color)
