"""Re-rolling groups that carry no learning signal: Scaf-GRPO hints and difficulty-aware augmentation.

Both act on a scored on-policy batch, inside the step, before advantages are computed:

- :func:`scaffold` ("Scaf-GRPO: Scaffolded Group Relative Policy Optimization for Enhancing LLM
  Reasoning", Zhang et al., 2025). A group where no sample solved the prompt has zero advantage
  (the "learning cliff"). After a guidance-exemption period, such a prompt is re-rolled with
  in-prompt hints of rising tiers (knowledge -> planning -> solution: ``Task.hints``); at the
  first tier where a hinted sample solves it, that sample replaces one failed sample of the
  group. The hinted sample keeps its hinted prompt, so its log-probs are the policy's own
  (on-policy under the hinted prompt), unlike prefix-guidance methods.
- :func:`augment_flat_groups` ("DeepVideo-R1: Video Reinforcement Fine-Tuning via
  Difficulty-aware Regressive GRPO", Park et al., 2025). A group that is all solved is made
  harder (``Task.augment(ex, "harder")``: e.g. noise on the visual input); one that is all
  failed is made easier (``"easier"``: a reasoning cue). The augmented prompt is re-rolled and
  replaces the group when its rewards now vary. DeepVideo-R1 pairs this with Reg-GRPO
  (``algo.loss_type=reg_grpo``); here it works with any objective.

``regenerate(examples, n)`` is the trainer's "roll out and score these examples, ``n`` samples
each" (group i = ``examples[i]``); ``solved(rewards)`` says which samples count as solved.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from ..rollouts import Rollouts
from .selection import group_has_variance

Regenerate = Callable[[Sequence[dict], int], Rollouts]


def _rows_by_group(batch: Rollouts) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, g in enumerate(batch.group_ids.tolist()):
        out.setdefault(int(g), []).append(i)
    return out


def _assemble(batch: Rollouts, drop_rows: set[int], additions: list[Rollouts]) -> Rollouts:
    """``batch`` without ``drop_rows``, plus ``additions`` whose group ids already name groups
    of ``batch``."""
    keep = batch.select([i for i in range(len(batch)) if i not in drop_rows])
    return Rollouts.concat([keep, *additions], renumber_groups=False)


def scaffold(
    batch: Rollouts,
    solved: Callable[[torch.Tensor], torch.Tensor],
    hints_for: Callable[[dict], list[str]],
    regenerate: Regenerate,
    num_samples: int,
) -> tuple[Rollouts, dict[str, float]]:
    """Scaf-GRPO's hint loop over the groups of ``batch`` with no solved sample (module doc).

    Tier t re-rolls every still-failing group that has a t-th hint (``num_samples`` samples per
    group, hint in ``ex["hint"]``); a group leaves the loop at its first solved hinted sample,
    which replaces the group's last sample. Returns the new batch and counts per tier.
    """
    rows = _rows_by_group(batch)
    ok = solved(batch.rewards)
    failing = [g for g, r in rows.items() if not bool(ok[r].any())]
    stats = {"scaffold/failing_groups": float(len(failing)), "scaffold/rescued_groups": 0.0}
    pending = {g: hints_for(batch.examples[rows[g][0]]) for g in failing}
    pending = {g: h for g, h in pending.items() if h}
    drop: set[int] = set()
    additions: list[Rollouts] = []
    tier = 0
    while pending:
        groups = [g for g, h in pending.items() if tier < len(h)]
        if not groups:
            break
        examples = [{**batch.examples[rows[g][0]], "hint": pending[g][tier]} for g in groups]
        hinted = regenerate(examples, num_samples)
        hinted_ok = solved(hinted.rewards)
        rescued = 0
        for i, g in enumerate(groups):
            hit = [r for r in (hinted.group_ids == i).nonzero().flatten().tolist() if hinted_ok[r]]
            if hit:
                sample = hinted.select([hit[0]])
                sample.group_ids = torch.tensor([g])
                additions.append(sample)
                drop.add(rows[g][-1])
                del pending[g]
                rescued += 1
        stats[f"scaffold/rescued_tier{tier + 1}"] = float(rescued)
        stats["scaffold/rescued_groups"] += rescued
        pending = {g: h for g, h in pending.items() if tier + 1 < len(h)}
        tier += 1
    if not additions:
        return batch, stats
    return _assemble(batch, drop, additions), stats


def augment_flat_groups(
    batch: Rollouts,
    solved: Callable[[torch.Tensor], torch.Tensor],
    augment: Callable[[dict, str], Optional[dict]],
    regenerate: Regenerate,
    num_samples: int,
) -> tuple[Rollouts, dict[str, float]]:
    """DeepVideo-R1's difficulty-aware augmentation of the zero-variance groups (module doc).

    All-solved groups get ``augment(ex, "harder")``, all-failed ones ``augment(ex, "easier")``
    (``None`` = no augmentation for this example); the augmented groups are re-rolled together
    and each replaces its original group when its rewards vary.
    """
    rows = _rows_by_group(batch)
    variance = group_has_variance(batch.rewards, batch.group_ids)
    ok = solved(batch.rewards)
    todo: list[tuple[int, str, dict]] = []
    for g, r in rows.items():
        if variance[g]:
            continue
        direction = "harder" if bool(ok[r].all()) else ("easier" if not bool(ok[r].any()) else None)
        new = augment(batch.examples[r[0]], direction) if direction else None
        if new is not None:
            todo.append((g, direction, new))
    stats = {"augment/harder": float(sum(d == "harder" for _, d, _ in todo)),
             "augment/easier": float(sum(d == "easier" for _, d, _ in todo)),
             "augment/replaced_groups": 0.0}
    if not todo:
        return batch, stats
    rerolled = regenerate([ex for _, _, ex in todo], num_samples)
    rerolled_variance = group_has_variance(rerolled.rewards, rerolled.group_ids)
    drop: set[int] = set()
    additions: list[Rollouts] = []
    for i, (g, _, _) in enumerate(todo):
        if rerolled_variance.get(i):
            part = rerolled.select((rerolled.group_ids == i).nonzero().flatten())
            part.group_ids = torch.full((len(part),), g, dtype=torch.long)
            additions.append(part)
            drop.update(rows[g])
    stats["augment/replaced_groups"] = float(len(additions))
    if not additions:
        return batch, stats
    return _assemble(batch, drop, additions), stats
