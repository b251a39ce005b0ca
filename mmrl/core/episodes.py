"""Rollouts of a task's examples: single completions, or multi-turn trajectories for an episodic task.

:func:`rollout_task` is what the batch builder and the evaluation call. For an ordinary task it is
``policy.rollout``. An episodic task (an :class:`EpisodicTask`: GUI episodes, tool use, any
multi-turn interaction) rolls out ``n`` trajectories of each example through the agent loop
(:mod:`mmrl.core.agent_loop`), one :class:`~mmrl.core.agent_loop.Interaction` each: the core declares
what it needs of such a task and never imports the environments or the tools.

Every turn becomes one row of the returned :class:`~mmrl.core.rollouts.Rollouts` (its own prompt:
the conversation, or the current screenshot with the earlier actions), so the existing estimators
and losses apply to the per-turn actions unchanged; the rows' examples carry what the episode-aware
estimators, rewards and :func:`episode_metrics` read, each key declared in
:class:`~mmrl.core.example.Example`: ``episode_id``, ``step_index`` and ``anchor_key`` on every row;
an environment's step keys (``step_reward``, ``step_valid``, ``step_message``) and, once the episode
is over, its outcome (``episode_success``, ``episode_return``, ``episode_length``,
``episode_timed_out``); a tool task's trajectory record (:mod:`mmrl.tools.interaction`).
"""

from __future__ import annotations

from typing import Sequence

from .agent_loop import Interaction, LoopOptions, run_agent_loop
from .example import Example
from .rollouts import Rollouts


class EpisodicTask:
    """What a multi-turn task adds to a :class:`~mmrl.task.Task` (a mixin: ``class
    EnvTask(Task, EpisodicTask)``): its examples are rolled out as trajectories of turns, each
    against its own :class:`~mmrl.core.agent_loop.Interaction`. A subclass writes
    :meth:`interaction` (or :meth:`interactions`) and :meth:`loop_options`."""

    def interaction(self, ex: dict) -> Interaction:
        """The other side of one trajectory of ``ex`` (an example the policy prepared)."""
        raise NotImplementedError(f"{type(self).__name__} must implement interaction(ex)")

    def interactions(self, policy, examples: Sequence[dict], n: int) -> list[Interaction]:
        """``n`` interactions per example, in order: each example prepared by the policy once per
        trajectory (one batched call), then :meth:`interaction`."""
        return [self.interaction(ex) for ex in policy.prepare_examples([ex for ex in examples for _ in range(n)])]

    def loop_options(self) -> LoopOptions:
        """The turn limit, stop texts, time limit and masking of this task's trajectories."""
        raise NotImplementedError(f"{type(self).__name__} must implement loop_options()")

    def run_episodes(self, policy, examples: Sequence[dict], n: int, mode: str, need_old_logps: bool = False,
                     need_ref_logps: bool = False) -> Rollouts:
        """``n`` trajectories of each of ``examples``, every turn a row (module docstring); group i
        holds the rows of ``examples[i]``'s trajectories (:func:`~mmrl.core.agent_loop.run_agent_loop`)."""
        return run_agent_loop(policy, self.interactions(policy, examples, n), n, self.loop_options(), mode,
                              need_old_logps, need_ref_logps)

    #: Example keys of the task's own (its data: ``answer``, ``target_box``, ...) that
    #: :meth:`rollout_metrics` reads besides the declared ones (:class:`~mmrl.core.example.Example`).
    #: With several processes the metrics see the gathered batch, which carries only declared keys
    #: and these (:func:`mmrl.core.batch.whole.light`): a key read but not listed would be missing there.
    metric_keys: tuple[str, ...] = ()

    def rollout_metrics(self, rows: Rollouts) -> dict[str, float]:
        """What the task reports of a training step's rows besides :func:`episode_metrics`
        (a tool-use task: its metrics over the step's trajectories); none by default. Reads only
        declared keys and :attr:`metric_keys` of the rows' examples."""
        return {}


def is_episodic(task) -> bool:
    return isinstance(task, EpisodicTask)


def rollout_task(policy, task, examples: Sequence[dict], n: int, mode: str, need_old_logps: bool = False,
                 need_ref_logps: bool = False) -> Rollouts:
    """``n`` samples (episodes, for an environment task) of each of ``examples``, as rows of one
    batch; group i holds those of ``examples[i]``. ``examples`` are already prepared by the policy
    (single-step tasks) or are task specs (episodic tasks: each step's example is prepared as it
    happens)."""
    if is_episodic(task):
        return task.run_episodes(policy, examples, n, mode, need_old_logps, need_ref_logps)
    return policy.rollout(examples, [task.build_prompt(ex) for ex in examples], n, mode,
                          need_old_logps=need_old_logps, need_ref_logps=need_ref_logps)


def episode_key(row: Example) -> tuple:
    """Which episode a row belongs to, unique in a batch gathered from several processes (each
    numbers its episodes from 0; ``_index`` is the task spec's index in its split)."""
    return row.get("_index"), row["episode_id"]


def episode_rows(examples: Sequence[Example]) -> list[list[int]]:
    """The rows of each episode among ``examples``, episodes in the order first seen and each
    episode's rows by step: what the eval gallery and the episode viewer draw (they are given
    this grouping, so the run directory's writers need not know the episode keys)."""
    episodes: dict[tuple, list[int]] = {}
    for i, ex in enumerate(examples):
        if isinstance(ex, dict) and "episode_id" in ex:
            episodes.setdefault(episode_key(ex), []).append(i)
    return [sorted(rows, key=lambda i: examples[i]["step_index"]) for rows in episodes.values()]


def episode_metrics(rows: Rollouts) -> dict[str, float]:
    """The step's episode metrics from its rows: success rate, mean length and return, and the
    fraction of invalid actions, each where the rows carry it (an environment's rows carry all;
    a tool-use trajectory's rows none, their task reports its own); {} for a batch that holds no
    episodes."""
    episodes = {episode_key(ex): ex for ex in rows.examples if isinstance(ex, dict) and "episode_id" in ex}
    if not episodes or "episode_success" not in next(iter(episodes.values())):
        return {}
    n = len(episodes)
    return {
        "episode/success": sum(float(ex["episode_success"]) for ex in episodes.values()) / n,
        "episode/length": sum(ex["episode_length"] for ex in episodes.values()) / n,
        "episode/return": sum(ex["episode_return"] for ex in episodes.values()) / n,
        "episode/invalid_actions": sum(not ex["step_valid"] for ex in rows.examples) / len(rows),
        "episode/timeouts": sum(float(ex.get("episode_timed_out", False)) for ex in episodes.values()) / n,
    }
