"""math_answer and its checker (mmrl.measures.math_equivalence): hand cases, choices, never-raise property."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.registry import REWARDS
from mmrl.measures import math_equivalence as _math
from mmrl.measures.math_equivalence import clean, compare, math_equal, normalize_options

needs_sympy = pytest.mark.skipif(not _math.SYMPY_AVAILABLE and not _math.MATH_VERIFY_AVAILABLE,
                                 reason="symbolic equality needs sympy or math_verify")


def reward(completions, examples):
    return REWARDS.get("math_answer")(completions, examples, step=0)


# -- numbers and wrappers --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "pred,truth",
    [
        ("12", "12"),
        ("12.0", "12"),
        ("12.", "12"),
        ("+12", "12"),
        ("-3", "-3"),
        ("1,000", "1000"),
        ("1000", "1,000"),
        ("1,234.5", "1234.5"),
        ("1e3", "1000"),
        ("1/2", "0.5"),
        ("0.5", "1/2"),
        ("3/4", "0.75"),
        ("6/8", "3/4"),
        ("\\frac{3}{4}", "0.75"),
        ("\\dfrac{3}{4}", "3/4"),
        ("\\tfrac{1}{2}", "0.5"),
        ("-\\frac{3}{4}", "-0.75"),
        ("\\frac{-3}{4}", "-3/4"),
        ("0.333333", "1/3"),  # 6-place rounding when a decimal is involved (as Math-Verify)
        ("\\boxed{12}", "12"),
        ("The total is \\boxed{12}.", "12"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("$12$", "12"),
        ("$$12$$", "12"),
        ("\\(12\\)", "12"),
        ("\\[12\\]", "12"),
        ("12", "$12$"),
        ("12", "\\boxed{12}"),
        ("\\text{12}", "12"),
        ("$5", "5"),
        ("x = 5", "5"),
        ("30^\\circ", "30"),
        ("30°", "30"),
        ("7 shapes", "7"),
        ("30 cm", "30"),
        ("two", "2"),
        ("50%", "0.5"),  # percent rule: "%" read as /100 ...
        ("0.5", "50%"),
        ("50%", "50"),  # ... or as a unit
        ("50", "50%"),
        ("50\\%", "50%"),
        ("12.5%", "0.125"),
    ],
)
def test_equal(pred, truth):
    assert math_equal(pred, truth), compare(pred, truth)


@pytest.mark.parametrize(
    "pred,truth",
    [
        ("0.333", "1/3"),
        ("1/3", "0.333"),
        ("13", "12"),
        ("-12", "12"),
        ("0.5", "50"),  # no percent sign: no percent reading
        ("50", "0.5"),
        ("1,000", "1"),
        ("1/2", "2"),
        ("2x", "2"),  # a lone letter is not a unit
        ("3 + 8", "11"),  # final-form rule: unevaluated arithmetic does not answer a number
        ("4 x 2", "8"),
        ("4*2", "8"),
        ("\\frac{3}{4} + 1", "1.75"),
        ("12", "B"),  # no options: a number is not a letter
        ("", "0"),
        ("\\boxed{}", "0"),
        ("nan", "nan0"),
        ("1e999", "1"),
        ("9^9^9^9", "1"),  # no power tower is ever evaluated
        ("(1, 2)", "(2, 1)"),  # tuples are ordered
        ("1, 2, 3", "1, 2"),
        ("yes", "no"),
    ],
)
def test_not_equal(pred, truth):
    assert not math_equal(pred, truth), compare(pred, truth)


@needs_sympy
@pytest.mark.parametrize(
    "pred,truth",
    [
        ("x+1", "1+x"),
        ("2(x+1)", "2x+2"),
        ("(x^2-1)/(x-1)", "x+1"),
        ("x/2", "\\frac{x}{2}"),
        ("\\sqrt{8}", "2\\sqrt{2}"),
        ("\\sqrt{121}", "11"),  # closed forms are evaluated, unlike bare arithmetic
        ("\\frac{\\sqrt{3}}{2}", "0.866025"),
        ("2\\pi", "6.283185"),
        ("a b", "b \\cdot a"),
    ],
)
def test_symbolic_equal(pred, truth):
    assert math_equal(pred, truth), compare(pred, truth)


@needs_sympy
@pytest.mark.parametrize("pred,truth", [("x+2", "x+1"), ("x^2", "2x"), ("\\sqrt{2}", "1.41"), ("x/0", "x")])
def test_symbolic_not_equal(pred, truth):
    assert not math_equal(pred, truth)


def test_strings_fall_back_to_normalised_equality():
    assert math_equal("Yes.", "yes")
    assert math_equal("  Red   Circle ", "red circle")
    assert math_equal("(1, 2)", "(1,2)")
    assert math_equal("[1, 2]", "(1, 2)")


def test_clean_strips_wrappers():
    assert clean("\\boxed{\\text{12}}") == "12"
    assert clean("$\\left( 3 \\right)$") == "( 3 )"
    assert clean("The answer: \\fbox{7}.") == "7"
    assert clean("y = 2x") == "2x"
    assert clean("12.") == "12"


# -- multiple choice -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "pred", ["B", "(B)", "B.", "B)", "B:", "B) 12", "B. 12", "(b)", "b", "Option B", "The answer is (B).",
             "answer: B", "\\boxed{B}", "$B$", "12", "12.0", "\\boxed{12}"],
)
def test_choice_matches(pred):
    options = {"A": "3", "B": "12", "C": "7", "D": "1/2"}
    assert math_equal(pred, "B", options)
    assert compare(pred, "B", options)[1] == "choice"


@pytest.mark.parametrize("pred", ["A", "(C)", "C) 12", "3", "Option D", "13", "E", "", "B12"])
def test_choice_mismatches(pred):
    assert not math_equal(pred, "B", {"A": "3", "B": "12", "C": "7", "D": "1/2"})


def test_choice_letters_without_options_and_option_forms():
    assert math_equal("(B)", "B") and math_equal("B) 12", "(B)") and not math_equal("A", "B")
    # A list of options reads as A, B, C...; an option's value answers for its letter ...
    assert math_equal("0.5", "D", ["3", "12", "7", "1/2"])
    # ... and a letter answers for a truth that is an option's text (MathVista's layout).
    assert math_equal("D", "1/2", ["3", "12", "7", "1/2"])
    assert not math_equal("C", "1/2", ["3", "12", "7", "1/2"])
    assert normalize_options(["x", "y"]) == {"A": "x", "B": "y"}
    assert normalize_options({"a": 1, "(B)": "2", "long": "3"}) == {"A": "1", "B": "2"}
    assert normalize_options("AB") is None and normalize_options(None) is None


# -- the reward ------------------------------------------------------------------------------------
def test_reward_scores_and_none():
    examples = [{"answer": "12"}, {"answer": "12"}, {"answer": "12"}, {"answer": "B", "options": {"A": "3", "B": "12"}},
                {}, {"answer": "12"}]
    completions = ["<think>4 x 3</think><answer>\\boxed{12}</answer>", "<answer>13</answer>", "12",
                   "<answer>12</answer>", "<answer>12</answer>", "<answer>1</answer><answer>12</answer>"]
    assert reward(completions, examples) == [1.0, 0.0, None, 1.0, None, 1.0]


def test_reward_records_its_checker():
    fn = REWARDS.get("math_answer")
    assert fn.uses_math_verify is _math.MATH_VERIFY_AVAILABLE
    assert fn.checker == _math.CHECKER
    expected = "math_verify" if _math.MATH_VERIFY_AVAILABLE else ("sympy" if _math.SYMPY_AVAILABLE else "string")
    assert fn.checker == expected
    # The fast built-in rules settle numbers and letters whichever checker is installed.
    assert compare("1/2", "0.5") == (True, "number") and compare("(B)", "B") == (True, "choice")


def test_reward_batch_mismatch_raises():
    with pytest.raises(ValueError):
        reward(["<answer>1</answer>"], [{"answer": "1"}, {"answer": "2"}])


def test_hostile_inputs_are_fast():
    slow = ["1e999999", "9^9^9^9", "(a+b+c)^99", "x^99^99", "open(1)", "__import__('os')", "9" * 5000,
            "\\frac{" * 200, "((((((((((((((((((((x))))))))))))))))))))", "breakpoint()", "input()"]
    for text in slow:
        t0 = time.perf_counter()
        assert reward([f"<answer>{text}</answer>"], [{"answer": "x+1"}]) == [0.0]
        assert time.perf_counter() - t0 < 2.0, text


# -- property: never raises, always None or 0/1 ----------------------------------------------------
FRAGMENTS = st.sampled_from(
    ["<answer>", "</answer>", "\\boxed{", "\\frac{", "{", "}", "$", "\\(", "\\)", "%", ",", ".", "/", "^", "**",
     "x", "sqrt", "\\sqrt", "pi", "(", ")", "B", "(B)", "1e999", "nan", "inf", "=", " ", "-", "+", "0", "9", "two"]
)
TEXTS = st.one_of(st.text(max_size=40), st.lists(st.one_of(FRAGMENTS, st.text(max_size=3)), max_size=16).map("".join))
TRUTHS = st.one_of(TEXTS, st.integers(-10**6, 10**6), st.floats(allow_nan=True), st.none())
OPTIONS = st.one_of(st.none(), st.lists(TEXTS, max_size=4), st.dictionaries(st.text(max_size=2), TEXTS, max_size=4),
                    st.integers())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(TEXTS, TRUTHS, OPTIONS), min_size=1, max_size=4))
def test_never_raises(rows):
    completions = [c if i % 2 else f"<answer>{c}</answer>" for i, (c, _, _) in enumerate(rows)]
    examples = [{"answer": t, "options": o} for _, t, o in rows]
    out = reward(completions, examples)
    assert len(out) == len(rows)
    for v in out:
        assert v is None or (isinstance(v, float) and v in (0.0, 1.0) and not math.isnan(v))


@settings(max_examples=100, deadline=None)
@given(st.fractions(min_value=-1000, max_value=1000, max_denominator=50))
def test_fraction_forms_agree(q):
    """a/b, \\frac{a}{b} and (when exact) the decimal all equal the fraction."""
    a, b = q.numerator, q.denominator
    assert math_equal(f"{a}/{b}", str(q)) and math_equal(f"\\frac{{{a}}}{{{b}}}", f"{a}/{b}")
    if 10**6 % b == 0 or b in (1, 2, 4, 5, 8, 16, 20, 25, 32, 40, 50):
        assert math_equal(f"{a / b:.6f}", f"{a}/{b}")
