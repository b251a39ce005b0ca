"""Video-R1's accuracy reward as its code computes it, and the temporal IoU of answers.

Video-R1 ("Video-R1: Reinforcing Video Reasoning in MLLMs", Feng et al., 2025) grades an answer by
the example's ``problem_type`` in ``accuracy_reward`` (``src/r1-v/src/open_r1/grpo.py``,
github.com/tulerfeng/Video-R1). :func:`video_r1_reward` is that function for one completion;
:mod:`mmrl.measures.video_answers` keeps mmrl's more lenient reading under its own name.
:func:`answer_tious` is TimeZero's temporal IoU of the ``<answer>`` block's segment.

What Video-R1's code does, and so what this does (its lines quoted):

- both the completion and the solution are read with ``re.search(r'<answer>\\s*(.*?)\\s*</answer>',
  text, re.DOTALL)``: the *first* answer block, stripped; ``""`` when there is none;
- ``multiple choice``: ``1.0 if output_ans.strip() == gt_ans.strip() else 0.0``, exact and
  case-sensitive ("B." or "(B)" for "B" score 0);
- ``numerical``: 0 when exactly one side has a ``.`` or ``,`` (``gt_has_decimal != out_has_decimal``:
  "3.0" for "3" scores 0), else ``float(s.replace(',', ''))`` of both sides, equal after
  ``round(x, 2)``; text that ``float`` cannot read scores 0 ("three", "3 apples");
- ``OCR``: ``1 - wer(gt_ans, output_ans)`` clipped to [0, 1] (:func:`mmrl.measures.rouge.word_error_rate`);
- ``free-form``: the mean of the ROUGE-1, ROUGE-2 and ROUGE-L F-measures from ``rouge_score`` with
  ``use_stemmer=True`` (:func:`mmrl.measures.rouge.rouge_score_tokens`), clipped to [0, 1];
- ``regression``: ``rel_diff = (abs(out - gt) + 1e-9) / (abs(gt) + 1e-9)``, ``1 - min(1.0,
  max(0.0, rel_diff))``; unreadable numbers 0. The clamp keeps a NaN: ``max(0.0, nan)`` is 0.0, so
  the answer "nan" scores 1.0 on every regression question, in Video-R1 and here (mmrl's
  ``video_answer_accuracy`` scores it 0); an exact answer to a truth of 0 scores 0 (1e-9 / 1e-9);
- any other ``problem_type``: 0.0; any exception: 0.0.

Two readings that are mmrl's, neither changing a score on Video-R1's data: the problem type is read
per example (Video-R1 reads ``kwargs['problem_type'][0]`` for its whole batch, one question per
device) and in any spelling of its five names (:func:`problem_type_key`: "Multiple_Choice"); a
solution with no ``<answer>`` block (Video-R1's always has one), or an ``answer`` key instead of
``solution``, is read whole.
"""

from __future__ import annotations

import re
from typing import Optional

from .rouge import rouge_mean, rouge_score_tokens, word_error_rate
from .temporal import as_segment, parse_segment, temporal_iou
from mmrl.parsing import extract_answer

_VIDEO_R1_ANSWER_RE = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


def problem_type_key(value) -> str:
    """A ``problem_type`` in one spelling: case-folded, runs of space/_/- as one space
    ("Multiple_Choice" -> "multiple choice", "free-form" -> "free form", "OCR" -> "ocr")."""
    return " ".join(re.split(r"[\s_-]+", str(value).casefold())).strip() if value is not None else ""


def first_answer(text) -> str:
    """Video-R1's ``extract_answer``: the stripped content of the first ``<answer>`` block, or ""."""
    match = _VIDEO_R1_ANSWER_RE.search(text)
    return match.group(1).strip() if match else ""


def _number(text: str) -> Optional[float]:
    """Video-R1's ``normalize_number``: ``float(num_str.replace(',', ''))``, None when it fails."""
    try:
        return float(text.replace(",", ""))
    except Exception:
        return None


def video_r1_reward(content, solution, problem_type) -> float:
    """Video-R1's ``accuracy_reward`` of one completion ``content`` against ``solution`` (text
    holding ``<answer>..</answer>``), in [0, 1] (see the module docstring for each type)."""
    try:
        out, gt = first_answer(content), first_answer(solution)
        kind = problem_type_key(problem_type)
        if kind == "multiple choice":
            return 1.0 if out.strip() == gt.strip() else 0.0
        if kind == "numerical":
            if ("." in gt or "," in gt) != ("." in out or "," in out):
                return 0.0
            g, o = _number(gt), _number(out)
            return 0.0 if g is None or o is None else float(round(g, 2) == round(o, 2))
        if kind == "ocr":
            return max(0.0, min(1.0, 1 - word_error_rate(out, gt)))
        if kind == "free form":
            return max(0.0, min(1.0, rouge_mean(out, gt, rouge_score_tokens)))
        if kind == "regression":
            g, o = _number(gt), _number(out)
            if g is None or o is None:
                return 0.0
            rel_diff = (abs(o - g) + 1e-9) / (abs(g) + 1e-9)
            return 1 - min(1.0, max(0.0, rel_diff))
        return 0.0
    except Exception:
        return 0.0


def gold_solution(ex) -> Optional[str]:
    """The example's solution as Video-R1 holds it: ``ex["solution"]`` (or ``ex["answer"]``), with
    ``<answer>..</answer>`` around it when it has no such block; None when there is neither."""
    text = stored_solution(ex)
    if text is None:
        return None
    return text if _VIDEO_R1_ANSWER_RE.search(text) else f"<answer>{text}</answer>"


def stored_solution(ex) -> Optional[str]:
    """``ex["solution"]`` (Video-R1's key), else ``ex["answer"]``, as text; None when there is neither."""
    if not isinstance(ex, dict):
        return None
    value = ex.get("solution")
    if value is None:
        value = ex.get("answer")
    return None if value is None else str(value)


def video_r1_accuracies(completions, examples) -> list:
    """:func:`video_r1_reward` of each completion against its example's solution, by
    ``ex["problem_type"]``; None only for an example with no solution (or answer)."""
    out = []
    for c, ex in zip(completions, examples):
        solution = gold_solution(ex)
        out.append(None if solution is None else video_r1_reward(c, solution, ex.get("problem_type")))
    return out


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
