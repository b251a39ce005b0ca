"""Open-vocabulary detection: the ``detection`` task, its JSONL reader, ``parse_boxes`` and the
``det_iou`` / ``ap50`` / ``det_criterion`` rewards (hand-worked numbers, never-raise property)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mmrl.media.coords import Frame
from mmrl.registry import REWARDS, TASKS
from mmrl.parsing import parse_boxes

REWARD_NAMES = ("det_iou", "ap50", "det_criterion")
A, B = [0, 0, 10, 10], [20, 20, 30, 30]
H = [0, 0, 5, 10]  # IoU 0.5 with A
X = [50, 50, 60, 60]  # overlaps nothing


def scores(preds, truths, **extra):
    """The three rewards for one answer listing ``preds`` against ``truths``."""
    completion = f"<think>x</think><answer>{json.dumps(preds)}</answer>"
    ex = {"boxes": [tuple(b) for b in truths], "image_size": (100, 100), **extra}
    return tuple(REWARDS.get(name)([completion], [ex])[0] for name in REWARD_NAMES)


def _text(messages):
    return " ".join(i["text"] for m in messages for i in m["content"] if i.get("type") == "text")


# -- rewards, hand-worked (the table in rewards/detection.py) --------------------------------------
@pytest.mark.parametrize(
    "preds,truths,expected",
    [
        ([A, B], [A, B], (1.0, 1.0, 1.0)),  # perfect
        ([B, A], [A, B], (1.0, 1.0, 1.0)),  # order does not matter when all are right
        ([A], [A, B], (0.5, 0.5, 0.75)),  # one missing
        ([A, A], [A], (0.5, 1.0, 0.75)),  # one duplicate: det_iou halves
        ([X], [A], (0.0, 0.0, 0.0)),  # a wrong box
        ([H], [A], (0.5, 1.0, 0.75)),  # half overlap: IoU 0.5 is a hit at the 0.5 threshold
        ([A, X, B], [A, B], (2 / 3, 5 / 6, 5 / 6)),  # a false positive between two hits
        ([], [], (1.0, 1.0, 1.0)),  # nothing to find, nothing found
        ([], [A], (0.0, 0.0, 0.0)),
        ([A], [], (0.0, 0.0, 0.0)),
    ],
)
def test_rewards_hand_worked(preds, truths, expected):
    assert scores(preds, truths) == pytest.approx(expected)


def test_many_boxes_do_not_pay():
    """VLM-R1's OVD hack: listing many boxes to catch the truth. det_iou falls as 1/#pred."""
    grid = [[x, y, x + 10, y + 10] for x in range(0, 100, 10) for y in range(0, 100, 10)]
    det_iou, _, criterion = scores(grid, [A])
    assert det_iou == pytest.approx(1 / 100) and criterion == pytest.approx((1 / 100 + 1) / 2)


def test_rel1000_prediction_with_frame_scores_one():
    """A policy that writes 0-1000 boxes on a 200x100 image: [100, 200, 300, 400] is
    pixels [20, 20, 60, 40]."""
    frame = Frame(200.0, 100.0)
    truth = [20, 20, 60, 40]
    assert scores([[100, 200, 300, 400]], [truth], pred_space="rel1000", frame=frame) == (1.0, 1.0, 1.0)
    assert scores([truth], [truth], pred_space="rel1000", frame=frame)[0] < 0.1  # pixels misread as rel1000
    task = TASKS.get("detection")()
    ex = {"boxes": [tuple(truth)], "image_size": (200, 100), "pred_space": "rel1000", "frame": frame,
          "question": "Find every person."}
    assert task.target(ex).endswith("<answer>[[100, 200, 300, 400]]</answer>")


def test_rewards_none_without_answer_or_truth():
    for name in REWARD_NAMES:
        fn = REWARDS.get(name)
        assert fn(["[[0, 0, 10, 10]]", "<answer>somewhere</answer>", "<answer>[]</answer>"],
                  [{"boxes": [A]}, {"boxes": [A]}, {}]) == [None, None, None]
        assert fn(["<answer>[[0, 0, 10, 10]]</answer>"], [{"box": A}]) == [1.0]  # grounding examples
        with pytest.raises(ValueError):
            fn(["a", "b"], [{"boxes": []}])


