"""vqa: labelled JSONL, and the label-free test-time RL mode (TTRV rewards from the group)."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from conftest import tiny_run_config, tiny_trainer
from mmrl.core.reward_computer import RewardComputer
from mmrl.registry import TASKS


def test_labelled_file_and_label_free_view(tmp_path):
    Image.new("RGB", (32, 32)).save(tmp_path / "a.png")
    p = tmp_path / "q.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in [
        {"image": "a.png", "question": "What colour is it?", "answer": "black"},
        {"image": "a.png", "question": "Is it dark?"},  # no answer: fine for label-free use
        {"image": "a.png"},                             # no question: skipped
    ]) + "\n")
    task = TASKS.get("vqa")(train_path=str(p))
    ds = task.examples("train")
    assert len(ds) == 2 and ds.stats()["skipped_lines"] == 1 and ds[0]["answer"] == "black"
    free = TASKS.get("vqa")(train_path=str(p), labels=False)
    assert set(free.rewards) == {"format", "ttrv_agreement", "ttrv_low_entropy"}
    ex = free.examples("train")[0]
    assert "answer" not in ex and ex["hidden_answer"] == "black"
    with pytest.raises(ValueError, match="no answer"):
        free.target(ex)


def test_label_free_rewards_score_agreement_within_groups():
    """Group 0 answers 3, 3, 4: agreement 2/3, 2/3, 1/3; group 1 all 5: 1 each. Low entropy:
    group 0: 1 - H(2/3, 1/3)/ln 3 = 1 - 0.6365/1.0986 = 0.4206; group 1: 1."""
    task = TASKS.get("vqa")(labels=False)
    rc = RewardComputer(task.rewards, task.reward_kwargs)
    ex = task.examples("train")[0]
    comps = [f"<think>x</think><answer>{a}</answer>" for a in (3, 3, 4, 5, 5, 5)]
    _, parts, _ = rc(comps, [ex] * 6, group_ids=torch.tensor([0, 0, 0, 1, 1, 1]))
    assert parts["ttrv_agreement"].tolist() == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1, 1, 1])
    assert parts["ttrv_low_entropy"].tolist() == pytest.approx([0.4206] * 3 + [1.0] * 3, abs=1e-4)
    assert task.metrics(comps[:3], [ex] * 3)["accuracy"] == pytest.approx(
        sum(a == int(ex["hidden_answer"]) for a in (3, 3, 4)) / 3)


@pytest.mark.slow
def test_label_free_training_step_runs(random_tiny_dir, tmp_path):
    t = tiny_trainer(tiny_run_config(random_tiny_dir, tmp_path, 1, "task.name=vqa", "task.options.labels=false",
                                     "rollout.num_generations=3"))
    batch, m = t.rollout_step(1)
    assert "reward/ttrv_agreement" in m and all("answer" not in ex for ex in batch.examples)
    t.update(batch, 1)
