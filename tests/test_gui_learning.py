"""GUI learning tests on the shipped tiny GUI model (`mmrl build-tiny gui`): shortened runs of the
GUI recipes through the public ``mmrl.train``, asserting the held-out task metric."""

from __future__ import annotations

import json

import pytest
from learning_runs import train_quietly as _train


# Screen grounding (`configs/gui/screen_grounding_tiny.yaml`) shortened to 30 steps, 100 held-out
# screens (measured 2026-11-24: point accuracy 0.39 -> 0.44, pass@1 0.273 -> 0.328; the full
# 120-step recipe 0.49). A 40-step schedule gave only 0.42: the gain is noisy at this length, so
# both the greedy and the sampled metric must rise.
GROUNDING_GAIN = 0.03


@pytest.mark.slow
def test_tiny_screen_grounding_raises_heldout_point_accuracy(tmp_path):
    result = _train("gui/screen_grounding_tiny", tmp_path, "grounding", "train.steps=30", "eval.num_examples=100")
    before, after = result.before, result.after
    assert before["reward/format"] >= 0.9 and after["reward/format"] >= 0.9, (before, after)
    assert after["point_accuracy"] - before["point_accuracy"] >= GROUNDING_GAIN, (before, after)
    assert after["pass@1"] - before["pass@1"] >= GROUNDING_GAIN, (before, after)


@pytest.mark.slow
def test_tiny_gui_episodes_train_with_gigpo_and_show_them(tmp_path):
    """Two GiGPO steps of multi-step episodes in the synthetic phone: every step logs the episode
    metrics, the advantages are finite, and the evaluation writes the episode viewer."""
    result = _train("gui/synthetic_gui_tiny", tmp_path, "episodes", "train.steps=2", "train.prompts_per_step=4",
                    "rollout.num_generations=4", "eval.num_examples=8", "log.save_rollouts_every=1")
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward" in r]
    assert len(steps) == 2
    for r in steps:
        assert 0.0 <= r["episode/success"] <= 1.0 and 1.0 <= r["episode/length"] <= 6.0, r
        assert "episode/invalid_actions" in r and "reward/env_reward" in r
    assert {"success", "episode_length", "invalid_actions"} <= set(result.after)
    page = (result.run_dir / "episodes_after" / "index.html").read_text()
    assert page.count("class='ep") == 8 and "step 1" in page
    saved = list((result.run_dir / "rollouts").rglob("*.png"))
    assert saved, "the saved rollouts show each step's screenshot with the click"
