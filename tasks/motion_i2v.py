"""Image-to-video motion on synthetic clips: "a red circle moving left" with the clip's true first frame given.

The examples are ``motion_t2v``'s (the same 32 prompts, the same held-out fifth by a stable hash)
plus ``first_frame``, the first frame of a clip rendered for the spec (:func:`mmrl.data.motion_t2v.render_clip`:
the shape in its starting cell); ``prompt(ex)`` is a :class:`mmrl.GenerationPrompt` of the text and
that frame, which an image-to-video generator (``model.path=tiny-i2v``, a Wan I2V checkpoint) takes as
its first frame. The reward and metrics are the text-to-video task's (``motion``: colour in every
frame, shape, direction, steadiness). The first frame fixes where the object starts (at 4 frames on a
4-cell grid, on the edge it moves away from), so it tells part of the direction; the prompt tells the rest.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from mmrl import GenerationPrompt, Task, register_task
from mmrl.data.motion_t2v import motion_prompt, render_clip, sample_motion_spec
from mmrl.data.sequence import LazySequence
from mmrl.measures.motion import motion_metrics, motion_strip
from mmrl.task import held_out_prompt_examples

SEEDS = {"train": 31, "eval": 32}


class WithFirstFrames(LazySequence):
    """``{"spec", "prompt"}`` examples with ``first_frame``: a clip of the spec rendered by seed
    ``[split seed, index]`` (deterministic), its first frame."""

    def __init__(self, examples: Sequence[dict], seed: int):
        self.examples = examples
        self.seed = seed

    def __len__(self) -> int:
        return len(self.examples)

    def item(self, i: int) -> dict:
        ex = self.examples[i]
        return {**ex, "first_frame": render_clip(ex["spec"], np.random.default_rng([self.seed, i]))[0]}


@register_task("motion_i2v")
class MotionI2V(Task):
    modality = "diffusion"
    rewards = {"motion": 1.0}
    success_metric = "motion_accuracy"

    def default_options(self):
        return {"train_size": 20000, "eval_size": 64}

    def examples(self, split: str):
        sizes = {"train": self.options["train_size"], "eval": self.options["eval_size"]}
        base = held_out_prompt_examples(self.name, split, sample_motion_spec, motion_prompt, sizes, SEEDS)
        return WithFirstFrames(base, SEEDS[split])

    def prompt(self, ex: dict) -> GenerationPrompt:
        return GenerationPrompt(ex["prompt"], ex["first_frame"])

    def build_prompt(self, ex: dict) -> GenerationPrompt:
        return self.prompt(ex)

    def metrics(self, completions: Sequence, examples: Sequence[dict]) -> dict[str, float]:
        """``motion_accuracy`` (every check passed) and the pass rate of each check."""
        return motion_metrics(completions, [ex["spec"] for ex in examples])

    def visualize(self, ex: dict, completion):
        """The frames side by side, the given first frame framed in blue and marked "given", the
        tracked centroids (green: the direction check passed), the prompt below."""
        return motion_strip(completion, ex["spec"], ex["prompt"], given_first=True)
