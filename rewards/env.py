"""``env_reward``: the environment's own reward for the step a row of an episode took.

For environment tasks (:class:`mmrl.envs.task.EnvTask`): every step of an episode is one row, and
the episode runner records on it the reward the environment returned for that step
(``step_reward``: in the synthetic GUI environment 1.0 on the step that accomplishes the task,
minus an optional invalid-action penalty). Summed over an episode's rows it is the episode's
return, which is what ``episode_grpo`` and ``gigpo`` compare within a group.
"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.measures.batch import score_each


@register_reward("env_reward")
def env_reward(completions, examples) -> list:
    """The step reward of each row; None for a row that has none (not a step of an environment
    episode: the reward then scores 0 and is counted as unparsable in the run's metrics)."""
    return score_each("env_reward", completions, examples, lambda _, ex: (
        float(ex["step_reward"]) if isinstance(ex, dict) and "step_reward" in ex else None))
