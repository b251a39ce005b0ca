"""Reward plugins and their parsing helpers: hand-checked cases and never-raise properties."""

import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import torch

from mmrl.core.reward_computer import RewardComputer
from mmrl.registry import REWARDS
from mmrl.measures.boxes import box_iou
from mmrl.parsing import extract_answer, parse_box, parse_exact_number, parse_number


def reward(name):
    return REWARDS.get(name)


def as_trained(fn, completions, examples, **context):
    """``fn`` called as the reward computer calls it in training: given only the per-call context
    it names (``reward_context``), so a reward that takes none is not handed ``group_ids``."""
    return fn(completions, examples, **{k: v for k, v in context.items() if k in fn.reward_context})


# -- parsing ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,expected",
    [
        ("<answer>3</answer>", "3"),
        ("<answer> 3 \n</answer>", "3"),
        ("<answer>1</answer> then <answer>2</answer>", "2"),
        ("<answer>a\nb</answer>", "a\nb"),
        ("<answer><answer>5</answer>", "5"),
        ("<answer></answer>", ""),
        ("no tags", None),
        ("<answer>3", None),
        ("3</answer>", None),
        ("</answer><answer>", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text,expected",
    [
        ("3", 3.0),
        ("3.0", 3.0),
        ("-2", -2.0),
        ("-2.5", -2.5),
        (".5", 0.5),
        ("3 circles", 3.0),
        ("there are 4.", 4.0),
        ("Three", 3.0),
        ("zero", 0.0),
        ("ten circles", 10.0),
        ("someone", None),
        ("x1", None),
        ("none", None),
        ("", None),
        ("1e999", None),
    ],
)
def test_parse_number(text, expected):
    assert parse_number(text) == expected


@pytest.mark.parametrize(
    "text,expected",
    [("2", 2.0), (" 2. ", 2.0), ("-1.5", -1.5), ("two", 2.0), ("1 red", None), ("B", None)],
)
def test_parse_exact_number(text, expected):
    assert parse_exact_number(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "[1, 2, 30, 40]",
        "[1,2,30,40]",
        "(1, 2, 30, 40)",
        "[1.0, 2.0, 30.0, 40.0]",
        "(1, 2), (30, 40)",
        "(1,2) to (30,40)",
        "[30, 40, 1, 2]",  # corners swapped
        "[30, 2, 1, 40]",
        '{"bbox_2d": [1, 2, 30, 40]}',
        '[{"bbox_2d": [1, 2, 30, 40], "label": "blue square 2"}]',
        '```json\n[{"bbox_2d": [1, 2, 30, 40], "label": "square"}]\n```',
        "x1=1, y1=2, x2=30, y2=40",
        "the box is [1, 2, 30, 40] I think",
    ],
)
def test_parse_box_variants(text):
    assert parse_box(text) == (1.0, 2.0, 30.0, 40.0)


@pytest.mark.parametrize("text", ["", "[1, 2, 3]", "no box", "[1e999, 2, 3, 4]", "1 2 3 4 5"])
def test_parse_box_unparsable(text):
    assert parse_box(text) is None


def test_parse_box_first_of_several():
    assert parse_box("[1, 2, 3, 4] [5, 6, 7, 8]") == (1, 2, 3, 4)


def test_box_iou_hand_computed():
    assert box_iou([0, 0, 10, 10], [5, 5, 15, 15]) == pytest.approx(25 / 175)
    assert box_iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0
    assert box_iou([0, 0, 10, 10], [10, 0, 20, 10]) == 0.0  # touching edges
    assert box_iou([0, 0, 10, 10], [0, 0, 5, 10]) == pytest.approx(0.5)
    assert box_iou([0, 0, 0, 0], [0, 0, 0, 0]) == 0.0  # empty union
    assert box_iou([10, 10, 0, 0], [5, 5, 15, 15]) == pytest.approx(25 / 175)  # unordered corners
    assert box_iou([0, 0, 1e308, 1e308], [0, 0, 1e308, 1e308]) in (0.0, 1.0)  # overflow guarded


# -- format ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,strict,lenient",
    [
        ("<think>a</think><answer>2</answer>", 1.0, 1.0),
        ("  <think>a\nb</think>\n <answer>2</answer>\n", 1.0, 1.0),
        ("<think></think><answer></answer>", 1.0, 1.0),
        ("<answer>2</answer>", 0.0, 1.0),
        ("<think>a</think><answer>2</answer> extra", 0.0, 1.0),
        ("pre <think>a</think><answer>2</answer>", 0.0, 1.0),
        ("<think>a</think>b<answer>2</answer>", 0.0, 1.0),
        ("<think>a</think>x</think><answer>2</answer>", 0.0, 1.0),
        ("<think>a</think><answer>1</answer><answer>2</answer>", 0.0, 1.0),
        ("<think>a<answer>1</answer></think><answer>2</answer>", 0.0, 1.0),
        ("<think>a</think>", 0.0, 0.0),
        ("2", 0.0, 0.0),
        ("", 0.0, 0.0),
    ],
)
def test_format_strict_and_lenient(text, strict, lenient):
    fmt = reward("format")
    assert fmt([text], [{}]) == [strict]
    assert fmt([text], [{}], mode="strict") == [strict]
    assert fmt([text], [{}], mode="lenient") == [lenient]


def test_format_rejects_unknown_mode_and_takes_no_context():
    with pytest.raises(ValueError, match="lenient"):
        reward("format")(["x"], [{}], mode="loose")
    text = "<think>a</think><answer>1</answer>"
    assert RewardComputer({"format": 1.0})([text], [{}], group_ids=torch.tensor([0]))[0].tolist() == [1.0]
    assert reward("format").reward_context == ()  # the trainer's group_ids is not passed to it
    with pytest.raises(TypeError):  # nor is anything else: its signature names what it takes
        reward("format")([text], [{}], step=3)


