"""Video rewards (``tiou``, ``video_r1_accuracy``, ``video_answer_accuracy``) and their measures:
Video-R1's reward worked out by hand from its code, mmrl's variant, never-raise properties."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.measures.porter import measure, stem
from mmrl.measures.rouge import (
    lcs_length,
    rouge_l,
    rouge_mean,
    rouge_n,
    rouge_score_tokens,
    rouge_tokens,
    word_error_rate,
)
from mmrl.measures.temporal import as_segment, parse_segment, temporal_iou
from mmrl.registry import REWARDS


def tiou(answer, segment):
    return REWARDS.get("tiou")([f"<think>t</think><answer>{answer}</answer>"], [{"segment": segment}])[0]


def acc(answer, solution, problem_type, key="solution", name="video_answer_accuracy"):
    ex = {key: solution, "problem_type": problem_type}
    return REWARDS.get(name)([f"<think>t</think><answer>{answer}</answer>"], [ex])[0]


def video_r1(completion, solution, problem_type):
    return REWARDS.get("video_r1_accuracy")([completion], [{"solution": solution, "problem_type": problem_type}])[0]


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


# -- the Porter stemmer and rouge_score's tokens (Video-R1's free-form reward) -----------------------
def test_porter_measure_as_in_the_paper():
    """Porter (1980): "m=0 TR, EE, TREE, Y, BY. m=1 TROUBLE, OATS, TREES, IVY. m=2 TROUBLES,
    PRIVATE, OATEN, ORRERY." """
    for words, m in (("tr ee tree y by", 0), ("trouble oats trees ivy", 1), ("troubles private oaten orrery", 2)):
        assert [measure(w) for w in words.split()] == [m] * len(words.split())


@pytest.mark.parametrize("word,expected", [
    ("caresses", "caress"), ("ponies", "poni"), ("cats", "cat"),  # step 1a: sses -> ss, ies -> i, s ->
    ("ties", "tie"),  # NLTK: "ies" of a 4-letter word -> "ie"
    ("feed", "feed"), ("agreed", "agre"),  # 1b: (m>0) eed -> ee (m(f) = 0); 5a then drops the e of "agree"
    ("plastered", "plaster"), ("motoring", "motor"), ("sing", "sing"),  # (*v*) ed, ing; "s" has no vowel
    ("conflated", "conflat"), ("hopping", "hop"), ("falling", "fall"), ("hissing", "hiss"), ("filing", "file"),
    ("happy", "happi"),  # 1c: y -> i after a consonant
    ("relational", "relat"), ("generalization", "gener"),  # steps 2-4 in turn
    ("running", "run"), ("opened", "open"),
    ("skies", "sky"), ("dying", "die"),  # NLTK's irregular forms
])
def test_porter_stems(word, expected):
    assert stem(word) == expected


def test_rouge_score_tokens():
    """rouge_score's tokenize.tokenize: text.lower(); NON_ALPHANUM_RE ([^a-z0-9]+) -> " "; stem
    tokens longer than 3 ("cats" -> "cat", "are" kept); non-ASCII letters are separators."""
    assert rouge_score_tokens("The CATS are Running!") == ["the", "cat", "are", "run"]
    assert rouge_score_tokens("Café 3.5") == ["caf", "3", "5"]
    assert rouge_score_tokens(None) == []


