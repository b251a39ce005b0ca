"""``mmrl.train`` for scripts and notebooks: the same run as ``mmrl train vlm|diffusion``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from .config import builtin_config_path, load_config
from .config_schema import Config

POLICY_MODALITIES = ("vlm", "diffusion")


def make_policy(cfg, task):
    """The policy that trains ``task``: a VLM for ``modality = "vlm"`` tasks, a generator for
    ``modality = "diffusion"`` (text-to-image/video) tasks."""
    modality = getattr(task, "modality", "vlm")
    if modality == "diffusion":
        from .diffusion.policy import DiffusionPolicy

        return DiffusionPolicy(cfg)
    if modality == "vlm":
        from .vlm.policy import VLMPolicy
        from .vlm.sft import untrained_task_warning

        names = list(getattr(task, "sub_tasks", None) or [task.name])  # a mixture: each of its tasks
        warning = untrained_task_warning(str(cfg.model.path), names)
        if warning:
            logging.getLogger("mmrl").warning("warning: %s", warning)
        return VLMPolicy(cfg)
    raise ValueError(f"task {getattr(task, 'name', '?')!r} has modality {modality!r}; no policy trains it "
                     f"(available: {', '.join(POLICY_MODALITIES)})")


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
