"""The interface every trainable policy implements; the trainer knows nothing else about it.

A VLM's actions are generated tokens; a diffusion model's are denoising steps. Either way the
policy samples groups, reports per-action log-probs, and takes optimizer steps on the core's loss.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import torch

from .rollouts import Rollouts


class Policy(Protocol):
    def rollout(self, examples: Sequence[dict], prompts: Sequence[Any], n: int, rollout_cfg: Any,
                need_old_logps: bool, need_ref_logps: bool) -> Rollouts:
        """``n`` samples per prompt (no grad); group i holds prompt i's samples."""

    def configure_optimizer(self, train_cfg: Any, total_steps: int) -> None:
        """Create the optimizer and LR scheduler (restored by ``load``)."""

    def train_step(self, batch: Rollouts, objective: Callable[..., tuple[torch.Tensor, dict]],
                   num_tokens: float, num_seqs: float) -> dict[str, float]:
        """One optimizer step over a mini-batch; ``objective`` is the core's loss."""

    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None: ...


# -- what every policy's setup and checkpoints share ------------------------------------------------

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name: str) -> torch.device:
    """``train.device``: ``auto`` is CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def make_optimizer(params, train_cfg: Any, total_steps: int):
    """AdamW over ``params`` and the configured transformers LR scheduler (``configure_optimizer``)."""
    from transformers import get_scheduler

    optimizer = torch.optim.AdamW(params, lr=train_cfg.learning_rate, weight_decay=train_cfg.weight_decay,
                                  betas=(train_cfg.adam_beta1, train_cfg.adam_beta2))
    scheduler = get_scheduler(train_cfg.lr_scheduler_type, optimizer, num_warmup_steps=train_cfg.warmup_steps,
                              num_training_steps=max(total_steps, 1))
    return optimizer, scheduler


def save_optimizer_state(path: Path, optimizer, scheduler) -> None:
    """``path/optimizer.pt`` with both states (nothing before ``configure_optimizer``)."""
    if optimizer is not None:
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
                   Path(path) / "optimizer.pt")


def load_optimizer_state(path: Path, optimizer, scheduler) -> None:
    """Restore what :func:`save_optimizer_state` wrote, when both the file and an optimizer exist."""
    opt = Path(path) / "optimizer.pt"
    if opt.exists() and optimizer is not None:
        state = torch.load(opt, map_location="cpu", weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
