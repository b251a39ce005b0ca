"""Which denoising steps of a rollout are stochastic (SDE) and which are trained.

- Every step SDE and trained: "Flow-GRPO: Training Flow Matching Models via Online RL".
- A prefix of the steps trained (``train_steps_prefix``): Flow-GRPO trains the early steps only.
- A window of ``k`` consecutive SDE steps, ODE elsewhere, only the window trained: Flow-GRPO-Fast
  (a random window start per RL step) and "MixGRPO: Unlocking Flow-based GRPO Efficiency with
  Mixed ODE-SDE" (a window that slides forward as training goes on).
- A random fraction of the trained steps per sample (``timestep_fraction``): DanceGRPO's timestep
  selection ("DanceGRPO: Unleashing GRPO on Visual Generation").

Every choice is a pure function of (seed, RL step, sample identity), so a resumed run and every
distributed worker make the same one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SDE_WINDOW_MODES = ("random", "sliding")


@dataclass
class StepPlan:
    sde: torch.Tensor  # (T,) bool: the step is stochastic (else the deterministic ODE step)
    window_start: int  # first SDE step (0 without a window)


def window_start(num_steps: int, size: int, window_range, mode: str, rl_step: int, shift_every: int,
                 generator: torch.Generator) -> int:
    """Start of the SDE window: uniform in ``window_range`` = [first, last] (``random``), or
    ``first + (rl_step // shift_every)`` wrapping around within the range (``sliding``)."""
    first, last = (0, num_steps - size) if window_range is None else (int(window_range[0]), int(window_range[1]))
    last = min(last, num_steps - size)
    if not 0 <= first <= last:
        raise ValueError(f"diffusion.sde_window_range={window_range} leaves no start for a window of "
                         f"{size} steps in {num_steps} (need 0 <= first <= last <= num_steps - size)")
    if mode == "random":
        return first + int(torch.randint(0, last - first + 1, (1,), generator=generator))
    if mode == "sliding":
        return first + (max(rl_step - 1, 0) // max(shift_every, 1)) % (last - first + 1)
    raise ValueError(f"unknown diffusion.sde_window_mode {mode!r}; valid: {', '.join(SDE_WINDOW_MODES)}")


def step_plan(num_steps: int, window_size: int, window_range, mode: str, rl_step: int, shift_every: int,
              generator: torch.Generator) -> StepPlan:
    """Which of ``num_steps`` steps are SDE (all of them without a window)."""
    if window_size <= 0:
        return StepPlan(torch.ones(num_steps, dtype=torch.bool), 0)
    if window_size > num_steps:
        raise ValueError(f"diffusion.sde_window_size={window_size} is larger than num_steps={num_steps}")
    start = window_start(num_steps, window_size, window_range, mode, rl_step, shift_every, generator)
    sde = torch.zeros(num_steps, dtype=torch.bool)
    sde[start:start + window_size] = True
    return StepPlan(sde, start)


def trained_steps(sde: torch.Tensor, num_samples: int, prefix: int, fraction: float,
                  generators: list[torch.Generator]) -> torch.Tensor:
    """(N, T) float mask of trained steps: the SDE steps, cut to the first ``prefix`` steps when
    ``prefix > 0``, then per sample a random ``fraction`` of them (at least one; DanceGRPO draws a
    permutation per sample and keeps its first ``int(T * fraction)``)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"diffusion.timestep_fraction must be in (0, 1], got {fraction}")
    base = sde.clone()
    if prefix > 0:
        base[prefix:] = False
    mask = base.float().expand(num_samples, -1).clone()
    candidates = base.nonzero().flatten()
    keep = max(1, int(len(candidates) * fraction))
    if fraction < 1 and len(candidates):
        for i in range(num_samples):
            chosen = candidates[torch.randperm(len(candidates), generator=generators[i])[:keep]]
            mask[i] = 0
            mask[i, chosen] = 1
    return mask
