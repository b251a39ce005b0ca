"""The video tasks: synthetic clips, the real formats read as they ship, perfect answers, galleries."""

from __future__ import annotations

import json

import pytest
import torch

from mmrl.data.motion import appearance_clip, motion_clip
from mmrl.registry import REWARDS, TASKS, load_plugins

pytest.importorskip("torchvision", reason="clips are resized like qwen-vl-utils (torchvision: mmrl[video])")
load_plugins()


def test_motion_clip_moves_one_cell_per_step_in_its_direction():
    import random

    for seed in range(20):
        clip, mover, direction = motion_clip(random.Random(seed), steps=4)
        cols = [c % 4 for c in mover.cells]
        rows = [c // 4 for c in mover.cells]
        step = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}[direction]
        assert [b - a for a, b in zip(cols, cols[1:])] == [step[0]] * 3
        assert [b - a for a, b in zip(rows, rows[1:])] == [step[1]] * 3
        assert len(clip.frames) == 8 and clip.frames[0] is clip.frames[1]  # each scene held 2 frames
        others = [c for t in clip.tracks if t is not mover for c in t.cells]
        assert not set(others) & set(mover.cells)


def test_appearance_clip_segments_are_in_seconds():
    import random

    clip = appearance_clip(random.Random(3), steps=4, objects=3)
    for track in clip.tracks:
        start, end = clip.segment(track)
        assert start == track.visible[0] * 1.0 and end == (track.visible[-1] + 1) * 1.0  # 2 frames at 2 fps
        assert track.visible == list(range(track.visible[0], track.visible[-1] + 1))


@pytest.mark.parametrize("name", ["video_qa", "temporal_grounding"])
def test_reference_answers_score_one_and_junk_scores_zero(name):
    task = TASKS.get(name)()
    exs = [task.examples("eval")[i] for i in range(12)]
    targets = [task.target(e) for e in exs]
    assert task.metrics(targets, exs)["accuracy"] == 1.0
    for reward, weight in task.rewards.items():
        scores = REWARDS.get(reward)(targets, exs)
        assert all(s == pytest.approx(1.0) for s in scores), (reward, scores)
    assert task.metrics(["<answer>Q</answer>"] * 12, exs)["accuracy"] == 0.0
    assert exs[0]["video"].frames.shape == (8, 3, 112, 112)


def test_video_qa_asks_both_kinds_with_their_problem_types():
    task = TASKS.get("video_qa")()
    exs = [task.examples("train")[i] for i in range(40)]
    kinds = {(e["kind"], e["problem_type"]) for e in exs}
    assert kinds == {("motion", "multiple choice"), ("appear_count", "numerical")}
    motion = next(e for e in exs if e["kind"] == "motion")
    assert "A. left B. right C. up D. down" in motion["question"] and motion["answer"] in "ABCD"


def _clip(path):
    from test_video_reader import write_clip

    return write_clip(path, frames=20, fps=10, size=(56, 56))


def test_video_r1_file_read_as_it_is(tmp_path):
    """Video-R1's JSON layout (problem, problem_type, options, solution, path, data_type), an
    image record among the clips, and a record whose clip is missing skipped with its line."""
    _clip(tmp_path / "a.mp4")
    from PIL import Image

    Image.new("RGB", (56, 56), (200, 0, 0)).save(tmp_path / "b.png")
    records = [
        {"problem": "Which way does it move?", "problem_type": "multiple choice",
         "options": ["A. left", "B. right"], "solution": "<answer>B</answer>", "path": "a.mp4", "data_type": "video"},
        {"problem": "What colour is it?", "problem_type": "free-form", "solution": "<answer>dark red</answer>",
         "path": "b.png", "data_type": "image"},
        {"problem": "How many?", "problem_type": "numerical", "solution": "<answer>3</answer>",
         "path": "missing.mp4", "data_type": "video"},
    ]
    (tmp_path / "train.json").write_text(json.dumps(records, indent=1))
    task = TASKS.get("video_qa")(train_path=str(tmp_path / "train.json"), video={"fps": 2.0, "max_pixels": 3136})
    exs = task.examples("train")
    assert len(exs) == 2 and exs.skipped and "missing.mp4" in exs.skipped[0][1]
    video, image = exs[0], exs[1]
    assert video["question"] == "Which way does it move? Options: A. left B. right"
    assert video["video"].frames.shape[0] == 4 and video["video"].sample_fps == pytest.approx(2.0)
    assert image["image"].size == (56, 56) and "video" not in image
    perfect = [f"<answer>{e['answer']}</answer>" for e in (video, image)]
    assert task.metrics(perfect, [video, image])["accuracy"] == 1.0
    assert task.prompt(video)[0]["content"][0]["type"] == "video"
    assert task.prompt(image)[0]["content"][0]["type"] == "image"


