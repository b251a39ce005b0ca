"""Reference completions injected into the groups as off-policy samples (``algo.off_policy_guidance``).

From "TempSamp-R1: Effective Temporal Sampling with Reinforcement Fine-Tuning for Video LLMs": each
group of ``n - k`` on-policy samples is completed by ``k`` reference completions (``Task.target``),
teacher-forced by the policy (capability ``teacher_forcing``: ``policy.rollout_given``) and marked
``off_policy``, so the objective can weight them by its off-policy shaping.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..rollouts import Rollouts


def check_references(k: int, n: int, policy) -> None:
    """Setup-time check: ``k`` references leave at least one on-policy sample of ``n``, and the
    policy can teacher-force given completions."""
    if not 0 <= k < n:
        raise ValueError(f"algo.off_policy_guidance={k} reference completions per group must leave "
                         f"at least one on-policy sample of rollout.num_generations={n}")
    if k and "teacher_forcing" not in policy.capabilities:
        raise ValueError(f"algo.off_policy_guidance needs a policy that teacher-forces given completions; "
                         f"a {type(policy).__name__} does not")


def with_references(batch: Rollouts, examples: Sequence[dict], k: int, policy, task,
                    score: Callable[[Rollouts], Rollouts], need_old_logps: bool, need_ref_logps: bool) -> Rollouts:
    """``batch`` (group i = ``examples[i]``) with ``k`` reference completions of each example
    appended to its group, scored by ``score``; ``batch.off_policy`` marks them."""
    refs = [ex for ex in examples for _ in range(k)]
    given = policy.rollout_given(refs, [task.build_prompt(ex) for ex in refs], [task.target(ex) for ex in refs],
                                 need_old_logps=need_old_logps, need_ref_logps=need_ref_logps)
    given.group_ids = torch.arange(len(examples)).repeat_interleave(k)
    if batch.off_policy is None:
        batch.off_policy = torch.zeros(len(batch), dtype=torch.bool)
    return Rollouts.concat([batch, score(given)], renumber_groups=False)
