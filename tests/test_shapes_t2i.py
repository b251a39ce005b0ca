"""Synthetic text-to-image scenes (mmrl.data.shapes_t2i) and the GenEval-style composition reward."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from mmrl.data.shapes_t2i import (BACKGROUND, COLORS, IMAGE_SIZE, example, place_objects, render, sample_spec,
                                  spec_prompt)
from mmrl.registry import REWARDS
from mmrl.measures.composition import composition_checks, detect_objects


def g(count, color, shape, position=None):
    return {"count": count, "color": color, "shape": shape, "position": position}


def test_prompts():
    assert spec_prompt([g(1, "red", "circle")]) == "a red circle"
    assert spec_prompt([g(2, "blue", "square", "left")]) == "two blue squares on the left"
    assert spec_prompt([g(3, "yellow", "circle", "right")]) == "three yellow circles on the right"
    assert spec_prompt([g(1, "red", "circle", "left"), g(2, "blue", "square", "right")]) == (
        "a red circle on the left and two blue squares on the right")
    with pytest.raises(ValueError, match="different colours"):
        spec_prompt([g(1, "red", "circle"), g(1, "red", "square")])
    with pytest.raises(ValueError, match="unknown colour"):
        spec_prompt([g(1, "purple", "circle")])


def test_sample_spec_is_deterministic_and_well_formed():
    specs = [sample_spec(np.random.default_rng(s), max_groups=2) for s in range(300)]
    assert specs == [sample_spec(np.random.default_rng(s), max_groups=2) for s in range(300)]
    assert {len(s) for s in specs} == {1, 2}
    for spec in specs:
        assert all(1 <= grp["count"] <= 3 for grp in spec)
        if len(spec) == 2:
            assert spec[0]["color"] != spec[1]["color"]
            sides = [grp["position"] for grp in spec if grp["position"]]
            assert len(sides) == len(set(sides)), "two positioned groups share a half"
    assert all(len(sample_spec(np.random.default_rng(s))) == 1 for s in range(50))
    unplaced = [sample_spec(np.random.default_rng(s), position_prob=0) for s in range(50)]
    assert all(grp["position"] is None for spec in unplaced for grp in spec)
    assert all(grp["count"] == 1 for s in range(50) for grp in sample_spec(np.random.default_rng(s), max_count=1))


def test_render_pixels_are_pure_and_deterministic():
    ex = example(7, max_groups=2)
    assert ex["prompt"] == spec_prompt(ex["spec"])
    assert ex["image"].size == (IMAGE_SIZE, IMAGE_SIZE) and ex["image"].mode == "RGB"
    assert np.array_equal(np.asarray(ex["image"]), np.asarray(example(7, max_groups=2)["image"]))
    colours = {tuple(c) for c in np.asarray(ex["image"]).reshape(-1, 3)}
    assert colours == {BACKGROUND} | {COLORS[grp["color"]] for grp in ex["spec"]}


def _apart(a, b):
    return a[2] + 1 <= b[0] or b[2] + 1 <= a[0] or a[3] + 1 <= b[1] or b[3] + 1 <= a[1]


@pytest.mark.slow
def test_placement_always_fits_three_per_half():
    """The crowded cases (3 per half, 3 + 3 anywhere) over 500 seeds: inside, in their half, apart."""
    crowded = [
        [g(3, "red", "square", "left"), g(3, "blue", "square", "right")],
        [g(3, "red", "square", "left"), g(3, "blue", "circle")],
        [g(3, "green", "circle"), g(3, "yellow", "square")],
    ]
    for seed in range(500):
        spec = crowded[seed % 3]
        boxes = place_objects(spec, np.random.default_rng(seed))
        positions = [grp["position"] for grp in spec for _ in range(grp["count"])]
        for i, (box, pos) in enumerate(zip(boxes, positions)):
            x1, y1, x2, y2 = box
            assert 0 <= x1 and 0 <= y1 and x2 <= IMAGE_SIZE and y2 <= IMAGE_SIZE
            assert 7 <= x2 - x1 <= 10 and x2 - x1 == y2 - y1
            if pos == "left":
                assert x2 <= IMAGE_SIZE // 2
            if pos == "right":
                assert x1 >= IMAGE_SIZE // 2
            assert all(_apart(box, other) for other in boxes[i + 1:])


@pytest.mark.slow
def test_renderings_score_one():
    """Every rendered spec (1 and 2 groups) passes all checks: the checker and renderer agree."""
    composition, strict = REWARDS.get("composition"), REWARDS.get("composition_strict")
    examples = [example(np.random.default_rng([1, s]), max_groups=2) for s in range(300)]
    images = [ex["image"] for ex in examples]
    assert {len(ex["spec"]) for ex in examples} == {1, 2}
    assert composition(images, examples) == [1.0] * 300
    assert strict(images, examples) == [1.0] * 300


def test_detect_objects_on_a_known_scene():
    spec = [g(2, "red", "circle", "left"), g(1, "blue", "square", "right")]
    objects = detect_objects(render(spec, 0))
    found = sorted((o["color"], o["shape"]) for o in objects)
    assert found == [("blue", "square"), ("red", "circle"), ("red", "circle")]
    assert all(o["cx"] < 16 for o in objects if o["color"] == "red")
    assert all(o["cx"] > 16 and o["area"] >= 49 for o in objects if o["color"] == "blue")
    # A large image works too (min_area scales with the area).
    big = render(spec, 0, size=96)
    assert sorted(o["color"] for o in detect_objects(big)) == ["blue", "red", "red"]
    # A thin bar is a blob: it counts as red but is no square.
    bar = Image.new("RGB", (32, 32), BACKGROUND)
    bar.paste(COLORS["red"], (4, 10, 24, 14))
    (obj,) = detect_objects(bar)
    assert obj["shape"] == "blob" and obj["box"] == (4, 10, 24, 14)


def test_failure_modes():
    composition = REWARDS.get("composition")
    spec = [g(1, "red", "circle", "left")]
    blank = Image.new("RGB", (32, 32), BACKGROUND)
    assert composition([blank], [{"spec": spec}])[0] <= 0.25  # only no_extra holds

    extra = render([g(2, "red", "circle", "left")], 3)
    checks = composition_checks(extra, spec)
    assert checks["color_0"] and not checks["count_0"]

    wrong_colour = render([g(1, "green", "circle", "left")], 3)
    checks = composition_checks(wrong_colour, spec)
    assert not checks["color_0"] and not checks["no_extra"]

    wrong_side = render([g(1, "red", "circle", "right")], 3)
    checks = composition_checks(wrong_side, spec)
    assert not checks["position_0"] and checks["count_0"] and checks["shape_0"]

    wrong_shape = render([g(1, "red", "square", "left")], 3)
    assert not composition_checks(wrong_shape, spec)["shape_0"]
    assert "position_0" not in composition_checks(wrong_shape, [g(1, "red", "square")])


def test_gaussian_noise_still_scores_one():
    composition = REWARDS.get("composition")
    rng = np.random.default_rng(0)
    examples = [example(np.random.default_rng([2, s]), max_groups=2) for s in range(40)]
    noisy = []
    for ex in examples:
        pixels = np.asarray(ex["image"], dtype=np.float64) + rng.normal(0, 10, (32, 32, 3))
        noisy.append(Image.fromarray(np.clip(pixels, 0, 255).round().astype(np.uint8)))
    assert composition(noisy, examples) == [1.0] * 40


def test_unscorable_inputs_are_none():
    composition = REWARDS.get("composition")
    ex = example(0)
    assert composition(["not an image", ex["image"]], [ex, {"prompt": "a red circle"}]) == [None, None]
    with pytest.raises(ValueError):
        composition([ex["image"]], [])
