"""Generator RL learns on CPU: the shipped tiny generator through ``mmrl.train``, as ``mmrl train
diffusion`` runs it.

- The default recipe (AWM) on the composition reward: the shipped generator follows the prompt's
  colour only about half the time (its pretraining captions misstate colours); a few steps close much
  of that gap on held-out prompts (the README quotes the full 100-step run).
- Flow-GRPO's clipped log-prob surrogate with a weight-free darkness reward (brightness, target 0):
  the SDE log-prob path learns an unconditional signal in a dozen steps.
- The tiny video generator (``configs/diffusion/motion_t2v_tiny.yaml``) on the whole-clip motion
  reward: RL makes it keep the prompt's object in every frame of held-out prompts."""

from __future__ import annotations

import json

import pytest

import mmrl


def _run(tmp_path, name, overrides, config="diffusion/composition_tiny"):
    result = mmrl.train(config, [
        *overrides, f"log.output_dir={tmp_path}", f"log.run_name={name}", "log.progress=false",
        "log.tensorboard=false", "log.save_every=0", "eval.every=0",
        # a short run at a constant lr (the recipe's linear decay spreads lr 1e-4 over its 100 steps)
        "train.lr_scheduler_type=constant_with_warmup"])
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    return result, [r["reward"] for r in rows if "reward" in r]


@pytest.mark.slow
def test_default_recipe_raises_held_out_composition(tmp_path):
    result, rewards = _run(tmp_path, "awm", ["train.steps=15", "train.prompts_per_step=8", "train.learning_rate=2e-4",
                                             "eval.num_examples=32", "log.save_rollouts_every=0"])
    assert len(rewards) == 15
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.1, rewards
    before, after = result.before, result.after
    assert after["reward"] > before["reward"] + 0.1, (before, after)  # measured 0.275 -> 0.458
    assert after["check/color"] > before["check/color"] + 0.2  # the gap the pretraining left; 0.375 -> 0.719
    for name in ("samples_before.png", "samples_after.png"):
        assert (result.run_dir / name).stat().st_size > 1000


@pytest.mark.slow
def test_flow_grpo_raises_a_darkness_reward_and_saves_rollouts(tmp_path):
    result, rewards = _run(tmp_path, "clip", [
        "algo.loss_type=clip", "train.steps=12", "train.prompts_per_step=8", "train.learning_rate=2e-4",
        "task.rewards.brightness=1.0", "task.reward_kwargs.brightness.target=0.0", "eval.num_examples=16",
        "log.save_rollouts_every=6"])
    assert len(rewards) == 12
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.1, rewards
    assert result.after["reward"] > result.before["reward"] + 0.1
    assert list((result.run_dir / "rollouts" / "step_000006").glob("*_completion.png"))


@pytest.mark.slow
def test_tiny_video_generator_learns_the_motion_reward(tmp_path):
    """20 steps of 8 prompts x 8 clips (AWM, lr 1e-4) on held-out motion prompts. Measured
    (2026-11-24, 63 s): reward 0.457 -> 0.566, the object drawn in every frame 0.25 -> 0.92, every
    check passed 0.016 -> 0.125. The direction check hardly moves (0.125 -> 0.14): the shipped tiny
    generator does not draw coherent motion from pure noise (README, "The tiny video generator")."""
    result, rewards = _run(tmp_path, "motion", ["train.steps=20", "train.prompts_per_step=8", "train.learning_rate=1e-4",
                                                "eval.num_examples=64", "log.save_rollouts_every=0"],
                           config="diffusion/motion_t2v_tiny")
    assert len(rewards) == 20
    before, after = result.before, result.after
    assert after["reward"] > before["reward"] + 0.05, (before, after)
    assert after["check/color"] > before["check/color"] + 0.4, (before, after)
    assert after["motion_accuracy"] >= before["motion_accuracy"], (before, after)
