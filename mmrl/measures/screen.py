"""Screen grounding: a click (or a box) for "click the Wi-Fi toggle", scored against the element.

Used by the ``click_accuracy``, ``gui_g2_point`` and ``gui_g2_coverage`` rewards and by screen
grounding metrics, so a gallery's verdict is the reward the policy got. Only the ``<answer>``
block counts, and the answer is converted from the policy's coordinate space
(``ex["pred_space"]``/``ex["frame"]``: Qwen2.5-VL resized-image pixels, Qwen2-VL / Qwen3-VL
0-1000, see :mod:`mmrl.media.coords`) to original pixels, the space of ``ex["box"]``, before
comparing: on a 2560x1440 screen a click read in the wrong frame lands hundreds of pixels away.

The Gaussian rewards are those of "GUI-G²: Gaussian Reward Modeling for GUI Grounding" (Tang et
al., 2025; arXiv 2507.15846, code github.com/zju-real/GUI-G2): the element is a 2D Gaussian at
its centre with sigma proportional to its size, sigma_x = ALPHA * width, sigma_y = ALPHA * height
(the paper's Eq. 5; ALPHA = 0.5 is the value its Section 4.1 sets and its ablation finds best,
and ``alpha = 0.5`` in the official ``gaussian_grpo.py``). Unlike the official code, rewards are
not rounded to 3 decimals.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from mmrl.measures.boxes import answer_box
from mmrl.media.coords import prediction_to_pixels
from mmrl.parsing import extract_answer, parse_point

ALPHA = 0.5  # GUI-G² adaptive sigma: sigma = ALPHA * element size (paper Eq. 5 and Section 4.1)


def answer_point(completion, ex) -> Optional[tuple[float, float]]:
    """The click in ``completion``'s ``<answer>`` block as original-image pixels (a box answer
    gives its centre), converted like :func:`mmrl.measures.boxes.answer_box`; None when there is
    no answer block or no point in it."""
    answer = extract_answer(completion)
    point = parse_point(answer) if answer is not None else None
    if point is None:
        return None
    x, y = prediction_to_pixels(point, ex) if isinstance(ex, dict) else point
    return (x, y) if math.isfinite(x) and math.isfinite(y) else None


def _truth(ex) -> Optional[tuple[float, float, float, float]]:
    """``ex["box"]`` as ordered finite floats, or None."""
    box = ex.get("box") if isinstance(ex, dict) else None
    try:
        x1, y1, x2, y2 = (float(v) for v in box)
    except (TypeError, ValueError):
        return None
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
        return None
    return min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2)


def point_in_box(point: Sequence[float], box: Sequence[float]) -> bool:
    """Whether ``(x, y)`` lies in the ``(x1, y1, x2, y2)`` box, edges included (ScreenSpot's test);
    False for anything unreadable or non-finite."""
    try:
        x, y = (float(v) for v in point)
        x1, y1, x2, y2 = (float(v) for v in box)
    except (TypeError, ValueError, OverflowError):
        return False
    return min(x1, x2) <= x <= max(x1, x2) and min(y1, y2) <= y <= max(y1, y2)


def click_score(completion, ex) -> Optional[float]:
    """1.0 if the answer's click (a box: its centre) lies inside ``ex["box"]``, else 0.0; None
    when the answer has no point or the example no box."""
    box = _truth(ex)
    point = answer_point(completion, ex) if box is not None else None
    return None if point is None else float(point_in_box(point, box))


def gaussian_point(point: Sequence[float], box: Sequence[float], alpha: float = ALPHA) -> float:
    """GUI-G² point reward (Eq. 2): exp(-1/2 ((x-cx)^2/sx^2 + (y-cy)^2/sy^2)) with the element's
    centre (cx, cy) and sx, sy = alpha * (width, height). 1 at the centre, exp(-1/2) one sigma off
    along one axis. A zero-size side counts only an exact hit on that axis."""
    x1, y1, x2, y2 = box
    total = 0.0
    for v, lo, hi in ((point[0], x1, x2), (point[1], y1, y2)):
        d, sigma = v - (lo + hi) / 2, alpha * (hi - lo)
        if sigma > 0:
            total += (d / sigma) * (d / sigma)  # not d**2: a float ** that overflows raises
        elif d != 0:
            return 0.0
    value = math.exp(-0.5 * total)
    return value if math.isfinite(value) else 0.0


def gaussian_coverage(pred: Sequence[float], box: Sequence[float], alpha: float = ALPHA) -> float:
    """GUI-G² coverage reward (Eqs. 3-4): the Bhattacharyya coefficient of the predicted box's
    Gaussian and the element's, both centred on their boxes with sigma = alpha * size. With
    diagonal covariances it factorises per axis into
    sqrt(2 s_p s_g / (s_p^2 + s_g^2)) * exp(-d^2 / (4 (s_p^2 + s_g^2))); 1 for the same box,
    0 for a degenerate (zero-width or zero-height) one."""
    value = 1.0
    for lo_p, hi_p, lo_g, hi_g in ((pred[0], pred[2], box[0], box[2]), (pred[1], pred[3], box[1], box[3])):
        sp, sg = alpha * (hi_p - lo_p), alpha * (hi_g - lo_g)
        if not (sp > 0 and sg > 0):
            return 0.0
        # Scaled by the larger sigma so squares cannot overflow for huge boxes.
        scale = max(sp, sg)
        p, g = sp / scale, sg / scale
        d = ((lo_p + hi_p) / 2 - (lo_g + hi_g) / 2) / scale
        var = p * p + g * g
        value *= math.sqrt(2 * p * g / var) * math.exp(-d * d / (4 * var))
    return min(1.0, value) if math.isfinite(value) else 0.0


def gui_g2_point_score(completion, ex, alpha: float = ALPHA) -> Optional[float]:
    """:func:`gaussian_point` of the answer's click (a box: its centre, as in the paper) against
    ``ex["box"]``; None when the answer has no point or the example no box."""
    box = _truth(ex)
    point = answer_point(completion, ex) if box is not None else None
    return None if point is None else gaussian_point(point, box, alpha)


def gui_g2_coverage_score(completion, ex, alpha: float = ALPHA) -> Optional[float]:
    """:func:`gaussian_coverage` of the answer's box against ``ex["box"]``; None when the answer
    holds no box (a bare click has no extent to cover) or the example none."""
    box = _truth(ex)
    pred = answer_box(completion, ex) if box is not None else None
    return None if pred is None else gaussian_coverage(pred, box, alpha)
