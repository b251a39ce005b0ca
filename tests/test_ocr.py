"""The ``ocr`` task and the ``edit_similarity`` reward: generator, targets, hand-worked scores,
never-raise properties, the JSONL reader, metrics and visualisation."""

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mmrl.config import load_config
from mmrl.core.reward_computer import RewardComputer
from mmrl.registry import REWARDS, TASKS
from mmrl.measures.text import anls, levenshtein, similarity


def task(**options):
    return TASKS.get("ocr")(**options)


def edit(completions, truths, **kwargs):
    return REWARDS.get("edit_similarity")(completions, [{"answer": t} for t in truths], **kwargs)


# -- generator ---------------------------------------------------------------------------------------
def test_examples_deterministic_and_splits_disjoint():
    train, again, eval_ = task().examples("train"), task().examples("train"), task().examples("eval")
    assert len(train) == 1_000_000 and len(eval_) == 1000
    for i in range(5):
        a, b = train[i], again[i]
        assert a["image"].tobytes() == b["image"].tobytes() and a["answer"] == b["answer"] and a["box"] == b["box"]
    assert {train[i]["id"] for i in range(100)}.isdisjoint(eval_[i]["id"] for i in range(100))
    assert [train[i]["answer"] for i in range(20)] != [eval_[i]["answer"] for i in range(20)]


def test_texts_follow_the_options_and_are_drawn_inside_the_image():
    t = task(min_len=2, max_len=6, alphabet="AB7")
    lengths = set()
    for i in range(80):
        ex = t.examples("train")[i]
        text = ex["answer"]
        lengths.add(len(text))
        assert ex["text"] == text and set(text) <= set("AB7") and ex["question"] == "What text is shown?"
        assert ex["image"].size == ex["image_size"] == (112, 112) and ex["image"].mode == "RGB"
        x1, y1, x2, y2 = ex["box"]
        assert 0 <= x1 < x2 <= 112 and 0 <= y1 < y2 <= 112
        # ink (the darkest pixels) only inside the text box; the background is light
        ink = ex["image"].convert("L").point(lambda v: 255 if v < 128 else 0).getbbox()
        assert ink is not None and x1 <= ink[0] and y1 <= ink[1] and ink[2] <= x2 and ink[3] <= y2
    assert lengths == {2, 3, 4, 5, 6}


def test_glyphs_are_scaled_up_with_nearest_neighbour():
    ex = task(min_len=4, max_len=4).examples("eval")[3]
    x1, y1, x2, y2 = ex["box"]
    assert (x2 - x1) == 4 * 6 * 3 and (y2 - y1) == 11 * 3  # 6x11 px glyph cells, 3x
    assert len(ex["image"].getcolors()) == 2  # two colours: no blur from resampling


def test_options_validated():
    with pytest.raises(ValueError, match="min_len"):
        task(min_len=4, max_len=3)
    with pytest.raises(ValueError, match="do not fit"):
        task(max_len=30)
    for alphabet in ("", "AB C", "A<B", "Aé"):
        with pytest.raises(ValueError, match="alphabet"):
            task(alphabet=alphabet)
    with pytest.raises(ValueError, match="thinking"):
        task(thinking="false")
    with pytest.raises(ValueError, match="valid options"):
        task(font="big")
    with pytest.raises(ValueError, match="eval.*train"):
        task().examples("test")


# -- prompts, targets, hints ---------------------------------------------------------------------------
@pytest.mark.parametrize("thinking", [True, False])
def test_targets_score_the_maximum_with_the_default_rewards(thinking):
    t = task(thinking=thinking)
    examples = [t.examples("eval")[i] for i in range(30)]
    targets = [t.target(ex) for ex in examples]
    total, components, _ = RewardComputer(t.rewards, t.reward_kwargs)(targets, examples)
    assert total.tolist() == pytest.approx([sum(t.rewards.values())] * 30)
    assert components["edit_similarity"].tolist() == [1.0] * 30
    m = t.metrics(targets, examples)
    assert m["accuracy"] == m["edit_similarity"] == m["anls"] == m["parsed"] == 1.0
    text = " ".join(i["text"] for m_ in t.prompt(examples[0]) for i in m_["content"] if i.get("type") == "text")
    assert text.startswith("What text is shown? ") and len(text) < 120
    assert ("<think>" in text) == thinking and ("<think>" in targets[0]) == thinking


def test_thinking_false_uses_the_answer_only_layout():
    t = task(thinking=False)
    assert t.rewards == {"format": 0.5, "edit_similarity": 1.0}
    assert t.reward_kwargs == {"format": {"mode": "answer_only"}}
    assert t.target({"answer": "W3K"}) == "<answer>W3K</answer>"
    assert type(t).reward_kwargs == {}  # the class default is untouched
    # a thinking completion loses the format reward in the answer-only layout
    total, _, _ = RewardComputer(t.rewards, t.reward_kwargs)(
        ["<think>x</think><answer>W3K</answer>"], [{"answer": "W3K"}])
    assert total.tolist() == [1.0]


