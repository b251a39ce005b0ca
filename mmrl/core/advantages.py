"""Group-relative advantage estimators.

Every estimator has the signature

    fn(rewards: Tensor (N,), group_ids: Tensor (N,) long, *, eps=1e-6, scale_rewards=True, **kw)
        -> Tensor (N,)

Samples drawn for the same prompt share a group id. Groups may be interleaved in any order and
may have different sizes (e.g. after filtering), so statistics are computed per group id with
``torch.unique(return_inverse=True)`` and ``index_add_``: one pass over the batch, no Python loop
over groups. Unknown keyword arguments are accepted and ignored so that the trainer can pass the
whole algorithm config to any estimator.

New estimators register with ``@register_advantage("name")`` and are looked up by
:func:`compute_advantages`. More estimators (REINFORCE++, NGRPO, BNPO, Stratified GRPO, SPO) live
in :mod:`mmrl.core.advantage_zoo` and register when this module is imported.

Stateful estimators (BNPO's running Beta moments, SPO's per-prompt value tracker) keep their
state in an :class:`EstimatorState` the caller owns: create it with
:func:`make_advantage_state`, pass it as ``state=`` on every call (the estimator updates it in
place) and save ``state.state_dict()`` with the checkpoint. An estimator advertises a state by
carrying a ``make_state`` attribute (a zero-argument factory).
"""

from __future__ import annotations

import abc

import torch
from torch import Tensor

from mmrl.registry import ADVANTAGES, register_advantage

__all__ = [
    "EstimatorState",
    "group_stats",
    "group_index",
    "constant_groups",
    "finalize_advantages",
    "as_float_tensor",
    "grpo",
    "dr_grpo",
    "rloo",
    "compute_advantages",
    "make_advantage_state",
]


class EstimatorState(abc.ABC):
    """Mutable state of a stateful advantage estimator, carried across training steps.

    Subclasses hold only plain Python values (floats, ints, strings, lists, dicts), so
    ``state_dict()`` can be written with ``torch.save`` and read back with
    ``torch.load(..., weights_only=True)``.
    """

    @abc.abstractmethod
    def state_dict(self) -> dict:
        """Plain-Python snapshot, saved in checkpoints."""

    @abc.abstractmethod
    def load_state_dict(self, d: dict) -> None:
        """Restore from :meth:`state_dict`."""


def group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample group statistics in float64, broadcast back to each sample.

    Returns ``(mean, std, count)``, each of shape (N,) and dtype float64: the mean of the
    sample's group, its *unbiased* sample standard deviation (``torch.std`` default, as TRL
    uses), and the group size. Float64 because a float32 mean of eight equal values can miss the
    value by one ulp, and that residue divided by a ~1e-8 std is an advantage of up to 0.1 for a
    group that carries no signal (:func:`constant_groups` zeroes those exactly). The std uses the
    two-pass formula; for a group of size 1 the denominator ``n - 1`` is clamped to 1, so its std
    is 0, not NaN.
    """
    r = as_float_tensor(rewards).to(torch.float64)
    inverse, num_groups = group_index(r, group_ids)
    count = torch.zeros(num_groups, dtype=r.dtype, device=r.device)
    count.index_add_(0, inverse, torch.ones_like(r))
    total = torch.zeros_like(count).index_add_(0, inverse, r)
    mean = (total / count)[inverse]

    sq_dev = torch.zeros_like(count).index_add_(0, inverse, (r - mean) ** 2)
    std = (sq_dev / (count - 1).clamp(min=1)).sqrt()[inverse]
    return mean, std, count[inverse]


def as_float_tensor(rewards) -> Tensor:
    r = torch.as_tensor(rewards)
    return r if r.is_floating_point() else r.float()


def group_index(rewards: Tensor, group_ids) -> tuple[Tensor, int]:
    """Validated ``(inverse, num_groups)`` for ``group_ids`` (ids need not be contiguous)."""
    ids = torch.as_tensor(group_ids, device=rewards.device)
    if rewards.dim() != 1 or ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both be 1-D of the same length, got "
            f"{tuple(rewards.shape)} and {tuple(ids.shape)}"
        )
    _, inverse = torch.unique(ids, return_inverse=True)
    return inverse, (int(inverse.max()) + 1 if inverse.numel() else 0)


def constant_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """(N,) bool: True where the sample's group has no reward spread, so it carries no signal.

    "No spread" means ``max - min <= 4 * ulp`` of the group's largest magnitude in the rewards'
    own dtype: differences at the level of the rounding of a weighted sum (0.2 * iou + ...) are
    noise, not a ranking of the samples. Singleton groups are constant by this definition.
    """
    r = as_float_tensor(rewards)
    inverse, n = group_index(r, group_ids)
    x = r.to(torch.float64)
    hi = torch.full((n,), -torch.inf, dtype=x.dtype, device=x.device).scatter_reduce(0, inverse, x, "amax")
    lo = torch.full((n,), torch.inf, dtype=x.dtype, device=x.device).scatter_reduce(0, inverse, x, "amin")
    tol = 4 * torch.finfo(r.dtype).eps * torch.maximum(hi.abs(), lo.abs())
    return ((hi - lo) <= tol)[inverse]


def finalize_advantages(advantages: Tensor, rewards: Tensor, zero: Tensor | None = None) -> Tensor:
    """Cast a float64 estimate back to the rewards' float dtype, with exact zeros where ``zero``."""
    if zero is not None:
        advantages = torch.where(zero, torch.zeros_like(advantages), advantages)
    return advantages.to(as_float_tensor(rewards).dtype)


