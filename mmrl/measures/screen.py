"""Screen grounding: a click (or a box) for "click the Wi-Fi toggle", scored against the element.

Used by the ``click_accuracy``, ``gui_g2_point``, ``gui_g2_coverage`` and ``gui_g1_box`` rewards and by screen
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

The box-size-constrained reward is that of "GUI-G1: Understanding R1-Zero-Like Training for Visual
Grounding in GUI Agents" (Zhou et al., 2025; arXiv 2505.15810, code github.com/Yuqi-Zhou/GUI-G1):
R = R_hit + GUI_G1_ALPHA * R_IoU + GUI_G1_BETA * R_box, see :func:`gui_g1_box_reward`.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from mmrl.measures.boxes import answer_box, box_iou
from mmrl.media.coords import prediction_to_pixels
from mmrl.parsing import extract_answer, parse_point

ALPHA = 0.5  # GUI-G² adaptive sigma: sigma = ALPHA * element size (paper Eq. 5 and Section 4.1)
GUI_G1_ALPHA = 0.25  # GUI-G1 weight of R_IoU (official grpo_rec.py: ``0.25*iou(...)``)
GUI_G1_BETA = 0.125  # GUI-G1 weight of R_box (official grpo_rec.py: ``0.125 * 4/(...)``)


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


def screen_size(ex) -> Optional[tuple[float, float]]:
    """The original image's (width, height): ``ex["image_size"]``, else ``ex["frame"]``'s; None
    when neither is a positive finite pair."""
    if not isinstance(ex, dict):
        return None
    size = ex.get("image_size")
    frame = ex.get("frame")
    if size is None and frame is not None:
        size = (getattr(frame, "width", None), getattr(frame, "height", None))
    try:
        w, h = (float(v) for v in size)
    except (TypeError, ValueError, OverflowError):
        return None
    return (w, h) if w > 0 and h > 0 and math.isfinite(w) and math.isfinite(h) else None


def gui_g1_box_term(pred: Sequence[float], box: Sequence[float], size: Sequence[float]) -> float:
    """GUI-G1's box-size constraint R_box in [0, 1]: the harmonic mean of the four per-coordinate
    closenesses c_i = 1 - |pred_i - box_i| / S_i (S = image width for x1, x2, height for y1, y2),

        R_box = 4 / (1/c_x1 + 1/c_y1 + 1/c_x2 + 1/c_y2),

    1 only when every edge matches, so a box that is too small (hit hacking) or too large (IoU
    hacking) loses reward on each edge it moves. A closeness <= 0 (an edge a full image size or more
    off) gives 0, the harmonic mean's limit (the official code's division by zero scores 0 too).
    Both boxes are taken with ordered corners."""
    w, h = size
    px1, px2 = sorted((pred[0], pred[2]))
    py1, py2 = sorted((pred[1], pred[3]))
    inverse = 0.0
    for p, g, s in ((px1, box[0], w), (py1, box[1], h), (px2, box[2], w), (py2, box[3], h)):
        c = 1.0 - abs(p - g) / s
        if not (c > 0):  # also catches NaN
            return 0.0
        inverse += 1.0 / c
    value = 4.0 / inverse
    return min(1.0, value) if math.isfinite(value) else 0.0


def gui_g1_box_reward(
    pred: Sequence[float],
    box: Sequence[float],
    size: Sequence[float],
    alpha: float = GUI_G1_ALPHA,
    beta: float = GUI_G1_BETA,
) -> float:
    """GUI-G1 box-size-constrained grounding reward (Zhou et al., 2025, "GUI-G1: Understanding
    R1-Zero-Like Training for Visual Grounding in GUI Agents", arXiv 2505.15810), in [0, 1 + alpha
    + beta] = [0, 1.375] with the defaults; the maximum is reached by the exact box:

        R = R_hit + alpha * R_IoU + beta * R_box
        R_hit = 1 if the predicted box's centre lies in the element's box (edges included) else 0
        R_IoU = IoU(predicted box, element box)
        R_box = 4 / sum_i 1 / (1 - |pred_i - gt_i| / S_i),  i over x1, y1, x2, y2,
                S = image width (x) / height (y)         (see :func:`gui_g1_box_term`)

    The paper's output-evaluation analysis adds R_box to the hit and IoU rewards because R_hit alone
    shrinks boxes and R_IoU alone grows them; the combination R_hit + alpha R_IoU + beta R_box is the
    paper's, and the R_box expression and alpha = 0.25, beta = 0.125 are those of the official
    ``grpo_rec.py`` (``iou_reward``: ``0.25*iou``, ``box_reward``: ``0.125 * 4/(...)``).
    The size S_i is the original screenshot's (``ex["image_size"]``), with both boxes in original
    pixels; the official code divides by the image it trains on, in whose space its boxes are, and
    |pred_i - gt_i| / S_i is the same in any linearly scaled space. Two deliberate differences from
    the official code: IoU is the continuous one of :func:`mmrl.measures.boxes.box_iou` (the
    official ``iou`` subtracts 1 from the right/bottom edges, a pixel-inclusive convention), and
    the sum is not split into three separately logged reward functions."""
    hit = point_in_box(((pred[0] + pred[2]) / 2, (pred[1] + pred[3]) / 2), box)
    value = float(hit) + alpha * box_iou(pred, box) + beta * gui_g1_box_term(pred, box, size)
    return value if math.isfinite(value) else 0.0


def gui_g1_box_score(completion, ex, alpha: float = GUI_G1_ALPHA, beta: float = GUI_G1_BETA) -> Optional[float]:
    """:func:`gui_g1_box_reward` of the answer's box (converted to original pixels like
    :func:`mmrl.measures.boxes.answer_box`) against ``ex["box"]`` on a screen of
    :func:`screen_size`; None when the answer holds no box (a bare click has no size to
    constrain), or the example has no box or no screen size."""
    box = _truth(ex)
    size = screen_size(ex) if box is not None else None
    pred = answer_box(completion, ex) if size is not None else None
    if pred is None or not all(math.isfinite(v) for v in pred):
        return None
    return gui_g1_box_reward(pred, box, size, alpha, beta)
