"""Group-level data selection on a scored rollout batch (``algo.selection``, a registry).

A selection is ``fn(generate, target_groups, max_num_gen_batches) -> (kept, generated, stats)``:
``generate(round)`` rolls out and scores one round of prompts.

DAPO dynamic sampling, from "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"
(Yu et al., 2025): a group whose samples all got the same reward has zero advantage under any
group-relative estimator, so it only dilutes the batch. Such groups are dropped and new prompts are
generated until the batch again holds ``target_groups`` groups with reward variance, or
``max_num_gen_batches`` generation rounds were spent (verl's name for the cap).
"""

from __future__ import annotations

from typing import Callable

import torch

from mmrl.registry import register_selection

from ..rollouts import Rollouts


def group_has_variance(rewards: torch.Tensor, group_ids: torch.Tensor) -> dict[int, bool]:
    """Group id -> whether its rewards are not all equal (a singleton group has no variance)."""
    out = {}
    for g in torch.unique(group_ids).tolist():
        r = rewards[group_ids == g]
        out[int(g)] = bool(r.numel() > 1 and (r.max() - r.min()) > 1e-12)
    return out


def keep_groups(batch: Rollouts, groups: list[int]) -> Rollouts:
    """The samples of ``groups``, in batch order (group ids unchanged)."""
    wanted = set(groups)
    rows = [i for i, g in enumerate(batch.group_ids.tolist()) if g in wanted]
    return batch.select(rows)


@register_selection("none")
def no_selection(generate: Callable[[int], Rollouts], target_groups: int, max_num_gen_batches: int
                 ) -> tuple[Rollouts, list[Rollouts], dict[str, float]]:
    """Train on the one generated batch as it is."""
    batch = generate(0)
    return batch, [batch], {}


@register_selection("dynamic_sampling")
def dynamic_sampling(
    generate: Callable[[int], Rollouts],
    target_groups: int,
    max_num_gen_batches: int,
) -> tuple[Rollouts, list[Rollouts], dict[str, float]]:
    """Run ``generate(round)`` (a scored batch: ``rewards`` set) for rounds 0, 1, ... keeping only
    groups with reward variance, until ``target_groups`` are kept or ``max_num_gen_batches``
    rounds ran (0 = no cap is refused: an all-solved task would loop forever).

    Returns ``(kept, generated, stats)``: ``kept`` holds the first ``target_groups`` kept groups
    (renumbered 0..k-1), ``generated`` every round's full batch (for logging the unfiltered reward
    and for samplers that learn from dropped groups too). When no group had variance in any
    round, ``kept`` is round 0's batch unchanged: its advantages are all zero, so the step moves
    only through KL/entropy terms, and ``selection/fallback`` says so.
    """
    if max_num_gen_batches < 1:
        raise ValueError(f"algo.max_num_gen_batches must be >= 1, got {max_num_gen_batches}")
    kept: list[Rollouts] = []
    generated: list[Rollouts] = []
    n_kept = dropped = 0
    for round in range(max_num_gen_batches):
        batch = generate(round)
        if batch.rewards is None:
            raise ValueError("dynamic_sampling: generate() must return a batch with rewards")
        generated.append(batch)
        variance = group_has_variance(batch.rewards, batch.group_ids)
        good = [g for g, v in variance.items() if v][: target_groups - n_kept]
        dropped += sum(1 for v in variance.values() if not v)
        if good:
            kept.append(keep_groups(batch, good))
            n_kept += len(good)
        if n_kept >= target_groups:
            break
    stats = {
        "selection/dropped_groups": float(dropped),
        "selection/kept_groups": float(n_kept),
        "selection/gen_batches": float(len(generated)),
        "selection/fallback": 0.0,
    }
    if not kept:
        stats["selection/fallback"] = 1.0
        return generated[0], generated, stats
    return _renumber(Rollouts.concat(kept)), generated, stats


def _renumber(batch: Rollouts) -> Rollouts:
    """Group ids 0..k-1 in order of first appearance."""
    mapping: dict[int, int] = {}
    ids = [mapping.setdefault(g, len(mapping)) for g in batch.group_ids.tolist()]
    batch.group_ids = torch.tensor(ids, dtype=torch.long)
    return batch
