"""The synthetic scene generator: deterministic, tight boxes, one object per grid cell."""

import random

import pytest

from mmrl.data.scenes import (
    COLORS,
    SHAPES,
    SceneObject,
    cell_of,
    place_in_cell,
    position_word,
    random_scene,
    render_scene,
    scene_with_targets,
)


def _cells(scene, cell=28):
    return [((o.box[0] // cell), (o.box[1] // cell)) for o in scene.objects]


def test_same_seed_same_scene_different_seed_differs():
    a = random_scene(random.Random(7), 5)
    b = random_scene(random.Random(7), 5)
    c = random_scene(random.Random(8), 5)
    assert a.objects == b.objects
    assert a.image.tobytes() == b.image.tobytes()
    assert a.objects != c.objects and a.image.tobytes() != c.image.tobytes()


def test_global_rng_untouched():
    random.seed(123)
    expected = random.random()
    random.seed(123)
    random_scene(random.Random(0), 4)
    scene_with_targets(random.Random(0), ("red", None), 2, 2)
    assert random.random() == expected


@pytest.mark.parametrize("seed", range(40))
def test_boxes_inside_image_distinct_cells_and_inside_their_cell(seed):
    scene = random_scene(random.Random(seed), 1 + seed % 16)
    cells = _cells(scene)
    assert len(set(cells)) == len(cells)
    for o, (cx, cy) in zip(scene.objects, cells):
        x1, y1, x2, y2 = o.box
        assert 0 <= x1 < x2 <= 112 and 0 <= y1 < y2 <= 112
        assert 14 <= x2 - x1 <= 22 and x2 - x1 == y2 - y1
        # stays within its own 28-px cell (right/bottom exclusive)
        assert cx * 28 <= x1 and x2 <= (cx + 1) * 28
        assert cy * 28 <= y1 and y2 <= (cy + 1) * 28


@pytest.mark.parametrize("seed", range(20))
def test_centre_pixel_has_object_colour(seed):
    scene = random_scene(random.Random(seed), 6)
    for o in scene.objects:
        x1, y1, x2, y2 = o.box
        assert scene.image.getpixel(((x1 + x2) // 2, (y1 + y2) // 2)) == COLORS[o.color]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("side", range(14, 23))
def test_box_tightly_bounds_drawn_shape(shape, side):
    obj = SceneObject(shape, "blue", (30, 31, 30 + side, 31 + side))
    scene = render_scene([obj])
    # Difference with a blank canvas: its bbox is exactly the drawn pixels (right/bottom exclusive).
    from PIL import ImageChops

    blank = render_scene([])
    assert ImageChops.difference(scene.image, blank.image).getbbox() == obj.box


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("target", [("red", "circle"), ("green", None), (None, "triangle")])
def test_scene_with_targets_counts_and_distractors(seed, target):
    rng = random.Random(seed)
    k, m = rng.randint(0, 4), rng.randint(0, 5)
    scene = scene_with_targets(rng, target, num_targets=k, num_distractors=m)
    assert len(scene.objects) == k + m
    assert sum(o.matches(*target) for o in scene.objects) == k
    assert len(set(_cells(scene))) == k + m


def test_scene_with_targets_rejects_impossible_requests():
    with pytest.raises(ValueError):
        scene_with_targets(random.Random(0), (None, None), 1, 1)  # everything matches
    with pytest.raises(ValueError):
        scene_with_targets(random.Random(0), ("red", "circle"), 10, 7)  # 17 > 16 cells
    with pytest.raises(ValueError):
        random_scene(random.Random(0), 13, unique=True)  # only 12 distinct pairs


def test_unique_pairs():
    for seed in range(20):
        scene = random_scene(random.Random(seed), 12, unique=True)
        assert len({(o.color, o.shape) for o in scene.objects}) == 12


@pytest.mark.parametrize(
    "box,word",
    [
        ((0, 0, 20, 20), "top left"),
        ((46, 0, 66, 20), "top"),
        ((92, 0, 112, 20), "top right"),
        ((0, 46, 20, 66), "left"),
        ((46, 46, 66, 66), "center"),
        ((92, 46, 112, 66), "right"),
        ((0, 92, 20, 112), "bottom left"),
        ((46, 92, 66, 112), "bottom"),
        ((92, 92, 112, 112), "bottom right"),
    ],
)
def test_position_word(box, word):
    assert position_word(box, 112) == word


def test_cell_of_inverts_place_in_cell():
    rng = random.Random(7)
    for index in range(16):
        for _ in range(5):
            assert cell_of(place_in_cell(rng, index)) == index
    assert cell_of((0, 0, 10, 10)) == 0 and cell_of((100, 100, 112, 112)) == 15
