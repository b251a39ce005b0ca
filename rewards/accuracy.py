"""``accuracy``: is the answer in the ``<answer>`` block equal to the example's ``answer``?"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.rewards._parsing import answer_correct, extract_answer


@register_reward("accuracy")
def accuracy(completions, examples, **ctx) -> list:
    """Exact-answer reward; None when there is no ``<answer>`` block (or no ground truth).

    Numeric truths compare as numbers ("2" == "2.0" == "two" == "2 circles"), others as
    normalised strings; see :func:`mmrl.rewards._parsing.answer_correct`.
    """
    if len(completions) != len(examples):
        raise ValueError(f"accuracy: {len(completions)} completions for {len(examples)} examples")
    out = []
    for c, ex in zip(completions, examples):
        pred = extract_answer(c)
        truth = ex.get("answer") if isinstance(ex, dict) else None
        out.append(None if pred is None or truth is None else answer_correct(pred, truth))
    return out
