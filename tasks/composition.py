"""Text-to-image composition on synthetic shape scenes (the tiny generator's task).

Prompts such as "two red circles on the left" come from :mod:`mmrl.data.shapes_t2i`; the
``composition`` reward checks a generated image against the prompt's spec (colour, count, shape,
position: GenEval's checks, done programmatically because the scenes are flat shapes). Held-out
prompts: a fixed fifth of the prompt strings (by a stable hash) only ever appears in the eval
split, so the held-out reward measures generalisation to prompts RL never trained on.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from mmrl import Task, register_task
from mmrl.data.shapes_t2i import sample_spec, spec_prompt
from mmrl.measures.composition import composition_checks
from mmrl.media.draw import FOOTER, canvas, draw_label
from mmrl.task import held_out_prompt_examples


@register_task("composition")
class Composition(Task):
    modality = "diffusion"
    rewards = {"composition": 1.0}
    success_metric = "geneval_accuracy"

    def default_options(self):
        return {"train_size": 20000, "eval_size": 64, "max_groups": 1, "position_prob": 0.5, "max_count": 3}

    def examples(self, split: str):
        o = self.options

        def sample(rng):
            return sample_spec(rng, max_groups=o["max_groups"], position_prob=o["position_prob"], max_count=o["max_count"])

        sizes = {"train": o["train_size"], "eval": o["eval_size"]}
        return held_out_prompt_examples(self.name, split, sample, spec_prompt, sizes, {"train": 11, "eval": 12})

    def prompt(self, ex: dict) -> str:
        return ex["prompt"]

    def build_prompt(self, ex: dict) -> str:
        return self.prompt(ex)

    def metrics(self, completions: Sequence, examples: Sequence[dict]) -> dict[str, float]:
        """GenEval-style accuracy (every check passed) and the pass rate of each kind of check."""
        strict, kinds = [], {}
        for image, ex in zip(completions, examples):
            checks = composition_checks(image, ex["spec"])
            strict.append(all(checks.values()))
            for name, ok in checks.items():
                kinds.setdefault(name.rstrip("0123456789").rstrip("_"), []).append(ok)
        out = {"geneval_accuracy": float(np.mean(strict)) if strict else 0.0}
        out.update({f"check/{k}": float(np.mean(v)) for k, v in kinds.items()})
        return out

    def visualize(self, ex: dict, completion):
        if not hasattr(completion, "convert"):
            return None
        image, draw = canvas(completion, scale=4, footer=FOOTER)
        draw_label(draw, ex["prompt"])
        return image
