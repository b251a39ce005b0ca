"""Video rewards (``tiou``, ``video_r1_accuracy``) and their measures: hand-worked cases and
never-raise properties."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.measures.rouge import lcs_length, rouge_l, rouge_mean, rouge_n, rouge_tokens, word_error_rate
from mmrl.measures.temporal import as_segment, parse_segment, temporal_iou
from mmrl.registry import REWARDS


def tiou(answer, segment):
    return REWARDS.get("tiou")([f"<think>t</think><answer>{answer}</answer>"], [{"segment": segment}])[0]


def acc(answer, solution, problem_type, key="solution"):
    ex = {key: solution, "problem_type": problem_type}
    return REWARDS.get("video_r1_accuracy")([f"<think>t</think><answer>{answer}</answer>"], [ex])[0]


# -- segments and temporal IoU ---------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("[12.5, 20.1]", (12.5, 20.1)),
    ("(12.5, 20.1)", (12.5, 20.1)),
    ("12.5 - 20.1", (12.5, 20.1)),
    ("12.5-20.1", (12.5, 20.1)),
    ("12.5 \u2013 20.1", (12.5, 20.1)),  # en dash
    ("12.5 to 20.1 seconds", (12.5, 20.1)),
    ("12.5s - 20.1s", (12.5, 20.1)),
    ("[3 sec, 7 sec]", (3.0, 7.0)),
    ("from 3 until 7.", (3.0, 7.0)),
    ("The event happens between 3 and 7 seconds.", (3.0, 7.0)),
    ("The 2 people dance from 12.5 to 20.1", (12.5, 20.1)),  # "2 people" is no segment
    ('{"start": 3.2, "end": 7.5}', (3.2, 7.5)),  # last resort: exactly two times
    ("starts at 3.5 seconds and ends at 7 seconds", (3.5, 7.0)),
    ("1:05 - 1:30", (65.0, 90.0)),  # clock times: 60 + 5, 60 + 30
    ("00:00:05.5 to 00:01:00", (5.5, 60.0)),
    ("[3, 3]", (3.0, 3.0)),  # zero length is a segment
])
def test_parse_segment_variants(text, expected):
    assert parse_segment(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", [
    "[7, 3]", "7 to 3",  # inverted: unparsable, not sorted
    "[1e999, 5]", "nan - 5", "[inf, 5]",  # non-finite
    "-3 to 5", "at -3s and 5s",  # a minus sign is not dropped
    "", "3", "1 2 3", "v2 to x5", "no idea", None, 12,
])
def test_parse_segment_unparsable(text):
    assert parse_segment(text) is None


@pytest.mark.parametrize("pred,true,expected", [
    ((2, 6), (4, 10), 0.25),  # intersection [4, 6] = 2; union 4 + 6 - 2 = 8
    ((0, 10), (2, 4), 0.2),  # the truth inside: 2 / 10
    ((0, 2), (5, 9), 0.0),  # disjoint
    ((0, 5), (5, 9), 0.0),  # touching at one point
    ((3.5, 7.25), (3.5, 7.25), 1.0),  # identical
    ((4, 4), (4, 4), 1.0),  # zero-length truth: only the same point scores
    ((4, 4), (5, 5), 0.0),
    ((3, 5), (4, 4), 0.0),  # a point inside the prediction: intersection has length 0
    ((6, 2), (4, 10), 0.0),  # an invalid (inverted) segment
    ((float("nan"), 2), (0, 2), 0.0),
    ((-1e308, 1e308), (0, 1), 0.0),  # the union overflows
    ("ab", (0, 1), 0.0),
])
def test_temporal_iou_hand_worked(pred, true, expected):
    assert temporal_iou(pred, true) == pytest.approx(expected)


def test_as_segment():
    assert as_segment([1, 2]) == (1.0, 2.0) and as_segment(("1.5", 2)) == (1.5, 2.0)
    for bad in (None, 3, (1, 2, 3), (2, 1), (0, float("inf")), ("a", 1)):
        assert as_segment(bad) is None


def test_tiou_reward():
    assert tiou("[2, 6]", (4, 10)) == pytest.approx(0.25)
    assert tiou("4 to 10 seconds", [4, 10]) == 1.0
    assert tiou("[0, 2]", (5, 9)) == 0.0
    assert tiou("[6, 2]", (4, 10)) is None  # inverted: unparsable (scored as the minimum)
    assert tiou("somewhere", (4, 10)) is None
    # numbers in the reasoning are no answer; no answer block -> None; no segment in the example -> None
    fn = REWARDS.get("tiou")
    assert fn(["<think>[4, 10]</think>"], [{"segment": (4, 10)}]) == [None]
    assert fn(["<answer>[4, 10]</answer>"], [{"answer": "2"}]) == [None]
    assert fn(["<answer>[4, 10]</answer>"], [{"segment": (10, 4)}]) == [None]
    with pytest.raises(ValueError):
        fn(["a", "b"], [{"segment": (0, 1)}])


# -- ROUGE and WER ---------------------------------------------------------------------------------
# pred "the cat sat on mat" (5 tokens), ref "the cat lay on the mat" (6 tokens)
PRED, REF = "the cat sat on mat", "The cat lay on the mat."


def test_rouge_tokens():
    assert rouge_tokens("The cat, sat!  ON-mat") == ["the", "cat", "sat", "on", "mat"]
    assert rouge_tokens("Café Zürich") == ["café", "zürich"]


def test_rouge_hand_worked():
    # ROUGE-1: clipped overlap the 1 + cat 1 + on 1 + mat 1 = 4; P 4/5, R 4/6; F1 = 2 PR / (P + R) = 8/11
    assert rouge_n(PRED, REF, 1) == pytest.approx(8 / 11)
    # ROUGE-2: pred bigrams {the cat, cat sat, sat on, on mat}, ref {the cat, cat lay, lay on, on the,
    # the mat}: overlap 1 (the cat); P 1/4, R 1/5; F1 = (2/20) / (9/20) = 2/9
    assert rouge_n(PRED, REF, 2) == pytest.approx(2 / 9)
    # ROUGE-L: LCS "the cat on mat" = 4 -> as ROUGE-1, 8/11
    assert lcs_length(rouge_tokens(PRED), rouge_tokens(REF)) == 4
    assert rouge_l(PRED, REF) == pytest.approx(8 / 11)
    # mean: (8/11 + 2/9 + 8/11) / 3 = (72 + 22 + 72) / 99 / 3 = 166/297
    assert rouge_mean(PRED, REF) == pytest.approx(166 / 297)


def test_rouge_l_sees_order_and_rouge_1_does_not():
    # "cat the sat" vs "the cat sat": every unigram matches (F1 1); no bigram does (0); LCS 2 of 3 -> 2/3
    assert rouge_n("cat the sat", "the cat sat", 1) == 1.0
    assert rouge_n("cat the sat", "the cat sat", 2) == 0.0
    assert rouge_l("cat the sat", "the cat sat") == pytest.approx(2 / 3)


def test_rouge_empty_sides_and_single_words():
    assert rouge_n("", "the cat", 1) == 0.0 and rouge_l("the cat", "") == 0.0
    assert rouge_n("cat", "cat", 2) == 0.0  # no bigram on either side: 0, as rouge_score
    assert rouge_mean("cat", "cat") == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        rouge_n("a", "a", 0)


def test_word_error_rate_hand_worked():
    assert word_error_rate("the cat sit", "the cat sat") == pytest.approx(1 / 3)  # 1 substitution / 3 words
    assert word_error_rate("the sat", "the cat sat") == pytest.approx(1 / 3)  # 1 deletion
    assert word_error_rate("a the cat sat b", "the cat sat") == pytest.approx(2 / 3)  # 2 insertions
    assert word_error_rate("x y z w", "a") == 4.0  # 1 substitution + 3 insertions over 1 word
    assert word_error_rate("The", "the") == 1.0  # case kept (OCR)
    assert word_error_rate("", "") == 0.0 and word_error_rate("a b", "") == 2.0  # denominator max(1, 0)


# -- video_r1_accuracy -----------------------------------------------------------------------------
@pytest.mark.parametrize("answer", ["B", "b", "B.", "(B)", "[B]", "**B**", "B. red", "(B) red", "B) red",
                                    "B: red", "The answer is (B)", "Option B"])
def test_multiple_choice_letter_forms(answer):
    assert acc(answer, "<answer>B</answer>", "multiple choice") == 1.0
    assert acc(answer, "<answer>C</answer>", "multiple choice") == 0.0


def test_multiple_choice_no_letter():
    assert acc("red", "B", "multiple choice") is None  # no option letter: unparsable
    assert acc("A cat", "B", "multiple choice") is None  # an article, not option A
    assert acc("Red.", "red", "multiple choice") == 1.0  # a truth with no letter: normalised string


@pytest.mark.parametrize("answer,solution,expected", [
    ("3", "3", 1.0), ("3.0", "3", 1.0), ("3.001", "3", 1.0),  # equal after rounding to 2 decimals
    ("3.14159", "3.14", 1.0), ("3.15", "3.14", 0.0), ("1,000", "1000", 1.0), ("12 apples", "12", 1.0),
    ("two", "2", 1.0), ("4", "3", 0.0),
])
def test_numerical(answer, solution, expected):
    assert acc(answer, f"<answer>{solution}</answer>", "numerical") == expected


@pytest.mark.parametrize("answer,solution,expected", [
    ("8", "10", 0.8),  # |8 - 10| / 10 = 0.2 -> 1 - 0.2
    ("12.5", "10", 0.75),  # 2.5 / 10
    ("10", "10", 1.0),
    ("25", "10", 0.0),  # 150 % error: clipped at 0
    ("-2", "4", 0.0),  # 6 / 4 -> clipped
    ("0", "0", 1.0),  # exact at truth 0 (Video-R1's +1e-9 form scored this 0)
    ("0.5", "0", 0.0),  # 0.5 / 1e-6
])
def test_regression(answer, solution, expected):
    assert acc(answer, solution, "regression") == pytest.approx(expected)


def test_free_form_and_ocr():
    assert acc(PRED, f"<answer>{REF}</answer>", "free-form") == pytest.approx(166 / 297)
    assert acc("the cat sit", "<answer>the cat sat</answer>", "OCR") == pytest.approx(2 / 3)  # 1 - 1/3
    assert acc("x y z w", "a", "OCR") == 0.0  # WER 4 -> clipped at 0


def test_problem_type_spellings_and_unknown_types():
    assert acc("(B)", "B", "Multiple_Choice") == 1.0
    assert acc("the cat sat", "the cat sat", "free form") == 1.0
    # an unknown or missing type: exact match after normalisation (case, spaces, final period)
    assert acc("  Paris. ", "paris", "geography") == 1.0
    assert acc("Paris", "Lyon", None) == 0.0
    assert acc("3", "3.0", "counting") == 0.0  # strings, not numbers


def test_truth_from_answer_key_and_missing_truth():
    assert acc("B", "B", "multiple choice", key="answer") == 1.0
    fn = REWARDS.get("video_r1_accuracy")
    assert fn(["<answer>B</answer>"], [{"problem_type": "multiple choice"}]) == [None]
    assert fn(["B"], [{"solution": "B", "problem_type": "multiple choice"}]) == [None]  # no answer block
    with pytest.raises(ValueError):
        fn(["a"], [])


@pytest.mark.parametrize("problem_type,truth", [
    ("multiple choice", "<answer>C</answer>"), ("numerical", "42"), ("regression", "3.5"),
    ("free-form", "the man opens the fridge"), ("OCR", "STOP AHEAD"), ("counting", "seven"),
])
def test_a_perfect_answer_scores_one(problem_type, truth):
    answer = truth.removeprefix("<answer>").removesuffix("</answer>")
    assert acc(answer, truth, problem_type) == 1.0


# -- never raises ----------------------------------------------------------------------------------
NASTY = ["", "nan", "inf", "-inf", "1e999", "-1e999", "<answer></answer>", "<answer>", "</answer>",
         "<answer><answer></answer>", "[", "[nan, inf]", "[1e999, 1e999]", "1:99:99.9 - 1:99:100",
         "ſix", "٣", "\u2013", "\x00", "日本語の答え", "🙂 B 🙂", " " * 5000 + "1", "1" + " " * 5000 + "x",
         "(((((((((((", "B" * 1000, "1," * 500, "3 - - 5", "0:0:0:0"]
EXAMPLES = [
    {"segment": (4, 10), "solution": "<answer>B</answer>", "problem_type": t}
    for t in ("multiple choice", "numerical", "regression", "free-form", "OCR", "other", None)
] + [{"segment": (0, 0), "answer": "0", "problem_type": "regression"}, {"segment": "x", "answer": None}, {}]


def _check(values, n):
    assert len(values) == n
    for v in values:
        assert v is None or (isinstance(v, float) and 0.0 <= v <= 1.0 and not math.isnan(v))


@pytest.mark.parametrize("name", ["tiou", "video_r1_accuracy"])
def test_nasty_text_never_raises(name):
    fn = REWARDS.get(name)
    texts = NASTY + [f"<answer>{t}</answer>" for t in NASTY] + [None, 3, ["frame"]]
    for ex in EXAMPLES:
        _check(fn(texts, [ex] * len(texts)), len(texts))


def test_nasty_truths_never_raise():
    fn = REWARDS.get("video_r1_accuracy")
    answers = [f"<answer>{t}</answer>" for t in NASTY]
    # truths come from data files, not from the policy: short ones are enough (a number followed by
    # thousands of spaces takes mmrl.parsing.parse_exact_number quadratic time)
    for truth in [t[:100] for t in NASTY]:
        for kind in ("multiple choice", "numerical", "regression", "free-form", "OCR"):
            _check(fn(answers, [{"solution": truth, "problem_type": kind}] * len(answers)), len(answers))
    for t in NASTY:
        segment = parse_segment(t)
        assert segment is None or all(math.isfinite(v) for v in segment)


@settings(max_examples=200, deadline=None)
@given(st.text(), st.text(), st.sampled_from(["multiple choice", "numerical", "regression", "free-form", "OCR", "x"]))
def test_video_rewards_never_raise(text, truth, problem_type):
    ex = {"segment": (1.0, 3.0), "solution": truth, "problem_type": problem_type}
    for name in ("tiou", "video_r1_accuracy"):
        _check(REWARDS.get(name)([text, f"<answer>{text}</answer>"], [ex, ex]), 2)
    segment = parse_segment(text)
    if segment is not None:
        assert segment[0] <= segment[1] and all(math.isfinite(v) for v in segment)
        assert 0.0 <= temporal_iou(segment, (1.0, 3.0)) <= 1.0
