"""``env_reward``: the environment's own reward for the step a row of an episode took.

For environment tasks (:class:`mmrl.envs.task.EnvTask`): every step of an episode is one row, and
the episode runner records on it the reward the environment returned for that step
(``step_reward``: in the synthetic GUI environment 1.0 on the step that accomplishes the task,
minus an optional invalid-action penalty). Summed over an episode's rows it is the episode's
return, which is what ``episode_grpo`` and ``gigpo`` compare within a group.
"""

from __future__ import annotations

from mmrl import register_reward


@register_reward("env_reward", minimum=-1e9)
def env_reward(completions, examples, **ctx) -> list[float]:
    """The step reward of each row; a row without one is not from an environment task: an error."""
    if len(completions) != len(examples):
        raise ValueError(f"env_reward: {len(completions)} completions for {len(examples)} examples")
    missing = [i for i, ex in enumerate(examples) if not isinstance(ex, dict) or "step_reward" not in ex]
    if missing:
        raise ValueError("env_reward scores the steps of environment episodes (task gui_env or another "
                         f"EnvTask); example {missing[0]} has no 'step_reward'")
    return [float(ex["step_reward"]) for ex in examples]