# -- video_r1_accuracy: Video-R1's accuracy_reward, worked out by hand from its code -------------------
# src/r1-v/src/open_r1/grpo.py (github.com/tulerfeng/Video-R1), accuracy_reward:
#   pattern = r'<answer>\s*(.*?)\s*</answer>'; match = re.search(pattern, text, re.DOTALL)
#   "multiple choice": reward = 1.0 if output_ans.strip() == gt_ans.strip() else 0.0
#   "numerical": gt_has_decimal = ("." in gt_ans) or ("," in gt_ans) ... if gt_has_decimal != out_has_decimal:
#       reward = 0.0 ... reward = 1.0 if round(gt_number, 2) == round(out_number, 2) else 0.0
#   "OCR": error_rate = wer(gt_ans, output_ans); reward = max(0.0, min(1.0, 1 - error_rate))
#   "free-form": compute_rouge_score(gt_ans, output_ans) (rouge1, rouge2, rougeL fmeasure / 3, use_stemmer=True)
#   "regression": rel_diff = (abs(out_number - gt_number) + 1e-9) / (abs(gt_number) + 1e-9)
#       rel_diff = min(1.0, max(0.0, rel_diff)); reward = 1 - rel_diff
#   else: reward = 0.0;  except Exception: reward = 0.0
VIDEO_R1_TABLE = [
    # (completion, solution, problem_type, Video-R1's value, video_answer_accuracy's value)
    # two answer blocks: re.search finds the first, "A"; mmrl's variant reads the last
    ("<answer>A</answer> no, <answer>B</answer>", "<answer>B</answer>", "multiple choice", 0.0, 1.0),
    ("<answer>B</answer>", "<answer> B </answer>", "multiple choice", 1.0, 1.0),  # \s* around the content
    ("<answer>B.</answer>", "<answer>B</answer>", "multiple choice", 0.0, 1.0),  # "B." != "B"
    ("<answer>b</answer>", "<answer>B</answer>", "multiple choice", 0.0, 1.0),  # case-sensitive
    ("<answer>(B) red</answer>", "<answer>B</answer>", "multiple choice", 0.0, 1.0),
    ("B", "<answer>B</answer>", "multiple choice", 0.0, None),  # no block: output_ans = "" != "B"
    # number words: float("three") raises -> normalize_number returns None -> 0.0
    ("<answer>three</answer>", "<answer>3</answer>", "numerical", 0.0, 1.0),
    ("<answer>3</answer>", "<answer>3</answer>", "numerical", 1.0, 1.0),
    ("<answer>3.0</answer>", "<answer>3</answer>", "numerical", 0.0, 1.0),  # gt_has_decimal False, out True
    ("<answer>1,000</answer>", "<answer>1000</answer>", "numerical", 0.0, 1.0),  # "," counts as a decimal mark
    ("<answer>3.14159</answer>", "<answer>3.14</answer>", "numerical", 1.0, 1.0),  # round(3.14159, 2) = 3.14
    ("<answer>12 apples</answer>", "<answer>12</answer>", "numerical", 0.0, 1.0),  # float("12 apples") raises
    # regression: (|8 - 10| + 1e-9) / (10 + 1e-9) = 0.19999999998 -> 1 - 0.19999999998 = 0.80000000002
    ("<answer>8</answer>", "<answer>10</answer>", "regression", 1 - (2 + 1e-9) / (10 + 1e-9), 0.8),
    ("<answer>0</answer>", "<answer>0</answer>", "regression", 0.0, 1.0),  # (0 + 1e-9) / (0 + 1e-9) = 1 -> 0
    ("<answer>nan</answer>", "<answer>3.5</answer>", "regression", 1.0, None),  # max(0.0, nan) = 0.0 -> 1 - 0
    ("<answer>inf</answer>", "<answer>3.5</answer>", "regression", 0.0, None),  # min(1.0, inf) = 1 -> 0
    ("<answer>about 3</answer>", "<answer>3</answer>", "regression", 0.0, 1.0),  # float("about 3") raises
    # OCR: wer("the cat sat", "the cat sit") = 1 substitution / 3 reference words
    ("<answer>the cat sit</answer>", "<answer>the cat sat</answer>", "OCR", 1 - 1 / 3, 1 - 1 / 3),
    ("<answer>The</answer>", "<answer>the</answer>", "OCR", 0.0, 0.0),  # case kept: 1 substitution / 1
    # free-form, stemmed: pred [the, cat, are, run], ref [the, cat, is, run]: ROUGE-1 3/4 (the, cat, run),
    # ROUGE-2 1/3 (the cat), ROUGE-L 3/4 (LCS the cat run): (3/4 + 1/3 + 3/4) / 3 = 11/18. Unstemmed
    # (mmrl's variant): [the, cats, are, running] vs [the, cat, is, running]: 1/2, 0, 1/2 -> 1/3
    ("<answer>the cats are running</answer>", "<answer>the cat is running</answer>", "free-form", 11 / 18, 1 / 3),
    ("<answer>Paris</answer>", "<answer>Paris</answer>", "geography", 0.0, 1.0),  # else: reward = 0.0
]


