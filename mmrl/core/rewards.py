"""Score completions with a weighted set of registered rewards, without ever crashing the run.

A reward may return ``None`` for text it cannot parse, or raise on inputs its author did not
foresee; both score the reward's declared minimum and are counted, so a run on a 100k-example
dataset is never killed by one odd completion, and the counts show when a reward is misbehaving.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import torch

from ..registry import REWARDS

log = logging.getLogger(__name__)


class RewardComputer:
    """``weights``: reward name -> weight; ``reward_kwargs``: name -> extra keyword arguments."""

    def __init__(self, weights: dict[str, float], reward_kwargs: dict[str, dict] | None = None):
        if not weights:
            raise ValueError("no rewards configured: set task.rewards (name: weight) or give the task defaults")
        self.weights = dict(weights)
        self.kwargs = {k: dict(v) for k, v in (reward_kwargs or {}).items()}
        unknown = set(self.kwargs) - set(self.weights)
        if unknown:
            raise ValueError(f"task.reward_kwargs names rewards that are not used: {sorted(unknown)}")
        self.fns = {name: REWARDS.get(name) for name in self.weights}

    def __call__(self, completions: Sequence[str], examples: Sequence[dict], **ctx: Any):
        """Returns ``(total (N,), {name: (N,)}, stats)`` where stats counts unparsable/errors."""
        n = len(completions)
        components: dict[str, torch.Tensor] = {}
        stats: dict[str, float] = {}
        total = torch.zeros(n)
        for name, fn in self.fns.items():
            minimum = float(getattr(fn, "reward_minimum", 0.0))
            try:
                raw = list(fn(list(completions), list(examples), **{**ctx, **self.kwargs.get(name, {})}))
                if len(raw) != n:
                    raise ValueError(f"reward {name!r} returned {len(raw)} scores for {n} completions")
                errors = 0
            except Exception as exc:  # a broken reward must not kill a long run
                log.warning("reward %r raised %s: %s; scoring the batch at its minimum", name, type(exc).__name__, exc)
                raw, errors = [None] * n, n
            unparsable = sum(1 for r in raw if r is None or not math.isfinite(float(r)))
            scores = torch.tensor([minimum if r is None or not math.isfinite(float(r)) else float(r) for r in raw])
            components[name] = scores
            total += self.weights[name] * scores
            stats[f"reward/{name}/unparsable_frac"] = (unparsable - errors) / max(n, 1)
            if errors:
                stats[f"reward/{name}/errors"] = float(errors)
        return total, components, stats
