"""Generator RL learns on CPU: the shipped tiny generator, Flow-GRPO, a weight-free reward.

The reward is brightness with target 0 (darker is better): a signal the tiny model can follow in a
dozen steps. (The composition reward does not yet rise reliably on the tiny model; the README says
so.) The run goes through ``mmrl.train`` exactly as ``mmrl train diffusion`` does."""

from __future__ import annotations

import json

import pytest

import mmrl


@pytest.mark.slow
def test_flow_grpo_raises_reward_and_writes_before_after_grids(tmp_path):
    result = mmrl.train("diffusion/composition_tiny", [
        "train.steps=12", "train.learning_rate=2e-4", "task.rewards.brightness=1.0",
        "task.reward_kwargs.brightness.target=0.0", "eval.num_examples=16", f"log.output_dir={tmp_path}",
        "log.run_name=run", "log.progress=false", "log.tensorboard=false", "log.save_rollouts_every=6"])
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward"] for r in rows if "reward" in r]
    assert len(rewards) == 12
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.1, rewards
    assert result.after["reward"] > result.before["reward"] + 0.1
    for name in ("samples_before.png", "samples_after.png"):
        assert (result.run_dir / name).stat().st_size > 1000
    assert list((result.run_dir / "rollouts" / "step_000006").glob("*_completion.png"))
