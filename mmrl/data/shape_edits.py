"""Deterministic synthetic image edits on the shape scenes of :mod:`mmrl.data.shapes_t2i`.

An edit example is a source scene of 1 or 2 objects (one per colour), an instruction of one of
three kinds, and what the edit must give:

- ``recolor``: "make the red circle blue" (the object keeps its place and shape);
- ``move``: "move the blue square to the right" (an object wholly in one half goes to the other;
  the target mirrors it across the midline, any place in that half passes the check);
- ``add``: "add a yellow circle" (a new object of a colour not yet in the scene, anywhere free).

Each example carries the source and target images, the target scene (``spec``: the objects with
their boxes), the edit itself (``edit``), and ``mask``: the ground-truth edit region, an (H, W)
bool array of the pixels the edit may change (the recoloured object's box; the moved object's box
and the free part of the half it goes to; the free background for an added object; "free" leaves
a 1-px ring around the other objects). Everything outside the mask must stay as the source has it.

Scenes follow :mod:`mmrl.data.shapes_t2i`'s rules (palette colours, no anti-aliasing, 1-px gaps),
so :mod:`mmrl.measures.edits` verifies an edit from pixels alone. Driven by an explicit
``numpy.random.Generator`` or int seed: the same seed gives the same example. 16x16 by default,
the size of the shipped tiny generators.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from .shapes_t2i import BACKGROUND, COLORS, POSITIONS, SHAPES, _apart, _rng, draw_shape, place_objects

EDIT_SIZE = 16
KINDS: tuple[str, ...] = ("recolor", "move", "add")
MAX_OBJECTS = 2  # in the source scene
_TRIES = 200


def instruction(edit: dict) -> str:
    """The instruction of an ``edit`` dict (see :func:`edit_example`)."""
    kind = edit["kind"]
    if kind == "recolor":
        return f"make the {edit['color']} {edit['shape']} {edit['new_color']}"
    if kind == "move":
        return f"move the {edit['color']} {edit['shape']} to the {edit['direction']}"
    if kind == "add":
        return f"add a {edit['color']} {edit['shape']}"
    raise ValueError(f"unknown edit kind {kind!r}; known: {KINDS}")


def draw_objects(objects: list[dict], size: int) -> Image.Image:
    """An RGB image of ``objects`` (``{"color", "shape", "box"}``) on the plain background."""
    image = Image.new("RGB", (size, size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for obj in objects:
        draw_shape(draw, obj["shape"], tuple(obj["box"]), COLORS[obj["color"]])
    return image


def _box_mask(box, size: int, grow: int = 0) -> np.ndarray:
    x1, y1, x2, y2 = box
    mask = np.zeros((size, size), dtype=bool)
    mask[max(0, y1 - grow):min(size, y2 + grow), max(0, x1 - grow):min(size, x2 + grow)] = True
    return mask


def _free(others: list[dict], size: int) -> np.ndarray:
    """The pixels at least one pixel away from every object of ``others``."""
    taken = np.zeros((size, size), dtype=bool)
    for obj in others:
        taken |= _box_mask(obj["box"], size, grow=1)
    return ~taken


def _half(direction: str, size: int) -> np.ndarray:
    mask = np.zeros((size, size), dtype=bool)
    if direction == "left":
        mask[:, :size // 2] = True
    else:
        mask[:, (size + 1) // 2:] = True
    return mask


def _layout(kind: str, rng: np.random.Generator, size: int) -> tuple[list[dict], dict, list[dict], np.ndarray]:
    """(source objects, edit, target objects, mask) of one random edit of ``kind``."""
    n = int(rng.integers(1, MAX_OBJECTS + 1))
    names = list(COLORS)
    colors = [names[i] for i in rng.choice(len(names), size=n + 1, replace=False)]  # the last: a new colour
    shapes = [SHAPES[int(rng.integers(len(SHAPES)))] for _ in range(n + 1)]
    side = POSITIONS[int(rng.integers(len(POSITIONS)))] if kind == "move" else None
    placed = n + 1 if kind == "add" else n
    for _ in range(_TRIES):
        groups = [{"count": 1, "position": side if i == 0 else None} for i in range(placed)]
        boxes = place_objects(groups, rng, size)
        objects = [{"color": c, "shape": s, "box": b} for c, s, b in zip(colors, shapes, boxes)]
        if kind == "recolor":
            source = objects
            target = [{**objects[0], "color": colors[n]}] + objects[1:]
            edit = {"kind": kind, "color": colors[0], "shape": shapes[0], "new_color": colors[n]}
            return source, edit, target, _box_mask(objects[0]["box"], size)
        if kind == "add":
            source, target = objects[:n], objects
            edit = {"kind": kind, "color": colors[n], "shape": shapes[n]}
            return source, edit, target, _free(source, size)
        x1, y1, x2, y2 = objects[0]["box"]
        moved = (size - x2, y1, size - x1, y2)  # mirrored across the vertical midline
        gap = max(1, round(size / 32))
        if all(_apart(moved, tuple(o["box"]), gap) for o in objects[1:]):
            direction = "right" if side == "left" else "left"
            target = [{**objects[0], "box": moved}] + objects[1:]
            edit = {"kind": kind, "color": colors[0], "shape": shapes[0], "direction": direction}
            mask = _box_mask(objects[0]["box"], size) | (_half(direction, size) & _free(objects[1:], size))
            return objects, edit, target, mask
    raise RuntimeError(f"could not lay out a {kind} edit in a {size}x{size} image")


def misstate(edit: dict, rng: np.random.Generator, scene_colors: set[str]) -> dict:
    """A copy of ``edit`` whose new colour (recolour, add) is another one, not in the scene: the
    caption noise of the tiny editing generator's pretraining (moves are left as they are)."""
    out = dict(edit)
    key = {"recolor": "new_color", "add": "color"}.get(edit["kind"])
    if key is None:
        return out
    others = [c for c in COLORS if c != edit[key] and c not in scene_colors]
    if others:
        out[key] = others[int(rng.integers(len(others)))]
    return out


def edit_example(rng_or_seed: Any, size: int = EDIT_SIZE, kinds: tuple[str, ...] = KINDS,
                 color_noise: float = 0.0) -> dict:
    """One random edit: ``{"kind", "instruction", "prompt" (the instruction), "source", "target"
    (PIL images), "spec" (the target objects), "source_objects", "edit", "mask"}``. With
    ``color_noise`` the instruction misstates the new colour at that rate (:func:`misstate`);
    ``edit``, ``spec`` and the images stay the truth."""
    unknown = set(kinds) - set(KINDS)
    if not kinds or unknown:
        raise ValueError(f"kinds must be some of {KINDS}, got {kinds!r}")
    if not 0.0 <= color_noise <= 1.0:
        raise ValueError(f"color_noise must lie in [0, 1], got {color_noise}")
    rng = _rng(rng_or_seed)
    kind = kinds[int(rng.integers(len(kinds)))]
    source, edit, target, mask = _layout(kind, rng, size)
    said = edit
    if color_noise and rng.random() < color_noise:
        said = misstate(edit, rng, {o["color"] for o in source} | {edit.get("color")})
    text = instruction(said)
    return {"kind": kind, "instruction": text, "prompt": text, "source": draw_objects(source, size),
            "target": draw_objects(target, size), "spec": target, "source_objects": source, "edit": edit,
            "mask": mask}
