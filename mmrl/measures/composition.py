"""A GenEval-style checker for the synthetic shape scenes of :mod:`mmrl.data.shapes_t2i`.

GenEval ("GenEval: An Object-Focused Framework for Evaluating Text-to-Image Alignment", Ghosh et
al., 2023) scores a generated image by detecting objects and checking the prompt's object, count,
colour and position claims; Flow-GRPO ("Flow-GRPO: Training Flow Matching Models via Online RL",
Liu et al., 2025) uses that score as its RL reward. Here the scenes of
:mod:`mmrl.data.shapes_t2i` are simple enough that the detector is programmatic: nearest-palette
pixel classification and connected components, no weights.

This module is the checker (used by the ``composition`` rewards and the ``composition`` task's
metrics); ``rewards/composition.py`` registers the rewards on top of :func:`composition_checks`.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from PIL import Image

from mmrl.data.shapes_t2i import BACKGROUND, COLORS, IMAGE_SIZE, validate_spec

_NAMES = tuple(COLORS)
_PALETTE = np.array([BACKGROUND, *COLORS.values()], dtype=np.float32)  # 0 = background
SQUARE_FILL = 0.9  # a filled square fills its box; a drawn circle ~0.785 (0.75-0.84 at 7-40 px)
MIN_FILL = 0.6  # below this a component is a ring/scribble, not a circle
ASPECT = (0.6, 1.67)  # bbox width / height of a circle or square; otherwise a "blob"


def classify_pixels(image: Image.Image, max_dist: float = 80.0) -> np.ndarray:
    """(H, W) int: 0 for background, 1 + i for the i-th palette colour. A pixel farther than
    ``max_dist`` (Euclidean RGB) from every palette colour and the background is noise (0): a
    blurred edge between red and the background is otherwise nearest to yellow."""
    rgb = np.asarray(image.convert("RGB"), dtype=np.float32)
    dist = np.linalg.norm(rgb[:, :, None, :] - _PALETTE[None, None], axis=-1)
    labels = dist.argmin(-1)
    labels[dist.min(-1) > max_dist] = 0
    return labels


def _components(mask: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """4-connected components of a boolean mask as (ys, xs) arrays; a BFS over its True pixels."""
    seen = np.zeros_like(mask, dtype=bool)
    h, w = mask.shape
    out = []
    for y0, x0 in zip(*np.nonzero(mask)):
        if seen[y0, x0]:
            continue
        seen[y0, x0] = True
        queue, ys, xs = deque([(y0, x0)]), [], []
        while queue:
            y, x = queue.popleft()
            ys.append(y)
            xs.append(x)
            for ny, nx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    queue.append((ny, nx))
        out.append((np.array(ys), np.array(xs)))
    return out


def _shape(area: int, width: int, height: int) -> str:
    aspect = width / height
    fill = area / (width * height)
    if not ASPECT[0] <= aspect <= ASPECT[1] or fill < MIN_FILL:
        return "blob"
    return "square" if fill >= SQUARE_FILL else "circle"


def detect_objects(image: Image.Image, min_area: float | None = None, max_dist: float = 80.0,
                   masks: bool = False) -> list[dict]:
    """Objects of palette colours: ``{"color", "shape", "cx", "cy", "area", "box"}``.

    ``cx``/``cy``: the centroid in continuous pixel coordinates (pixel x covers [x, x + 1)), so
    the image's vertical midline is ``width / 2``. ``box``: ``(x1, y1, x2, y2)`` right/bottom
    exclusive. ``shape``: "square" (fills >= 0.9 of its box), "circle", or "blob" (box aspect
    outside [0.6, 1.67] or fill < 0.6): a blob counts for colour and count but never matches a
    shape. Components under ``min_area`` pixels (default 12 at 32x32, scaled with the area) are
    dropped as noise. ``masks=True`` adds ``"mask"``: the object's pixels, an (H, W) bool array
    (what GenEval's CLIP colour classifier keeps of the image, :mod:`mmrl.eval_protocols.geneval_clip`)."""
    w, h = image.size
    if min_area is None:
        min_area = 12 * (w * h) / (IMAGE_SIZE * IMAGE_SIZE)
    labels = classify_pixels(image, max_dist)
    objects = []
    for index, color in enumerate(_NAMES, start=1):
        for ys, xs in _components(labels == index):
            area = len(ys)
            if area < min_area:
                continue
            x1, y1, x2, y2 = int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
            objects.append({
                "color": color, "shape": _shape(area, x2 - x1, y2 - y1),
                "cx": float(xs.mean()) + 0.5, "cy": float(ys.mean()) + 0.5,
                "area": area, "box": (x1, y1, x2, y2),
            })
            if masks:
                objects[-1]["mask"] = np.zeros((h, w), dtype=bool)
                objects[-1]["mask"][ys, xs] = True
    return objects


def composition_checks(image: Image.Image, spec: list[dict], min_area: float | None = None) -> dict[str, bool]:
    """The spec's checks on ``image``. For group ``i`` (0-based): ``color_i`` (some object has its
    colour), ``count_i`` (exactly ``count`` objects of it), ``shape_i`` (at least one, and all of
    them have the group's shape), ``position_i`` (only for a positioned group: at least one, and
    all centres on that side of the midline); then ``no_extra`` (no object of another colour)."""
    return object_checks(detect_objects(image, min_area), spec, image.size[0])


def object_checks(objects: list[dict], spec: list[dict], width: int) -> dict[str, bool]:
    """:func:`composition_checks` on objects already detected in an image ``width`` pixels wide
    (whose colours another judge may have decided: GenEval's CLIP classifier)."""
    validate_spec(spec)
    mid = width / 2
    checks: dict[str, bool] = {}
    for i, group in enumerate(spec):
        mine = [o for o in objects if o["color"] == group["color"]]
        checks[f"color_{i}"] = bool(mine)
        checks[f"count_{i}"] = len(mine) == group["count"]
        checks[f"shape_{i}"] = bool(mine) and all(o["shape"] == group["shape"] for o in mine)
        position = group.get("position")
        if position is not None:
            side = (lambda o: o["cx"] < mid) if position == "left" else (lambda o: o["cx"] > mid)
            checks[f"position_{i}"] = bool(mine) and all(side(o) for o in mine)
    wanted = {g["color"] for g in spec}
    checks["no_extra"] = all(o["color"] in wanted for o in objects)
    return checks
