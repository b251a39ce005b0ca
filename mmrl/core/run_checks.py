"""Checks of a run's setup that stop it before any training: a held-out split with nothing usable,
a launch whose processes cannot each take whole groups."""

from __future__ import annotations

from ..task import Task
from . import distributed as dist


def check_eval_split(task: Task) -> None:
    """Open one held-out example now, so an eval split with nothing usable (every image broken,
    every target invalid) stops the run before any training instead of at its first evaluation."""
    try:
        examples = task.examples("eval")
        if len(examples):
            examples[0]
    except ValueError as exc:
        raise ValueError(f"the eval split of task {task.name!r} is unusable: {exc}") from exc


def check_world(cfg) -> None:
    """Setup-time checks of a launch against the config: whole groups per rank."""
    world = dist.world_size()
    if world == 1:
        return
    if cfg.train.prompts_per_step < world:
        raise ValueError(f"train.prompts_per_step={cfg.train.prompts_per_step} prompts cannot give each of "
                         f"{world} processes a group; use at least {world} (ideally a multiple)")
    if cfg.train.mini_batch_size % world:
        raise ValueError(f"train.mini_batch_size={cfg.train.mini_batch_size} must be a multiple of the "
                         f"{world} processes (each rank trains its share of every mini-batch)")
