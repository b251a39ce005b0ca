"""The advantage stage: reward aggregation, then the configured estimator with the inputs it declared.

An estimator declares the extra inputs it reads at registration (``register_advantage(inputs=...)``);
each is computed here from the batch by the function :data:`ESTIMATOR_INPUTS` names it after, or left
out when the batch has none (None). An input the table does not know stops the run at setup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..advantages import compute_advantages
from ..rollouts import Rollouts
from .aggregation import aggregate_rewards


@dataclass
class RunFacts:
    """What the estimator inputs read besides the batch."""

    reward_weights: dict[str, float]  # reward name -> weight
    source_ids: dict[str, int]  # data source -> id (a mixture's tasks; one source otherwise)
    policy_kl: float | None = None  # KL(pi_old || pi_new) of the last update, when tracked


def lengths(batch: Rollouts, facts: RunFacts) -> torch.Tensor:
    """Actions per sample (Dr. GRPO-style length-aware estimators)."""
    return batch.action_mask.sum(1)


def prompt_keys(batch: Rollouts, facts: RunFacts) -> list[str]:
    """SPO's per-prompt value tracker keys on the example's index in its split."""
    return [str(ex["_index"]) for ex in batch.examples]


def task_ids(batch: Rollouts, facts: RunFacts) -> torch.Tensor | None:
    """Stratified GRPO's strata: the examples' data sources (a mixture's tasks); None for one source."""
    if len(facts.source_ids) < 2:
        return None
    return torch.tensor([facts.source_ids[ex["source"]] for ex in batch.examples])


def r_max(batch: Rollouts, facts: RunFacts) -> float:
    """The best total reward: rewards lie in [0, 1], so the sum of the positive weights."""
    return float(sum(w for w in facts.reward_weights.values() if w > 0))


def policy_kl(batch: Rollouts, facts: RunFacts) -> float | None:
    """SPO's KL-adaptive forgetting: KL(pi_old || pi_new) of the last update."""
    return facts.policy_kl


def _episodic(batch: Rollouts) -> bool:
    return bool(batch.examples) and "episode_id" in batch.examples[0]


def episode_ids(batch: Rollouts, facts: RunFacts) -> torch.Tensor | None:
    """The episode of each row of an environment task, unique across the gathered batch (a rank's,
    or a refill round's, episode ids restart at 0)."""
    if not _episodic(batch):
        return None
    keys = list(zip(batch.group_ids.tolist(), (ex["episode_id"] for ex in batch.examples)))
    ids = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    return torch.tensor([ids[k] for k in keys])


def step_indices(batch: Rollouts, facts: RunFacts) -> torch.Tensor | None:
    """Each row's step in its episode (0, 1, ...)."""
    return torch.tensor([ex["step_index"] for ex in batch.examples]) if _episodic(batch) else None


def anchor_keys(batch: Rollouts, facts: RunFacts) -> list | None:
    """GiGPO's anchor states: the state each row acted from."""
    return [ex["anchor_key"] for ex in batch.examples] if _episodic(batch) else None


ESTIMATOR_INPUTS: dict[str, Callable[[Rollouts, RunFacts], Any]] = {
    fn.__name__: fn for fn in (lengths, prompt_keys, task_ids, r_max, policy_kl, episode_ids, step_indices, anchor_keys)
}


def check_estimator_inputs(advantage: str, inputs, options: dict[str, Any]) -> None:
    """Setup-time check: every input the estimator declared is in the table (or given as an option)."""
    unknown = [name for name in inputs if name not in ESTIMATOR_INPUTS and name not in options]
    if unknown:
        raise ValueError(f"advantage estimator {advantage!r} needs input(s) {unknown}, which the trainer does "
                         f"not provide (known: {', '.join(ESTIMATOR_INPUTS)})")


def batch_advantages(batch: Rollouts, advantage: str, aggregation: str, inputs, options: dict[str, Any],
                     state: Any, facts: RunFacts) -> torch.Tensor:
    """The estimator ``advantage`` on ``batch``'s rewards (``aggregation`` other than
    ``weighted_sum``: re-aggregated from the components), with ``options`` (``algo.advantage_kwargs``),
    the declared ``inputs`` the batch has, and the estimator's ``state`` (None: stateless)."""
    signal = batch.rewards
    if aggregation != "weighted_sum":
        weights = dict(facts.reward_weights)
        if "overlong_penalty" in batch.reward_components:
            weights["overlong_penalty"] = 1.0
        signal = aggregate_rewards(batch.reward_components, weights, aggregation, group_ids=batch.group_ids)
    extra = dict(options)
    for name in inputs:
        if name not in extra and (value := ESTIMATOR_INPUTS[name](batch, facts)) is not None:
            extra[name] = value
    if state is not None:
        extra["state"] = state
    return compute_advantages(advantage, signal, batch.group_ids, **extra)
