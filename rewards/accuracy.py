"""``accuracy``: is the answer in the ``<answer>`` block equal to the example's ``answer``?"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.measures.answers import accuracy_score
from mmrl.measures.batch import score_each


@register_reward("accuracy")
def accuracy(completions, examples) -> list:
    """Exact-answer reward; None when there is no ``<answer>`` block (or no ground truth).

    Numeric truths compare as numbers ("2" == "2.0" == "two" == "2 circles"), others as
    normalised strings; see :func:`mmrl.measures.answers.accuracy_score`.
    """
    return score_each("accuracy", completions, examples,
                      lambda c, ex: accuracy_score(c, ex.get("answer") if isinstance(ex, dict) else None))
