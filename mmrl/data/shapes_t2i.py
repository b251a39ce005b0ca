"""Deterministic synthetic text-to-image scenes: coloured circles and squares described by a prompt.

The tiny built-in generator is pretrained on ``render(spec)`` images and then RL-trained (Flow-GRPO)
with the GenEval-style ``composition`` reward (``rewards/composition.py``), which checks a generated
image against the same ``spec``. So the scenes are made to be checkable from pixels alone:

- pure palette colours on a plain background, drawn without anti-aliasing, so every pixel of an
  object has exactly its colour and a nearest-colour classifier cannot confuse two objects;
- at least a 1 px gap between any two objects, so each object is its own 4-connected component
  (two touching red circles would otherwise count as one red blob);
- "left"/"right" objects lie wholly in that half, so the position of their centre is unambiguous.

A spec is a list of 1 or 2 groups ``{"count": 1..3, "color", "shape", "position": "left" |
"right" | None}``; two groups always have different colours (the checker counts objects per
colour). Everything is driven by an explicit ``numpy.random.Generator`` (or an int seed): the same
seed always gives the same spec and pixels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image, ImageDraw

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 200, 30),
}
BACKGROUND: tuple[int, int, int] = (235, 235, 235)
SHAPES: tuple[str, ...] = ("circle", "square")
COUNT_WORDS: dict[int, str] = {1: "one", 2: "two", 3: "three"}
POSITIONS: tuple[str, ...] = ("left", "right")
IMAGE_SIZE = 32
MIN_SIDE, MAX_SIDE = 7, 10  # object diameter / side at 32 px; scaled with size / 32
MAX_GROUPS = 2


def _rng(rng_or_seed: Any) -> np.random.Generator:
    if isinstance(rng_or_seed, np.random.Generator):
        return rng_or_seed
    return np.random.default_rng(rng_or_seed)


def validate_spec(spec: list[dict]) -> list[dict]:
    """Raise ValueError unless ``spec`` is 1 or 2 well-formed groups with distinct colours."""
    if not isinstance(spec, (list, tuple)) or not 1 <= len(spec) <= MAX_GROUPS:
        raise ValueError(f"a scene spec is a list of 1 or {MAX_GROUPS} groups, got {spec!r}")
    for g in spec:
        if g.get("color") not in COLORS:
            raise ValueError(f"unknown colour {g.get('color')!r}; known: {tuple(COLORS)}")
        if g.get("shape") not in SHAPES:
            raise ValueError(f"unknown shape {g.get('shape')!r}; known: {SHAPES}")
        if g.get("count") not in COUNT_WORDS:
            raise ValueError(f"count must be one of {tuple(COUNT_WORDS)}, got {g.get('count')!r}")
        if g.get("position") not in (None, *POSITIONS):
            raise ValueError(f"position must be 'left', 'right' or None, got {g.get('position')!r}")
    colors = [g["color"] for g in spec]
    if len(set(colors)) != len(colors):
        raise ValueError(f"the groups of a spec need different colours, got {colors}")
    return list(spec)


def sample_spec(rng: np.random.Generator, max_groups: int = 1, position_prob: float = 0.5,
                max_count: int = 3) -> list[dict]:
    """A random spec of 1..``max_groups`` groups, each given a side with ``position_prob``.

    Two positioned groups get opposite sides, so one half never has to hold more than
    ``max_count`` (<= 3) objects, which is what :func:`render` guarantees to fit."""
    if not 1 <= max_groups <= MAX_GROUPS:
        raise ValueError(f"max_groups must be 1..{MAX_GROUPS}, got {max_groups}")
    if max_count not in COUNT_WORDS:
        raise ValueError(f"max_count must be one of {tuple(COUNT_WORDS)}, got {max_count}")
    rng = _rng(rng)
    n_groups = int(rng.integers(1, max_groups + 1))
    names = list(COLORS)
    colors = [names[i] for i in rng.choice(len(names), size=n_groups, replace=False)]
    spec: list[dict] = []
    for color in colors:
        count = int(rng.integers(1, max_count + 1))
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        position = None
        if rng.random() < position_prob:
            free = [p for p in POSITIONS if p not in {g["position"] for g in spec}]
            position = free[int(rng.integers(len(free)))]
        spec.append({"count": count, "color": color, "shape": shape, "position": position})
    return spec


def group_phrase(group: dict) -> str:
    """"a red circle", "two blue squares on the left"."""
    count = group["count"]
    noun = group["shape"] if count == 1 else group["shape"] + "s"
    words = ["a" if count == 1 else COUNT_WORDS[count], group["color"], noun]
    if group.get("position"):
        words += ["on", "the", group["position"]]
    return " ".join(words)


def spec_prompt(spec: list[dict]) -> str:
    """The prompt of a spec: its groups' phrases joined with " and "."""
    return " and ".join(group_phrase(g) for g in validate_spec(spec))


# -- rendering -------------------------------------------------------------------------------------

def _x_range(position: str | None, side: int, size: int) -> tuple[int, int]:
    """Inclusive range of an object's left edge so it lies wholly in its half (or anywhere)."""
    if position == "left":
        return 0, size // 2 - side
    if position == "right":
        return (size + 1) // 2, size - side
    return 0, size - side


def _apart(a: tuple[int, int, int, int], b: tuple[int, int, int, int], gap: int) -> bool:
    """Boxes (right/bottom exclusive) at least ``gap`` background pixels apart along some axis."""
    return a[2] + gap <= b[0] or b[2] + gap <= a[0] or a[3] + gap <= b[1] or b[3] + gap <= a[1]