def test_target_and_hints_text():
    t = task()
    ex = {"answer": "W3K9A"}
    assert t.target(ex) == "<think>The text has 5 characters.</think><answer>W3K9A</answer>"
    assert t.hints(ex) == ["The text has 5 characters.", "It starts with W3.", "The answer is W3K9A."]
    assert t.hints({"answer": "Q"})[:2] == ["The text has 1 character.", "It starts with Q."]
    hinted = t.build_prompt({**t.examples("train")[0], "hint": t.hints(ex)[0]})
    assert hinted[-1]["content"][-1]["text"].endswith("Hint: The text has 5 characters.")


def test_case_insensitive_option_reaches_reward_and_metrics():
    t = task(case_sensitive=False)
    assert t.reward_kwargs == {"edit_similarity": {"case_sensitive": False}}
    total, _, _ = RewardComputer(t.rewards, t.reward_kwargs)(["<think>a</think><answer>w3k</answer>"], [{"answer": "W3K"}])
    assert total.tolist() == [1.5]
    assert t.metrics(["<answer>w3k</answer>"], [{"answer": "W3K"}])["accuracy"] == 1.0
    assert task().metrics(["<answer>w3k</answer>"], [{"answer": "W3K"}])["accuracy"] == 0.0
    assert task(case_sensitive=False, thinking=False).reward_kwargs == {
        "format": {"mode": "answer_only"}, "edit_similarity": {"case_sensitive": False}}


# -- levenshtein and the reward, by hand ------------------------------------------------------------
@pytest.mark.parametrize(
    "a,b,d",
    [
        ("kitten", "sitting", 3),  # k->s, e->i, insert g
        ("flaw", "lawn", 2),  # delete f, insert n
        ("", "", 0),
        ("", "abc", 3),  # three insertions
        ("abc", "abc", 0),
        ("abc", "acb", 2),  # a transposition is two substitutions
        ("W3K9A", "W3K9B", 1),
        ("ABC", "abc", 3),  # case-sensitive
    ],
)
def test_levenshtein_hand_worked(a, b, d):
    assert levenshtein(a, b) == d and levenshtein(b, a) == d


def test_edit_similarity_hand_worked():
    """"kitten" vs "sitting": 3 edits, longer length 7 -> 1 - 3/7 = 4/7.
    "W3K9B" vs "W3K9A": 1 edit over 5 -> 0.8.  "AB" vs "ABCD": 2 insertions over 4 -> 0.5.
    "XYZ" vs "ABC": 3 substitutions over 3 -> 0.0.  "" vs "": 1.0 (both empty)."""
    out = edit(
        ["<answer>kitten</answer>", "<think>x</think><answer> W3K9B </answer>", "<answer>AB</answer>",
         "<answer>XYZ</answer>", "<answer></answer>", "<answer>1</answer><answer>ABC</answer>"],
        ["sitting", "W3K9A", "ABCD", "ABC", "", "ABC"],
    )
    assert out == pytest.approx([4 / 7, 0.8, 0.5, 0.0, 1.0, 1.0])  # the last answer block counts


def test_edit_similarity_none_without_answer_block_or_truth():
    assert edit(["W3K", "<answer>W3K", "<think>W3K</think>"], ["W3K"] * 3) == [None, None, None]
    assert REWARDS.get("edit_similarity")(["<answer>W3K</answer>"], [{}]) == [None]
    with pytest.raises(ValueError):
        edit(["a", "b"], ["a"])


def test_edit_similarity_case_option():
    """"abc" vs "ABC": 3 substitutions -> 0.0 case-sensitive, 1.0 case-insensitive;
    "Kitten" vs "sitting" case-insensitive is the kitten/sitting case: 4/7."""
    assert edit(["<answer>abc</answer>"], ["ABC"]) == [0.0]
    assert edit(["<answer>abc</answer>", "<answer>Kitten</answer>"], ["ABC", "sitting"], case_sensitive=False) == \
        pytest.approx([1.0, 4 / 7])


def test_anls_threshold_hand_worked():
    """ANLS (ST-VQA, tau = 0.5): similarities 1.0, 0.8, 0.5, 0.4, None -> 1.0 + 0.8 + 0.5 + 0 + 0
    over 5 = 0.46; below 0.5 counts nothing."""
    assert anls([1.0, 0.8, 0.5, 0.4, None]) == pytest.approx(2.3 / 5)
    assert anls([]) == 0.0
    t = task()
    completions = ["<answer>W3K9A</answer>", "<answer>W3K9B</answer>", "<answer>AB</answer>", "<answer>XY</answer>", "none"]
    examples = [{"answer": a} for a in ("W3K9A", "W3K9A", "ABCD", "ABCD", "ABCD")]
    m = t.metrics(completions, examples)
    # similarities 1.0, 0.8, 0.5, 0.0, None
    assert m["accuracy"] == pytest.approx(1 / 5)
    assert m["edit_similarity"] == pytest.approx(2.3 / 5)
    assert m["anls"] == pytest.approx(2.3 / 5)
    assert m["parsed"] == pytest.approx(4 / 5)


