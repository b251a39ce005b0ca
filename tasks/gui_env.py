"""``gui_env``: multi-step GUI episodes in an environment ("Turn on Bluetooth", "Open the message
from Bob", "Enter the name Ada and submit"), one action per turn.

Default environment: the built-in synthetic phone (``synthetic_gui``, :mod:`mmrl.envs`); any
registered environment with the GUI action space works (``task.options.env``). Each step's prompt
is the screenshot, the instruction and the last ``history_length`` actions; the policy answers
with one JSON action (:mod:`mmrl.measures.gui`), points in its coordinate space. Reward: the
environment's step reward (``env_reward``); train with ``algo.advantage=gigpo`` or
``episode_grpo``. Metric: ``success``, the fraction of episodes that accomplished the task.
"""

from __future__ import annotations

from mmrl import register_task
from mmrl.envs.task import EnvTask


@register_task("gui_env")
class GUIEnvironment(EnvTask):
    """See the module docstring; everything is :class:`~mmrl.envs.task.EnvTask`'s."""
