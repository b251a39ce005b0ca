"""``motion`` / ``motion_strict``: whole-clip rewards for "a red circle moving left" prompts.

The checks (colour in every frame, shape, direction of travel, no step backwards) are
:func:`mmrl.measures.motion.motion_checks`. ``motion`` is the fraction passed (dense: the right
object standing still earns part of it, so RL sees the way towards the motion); ``motion_strict``
is 1 only when all pass, the binary score to report. They are declared ``media="video"``: a clip is
scored as a whole, since direction lives between frames (an image reward sees one frame at a time);
a still image is a 1-frame clip, which fails ``direction``. Per-frame image rewards (brightness,
CLIP score ...) combine with them in the same run.
"""

from __future__ import annotations

from typing import Any, Callable

from mmrl import register_reward
from mmrl.measures.batch import score_each
from mmrl.measures.motion import as_frames, motion_checks


def _scores(completions, examples, min_area, min_shift, reduce: Callable[[list[bool]], float], name: str) -> list:
    def score(clip, ex) -> Any:
        spec = ex.get("spec") if isinstance(ex, dict) else None
        try:
            frames = as_frames(clip) if spec is not None else []
        except ValueError:  # text, or anything that is not a clip or an image
            frames = []
        return reduce(list(motion_checks(frames, spec, min_area, min_shift).values())) if frames else None

    return score_each(name, completions, examples, score, items="clips")


@register_reward("motion", media="video")
def motion(completions, examples, min_area: float | None = None, min_shift: float | None = None) -> list:
    """Fraction of :func:`motion_checks` passed, in [0, 1]; None without ``ex["spec"]`` or for a
    completion that is neither a clip (frames, or an (F, 3, H, W) array) nor an image."""
    return _scores(completions, examples, min_area, min_shift, lambda c: sum(c) / len(c), "motion")


@register_reward("motion_strict", media="video")
def motion_strict(completions, examples, min_area: float | None = None, min_shift: float | None = None) -> list:
    """1.0 iff every motion check passes, else 0.0 (None as for ``motion``)."""
    return _scores(completions, examples, min_area, min_shift, lambda c: float(all(c)), "motion_strict")