# -- properties ------------------------------------------------------------------------------------------
FRAGMENTS = st.sampled_from(["<answer>", "</answer>", "<think>", "</think>", " ", "\n", "W3K", "ſ", "\x00", "😀"])
TEXTS = st.one_of(st.text(max_size=40), st.lists(st.one_of(FRAGMENTS, st.text(max_size=4)), max_size=12).map("".join))


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(TEXTS, st.text(max_size=20), st.booleans())
def test_edit_similarity_is_none_or_in_unit_interval(completion, truth, case_sensitive):
    (value,) = edit([completion], [truth], case_sensitive=case_sensitive)
    assert value is None or (isinstance(value, float) and 0.0 <= value <= 1.0 and not math.isnan(value))
    assert (value is None) == ("</answer>" not in completion or "<answer>" not in completion.rsplit("</answer>", 1)[0])


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=15), st.text(max_size=15))
def test_levenshtein_properties(a, b):
    d = levenshtein(a, b)
    assert d == levenshtein(b, a)
    assert abs(len(a) - len(b)) <= d <= max(len(a), len(b))
    assert (d == 0) == (a == b)
    assert 0.0 <= similarity(a, b) <= 1.0


# -- JSONL reader --------------------------------------------------------------------------------------------
def test_reader_reads_jsonl_and_skips_bad_lines(tmp_path):
    Image.new("RGB", (60, 20), "white").save(tmp_path / "a.png")
    Image.new("RGB", (40, 20), "white").save(tmp_path / "b.png")
    (tmp_path / "data.jsonl").write_text("\n".join([
        json.dumps({"image": "a.png", "text": " STOP "}),  # 1 ok
        "{broken",  # 2 malformed JSON
        json.dumps({"image": "b.png"}),  # 3 no text
        json.dumps({"image": "b.png", "text": "Exit 3", "question": "What does the sign say?"}),  # 4 ok
        json.dumps({"image": "b.png", "text": "  "}),  # 5 empty text
    ]) + "\n")
    t = task(eval_path=str(tmp_path / "data.jsonl"))
    ds = t.examples("eval")
    assert len(ds) == 2 and [n for n, _ in ds.skipped] == [2, 3, 5]
    assert "not valid JSON" in ds.skipped[0][1] and "text" in ds.skipped[1][1]
    assert ds.stats() == {"examples": 2, "skipped_lines": 3, "bad_images": 0, "bad_targets": 0}
    a, b = ds[0], ds[1]
    assert a["answer"] == "STOP" and a["question"] == "What text is shown?"  # the default question
    assert a["image"].size == (60, 20)
    assert b["answer"] == "Exit 3" and b["question"] == "What does the sign say?"
    assert t.examples("eval") is ds  # read once
    assert len(t.examples("train")) == 1_000_000  # the other split stays synthetic
    targets = [t.target(x) for x in (a, b)]
    assert RewardComputer(t.rewards, t.reward_kwargs)(targets, [a, b])[0].tolist() == [1.5, 1.5]
    assert t.visualize(b, "<answer>Exit 8</answer>").size[1] > b["image"].size[1]


def test_reader_image_root(tmp_path):
    (tmp_path / "imgs").mkdir()
    Image.new("RGB", (30, 30), "white").save(tmp_path / "imgs" / "x.png")
    (tmp_path / "train.jsonl").write_text(json.dumps({"image": "x.png", "text": "OK"}) + "\n")
    ds = task(train_path=str(tmp_path / "train.jsonl"), image_root=str(tmp_path / "imgs")).examples("train")
    assert ds[0]["image_path"].endswith("x.png") and ds[0]["answer"] == "OK"


# -- visualisation and config -----------------------------------------------------------------------------
def test_visualize_marks_right_and_wrong():
    t = task()
    ex = t.examples("eval")[0]
    right = t.visualize(ex, f"<answer>{ex['answer']}</answer>")
    wrong = t.visualize(ex, "<answer>nope</answer>")
    s = right.size[0] // 112
    assert s >= 2 and right.size[1] > right.size[0]  # a label strip under the image
    x1, y1 = ex["box"][:2]
    assert right.getpixel((x1 * s, y1 * s)) == (0, 200, 0)  # the text box, green
    h = right.size[1]
    assert right.crop((0, h - 18, 300, h)).tobytes() != wrong.crop((0, h - 18, 300, h)).tobytes()
    assert t.visualize(ex, "garbage\n" * 50).size == right.size
    assert ex["image"].size == (112, 112)


def test_config_loads():
    cfg = load_config(Path(__file__).parents[1] / "configs" / "vlm" / "ocr_tiny.yaml")
    assert cfg.task.name == "ocr" and dict(cfg.task.options) == {}
    assert cfg.rollout.max_completion_length >= 32
    assert TASKS.get(cfg.task.name)(**dict(cfg.task.options)).name == "ocr"
