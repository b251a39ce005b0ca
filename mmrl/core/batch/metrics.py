"""What a step reports of its rollouts, and what the prompt sampler learns from them."""

from __future__ import annotations

import torch

from ..episodes import episode_metrics
from ..rollouts import Rollouts
from .selection import group_has_variance


def rollout_metrics(first: Rollouts, reward_stats: dict[str, float], extra: dict[str, float]) -> dict[str, float]:
    """Reward metrics of the unfiltered first round (the honest estimate of the policy's reward):
    injected reference completions are reported apart (``reward/off_policy``). ``reward_stats``: the
    reward computer's, averaged over the step's scoring calls; ``extra``: the stages' metrics."""
    extra = dict(extra)
    if first.off_policy is not None and bool(first.off_policy.any()):
        extra["reward/off_policy"] = float(first.rewards[first.off_policy].mean())
        first = first.select((~first.off_policy).nonzero().flatten())
    lengths = first.action_mask.sum(1)
    variance = group_has_variance(first.rewards, first.group_ids)
    return {
        "reward": float(first.rewards.mean()),
        "reward_std": float(first.rewards.std()) if len(first) > 1 else 0.0,
        **{f"reward/{k}": float(v.mean()) for k, v in first.reward_components.items()},
        **reward_stats,
        "completion_length": float(lengths.mean()),
        "truncated_frac": float(first.truncated.float().mean()) if first.truncated is not None else 0.0,
        "zero_std_group_frac": sum(not v for v in variance.values()) / max(len(variance), 1),
        **episode_metrics(first),
        **extra,
    }


def observe(sampler, rounds: list[tuple[Rollouts, list[int]]], trained: Rollouts) -> dict[str, float]:
    """Let the prompt sampler learn from every generated group; groups left out of the trained
    batch (dynamic sampling) count with advantage 0, which is what they would have had."""
    trained_adv: dict[int, list[float]] = {}
    adv = trained.advantages if trained.advantages.dim() == 1 else trained.advantages.mean(-1)
    for i, ex in enumerate(trained.examples):
        trained_adv.setdefault(ex["_index"], []).append(float(adv[i]))
    metrics: dict[str, float] = {}
    for batch, indices in rounds:
        advantages = torch.zeros(len(batch))
        seen: dict[int, int] = {}
        for i, ex in enumerate(batch.examples):
            values = trained_adv.get(ex["_index"])
            j = seen.get(ex["_index"], 0)
            if values and j < len(values):
                advantages[i] = values[j]
            seen[ex["_index"]] = j + 1
        metrics = sampler.observe(indices, batch.rewards, advantages, batch.group_ids, batch.completions)
    return metrics
