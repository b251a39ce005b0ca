"""The SFT warm start's task mixture (examples drawn by task weight), thought dropout's text and
the learning-rate schedule that stops the shipped warm start early."""

import random
from collections import Counter

import pytest

from mmrl.vlm.sft import DEFAULT_TINY_TASKS, draw_examples, drop_thought, mixture_weights


def test_task_weights_set_the_share_of_each_task():
    splits = [[f"a{i}" for i in range(10)], [f"b{i}" for i in range(10)], [f"c{i}" for i in range(10)]]
    picks = draw_examples(random.Random(0), splits, 4000, task_weights=[3, 1, 0])
    share = Counter(t for t, _ in picks)
    assert share[2] == 0  # weight 0: never drawn
    assert abs(share[0] / 4000 - 0.75) < 0.03 and abs(share[1] / 4000 - 0.25) < 0.03
    assert all(ex in splits[t] for t, ex in picks)
    # deterministic by seed; uniform when no weights are given
    assert picks == draw_examples(random.Random(0), splits, 4000, task_weights=[3, 1, 0])
    uniform = Counter(t for t, _ in draw_examples(random.Random(1), splits, 3000))
    assert all(abs(n / 3000 - 1 / 3) < 0.03 for n in uniform.values())


def test_mixture_weights_from_the_task_specs():
    assert mixture_weights([{"name": "ocr", "options": {}}]) is None  # no weights: uniform draw
    assert mixture_weights(DEFAULT_TINY_TASKS)[:4] == [3.0, 1.5, 4.0, 4.0]  # counting-heavy default
    specs = [{"name": "counting", "options": {}, "weight": 4}, {"name": "ocr", "options": {}}]
    assert mixture_weights(specs) == [4.0, 1.0]


def test_thought_dropout_removes_only_the_reasoning_block():
    assert drop_thought("<think>I count 2 red shapes.</think><answer>2</answer>") == "<answer>2</answer>"
    assert drop_thought("<answer>2</answer>") == "<answer>2</answer>"


def test_warm_start_lr_schedule_stops_early_when_decay_is_longer():
    from mmrl.vlm.sft import warm_start_lr_factor

    assert warm_start_lr_factor(0, 800) == pytest.approx(1 / 20)  # warmup
    assert warm_start_lr_factor(19, 800) == pytest.approx(1 - 19 / 800)
    # the shipped warm start stops at step 600 of an 800-step decay: a quarter of the peak is left
    assert warm_start_lr_factor(600, 800) == pytest.approx(0.25)
    assert warm_start_lr_factor(799, 800) == pytest.approx(0.05)  # floored at 5%