# -- accuracy --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "completion,answer,expected",
    [
        ("<answer>2</answer>", "2", 1.0),
        ("<answer>2.0</answer>", "2", 1.0),
        ("<answer>two</answer>", "2", 1.0),
        ("<answer>2 circles</answer>", "2", 1.0),
        ("<answer>3</answer>", "2", 0.0),
        ("<answer>-1</answer>", "-1", 1.0),
        ("<answer>0.1</answer>", "0.1000000001", 1.0),
        ("<answer>many</answer>", "2", 0.0),
        ("<answer>  Red  Circle. </answer>", "red circle", 1.0),
        ("<answer>blue</answer>", "red", 0.0),
        ("<answer>1 blue</answer>", "1 red", 0.0),  # a non-numeric truth compares as a string
        ("<answer>1</answer><answer>2</answer>", "2", 1.0),  # last answer block counts
        ("2", "2", None),  # no answer block
        ("<think>2</think>", "2", None),
    ],
)
def test_accuracy(completion, answer, expected):
    assert reward("accuracy")([completion], [{"answer": answer}]) == [expected]


def test_accuracy_missing_truth_is_none():
    assert reward("accuracy")(["<answer>2</answer>"], [{}]) == [None]


# -- iou -------------------------------------------------------------------------------------------
def test_iou_reward():
    ex = {"box": (0, 0, 10, 10)}
    out = reward("iou")(
        [
            "<think>x</think><answer>[0, 0, 10, 10]</answer>",
            "<answer>[5, 5, 15, 15]</answer>",
            '<answer>[{"bbox_2d": [0, 0, 5, 10], "label": "a"}]</answer>',
            "<answer>[20, 20, 30, 30]</answer>",
            "[0, 0, 10, 10]",  # box outside an answer block does not count
            "<think>[0, 0, 10, 10]</think><answer>somewhere</answer>",
        ],
        [ex] * 6,
    )
    assert out[0] == 1.0
    assert out[1] == pytest.approx(25 / 175)
    assert out[2] == pytest.approx(0.5)
    assert out[3] == 0.0
    assert out[4] is None and out[5] is None


def test_batch_length_mismatch_is_an_error():
    with pytest.raises(ValueError):
        reward("accuracy")(["a", "b"], [{"answer": "1"}])


# -- properties: no string ever makes a reward raise -----------------------------------------------
FRAGMENTS = st.sampled_from(
    ["<think>", "</think>", "<answer>", "</answer>", "[", "]", "(", ")", ",", " ", "\n", "-", ".",
     "1e999", "nan", "inf", "bbox_2d", '{"', '":', "}", "```", "two", "ſix"]
)
NUMBERS = st.one_of(
    st.integers(-10**30, 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
TEXTS = st.one_of(
    st.text(),
    st.lists(st.one_of(FRAGMENTS, NUMBERS, st.text(max_size=3)), max_size=20).map("".join),
)
EXAMPLE = {"answer": "2", "box": (10, 20, 40, 50), "image_size": (112, 112)}


def _check(values, n, low=0.0, high=1.0):
    """One score per completion, each None or a float in the reward's declared range (default [0, 1])."""
    assert len(values) == n
    for v in values:
        assert v is None or (isinstance(v, float) and low <= v <= high and not math.isnan(v))


# The suite draws 150 lists; the reliability campaign (README) runs MMRL_FUZZ_EXAMPLES=4000, and
# with MMRL_FUZZ_REPORT=<file> the number of strings every reward was given is written there.
FUZZ_EXAMPLES = int(os.environ.get("MMRL_FUZZ_EXAMPLES", "150"))
_fuzzed = [0]


@pytest.mark.slow
@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(st.lists(TEXTS, min_size=1, max_size=4))
def test_every_reward_never_raises(texts):
    _fuzzed[0] += len(texts)
    if os.environ.get("MMRL_FUZZ_REPORT"):
        Path(os.environ["MMRL_FUZZ_REPORT"]).write_text(f"{_fuzzed[0]} strings, {len(REWARDS.names())} rewards\n")
    names = REWARDS.names()
    assert {"format", "accuracy", "iou"} <= set(names)
    for name in names:
        check = getattr(REWARDS.get(name), "reward_check", None)
        try:
            if check is not None:
                check()
        except (FileNotFoundError, ValueError):
            continue  # model-based rewards refuse to run without weights (tested in test_image_rewards.py)
        fn = REWARDS.get(name)  # the trainer's context: samples in groups of two
        _check(as_trained(fn, texts, [dict(EXAMPLE) for _ in texts], group_ids=torch.arange(len(texts)) // 2),
               len(texts),
               min(0.0, fn.reward_minimum), max(1.0, fn.reward_maximum))
    _check(REWARDS.get("format")(texts, [EXAMPLE] * len(texts), mode="lenient"), len(texts))


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(TEXTS, TEXTS)
def test_parsers_never_raise(text, truth):
    for value in (parse_number(text), parse_exact_number(text)):
        assert value is None or math.isfinite(value)
    box = parse_box(text)
    if box is not None:
        assert box[0] <= box[2] and box[1] <= box[3] and all(math.isfinite(v) for v in box)
        assert 0.0 <= box_iou(box, (0, 0, 10, 10)) <= 1.0
    extract_answer(text)
    _check(REWARDS.get("accuracy")([f"<answer>{text}</answer>"], [{"answer": truth}]), 1)

