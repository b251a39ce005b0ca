"""The whole step's batch, seen from every rank: what estimators, metrics and prompt samplers
need of all ranks' samples, gathered once per step.

Each rank rolls out whole groups, so group statistics are already exact locally; but batch-level
estimators (REINFORCE++ / SPO whitening, BNPO's Beta fit, SPO's tracker), the reward metrics and
the samplers' feedback read the whole batch. Only light per-sample values travel (rewards and
their components, action masks, group ids, text completions, and of each example its declared
keys, :class:`~mmrl.core.example.Example`, that hold plain data: so the rows of an episode keep
what the episode estimators and the episode and tool-use metrics read), never media or log-probs;
every rank then computes the same advantages and keeps the rows of its own samples.
Concatenating the ranks' parts in rank order gives the order one process would have had, since
each rank holds a contiguous block of the step's prompts.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from .. import distributed as dist
from ..example import SHARED_KEYS
from ..rollouts import Rollouts

# Generation stats that are counts over the whole batch (summed over ranks: a rollout server's
# requests, retries and errors are each rank's own, its weight pushes rank 0's); the others are
# averaged, ``selection/gen_batches`` takes the most rounds any rank needed and the weight sync time
# the longest any rank spent in it (rank 0 pushing, the others waiting for it).
SUMMED = ("selection/dropped_groups", "selection/kept_groups", "rollout_timeouts", "rollout/server_requests",
          "rollout/server_retries", "rollout/server_errors", "rollout/weight_pushes")
MAXED = ("selection/gen_batches", "rollout/weight_sync_time")


@dataclass
class WholeBatch:
    trained: Rollouts  # every rank's trained batch (light), in rank order
    rounds: list[tuple[Rollouts, list[int]]]  # generation round r of every rank, with its prompt indices
    extra: dict[str, float]
    reward_stats: dict[str, float]
    reward_calls: int
    start: int = 0  # this rank's rows of ``trained``
    stop: int = 0


def light(batch: Rollouts, task_keys: tuple[str, ...] = ()) -> Rollouts:
    """What the estimators, metrics and samplers read of ``batch``: of each example its declared
    keys (``SHARED_KEYS``) and ``task_keys`` (those an episodic task's training metrics read,
    :attr:`~mmrl.core.episodes.EpisodicTask.metric_keys`) whose values are plain data (:func:`plain`). What stays on the rank: the
    payload, the log-probs and, of the declared keys, the example's media, a tool trajectory's
    conversation (``tool_turns``: its observations hold the tools' images) and an environment's
    task spec when it is an object rather than data; nothing after the rollout reads them."""
    return Rollouts(
        group_ids=batch.group_ids, action_mask=batch.action_mask, rewards=batch.rewards,
        reward_components=dict(batch.reward_components),
        completions=[c if isinstance(c, str) else None for c in batch.completions],
        examples=[{k: v for k, v in ex.items() if (k in SHARED_KEYS or k in task_keys) and plain(v)}
                  for ex in batch.examples],
        truncated=batch.truncated, off_policy=batch.off_policy,
    )


def plain(value: Any) -> bool:
    """Whether ``value`` is plain data (None, text, a number, or lists and dicts of them), which
    crosses ranks cheaply, unlike an image, a tensor or another object."""
    if value is None or isinstance(value, (str, numbers.Number)):
        return True
    if isinstance(value, (list, tuple)):
        return all(plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and plain(v) for k, v in value.items())
    return False


def gather_whole(trained: Rollouts, rounds: list[tuple[Rollouts, list[int]]], extra: dict[str, float],
                 reward_stats: dict[str, float], reward_calls: int, task_keys: tuple[str, ...] = ()) -> WholeBatch:
    """The :class:`WholeBatch` of this step; in one process, the local objects themselves.
    ``task_keys``: example keys of the task's own that also cross ranks (see :func:`light`)."""
    if dist.world_size() == 1:
        return WholeBatch(trained, rounds, extra, reward_stats, reward_calls, 0, len(trained))
    parts = dist.gather((light(trained, task_keys), [(light(b, task_keys), list(i)) for b, i in rounds], dict(extra),
                         dict(reward_stats), reward_calls))
    sizes = [len(p[0]) for p in parts]
    start = sum(sizes[:dist.rank()])
    whole_rounds = []
    for r in range(max(len(p[1]) for p in parts)):
        here = [p[1][r] for p in parts if r < len(p[1])]  # ranks may need different refill rounds
        whole_rounds.append((Rollouts.concat([b for b, _ in here]), [i for _, ix in here for i in ix]))
    return WholeBatch(
        trained=Rollouts.concat([p[0] for p in parts]),
        rounds=whole_rounds,
        extra=_reduce([p[2] for p in parts]),
        reward_stats=_reduce([p[3] for p in parts], mean=False),
        reward_calls=sum(p[4] for p in parts),
        start=start, stop=start + sizes[dist.rank()],
    )


def _reduce(dicts: list[dict[str, float]], mean: bool = True) -> dict[str, Any]:
    keys = list(dict.fromkeys(k for d in dicts for k in d))
    out = {}
    for k in keys:
        values = [d[k] for d in dicts if k in d]
        if k in MAXED:
            out[k] = max(values)
        elif k in SUMMED or not mean:
            out[k] = sum(values)
        else:
            out[k] = sum(values) / len(values)
    return out