@register_advantage("grpo")
def grpo(
    rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6, scale_rewards: bool = True, **_
) -> Tensor:
    """GRPO outcome advantage.

    From "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models"
    (Shao et al., 2024):

        A_i = (r_i - mean_g(r)) / (std_g(r) + eps)

    with the unbiased sample std of the sample's group g. With ``scale_rewards=False`` the std
    division is dropped, ``A_i = r_i - mean_g(r)`` (the Dr. GRPO fix, exposed as an option as TRL
    does). A group whose rewards are all equal, including a group of size 1, gets exactly 0
    (:func:`constant_groups`; statistics in float64).
    """
    mean, std, _ = group_stats(rewards, group_ids)
    centred = as_float_tensor(rewards).to(mean.dtype) - mean
    adv = centred / (std + eps) if scale_rewards else centred
    return finalize_advantages(adv, rewards, constant_groups(rewards, group_ids))


@register_advantage("dr_grpo")
def dr_grpo(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6, **_) -> Tensor:
    """Dr. GRPO advantage: the group mean baseline without std normalisation.

    From "Understanding R1-Zero-Like Training: A Critical Perspective" (Liu et al., 2025), which
    shows that dividing by the group std up-weights prompts that are too easy or too hard:

        A_i = r_i - mean_g(r)

    An all-equal group gets exactly 0.
    """
    mean, _, _ = group_stats(rewards, group_ids)
    return finalize_advantages(as_float_tensor(rewards).to(mean.dtype) - mean, rewards, constant_groups(rewards, group_ids))


@register_advantage("rloo")
def rloo(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6, **_) -> Tensor:
    """REINFORCE leave-one-out advantage.

    From "Buy 4 REINFORCE Samples, Get a Baseline for Free!" (Kool et al., 2019) and "Back to
    Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs"
    (Ahmadian et al., 2024). Each sample's baseline is the mean of the *other* samples of its
    group, which keeps the estimator unbiased:

        A_i = r_i - mean_{j in g, j != i} r_j = n / (n - 1) * (r_i - mean_g(r))

    A group of size 1 has no other sample and gets advantage 0 (verl's loop version gives it
    ``r``: a lone sample has no baseline, so mmrl gives it no signal); an all-equal group gets
    exactly 0.
    """
    mean, _, count = group_stats(rewards, group_ids)
    centred = as_float_tensor(rewards).to(mean.dtype) - mean
    # For n == 1, centred is exactly 0, so clamping the denominator gives 0 rather than inf*0.
    return finalize_advantages(centred * count / (count - 1).clamp(min=1), rewards, constant_groups(rewards, group_ids))


def compute_advantages(name: str, rewards: Tensor, group_ids: Tensor, **kwargs) -> Tensor:
    """Look up the estimator registered as ``name`` and apply it to the batch."""
    return ADVANTAGES.get(name)(rewards, group_ids, **kwargs)


def make_advantage_state(name: str) -> EstimatorState | None:
    """A fresh state for the estimator ``name``, or ``None`` if it is stateless."""
    factory = getattr(ADVANTAGES.get(name), "make_state", None)
    return factory() if factory is not None else None


# The zoo imports group_stats/EstimatorState from here, so it is imported last.
from . import advantage_zoo  # noqa: E402,F401  (registers reinforce_pp, ngrpo, bnpo, ...)
