"""One coordinate system for boxes and points, and conversions to what each model family emits.

Box rewards sit at zero when the prediction and the label are compared in different spaces (a
Qwen2.5-VL box in resized-image pixels against a label in original pixels), so every box in mmrl
states its space, and comparisons convert to original-image pixels first. The spaces:

- ``pixel``: pixels of the original image (how most dataset files store boxes);
- ``resized``: pixels of the image the model saw after Qwen-VL's ``smart_resize`` under
  ``min_pixels``/``max_pixels`` (what Qwen2.5-VL is trained to output);
- ``rel1000``: 0-1000 relative coordinates (Qwen2-VL and Qwen3-VL output);
- ``norm``: 0-1 relative coordinates (some dataset formats).

A :class:`Frame` holds the original size and, when known, the resized size; with it any box
converts between any two spaces (x by width ratios, y by height ratios).
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Optional, Sequence

SPACES = ("pixel", "resized", "rel1000", "norm")

# What each family is trained to write in its grounding answers (config.model_type).
FAMILY_OUTPUT_SPACE = {
    "qwen2_vl": "rel1000",
    "qwen2_5_vl": "resized",
    "qwen3_vl": "rel1000",
    "qwen3_vl_moe": "rel1000",
    # InternVL's grounding answers: <ref>..</ref><box>[[x1, y1, x2, y2]]</box> normalised to 0-1000
    # (InternVL documentation, "Grounding" / RefCOCO evaluation: coordinates / 1000 * image size).
    "internvl": "rel1000",
    # GLM-4.1V / GLM-V: boxes between <|begin_of_box|> and <|end_of_box|>, x and y normalised to 0-1000 of
    # the image (zai-org's GLM-V grounding documentation: x = round(x_pixel / W * 1000)).
    "glm4v": "rel1000",
}

# Families whose documentation states no grounding convention: box and point rewards refuse them
# rather than guess a space (set vlm.box_space when a checkpoint was fine-tuned to answer in one).
NO_GROUNDING_CONVENTION = {
    # Google's Gemma 3 technical report and model card describe no box or point output format.
    "gemma3": "Gemma 3 (its technical report and model card state no box or point output format)",
    # Idefics3 / SmolVLM model cards: captioning, VQA, OCR; no grounding output format.
    "idefics3": "Idefics3 (its model card states no box or point output format)",
    "smolvlm": "SmolVLM / SmolVLM2 (their model cards state no box or point output format)",
    # LLaVA-1.5 wrote 0-1 boxes, but neither the LLaVA-OneVision paper nor its transformers model cards
    # state a box format for OneVision: not assumed.
    "llava_onevision": "LLaVA-OneVision (its paper and model cards state no box or point output format)",
}

# The pred_space recorded for such a family's examples: "undeclared:<model_type>".
UNDECLARED = "undeclared"


class NoCoordinateFrame(RuntimeError):
    """A box or point was read from a model whose family declares no coordinate frame. Not a
    ValueError on purpose: parsers that score unparsable text 0 must not swallow it."""


def _check_space(space: str) -> None:
    if space not in SPACES:
        raise ValueError(f"unknown coordinate space {space!r}; valid spaces: {', '.join(SPACES)}")


@dataclass(frozen=True)
class Frame:
    """An image's original size and (optionally) the size the model saw, both (width, height)."""

    width: float
    height: float
    resized_width: Optional[float] = None
    resized_height: Optional[float] = None

    def units_per_pixel(self, space: str) -> tuple[float, float]:
        """How many units of ``space`` one original pixel spans, along x and y."""
        _check_space(space)
        if space == "pixel":
            return 1.0, 1.0
        if space == "norm":
            return 1.0 / self.width, 1.0 / self.height
        if space == "rel1000":
            return 1000.0 / self.width, 1000.0 / self.height
        if self.resized_width is None or self.resized_height is None:
            raise ValueError(
                "a 'resized' coordinate needs the resized image size: build the Frame with "
                "resized_width/resized_height (see qwen_frame)"
            )
        return self.resized_width / self.width, self.resized_height / self.height


def convert_points(coords: Sequence[float], src: str, dst: str, frame: Frame) -> tuple[float, ...]:
    """Convert flat (x, y, x, y, ...) coordinates (a box x1, y1, x2, y2 or a click x, y)."""
    if len(coords) % 2:
        raise ValueError(f"coordinates come in (x, y) pairs, got {len(coords)} numbers")
    sx, sy = frame.units_per_pixel(src)
    dx, dy = frame.units_per_pixel(dst)
    out = []
    for i, v in enumerate(coords):
        out.append(float(v) / sx * dx if i % 2 == 0 else float(v) / sy * dy)
    return tuple(out)


def convert_box(box: Sequence[float], src: str, dst: str, frame: Frame) -> tuple[float, float, float, float]:
    if len(box) != 4:
        raise ValueError(f"a box is (x1, y1, x2, y2), got {len(box)} numbers")
    return convert_points(box, src, dst, frame)  # type: ignore[return-value]


