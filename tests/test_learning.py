"""Learning test: RL on the shipped tiny model raises the held-out reward. A shortened
`mmrl train vlm`: same recipe, same code path, through the public ``mmrl.train``."""

from __future__ import annotations

import pytest

import mmrl


@pytest.mark.slow
def test_default_recipe_raises_heldout_reward(tmp_path):
    result = mmrl.train("vlm/counting_tiny", [
        "train.steps=40", "eval.num_examples=100", f"log.output_dir={tmp_path}", "log.run_name=learn",
        "log.progress=false", "log.save_every=0",
    ])
    before, after = result.before, result.after
    print(f"held-out reward before {before['reward']:.3f} after {after['reward']:.3f}")
    assert after["reward"] - before["reward"] >= 0.15, (before, after)
    # The gain is real learning of what the reward asks (the strict reasoning layout) ...
    assert after["reward/format"] - before["reward/format"] >= 0.3
    # ... and does not come at the cost of the task itself.
    assert after["accuracy"] >= before["accuracy"] - 0.1
