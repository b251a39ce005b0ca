"""Training-time schedules of the objective: the KL weight and the reference-model reset.

- ``grpo_d``: "OThink-MR1: Stimulating multimodal generalized reasoning capabilities via dynamic
  reinforcement learning" (Liu et al., 2025). GRPO-D replaces GRPO's constant KL weight by a
  dynamic one that is small early in training (exploration: the policy may move away from the
  reference) and grows later (exploitation: stay close to what works).
- Reference reset: "ProRL: Prolonged Reinforcement Learning Expands Reasoning Boundaries in Large
  Language Models" (Liu et al., 2025): every so often the reference policy is hard-reset to the
  current policy (and the optimizer state re-initialised), so the KL term keeps regularising
  without pinning a long run to the initial model.
"""

from __future__ import annotations

from typing import Optional

from mmrl.config.options import check_options
from mmrl.registry import KL_SCHEDULES, register_kl_schedule

__all__ = ["kl_coef_at", "check_kl_schedule", "should_reset_reference"]


def _progress(step: int, span: Optional[float], schedule: str) -> float:
    if span is None or span <= 0:
        raise ValueError(f"kl schedule {schedule!r} needs total_steps > 0")
    return min(max(step / span, 0.0), 1.0)


def kl_coef_at(step: int, beta: float, schedule: str = "constant", *, total_steps: Optional[int] = None,
               **kwargs) -> float:
    """The KL weight for RL step ``step`` (0-based) under the registered ``schedule``.

    - ``constant``: ``beta``.
    - ``linear_decay``: from ``beta`` at step 0 linearly to ``beta_end`` at ``total_steps``, then
      flat: ``beta + (beta_end - beta) * min(step / total_steps, 1)``.
    - ``grpo_d`` (OThink-MR1's GRPO-D): increases linearly from ``beta_min`` at step 0 to
      ``beta_max`` (default ``beta``) at ``ramp_frac * total_steps``, then flat:
      ``beta_min + (beta_max - beta_min) * min(step / (ramp_frac * total_steps), 1)``.

    ``beta`` is the peak for ``constant``/``linear_decay``/``grpo_d`` alike, so "a reference model
    is needed" stays ``beta > 0``.
    """
    return float(KL_SCHEDULES.get(schedule, "algo.kl_schedule")(step, beta, total_steps, **kwargs))


def check_kl_schedule(schedule: str, kwargs: dict) -> None:
    """``algo.kl_schedule`` and its ``algo.kl_schedule_kwargs`` at setup: an unknown name, or an
    option the schedule does not take, is an error before the first step."""
    fn = KL_SCHEDULES.get(schedule, "algo.kl_schedule")
    check_options(fn, kwargs, "algo.kl_schedule_kwargs", f"the {schedule} KL schedule", ("step", "beta", "total_steps"))


@register_kl_schedule("constant")
def constant(step: int, beta: float, total_steps: Optional[int]) -> float:
    return beta


@register_kl_schedule("linear_decay")
def linear_decay(step: int, beta: float, total_steps: Optional[int], beta_end: float = 0.0) -> float:
    p = _progress(step, total_steps, "linear_decay")
    return beta + (beta_end - beta) * p


@register_kl_schedule("grpo_d")
def grpo_d(step: int, beta: float, total_steps: Optional[int], beta_min: float = 0.0,
           beta_max: Optional[float] = None, ramp_frac: float = 1.0) -> float:
    top = beta if beta_max is None else beta_max
    if not 0 < ramp_frac <= 1:
        raise ValueError(f"ramp_frac must be in (0, 1], got {ramp_frac}")
    p = _progress(step, None if total_steps is None else ramp_frac * total_steps, "grpo_d")
    return beta_min + (top - beta_min) * p


def should_reset_reference(step: int, every: Optional[int]) -> bool:
    """ProRL's periodic reference reset: True after every ``every``-th completed RL step
    (``step`` = number of steps done, 1-based: True at every, 2*every, ...). ``every`` None or 0
    disables it. On True the trainer copies the current policy weights into the reference model
    (and, as ProRL does, re-initialises the optimizer state)."""
    if not every:
        return False
    if every < 0:
        raise ValueError(f"reference reset interval must be >= 0, got {every}")
    return step > 0 and step % every == 0