@pytest.mark.parametrize("completion,solution,problem_type,reference,variant", VIDEO_R1_TABLE)
def test_video_r1_accuracy_is_video_r1s_code(completion, solution, problem_type, reference, variant):
    assert video_r1(completion, solution, problem_type) == pytest.approx(reference, abs=1e-12)
    mine = REWARDS.get("video_answer_accuracy")([completion], [{"solution": solution, "problem_type": problem_type}])[0]
    assert mine == (None if variant is None else pytest.approx(variant))


def test_video_r1_exact_regression_answer_is_not_quite_one():
    """(0 + 1e-9) / (3.5 + 1e-9) = 2.857e-10: Video-R1's exact answer scores 1 - 2.857e-10."""
    assert video_r1("<answer>3.5</answer>", "<answer>3.5</answer>", "regression") == 1 - 1e-9 / (3.5 + 1e-9)


def test_video_r1_problem_type_spellings_and_batch():
    """Each example is graded by its own type (Video-R1 reads kwargs['problem_type'][0] for a batch
    of one question); the spelling of the five names is free."""
    fn = REWARDS.get("video_r1_accuracy")
    examples = [{"solution": "<answer>B</answer>", "problem_type": "Multiple_Choice"},
                {"solution": "<answer>3</answer>", "problem_type": "numerical"}, {"answer": "B"}]
    assert fn(["<answer>B</answer>", "<answer>3</answer>", "<answer>B</answer>"], examples) == [1.0, 1.0, 0.0]


# -- video_answer_accuracy (mmrl's reading) --------------------------------------------------------
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
    ("0", "0", 1.0),  # exact at truth 0 (video_r1_accuracy, Video-R1's +1e-9 form, scores this 0)
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
    for name in ("video_answer_accuracy", "video_r1_accuracy"):
        assert acc("B", "B", "multiple choice", key="answer", name=name) == 1.0
        fn = REWARDS.get(name)
        assert fn(["<answer>B</answer>"], [{"problem_type": "multiple choice"}]) == [None]
        with pytest.raises(ValueError):
            fn(["a"], [])
    # no answer block: unparsable for mmrl's variant; Video-R1 reads "" and scores 0
    assert REWARDS.get("video_answer_accuracy")(["B"], [{"solution": "B", "problem_type": "multiple choice"}]) == [None]
    assert REWARDS.get("video_r1_accuracy")(["B"], [{"solution": "B", "problem_type": "multiple choice"}]) == [0.0]


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


VIDEO_REWARDS = ("tiou", "video_r1_accuracy", "video_answer_accuracy")


@pytest.mark.slow
@pytest.mark.parametrize("name", VIDEO_REWARDS)
def test_nasty_text_never_raises(name):
    fn = REWARDS.get(name)
    texts = NASTY + [f"<answer>{t}</answer>" for t in NASTY] + [None, 3, ["frame"]]
    for ex in EXAMPLES:
        _check(fn(texts, [ex] * len(texts)), len(texts))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["video_r1_accuracy", "video_answer_accuracy"])
def test_nasty_truths_never_raise(name):
    fn = REWARDS.get(name)
    answers = [f"<answer>{t}</answer>" for t in NASTY]
    # truths come from data files, not from the policy: short ones are enough (a number followed by
    # thousands of spaces takes mmrl.parsing.parse_exact_number quadratic time)
    for truth in [t[:100] for t in NASTY]:
        for kind in ("multiple choice", "numerical", "regression", "free-form", "OCR"):
            _check(fn(answers, [{"solution": truth, "problem_type": kind}] * len(answers)), len(answers))
    for t in NASTY:
        segment = parse_segment(t)
        assert segment is None or all(math.isfinite(v) for v in segment)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.text(), st.text(), st.sampled_from(["multiple choice", "numerical", "regression", "free-form", "OCR", "x"]))
def test_video_rewards_never_raise(text, truth, problem_type):
    ex = {"segment": (1.0, 3.0), "solution": truth, "problem_type": problem_type}
    for name in VIDEO_REWARDS:
        _check(REWARDS.get(name)([text, f"<answer>{text}</answer>"], [ex, ex]), 2)
    segment = parse_segment(text)
    if segment is not None:
        assert segment[0] <= segment[1] and all(math.isfinite(v) for v in segment)
        assert 0.0 <= temporal_iou(segment, (1.0, 3.0)) <= 1.0
