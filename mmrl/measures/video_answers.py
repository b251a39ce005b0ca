"""mmrl's reading of video answers: the ``video_answer_accuracy`` reward, Video-R1's grading by
``problem_type`` made tolerant of how a model writes an answer.

Video-R1's own reward, as its code computes it, is :mod:`mmrl.measures.video_r1`
(``video_r1_accuracy``); this one differs on purpose, each difference a fix for a way a right
answer scored 0 there (or a wrong one 1):

- the *last* ``<answer>`` block counts (:func:`mmrl.parsing.extract_answer`, as every mmrl reward:
  the final answer after a correction), not the first;
- ``multiple choice``: the option letter is read from "B", "b", "B.", "(B)", "[B]", "B. red",
  "(B) red", "The answer is (B)", "Option B" (Video-R1: exact string equality);
- ``numerical``: the first number of the answer ("12 apples"), thousands separators dropped, a
  number-word truth or answer zero..ten ("three" for 3); "3.0" for "3" is right (Video-R1 scores 0
  when one side has a decimal point and the other not, and reads no words);
- ``regression``: ``1 - min(1, |pred - truth| / max(|truth|, 1e-6))``: the exact answer to a truth
  of 0 scores 1 (Video-R1: 0), and "nan" is no number (Video-R1: 1.0, see its module);
- ``free-form``: ROUGE without the stemmer, non-ASCII letters kept (:func:`mmrl.measures.rouge.rouge_tokens`);
- another ``problem_type``: normalised string equality (Video-R1: 0);
- an answer unreadable for its type (no answer block, no option letter, no number) is None: scored
  as the minimum and counted as unparsable, instead of a silent 0.
"""

from __future__ import annotations

import re
from typing import Optional

from .rouge import rouge_mean, word_error_rate
from .video_r1 import problem_type_key, stored_solution
from mmrl.parsing import extract_answer, normalize, parse_exact_number, parse_number

REL_EPS = 1e-6  # regression: the relative error's denominator is max(|truth|, REL_EPS)

# The whole answer is one option letter, maybe bracketed or followed by punctuation: "B", "(B)", "b."
_LONE_LETTER_RE = re.compile(r"[\s(\[*\"'`]*([A-Za-z])[\s)\]*\"'`.:,]*")
# An option letter opening a longer answer, marked off by punctuation: "B. red", "(B) red", "B: red"
# (not "A cat": there the "A" is an article).
_LEADING_LETTER_RE = re.compile(r"[\s*\"'`]*(?:[(\[]\s*([A-Z])\s*[)\]]|([A-Z])\s*[.:)])")
# A letter named as the option: "The answer is (B)", "Option C", "choice: D".
_NAMED_LETTER_RE = re.compile(r"\b(?i:option|answer|choice)(?:\s+(?i:is))?\s*[:\-]?\s*[(\[]?\s*([A-Z])\b(?!')")
# A thousands separator between digits: "1,000" -> "1000" (a decimal comma "3,5" is left alone).
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def choice_letter(text: str) -> Optional[str]:
    """The option letter an answer picks, upper-case, or None: "B", "b", "B.", "(B)", "[B]",
    "B. red", "(B) red", "B) red", "The answer is (B)", "Option B" -> "B"; "A cat", "red" -> None.
    A lower-case letter counts only when it is the whole answer."""
    if not isinstance(text, str):
        return None
    m = _LONE_LETTER_RE.fullmatch(text)
    if m is not None:
        return m.group(1).upper()
    m = _LEADING_LETTER_RE.match(text)
    if m is not None:
        return m.group(1) or m.group(2)
    m = _NAMED_LETTER_RE.search(text)
    return m.group(1) if m is not None else None


def _number(text: str, exact: bool = False) -> Optional[float]:
    text = _THOUSANDS_RE.sub("", text)
    value = parse_exact_number(text) if exact else None
    return value if value is not None else parse_number(text)


def gold_answer(ex) -> Optional[str]:
    """The example's true answer: ``ex["solution"]`` (Video-R1's key) or else ``ex["answer"]``, the
    content of its ``<answer>`` block when it has one, stripped; None when there is neither."""
    text = stored_solution(ex)
    if text is None:
        return None
    inner = extract_answer(text)
    return (inner if inner is not None else text).strip()


def answer_score(pred: str, truth: str, problem_type) -> Optional[float]:
    """The accuracy of the answer ``pred`` against ``truth``, in [0, 1], by ``problem_type`` (any
    spelling, :func:`problem_type_key`); None when ``pred`` cannot be read for its type.

    - ``multiple choice``: 1 if the option letters agree (:func:`choice_letter`), else 0; a truth
      that is no letter is compared as a normalised string.
    - ``numerical``: 1 if the numbers agree once both are rounded to 2 decimals, else 0.
    - ``regression``: ``1 - min(1, |pred - truth| / max(|truth|, 1e-6))`` (truth 10, answer 8 -> 0.8).
    - ``free-form``: the mean of the ROUGE-1, ROUGE-2 and ROUGE-L F-measures
      (:func:`mmrl.measures.rouge.rouge_mean`); a one-word truth has no bigram: even the right
      answer scores 2/3, as in ``rouge_score``.
    - ``OCR``: ``1 - WER`` clipped to [0, 1] (:func:`mmrl.measures.rouge.word_error_rate`).
    - anything else: 1 if the normalised strings are equal (:func:`mmrl.parsing.normalize`:
      case, whitespace and a final period ignored), else 0.
    """
    kind = problem_type_key(problem_type)
    if kind == "multiple choice":
        want = choice_letter(truth)
        if want is not None:
            got = choice_letter(pred)
            return None if got is None else float(got == want)
    elif kind in ("numerical", "regression"):
        want = _number(truth, exact=True)
        if want is not None:
            got = _number(pred)
            if got is None:
                return None
            if kind == "numerical":
                return float(round(got, 2) == round(want, 2))
            rel = abs(got - want) / max(abs(want), REL_EPS)  # inf when the difference overflows
            return 1.0 - min(1.0, rel)
    elif kind == "free form":
        return min(1.0, max(0.0, rouge_mean(pred, truth)))
    elif kind == "ocr":
        return min(1.0, max(0.0, 1.0 - word_error_rate(pred, truth)))
    # an unknown type, or a truth that cannot be read as its type (no letter, no number)
    return float(normalize(pred) == normalize(truth))


def answer_accuracies(completions, examples) -> list:
    """:func:`answer_score` of each completion's last answer block against ``ex["solution"]`` or
    ``ex["answer"]``; None when there is no answer block, no truth, or an answer unreadable for its
    type (no option letter, no number)."""
    out = []
    for c, ex in zip(completions, examples):
        truth = gold_answer(ex)
        pred = extract_answer(c) if truth is not None else None
        out.append(None if pred is None else answer_score(pred, truth, ex.get("problem_type")))
    return out
