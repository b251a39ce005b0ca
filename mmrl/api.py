"""``mmrl.train`` for scripts and notebooks: the same run as ``mmrl train vlm|diffusion``."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .config import builtin_config_path, load_config
from mmrl.config.schema import Config


def make_policy(cfg, task):
    """The policy registered (``register_policy``) for ``task.modality``: the VLM for ``"vlm"``
    tasks, the generator for ``"diffusion"`` (text-to-image/video) tasks, or a plugin's."""
    from .registry import POLICIES

    return POLICIES.get(task.modality, key=f"task {task.name!r}'s modality").for_task(cfg, task)


def train(config: str | Path | Config | None = None, overrides: Sequence[str] = ()):
    """Train with RL; returns a ``TrainResult`` (run_dir, before/after metrics).

    ``config`` is a YAML recipe path, a built-in recipe name (``"vlm/grounding_tiny"``,
    ``"diffusion/composition_tiny"``), a ``Config``, or None for the tiny VLM default;
    ``overrides`` are dotted ``key=value`` strings. The task's modality picks the policy.
    """
    from .core.trainer import Trainer, build_task

    if isinstance(config, Config):
        cfg = load_config(None, overrides, base=config)
    else:
        cfg = load_config(builtin_config_path(str(config or "vlm/counting_tiny")), overrides)
    task = build_task(cfg)
    return Trainer(cfg, make_policy(cfg, task), task).train()
