"""``composition`` / ``composition_strict``: GenEval-style rewards for the synthetic shape scenes.

The checks (colour, count, shape, position, no extra colour) are
:func:`mmrl.measures.composition.composition_checks`. ``composition`` is the fraction of checks
passed (a dense signal for RL: fixing one count is rewarded before the whole prompt is right);
``composition_strict`` is 1 only when all pass, GenEval's binary score, the one to report.
Both are image rewards (``media="image"``): a clip is checked frame by frame (:mod:`mmrl.media.clips`).
"""

from __future__ import annotations

from PIL import Image

from mmrl import register_reward
from mmrl.measures.batch import score_each
from mmrl.measures.composition import composition_checks


def _scores(completions, examples, min_area, reduce) -> list:
    def score(image, ex):
        spec = ex.get("spec") if isinstance(ex, dict) else None
        if spec is None or not isinstance(image, Image.Image):
            return None
        return reduce(list(composition_checks(image, spec, min_area).values()))

    return score_each("composition", completions, examples, score, items="images")


@register_reward("composition", media="image")
def composition(completions, examples, min_area: float | None = None) -> list:
    """Fraction of :func:`composition_checks` passed, in [0, 1]; None without ``ex["spec"]`` or
    for a completion that is not a PIL image."""
    return _scores(completions, examples, min_area, lambda c: sum(c) / len(c))


@register_reward("composition_strict", media="image")
def composition_strict(completions, examples, min_area: float | None = None) -> list:
    """1.0 iff every check passes (GenEval's binary per-prompt score), else 0.0."""
    return _scores(completions, examples, min_area, lambda c: float(all(c)))
