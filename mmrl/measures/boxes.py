"""Box overlap: IoU of two boxes, and of a completion's answer box with the example's.

Used by the ``iou`` reward and the ``grounding`` task's metrics and gallery, so the number a
gallery shows is the reward the policy got.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from mmrl.media.coords import prediction_to_pixels
from mmrl.parsing import extract_answer, parse_box


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two ``(x1, y1, x2, y2)`` boxes; 0.0 when the union is empty."""
    try:
        ax1, ay1, ax2, ay2 = (float(v) for v in a)
        bx1, by1, bx2, by2 = (float(v) for v in b)
    except (TypeError, ValueError):
        return 0.0
    ax1, ax2 = sorted((ax1, ax2))
    ay1, ay2 = sorted((ay1, ay2))
    bx1, bx2 = sorted((bx1, bx2))
    by1, by2 = sorted((by1, by2))
    iw = max(0.0, min(ax2, bx2) - max(ax1, bx1))
    ih = max(0.0, min(ay2, by2) - max(ay1, by1))
    inter = iw * ih
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    if not (union > 0) or not math.isfinite(union):
        return 0.0
    iou = inter / union
    return min(1.0, max(0.0, iou)) if math.isfinite(iou) else 0.0


def answer_box(completion, ex) -> Optional[tuple[float, ...]]:
    """The box in ``completion``'s ``<answer>`` block as original-image pixels (converted from the
    policy's space, ``ex["pred_space"]``/``ex["frame"]``, see :mod:`mmrl.media.coords`); None
    when there is no answer block or no parsable box in it. Only the answer block counts: numbers
    that merely appear in the reasoning are not an answer."""
    answer = extract_answer(completion)
    box = parse_box(answer) if answer is not None else None
    if box is None:
        return None
    return prediction_to_pixels(box, ex) if isinstance(ex, dict) else box


def answer_iou(completion, ex) -> Optional[float]:
    """IoU of :func:`answer_box` with ``ex["box"]`` (original pixels); None when either is missing."""
    truth = ex.get("box") if isinstance(ex, dict) else None
    box = answer_box(completion, ex) if truth is not None else None
    return None if box is None else box_iou(box, truth)
