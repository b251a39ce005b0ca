"""Seeds derived from (run seed, step, purpose): what makes a run's draws a pure function of the
step, so a resumed run continues exactly."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch


# Every random purpose of a run draws from its own stream, named here once: (base salt, how many
# sub-streams it may use: an iteration, a generation round). Sub-stream i is salt base + i; each rank
# adds distributed.RANK_SALT * rank (1,000,003: above every range). The bases are the values runs
# have always used, so seeded runs reproduce, except T-GRPO's frame shuffling, which shared the
# perturbations' stream until 2026-11-25. tests/test_seeding.py checks that no two ranges overlap.
# The generator policy's noise is keyed by a hash of (call, sample, step) (mmrl/diffusion/policy.py).
STREAMS: dict[str, tuple[int, int]] = {
    "step": (0, 1),  # the step's global generators (python, numpy, torch)
    "epoch_order": (7, 1),  # the uniform prompt sampler's epoch permutation
    "minibatch_order": (11, 20),  # mini-batch shuffles, one per iteration (algo.num_iterations <= 20)
    "variance_sampler": (31, 1),  # MMR1 variance-aware prompt draws
    "dump_sampler": (53, 100),  # DUMP's draws, one per generation round
    "difficulty_augmentation": (200, 100),  # DeepVideo-R1 re-roll noise, per round
    "perturbation": (300, 100),  # Vision Matters perturbations, per round
    "temporal_shuffle": (400, 100),  # T-GRPO frame orders, per round
    "prompt_refill": (1000, 1000),  # dynamic-sampling refills, per round
    "thought_dropout": (2000, 1),  # mmrl sft: which references lose their <think> block
}


def step_seed(seed: int, step: int, salt: int = 0) -> int:
    """A well-mixed 63-bit seed for (run seed, step, salt)."""
    return (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + salt * 0x94D049BB133111EB) % (1 << 63)


def stream_seed(seed: int, step: int, stream: str, index: int = 0, rank_salt: int = 0) -> int:
    """The seed of sub-stream ``index`` of the named ``stream`` (:data:`STREAMS`) at ``step``."""
    base, size = STREAMS[stream]
    if not 0 <= index < size:
        raise ValueError(f"random stream {stream!r} has {size} sub-streams; index {index} is out of range")
    return step_seed(seed, step, salt=base + index + rank_salt)


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
