"""mmrl: reinforcement learning for multimodal models with one GRPO-style core.

Public API for plugins and scripts::

    from mmrl import Task, register_task, register_reward, SyntheticExamples, image_prompt
    result = mmrl.train("vlm/counting_tiny", ["train.steps=50"])   # same as `mmrl train vlm`
"""

from .api import train
from .core.policy import Policy
from .registry import load_plugins, register_advantage, register_reward, register_sampler, register_task
from .task import SyntheticExamples, Task, image_prompt

__version__ = "0.1.0"

__all__ = [
    "train",
    "Policy",
    "Task",
    "SyntheticExamples",
    "image_prompt",
    "register_task",
    "register_reward",
    "register_advantage",
    "register_sampler",
    "load_plugins",
]
