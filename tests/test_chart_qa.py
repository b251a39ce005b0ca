"""The ``chart_qa`` task and the ``relaxed_accuracy`` reward: generator, answers readable from the
drawn chart, targets, hand-worked scores, never-raise properties, the JSONL reader, metrics."""

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mmrl.config import load_config
from mmrl.core.reward_computer import RewardComputer
from mmrl.registry import REWARDS, TASKS
from mmrl.measures.relaxed import relaxed_correct, to_number
from mmrl.tasks.chart_qa import layout


def task(**options):
    return TASKS.get("chart_qa")(**options)


def relaxed(completions, truths, **kwargs):
    return REWARDS.get("relaxed_accuracy")(completions, [{"answer": t} for t in truths], **kwargs)


# -- generator ---------------------------------------------------------------------------------------
def test_examples_deterministic_and_splits_disjoint():
    train, again, eval_ = task().examples("train"), task().examples("train"), task().examples("eval")
    assert len(train) == 1_000_000 and len(eval_) == 1000
    for i in range(5):
        a, b = train[i], again[i]
        assert a["image"].tobytes() == b["image"].tobytes()
        assert (a["values"], a["question"], a["answer"]) == (b["values"], b["question"], b["answer"])
    assert {train[i]["id"] for i in range(100)}.isdisjoint(eval_[i]["id"] for i in range(100))
    assert [train[i]["values"] for i in range(20)] != [eval_[i]["values"] for i in range(20)]


def test_questions_are_answered_by_the_generated_values():
    t = task()
    seen = Counter()
    for i in range(200):
        ex = t.examples("train")[i]
        labels, values = ex["labels"], ex["values"]
        assert 3 <= len(values) <= 5 and labels == list("ABCDE"[: len(values)])
        assert all(isinstance(v, int) and 1 <= v <= 9 for v in values)
        assert values.count(max(values)) == 1  # the maximum is unique
        assert ex["image"].size == ex["image_size"] == (112, 112)
        value = dict(zip(labels, values))
        q = ex["qtype"]
        seen[(q, ex["kind"])] += 1
        if q == "value":
            (a,) = ex["asked"]
            assert ex["question"] == f"What is the value of {a}?" and ex["answer"] == str(value[a])
        elif q == "compare":
            a, b = ex["asked"]
            assert ex["question"] == f"Is {a} higher than {b}?" and value[a] != value[b]
            assert ex["answer"] == ("yes" if value[a] > value[b] else "no")
            seen[ex["answer"]] += 1
        else:
            assert ex["question"] == "Which is the highest?"
            assert ex["answer"] == labels[values.index(max(values))] == ex["asked"][0]
    assert all(seen[(q, k)] > 10 for q in ("value", "compare", "max") for k in ("bar", "line"))
    assert seen["yes"] > 15 and seen["no"] > 15


def test_options_restrict_kinds_and_questions():
    t = task(kinds=["line"], questions=["max"], min_categories=4, max_categories=4)
    for i in range(20):
        ex = t.examples("eval")[i]
        assert ex["kind"] == "line" and ex["qtype"] == "max" and len(ex["values"]) == 4
    assert task(kinds="bar").options["kinds"] == ["bar"]


