"""Pre-training the tiny vision tower on per-cell labels (mmrl.vlm.vision_pretrain)."""

import random

import pytest
import torch

from mmrl.data.scenes import SceneObject, random_scene, render_scene
from mmrl.vlm import tiny
from mmrl.vlm.loading import vision_tower
from mmrl.vlm.vision_pretrain import cell_labels, pretrain_vision


def test_cell_labels_put_each_object_in_its_reading_order_cell():
    scene = render_scene([SceneObject("circle", "red", (2, 3, 20, 21)),        # row 0, col 0
                          SceneObject("triangle", "yellow", (90, 30, 108, 48)),  # row 1, col 3
                          SceneObject("square", "blue", (58, 86, 76, 104))])     # row 3, col 2
    colors, shapes = cell_labels(scene)
    expected_colors = torch.zeros(16, dtype=torch.long)
    expected_shapes = torch.zeros(16, dtype=torch.long)
    # classes: 0 empty; colours red, green, blue, yellow = 1..4; shapes circle, square, triangle = 1..3
    expected_colors[0], expected_shapes[0] = 1, 1
    expected_colors[7], expected_shapes[7] = 4, 3
    expected_colors[14], expected_shapes[14] = 3, 2
    assert torch.equal(colors, expected_colors) and torch.equal(shapes, expected_shapes)


def _colour_separation(model, processor, scenes) -> float:
    """Mean distance between colour centroids of the merged vision tokens / mean spread within a colour."""
    inputs = processor(images=[s.image for s in scenes], return_tensors="pt")
    with torch.no_grad():
        tokens = vision_tower(model)(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"]).pooler_output
    labels = torch.cat([cell_labels(s)[0] for s in scenes])
    centroids = [tokens[labels == c].mean(0) for c in range(1, 5)]
    spread = sum((tokens[labels == c] - centroids[c - 1]).norm(dim=1).mean() for c in range(1, 5)) / 4
    between = [(a - b).norm() for i, a in enumerate(centroids) for b in centroids[i + 1:]]
    return float(sum(between) / len(between) / spread)


@pytest.fixture(scope="module")
def tiny_parts():
    from transformers import AutoTokenizer

    from mmrl.assets import asset_path

    tokenizer = AutoTokenizer.from_pretrained(asset_path("tiny-qwen2.5-vl"))
    return tiny.build_model(tokenizer, seed=0), tiny.build_processor(tokenizer).image_processor


def test_pretraining_separates_the_colours_the_random_tower_mixes(tiny_parts):
    model, processor = tiny_parts
    rng = random.Random(123)  # held-out scenes, not the training stream (seed 0)
    scenes = [random_scene(rng, 8) for _ in range(24)]
    before = _colour_separation(model, processor, scenes)
    losses = pretrain_vision(model, processor, steps=40, batch_size=16, seed=0)
    after = _colour_separation(model, processor, scenes)
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    assert before < 1.0 < after  # random: colours overlap; pre-trained: centroids further apart than the spread


def test_pretraining_refuses_an_image_budget_without_one_token_per_cell(tiny_parts):
    model, _ = tiny_parts
    from transformers import Qwen2VLImageProcessor

    big = Qwen2VLImageProcessor(min_pixels=224 * 224, max_pixels=224 * 224)
    with pytest.raises(ValueError, match="one per cell"):
        pretrain_vision(model, big, steps=1, batch_size=2)
