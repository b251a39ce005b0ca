"""Rewards of trajectories that call tools: DeepEyes, crop_iou, Pixel Reasoner's curiosity terms."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.measures.tool_use import rule_judge, tool_use_metrics
from mmrl.registry import REWARDS
from test_rewards import as_trained


def record(ok=True, box=(0, 0, 10, 10), image=True, turn=1, name="zoom_in"):
    return {"turn": turn, "name": name, "arguments": {}, "ok": ok, "error": None if ok else "Error: x",
            "box": list(box) if box is not None and ok else None, "image_size": [56, 56] if ok and image else None}


def score(name, completions, examples, **kw):
    return REWARDS.get(name)(completions, examples, **kw)


TRAJECTORY = ('<think>The sign is small; zoom.</think><tool_call>{"name": "zoom_in", "arguments": '
              '{"bbox_2d": [1, 2, 30, 40]}}</tool_call><tool_response><image></tool_response>'
              '<think>It reads red.</think><answer>red</answer>')


def test_deepeyes_hand_computed():
    used = {"answer": "red", "tool_calls": [record()]}
    unused = {"answer": "red"}
    cases = [
        (TRAJECTORY, used, 0.8 * 1 + 0.2 * 0 + 1.2 * 1),  # right, well formed, tool image: 2.0
        (TRAJECTORY, unused, 0.8),  # right, no tool
        ("<think>a</think><answer>blue</answer>", used, 0.0),  # wrong: no tool bonus either
        ("<think>a<answer>red</answer>", unused, 0.8 - 0.2),  # <think> without </think>: format -1
        # unbalanced answer tags, and the answer is what follows the last <answer>: "" -> 0 - 0.2
        ("<think>a</think><answer>red</answer><answer>", unused, -0.2),
        # no answer tag: DeepEyes' split leaves the whole text, "<think>a</think>red" != "red"
        ("<think>a</think>red", unused, 0.0),
        ("<answer>" + "red " * 300 + "</answer>", unused, -0.2),  # 1000+ characters: accuracy 0, format error
        (TRAJECTORY, {"answer": "red", "tool_calls": [record(ok=False)]}, 0.8),  # failed call: no image back
    ]
    out = score("deepeyes_rule_judge", [c for c, _, _ in cases], [e for _, e, _ in cases])
    assert out == pytest.approx([v for _, _, v in cases])
    assert score("deepeyes_rule_judge", ["<answer>red</answer>"], [{}]) == [None]  # no ground truth


def test_deepeyes_rule_judge_reads_option_letters():
    options = ["red", "blue", "green", "white"]
    assert rule_judge("A", "red", options) == 1.0
    assert rule_judge("(A) red", "red", options) == 1.0
    assert rule_judge("B. blue", "red", options) == 0.0
    assert rule_judge("Red.", "red") == 1.0 and rule_judge("2.0", "2") == 1.0
    assert rule_judge("it is red", "red") == 0.0  # the LLM judge would accept it; the rule does not
    assert score("deepeyes_rule_judge", ["<answer>A</answer>"], [{"answer": "red", "options": options}]) == [pytest.approx(0.8)]


def test_crop_iou_best_and_last():
    target = {"target_box": (0, 0, 10, 10)}
    crops = [record(box=(5, 5, 15, 15)), record(box=(0, 0, 10, 10), turn=2)]
    ex = {**target, "tool_calls": crops}
    rev = {**target, "tool_calls": crops[::-1]}
    assert score("crop_iou", ["", ""], [ex, rev]) == [1.0, 1.0]  # best
    # last crop [5, 5, 15, 15] against [0, 0, 10, 10]: 25 / (100 + 100 - 25)
    assert score("crop_iou", ["", ""], [ex, rev], which="last") == pytest.approx([1.0, 25 / 175])
    no_crop = {**target, "tool_calls": [record(ok=False)]}
    several = {"target_boxes": [(100, 100, 110, 110), (5, 5, 15, 15)], "tool_calls": crops[:1]}
    assert score("crop_iou", ["", "", ""], [no_crop, {"tool_calls": crops}, several]) == [0.0, None, 1.0]
    with pytest.raises(ValueError, match="which"):
        score("crop_iou", [""], [ex], which="first")


def test_pixel_reasoner_curiosity_hand_computed():
    tool, none = {"tool_calls": [record()]}, {}
    # group 0: 1 of 4 trajectories operated, RaPR = 0.25 -> max(0.3 - 0.25, 0) = 0.05 for it, 0 for the rest;
    # group 1: 2 of 4 operated, RaPR = 0.5 >= H -> 0 for everyone
    examples = [tool, none, none, none, tool, tool, none, none]
    out = score("pixel_reasoner_curiosity", [""] * 8, examples, group_ids=[0, 0, 0, 0, 1, 1, 1, 1])
    assert out == pytest.approx([0.05, 0, 0, 0, 0, 0, 0, 0])
    # no group ids: the batch is one group, RaPR = 3/8 = 0.375 -> 0 everywhere; H = 0.5 -> 0.125 for users
    assert score("pixel_reasoner_curiosity", [""] * 8, examples) == pytest.approx([0.0] * 8)
    out = score("pixel_reasoner_curiosity", [""] * 8, examples, threshold=0.5)
    assert out == pytest.approx([0.125, 0, 0, 0, 0.125, 0.125, 0, 0])
    with pytest.raises(ValueError, match="threshold"):
        score("pixel_reasoner_curiosity", [""], [none], threshold=2.0)


def test_pixel_reasoner_penalty_counts_operations_beyond_n():
    three = {"tool_calls": [record(), record(ok=False), record(turn=2)]}
    one = {"tool_calls": [record()]}
    # n_vo = 3, N = 1 -> 2 (r_penalty = min(1 - 3, 0) = -2: weight -beta); n_vo <= N -> 0
    assert score("pixel_reasoner_penalty", ["", "", ""], [three, one, {}]) == [2.0, 0.0, 0.0]
    assert score("pixel_reasoner_penalty", [""], [three], limit=3) == [0.0]
    # the paper's total with alpha = 0.5, beta = 0.05 for a right answer (r = 1) using 3 operations in a
    # group with RaPR 0.25: 1 + 0.5 * 0.05 - 0.05 * 2 = 0.925
    assert 1 + 0.5 * 0.05 - 0.05 * 2.0 == pytest.approx(0.925)


def test_tool_use_metrics():
    examples = [{"tool_calls": [record(), record(ok=False, turn=2)]}, {}, {"tool_calls": [record()]}, {}]
    m = tool_use_metrics(examples)
    assert m == pytest.approx({"tool/rapr": 0.5, "tool/calls": 0.75, "tool/error_rate": 1 / 3,
                               "tool/images": 0.5, "tool/turns": 0.75})


RECORDS = st.lists(st.builds(record, ok=st.booleans(), box=st.one_of(st.none(), st.tuples(*[st.floats()] * 4)),
                             image=st.booleans(), turn=st.integers(0, 5)), max_size=5)
TEXTS = st.lists(st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", "<tool_call>", "</tool_call>",
                                  "{", "}", "red", "A", " ", "1e999", "<image>"]), max_size=12).map("".join)


@pytest.mark.slow
@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(TEXTS, RECORDS, st.booleans()), min_size=1, max_size=4))
def test_tool_rewards_never_raise_and_stay_in_range(items):
    texts = [t for t, _, _ in items]
    examples = [{"answer": "red", "options": ["red", "blue"], "tool_calls": r,
                 **({"target_box": (0, 0, 10, 10)} if has_target else {})} for _, r, has_target in items]
    for name in ("deepeyes_rule_judge", "crop_iou", "pixel_reasoner_curiosity", "pixel_reasoner_penalty"):
        fn = REWARDS.get(name)
        for v in as_trained(fn, texts, examples, group_ids=list(range(len(texts)))):
            assert v is None or (fn.reward_minimum <= v <= fn.reward_maximum and not math.isnan(v))