def _read_values(ex):
    """The values read off the image's pixels alone: the top of each bar (or the middle of each
    point's marker) in the column above each category, converted with the y axis grid."""
    g = layout(ex["image"].size[0], len(ex["values"]))
    img = ex["image"]
    color = img.getpixel(tuple(ex["boxes"][0][:2]))
    out = []
    for cx in g["centers"]:
        rows = [y for y in range(g["bottom"]) if all(img.getpixel((x, y)) == color for x in range(cx - 1, cx + 2))]
        y = min(rows) if ex["kind"] == "bar" else sorted(rows)[len(rows) // 2]
        out.append((g["bottom"] - y) / g["unit"])
    return out


@pytest.mark.parametrize("kind", ["bar", "line"])
def test_values_are_readable_from_the_drawn_chart(kind):
    t = task(kinds=[kind])
    for i in range(25):
        ex = t.examples("train")[i]
        assert _read_values(ex) == ex["values"]
        g = layout(112, len(ex["values"]))
        img = ex["image"].convert("L")
        for v in range(1, 10):  # a dark tick label left of the axis at every grid line
            y = g["bottom"] - v * g["unit"]
            assert img.crop((0, y - 4, g["left"] - 3, y + 4)).getextrema()[0] < 80, v
        for cx in g["centers"]:  # a dark letter under every category
            assert img.crop((cx - 3, g["bottom"] + 3, cx + 4, 112)).getextrema()[0] < 80


def test_options_validated():
    for bad in ({"kinds": ["pie"]}, {"kinds": []}, {"questions": ["sum"]}, {"min_categories": 1},
                {"min_categories": 5, "max_categories": 4}, {"max_categories": 11}, {"image_size": 64}):
        with pytest.raises(ValueError):
            task(**bad)
    with pytest.raises(ValueError, match="thinking"):
        task(thinking="no")
    with pytest.raises(ValueError, match="eval.*train"):
        task().examples("test")


# -- prompts, targets, hints ---------------------------------------------------------------------------
@pytest.mark.parametrize("thinking", [True, False])
def test_targets_score_the_maximum_with_the_default_rewards(thinking):
    t = task(thinking=thinking)
    examples = [t.examples("eval")[i] for i in range(40)]
    targets = [t.target(ex) for ex in examples]
    total, components, _ = RewardComputer(t.rewards, t.reward_kwargs)(targets, examples)
    assert total.tolist() == pytest.approx([1.5] * 40)
    assert components["relaxed_accuracy"].tolist() == [1.0] * 40
    m = t.metrics(targets, examples)
    assert m["accuracy"] == m["parsed"] == 1.0
    assert all(m[f"accuracy/{q}"] == 1.0 for q in ("value", "compare", "max"))
    text = " ".join(i["text"] for m_ in t.prompt(examples[0]) for i in m_["content"] if i.get("type") == "text")
    assert text.startswith(examples[0]["question"] + " ") and len(text) < 120
    assert ("<think>" in text) == thinking and ("<think>" in targets[0]) == thinking
    assert t.reward_kwargs == ({} if thinking else {"format": {"mode": "answer_only"}})
    assert type(t).reward_kwargs == {}


def test_target_and_hint_texts():
    t = task()
    base = {"kind": "bar", "labels": ["A", "B", "C"], "values": [3, 7, 6]}
    value = {**base, "qtype": "value", "asked": ["B"], "question": "What is the value of B?", "answer": "7"}
    compare = {**base, "qtype": "compare", "asked": ["A", "C"], "question": "Is A higher than C?", "answer": "no"}
    top = {**base, "kind": "line", "qtype": "max", "asked": ["B"], "question": "Which is the highest?", "answer": "B"}
    assert t.target(value) == "<think>B is at 7.</think><answer>7</answer>"
    assert t.target(compare) == "<think>A is at 3, C is at 6.</think><answer>no</answer>"
    assert t.target(top) == "<think>B is at 7, the highest.</think><answer>B</answer>"
    assert t.hints(value) == ["Look at the bar above B.", "B is between 6 and 8.", "The answer is 7."]
    assert t.hints(compare) == ["Look at the bars above A and C.", "A is about 3, C is about 6.", "The answer is no."]
    assert t.hints(top) == ["Look for the highest point.", "The highest is about 7.", "The answer is B."]
    assert task(thinking=False).target(compare) == "<answer>no</answer>"


# -- relaxed accuracy, by hand -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "pred,truth,expected",
    [
        ("104", "100", 1.0),  # |104 - 100| / 100 = 4% <= 5%
        ("96", "100", 1.0),
        ("105", "100", 1.0),  # exactly 5%
        ("106", "100", 0.0),  # 6%
        ("94.9", "100", 0.0),
        ("0", "0", 1.0),  # truth 0: only exactly 0
        ("0.0", "0", 1.0),
        ("0.01", "0", 0.0),
        ("-0.01", "0", 0.0),
        ("7", "7", 1.0),
        ("7.3", "7", 1.0),  # 4.3%
        ("7.4", "7", 0.0),  # 5.7%
        ("seven", "7", 1.0),
        ("7 apples", "7", 0.0),  # not a bare number: compared as text
        ("1,020", "1000", 1.0),  # thousands separator
        ("50%", "50%", 1.0),
        ("0.5", "50%", 1.0),  # percentages as fractions, like ChartQA's evaluation
        ("-52", "-50", 1.0),  # relative to |truth|
        ("Yes.", "yes", 1.0),  # normalised exact match
        ("  YES ", "yes", 1.0),
        ("no", "yes", 0.0),
        (" b ", "B", 1.0),
        ("B", "A", 0.0),
        ("United  States", "united states", 1.0),
        ("", "", 1.0),
        ("nan", "nan", 1.0),  # text, not a number
        ("1e999", "100", 0.0),
    ],
)
def test_relaxed_correct_hand_worked(pred, truth, expected):
    assert relaxed_correct(pred, truth) == expected


