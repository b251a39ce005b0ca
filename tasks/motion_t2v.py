"""Text-to-video motion on synthetic clips: "a red circle moving left" (the tiny video generator's task).

Prompts come from :mod:`mmrl.data.motion_t2v`; the ``motion`` reward checks a generated clip
against the prompt's spec (colour, shape, direction, steadiness:
:func:`mmrl.measures.motion.motion_checks`, GenEval-style checks tracked over frames). There are
only 4 colours x 2 shapes x 4 directions = 32 prompts; a fixed fifth of them by a stable hash
(:func:`mmrl.task.is_held_out`, 6 prompts) appears only in the eval split, so the held-out score
measures new combinations of colour, shape and direction that RL never trained on.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from mmrl import Task, register_task
from mmrl.data.motion_t2v import motion_prompt, sample_motion_spec
from mmrl.measures.motion import CHECKS, as_frames, motion_checks, track_object
from mmrl.media.draw import FOOTER, PRED, TRUE, draw_label, frame_strip
from mmrl.task import held_out_prompt_examples

VIS_SCALE = 6  # a 16-px frame -> 96 px
MAX_SHOWN = 8


def _checks(completion, spec: dict) -> dict[str, bool]:
    """The checks of one completion; all failed for one that is not a clip or an image."""
    try:
        return motion_checks(completion, spec)
    except ValueError:
        return dict.fromkeys(CHECKS, False)


@register_task("motion_t2v")
class MotionT2V(Task):
    modality = "diffusion"
    rewards = {"motion": 1.0}
    success_metric = "motion_accuracy"

    def default_options(self):
        return {"train_size": 20000, "eval_size": 64}

    def examples(self, split: str):
        sizes = {"train": self.options["train_size"], "eval": self.options["eval_size"]}
        return held_out_prompt_examples(self.name, split, sample_motion_spec, motion_prompt, sizes,
                                        {"train": 21, "eval": 22})

    def prompt(self, ex: dict) -> str:
        return ex["prompt"]

    def build_prompt(self, ex: dict) -> str:
        return self.prompt(ex)

    def metrics(self, completions: Sequence, examples: Sequence[dict]) -> dict[str, float]:
        """``motion_accuracy`` (every check passed) and the pass rate of each check."""
        results = [_checks(c, ex["spec"]) for c, ex in zip(completions, examples)]
        out = {"motion_accuracy": float(np.mean([all(r.values()) for r in results])) if results else 0.0}
        out.update({f"check/{k}": float(np.mean([r[k] for r in results])) if results else 0.0 for k in CHECKS})
        return out

    def visualize(self, ex: dict, completion):
        """The frames side by side, the tracked centroids as dots joined by a line (green when the
        direction check passes, red otherwise), the prompt below."""
        try:
            frames = as_frames(completion)
        except ValueError:
            return None
        if not frames:
            return None
        ok = _checks(frames, ex["spec"])["direction"]
        if len(frames) > MAX_SHOWN:  # the frames a strip shows, tracked on those
            frames = [frames[round(i * (len(frames) - 1) / (MAX_SHOWN - 1))] for i in range(MAX_SHOWN)]
        image, draw = frame_strip(frames, scale=VIS_SCALE, max_frames=MAX_SHOWN, footer=FOOTER)
        pitch = frames[0].size[0] * VIS_SCALE + 2  # frame_strip's frame width plus its 2-px gap
        points = [(i * pitch + o["cx"] * VIS_SCALE, o["cy"] * VIS_SCALE)
                  for i, o in enumerate(track_object(frames, ex["spec"]["color"])) if o is not None]
        color = TRUE if ok else PRED
        if len(points) > 1:
            draw.line(points, fill=color, width=2)
        for x, y in points:
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=color, outline=(0, 0, 0))
        draw_label(draw, ex["prompt"])
        return image
