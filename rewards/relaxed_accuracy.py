"""``relaxed_accuracy``: ChartQA's metric, exact answers with a 5% tolerance on numbers.

The rule and its paper are in :mod:`mmrl.measures.relaxed`; this module registers the reward.
"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.measures.batch import score_each
from mmrl.measures.relaxed import MAX_RELATIVE_ERROR, relaxed_correct
from mmrl.parsing import extract_answer


@register_reward("relaxed_accuracy")
def relaxed_accuracy(completions, examples, max_relative_error: float = MAX_RELATIVE_ERROR) -> list:
    """ChartQA relaxed accuracy of the ``<answer>`` block against ``ex["answer"]``.

    Hand-worked: truth "100": "104" -> 1.0 (4% off), "105" -> 1.0 (exactly 5%), "106" -> 0.0;
    truth "0": "0" and "0.0" -> 1.0, "0.01" -> 0.0; truth "yes": "Yes." -> 1.0, "no" -> 0.0;
    truth "B": " b " -> 1.0. None when there is no answer block (or the example has no answer).
    """

    def score(completion, ex):
        pred = extract_answer(completion)
        truth = ex.get("answer") if isinstance(ex, dict) else None
        return None if pred is None or truth is None else relaxed_correct(pred, truth, max_relative_error)

    return score_each("relaxed_accuracy", completions, examples, score)
