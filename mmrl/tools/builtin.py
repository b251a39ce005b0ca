"""The built-in tools: ``zoom_in`` (DeepEyes' ``image_zoom_in_tool``, also registered under that
name), ``crop``, ``rotate`` and ``zoom_cell`` (mmrl's own: a named grid cell, for models that
cannot regress boxes).

Boxes are written in the model's coordinate frame (Qwen2.5-VL: pixels of the resized image it
saw) and converted to pixels of the original image with :func:`mmrl.media.coords.prediction_to_pixels`
and the example's ``pred_space`` / ``frame``; they always refer to the conversation's first image,
as DeepEyes' toolbox crops ``multi_modal_data['image'][0]``.

``zoom_in`` follows DeepEyes ("DeepEyes: Incentivizing 'Thinking with Images' via Reinforcement
Learning", Zheng et al., 2025; ``verl/workers/agent/envs/mm_process_engine/visual_toolbox_v5.py``,
``maybe_resize_bbox``): the box is clamped to the image; it must then have x1 < x2, y1 < y2 and an
aspect ratio of at most 100; a box with a side under 28 px is grown about its centre so that its
shorter side is 28 px (half-sides ``ceil(side * 28 / min_side / 2)``, edges floored / ceiled, not
clamped again: PIL fills what lies off the image with black) and checked again. The crop is then
resized as DeepEyes' evaluation script (``eval/eval_vstar.py``) does: each side to a multiple of 28
by Qwen-VL's ``smart_resize`` with ``min_pixels`` 4*28*28 and ``max_pixels`` 16384*28*28, bicubic
(DeepEyes' training toolbox returns the crop unresized and lets the processor resize it:
``resize=False``). Raise ``min_pixels`` to the policy's ``vlm.max_pixels`` so a small region is
shown at the full budget (the ``zoom_qa`` task needs it).
"""

from __future__ import annotations

import math
from typing import Any

from mmrl.media.coords import prediction_to_pixels, qwen_resized_size

from .base import Tool, ToolArgumentError, ToolObservation, ToolState, register_tool

BOX_SCHEMA = {"type": "array", "items": {"type": "number"}, "minItems": 4, "maxItems": 4,
              "description": "The bounding box of the region, as [x1, y1, x2, y2], where (x1, y1) is the "
                             "top-left corner and (x2, y2) is the bottom-right corner."}
DEEPEYES_MIN_SIDE = 28  # maybe_resize_bbox: a crop side under 28 px is grown to 28
DEEPEYES_MAX_ASPECT = 100  # validate_bbox: max(h, w) / min(h, w) <= 100
FACTOR = 28  # Qwen2.5-VL: patch 14 x merge 2
EVAL_MIN_PIXELS, EVAL_MAX_PIXELS = 4 * 28 * 28, 16384 * 28 * 28  # DeepEyes' eval_vstar.py


def read_box(arguments: dict, key: str, state: ToolState) -> tuple[float, float, float, float]:
    """``arguments[key]`` (4 finite numbers in the model's frame) as original-image pixels."""
    box = arguments.get(key)
    if not isinstance(box, (list, tuple)) or len(box) != 4:
        raise ToolArgumentError(f"'{key}' must be a list of 4 numbers [x1, y1, x2, y2], got {box!r}")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box):
        raise ToolArgumentError(f"'{key}' must hold 4 finite numbers, got {list(box)!r}")
    return tuple(prediction_to_pixels(box, state.example))  # type: ignore[return-value]


def clamp_box(box, width: int, height: int) -> tuple[float, float, float, float]:
    """``box`` clamped to a ``width`` x ``height`` image; a box that then has no area (off the
    image, inverted or empty) raises :class:`ToolArgumentError`."""
    x1, y1, x2, y2 = max(0.0, box[0]), max(0.0, box[1]), min(float(width), box[2]), min(float(height), box[3])
    if not (x1 < x2 and y1 < y2):
        raise ToolArgumentError(
            f"the box {[round(v, 1) for v in box]} (in original pixels) has no area on the {width}x{height} "
            "image: it lies off the image or has x2 <= x1 or y2 <= y1")
    return x1, y1, x2, y2


