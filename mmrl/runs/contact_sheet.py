"""A contact sheet: pictures in rows, each at its own aspect ratio, each in a thin coloured border.

Every picture is scaled down to at most ``row_height`` pixels high and the sheet's ``width`` wide
(a small one is scaled up by a whole factor, pixels kept crisp, to fill half a row or more), then the pictures are laid out left to right, a new row starting when the next one
does not fit (a justified-rows layout, as photo sites lay out thumbnails): square pictures four
to a row, a video's frame strip alone on its row at the sheet's width, a tall screenshot narrow.
A title line (e.g. "3 of 16 right") heads the sheet, and a caption in an unscaled font sits under
each picture (a task's own labels shrink with its picture), wrapped to the tile's width between
words and tags, never inside a ``<tag>``, so a completion reads whole.
"""

from __future__ import annotations

import re
from typing import Sequence

from PIL import Image, ImageDraw

from ..media.draw import bitmap_font, bitmap_text

TITLE = 18  # pixels of the title band
CAPTION = 14  # pixels of the first caption line under a tile (its band: the line and the gaps around it)
LINE = 12  # pixels of each further caption line
CHAR = 6  # pixels of a character of the bitmap font
MAX_LINES = 12  # a caption longer than this keeps its first and last lines (the answer comes last)

# A caption's units: a line break, other whitespace, a tag (kept whole), a word (a run up to a tag)
_UNIT = re.compile(r"\n|[^\S\n]+|<[^<>\s]{1,40}>|[^\s<]+|<")


def wrap(text: str, chars: int, max_lines: int = MAX_LINES) -> list[str]:
    """``text`` in lines of at most ``chars`` characters, broken at whitespace or before / after a
    tag, a tag never split (a word longer than a line is, at the line's end); a newline breaks the
    line. More than ``max_lines`` lines: the first ones, a line saying how many were left out, and
    the last ones."""
    chars = max(1, chars)
    lines, line, space = [], "", False
    for unit in _UNIT.findall(str(text)):
        if unit == "\n":
            lines.append(line)
            line, space = "", False
        elif unit.isspace():
            space = bool(line)
        else:
            piece = (" " if space else "") + unit
            if line and len(line) + len(piece) > chars:
                lines.append(line)
                line, piece = "", unit
            line += piece
            while len(line) > chars:
                lines.append(line[:chars])
                line = line[chars:]
            space = False
    lines.append(line)
    while len(lines) > 1 and not lines[-1]:
        lines.pop()
    if len(lines) > max_lines:
        head, tail = (max_lines - 1) // 2, max_lines - 1 - (max_lines - 1) // 2
        lines = [*lines[:head], f"[... {len(lines) - head - tail} lines left out ...]"[:chars], *lines[-tail:]]
    return lines


def caption_height(lines: int) -> int:
    """Pixels of a caption band of ``lines`` lines (none: no band)."""
    return 0 if lines <= 0 else CAPTION + LINE * (lines - 1)


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
    ``border`` pixels in ``colours[i]``, ``captions[i]`` under it wrapped to the tile's width
    (:func:`wrap`); tiles ``gap`` pixels apart)."""
    sizes = [fit(p.size, row_height, width - 2 * (border + gap)) for p in pictures]
    texts = [wrap(captions[i], (w + 2 * border) // CHAR) if i < len(captions) else []
             for i, (w, _) in enumerate(sizes)]
    boxes: list[tuple[int, int, int, int]] = []
    x, y, row_bottom = gap, TITLE + gap, TITLE + gap
    for (w, h), text in zip(sizes, texts):
        outer_w, outer_h = w + 2 * border, h + 2 * border + caption_height(len(text))
        if x > gap and x + outer_w + gap > width:  # the next row
            x, y = gap, row_bottom + gap
        boxes.append((x + border, y + border, x + border + w, y + border + h))
        x += outer_w + gap
        row_bottom = max(row_bottom, y + outer_h)
    # as wide as the tiles, half the asked width at least, and the whole title
    sheet_width = max([b[2] + border + gap for b in boxes] + [width // 2, 2 * gap + CHAR * len(title)])
    sheet = Image.new("RGB", (sheet_width, row_bottom + gap), "white")
    draw = ImageDraw.Draw(sheet)
    draw.text((gap, 4), bitmap_text(title), fill=(0, 0, 0), font=bitmap_font())
    for i, (picture, colour, box) in enumerate(zip(pictures, colours, boxes)):
        left, top, right, bottom = box
        draw.rectangle([left - border, top - border, right + border - 1, bottom + border - 1], fill=colour)
        up = right - left > picture.width
        sheet.paste(picture.convert("RGB").resize((right - left, bottom - top), Image.NEAREST if up else Image.LANCZOS),
                    (left, top))
        for k, line in enumerate(texts[i]):
            draw.text((left - border, bottom + border + 2 + LINE * k), bitmap_text(line), fill=(0, 0, 0), font=bitmap_font())
    return sheet, boxes

