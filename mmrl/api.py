"""``mmrl.train`` for scripts and notebooks: the same run as ``mmrl train vlm``."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .config import builtin_config_path, load_config
from .config_schema import Config


def train(config: str | Path | Config | None = None, overrides: Sequence[str] = ()):
    """Train a VLM policy with RL; returns a ``TrainResult`` (run_dir, before/after metrics).

    ``config`` is a YAML recipe path, a built-in recipe name (``"vlm/grounding_tiny"``), a
    ``Config``, or None for the tiny default; ``overrides`` are dotted ``key=value`` strings.
    """
    from .core.trainer import Trainer, build_task
    from .vlm.policy import VLMPolicy

    if isinstance(config, Config):
        cfg = load_config(None, overrides, base=config)
    else:
        cfg = load_config(builtin_config_path(str(config or "vlm/counting_tiny")), overrides)
    task = build_task(cfg)
    return Trainer(cfg, VLMPolicy(cfg), task).train()
