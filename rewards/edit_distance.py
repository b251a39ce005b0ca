"""``edit_similarity``: how close is the answer text to the true text, by Levenshtein distance?

The graded reward for reading tasks (OCR): a near miss ("W3K9B" for "W3K9A") earns most of the
reward instead of none, so the policy gets a signal before it reads whole strings right. The
similarity ``1 - d(pred, truth) / max(len(pred), len(truth))`` is the per-answer term of ANLS
("Scene Text Visual Question Answering", ST-VQA), without ANLS's 0.5 cut-off (see
:mod:`mmrl.measures.text`, which the ``ocr`` task's metrics use too).
"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.measures.batch import score_each
from mmrl.measures.text import answer_similarity


@register_reward("edit_similarity")
def edit_similarity(completions, examples, case_sensitive: bool = True) -> list:
    """Normalised edit similarity of the ``<answer>`` block to ``ex["answer"]``, in [0, 1].

    Hand-worked: "kitten" vs "sitting" is 3 edits over 7 characters -> 1 - 3/7 = 4/7; "W3K9B" vs
    "W3K9A" -> 1 - 1/5 = 0.8; "abc" vs "ABC" -> 0.0 (case-sensitive) or 1.0 with
    ``case_sensitive=False``; an empty answer block for an empty truth -> 1.0. None when there is
    no answer block (or the example has no answer).
    """
    return score_each("edit_similarity", completions, examples, lambda c, ex: answer_similarity(
        c, ex.get("answer") if isinstance(ex, dict) else None, case_sensitive=bool(case_sensitive)))
