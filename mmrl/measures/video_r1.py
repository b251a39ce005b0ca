"""Video-R1's answer checks and temporal IoU of answers, shared by the video rewards and the video
tasks' metrics (so a gallery and the reward agree to the digit).

Video-R1 ("Video-R1: Reinforcing Video Reasoning in MLLMs", Feng et al., 2025) grades an answer by
its ``problem_type``: :func:`video_r1_score`. :func:`answer_tious` is TimeZero's temporal IoU of
the ``<answer>`` block's segment.
"""

from __future__ import annotations

import re
from typing import Optional

from .rouge import rouge_mean, word_error_rate
from .temporal import as_segment, parse_segment, temporal_iou
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


def problem_type_key(value) -> str:
    """A ``problem_type`` in one spelling: case-folded, runs of space/_/- as one space
    ("Multiple_Choice" -> "multiple choice", "free-form" -> "free form", "OCR" -> "ocr")."""
    return " ".join(re.split(r"[\s_-]+", str(value).casefold())).strip() if value is not None else ""


def gold_answer(ex) -> Optional[str]:
    """The example's true answer: ``ex["solution"]`` (Video-R1's key) or else ``ex["answer"]``, the
    content of its ``<answer>`` block when it has one, stripped; None when there is neither."""
    if not isinstance(ex, dict):
        return None
    value = ex.get("solution")
    if value is None:
        value = ex.get("answer")
    if value is None:
        return None
    text = str(value)
    inner = extract_answer(text)
    return (inner if inner is not None else text).strip()


def video_r1_score(pred: str, truth: str, problem_type) -> Optional[float]:
    """Video-R1's accuracy of the answer ``pred`` against ``truth``, in [0, 1], by ``problem_type``
    (spelling as in :func:`problem_type_key`); None when ``pred`` cannot be read for its type.

    - ``multiple choice``: 1 if the option letters agree (:func:`choice_letter`), else 0; a truth
      that is no letter is compared as a normalised string. Video-R1 compares the stripped strings,
      so "B." or "(B)" scored 0 there.
    - ``numerical``: 1 if the numbers agree once both are rounded to 2 decimals, else 0 (the first
      number of the answer counts, thousands separators dropped). Video-R1 also scores 0 when one
      side has a decimal point and the other not ("3.0" for "3"); that format rule is left out.
    - ``regression``: ``1 - min(1, |pred - truth| / max(|truth|, 1e-6))``, i.e. one minus the
      relative error, 0 from 100 % error on (truth 10, answer 8 -> 0.8). Video-R1 writes
      ``rel = (|pred - truth| + 1e-9) / (|truth| + 1e-9)``, which differs by < 1e-9 relative except
      at truth 0, where its exact answer 0 scored 0 and here scores 1.
    - ``free-form``: the mean of the ROUGE-1, ROUGE-2 and ROUGE-L F-measures
      (:func:`mmrl.measures.rouge.rouge_mean`; no stemmer, unlike Video-R1's ``rouge_score`` call).
      As in ``rouge_score``, a one-word truth has no bigram: even the right answer scores 2/3.
    - ``OCR``: ``1 - WER`` clipped to [0, 1] (:func:`mmrl.measures.rouge.word_error_rate`).
    - anything else: 1 if the normalised strings are equal (:func:`mmrl.parsing.normalize`:
      case, whitespace and a final period ignored), else 0. Video-R1 scored unknown types 0.
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


def answer_tious(completions, examples) -> list:
    """Temporal IoU in [0, 1] of each completion's answer segment with ``ex["segment"]``; None when
    there is no answer block, no readable segment in it (an inverted one included, see
    :func:`mmrl.measures.temporal.parse_segment`) or no valid ``segment`` in the example."""
    out = []
    for c, ex in zip(completions, examples):
        truth = as_segment(ex.get("segment")) if isinstance(ex, dict) else None
        answer = extract_answer(c) if truth is not None else None
        segment = parse_segment(answer) if answer is not None else None
        out.append(None if segment is None else temporal_iou(segment, truth))
    return out


def answer_accuracies(completions, examples) -> list:
    """Video-R1's accuracy of each completion's answer block (:func:`video_r1_score`) against
    ``ex["solution"]`` or ``ex["answer"]``; None when there is no answer block, no truth, or an
    answer unreadable for its type (no option letter, no number)."""
    out = []
    for c, ex in zip(completions, examples):
        truth = gold_answer(ex)
        pred = extract_answer(c) if truth is not None else None
        out.append(None if pred is None else video_r1_score(pred, truth, ex.get("problem_type")))
    return out
