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
