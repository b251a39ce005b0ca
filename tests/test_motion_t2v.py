"""Text-to-video motion: the synthetic clips, the programmatic motion checker, the whole-clip
``motion`` rewards and the ``motion_t2v`` task (data, held-out prompts, metrics, gallery)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from conftest import make_config
from mmrl import make_task
from mmrl.core.reward_computer import RewardComputer
from mmrl.data.motion_t2v import (CLIP_SIZE, DIRECTIONS, NUM_FRAMES, clip_array, motion_boxes, motion_example,
                                  motion_prompt, render_clip)
from mmrl.data.shapes_t2i import BACKGROUND, COLORS, SHAPES
from mmrl.measures.motion import as_frames, motion_checks, motion_score, track_object
from mmrl.media.draw import FOOTER, PRED, TRUE
from mmrl.registry import REWARDS
from mmrl.task import is_held_out

ALL_SPECS = [{"color": c, "shape": s, "direction": d} for c in COLORS for s in SHAPES for d in DIRECTIONS]


def frame_with(box=None, color="red", shape="square", size=CLIP_SIZE) -> Image.Image:
    """A background frame with one palette shape in ``box`` (right/bottom exclusive), or none."""
    frame = Image.new("RGB", (size, size), BACKGROUND)
    if box is not None:
        x1, y1, x2, y2 = box
        draw = ImageDraw.Draw(frame)
        (draw.rectangle if shape == "square" else draw.ellipse)([x1, y1, x2 - 1, y2 - 1], fill=COLORS[color])
    return frame


# -- data ---------------------------------------------------------------------------------------


def test_examples_are_deterministic_by_seed():
    a, b, c = motion_example(3), motion_example(3), motion_example(4)
    assert a["spec"] == b["spec"] and a["prompt"] == b["prompt"] == motion_prompt(a["spec"])
    assert np.array_equal(clip_array(a["frames"]), clip_array(b["frames"]))
    assert clip_array(a["frames"]).shape == (NUM_FRAMES, 3, CLIP_SIZE, CLIP_SIZE)
    assert a["spec"] != c["spec"] or not np.array_equal(clip_array(a["frames"]), clip_array(c["frames"]))


@pytest.mark.parametrize("direction", list(DIRECTIONS))
def test_the_object_stays_inside_the_frame_and_moves_its_way(direction):
    dx, dy = DIRECTIONS[direction]
    for seed in range(20):
        boxes = motion_boxes({"color": "red", "shape": "circle", "direction": direction}, seed)
        assert all(0 <= x1 < x2 <= CLIP_SIZE and 0 <= y1 < y2 <= CLIP_SIZE for x1, y1, x2, y2 in boxes)
        for (ax, ay, _, _), (bx, by, _, _) in zip(boxes, boxes[1:]):
            assert (bx - ax, by - ay) == (4 * dx, 4 * dy)  # one 4-px cell a frame at 16 px


# -- the checker --------------------------------------------------------------------------------


def test_every_rendered_clip_passes_every_check():
    for spec in ALL_SPECS:
        for seed in range(3):
            checks = motion_checks(render_clip(spec, seed), spec)
            assert all(checks.values()), (spec, seed, checks)
            assert set(checks) == {"color", "shape", "direction", "steady"}


def test_reversed_static_recoloured_and_vanishing_clips_fail_their_check():
    spec = {"color": "blue", "shape": "circle", "direction": "up"}
    frames = render_clip(spec, 0)
    reverse = motion_checks(frames[::-1], spec)
    assert not reverse["direction"] and not reverse["steady"] and reverse["color"] and reverse["shape"]
    still = motion_checks([frames[1]] * NUM_FRAMES, spec)
    assert not still["direction"] and still["steady"] and still["color"]  # standing still is not going back
    assert not motion_checks(render_clip({**spec, "color": "green"}, 0), spec)["color"]
    assert not motion_checks(frames, {**spec, "direction": "down"})["direction"]
    assert not motion_checks(frames, {**spec, "direction": "left"})["direction"]
    vanished = motion_checks([frames[0], frame_with(None), *frames[2:]], spec)
    assert not vanished["color"] and vanished["direction"] and vanished["steady"]
    # lost in the last frame: its start-to-end travel is unknown, so direction fails too
    assert not motion_checks([*frames[:-1], frame_with(None)], spec)["direction"]


def test_a_slightly_noisy_clip_still_passes():
    rng = np.random.default_rng(0)
    for spec in ALL_SPECS[::3]:
        pixels = clip_array(render_clip(spec, 1)).astype(np.float32)
        noisy = np.clip(pixels + rng.normal(0, 10, pixels.shape), 0, 255).astype(np.uint8)
        assert all(motion_checks(noisy, spec).values()), spec
        assert all(motion_checks(torch.from_numpy(noisy).float() / 255, spec).values()), spec


def test_hand_computed_centroid_displacement():
    """A 4x4 red square at x 2..5, y 6..9 (centroid (4, 8)), then at x 8..11, y 7..10 (centroid
    (10, 9)): dx = 6, dy = 1. Right: 6 >= 2 px and 1 <= 6 / 2, passes; down: 1 < 2 px, fails."""
    clip = [frame_with((2, 6, 6, 10)), frame_with((8, 7, 12, 11))]
    first, last = track_object(clip, "red")
    assert (first["cx"], first["cy"], last["cx"], last["cy"]) == (4.0, 8.0, 10.0, 9.0)
    assert track_object(clip, "blue") == [None, None]
    right = {"color": "red", "shape": "square", "direction": "right"}
    assert motion_checks(clip, right) == {"color": True, "shape": True, "direction": True, "steady": True}
    assert not motion_checks(clip, {**right, "direction": "down"})["direction"]
    assert motion_checks(clip, {**right, "direction": "down"})["steady"]  # dy = +1 is not backwards
    # a diagonal move (dx 6, dy 4): 4 across > 6 / 2 along, not "right"
    assert not motion_checks([frame_with((2, 2, 6, 6)), frame_with((8, 6, 12, 10))], right)["direction"]
    # y grows downward: moving up is a negative dy
    up = [frame_with((6, 10, 10, 14)), frame_with((6, 7, 10, 11))]
    assert motion_checks(up, {**right, "direction": "up"})["direction"]
    assert not motion_checks(up, {**right, "direction": "down"})["direction"]
    # 1 px of travel: under the default 2 px (16 / 8), enough with min_shift=1
    small = [frame_with((2, 6, 6, 10)), frame_with((3, 6, 7, 10))]
    assert not motion_checks(small, right)["direction"] and motion_checks(small, right, min_shift=1)["direction"]
    assert motion_score(small, right) == 0.75


def test_frames_as_pil_lists_arrays_and_tensors():
    frames = render_clip(ALL_SPECS[0], 0)
    array = clip_array(frames)
    for clip in (frames, array, torch.from_numpy(array), torch.from_numpy(array).float() / 255,
                 [np.asarray(f) for f in frames]):
        assert [np.asarray(f).tolist() for f in as_frames(clip)] == [np.asarray(f).tolist() for f in frames]
    assert len(as_frames(frames[0])) == 1 and len(as_frames(array[0])) == 1
    with pytest.raises(ValueError, match="clip"):
        as_frames("a red circle")


# -- rewards ------------------------------------------------------------------------------------


def test_rewards_on_hand_examples():
    spec = {"color": "red", "shape": "square", "direction": "right"}
    ex = {"spec": spec}
    good = render_clip(spec, 0)
    motion, strict = REWARDS.get("motion"), REWARDS.get("motion_strict")
    assert motion.reward_media == strict.reward_media == "video"
    # a still image is a 1-frame clip: colour and shape pass, direction and steady (no step) fail: 2/4
    clips = [good, good[::-1], good[0], [good[0]] * 3, "a red square", []]
    assert motion(clips, [ex] * 6) == [1.0, 0.5, 0.5, 0.75, None, None]
    assert strict(clips, [ex] * 6) == [1.0, 0.0, 0.0, 0.0, None, None]
    assert motion([good], [{"prompt": "no spec"}]) == [None]
    with pytest.raises(ValueError, match="2 clips for 1 examples"):
        motion([good, good], [ex])


def test_rewards_on_tensors():
    spec = {"color": "yellow", "shape": "circle", "direction": "left"}
    array = clip_array(render_clip(spec, 2))
    batch = [torch.from_numpy(array).float() / 255, array, torch.from_numpy(array[::-1].copy()).float() / 255]
    assert REWARDS.get("motion")(batch, [{"spec": spec}] * 3) == [1.0, 1.0, 0.5]
    assert REWARDS.get("motion_strict")(batch, [{"spec": spec}] * 3) == [1.0, 1.0, 0.0]


# -- the task -----------------------------------------------------------------------------------


def test_held_out_prompts_leave_every_direction_to_train():
    held = [s for s in ALL_SPECS if is_held_out(motion_prompt(s))]
    train = [s for s in ALL_SPECS if not is_held_out(motion_prompt(s))]
    assert 0 < len(held) < len(train)
    assert {s["direction"] for s in train} == set(DIRECTIONS)


def test_task_examples_are_deterministic_and_held_out_prompts_are_never_trained():
    task, again = make_task("motion_t2v"), make_task("motion_t2v")
    assert task.modality == "diffusion" and task.rewards == {"motion": 1.0}
    assert task.success_metric == "motion_accuracy"
    assert len(task.examples("train")) == 20000 and len(task.examples("eval")) == 64
    ev, tr = task.examples("eval"), task.examples("train")
    assert [ev[i] for i in range(64)] == [again.examples("eval")[i] for i in range(64)]
    eval_prompts = {ev[i]["prompt"] for i in range(64)}
    train_prompts = {tr[i]["prompt"] for i in range(300)}
    assert eval_prompts and all(is_held_out(p) for p in eval_prompts)
    assert not eval_prompts & train_prompts
    assert {tr[i]["spec"]["direction"] for i in range(300)} == set(DIRECTIONS)
    assert all(ex["prompt"] == motion_prompt(ex["spec"]) for ex in (ev[0], tr[0]))
    with pytest.raises(ValueError, match="unknown split"):
        task.examples("test")


def test_metrics_and_visualize():
    task = make_task("motion_t2v", eval_size=8)
    examples = list(task.examples("eval"))
    perfect = [render_clip(ex["spec"], i) for i, ex in enumerate(examples)]
    assert task.metrics(perfect, examples) == {"motion_accuracy": 1.0, "check/color": 1.0, "check/shape": 1.0,
                                               "check/direction": 1.0, "check/steady": 1.0}
    reversed_ = task.metrics([clip[::-1] for clip in perfect], examples)
    assert reversed_["motion_accuracy"] == 0.0 and reversed_["check/direction"] == 0.0
    assert reversed_["check/color"] == 1.0
    assert task.metrics(["text"] + perfect[1:], examples)["motion_accuracy"] == 7 / 8
    image = task.visualize(examples[0], perfect[0])
    assert image.size == (NUM_FRAMES * (CLIP_SIZE * 6 + 2), CLIP_SIZE * 6 + FOOTER)
    # the centroids joined by a line: green where the direction check passes, red where it fails

    def near_segment(im: Image.Image, frames) -> set:  # pixels around the midpoint of the first segment
        track = track_object(frames, examples[0]["spec"]["color"])
        x = round((track[0]["cx"] * 6 + (CLIP_SIZE * 6 + 2) + track[1]["cx"] * 6) / 2)
        y = round((track[0]["cy"] + track[1]["cy"]) * 3)
        return {im.getpixel((x + i, y + j)) for i in (-1, 0, 1) for j in (-1, 0, 1)}

    assert TRUE in near_segment(image, perfect[0]) and PRED not in near_segment(image, perfect[0])
    backwards = task.visualize(examples[0], perfect[0][::-1])
    assert backwards.size == image.size and PRED in near_segment(backwards, perfect[0][::-1])
    assert task.visualize(examples[0], "text") is None


# -- clips of the tiny Wan pipeline: a whole-clip reward beside a per-frame one -------------------


@pytest.fixture(scope="module")
def wan_motion_clips(wan_dir, one_thread):
    """Two 5-frame 16x16 clips of the tiny Wan pipeline for motion_t2v prompts (eval: ODE)."""
    from mmrl.diffusion.policy import DiffusionPolicy

    cfg = make_config(f"model.path={wan_dir}", "train.device=cpu", "task.name=motion_t2v",
                      "diffusion.eval_num_steps=2", "diffusion.height=16", "diffusion.width=16",
                      "diffusion.num_frames=5", "diffusion.guidance_scale=1.0")
    policy = DiffusionPolicy(cfg)
    examples = [{**make_task("motion_t2v").examples("eval")[i], "_index": i} for i in range(2)]
    batch = policy.rollout(examples, [ex["prompt"] for ex in examples], 1, "eval", False, False)
    return batch.completions, batch.examples


def test_wan_clips_are_scored_whole_beside_a_per_frame_reward(wan_motion_clips):
    clips, examples = wan_motion_clips
    assert len(clips) == 2 and all(len(c) == 5 and all(isinstance(f, Image.Image) for f in c) for c in clips)
    scores = REWARDS.get("motion")(clips, examples)
    assert all(isinstance(s, float) and 0.0 <= s <= 1.0 for s in scores), scores
    total, comps, stats = RewardComputer({"motion": 1.0, "brightness": 0.5}, {})(
        clips, examples, group_ids=torch.tensor([0, 1]))
    bright = REWARDS.get("brightness")(clips, examples)  # each clip's mean frame brightness
    assert comps["motion"].tolist() == pytest.approx(scores)
    assert comps["brightness"].tolist() == pytest.approx(bright)
    assert total.tolist() == pytest.approx([m + 0.5 * b for m, b in zip(scores, bright)])
    assert stats["reward/motion/unparsable_frac"] == 0.0
