"""Screen grounding rewards: ``click_accuracy``, ``gui_g2_point``, ``gui_g2_coverage``.

A click answer ("click the Wi-Fi toggle" -> ``<answer>(x, y)</answer>``) is scored against the
element's ``box`` (original pixels) after converting it from the policy's coordinate space
(``ex["pred_space"]``/``ex["frame"]``, recorded by the trainer; see ``mmrl.media.coords``), so a
Qwen2.5-VL click in resized pixels and a Qwen3-VL click in 0-1000 score alike. Only the
``<answer>`` block counts. Formulas and the sigma constant: :mod:`mmrl.measures.screen`. Box
answers' overlap is the ``iou`` reward.
"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.measures.screen import ALPHA, click_score, gui_g2_coverage_score, gui_g2_point_score


def _check_call(name, completions, examples, alpha: float = ALPHA) -> None:
    if len(completions) != len(examples):
        raise ValueError(f"{name}: {len(completions)} completions for {len(examples)} examples")
    if not (isinstance(alpha, (int, float)) and alpha > 0):
        raise ValueError(f"{name}: alpha (sigma / element size) must be a positive number, got {alpha!r}")


@register_reward("click_accuracy")
def click_accuracy(completions, examples, **ctx) -> list:
    """1 if the answer's click (a box answer: its centre) is inside ``ex["box"]``, else 0 (the
    ScreenSpot criterion); None when the answer holds no point."""
    _check_call("click_accuracy", completions, examples)
    return [click_score(c, ex) for c, ex in zip(completions, examples)]


@register_reward("gui_g2_point")
def gui_g2_point(completions, examples, alpha: float = ALPHA, **ctx) -> list:
    """GUI-G² Gaussian point reward in (0, 1]: 1 at the element's centre, exp(-1/2) one sigma
    (``alpha`` x the element's width) off along x; None when the answer holds no point."""
    _check_call("gui_g2_point", completions, examples, alpha)
    return [gui_g2_point_score(c, ex, alpha) for c, ex in zip(completions, examples)]


@register_reward("gui_g2_coverage")
def gui_g2_coverage(completions, examples, alpha: float = ALPHA, **ctx) -> list:
    """GUI-G² Gaussian coverage reward in [0, 1]: the Bhattacharyya coefficient of the answer
    box's Gaussian and the element's; None when the answer holds no box (a bare click)."""
    _check_call("gui_g2_coverage", completions, examples, alpha)
    return [gui_g2_coverage_score(c, ex, alpha) for c, ex in zip(completions, examples)]
