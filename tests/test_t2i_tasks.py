"""The generator tasks: held-out composition prompts, prompt files, metrics."""

from __future__ import annotations

import pytest

from mmrl.registry import TASKS


def test_composition_eval_prompts_are_never_trained_on():
    task = TASKS.get("composition")(train_size=300, eval_size=40)
    train = {task.examples("train")[i]["prompt"] for i in range(300)}
    held = {task.examples("eval")[i]["prompt"] for i in range(40)}
    assert held and not train & held


def test_composition_metrics_on_rendered_targets_are_perfect():
    import numpy as np

    from mmrl.data.shapes_t2i import render

    task = TASKS.get("composition")()
    examples = [task.examples("eval")[i] for i in range(8)]
    images = [render(ex["spec"], np.random.default_rng(i)) for i, ex in enumerate(examples)]
    metrics = task.metrics(images, examples)
    assert metrics["geneval_accuracy"] == 1.0 and metrics["check/count"] == 1.0


def test_prompt_files_txt_and_jsonl(tmp_path):
    txt = tmp_path / "p.txt"
    txt.write_text("# comment\na cat\n\na dog on a sofa\n")
    task = TASKS.get("t2i_prompts")(train_path=str(txt))
    assert [ex["prompt"] for ex in task.examples("train")] == ["a cat", "a dog on a sofa"]
    assert task.build_prompt(task.examples("eval")[1]) == "a dog on a sofa"  # eval defaults to train
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a red car", "target_color": "red"}\n{"nope": 1}\n')
    examples = TASKS.get("t2i_prompts")(train_path=str(jsonl)).examples("train")
    assert len(examples) == 1 and examples[0]["target_color"] == "red"
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        TASKS.get("t2i_prompts")(train_path=str(tmp_path / "missing.txt")).examples("train")
    with pytest.raises(ValueError, match="train_path"):
        TASKS.get("t2i_prompts")().examples("train")
