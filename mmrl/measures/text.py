"""Edit distance between answer texts: Levenshtein, normalised similarity, ANLS.

The graded measure of reading tasks (OCR): a near miss ("W3K9B" for "W3K9A") scores most of the
way instead of zero. The similarity ``1 - d(pred, truth) / max(len(pred), len(truth))`` is the
per-answer term of ANLS ("Scene Text Visual Question Answering", ST-VQA), which :func:`anls`
averages with its 0.5 cut-off. Used by the ``edit_similarity`` reward and the ``ocr`` task's
metrics.
"""

from __future__ import annotations

from typing import Optional

from mmrl.parsing import extract_answer

ANLS_THRESHOLD = 0.5  # ST-VQA's tau


def levenshtein(a: str, b: str) -> int:
    """The least number of one-character insertions, deletions and substitutions turning ``a``
    into ``b`` (two-row dynamic programme, O(len(a) * len(b)) time, O(min) memory).

    >>> levenshtein("kitten", "sitting")  # k->s, e->i, +g
    3
    """
    if a == b:
        return 0
    if len(a) < len(b):
        a, b = b, a  # b is the shorter: the rows are len(b) + 1 long
    if not b:
        return len(a)
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(
                previous[j] + 1,  # delete ca
                current[j - 1] + 1,  # insert cb
                previous[j - 1] + (ca != cb),  # substitute (free when equal)
            ))
        previous = current
    return previous[-1]


def similarity(pred: str, truth: str, case_sensitive: bool = True) -> float:
    """``1 - levenshtein(pred, truth) / max(len(pred), len(truth))`` in [0, 1]; 1.0 when both are
    empty. ``case_sensitive=False`` compares case-folded texts."""
    if not case_sensitive:
        pred, truth = pred.casefold(), truth.casefold()
    longest = max(len(pred), len(truth))
    if longest == 0:
        return 1.0
    return 1.0 - levenshtein(pred, truth) / longest


def anls(values) -> float:
    """ANLS over per-answer similarities (None counts as 0): the mean of ``s if s >= 0.5 else 0``.

    Average Normalized Levenshtein Similarity of "Scene Text Visual Question Answering" (ST-VQA,
    Biten et al., ICCV 2019) with its threshold tau = 0.5 and one ground truth per question. At
    exactly 0.5 this follows the Robust Reading Competition's evaluation script (0.5 is kept); the
    paper's formula (NL < tau) would zero it. 0.0 for an empty batch.
    """
    values = [0.0 if v is None else float(v) for v in values]
    if not values:
        return 0.0
    return sum(v if v >= ANLS_THRESHOLD else 0.0 for v in values) / len(values)


def answer_similarity(completion: str, truth, case_sensitive: bool = True) -> Optional[float]:
    """:func:`similarity` of the completion's answer block (stripped) to ``str(truth)``
    (stripped); None when there is no answer block or no truth."""
    pred = extract_answer(completion)
    if pred is None or truth is None:
        return None
    return similarity(pred, str(truth).strip(), case_sensitive=case_sensitive)