def test_boxes_in_the_reasoning_do_not_count():
    assert scores([], [A])[0] == 0.0
    out = REWARDS.get("det_iou")(["<think>[[0, 0, 10, 10]]</think><answer>[]</answer>"], [{"boxes": [A]}])
    assert out == [0.0]


# -- parse_boxes -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,expected",
    [
        ("[[1, 2, 30, 40], [5, 6, 7, 8]]", [(1, 2, 30, 40), (5, 6, 7, 8)]),
        ("[[1,2,30,40]]", [(1, 2, 30, 40)]),
        ("[1, 2, 30, 40]", [(1, 2, 30, 40)]),  # a bare single box
        ("[[30, 40, 1, 2]]", [(1, 2, 30, 40)]),  # corners ordered
        ('[{"bbox_2d": [1, 2, 30, 40], "label": "red circle 2"}, {"bbox_2d": [5, 6, 7, 8], "label": "x"}]',
         [(1, 2, 30, 40), (5, 6, 7, 8)]),
        ('```json\n[{"bbox_2d": [1, 2, 30, 40], "label": "a"}]\n```', [(1, 2, 30, 40)]),
        ("(1, 2), (30, 40)", [(1, 2, 30, 40)]),
        ("(1,2),(30,40) and (5, 6), (7, 8)", [(1, 2, 30, 40), (5, 6, 7, 8)]),
        ("[[[1, 2], [30, 40]], [[5, 6], [7, 8]]]", [(1, 2, 30, 40), (5, 6, 7, 8)]),
        ("[1.5, 2.5, 30.0, 40.0]", [(1.5, 2.5, 30.0, 40.0)]),
        ("x1=1, y1=2, x2=30, y2=40", [(1, 2, 30, 40)]),  # four bare numbers: one box
        ("[]", []),
        ("[ ]", []),
        ("```json\n[]\n```", []),
        ("None.", []),
        ('[{"bbox_2d": []}]', []),
    ],
)
def test_parse_boxes(text, expected):
    assert parse_boxes(text) == expected


@pytest.mark.parametrize(
    "text", ["", "somewhere", "[1, 2, 3]", "1 2 3 4 5", "[[1e999, 2, 3, 4]]", None, 3]
)
def test_parse_boxes_unparsable(text):
    assert parse_boxes(text) is None


def test_parse_boxes_linear_on_whitespace_runs():
    """Separators match a whitespace run one way only; the ambiguous "\\s*,?\\s*" would take
    tens of seconds here (quadratic backtracking)."""
    assert parse_boxes("[1," + " " * 20000 + "x") is None
    assert parse_boxes("[[1, 2, 3, 4]" + " " * 20000 + "]") == [(1, 2, 3, 4)]


# -- properties: any text, a float in [0, 1] or None -----------------------------------------------
FRAGMENTS = st.sampled_from(
    ["<think>", "</think>", "<answer>", "</answer>", "[", "]", "(", ")", ",", " ", "\n", "-", ".", "1e999",
     "nan", "inf", "bbox_2d", '{"', '":', "}", "```", "[]", "none", "10", "0", "1e308"]
)
NUMBERS = st.one_of(st.integers(-10**30, 10**30).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr))
TEXTS = st.one_of(st.text(), st.lists(st.one_of(FRAGMENTS, NUMBERS, st.text(max_size=3)), max_size=30).map("".join))
TRUTHS = st.lists(st.sampled_from([A, B, H, X]), max_size=3)
SPACES = st.sampled_from([{}, {"pred_space": "rel1000", "frame": Frame(200.0, 100.0)},
                          {"pred_space": "resized", "frame": Frame(200.0, 100.0)}])  # the last cannot convert


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(TEXTS, TRUTHS, SPACES), min_size=1, max_size=4))
def test_rewards_are_none_or_unit_floats(cases):
    completions = [f"<answer>{t}</answer>" if i % 2 else t for i, (t, _, _) in enumerate(cases)]
    examples = [{"boxes": [tuple(b) for b in truths], **space} for _, truths, space in cases]
    for name in REWARD_NAMES:
        out = REWARDS.get(name)(completions, examples)
        assert len(out) == len(cases)
        for v in out:
            assert v is None or (type(v) is float and 0.0 <= v <= 1.0 and not math.isnan(v)), (name, v)
    for t, _, _ in cases:
        boxes = parse_boxes(t)
        assert boxes is None or all(b[0] <= b[2] and b[1] <= b[3] and all(map(math.isfinite, b)) for b in boxes)


