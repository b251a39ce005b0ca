"""``data.sampler=weighted``: each prompt's data source drawn by weight, then one of its examples.

The share each source gets of the batches is set by the user, as ``datasets.interleave_datasets``'
``probabilities`` set it (LLaMA-Factory's ``interleave_probs``, ms-swift's per-dataset counts), not
by the sources' sizes as in the uniform sampler's epochs. Both draws are with replacement, from one
``random.Random(train.seed)`` whose state the run's checkpoints keep, so a resumed run draws what
the uninterrupted one would have. The tiny models' SFT warm starts use it over a task mixture
(counting-heavy, :data:`mmrl.vlm.tiny_tasks.DEFAULT_TINY_TASKS`).
"""

from __future__ import annotations

import random
from typing import Any, Mapping

from mmrl.config import ConfigError
from mmrl.registry import register_sampler

from .prompts import PromptSampler


@register_sampler("weighted")
class WeightedSourceSampler(PromptSampler):
    """``weights``: source name -> weight (``data.sampler_kwargs.weights``; a source it omits
    weighs 1, so no weights at all is a uniform draw over the sources). For each prompt a source s
    is drawn with probability ``w_s / sum(w)`` (``random.choices``), then an example of s uniformly
    (``randrange``). A source of weight 0 is never drawn."""

    def __init__(self, sizes, batch, seed, weights: Mapping[str, float] | None = None):
        super().__init__(sizes, batch, seed)
        weights = dict(weights or {})
        unknown = sorted(set(weights) - set(self.sizes))
        if unknown:
            raise ConfigError(f"data.sampler_kwargs.weights: no data source named {', '.join(map(str, unknown))} "
                              f"(the task's sources: {', '.join(self.sizes)})")
        self.names = list(self.sizes)
        self.weights = [float(weights.get(name, 1.0)) for name in self.names]
        if any(w < 0 for w in self.weights) or not any(w > 0 and self.sizes[n] for w, n in zip(self.weights, self.names)):
            raise ConfigError(f"data.sampler_kwargs.weights: weights must be >= 0 and some source with examples "
                              f"must weigh more than 0 (got {dict(zip(self.names, self.weights))})")
        self.rng = random.Random(seed)

    def indices(self, step: int, round: int = 0) -> list[int]:
        if round > 0:
            return self.refill_indices(step, round, self.batch)
        out = []
        for _ in range(self.batch):
            name = self.names[self.rng.choices(range(len(self.names)), self.weights)[0]]
            out.append(self.offsets[name] + self.rng.randrange(self.sizes[name]))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "rng" in state:
            version, internal, gauss = state["rng"]
            self.rng.setstate((version, tuple(internal), gauss))
