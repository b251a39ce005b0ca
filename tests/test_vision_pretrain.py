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


@pytest.mark.slow
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


@pytest.mark.slow
def test_screen_pretraining_teaches_the_tower_where_each_token_is(tiny_parts):
    """On the phone's screens each token learns its element, row and column: a linear probe on the
    frozen tokens after pre-training reads the row far above chance (1/8); the random tower's
    tokens carry no position (Qwen2.5-VL's tower has only relative rotary positions)."""
    from transformers import Qwen2VLImageProcessor

    from mmrl.envs import make_env
    from mmrl.vlm.vision_pretrain import pretrain_vision_on_screens

    model, _ = tiny_parts
    processor = Qwen2VLImageProcessor(min_pixels=112 * 224, max_pixels=112 * 224)
    env = make_env("synthetic_gui")

    def row_probe_accuracy() -> float:
        rng = random.Random(7)
        screens = [env.random_screen(rng) for _ in range(48)]
        inputs = processor(images=[o.image for o in screens], return_tensors="pt")
        with torch.no_grad():
            tokens = vision_tower(model)(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"]).pooler_output
        rows = (torch.arange(32) // 4).repeat(48)
        train, test = slice(0, 32 * 32), slice(32 * 32, None)
        probe = torch.nn.Linear(tokens.shape[1], 8)
        opt = torch.optim.Adam(probe.parameters(), lr=1e-2)
        for _ in range(200):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(probe(tokens[train]), rows[train]).backward()
            opt.step()
        return float((probe(tokens[test]).argmax(1) == rows[test]).float().mean())

    before = row_probe_accuracy()
    losses = pretrain_vision_on_screens(model, processor, env, steps=150, batch_size=16, seed=0)
    after = row_probe_accuracy()
    assert sum(losses[-5:]) < 0.6 * sum(losses[:5])
    assert after > before + 0.2 and after > 0.5, (before, after)


@pytest.mark.slow
def test_build_tiny_gui_pretrains_the_tower_then_warm_starts(random_tiny_dir, tmp_path):
    """`mmrl build-tiny gui` in miniature: the tower re-trained on the phone's screens, then SFT on
    the GUI tasks with it frozen; saved atomically and loadable as model.path."""
    from safetensors.torch import load_file

    from mmrl.vlm.tiny_builders import build_tiny_gui

    out = build_tiny_gui(tmp_path / "tiny-gui", base=str(random_tiny_dir), vision_steps=2, sft_steps=2,
                         batch_size=2, progress=False)
    assert (out / "config.json").exists() and not (tmp_path / "tiny-gui.tmp").exists()
    before, after = load_file(random_tiny_dir / "model.safetensors"), load_file(out / "model.safetensors")
    tower = [k for k in before if ".visual." in k or k.startswith("visual.")]
    assert any(not torch.equal(before[k], after[k]) for k in tower)  # pre-trained on screens
    assert any(not torch.equal(before[k], after[k]) for k in before if "embed_tokens" in k or "lm_head" in k)
    mmrl_train = __import__("mmrl").train
    result = mmrl_train("gui/screen_grounding_tiny", [f"model.path={out}", "train.steps=1", "train.prompts_per_step=2",
                                                       "rollout.num_generations=2", "eval.num_examples=2", "eval.pass_k=0",
                                                       f"log.output_dir={tmp_path}", "log.progress=false"])
    assert "point_accuracy" in result.after


@pytest.mark.slow
def test_build_tiny_gui_grounding_teaches_clicks_with_the_tower_frozen(random_tiny_dir, tmp_path):
    """`mmrl build-tiny gui-grounding` in miniature: SFT of a GUI model on screen grounding alone;
    the tower stays as it was, the language model moves, and the result loads as model.path."""
    from safetensors.torch import load_file

    from mmrl.vlm.tiny_builders import build_tiny_gui_grounding

    out = build_tiny_gui_grounding(tmp_path / "tiny-gui-grounding", base=str(random_tiny_dir), sft_steps=2,
                                   batch_size=2, progress=False)
    before, after = load_file(random_tiny_dir / "model.safetensors"), load_file(out / "model.safetensors")
    tower = [k for k in before if ".visual." in k or k.startswith("visual.")]
    assert tower and all(torch.equal(before[k], after[k]) for k in tower)
    assert any(not torch.equal(before[k], after[k]) for k in before if "embed_tokens" in k or "lm_head" in k)
    from mmrl.vlm.loading import resolve_model_path

    assert resolve_model_path(str(out)) == out
