"""Matching and scoring of multi-box answers (open-vocabulary detection), shared by the
detection rewards (``det_iou``, ``ap50``, ``det_criterion``) and the ``detection`` task's metrics.

Answers are read with :func:`mmrl.parsing.parse_boxes`. Nothing here raises on model output:
unparsable text gives ``None``, and every score is a float in [0, 1].
"""

from __future__ import annotations

from typing import Optional, Sequence

from mmrl.measures.boxes import box_iou
from mmrl.media.coords import prediction_to_pixels
from mmrl.parsing import Box, extract_answer, parse_boxes


def answer_boxes(completion, ex) -> Optional[list[Box]]:
    """The boxes in ``completion``'s answer block, converted from the policy's coordinate space to
    original-image pixels (:func:`mmrl.media.coords.prediction_to_pixels`); None when there is no
    answer block, no parsable box list in it, or the conversion is impossible."""
    answer = extract_answer(completion)
    boxes = parse_boxes(answer) if answer is not None else None
    if boxes is None:
        return None
    try:
        out = [tuple(prediction_to_pixels(b, ex)) for b in boxes] if isinstance(ex, dict) else boxes
    except (ValueError, TypeError, ZeroDivisionError, OverflowError):
        return None
    return out  # type: ignore[return-value]


def truth_boxes(ex) -> Optional[list[Box]]:
    """The example's true boxes in pixels: ``ex["boxes"]`` (possibly empty), else ``[ex["box"]]``
    (so the rewards also score single-box grounding examples), else None."""
    if not isinstance(ex, dict):
        return None
    if ex.get("boxes") is not None:
        return [tuple(float(v) for v in b) for b in ex["boxes"]]
    if ex.get("box") is not None:
        return [tuple(float(v) for v in ex["box"])]
    return None


def match_boxes(preds: Sequence[Sequence[float]], truths: Sequence[Sequence[float]],
                min_iou: float = 0.0, strict: bool = True) -> list[tuple[int, int, float]]:
    """Greedy one-to-one matching, highest IoU first: ``(pred index, truth index, IoU)`` triples.

    A pair is eligible when its IoU is ``> min_iou`` (``strict``) or ``>= min_iou``; ties are
    broken by the lower prediction index, then the lower truth index, so the result is
    deterministic. Greedy is what the rewards specify (not the Hungarian optimum): it is cheap and
    matches how a reader pairs boxes by eye.
    """
    pairs = []
    for i, p in enumerate(preds):
        for j, t in enumerate(truths):
            iou = box_iou(p, t)
            if iou > min_iou or (not strict and iou >= min_iou):
                pairs.append((-iou, i, j))
    pairs.sort()
    used_p, used_t, out = set(), set(), []
    for neg, i, j in pairs:
        if i in used_p or j in used_t:
            continue
        used_p.add(i)
        used_t.add(j)
        out.append((i, j, -neg))
    return out


def det_iou_score(preds, truths) -> float:
    """sum(matched IoU) / max(#pred, #true) under greedy matching at IoU > 0; both empty -> 1.0."""
    if not preds and not truths:
        return 1.0
    if not preds or not truths:
        return 0.0
    total = sum(iou for _, _, iou in match_boxes(preds, truths))
    return min(1.0, max(0.0, total / max(len(preds), len(truths))))


def ap50_score(preds, truths, threshold: float = 0.5) -> float:
    """Average precision at IoU ``threshold`` for one image, predictions ranked in answer order.

    Walking the predictions in order, each one is a true positive if the unmatched truth it
    overlaps most has IoU >= threshold (that truth is then used up), else a false positive; after
    each one, precision = TP / (predictions so far) and recall = TP / #true. AP is the area under
    the precision-recall curve with all-point interpolation (COCO / PASCAL VOC 2010+): the
    precision at recall r is the best precision at any recall >= r. Both empty -> 1.0; only one
    empty -> 0.0.
    """
    if not preds and not truths:
        return 1.0
    if not preds or not truths:
        return 0.0
    used: set[int] = set()
    tp = 0
    points = []  # (recall, precision) after each prediction
    for k, p in enumerate(preds, start=1):
        best, best_j = -1.0, None
        for j, t in enumerate(truths):
            iou = box_iou(p, t) if j not in used else -1.0
            if iou >= threshold and iou > best:
                best, best_j = iou, j
        if best_j is not None:
            used.add(best_j)
            tp += 1
        points.append((tp / len(truths), tp / k))
    ap, prev_recall = 0.0, 0.0
    for idx, (recall, _) in enumerate(points):
        if recall > prev_recall:
            ap += (recall - prev_recall) * max(pr for _, pr in points[idx:])
            prev_recall = recall
    return min(1.0, max(0.0, ap))


def criterion_score(preds, truths, threshold: float = 0.5) -> float:
    """(precision + recall) / 2 with greedy one-to-one matching at IoU >= threshold:
    precision = sum(IoU of matched predictions) / #pred, recall = #matched / #true.
    Both empty -> 1.0; only one empty -> 0.0."""
    if not preds and not truths:
        return 1.0
    if not preds or not truths:
        return 0.0
    matches = match_boxes(preds, truths, min_iou=threshold, strict=False)
    precision = sum(iou for _, _, iou in matches) / len(preds)
    recall = len(matches) / len(truths)
    return min(1.0, max(0.0, (precision + recall) / 2))
