"""Scoring a generated batch: the rewards, plus DAPO's soft overlong penalty, and the reward
computer's stats (unparsable fractions) accumulated over the step's scoring calls.

Rewards computed elsewhere (a reward service) are sent as soon as the samples exist and awaited
only after the trainer's log-prob passes (``meanwhile``); ``reward_wait_time`` is the seconds the
step spent in the reward computer beyond those passes (in process: the whole reward computation)."""

from __future__ import annotations

import time
from typing import Callable, Optional

from ..rollouts import Rollouts
from .shaping import soft_overlong_penalty


class StepScorer:
    """Scores batches with ``rewards`` (a reward computer); ``max_actions`` is the policy's length
    limit, ``buffer`` / ``penalty`` ``algo.soft_overlong_buffer`` / ``algo.soft_overlong_penalty``
    (buffer 0: no penalty). :meth:`start` begins a step's stats."""

    def __init__(self, rewards, max_actions: int, buffer: int, penalty: float):
        self.rewards, self.max_actions, self.buffer, self.penalty = rewards, max_actions, buffer, penalty
        self.start()

    def start(self) -> None:
        self.stats: dict[str, float] = {}
        self.calls = 0
        self.wait = 0.0  # seconds spent waiting for rewards this step

    def __call__(self, batch: Rollouts, meanwhile: Optional[Callable[[], object]] = None) -> Rollouts:
        """``batch`` with its rewards and reward components set (in place); ``meanwhile`` (the
        trainer's log-prob passes) runs after the rewards are started and before they are awaited."""
        began = time.perf_counter()
        pending = self.rewards.start(batch.completions, batch.examples, group_ids=batch.group_ids)
        self.wait += time.perf_counter() - began
        if meanwhile is not None:
            meanwhile()
        began = time.perf_counter()
        total, comps, stats = pending.result()
        self.wait += time.perf_counter() - began
        if self.buffer:
            comps["overlong_penalty"] = soft_overlong_penalty(batch.action_mask.sum(1), self.max_actions,
                                                              self.buffer, self.penalty)
            if batch.off_policy is not None:  # a reference completion is never penalised for length
                comps["overlong_penalty"] = comps["overlong_penalty"] * (~batch.off_policy).float()
            total = total + comps["overlong_penalty"]
        batch.rewards, batch.reward_components = total, comps
        for k, v in stats.items():
            self.stats[k] = self.stats.get(k, 0.0) + v
        self.calls += 1
        return batch

    def mean_stats(self) -> dict[str, float]:
        """The step's reward stats, each the mean over its scoring calls, and ``reward_wait_time``
        (this process's sum)."""
        return {**{k: v / max(self.calls, 1) for k, v in self.stats.items()}, "reward_wait_time": self.wait}


def complete_logps(batch: Rollouts, policy, need_old: bool, need_ref: bool, correct_engine: bool) -> Rollouts:
    """``batch`` with the trainer's log-probs the objective needs that the rollout did not give
    (in place): the old ones for several iterations (``need_old``) or to correct a rollout engine's
    own log-probs (``correct_engine``: ``algo.vllm_importance_sampling_correction``), the
    reference's for a KL term (``need_ref``). Called after the rollout (the on-policy loop) or when
    an asynchronous batch is trained (:mod:`mmrl.core.async_rollouts`: with the weights of then).
    A policy that cannot re-score a batch (no ``scoring`` capability: the generator's log-probs
    come from its SDE trajectory, its reference inside the loss) gave what it has in the rollout."""
    if not len(batch) or "scoring" not in policy.capabilities:
        return batch
    if batch.old_logps is None and (need_old or (correct_engine and batch.rollout_logps is not None)):
        batch.old_logps = policy.score(batch, reference=False)
    if need_ref and batch.ref_logps is None:
        batch.ref_logps = policy.score(batch, reference=True)
    return batch
