"""A contact sheet: pictures in rows, each at its own aspect ratio, each in a thin coloured border.

Every picture is scaled down to at most ``row_height`` pixels high and the sheet's ``width`` wide
(a small one is scaled up by a whole factor, pixels kept crisp, to fill half a row or more), then the pictures are laid out left to right, a new row starting when the next one
does not fit (a justified-rows layout, as photo sites lay out thumbnails): square pictures four
to a row, a video's frame strip alone on its row at the sheet's width, a tall screenshot narrow.
A title line (e.g. "3 of 16 right") heads the sheet, and a caption line in an unscaled font sits
under each picture (a task's own labels shrink with its picture).
"""

from __future__ import annotations

from typing import Sequence

from PIL import Image, ImageDraw

from ..media.draw import bitmap_font

TITLE = 18  # pixels of the title band
CAPTION = 14  # pixels of a caption line under a tile
CHAR = 6  # pixels of a character of the bitmap font


def fit(size: tuple[int, int], row_height: int, width: int) -> tuple[int, int]:
    """``size`` scaled to at most ``row_height`` high and ``width`` wide, aspect kept; one smaller
    than half of that is scaled up by the largest whole factor that fits."""
    w, h = size
    scale = min(1.0, row_height / h, width / w)
    if scale == 1.0 and 2 * h <= row_height and 2 * w <= width:
        scale = float(min(row_height // h, width // w))
    return max(1, round(w * scale)), max(1, round(h * scale))


def side_by_side(images: Sequence[Image.Image], gap: int = 4) -> Image.Image:
    """``images`` in one row on white, each scaled to the first one's height (an episode's steps)."""
    height = images[0].height
    scaled = [im.convert("RGB").resize((max(1, round(im.width * height / im.height)), height)) for im in images]
    row = Image.new("RGB", (sum(im.width for im in scaled) + gap * (len(scaled) - 1), height), "white")
    x = 0
    for im in scaled:
        row.paste(im, (x, 0))
        x += im.width + gap
    return row


def contact_sheet(pictures: Sequence[Image.Image], colours: Sequence[tuple[int, int, int]], title: str = "",
                  captions: Sequence[str] = (), width: int = 960, row_height: int = 224, border: int = 3,
                  gap: int = 6) -> tuple[Image.Image, list[tuple[int, int, int, int]]]:
    """The sheet and each picture's box ``(left, top, right, bottom)`` on it (inside its border of
    ``border`` pixels in ``colours[i]``, ``captions[i]`` under it cut to the tile's width; tiles
    ``gap`` pixels apart)."""
    sizes = [fit(p.size, row_height, width - 2 * (border + gap)) for p in pictures]
    boxes: list[tuple[int, int, int, int]] = []
    x, y, row_bottom = gap, TITLE + gap, TITLE + gap
    for w, h in sizes:
        outer_w, outer_h = w + 2 * border, h + 2 * border + (CAPTION if captions else 0)
        if x > gap and x + outer_w + gap > width:  # the next row
            x, y = gap, row_bottom + gap
        boxes.append((x + border, y + border, x + border + w, y + border + h))
        x += outer_w + gap
        row_bottom = max(row_bottom, y + outer_h)
    sheet_width = max([b[2] + border + gap for b in boxes] + [width // 2])
    sheet = Image.new("RGB", (sheet_width, row_bottom + gap), "white")
    draw = ImageDraw.Draw(sheet)
    draw.text((gap, 4), title, fill=(0, 0, 0), font=bitmap_font())
    for i, (picture, colour, box) in enumerate(zip(pictures, colours, boxes)):
        left, top, right, bottom = box
        draw.rectangle([left - border, top - border, right + border - 1, bottom + border - 1], fill=colour)
        up = right - left > picture.width
        sheet.paste(picture.convert("RGB").resize((right - left, bottom - top), Image.NEAREST if up else Image.LANCZOS),
                    (left, top))
        if i < len(captions):
            text = captions[i][: max(1, (right - left + 2 * border) // CHAR)]
            draw.text((left - border, bottom + border + 2), text, fill=(0, 0, 0), font=bitmap_font())
    return sheet, boxes