# -- the synthetic task ----------------------------------------------------------------------------
def test_registered_with_declared_rewards():
    task = TASKS.get("detection")()
    assert task.modality == "vlm" and task.rewards == {"format": 0.5, "det_iou": 1.0}
    for name in (*task.rewards, *REWARD_NAMES):
        assert name in REWARDS


def test_examples_deterministic_and_splits_disjoint():
    task = TASKS.get("detection")()
    train, again, eval_ = task.examples("train"), TASKS.get("detection")().examples("train"), task.examples("eval")
    assert len(train) == 1_000_000 and len(eval_) == 1000
    for i in range(5):
        a, b = train[i], again[i]
        assert a["image"].tobytes() == b["image"].tobytes() and a["boxes"] == b["boxes"] and a["question"] == b["question"]
    assert {train[i]["id"] for i in range(50)}.isdisjoint(eval_[i]["id"] for i in range(50))
    assert [train[i]["boxes"] for i in range(10)] != [eval_[i]["boxes"] for i in range(10)]
    with pytest.raises(ValueError, match="eval.*train"):
        task.examples("test")


def test_truth_is_every_matching_object():
    task = TASKS.get("detection")(max_objects=6)
    counts, two = set(), 0
    for i in range(120):
        ex = task.examples("train")[i]
        q = ex["query"]
        assert 1 <= len(q) <= 2 and 1 <= len(ex["objects"]) <= 6
        two += len(q) == 2
        fits = lambda o: any((c["color"] in (None, o["color"])) and (c["shape"] in (None, o["shape"])) for c in q)
        assert ex["boxes"] == [tuple(o["box"]) for o in ex["objects"] if fits(o)]
        assert len(ex["labels"]) == len(ex["boxes"]) and ex["image_size"] == (112, 112)
        assert ex["question"].startswith("Find every ") and ex["question"].endswith(".")
        counts.add(len(ex["boxes"]))
    assert {0, 1, 2, 3} <= counts and two > 10


def test_question_wording():
    import re

    color, shape = "(red|green|blue|yellow)", "(circle|square|triangle)"
    forms = {
        "color": rf"{color} shape", "shape": shape, "color_shape": rf"{color} {shape}",
        "two colors": rf"{color} shape and {color} shape", "two shapes": rf"{shape} and {shape}",
        "two pairs": rf"{color} {shape} and {color} {shape}",
    }
    task = TASKS.get("detection")()
    seen = set()
    for i in range(300):
        q = task.examples("train")[i]["question"]
        hits = [name for name, form in forms.items() if re.fullmatch(rf"Find every {form}\.", q)]
        assert len(hits) == 1, q
        seen.add(hits[0])
    assert seen == set(forms)


def test_targets_score_one_on_every_reward():
    task = TASKS.get("detection")()
    examples = [task.examples("eval")[i] for i in range(40)]
    targets = [task.target(ex) for ex in examples]
    for name in (*task.rewards, *REWARD_NAMES):
        assert REWARDS.get(name)(targets, examples) == [1.0] * len(examples), name
    assert REWARDS.get("format")(targets, examples, mode="strict") == [1.0] * len(examples)
    m = task.metrics(targets, examples)
    assert m["ap50"] == 1.0 and m["parsed"] == 1.0 and m["mean_iou"] == 1.0


