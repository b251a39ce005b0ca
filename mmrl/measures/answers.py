"""Exact answers: numeric-aware accuracy of an answer block, and No-Thinking equality.

Used by the ``accuracy`` and ``equality`` rewards and by the metrics of the tasks they score
(classification, rotation, ...), so a task's accuracy is graded exactly as its answer reward is:
with the ``thinking`` option a task scores with ``accuracy``, without it with ``equality``
(:func:`layout_score`, :func:`layout_answer`).
"""

from __future__ import annotations

from typing import Optional

from mmrl.parsing import answer_correct, answer_text, extract_answer


def accuracy_score(completion, truth) -> Optional[float]:
    """1.0 / 0.0 for the last ``<answer>`` block against ``truth`` (numeric truths compare as
    numbers: "2" == "2.0" == "two" == "2 circles", see :func:`mmrl.parsing.answer_correct`);
    None when there is no answer block or no truth."""
    pred = extract_answer(completion)
    return None if pred is None or truth is None else answer_correct(pred, truth)


def _canonical(text: str) -> str:
    """Stripped, internal whitespace collapsed to one space, case-folded."""
    return " ".join(text.split()).casefold()


def equality_score(completion, truth) -> float:
    """1.0 iff :func:`mmrl.parsing.answer_text` of ``completion`` equals ``truth`` up to case and
    whitespace, else 0.0 (also for a non-str completion or no truth): no numeric tolerance and no
    text around the answer, the "equality accuracy" of CLS-RL / No-Thinking-RL."""
    if not isinstance(completion, str) or truth is None:
        return 0.0
    return 1.0 if _canonical(answer_text(completion)) == _canonical(str(truth)) else 0.0


def layout_score(completion, truth, thinking: bool) -> float:
    """Correctness as the answer reward of a task with the ``thinking`` option grades it:
    :func:`accuracy_score` (unparsable: 0.0) with thinking, :func:`equality_score` without."""
    return (accuracy_score(completion, truth) or 0.0) if thinking else equality_score(completion, truth)


def layout_answer(completion, thinking: bool) -> Optional[str]:
    """What ``completion`` answers in the layout: the last ``<answer>`` block with thinking,
    :func:`mmrl.parsing.answer_text` without; None for a non-str completion."""
    if not isinstance(completion, str):
        return None
    return extract_answer(completion) if thinking else answer_text(completion)
