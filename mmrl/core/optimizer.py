"""The optimizer and learning-rate schedule of a policy's trained parameters."""

from __future__ import annotations

from typing import Any

import torch


def make_optimizer(params, train_cfg: Any, total_steps: int):
    """AdamW over ``params`` and the configured transformers LR scheduler over ``total_steps`` RL
    steps (stepped once per RL step by :func:`step_schedule`)."""
    from transformers import get_scheduler

    optimizer = torch.optim.AdamW(params, lr=train_cfg.learning_rate, weight_decay=train_cfg.weight_decay,
                                  betas=(train_cfg.adam_beta1, train_cfg.adam_beta2))
    scheduler = get_scheduler(train_cfg.lr_scheduler_type, optimizer, num_warmup_steps=train_cfg.warmup_steps,
                              num_training_steps=max(total_steps, 1))
    return optimizer, scheduler


def step_schedule(scheduler, step: int) -> None:
    """Set the learning rate of RL step ``step``.

    The schedule counts RL steps, the unit of ``train.steps`` and ``train.warmup_steps`` (as verl
    steps its scheduler once per training step), whatever number of optimizer steps an RL step
    takes (mini-batches x ``num_iterations``, or a batch that dynamic sampling resized): stepped
    per optimizer step, a linear decay would reach 0 part-way through the run."""
    while scheduler.last_epoch < step - 1:
        scheduler.step()
