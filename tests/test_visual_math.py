"""visual_math: deterministic synthetic kinds, targets that score max, the JSONL reader, config."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrl.core.reward_computer import RewardComputer
from mmrl.registry import TASKS


def task(**options):
    return TASKS.get("visual_math")(**options)


def pixels(image):
    return np.asarray(image.convert("RGB"))


# -- generator -------------------------------------------------------------------------------------
def test_generator_is_deterministic_and_splits_are_disjoint():
    a, b = task().examples("train"), task().examples("train")
    for i in (0, 1, 7, 123):
        x, y = a[i], b[i]
        assert {k: v for k, v in x.items() if k != "image"} == {k: v for k, v in y.items() if k != "image"}
        assert np.array_equal(pixels(x["image"]), pixels(y["image"]))
    train_ids = {a[i]["id"] for i in range(200)}
    eval_ids = {task().examples("eval")[i]["id"] for i in range(200)}
    assert not train_ids & eval_ids
    assert len(task().examples("eval")) == 1000 and a[-1]["id"] == a[len(a) - 1]["id"]
    with pytest.raises(ValueError, match="split"):
        task().examples("test")


def test_kinds_and_example_contents():
    ex = task(eval_size=60).examples("eval")
    seen = {}
    for i in range(60):
        e = ex[i]
        seen.setdefault(e["kind"], e)
        assert e["image"].size == (112, 112) and e["image_size"] == (112, 112)
        if e["kind"] == "arith":
            assert e["question"] == "What is the value shown?" and e["options"] is None
            expr = e["expression"].replace("x", "*")
            assert int(e["answer"]) == eval(expr) >= 0  # noqa: S307 - digits and + - * only
        elif e["kind"] == "count_sum":
            assert e["question"] == "How many circles and squares are there in all?"
            shapes = [o["shape"] for o in e["objects"]]
            assert int(e["answer"]) == shapes.count("circle") + shapes.count("square") == len(shapes)
            assert e["counts"] == {"circle": shapes.count("circle"), "square": shapes.count("square")}
    assert set(seen) == {"arith", "count_sum", "choice"}
    assert set(task(kinds=["arith"]).examples("eval")[i]["kind"] for i in range(10)) == {"arith"}


def test_arith_image_has_text_and_count_sum_is_a_scene():
    t = task(kinds=["arith"])
    e = t.examples("train")[0]
    dark = (pixels(e["image"]).max(axis=2) < 100).sum()
    assert dark > 50  # the expression is drawn
    assert len({t.examples("train")[i]["expression"] for i in range(5)}) > 1


def test_choice_answers_are_consistent_with_options():
    t = task(kinds=["choice"])
    for i in range(50):
        e = t.examples("train")[i]
        opts = e["options"]
        assert list(opts) == ["A", "B", "C", "D"]
        assert len(set(opts.values())) == 4 and all(int(v) >= 0 for v in opts.values())
        assert opts[e["answer"]] == str(e["value"])
        assert e["base_kind"] in ("arith", "count_sum")
        text = t.prompt(e)[0]["content"][1]["text"]
        assert "Choices: (A) " in text and "<answer>letter</answer>" in text
        for k, v in opts.items():
            assert f"({k}) {v}" in text
    assert list(task(kinds=["choice"], num_choices=6).examples("train")[0]["options"]) == list("ABCDEF")


@pytest.mark.parametrize("bad", [{"kinds": []}, {"kinds": "arith"}, {"kinds": ["algebra"]}, {"max_terms": 9},
                                 {"max_group": 9}, {"num_choices": 1}, {"thinking": "false"}, {"nope": 1}])
def test_bad_options_are_errors(bad):
    with pytest.raises(ValueError):
        task(**bad)


# -- rewards, targets, hints, metrics ---------------------------------------------------------------
@pytest.mark.parametrize("thinking", [True, False])
def test_targets_score_max_under_default_rewards(thinking):
    t = task(thinking=thinking)
    rc = RewardComputer(t.rewards, t.reward_kwargs)
    examples = [t.examples("train")[i] for i in range(40)]
    targets = [t.target(e) for e in examples]
    total, components, _ = rc(targets, examples)
    assert set(components) == {"format", "math_answer"}
    assert np.allclose(total.numpy(), sum(t.rewards.values()))
    assert t.metrics(targets, examples)["accuracy"] == 1.0
    if not thinking:
        assert t.reward_kwargs == {"format": {"mode": "answer_only"}}
        assert all(s.startswith("<answer>") and "<think>" not in s for s in targets)
        assert "<think>" not in t.prompt(examples[0])[0]["content"][1]["text"]
    # A wrong answer loses the math_answer part.
    wrong = [s.replace(f"<answer>{e['answer']}</answer>", "<answer>999</answer>") for s, e in zip(targets, examples)]
    assert float(rc(wrong, examples)[1]["math_answer"].sum()) == 0.0


def test_hints_have_three_tiers_and_end_with_the_answer():
    t = task()
    for i in range(20):
        e = t.examples("train")[i]
        hints = t.hints(e)
        assert len(hints) == 3 and all(isinstance(h, str) and h for h in hints)
        assert e["answer"] in hints[2]
        if e["kind"] == "count_sum":
            assert str(e["counts"]["circle"]) in hints[1]
    e = t.examples("train")[0]
    assert t.hints(e)[0] in t.build_prompt({**e, "hint": t.hints(e)[0]})[0]["content"][1]["text"]


def test_metrics_per_kind():
    t = task()
    examples = [t.examples("eval")[i] for i in range(30)]
    completions = [t.target(e) if e["kind"] != "arith" else "<answer>-1</answer>" for e in examples]
    completions[0] = "no answer"
    m = t.metrics(completions, examples)
    assert m["accuracy/arith"] == 0.0
    assert set(m) >= {"accuracy", "parsed", "accuracy/arith", "accuracy/count_sum", "accuracy/choice"}
    assert m["parsed"] == pytest.approx(29 / 30)
    n_right = sum(1 for e in examples[1:] if e["kind"] != "arith")
    assert m["accuracy"] == pytest.approx(n_right / 30)


def test_visualize_returns_an_image():
    t = task()
    for i in range(6):
        e = t.examples("train")[i]
        for c in (t.target(e), "garbage", "<answer>" + "9" * 200 + "</answer>"):
            img = t.visualize(e, c)
            assert isinstance(img, Image.Image) and img.size[0] == 448


# -- JSONL reader ----------------------------------------------------------------------------------
def write_jsonl(tmp_path: Path) -> Path:
    Image.new("RGB", (40, 30), "white").save(tmp_path / "a.png")
    Image.new("RGB", (20, 20), "black").save(tmp_path / "b.png")
    lines = [
        json.dumps({"image": "a.png", "question": "What is x?", "answer": "1/2", "id": "q1"}),
        "{broken json",
        json.dumps({"image": "b.png", "question": "Which is largest?", "answer": "12", "choices": ["3", "12", "7"]}),
        json.dumps({"image": "a.png", "problem": "Pick one.", "answer": "(C)",
                    "options": {"A": "x", "B": "y", "C": "z"}}),
        json.dumps({"image": "a.png", "question": "No answer here"}),
        json.dumps({"image": "b.png", "question": "Angle?", "answer": 30, "pid": 7}),
        json.dumps({"image": "a.png", "question": "Bad letter", "answer": "E", "choices": ["1", "2"]}),
        json.dumps({"image": "a.png", "question": "Bad choices", "answer": "1", "choices": 5}),
    ]
    path = tmp_path / "math.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_reader(tmp_path):
    path = write_jsonl(tmp_path)
    t = task(train_path=str(path), eval_path=str(path))
    ds = t.examples("train")
    assert len(ds) == 4 and [n for n, _ in ds.skipped] == [2, 5, 7, 8]
    assert t.examples("train") is ds  # indexed once

    e0, e1, e2, e3 = (ds[i] for i in range(4))
    assert e0["answer"] == "1/2" and e0["options"] is None and e0["kind"] == "open" and e0["id"] == "q1"
    assert e0["image"].size == (40, 30) and e0["image_path"].endswith("a.png")
    # A list of choices becomes A, B, C; an answer given as an option's text becomes its letter.
    assert e1["options"] == {"A": "3", "B": "12", "C": "7"} and e1["answer"] == "B" and e1["answer_text"] == "12"
    assert e1["kind"] == "choice"
    assert e2["question"] == "Pick one." and e2["answer"] == "C" and e2["options"]["C"] == "z"
    assert e3["answer"] == "30" and e3["id"] == 7

    rc = RewardComputer(t.rewards, t.reward_kwargs)
    completions = ["<think>a</think><answer>0.5</answer>", "<think>a</think><answer>12</answer>",
                   "<think>a</think><answer>C</answer>", "<think>a</think><answer>30^\\circ</answer>"]
    assert rc(completions, [e0, e1, e2, e3])[1]["math_answer"].tolist() == [1.0, 1.0, 1.0, 1.0]
    targets = [t.target(e) for e in (e0, e1, e2, e3)]
    assert rc(targets, [e0, e1, e2, e3])[0].tolist() == [1.5] * 4
    assert t.hints(e0) == []
    prompt = t.prompt(e1)[0]["content"][1]["text"]
    assert "Choices: (A) 3 (B) 12 (C) 7." in prompt and "letter" in prompt
    assert "<answer>answer</answer>" in t.prompt(e0)[0]["content"][1]["text"]
    assert t.metrics(completions, [e0, e1, e2, e3]) == {
        "accuracy": 1.0, "parsed": 1.0, "accuracy/choice": 1.0, "accuracy/open": 1.0}
    assert isinstance(t.visualize(e1, completions[1]), Image.Image)


def test_reader_image_root_and_missing_file(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    Image.new("RGB", (8, 8), "red").save(tmp_path / "pic.png")
    (data / "d.jsonl").write_text(json.dumps({"image": "pic.png", "question": "q", "answer": "1"}) + "\n")
    t = task(eval_path=str(data / "d.jsonl"), image_root=str(tmp_path))
    assert t.examples("eval")[0]["image"].size == (8, 8)
    assert t.examples("train")[0]["kind"] in ("arith", "count_sum", "choice")  # train stays synthetic
    with pytest.raises(FileNotFoundError):
        task(train_path=str(tmp_path / "nope.jsonl")).examples("train")


# -- config ----------------------------------------------------------------------------------------
def test_config_loads():
    from mmrl.config import load_config

    path = Path(__file__).resolve().parents[1] / "configs" / "vlm" / "visual_math_tiny.yaml"
    cfg = load_config(str(path), [])
    assert cfg.task.name == "visual_math" and "query" not in cfg.task.options
    assert cfg.rollout.max_completion_length >= 48
    t = TASKS.get(cfg.task.name)(**cfg.task.options)
    assert t.kinds == ("arith", "count_sum", "choice")
    assert cfg.rollout.num_generations == 8  # inherited from counting_tiny
