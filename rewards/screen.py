"""Screen grounding rewards: ``click_accuracy``, ``gui_g2_point``, ``gui_g2_coverage``, ``gui_g1_box``.

A click answer ("click the Wi-Fi toggle" -> ``<answer>(x, y)</answer>``) is scored against the
element's ``box`` (original pixels) after converting it from the policy's coordinate space
(``ex["pred_space"]``/``ex["frame"]``, recorded by the trainer; see ``mmrl.media.coords``), so a
Qwen2.5-VL click in resized pixels and a Qwen3-VL click in 0-1000 score alike. Only the
``<answer>`` block counts. Formulas and the sigma constant: :mod:`mmrl.measures.screen`. Box
answers' overlap is the ``iou`` reward; ``gui_g1_box`` is GUI-G1's hit + 0.25 IoU + 0.125 box-size
reward for box answers, divided by 1.375 so that it lies in [0, 1] (``normalize=False``: the
paper's scale).
"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.measures.batch import check_batch, score_each
from mmrl.measures.screen import (
    ALPHA,
    GUI_G1_ALPHA,
    GUI_G1_BETA,
    click_score,
    gui_g1_box_score,
    gui_g2_coverage_score,
    gui_g2_point_score,
    screen_size,
)


def _check_call(name, completions, examples, alpha: float = ALPHA) -> None:
    check_batch(name, completions, examples)
    if not (isinstance(alpha, (int, float)) and alpha > 0):
        raise ValueError(f"{name}: alpha (sigma / element size) must be a positive number, got {alpha!r}")


@register_reward("click_accuracy")
def click_accuracy(completions, examples) -> list:
    """1 if the answer's click (a box answer: its centre) is inside ``ex["box"]``, else 0 (the
    ScreenSpot criterion); None when the answer holds no point."""
    return score_each("click_accuracy", completions, examples, click_score)


@register_reward("gui_g2_point")
def gui_g2_point(completions, examples, alpha: float = ALPHA) -> list:
    """GUI-G² Gaussian point reward in (0, 1]: 1 at the element's centre, exp(-1/2) one sigma
    (``alpha`` x the element's width) off along x; None when the answer holds no point."""
    _check_call("gui_g2_point", completions, examples, alpha)
    return [gui_g2_point_score(c, ex, alpha) for c, ex in zip(completions, examples)]


@register_reward("gui_g2_coverage")
def gui_g2_coverage(completions, examples, alpha: float = ALPHA) -> list:
    """GUI-G² Gaussian coverage reward in [0, 1]: the Bhattacharyya coefficient of the answer
    box's Gaussian and the element's; None when the answer holds no box (a bare click)."""
    _check_call("gui_g2_coverage", completions, examples, alpha)
    return [gui_g2_coverage_score(c, ex, alpha) for c, ex in zip(completions, examples)]


def _check_g1_weights(alpha: float = GUI_G1_ALPHA, beta: float = GUI_G1_BETA, **_) -> None:
    for name, w in (("alpha", alpha), ("beta", beta)):
        if not (isinstance(w, (int, float)) and not isinstance(w, bool) and 0 <= w < float("inf")):
            raise ValueError(f"gui_g1_box: {name} must be a finite non-negative number, got {w!r}")


@register_reward("gui_g1_box", check=_check_g1_weights)
def gui_g1_box(completions, examples, alpha: float = GUI_G1_ALPHA, beta: float = GUI_G1_BETA,
               normalize: bool = True) -> list:
    """GUI-G1 box-size-constrained reward: hit (the answer box's centre in ``ex["box"]``) +
    ``alpha`` IoU + ``beta`` R_box (the harmonic mean of the four edges' closeness
    1 - |error| / screen size); formula and constants: :func:`mmrl.measures.screen.gui_g1_box_reward`.
    The paper's sum lies in [0, 1 + alpha + beta] (1.375 by default, the exact box); with
    ``normalize`` (default) it is divided by 1 + alpha + beta so that, like every registered
    reward, it lies in [0, 1] (a positive rescaling: a reward weight of 1 + alpha + beta, or
    ``normalize=False``, gives the paper's scale). None when the answer holds no box (a bare
    click). Needs each example's screen size (``image_size`` or ``frame``): an example with a box
    but no size is a ValueError, not a silent None."""
    check_batch("gui_g1_box", completions, examples)
    _check_g1_weights(alpha, beta)
    for ex in examples:
        if isinstance(ex, dict) and ex.get("box") is not None and screen_size(ex) is None:
            raise ValueError("gui_g1_box: an example with a box has no screen size (image_size or frame), "
                             "which R_box normalises the edge errors by")
    scale = 1.0 / (1.0 + alpha + beta) if normalize else 1.0
    scores = [gui_g1_box_score(c, ex, alpha, beta) for c, ex in zip(completions, examples)]
    return [None if v is None else min(1.0, v * scale) if normalize else v for v in scores]