def place_objects(spec: list[dict], rng: np.random.Generator, size: int = IMAGE_SIZE,
                  attempts: int = 300, tries: int = 60) -> list[tuple[int, int, int, int]]:
    """Boxes ``(x1, y1, x2, y2)`` (right/bottom exclusive) for the spec's objects, in spec order.

    Rejection sampling: draw all sides, then place positioned objects first (they have the least
    room), each at up to ``tries`` random spots clear of the others; if one finds no spot, start
    over with fresh sides whose upper bound shrinks towards the minimum as attempts fail, so
    crowded halves (3 objects in a 16x32 half) end up with small objects instead of failing."""
    scale = size / IMAGE_SIZE
    lo, hi = max(2, round(MIN_SIDE * scale)), max(2, round(MAX_SIDE * scale))
    gap = max(1, round(scale))
    objects = [g.get("position") for g in spec for _ in range(g["count"])]
    order = sorted(range(len(objects)), key=lambda i: objects[i] is None)
    for attempt in range(attempts):
        cap = hi - round((hi - lo) * min(1.0, attempt / (attempts / 3)))
        sides = rng.integers(lo, cap + 1, size=len(objects))
        boxes: dict[int, tuple[int, int, int, int]] = {}
        for i in order:
            side = int(sides[i])
            x_lo, x_hi = _x_range(objects[i], side, size)
            if x_hi < x_lo:
                break
            for _ in range(tries):
                x, y = int(rng.integers(x_lo, x_hi + 1)), int(rng.integers(0, size - side + 1))
                box = (x, y, x + side, y + side)
                if all(_apart(box, other, gap) for other in boxes.values()):
                    boxes[i] = box
                    break
            else:
                break
        if len(boxes) == len(objects):
            return [boxes[i] for i in range(len(objects))]
    raise RuntimeError(f"could not place the objects of {spec} in a {size}x{size} image")


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: tuple[int, int, int, int],
               fill: tuple[int, int, int]) -> None:
    """A filled shape covering exactly the pixels ``x1 <= x < x2``, ``y1 <= y < y2`` (no anti-aliasing)."""
    x1, y1, x2, y2 = box
    if shape == "square":
        draw.rectangle([x1, y1, x2 - 1, y2 - 1], fill=fill)
    elif shape == "circle":
        draw.ellipse([x1, y1, x2 - 1, y2 - 1], fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}; known: {SHAPES}")


def render(spec: list[dict], rng: Any, size: int = IMAGE_SIZE) -> Image.Image:
    """An RGB ``size`` x ``size`` image of the spec: the generator's pretraining target."""
    validate_spec(spec)
    rng = _rng(rng)
    boxes = iter(place_objects(spec, rng, size))
    image = Image.new("RGB", (size, size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for group in spec:
        for _ in range(group["count"]):
            draw_shape(draw, group["shape"], next(boxes), COLORS[group["color"]])
    return image


def mislabel(spec: list[dict], rng: np.random.Generator, count_prob: float = 0.0,
             position_prob: float = 0.0, color_prob: float = 0.0) -> list[dict]:
    """A caption's spec for an image of ``spec`` that, like web alt-text, is sometimes wrong: each
    group's count is replaced by another count with ``count_prob``, its side by another of
    (left, right, none) with ``position_prob``, its colour by another with ``color_prob``. Two
    groups never end up claiming the same side or colour."""
    out = [dict(g) for g in spec]
    for g in out:
        if rng.random() < count_prob:
            others = [c for c in COUNT_WORDS if c != g["count"]]
            g["count"] = others[int(rng.integers(len(others)))]
        if rng.random() < position_prob:
            taken = {o["position"] for o in out if o is not g} - {None}
            others = [p for p in (*POSITIONS, None) if p != g["position"] and p not in taken]
            g["position"] = others[int(rng.integers(len(others)))]
        if color_prob and rng.random() < color_prob:  # no draw at 0: float-noise datasets unchanged
            taken = {o["color"] for o in out if o is not g}
            others = [c for c in COLORS if c != g["color"] and c not in taken]
            g["color"] = others[int(rng.integers(len(others)))]
    return validate_spec(out)


def caption_noise_rates(caption_noise: float | dict) -> dict[str, float]:
    """``{"count", "position", "color"}`` mislabel probabilities: a number means that rate for count
    and position (colour stays true); a mapping gives each attribute's own (missing ones are 0)."""
    if isinstance(caption_noise, (int, float)):
        return {"count": float(caption_noise), "position": float(caption_noise), "color": 0.0}
    unknown = set(caption_noise) - {"count", "position", "color"}
    if unknown:
        raise ValueError(f"caption_noise: unknown attribute(s) {sorted(unknown)}; known: count, position, color")
    rates = {k: float(caption_noise.get(k, 0.0)) for k in ("count", "position", "color")}
    if any(not 0.0 <= r <= 1.0 for r in rates.values()):
        raise ValueError(f"caption_noise rates must lie in [0, 1], got {rates}")
    return rates


def example(rng_or_seed: Any, size: int = IMAGE_SIZE, caption_noise: float | dict = 0.0, **sample_kwargs) -> dict:
    """``{"spec", "prompt", "image"}`` of one random scene (``sample_kwargs`` go to :func:`sample_spec`).
    RL uses only the spec (for the reward) and the prompt; the image is for pretraining. With
    ``caption_noise`` (see :func:`caption_noise_rates`) the prompt misstates each group's
    attributes at those rates (:func:`mislabel`); ``spec`` stays the truth of the image."""
    rng = _rng(rng_or_seed)
    spec = sample_spec(rng, **sample_kwargs)
    image = render(spec, rng, size)
    rates = caption_noise_rates(caption_noise)
    said = (mislabel(spec, rng, rates["count"], rates["position"], rates["color"])
            if any(rates.values()) else spec)
    return {"spec": spec, "prompt": spec_prompt(said), "image": image}
