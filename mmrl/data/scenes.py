"""Deterministic synthetic scenes: coloured shapes on a grid, for the built-in VLM tasks and tests.

Why a grid: the tiny default model sees a 112x112 image as 8x8 patches of 14 px merged 2x2, i.e.
one vision token per 28x28 cell. Putting at most one object in each 28-px cell makes every object
visible to exactly one token, so the tiny model can actually learn the tasks.

Boxes are ``(x1, y1, x2, y2)`` in image pixels, **right/bottom exclusive** (the PIL ``getbbox``
convention): the shape covers pixels ``x1 <= x < x2`` and ``y1 <= y < y2`` and touches all four
edges, so the box tightly bounds what is drawn. Drawing uses no anti-aliasing, so every pixel of
a shape has exactly its colour.

Everything is driven by an explicit ``random.Random``; nothing touches the global RNG, so the
same seed always gives the same pixels and objects.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Iterable, Optional, Sequence

from PIL import Image, ImageDraw

SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 60, 220),
    "yellow": (235, 200, 20),
}
PLURALS: dict[str, str] = {"circle": "circles", "square": "squares", "triangle": "triangles"}
BACKGROUND: tuple[int, int, int] = (245, 245, 240)

DEFAULT_SIZE = 112
DEFAULT_GRID = 4  # 4x4 cells of 28 px at 112 px
MIN_OBJECT, MAX_OBJECT = 14, 22  # side of an object's box, in pixels


@dataclass
class SceneObject:
    shape: str
    color: str
    box: tuple[int, int, int, int]  # x1, y1, x2, y2; right/bottom exclusive

    def matches(self, color: Optional[str] = None, shape: Optional[str] = None) -> bool:
        """True if the object fits a query; ``None`` means "any" for that attribute."""
        return (color is None or self.color == color) and (shape is None or self.shape == shape)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["box"] = tuple(self.box)
        return d


@dataclass
class Scene:
    image: Image.Image
    objects: list[SceneObject] = field(default_factory=list)
    size: int = DEFAULT_SIZE


def draw_object(draw: ImageDraw.ImageDraw, obj: SceneObject) -> None:
    """Draw one object filling its box exactly (see the module docstring for the convention)."""
    if obj.shape not in SHAPES:
        raise ValueError(f"unknown shape {obj.shape!r}; known: {SHAPES}")
    if obj.color not in COLORS:
        raise ValueError(f"unknown colour {obj.color!r}; known: {tuple(COLORS)}")
    x1, y1, x2, y2 = obj.box
    fill = COLORS[obj.color]
    if obj.shape == "square":
        draw.rectangle([x1, y1, x2 - 1, y2 - 1], fill=fill)
    elif obj.shape == "circle":
        draw.ellipse([x1, y1, x2 - 1, y2 - 1], fill=fill)
    else:  # triangle, apex up
        draw.polygon([(x1, y2 - 1), (x2 - 1, y2 - 1), ((x1 + x2 - 1) / 2, y1)], fill=fill)


def render_scene(
    objects: Iterable[SceneObject],
    size: int = DEFAULT_SIZE,
    background: tuple[int, int, int] = BACKGROUND,
) -> Scene:
    """Draw ``objects`` on a ``size`` x ``size`` RGB canvas."""
    objects = list(objects)
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)
    for obj in objects:
        draw_object(draw, obj)
    return Scene(image=image, objects=objects, size=size)


def position_word(box: Sequence[float], size: int | Sequence[int] = DEFAULT_SIZE) -> str:
    """Where a box's centre lies on a 3x3 split of the image: "top left", "top", ..., "center".
    ``size``: the side of a square image, or (width, height)."""
    width, height = (size, size) if isinstance(size, (int, float)) else (size[0], size[1])
    cx = (box[0] + box[2]) / 2
    cy = (box[1] + box[3]) / 2
    col = min(2, max(0, int(3 * cx / width)))
    row = min(2, max(0, int(3 * cy / height)))
    vertical = ("top", "", "bottom")[row]
    horizontal = ("left", "", "right")[col]
    return " ".join(w for w in (vertical, horizontal) if w) or "center"


def noun_phrase(color: Optional[str], shape: Optional[str], count: int) -> str:
    """ "red circle" / "red circles" / "red shapes" / "circles", pluralised for ``count``; None
    means "any" for that attribute (the words of the task questions about these scenes)."""
    noun = shape if shape is not None else "shape"
    if count != 1:
        noun = PLURALS.get(noun, noun + "s")
    return f"{color} {noun}" if color is not None else noun


def _cell_size(size: int, grid: int) -> int:
    cell = size // grid
    if cell < MIN_OBJECT:
        raise ValueError(f"grid {grid} on a {size}-px image gives {cell}-px cells, below {MIN_OBJECT}")
    return cell


def place_in_cell(rng: random.Random, cell_index: int, size: int = DEFAULT_SIZE,
                  grid: int = DEFAULT_GRID) -> tuple[int, int, int, int]:
    """A random box of side MIN_OBJECT..MAX_OBJECT (capped by the cell), jittered inside cell
    ``cell_index`` (reading order) of a ``grid`` x ``grid`` split of a ``size``-px image: the
    one-object-per-cell placement of every scene here, for tasks that build their own scenes."""
    cell = _cell_size(size, grid)
    side = rng.randint(MIN_OBJECT, min(MAX_OBJECT, cell))
    col, row = cell_index % grid, cell_index // grid
    x1 = col * cell + rng.randint(0, cell - side)
    y1 = row * cell + rng.randint(0, cell - side)
    return (x1, y1, x1 + side, y1 + side)


def cell_of(box: Sequence[float], size: int = DEFAULT_SIZE, grid: int = DEFAULT_GRID) -> int:
    """The reading-order index of the ``grid`` x ``grid`` cell holding ``box``'s centre: the
    inverse of :func:`place_in_cell`."""
    cell = _cell_size(size, grid)
    return int((box[0] + box[2]) / 2) // cell + grid * (int((box[1] + box[3]) / 2) // cell)


def _check_capacity(n: int, grid: int) -> None:
    if n > grid * grid:
        raise ValueError(f"{n} objects do not fit in a {grid}x{grid} grid (one object per cell)")


def random_scene(
    rng: random.Random,
    num_objects: int,
    size: int = DEFAULT_SIZE,
    grid: int = DEFAULT_GRID,
    unique: bool = False,
    colors: Sequence[str] = tuple(COLORS),
    shapes: Sequence[str] = SHAPES,
) -> Scene:
    """``num_objects`` random objects in distinct cells; ``unique`` makes (colour, shape) distinct."""
    _check_capacity(num_objects, grid)
    pairs = [(c, s) for c in colors for s in shapes]
    if unique:
        if num_objects > len(pairs):
            raise ValueError(f"only {len(pairs)} distinct (colour, shape) pairs for {num_objects} objects")
        chosen = rng.sample(pairs, num_objects)
    else:
        chosen = [rng.choice(pairs) for _ in range(num_objects)]
    cells = rng.sample(range(grid * grid), num_objects)
    objects = [SceneObject(s, c, place_in_cell(rng, cell, size, grid)) for (c, s), cell in zip(chosen, cells)]
    return render_scene(objects, size)


def scene_with_targets(
    rng: random.Random,
    target: tuple[Optional[str], Optional[str]],
    num_targets: int,
    num_distractors: int,
    size: int = DEFAULT_SIZE,
    grid: int = DEFAULT_GRID,
    colors: Sequence[str] = tuple(COLORS),
    shapes: Sequence[str] = SHAPES,
) -> Scene:
    """A scene with exactly ``num_targets`` objects matching ``target = (colour, shape)``.

    ``None`` in ``target`` means "any" (so ``("red", None)`` asks for red shapes of any kind);
    distractors never match the query, so counting the matches always gives ``num_targets``.
    Objects are shuffled over the cells so targets are not systematically first.
    """
    color, shape = target
    _check_capacity(num_targets + num_distractors, grid)
    pairs = [(c, s) for c in colors for s in shapes]
    matching = [p for p in pairs if (color is None or p[0] == color) and (shape is None or p[1] == shape)]
    others = [p for p in pairs if p not in matching]
    if num_targets and not matching:
        raise ValueError(f"no (colour, shape) pair matches target {target!r}")
    if num_distractors and not others:
        raise ValueError(f"target {target!r} matches everything, so there can be no distractors")
    chosen = [rng.choice(matching) for _ in range(num_targets)]
    chosen += [rng.choice(others) for _ in range(num_distractors)]
    cells = rng.sample(range(grid * grid), len(chosen))
    objects = [SceneObject(s, c, place_in_cell(rng, cell, size, grid)) for (c, s), cell in zip(chosen, cells)]
    objects.sort(key=lambda o: (o.box[1] // (size // grid), o.box[0]))  # reading order, not target-first
    return render_scene(objects, size)
