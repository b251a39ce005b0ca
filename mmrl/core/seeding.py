"""Seeds derived from (run seed, step, purpose): what makes a run's draws a pure function of the
step, so a resumed run continues exactly."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch


def step_seed(seed: int, step: int, salt: int = 0) -> int:
    """A well-mixed 63-bit seed for (run seed, step, purpose)."""
    return (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + salt * 0x94D049BB133111EB) % (1 << 63)


def seed_everything(seed: int) -> None:
    """Python, NumPy and torch (CPU and CUDA) from one seed."""
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


@contextlib.contextmanager
def seeded(seed: int):
    """torch's generators (CPU and CUDA) seeded for a block and restored after it: what is drawn at
    set-up (LoRA adapters' initial weights) is a function of the run seed, the same on every rank
    and in every run, and the draws of the rest of the run are left as they were."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