def test_target_and_prompt_text():
    task = TASKS.get("detection")()
    ex = {"query": [{"color": "red", "shape": None}], "boxes": [(12, 8, 30, 27), (60, 60, 80, 80)],
          "labels": ["red shape", "red shape"], "image_size": (112, 112), "question": "Find every red shape."}
    assert task.target(ex) == "<think>I count 2 red shapes.</think><answer>[[12, 8, 30, 27], [60, 60, 80, 80]]</answer>"
    empty = {**ex, "query": [{"color": None, "shape": "circle"}, {"color": None, "shape": "square"}], "boxes": [], "labels": []}
    assert task.target(empty) == "<think>I count 0 circles and squares.</think><answer>[]</answer>"
    ex0 = task.examples("eval")[0]
    text = _text(task.prompt(ex0))
    assert text == f"{ex0['question']} Answer with <think>...</think><answer>[[x1, y1, x2, y2], ...]</answer>."
    assert len(text) < 130


def test_no_thinking_prompt_target_and_rewards():
    task = TASKS.get("detection")(thinking=False)
    ex = task.examples("eval")[0]
    assert _text(task.prompt(ex)) == f"{ex['question']} Answer with <answer>[[x1, y1, x2, y2], ...]</answer>."
    assert task.target(ex) == f"<answer>{ex['answer']}</answer>"
    assert task.rewards == {"format": 0.5, "det_iou": 1.0}
    assert task.reward_kwargs == {"format": {"mode": "answer_only"}}
    assert REWARDS.get("format")([task.target(ex)], [ex], mode="answer_only") == [1.0]
    assert type(task).reward_kwargs == {}  # class defaults untouched
    with pytest.raises(ValueError, match="thinking"):
        TASKS.get("detection")(thinking="false")


def test_options_validated():
    with pytest.raises(ValueError, match="valid options"):
        TASKS.get("detection")(query="color")
    with pytest.raises(ValueError, match="max_objects"):
        TASKS.get("detection")(max_objects=17)
    with pytest.raises(ValueError, match="box_space"):
        TASKS.get("detection")(box_space="resized")


def test_hints_three_tiers():
    task = TASKS.get("detection")()
    ex = {"query": [{"color": "red", "shape": "circle"}, {"color": "blue", "shape": "square"}],
          "boxes": [(4, 6, 19, 21), (84, 61, 105, 82)], "labels": ["red circle", "blue square"],
          "image_size": (112, 112)}
    assert task.hints(ex) == [
        "Box only red circles and blue squares; ignore the rest.",
        "There are 2: top left, right.",
        "The answer is [[4, 6, 19, 21], [84, 61, 105, 82]].",
    ]
    assert task.hints({**ex, "boxes": [], "labels": []})[1:] == ["There are none.", "The answer is []."]
    real = {"boxes": [(0, 10, 10, 20)], "labels": ["person"], "image_size": (300, 30)}  # thirds of each axis
    assert task.hints(real) == ["Box every person.", "There is 1: left.", "The answer is [[0, 10, 10, 20]]."]
    easier = task.augment(task.examples("train")[0], "easier", rng=None)
    assert easier["hint"] == task.hints(easier)[0] and easier["hint"] in _text(task.build_prompt(easier))


def test_metrics_ap50_hand_check():
    task = TASKS.get("detection")()
    examples = [{"boxes": [A, B]}, {"boxes": [A]}, {"boxes": []}, {"boxes": [A]}]
    completions = [
        f"<answer>{[A, X, B]}</answer>",  # AP 5/6; matched IoUs 1, 1
        f"<answer>{[H]}</answer>",  # AP 1 (IoU 0.5 is a hit); matched IoU 0.5
        "<answer>[]</answer>",  # AP 1 (nothing to find)
        "no answer",  # unparsable: AP 0, not parsed
    ]
    m = task.metrics(completions, examples)
    assert m["ap50"] == pytest.approx((5 / 6 + 1 + 1 + 0) / 4)
    assert m["mean_iou"] == pytest.approx((1 + 1 + 0.5) / 3)
    assert m["parsed"] == pytest.approx(0.75)
    assert math.isnan(task.metrics(["x"], [{"boxes": [A]}])["mean_iou"])


