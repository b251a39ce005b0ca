"""Parsing and matching for multi-box answers (open-vocabulary detection), shared by the
detection rewards and the ``detection`` task's metrics.

Like :mod:`mmrl.rewards._parsing`, nothing here raises on model output: unparsable text gives
``None``, and every score is a float in [0, 1].
"""

from __future__ import annotations

import math
import re
from typing import Optional, Sequence

from mmrl.media.coords import prediction_to_pixels
from mmrl.rewards._parsing import _NUM, _NUM_RE, box_iou, extract_answer

Box = tuple[float, float, float, float]

# The box styles of ``parse_box`` (same number pattern), with separators written so that a run of
# whitespace can be matched one way only ("\s*(?:,\s*)?" rather than "\s*,?\s*"): the ambiguous
# form backtracks quadratically on long whitespace runs, and a completion may hold thousands.
_SEP = r"\s*(?:,\s*)?"
_BOX4 = rf"[\[(]\s*({_NUM}){_SEP}({_NUM}){_SEP}({_NUM}){_SEP}({_NUM})\s*[\])]"
_PAIRS = (rf"[\[(]\s*({_NUM}){_SEP}({_NUM})\s*[\])]\s*(?:(?:,|-|to|and)\s*)?"
          rf"[\[(]\s*({_NUM}){_SEP}({_NUM})\s*[\])]")
# One scan, left to right, non-overlapping: at each position a 4-number box is tried before a
# corner pair, so "[[1, 2], [3, 4]]" reads as one box and "[[1, 2, 3, 4], [5, 6, 7, 8]]" as two.
_ANY_BOX_RE = re.compile(f"(?:{_BOX4})|(?:{_PAIRS})", re.ASCII)
_FENCE_RE = re.compile(r"```[A-Za-z0-9_-]*")
_EMPTY_LIST_RE = re.compile(r"\[\s*\]")
_NONE_WORDS = ("none", "no objects", "nothing")


def parse_boxes(text: str) -> Optional[list[Box]]:
    """All boxes ``(x1, y1, x2, y2)`` of an answer, in answer order, corners ordered; ``[]`` for an
    explicit empty answer; None when the text cannot be read as a list of boxes.

    Accepts ``[[x1, y1, x2, y2], ...]``, ``[{"bbox_2d": [...], "label": "..."}, ...]`` (any keys:
    the bracketed numbers are what count), ``(x1, y1), (x2, y2)`` corner pairs, a single box, any of
    them inside code fences, and as a last resort text with exactly four numbers (one box). Empty
    answers are ``[]`` (or "none" / "no objects" / "nothing") with no number in the text. A box
    with a non-finite coordinate makes the whole answer unparsable.
    """
    if not isinstance(text, str):
        return None
    text = _FENCE_RE.sub(" ", text)
    boxes: list[Box] = []
    for m in _ANY_BOX_RE.finditer(text):
        groups = m.groups()
        values = groups[:4] if groups[0] is not None else groups[4:]
        box = _ordered(values)
        if box is None:
            return None
        boxes.append(box)
    if boxes:
        return boxes
    numbers = _NUM_RE.findall(text)
    if len(numbers) == 4:
        box = _ordered(numbers)
        return None if box is None else [box]
    if not numbers:
        if _EMPTY_LIST_RE.search(text) or text.strip().rstrip(".").strip().casefold() in _NONE_WORDS:
            return []
    return None


def _ordered(values: Sequence[str]) -> Optional[Box]:
    try:
        x1, y1, x2, y2 = (float(v) for v in values)
    except (TypeError, ValueError, OverflowError):
        return None
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
        return None
    return (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))


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
