"""Pixel checks of a synthetic edit (:mod:`mmrl.data.shape_edits`): did the result do what the
instruction asked, and keep the rest?

The objects of the result are found as the composition checker finds them
(:func:`mmrl.measures.composition.detect_objects`: nearest-palette pixels, connected components).
The checks of one result (each a bool):

- ``color``: an object of the edit's colour is there (the new colour of a recolour or an add);
- ``position``: one of them is where the edit puts it (a recolour: where the object was, its
  centre within ``tolerance`` px; a move: its centre in the half it goes to; an add: anywhere);
- ``shape``: that object has the edited object's shape;
- ``kept``: every object the edit leaves alone is found with its colour and shape, its centre within
  ``tolerance`` px of where it was;
- ``no_extra``: exactly as many objects as the target has (no copy left behind, nothing added
  twice, no stray blob);
- ``background``: outside the edit region (``ex["mask"]``) at least ``min_agreement`` of the
  pixels classify as the source's do (background or the same palette colour).

``edit_success`` is all of them; :func:`masked_preservation` is the dense preservation score the
``edit_preservation`` reward gives.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from .composition import classify_pixels, detect_objects

CHECKS = ("color", "position", "shape", "kept", "no_extra", "background")
MIN_AGREEMENT = 0.95


def _centre(box) -> tuple[float, float]:
    x1, y1, x2, y2 = box
    return (x1 + x2) / 2, (y1 + y2) / 2


def _near(obj: dict, point: tuple[float, float], tolerance: float) -> bool:
    return abs(obj["cx"] - point[0]) <= tolerance and abs(obj["cy"] - point[1]) <= tolerance


def _target_index(ex: dict) -> int | None:
    """The index in ``ex["spec"]`` of the object the edit made or changed."""
    edit = ex["edit"]
    return len(ex["spec"]) - 1 if edit["kind"] == "add" else 0


def edit_checks(result: Image.Image, ex: dict, tolerance: float | None = None,
                min_agreement: float = MIN_AGREEMENT) -> dict[str, bool]:
    """The checks above for ``result`` (a PIL image of the source's size) against edit example ``ex``.
    ``tolerance`` defaults to 1.5 px at 16 px, scaled with the image's width."""
    source = ex["source"]
    if result.size != source.size:
        result = result.resize(source.size, Image.NEAREST)
    width = result.size[0]
    tolerance = 1.5 * width / 16 if tolerance is None else tolerance
    objects = detect_objects(result)
    edit = ex["edit"]
    index = _target_index(ex)
    want = ex["spec"][index]
    if edit["kind"] == "move":
        mid = width / 2
        place = (lambda o: o["cx"] < mid) if edit["direction"] == "left" else (lambda o: o["cx"] > mid)
    elif edit["kind"] == "recolor":
        centre = _centre(want["box"])
        place = lambda o: _near(o, centre, tolerance)  # noqa: E731
    else:
        place = lambda o: True  # noqa: E731
    mine = [o for o in objects if o["color"] == want["color"]]
    placed = [o for o in mine if place(o)]
    kept = [o for i, o in enumerate(ex["spec"]) if i != index]
    out = {
        "color": bool(mine),
        "position": bool(placed),
        "shape": any(o["shape"] == want["shape"] for o in placed),
        "kept": all(any(d["color"] == o["color"] and d["shape"] == o["shape"] and _near(d, _centre(o["box"]), tolerance)
                        for d in objects) for o in kept),
        "no_extra": len(objects) == len(ex["spec"]),
        "background": outside_agreement(result, source, ex.get("mask")) >= min_agreement,
    }
    return out


def outside_agreement(result: Image.Image, source: Image.Image, mask) -> float:
    """The share of pixels outside ``mask`` (all pixels when None) whose palette class in ``result``
    equals the one in ``source``."""
    same = classify_pixels(result) == classify_pixels(source)
    outside = np.ones_like(same) if mask is None else ~np.asarray(mask, dtype=bool)
    return float(same[outside].mean()) if outside.any() else 1.0


def masked_preservation(result: Image.Image, source: Image.Image, mask=None) -> float:
    """1 - the mean absolute difference of ``result`` and ``source`` over the pixels outside
    ``mask`` (RGB in [0, 1], channels averaged), in [0, 1]: MagicBrush's L1 (Zhang et al., 2023)
    restricted to the unedited region, as PIE-Bench (Ju et al., 2024) restricts its background
    metrics. No mask: the whole image (then the edit itself costs its own pixels' share).
    ``source`` and ``mask`` are resized to ``result``'s size when they differ."""
    if source.size != result.size:
        source = source.resize(result.size, Image.BICUBIC)
    a = np.asarray(result.convert("RGB"), dtype=np.float32) / 255.0
    b = np.asarray(source.convert("RGB"), dtype=np.float32) / 255.0
    diff = np.abs(a - b).mean(-1)
    if mask is None:
        return float(1.0 - diff.mean())
    keep = ~np.asarray(mask, dtype=bool)
    if keep.shape != diff.shape:
        keep = np.asarray(Image.fromarray(keep).resize(result.size, Image.NEAREST), dtype=bool)
    return float(1.0 - diff[keep].mean()) if keep.any() else 1.0
