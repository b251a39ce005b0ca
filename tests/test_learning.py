"""Learning test: RL on the shipped tiny model raises the held-out reward (a shortened
`mmrl train vlm`, same recipe and code path)."""

from __future__ import annotations

import pytest

from conftest import make_config
from mmrl.config import builtin_config_path
from mmrl.core.trainer import Trainer
from mmrl.vlm.policy import VLMPolicy


@pytest.mark.slow
def test_default_recipe_raises_heldout_reward(tmp_path):
    cfg = make_config(
        "train.steps=40", "eval.num_examples=100", f"log.output_dir={tmp_path}", "log.run_name=learn",
        "log.progress=false", "log.save_every=0",
        path=builtin_config_path("vlm/counting_tiny"),
    )
    result = Trainer(cfg, VLMPolicy(cfg)).train()
    before, after = result.before["reward"], result.after["reward"]
    print(f"held-out reward before {before:.3f} after {after:.3f}")
    assert after - before >= 0.1, (result.before, result.after)