def test_visualize_true_green_predicted_red():
    task = TASKS.get("detection")()
    ex = next(e for e in (task.examples("eval")[i] for i in range(50)) if e["boxes"])
    x1, y1 = ex["boxes"][0][:2]
    far = [(x1 + 56) % 100, (y1 + 56) % 100]
    pred = [far[0], far[1], far[0] + 8, far[1] + 8]
    img = task.visualize(ex, f"<answer>[{pred}]</answer>")
    s = img.size[0] // 112
    assert s == 4 and img.size[1] > img.size[0]  # upscaled, with a label strip
    assert img.getpixel((x1 * s, y1 * s)) == (0, 200, 0)
    assert img.getpixel((far[0] * s, far[1] * s)) == (255, 0, 0)
    assert task.visualize(ex, "garbage").size == img.size
    assert task.visualize(ex, "<answer>[[-1e300, 0, 1e300, 5]]</answer>").size == img.size


# -- the JSONL reader ------------------------------------------------------------------------------
def test_jsonl_reader_converts_norm_boxes_and_skips_bad_lines(tmp_path):
    (tmp_path / "img").mkdir()
    Image.new("RGB", (200, 100), "white").save(tmp_path / "img" / "a.png")
    Image.new("RGB", (50, 40), "white").save(tmp_path / "img" / "b.png")
    lines = [
        {"image": "a.png", "problem": "Find every person.", "boxes": [[0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 1.0, 1.0]],
         "labels": ["person", "person"]},
        "{not json",
        {"image": "b.png", "problem": "Find every dog.", "boxes": [[10, 20, 30, 40]]},  # not in 0..1: skipped
        {"image": "b.png", "problem": "Find every cat.", "boxes": []},  # nothing to find
        {"image": "b.png", "problem": "Find every cat.", "boxes": [[0, 0, 1, 1]], "labels": ["cat", "dog"]},  # label count
        {"image": "b.png", "problem": "Find every cat.", "boxes": [[0.5, 0.1, 0.2, 0.3]]},  # inverted: refused
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    task = TASKS.get("detection")(train_path=str(path), image_root=str(tmp_path / "img"), box_space="norm")
    ds = task.examples("train")
    assert len(ds) == 2
    assert [n for n, _ in ds.skipped] == [2, 3, 5, 6]
    assert "box_space" in ds.skipped[1][1] and "is inverted" in ds.skipped[3][1]
    ex = ds[0]
    assert ex["image"].size == (200, 100) and ex["image_size"] == (200, 100)
    assert ex["boxes"] == [pytest.approx((20, 20, 60, 40)), pytest.approx((100, 50, 200, 100))]
    assert ex["labels"] == ["person", "person"] and ex["question"] == "Find every person."
    assert ex["answer"] == "[[20, 20, 60, 40], [100, 50, 200, 100]]" and "source_boxes" not in ex
    empty = ds[1]
    assert empty["boxes"] == [] and empty["labels"] == [] and task.target(empty) == "<think>I count 0.</think><answer>[]</answer>"
    targets = [task.target(e) for e in ds]
    for name in REWARD_NAMES:
        assert REWARDS.get(name)(targets, list(ds)) == [1.0, 1.0]
    assert task.hints(ex)[0] == "Box every person."
    assert task.examples("eval")[0]["image"].size == (112, 112)  # no eval_path: synthetic scenes


def test_jsonl_reader_pixel_and_rel1000(tmp_path):
    Image.new("RGB", (200, 100), "white").save(tmp_path / "a.png")
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"image": "a.png", "problem": "Find every car.", "boxes": [[100, 200, 300, 400]]}) + "\n")
    rel = TASKS.get("detection")(eval_path=str(path), box_space="rel1000").examples("eval")[0]
    assert rel["boxes"] == [pytest.approx((20, 20, 60, 40))] and rel["labels"] == ["object"]
    # read as pixels the same numbers fall off the 200x100 image: not a target, and a split of
    # nothing else is an error naming the box and the space it was read in
    with pytest.raises(ValueError, match=r"outside the 200x100 image \(read as pixel coordinates\)"):
        TASKS.get("detection")(eval_path=str(path)).examples("eval")[0]