def box_problem(box: Sequence[float], width: float, height: float, slack: float = 0.01) -> str | None:
    """Why ``box`` (x1, y1, x2, y2 in pixels of a ``width`` x ``height`` image) cannot be a
    training target, or None: it must be finite, have x1 < x2 and y1 < y2 (an inverted box is not
    silently reordered: its file may mean another layout) and lie on the image (``slack`` of the
    side allowed for annotation rounding)."""
    if len(box) != 4 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in box):
        return f"box {list(box)} is not 4 finite numbers"
    x1, y1, x2, y2 = box
    if not (x1 < x2 and y1 < y2):
        return f"box {list(box)} is inverted or empty (needs x1 < x2 and y1 < y2)"
    dx, dy = slack * width, slack * height
    if x1 < -dx or y1 < -dy or x2 > width + dx or y2 > height + dy:
        return f"box {list(box)} lies outside the {int(width)}x{int(height)} image"
    return None


def point_problem(point: Sequence[float], width: float, height: float, slack: float = 0.01) -> str | None:
    """Why ``point`` (x, y in pixels) cannot be a click target on a ``width`` x ``height`` image,
    or None (finite, on the image within ``slack`` of the side)."""
    if len(point) != 2 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in point):
        return f"point {list(point)} is not 2 finite numbers"
    x, y = point
    if not (-slack * width <= x <= width * (1 + slack) and -slack * height <= y <= height * (1 + slack)):
        return f"point {list(point)} lies outside the {int(width)}x{int(height)} image"
    return None


def qwen_resized_size(width: int, height: int, min_pixels: int, max_pixels: int, factor: int = 28) -> tuple[int, int]:
    """(width, height) of the image Qwen-VL sees: transformers' own ``smart_resize`` (multiples of
    ``factor`` = patch_size * merge_size, pixel count within the budget, aspect ratio kept)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    h, w = smart_resize(int(height), int(width), factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    return w, h


def qwen_frame(image_size: Sequence[int], image_processor) -> Frame:
    """The :class:`Frame` of an image of ``image_size`` (width, height) under a Qwen-VL image
    processor's budget (its ``min_pixels``/``max_pixels`` or ``size`` shortest/longest edge)."""
    size = dict(getattr(image_processor, "size", None) or {})
    min_pixels = getattr(image_processor, "min_pixels", None) or size.get("shortest_edge")
    max_pixels = getattr(image_processor, "max_pixels", None) or size.get("longest_edge")
    if min_pixels is None or max_pixels is None:
        raise ValueError("the image processor states no min_pixels/max_pixels budget")
    factor = int(getattr(image_processor, "patch_size", 14)) * int(getattr(image_processor, "merge_size", 2))
    w, h = qwen_resized_size(image_size[0], image_size[1], int(min_pixels), int(max_pixels), factor)
    return Frame(float(image_size[0]), float(image_size[1]), float(w), float(h))


def declares_space(model_type: str) -> bool:
    """Whether mmrl knows the coordinate space ``model_type``'s family answers in."""
    return model_type in FAMILY_OUTPUT_SPACE


def _refuse(model_type: str) -> NoCoordinateFrame:
    why = NO_GROUNDING_CONVENTION.get(model_type, f"model_type {model_type!r}")
    return NoCoordinateFrame(
        f"{why} declares no coordinate frame for boxes or points, so grounding rewards and metrics refuse "
        "to read its answers rather than guess one. If your checkpoint was fine-tuned to answer in one, set "
        f"vlm.box_space to it ({', '.join(SPACES)})")


def output_space(model_type: str) -> str:
    """The coordinate space a model family writes boxes in (from its config's ``model_type``)."""
    if model_type in NO_GROUNDING_CONVENTION:
        raise _refuse(model_type)
    if model_type not in FAMILY_OUTPUT_SPACE:
        raise ValueError(
            f"no known box coordinate space for model_type {model_type!r} "
            f"(known: {', '.join(sorted(FAMILY_OUTPUT_SPACE))}); state the space of your model's boxes explicitly"
        )
    return FAMILY_OUTPUT_SPACE[model_type]


def prediction_to_pixels(coords: Sequence[float], ex: dict) -> tuple[float, ...]:
    """A model's predicted coordinates as original-image pixels, using what the trainer recorded
    on the example: ``ex["pred_space"]`` (the policy's output space) and ``ex["frame"]``.
    Examples without them (e.g. scored outside a run) are taken to be in pixels already; a
    family without a declared frame raises :class:`NoCoordinateFrame`."""
    space, frame = ex.get("pred_space", "pixel"), ex.get("frame")
    if str(space).startswith(UNDECLARED):
        raise _refuse(str(space).partition(":")[2])
    if space == "pixel" or frame is None:
        return tuple(float(v) for v in coords)
    return convert_points(coords, space, "pixel", frame)


def pixels_to_prediction(coords: Sequence[float], ex: dict) -> tuple[float, ...]:
    """The inverse of :func:`prediction_to_pixels`: label coordinates in the policy's space
    (for reference completions: SFT targets, off-policy guidance)."""
    space, frame = ex.get("pred_space", "pixel"), ex.get("frame")
    if str(space).startswith(UNDECLARED):
        raise _refuse(str(space).partition(":")[2])
    if space == "pixel" or frame is None:
        return tuple(float(v) for v in coords)
    return convert_points(coords, "pixel", space, frame)
