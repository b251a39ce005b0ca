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

from mmrl import Task, register_task
from mmrl.data.motion_t2v import motion_prompt, sample_motion_spec
from mmrl.measures.motion import motion_metrics, motion_strip
from mmrl.task import held_out_prompt_examples


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
        return motion_metrics(completions, [ex["spec"] for ex in examples])

    def visualize(self, ex: dict, completion):
        """The frames side by side, the tracked centroids as dots joined by a line (green when the
        direction check passes, red otherwise), the prompt below."""
        return motion_strip(completion, ex["spec"], ex["prompt"])