def _check_aspect(box) -> None:
    w, h = box[2] - box[0], box[3] - box[1]
    if max(w, h) / min(w, h) > DEEPEYES_MAX_ASPECT:
        raise ToolArgumentError(f"the box is {w:g}x{h:g} pixels: its aspect ratio exceeds {DEEPEYES_MAX_ASPECT}")


def deepeyes_box(box, width: int, height: int, min_side: int = DEEPEYES_MIN_SIDE) -> tuple[float, ...]:
    """DeepEyes' ``maybe_resize_bbox``: clamp, check, grow a side under ``min_side`` about the
    centre, check again (see the module docstring). Pixels of the original image."""
    left, top, right, bottom = clamp_box(box, width, height)
    _check_aspect((left, top, right, bottom))
    h, w = bottom - top, right - left
    if h >= min_side and w >= min_side:
        return left, top, right, bottom
    cx, cy = (left + right) / 2.0, (top + bottom) / 2.0
    ratio = min_side / min(h, w)
    half_h, half_w = math.ceil(h * ratio * 0.5), math.ceil(w * ratio * 0.5)
    grown = (math.floor(cx - half_w), math.floor(cy - half_h), math.ceil(cx + half_w), math.ceil(cy + half_h))
    _check_aspect(grown)
    return tuple(float(v) for v in grown)


def pil_box(box) -> tuple[int, int, int, int]:
    """The integer box PIL's ``crop`` uses for ``box`` (it rounds each coordinate)."""
    return tuple(int(round(v)) for v in box)  # type: ignore[return-value]


@register_tool("zoom_in")
class ZoomIn(Tool):
    description = ("Zoom in on a specific region of an image by cropping it based on a bounding box (bbox_2d) "
                   "and an optional object label.")
    parameters = {"type": "object",
                  "properties": {"bbox_2d": BOX_SCHEMA,
                                 "label": {"type": "string",
                                           "description": "The name or label of the object in the box (optional)."}},
                  "required": ["bbox_2d"]}
    example_arguments = {"bbox_2d": [10, 20, 100, 200], "label": "the apple on the desk"}

    def default_options(self) -> dict[str, Any]:
        return {"min_side": DEEPEYES_MIN_SIDE, "resize": True, "min_pixels": EVAL_MIN_PIXELS,
                "max_pixels": EVAL_MAX_PIXELS}

    def __call__(self, arguments: dict, state: ToolState) -> ToolObservation:
        image = state.image
        box = pil_box(deepeyes_box(read_box(arguments, "bbox_2d", state), *image.size, self.options["min_side"]))
        crop = image.crop(box)
        if self.options["resize"]:
            w, h = qwen_resized_size(crop.width, crop.height, self.options["min_pixels"], self.options["max_pixels"], FACTOR)
            crop = crop.resize((w, h), resample=3)  # PIL.Image.BICUBIC
        return ToolObservation(image=crop, box=box)


@register_tool("image_zoom_in_tool")
class DeepEyesZoomIn(ZoomIn):
    """``zoom_in`` under DeepEyes' name, for checkpoints and prompts trained with it."""


@register_tool("crop")
class Crop(Tool):
    description = "Crop a region of the image (bbox_2d) and return it at its own resolution."
    parameters = {"type": "object", "properties": {"bbox_2d": BOX_SCHEMA}, "required": ["bbox_2d"]}
    example_arguments = {"bbox_2d": [10, 20, 100, 200]}

    def __call__(self, arguments: dict, state: ToolState) -> ToolObservation:
        image = state.image
        box = pil_box(clamp_box(read_box(arguments, "bbox_2d", state), *image.size))
        if box[2] <= box[0] or box[3] <= box[1]:
            raise ToolArgumentError(f"the box {list(box)} is less than a pixel wide or high")
        return ToolObservation(image=image.crop(box), box=box)


