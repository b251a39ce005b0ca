"""Open-vocabulary detection rewards: a list of boxes in the answer against ``ex["boxes"]``.

The answer is a JSON-style list of boxes inside the ``<answer>`` block (see
:func:`mmrl.parsing.parse_boxes` for the accepted styles). Predictions are converted
from the policy's coordinate space (``ex["pred_space"]``/``ex["frame"]``) to original-image
pixels, the space of ``ex["boxes"]``, box by box. Examples with only a single ``box`` (grounding)
are scored as one true box. Every reward returns None where the answer has no parsable box list
(or the example no truth) and never raises on model output.

Worked numbers used by the tests, with truths A = [0, 0, 10, 10] and B = [20, 20, 30, 30],
H = [0, 0, 5, 10] (IoU 0.5 with A) and X = [50, 50, 60, 60] (IoU 0 with both):

=====================  ==========  =====================  =============================
predictions vs truths  det_iou     ap50                   det_criterion
=====================  ==========  =====================  =============================
[A, B] vs [A, B]       1.0         1.0                    (1 + 1) / 2 = 1.0
[A] vs [A, B]          1/2 = 0.5   0.5 * 1 = 0.5          (1/1 + 1/2) / 2 = 0.75
[A, A] vs [A]          1/2 = 0.5   1.0                    (1/2 + 1/1) / 2 = 0.75
[X] vs [A]             0.0         0.0                    0.0
[H] vs [A]             0.5         1.0 (IoU 0.5 counts)   (0.5 + 1) / 2 = 0.75
[A, X, B] vs [A, B]    2/3         0.5*1 + 0.5*2/3 = 5/6  (2/3 + 1) / 2 = 5/6
[] vs []               1.0         1.0                    1.0
[] vs [A], [A] vs []   0.0         0.0                    0.0
=====================  ==========  =====================  =============================
"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.measures.batch import score_each
from mmrl.measures.detection import answer_boxes, ap50_score, criterion_score, det_iou_score, truth_boxes


def _score(name, completions, examples, score) -> list:
    def one(completion, ex):
        try:
            truths = truth_boxes(ex)
        except (TypeError, ValueError):
            truths = None
        preds = answer_boxes(completion, ex) if truths is not None else None
        return None if preds is None else float(score(preds, truths))

    return score_each(name, completions, examples, one)


@register_reward("det_iou")
def det_iou(completions, examples) -> list:
    """Matched IoU normalised by the larger of the two box counts:

        det_iou = sum(IoU of matched pairs) / max(#pred, #true)

    with greedy one-to-one matching, highest-IoU pairs first, IoU > 0 only. Both lists empty ->
    1.0; exactly one empty -> 0.0. Dividing by max(#pred, #true) rather than by #true is the
    point: redundant or duplicate boxes lower the reward, which closes the reward hack that
    "VLM-R1: A Stable and Generalizable R1-style Large Vision-Language Model" (Shen et al., 2025,
    arXiv:2504.07615)
    reports for open-vocabulary detection, where a recall-style reward let the policy emit many
    boxes. Examples: [A, B] vs [A, B] -> 1.0; [A] vs [A, B] -> 0.5; the same box twice, [A, A] vs
    [A] -> 0.5 (halved); a wrong box -> 0.0; a half-overlapping box alone -> 0.5.
    """
    return _score("det_iou", completions, examples, det_iou_score)


@register_reward("ap50")
def ap50(completions, examples) -> list:
    """Average precision at IoU 0.5 for one image, the predictions ranked in answer order (the
    answers carry no confidence scores): each prediction is a true positive if it overlaps an
    unmatched truth at IoU >= 0.5 (the best such truth is used up), precision and recall are
    taken after each prediction, and AP is the area under the all-point interpolated
    precision-recall curve (COCO / PASCAL VOC 2010+: precision at recall r is the maximum
    precision at any recall >= r):

        AP = sum_k (r_k - r_{k-1}) * max_{k' >= k} p_{k'}   over the recall steps.

    Both empty -> 1.0; exactly one empty -> 0.0. Examples: [A, X, B] vs [A, B] gives the points
    (r, p) = (0.5, 1), (0.5, 1/2), (1, 2/3), so AP = 0.5 * 1 + 0.5 * 2/3 = 5/6; [A] vs [A, B] ->
    0.5. Like AP itself, trailing false positives after the last true positive cost nothing
    ([A, A] vs [A] -> 1.0): use ``det_iou`` or ``det_criterion`` to penalise extra boxes.
    """
    return _score("ap50", completions, examples, ap50_score)


@register_reward("det_criterion")
def det_criterion(completions, examples) -> list:
    """The criterion-driven detection reward of "Vision-R1: Evolving Human-Free Alignment in Large
    Vision-Language Models via Vision-Guided Reinforcement Learning" (Zhan et al., 2025,
    arXiv:2503.18013), as we
    read it: a precision term and a recall term, averaged. This is our reading of the paper's
    criterion reward (we did not have its text), so the formula implemented is stated exactly:

        matches   = greedy one-to-one pairs, highest IoU first, IoU >= 0.5
        precision = sum(IoU of matched predictions) / #pred
        recall    = #matches / #true
        det_criterion = (precision + recall) / 2

    Both empty -> 1.0; exactly one empty -> 0.0. Examples: [A] vs [A, B] -> (1 + 0.5) / 2 = 0.75;
    [A, A] vs [A] -> (0.5 + 1) / 2 = 0.75; [H] vs [A] (IoU 0.5) -> (0.5 + 1) / 2 = 0.75.
    """
    return _score("det_criterion", completions, examples, criterion_score)