def test_charades_sta_and_activitynet_read_as_they_ship(tmp_path):
    """Charades-STA's ``VIDEO start end##sentence`` lines (a malformed line skipped with its line
    number) and ActivityNet Captions' JSON (one example per sentence); a perfect answer scores 1."""
    _clip(tmp_path / "3MSZA.mp4")
    _clip(tmp_path / "v_abc.mp4")
    (tmp_path / "charades_sta_test.txt").write_text(
        "3MSZA 0.3 1.2##person turn a light on.\nbroken line\n3MSZA 1.0 1.9##person opens a door.\n")
    task = TASKS.get("temporal_grounding")(train_path=str(tmp_path / "charades_sta_test.txt"))
    exs = task.examples("train")
    assert len(exs) == 2 and exs.skipped[0][0] == 2
    ex = exs[0]
    assert ex["segment"] == (0.3, 1.2) and ex["question"] == "When does this happen: person turn a light on?"
    assert ex["video_path"].endswith("3MSZA.mp4")
    assert task.metrics(["<answer>0.3 to 1.2</answer>"], [ex]) == {"accuracy": 1.0, "mean_tiou": 1.0, "parsed": 1.0}
    assert REWARDS.get("tiou")(["<answer>0.3 to 1.2</answer>", "<answer>0.75 to 1.65</answer>"], [ex, ex]) == \
        pytest.approx([1.0, 0.45 / 1.35])
    (tmp_path / "val_1.json").write_text(json.dumps({"v_abc": {
        "duration": 2.0, "timestamps": [[0.0, 0.8], [0.9, 1.8]], "sentences": ["A man waves.", " He sits down."]}}))
    task = TASKS.get("temporal_grounding")(eval_path=str(tmp_path / "val_1.json"))
    exs = task.examples("eval")
    assert [e["segment"] for e in exs] == [(0.0, 0.8), (0.9, 1.8)]
    assert exs[1]["question"] == "When does this happen: He sits down?"


def test_galleries_draw_frame_strips_and_timelines():
    """A grounding picture is a strip of the clip's frames over two timelines: the true segment
    in green on the first, the predicted one in red on the second."""
    task = TASKS.get("temporal_grounding")()
    ex = task.examples("eval")[0]
    start, end = ex["segment"]
    picture = task.visualize(ex, f"<answer>{start:g} to {end:g}</answer>")
    width, height = picture.size
    assert width > 4 * 224  # 8 frames side by side at 2x
    from mmrl.media.draw import FOOTER, TIMELINE

    true_row = height - FOOTER - 2 * TIMELINE + 5
    pred_row = true_row + TIMELINE
    mid = round((start + end) / 2 / ex["duration"] * (width - 1))
    assert picture.getpixel((mid, true_row)) == (0, 200, 0)
    assert picture.getpixel((mid, pred_row)) == (255, 0, 0)
    qa = TASKS.get("video_qa")()
    rec = qa.record(qa.examples("eval")[0], "<answer>A</answer>")
    assert rec["image"].size[0] > 4 * 224


def test_harder_variant_of_a_clip_adds_noise_to_every_frame():
    """DeepVideo-R1's "harder" re-roll of a clip question: the same clip with Gaussian pixel noise."""
    import numpy as np

    task = TASKS.get("video_qa")()
    ex = task.examples("train")[0]
    harder = task.augment(ex, "harder", np.random.default_rng(0), noise_std=0.1)
    before, after = ex["video"].frames.float(), harder["video"].frames.float()
    assert after.shape == before.shape and harder["video"].timestamps == ex["video"].timestamps
    per_frame = (after - before).abs().mean(dim=(1, 2, 3))
    assert (per_frame > 5).all() and (per_frame < 40).all()  # ~0.8 * 25.5 on unclipped pixels


@pytest.mark.slow
def test_build_tiny_video_warm_starts_a_checkpoint_that_loads(random_tiny_dir, tmp_path):
    """`mmrl build-tiny video` in miniature: a few SFT steps on clips from a base checkpoint, saved
    atomically (no staging directory left), loadable as model.path, vision tower unchanged."""
    from safetensors.torch import load_file

    from mmrl.vlm.tiny_builders import build_tiny_video

    out = build_tiny_video(tmp_path / "tiny-video", base=str(random_tiny_dir), sft_steps=2, batch_size=2,
                           progress=False)
    assert (out / "config.json").exists() and not (tmp_path / "tiny-video.tmp").exists()
    before, after = load_file(random_tiny_dir / "model.safetensors"), load_file(out / "model.safetensors")
    tower = [k for k in before if ".visual." in k or k.startswith("visual.")]
    assert tower and all(torch.equal(before[k], after[k]) for k in tower)
    assert any(not torch.equal(before[k], after[k]) for k in before if "lm_head" in k or "embed_tokens" in k)
