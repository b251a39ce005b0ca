"""mmrl: reinforcement learning for multimodal models with one GRPO-style core.

Public API for plugins and scripts (a new modality: ``register_policy`` on a ``PolicyBase``
subclass whose rollouts are ``Rollouts``)::

    from mmrl import Task, register_task, register_reward, SyntheticExamples, image_prompt
    from mmrl import EpisodicTask, Interaction, LoopOptions, Reply   # a multi-turn task (the agent loop)
    result = mmrl.train("vlm/counting_tiny", ["train.steps=50"])   # same as `mmrl train vlm`

The modules a plugin may import besides these names are listed in :data:`PUBLIC_MODULES`
(:mod:`mmrl.public`).
"""

from . import library_noise  # noqa: F401  (silences, once, what a user cannot act on: see the module)
from . import plugins  # noqa: F401  (installs the registries' plugin loader)
from .api import train
from .eval_protocols import Benchmark, register_benchmark
from .core.agent_loop import Interaction, LoopOptions, Reply
from .core.distributed import pick_device
from .core.episodes import EpisodicTask
from .core.policy import PolicyBase
from .core.protocol import Policy
from .core.rollouts import Rollouts
from .envs import Env, Observation, register_env
from .public import PUBLIC_MODULES
from .registry import (
    Registry,
    UnknownNameError,
    load_plugins,
    register_advantage,
    register_engine,
    register_kl_schedule,
    register_loss,
    register_optimizer,
    register_perturbation,
    register_policy,
    register_reward,
    register_sampler,
    register_sde_sampler,
    register_selection,
    register_task,
    register_tool,
)
from .task import GenerationPrompt, SyntheticExamples, Task, image_prompt, make_task, video_prompt

__version__ = "0.1.0"

__all__ = [
    "train",
    "Benchmark",
    "register_benchmark",
    "Policy",
    "PolicyBase",
    "Rollouts",
    "register_policy",
    "register_loss",
    "register_optimizer",
    "register_engine",
    "register_selection",
    "register_sde_sampler",
    "register_kl_schedule",
    "register_perturbation",
    "Task",
    "SyntheticExamples",
    "image_prompt",
    "GenerationPrompt",
    "video_prompt",
    "register_task",
    "register_reward",
    "register_advantage",
    "register_sampler",
    "register_env",
    "register_tool",
    "Env",
    "Observation",
    "EpisodicTask",
    "Interaction",
    "LoopOptions",
    "Reply",
    "load_plugins",
    "make_task",
    "UnknownNameError",
    "Registry",
    "pick_device",
    "PUBLIC_MODULES",
]
