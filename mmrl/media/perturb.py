"""Visual perturbations for training, with boxes moved consistently (``data.perturbation``).

From "Vision Matters: Simple Visual Perturbations Can Boost Multimodal Math Reasoning" (Li et al.,
2025): training on perturbed images makes a VLM rely on what it sees rather than on text priors.
Three perturbations:

- ``distractor``: the image is concatenated side by side with an unrelated image (another training
  example's, scaled to the same height) on a random side; boxes shift by the distractor's width
  when it sits on the left.
- ``mixup``: dominance-preserving mixup, ``(1 - a) * image + a * other`` with a small ``a``
  (default up to 0.3) so the original stays dominant; boxes are unchanged.
- ``rotation``: a random rotation by up to ``max_angle`` degrees (canvas expanded, nothing cut);
  each box becomes the axis-aligned box around its rotated corners.

Every function takes and returns original-image-pixel boxes; :func:`perturb_example` applies one
to a task example (its ``image``, ``image_size``, ``box``, ``boxes`` and ``objects[*]["box"]``).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
from PIL import Image

from mmrl.config.options import accepted
from mmrl.registry import PERTURBATIONS, register_perturbation

Box = tuple[float, float, float, float]


def rotate(image: Image.Image, boxes: Sequence[Box], angle: float, fill=(255, 255, 255)) -> tuple[Image.Image, list[Box]]:
    """Rotate counter-clockwise by ``angle`` degrees about the centre, expanding the canvas (PIL's
    ``rotate(expand=True)``); boxes follow their corners. E.g. 90 degrees on a W x H image maps
    (x, y) to (y, W - x)."""
    w, h = image.size
    out = image.rotate(angle, expand=True, fillcolor=fill, resample=Image.BICUBIC)
    nw, nh = out.size
    t = math.radians(angle)
    cos, sin = math.cos(t), math.sin(t)

    def move(x: float, y: float) -> tuple[float, float]:
        # About the old centre, y pointing down; counter-clockwise on screen, then re-centred.
        dx, dy = x - w / 2, y - h / 2
        return dx * cos + dy * sin + nw / 2, -dx * sin + dy * cos + nh / 2

    moved = []
    for x1, y1, x2, y2 in boxes:
        pts = [move(x, y) for x, y in ((x1, y1), (x2, y1), (x1, y2), (x2, y2))]
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        moved.append((max(0.0, min(xs)), max(0.0, min(ys)), min(float(nw), max(xs)), min(float(nh), max(ys))))
    return out, moved


def concat_distractor(image: Image.Image, boxes: Sequence[Box], distractor: Image.Image,
                      left: bool) -> tuple[Image.Image, list[Box]]:
    """``image`` and ``distractor`` (scaled to the same height) side by side; the distractor on
    the left when ``left`` (then every box moves right by its width)."""
    w, h = image.size
    dw = max(1, round(distractor.width * h / distractor.height))
    d = distractor.convert("RGB").resize((dw, h), Image.BILINEAR)
    out = Image.new("RGB", (w + dw, h))
    out.paste(d if left else image.convert("RGB"), (0, 0))
    out.paste(image.convert("RGB") if left else d, (dw if left else w, 0))
    shift = dw if left else 0
    return out, [(x1 + shift, y1, x2 + shift, y2) for x1, y1, x2, y2 in boxes]


def mixup(image: Image.Image, other: Image.Image, weight: float) -> Image.Image:
    """``(1 - weight) * image + weight * other`` (other resized to the image); ``weight`` < 0.5
    keeps the original dominant."""
    if not 0 <= weight < 0.5:
        raise ValueError(f"mixup weight must be in [0, 0.5) to keep the original dominant, got {weight}")
    a = np.asarray(image.convert("RGB"), dtype=np.float32)
    b = np.asarray(other.convert("RGB").resize(image.size, Image.BILINEAR), dtype=np.float32)
    return Image.fromarray(np.clip((1 - weight) * a + weight * b + 0.5, 0, 255).astype(np.uint8))


def _boxes_of(ex: dict) -> list[Box]:
    boxes: list[Box] = []
    if ex.get("box") is not None:
        boxes.append(tuple(ex["box"]))
    boxes += [tuple(b) for b in ex.get("boxes") or []]
    boxes += [tuple(o["box"]) for o in ex.get("objects") or [] if "box" in o]
    return boxes


def _with_boxes(ex: dict, image: Image.Image, boxes: list[Box]) -> dict:
    out = {**ex, "image": image, "image_size": image.size}
    it = iter(boxes)
    if ex.get("box") is not None:
        out["box"] = next(it)
    if ex.get("boxes"):
        out["boxes"] = [next(it) for _ in ex["boxes"]]
    if ex.get("objects"):
        out["objects"] = [{**o, "box": next(it)} if "box" in o else o for o in ex["objects"]]
    return out


# -- the registered perturbations: fn(image, boxes, rng, other, max_angle, max_mix) -> (image, boxes) --


@register_perturbation("rotation")
def _rotation(image, boxes, rng, other, max_angle: float = 30.0):
    return rotate(image, boxes, float(rng.uniform(-max_angle, max_angle)))


@register_perturbation("distractor")
def _distractor(image, boxes, rng, other):
    return concat_distractor(image, boxes, other, left=bool(rng.random() < 0.5))


@register_perturbation("mixup")
def _mixup(image, boxes, rng, other, max_mix: float = 0.3):
    return mixup(image, other, float(rng.uniform(0.0, max_mix))), list(boxes)


_rotation.needs_other = False
_distractor.needs_other = _mixup.needs_other = True


def perturb_example(ex: dict, kind: str, rng: np.random.Generator, other: Optional[Image.Image] = None,
                    **options: float) -> dict:
    """A perturbed copy of ``ex`` (``kind`` a registered perturbation); ``other`` is the image the
    distractor / mixup perturbations use; ``options`` (``data.perturbation_kwargs``, checked at
    setup against the perturbations' signatures) reach the perturbations that take them. Examples without
    a PIL ``image`` come back unchanged."""
    fn = PERTURBATIONS.get(kind)
    image = ex.get("image")
    if not isinstance(image, Image.Image):
        return ex
    if fn.needs_other and other is None:
        raise ValueError(f"the {kind} perturbation needs another image")
    image, boxes = fn(image, _boxes_of(ex), rng, other, **accepted(fn, options))
    return _with_boxes(ex, image, boxes)