def test_relaxed_accuracy_reward_hand_worked():
    """Truth 100: "104" -> 1.0, "106" -> 0.0; truth 0: "0" -> 1.0; truth "yes": "Yes." -> 1.0;
    no answer block -> None; the last answer block counts."""
    out = relaxed(
        ["<answer>104</answer>", "<think>x</think><answer>106</answer>", "<answer>0</answer>",
         "<answer>Yes.</answer>", "yes", "<answer>5</answer><answer>100</answer>"],
        ["100", "100", "0", "yes", "yes", "100"],
    )
    assert out == [1.0, 0.0, 1.0, 1.0, None, 1.0]
    assert REWARDS.get("relaxed_accuracy")(["<answer>1</answer>"], [{}]) == [None]
    assert relaxed(["<answer>110</answer>"], ["100"], max_relative_error=0.1) == [1.0]
    with pytest.raises(ValueError):
        relaxed(["a", "b"], ["a"])


def test_to_number():
    assert to_number("7") == 7.0 and to_number(" 7. ") == 7.0 and to_number("12.5%") == pytest.approx(0.125)
    assert to_number("1,234.5") == 1234.5 and to_number("two") == 2.0
    for text in ("B", "7 apples", "1,23", "", "%", "1e999", None):
        assert to_number(text) is None


# -- properties ----------------------------------------------------------------------------------------------
FRAGMENTS = st.sampled_from(["<answer>", "</answer>", "<think>", "</think>", " ", "%", ",", ".", "-", "1e999",
                             "nan", "inf", "yes", "0", "100", "ſix", "\x00"])
TEXTS = st.one_of(st.text(max_size=40), st.lists(st.one_of(FRAGMENTS, st.text(max_size=4)), max_size=12).map("".join))
TRUTHS = st.one_of(st.text(max_size=10), st.integers(-10**6, 10**6).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr), FRAGMENTS)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(TEXTS, TRUTHS)
def test_relaxed_accuracy_is_none_or_in_unit_interval(completion, truth):
    (value,) = relaxed([completion], [truth])
    assert value is None or (isinstance(value, float) and value in (0.0, 1.0))
    assert (value is None) == ("</answer>" not in completion or "<answer>" not in completion.rsplit("</answer>", 1)[0])
    if "<" not in truth:  # the truth itself (no tags to confuse the answer block) always scores
        assert relaxed([f"<answer>{truth}</answer>"], [truth]) == [1.0]