@register_tool("rotate")
class Rotate(Tool):
    description = "Rotate the image by an angle in degrees (positive: clockwise), enlarged to keep all of it."
    parameters = {"type": "object",
                  "properties": {"angle": {"type": "number", "description": "Degrees; positive turns clockwise."}},
                  "required": ["angle"]}
    example_arguments = {"angle": 90}

    def __call__(self, arguments: dict, state: ToolState) -> ToolObservation:
        angle = arguments.get("angle")
        if isinstance(angle, bool) or not isinstance(angle, (int, float)) or not math.isfinite(angle):
            raise ToolArgumentError(f"'angle' must be a finite number of degrees, got {angle!r}")
        # PIL turns counter-clockwise for a positive angle; expand keeps the corners
        return ToolObservation(image=state.image.rotate(-float(angle), expand=True))


def cell_box(name: Any, grid: int, width: int, height: int) -> tuple[int, int, int, int]:
    """The pixel box of grid cell ``name`` ("B3": row B from the top, column 3 from the left) of a
    ``grid`` x ``grid`` split of a ``width`` x ``height`` image."""
    rows = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:grid]
    text = name.strip().upper() if isinstance(name, str) else ""
    if len(text) < 2 or text[0] not in rows or not text[1:].isdigit() or not 1 <= int(text[1:]) <= grid:
        raise ToolArgumentError(f"'cell' must name a cell of the {grid}x{grid} grid, a row {rows[0]}-{rows[-1]} "
                                f"then a column 1-{grid} (e.g. \"B2\"), got {name!r}")
    r, c = rows.index(text[0]), int(text[1:]) - 1
    return (c * width // grid, r * height // grid, (c + 1) * width // grid, (r + 1) * height // grid)


def cell_name(box, grid: int, width: int, height: int) -> str:
    """The name of the grid cell that holds the centre of ``box`` (pixels)."""
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[min(grid - 1, int(cy * grid // height))] + str(min(grid, int(cx * grid // width) + 1))


@register_tool("zoom_cell")
class ZoomCell(Tool):
    """mmrl's own: zoom into one cell of a grid laid over the image, named like a spreadsheet
    cell. For a model that cannot regress boxes (the tiny default): its argument is one of
    grid x grid names, not coordinates, so it needs no coordinate frame. The cell is returned at
    its own resolution, or with ``min_pixels`` resized up as ``zoom_in`` resizes."""

    description = ("Zoom in on one cell of a grid over the image: rows A, B, ... from the top, columns 1, 2, ... "
                   "from the left (e.g. \"B2\").")
    parameters = {"type": "object", "properties": {"cell": {"type": "string", "description": "The cell, e.g. \"B2\"."}},
                  "required": ["cell"]}
    example_arguments = {"cell": "B2"}

    def default_options(self) -> dict[str, Any]:
        return {"grid": 4, "min_pixels": None}

    def __init__(self, **options: Any):
        super().__init__(**options)
        grid = self.options["grid"]
        if isinstance(grid, bool) or not isinstance(grid, int) or not 1 <= grid <= 26:
            raise ValueError(f"zoom_cell: grid must be an int in [1, 26], got {grid!r}")
        self.example_arguments = {"cell": "A1" if grid < 2 else "B2"}

    def __call__(self, arguments: dict, state: ToolState) -> ToolObservation:
        image = state.image
        box = cell_box(arguments.get("cell"), self.options["grid"], *image.size)
        crop = image.crop(box)
        if self.options["min_pixels"]:
            w, h = qwen_resized_size(crop.width, crop.height, self.options["min_pixels"], EVAL_MAX_PIXELS, FACTOR)
            crop = crop.resize((w, h), resample=3)
        return ToolObservation(image=crop, box=box)
