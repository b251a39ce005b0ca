"""Vision Matters perturbations: boxes follow the pixels (checked on drawn rectangles)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw

from mmrl.media.perturb import concat_distractor, mixup, perturb_example, rotate


def red_box_image(size, box):
    im = Image.new("RGB", size, "white")
    ImageDraw.Draw(im).rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=(255, 0, 0))
    return im


def red_extent(im):
    a = np.asarray(im.convert("RGB")).astype(int)
    ys, xs = np.nonzero((a[..., 0] > 200) & (a[..., 1] < 80) & (a[..., 2] < 80))
    return xs.min(), ys.min(), xs.max() + 1, ys.max() + 1


def test_rotate_90_hand_worked():
    """90 degrees counter-clockwise on 200x100: (x, y) -> (y, 200 - x), so box (10, 20, 50, 40)
    -> (20, 150, 40, 190) on a 100x200 canvas."""
    im, (box,) = rotate(red_box_image((200, 100), (10, 20, 50, 40)), [(10, 20, 50, 40)], 90)
    assert im.size == (100, 200)
    assert box == pytest.approx((20, 150, 40, 190), abs=1e-6)
    assert red_extent(im) == pytest.approx(box, abs=1)


@pytest.mark.parametrize("angle", [-25.0, 13.0])
def test_small_rotation_box_contains_the_rotated_object(angle):
    box = (60, 30, 100, 70)
    im, (moved,) = rotate(red_box_image((160, 120), box), [box], angle)
    x1, y1, x2, y2 = red_extent(im)
    assert moved[0] <= x1 + 1 and moved[1] <= y1 + 1 and moved[2] >= x2 - 1 and moved[3] >= y2 - 1
    assert moved == pytest.approx((x1, y1, x2, y2), abs=2)  # the tight box of the rotated square


def test_distractor_concatenation_shifts_boxes_only_when_left():
    """Image 100x50, distractor 40x20 scaled to height 50 -> 100 wide: on the left the box moves
    right by 100; on the right nothing moves. The canvas is 200x50 either way."""
    im = red_box_image((100, 50), (10, 10, 30, 40))
    d = Image.new("RGB", (40, 20), "blue")
    left, (b1,) = concat_distractor(im, [(10, 10, 30, 40)], d, left=True)
    right, (b2,) = concat_distractor(im, [(10, 10, 30, 40)], d, left=False)
    assert left.size == right.size == (200, 50)
    assert b1 == (110, 10, 130, 40) and red_extent(left) == b1
    assert b2 == (10, 10, 30, 40) and red_extent(right) == b2


def test_mixup_keeps_the_original_dominant():
    """0.7 * 200 + 0.3 * 100 = 170 per channel."""
    out = mixup(Image.new("RGB", (4, 4), (200, 200, 200)), Image.new("RGB", (8, 8), (100, 100, 100)), 0.3)
    assert np.asarray(out)[0, 0].tolist() == [170, 170, 170]
    with pytest.raises(ValueError, match="dominant"):
        mixup(out, out, 0.6)


def test_perturb_example_moves_every_box_field():
    ex = {"image": red_box_image((100, 50), (10, 10, 30, 40)), "image_size": (100, 50), "box": (10, 10, 30, 40),
          "boxes": [(10, 10, 30, 40)], "objects": [{"box": (10, 10, 30, 40), "color": "red"}]}
    rng = np.random.default_rng(0)
    out = perturb_example(ex, "distractor", rng, other=Image.new("RGB", (50, 50)))
    assert out["image_size"] == out["image"].size == (150, 50)
    assert out["box"] == out["boxes"][0] == out["objects"][0]["box"]
    assert out["objects"][0]["color"] == "red" and ex["box"] == (10, 10, 30, 40)  # the input is not modified
    assert red_extent(out["image"]) == out["box"]
    with pytest.raises(ValueError, match="known: distractor, mixup, rotation"):
        perturb_example(ex, "blur", rng)
