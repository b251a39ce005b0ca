"""A data file's boxes against the coordinate space it is said to be in: 0-1 boxes read as pixels.

A box written in 0-1 of the image (``[0.12, 0.30, 0.45, 0.80]``) in a file read as pixels (or as
0-1000) passes every check of one box: it is finite, ordered and lies on the image. It then trains
as a box smaller than a pixel, and nothing says so. One such box may be meant; a file whose EVERY
box lies within [0, 1], on images larger than a few pixels, is a 0-1 file read in the wrong space.
:class:`BoxRange` collects the boxes of a file as it is indexed, and :meth:`BoxRange.problem` says
so, naming the file, ``task.options.box_space`` and the value to set, once one image gives a size.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

MIN_SIDE = 8  # pixels: on images at least this large a 0-1 box is at most 1/8 of a side


class BoxRange:
    """The largest coordinate of the boxes of a file read in ``space`` (a ``box_space`` name:
    pixel | rel1000 | norm), with the first box and where it is."""

    def __init__(self, space: str):
        self.space = space
        self.largest = 0.0
        self.count = 0
        self.first: Optional[tuple[str, list]] = None

    def add(self, boxes: Any, where: str) -> None:
        """One box (4 numbers) or a sequence of boxes, as the file writes them; others are ignored
        (the task's reader refuses them)."""
        for box in ([boxes] if _is_box(boxes) else boxes if isinstance(boxes, (list, tuple)) else ()):
            if _is_box(box):
                self.largest = max(self.largest, *(abs(float(v)) for v in box))
                self.count += 1
                self.first = self.first or (where, [float(v) for v in box])

    def suspect(self) -> bool:
        """Every box within [0, 1] although the space is not 0-1 (the image size decides)."""
        return self.space != "norm" and self.count > 0 and self.largest <= 1.0

    def problem(self, path: Any, image_size: Sequence[int]) -> Optional[str]:
        """The error when every box lies within [0, 1] and the image is larger than a few pixels."""
        if not self.suspect() or min(image_size) < MIN_SIDE:
            return None
        w, h = image_size
        where, box = self.first
        reading = "a box smaller than a pixel" if self.space == "pixel" else f"1/1000 of the image as {self.space}"
        return (f"{path}: every box lies within [0, 1] ({self.count} boxes, e.g. {where}: {box}), which is "
                f"{reading} on its {w}x{h} images: the file's boxes are 0-1 of the image size, so set "
                f"task.options.box_space=norm (it is {self.space!r})")


def _is_box(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) == 4
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value))
