"""Deterministic synthetic text-to-video clips: one coloured shape moving in a stated direction.

The tiny video generator (``mmrl build-tiny video-gen``) is pretrained on ``render_clip(spec)``
clips and RL-trained with the ``motion`` reward (``rewards/motion.py``), which checks a generated
clip against the same spec with :func:`mmrl.measures.motion.motion_checks`. The frames are the
still scenes of :mod:`mmrl.data.shapes_t2i` (palette colours, no anti-aliasing), so the object is
found in every frame from pixels alone, and the object moves one grid cell per frame (see
:func:`motion_boxes`) so its displacement is exact.

A spec is ``{"color", "shape", "direction": "left" | "right" | "up" | "down"}``; its prompt reads
"a red circle moving left". Everything is driven by an explicit ``numpy.random.Generator`` (or an
int seed): the same seed gives the same spec and pixels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from .shapes_t2i import BACKGROUND, COLORS, SHAPES, _rng, draw_shape

DIRECTIONS: dict[str, tuple[int, int]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
CLIP_SIZE = 16  # the tiny generator's frame side
NUM_FRAMES = 4
GRID = 4  # the frame is GRID x GRID cells; the object fills one and moves one cell per frame


def validate_motion_spec(spec: dict) -> dict:
    """Raise ValueError unless ``spec`` names a known colour, shape and direction."""
    if not isinstance(spec, dict):
        raise ValueError(f"a motion spec is a dict with color, shape and direction, got {spec!r}")
    for key, known in (("color", tuple(COLORS)), ("shape", SHAPES), ("direction", tuple(DIRECTIONS))):
        if spec.get(key) not in known:
            raise ValueError(f"motion spec: unknown {key} {spec.get(key)!r}; known: {known}")
    return spec


def sample_motion_spec(rng: Any) -> dict:
    rng = _rng(rng)
    pick = lambda options: options[int(rng.integers(len(options)))]  # noqa: E731
    return {"color": pick(tuple(COLORS)), "shape": pick(SHAPES), "direction": pick(tuple(DIRECTIONS))}


def motion_prompt(spec: dict) -> str:
    """"a red circle moving left"."""
    validate_motion_spec(spec)
    return f"a {spec['color']} {spec['shape']} moving {spec['direction']}"


def motion_boxes(spec: dict, rng: Any, size: int = CLIP_SIZE, num_frames: int = NUM_FRAMES) -> list[tuple[int, int, int, int]]:
    """The object's box ``(x1, y1, x2, y2)`` (right/bottom exclusive) in each frame.

    The frame is a ``GRID`` x ``GRID`` grid of cells (4-px cells at 16 px: the tiny generator's
    patches); the object fills one cell and moves one cell per frame in the spec's direction, in a
    random row (or column), starting as far back as the clip's length allows (with 4 frames: from
    one edge to the other). Cell-aligned motion is what a ~0.5M-parameter transformer learns to
    draw coherently across frames within minutes on a CPU; shifts of a few pixels it did not
    (measured: the tracked object jumped between frames)."""
    validate_motion_spec(spec)
    rng = _rng(rng)
    cell = size // GRID
    if num_frames > GRID:
        raise ValueError(f"{num_frames} frames of one cell each do not fit a {GRID}-cell frame")
    dx, dy = DIRECTIONS[spec["direction"]]
    lane = int(rng.integers(GRID))  # the row (left/right) or column (up/down) it moves along
    first = int(rng.integers(GRID - num_frames + 1))  # cells from the starting edge

    def cells(t: int) -> tuple[int, int]:
        along = first + t if (dx or dy) > 0 else GRID - 1 - first - t
        return (along, lane) if dx else (lane, along)

    return [(cx * cell, cy * cell, (cx + 1) * cell, (cy + 1) * cell) for cx, cy in map(cells, range(num_frames))]


def render_clip(spec: dict, rng: Any, size: int = CLIP_SIZE, num_frames: int = NUM_FRAMES) -> list[Image.Image]:
    """The clip of ``spec``: ``num_frames`` RGB ``size`` x ``size`` frames (the pretraining target)."""
    frames = []
    for box in motion_boxes(spec, rng, size, num_frames):
        frame = Image.new("RGB", (size, size), BACKGROUND)
        draw_shape(ImageDraw.Draw(frame), spec["shape"], box, COLORS[spec["color"]])
        frames.append(frame)
    return frames


def motion_example(rng_or_seed: Any, size: int = CLIP_SIZE, num_frames: int = NUM_FRAMES,
                   direction_noise: float = 0.0) -> dict:
    """``{"spec", "prompt", "frames"}`` of one random clip. With ``direction_noise`` the prompt names
    another direction at that rate (captions that, like web alt-text, are sometimes wrong); ``spec``
    stays the truth of the frames."""
    rng = _rng(rng_or_seed)
    spec = sample_motion_spec(rng)
    frames = render_clip(spec, rng, size, num_frames)
    said = dict(spec)
    if direction_noise and rng.random() < direction_noise:
        others = [d for d in DIRECTIONS if d != spec["direction"]]
        said["direction"] = others[int(rng.integers(len(others)))]
    return {"spec": spec, "prompt": motion_prompt(said), "frames": frames}


def clip_array(frames: list[Image.Image]) -> np.ndarray:
    """(F, 3, H, W) uint8 of a list of frames."""
    return np.stack([np.asarray(f.convert("RGB"), dtype=np.uint8).transpose(2, 0, 1) for f in frames])