# -- JSONL reader ------------------------------------------------------------------------------------------------
def test_reader_reads_chartqa_style_jsonl_and_skips_bad_lines(tmp_path):
    (tmp_path / "png").mkdir()
    for name in ("c1.png", "c2.png", "c3.png"):
        Image.new("RGB", (80, 60), "white").save(tmp_path / "png" / name)
    (tmp_path / "test.jsonl").write_text("\n".join([
        json.dumps({"imgname": "c1.png", "query": "What is the value of Japan?", "label": "27.5"}),  # 1 ok
        json.dumps({"image": "c2.png", "question": "Is the red bar higher?", "answer": "Yes"}),  # 2 ok
        '{"imgname": "c3.png", "query": ',  # 3 malformed JSON
        json.dumps({"imgname": "c3.png", "query": "How many?"}),  # 4 no label
        json.dumps({"imgname": "c3.png", "query": "How many?", "label": True}),  # 5 not a string/number
        json.dumps({"imgname": "c3.png", "query": "How many bars?", "label": 4}),  # 6 ok, a number
    ]) + "\n")
    t = task(eval_path=str(tmp_path / "test.jsonl"), image_root=str(tmp_path / "png"))
    ds = t.examples("eval")
    assert len(ds) == 3 and [n for n, _ in ds.skipped] == [3, 4, 5]
    assert ds.stats() == {"examples": 3, "skipped_lines": 3, "bad_images": 0, "bad_targets": 0}
    a, b, c = ds[0], ds[1], ds[2]
    assert (a["question"], a["answer"], a["image"].size) == ("What is the value of Japan?", "27.5", (80, 60))
    assert (b["question"], b["answer"]) == ("Is the red bar higher?", "Yes") and c["answer"] == "4"
    assert t.examples("eval") is ds and len(t.examples("train")) == 1_000_000
    targets = [t.target(x) for x in (a, b, c)]
    assert targets[0] == "<think>I read the chart.</think><answer>27.5</answer>"
    assert RewardComputer(t.rewards, t.reward_kwargs)(targets, [a, b, c])[0].tolist() == [1.5] * 3
    assert [h[-1] for h in map(t.hints, (a, b))] == ["The answer is 27.5.", "The answer is Yes."]
    m = t.metrics(["<answer>28</answer>", "<answer>yes</answer>", "<answer>5</answer>"], [a, b, c])
    assert m == {"accuracy": pytest.approx(2 / 3), "parsed": 1.0}  # 28 is 1.8% off 27.5; 5 is 25% off 4
    assert t.visualize(a, "<answer>28</answer>").size[1] > 60


# -- metrics, visualisation, config ---------------------------------------------------------------------------
def test_metrics_per_question_type_hand_made():
    t = task()
    examples = [{"answer": "7", "qtype": "value"}, {"answer": "8", "qtype": "value"},
                {"answer": "yes", "qtype": "compare"}, {"answer": "C", "qtype": "max"}]
    completions = ["<answer>7</answer>", "<answer>9</answer>", "<answer>Yes.</answer>", "no block"]
    m = t.metrics(completions, examples)
    assert m["accuracy"] == pytest.approx(2 / 4) and m["parsed"] == pytest.approx(3 / 4)
    assert m["accuracy/value"] == pytest.approx(0.5)
    assert m["accuracy/compare"] == 1.0 and m["accuracy/max"] == 0.0
    assert set(t.metrics(completions[:1], examples[:1])) == {"accuracy", "parsed", "accuracy/value"}


def test_visualize_boxes_the_asked_categories_and_labels_the_answer():
    t = task(kinds=["bar"], questions=["value"])
    ex = t.examples("eval")[0]
    right = t.visualize(ex, f"<answer>{ex['answer']}</answer>")
    wrong = t.visualize(ex, "<answer>nope</answer>")
    s = right.size[0] // 112
    assert s >= 2 and right.size[1] > right.size[0]
    x1, y1 = ex["boxes"][ex["labels"].index(ex["asked"][0])][:2]
    assert right.getpixel(((x1 - 1) * s, (y1 - 1) * s)) == (0, 200, 0)
    h = right.size[1]
    assert right.crop((0, h - 18, 400, h)).tobytes() != wrong.crop((0, h - 18, 400, h)).tobytes()
    assert t.visualize(ex, "garbage").size == right.size and ex["image"].size == (112, 112)


def test_config_loads():
    cfg = load_config(Path(__file__).parents[1] / "configs" / "vlm" / "chart_qa_tiny.yaml")
    assert cfg.task.name == "chart_qa" and dict(cfg.task.options) == {}
    assert cfg.rollout.max_completion_length >= 24
    over = load_config(Path(__file__).parents[1] / "configs" / "vlm" / "chart_qa_tiny.yaml", ["task.options.kinds=[bar]"])
    assert TASKS.get("chart_qa")(**dict(over.task.options)).options["kinds"] == ["bar"]
