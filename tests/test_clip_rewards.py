"""Image rewards on video completions (lists of frames): every frame scored, reduced per clip by the
reward kwarg ``frames`` (mean | min), for every reward declared ``register_reward(media="image")``
(:mod:`mmrl.media.clips`)."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from conftest import make_config
from mmrl import register_reward
from mmrl.core.reward_computer import RewardComputer
from mmrl.registry import REWARDS

WEIGHT_FREE = {"brightness": {}, "jpeg_compressibility": {}, "jpeg_incompressibility": {"scale": 0.5},
               "color_target": {"color": "red"}}
IMAGE_REWARDS = ["brightness", "jpeg_compressibility", "jpeg_incompressibility", "color_target", "composition",
                 "composition_strict", "clip_score", "image_scorer", "vlm_judge"]


def gray(level: int, size: int = 4) -> Image.Image:
    return Image.new("RGB", (size, size), (level, level, level))


SEEN: list[dict] = []


@register_reward("test_clip_spy", media="image")
def spy(completions, examples, **ctx):
    """Records what the reward itself received; scores a frame by its group id (None for a 1-px
    frame, or anything but an image: rewards are called on arbitrary input elsewhere)."""
    ids = ctx["group_ids"].tolist() if ctx.get("group_ids") is not None else [0] * len(completions)
    SEEN.append({"n": len(completions), "group_ids": ids,
                 "prompts": [ex.get("prompt") if isinstance(ex, dict) else None for ex in examples]})
    return [float(g) if isinstance(im, Image.Image) and im.size != (1, 1) else None
            for im, g in zip(completions, ids)]


def test_hand_computed_mean_and_min():
    """Frames of gray 0, 51, 255 have brightness 0, 0.2, 1: the clip's mean is 1.2 / 3 = 0.4, its
    min 0. A still image (gray 102 -> 0.4) in the same batch scores as it always did."""
    brightness = REWARDS.get("brightness")
    batch = [[gray(0), gray(51), gray(255)], gray(102)]
    assert brightness(batch, [{}, {}]) == pytest.approx([0.4, 0.4])
    assert brightness(batch, [{}, {}], frames="mean") == pytest.approx([0.4, 0.4])
    assert brightness(batch, [{}, {}], frames="min") == pytest.approx([0.0, 0.4])
    # with target 0.5: per frame 1 - |b - 0.5| = 0.5, 0.7, 0.5 -> mean 1.7 / 3, min 0.5
    assert brightness(batch[:1], [{}], target=0.5) == pytest.approx([1.7 / 3])
    assert brightness(batch[:1], [{}], target=0.5, frames="min") == pytest.approx([0.5])


def test_frames_see_their_clip_example_and_group():
    SEEN.clear()
    clips = [[gray(0)] * 3, [gray(9)] * 2, gray(5)]
    examples = [{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c"}]
    assert spy(clips, examples, group_ids=torch.tensor([4, 7, 9])) == [4.0, 7.0, 9.0]
    # one call for all 6 frames (a learned scorer sees one batch), example and group id per frame
    assert SEEN == [{"n": 6, "group_ids": [4, 4, 4, 7, 7, 9], "prompts": ["a", "a", "a", "b", "b", "c"]}]


def test_a_clip_with_an_unscorable_frame_scores_the_minimum():
    """One frame the reward cannot score (None) makes the whole clip unparsable, never an average of
    the frames it could score; an empty clip likewise."""
    computer = RewardComputer({"test_clip_spy": 1.0}, {"test_clip_spy": {"frames": "min"}})
    total, comps, stats = computer([[gray(0), gray(0, size=1)], [gray(0)] * 2, []], [{"prompt": "p"}] * 3,
                                   group_ids=torch.tensor([2, 3, 5]))
    assert total.tolist() == [0.0, 3.0, 0.0]
    assert stats["reward/test_clip_spy/unparsable_frac"] == pytest.approx(2 / 3)


def test_unknown_frame_reduction_is_refused_at_setup():
    with pytest.raises(ValueError, match=r"task\.reward_kwargs\.brightness\.frames='median'.*mean, min"):
        RewardComputer({"brightness": 1.0}, {"brightness": {"frames": "median"}})
    RewardComputer({"brightness": 1.0}, {"brightness": {"frames": "min"}})
    # a model-based reward's own check still runs behind the frames check
    with pytest.raises(FileNotFoundError, match="clip_score.pretrained"):
        RewardComputer({"clip_score": 1.0}, {"clip_score": {"frames": "min"}})
    with pytest.raises(ValueError, match="media"):
        register_reward("test_bad_media", media="audio")(lambda completions, examples, **ctx: [])


def test_every_image_reward_is_declared_and_text_rewards_are_not():
    for name in IMAGE_REWARDS:
        assert REWARDS.get(name).reward_media == "image", name
    for name in ("format", "accuracy", "iou", "ttrv_agreement"):
        assert REWARDS.get(name).reward_media == "any", name


@pytest.fixture(scope="module")
def wan_clips(wan_dir, one_thread):
    """Two 5-frame clips of the tiny Wan pipeline (eval rollout: deterministic ODE)."""
    from mmrl.diffusion.policy import DiffusionPolicy

    cfg = make_config(f"model.path={wan_dir}", "train.device=cpu", "task.name=t2i_prompts",
                      "diffusion.eval_num_steps=2", "diffusion.height=16", "diffusion.width=16",
                      "diffusion.num_frames=5", "diffusion.guidance_scale=1.0")
    policy = DiffusionPolicy(cfg)
    examples = [{"prompt": "a red cat", "_index": 0}, {"prompt": "two dogs", "_index": 1}]
    batch = policy.rollout(examples, [ex["prompt"] for ex in examples], 1, "eval", False, False)
    return batch.completions, batch.examples


@pytest.mark.slow
def test_wan_clip_is_scored_frame_by_frame(wan_clips):
    clips, examples = wan_clips
    assert len(clips) == 2 and all(len(c) == 5 and all(isinstance(f, Image.Image) for f in c) for c in clips)
    for name, kwargs in WEIGHT_FREE.items():
        fn = REWARDS.get(name)
        # the frames one by one, each as a still image
        per_frame = [[fn([frame], [ex], **kwargs)[0] for frame in clip] for clip, ex in zip(clips, examples)]
        assert all(isinstance(v, float) for frames in per_frame for v in frames), name
        assert fn(clips, examples, **kwargs) == pytest.approx([sum(f) / len(f) for f in per_frame]), name
        assert fn(clips, examples, frames="min", **kwargs) == pytest.approx([min(f) for f in per_frame]), name
    # the frames differ, so mean and min really are different numbers here
    brightness = [[REWARDS.get("brightness")([f], [ex])[0] for f in clip] for clip, ex in zip(clips, examples)]
    assert all(max(b) - min(b) > 1e-3 for b in brightness), brightness


@pytest.mark.slow
def test_reward_computer_scores_clips_with_each_rewards_reduction(wan_clips):
    clips, examples = wan_clips
    computer = RewardComputer({"brightness": 1.0, "jpeg_compressibility": 0.1},
                              {"brightness": {"frames": "min"}})
    total, comps, stats = computer(clips, examples, group_ids=torch.tensor([0, 0]))
    bright_min = REWARDS.get("brightness")(clips, examples, frames="min")
    jpeg_mean = REWARDS.get("jpeg_compressibility")(clips, examples)
    assert comps["brightness"].tolist() == pytest.approx(bright_min)
    assert comps["jpeg_compressibility"].tolist() == pytest.approx(jpeg_mean)
    assert total.tolist() == pytest.approx([b + 0.1 * j for b, j in zip(bright_min, jpeg_mean)])
    assert stats["reward/brightness/unparsable_frac"] == 0.0 and all(v < 0 for v in jpeg_mean)
