"""Deterministic synthetic clips: shapes that move, appear and disappear on the scene grid.

A clip is ``steps`` scenes of :mod:`mmrl.data.scenes` (112-px images, 4x4 grid of 28-px cells),
each held for ``frames_per_step`` frames. Holding a scene for exactly the vision tower's temporal
patch (2 frames in Qwen2-VL / 2.5-VL) makes every video token see one still scene, the same
token an image of that scene gives, so a model that reads the scenes can learn what changes
between them. At ``fps`` 2.0 (qwen-vl-utils' default sampling rate) a step lasts one second.

Every function takes an explicit ``random.Random``: the same seed gives the same pixels.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Optional, Sequence

from PIL import Image

from .scenes import COLORS, DEFAULT_GRID, DEFAULT_SIZE, SHAPES, SceneObject, place_in_cell, render_scene

DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}


@dataclass
class Track:
    """One object through a clip: its cell at each step, None where it is not shown."""

    shape: str
    color: str
    cells: list[Optional[int]]

    @property
    def visible(self) -> list[int]:
        return [t for t, c in enumerate(self.cells) if c is not None]


@dataclass
class SceneClip:
    """The frames of a synthetic clip and what is in them."""

    frames: list[Image.Image]
    tracks: list[Track]
    steps: int
    frames_per_step: int
    fps: float
    boxes: list[list[Optional[tuple[int, int, int, int]]]] = field(default_factory=list)  # [track][step]

    @property
    def step_seconds(self) -> float:
        return self.frames_per_step / self.fps

    @property
    def duration(self) -> float:
        return self.steps * self.step_seconds

    def segment(self, track: Track) -> tuple[float, float]:
        """Seconds from the first frame showing ``track`` to the end of its last one."""
        first, last = track.visible[0], track.visible[-1]
        return first * self.step_seconds, (last + 1) * self.step_seconds


def render_clip(rng: random.Random, tracks: Sequence[Track], steps: int, frames_per_step: int = 2,
                fps: float = 2.0, size: int = DEFAULT_SIZE, grid: int = DEFAULT_GRID) -> SceneClip:
    """Draw ``tracks``: one box per (track, cell), kept while the object stays in the cell."""
    boxes: list[list[Optional[tuple[int, int, int, int]]]] = []
    for track in tracks:
        placed: dict[int, tuple[int, int, int, int]] = {}
        row = []
        for cell in track.cells:
            if cell is not None and cell not in placed:
                placed[cell] = place_in_cell(rng, cell, size, grid)
            row.append(None if cell is None else placed[cell])
        boxes.append(row)
    frames = []
    for t in range(steps):
        objects = [SceneObject(tr.shape, tr.color, boxes[i][t]) for i, tr in enumerate(tracks) if tr.cells[t] is not None]
        image = render_scene(objects, size).image
        frames += [image] * frames_per_step
    return SceneClip(frames, list(tracks), steps, frames_per_step, fps, boxes)


def _distinct_pairs(rng: random.Random, n: int) -> list[tuple[str, str]]:
    return rng.sample([(c, s) for c in COLORS for s in SHAPES], n)


def motion_clip(rng: random.Random, steps: int = 4, distractors: int = 2, frames_per_step: int = 2,
                fps: float = 2.0, grid: int = DEFAULT_GRID) -> tuple[SceneClip, Track, str]:
    """One object moving one cell per step across its row or column (left, right, up or down),
    beside ``distractors`` still objects off its path. Returns the clip, the mover and its
    direction."""
    if steps > grid:
        raise ValueError(f"a mover crosses at most {grid} cells; got steps={steps}")
    direction = rng.choice(list(DIRECTIONS))
    dx, dy = DIRECTIONS[direction]
    lane = rng.randrange(grid)
    start = rng.randrange(grid - steps + 1)
    positions = [start + t for t in range(steps)]
    if dx < 0 or dy < 0:
        positions = [grid - 1 - p for p in positions]
    cells = [lane * grid + p for p in positions] if dx else [p * grid + lane for p in positions]
    pairs = _distinct_pairs(rng, 1 + distractors)
    mover = Track(pairs[0][1], pairs[0][0], cells)
    free = [c for c in range(grid * grid) if c not in cells]
    still = [Track(s, c, [cell] * steps) for (c, s), cell in zip(pairs[1:], rng.sample(free, distractors))]
    tracks = [mover, *still]
    rng.shuffle(tracks)
    return render_clip(rng, tracks, steps, frames_per_step, fps, grid=grid), mover, direction


def appearance_clip(rng: random.Random, steps: int = 4, objects: int = 3, frames_per_step: int = 2,
                    fps: float = 2.0, grid: int = DEFAULT_GRID) -> SceneClip:
    """``objects`` still objects (distinct colour and shape), each shown over its own run of
    consecutive steps (at least one), in distinct cells."""
    tracks = []
    for (color, shape), cell in zip(_distinct_pairs(rng, objects), rng.sample(range(grid * grid), objects)):
        first = rng.randrange(steps)
        last = rng.randrange(first, steps)
        tracks.append(Track(shape, color, [cell if first <= t <= last else None for t in range(steps)]))
    return render_clip(rng, tracks, steps, frames_per_step, fps, grid=grid)
