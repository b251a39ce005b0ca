"""What every advantage estimator shares: group statistics in float64, the constant-group rule,
batch whitening, the estimator-state base class and the lookup by name.

Every estimator has the signature

    fn(rewards: Tensor (N,), group_ids: Tensor (N,) long, *, eps=1e-6, <its options>) -> Tensor (N,)

Samples drawn for the same prompt share a group id. Groups may be interleaved in any order and
may have different sizes (e.g. after filtering), so statistics are computed per group id with
``torch.unique(return_inverse=True)`` and ``index_add_``: one pass over the batch, no Python loop
over groups. No estimator takes ``**kwargs``: a key it does not take is an error at setup
(:mod:`mmrl.config.options`). Extra per-batch inputs an estimator needs (``lengths``, ``prompt_keys``, ``task_ids``, ``r_max``, ``policy_kl``) are declared
with ``@register_advantage(name, inputs=(...))`` and supplied by the trainer.

Stateful estimators (BNPO's running Beta moments, SPO's per-prompt value tracker) keep their
state in an :class:`EstimatorState` the caller owns: create it with :func:`make_advantage_state`,
pass it as ``state=`` on every call (the estimator updates it in place) and save
``state.state_dict()`` with the checkpoint. An estimator declares its state with
``@register_advantage(..., make_state=Factory)``.
"""

from __future__ import annotations

import abc

import torch
from torch import Tensor

from mmrl.registry import ADVANTAGES

from ...config import ConfigError
from mmrl.config.options import check_options, keyword_options

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


def whiten_batch(x: Tensor, eps: float, weights: Tensor | None = None) -> Tensor:
    """``(x - mean(x)) / (std(x) + eps)`` over the whole batch, in float64, Bessel-corrected.

    ``weights`` (N,) counts each value that many times (REINFORCE++'s token-level whitening:
    a sequence's advantage weighted by its number of tokens, the Bessel correction over the token
    count). A batch with no spread (``max - min`` within 4 ulp of its magnitude, see
    :func:`~mmrl.core.advantages.constant_groups`) whitens to exactly 0; N = 1 gives 0.
    """
    if x.numel() == 0:
        return x
    x64 = x.to(torch.float64)
    w = torch.ones_like(x64) if weights is None else torch.as_tensor(weights, dtype=torch.float64, device=x.device)
    total = w.sum()
    centred = x64 - (w * x64).sum() / total.clamp(min=1e-300)
    std = ((w * centred.pow(2)).sum() / (total - 1).clamp(min=1)).sqrt()
    flat = constant_groups(x, torch.zeros(x.numel(), dtype=torch.long, device=x.device))
    return finalize_advantages(centred / (std + eps), x, flat)


def compute_advantages(name: str, rewards: Tensor, group_ids: Tensor, **kwargs) -> Tensor:
    """Look up the estimator registered as ``name`` and apply it to the batch (``kwargs``: its
    options and declared inputs; a name it does not take is a TypeError)."""
    return ADVANTAGES.get(name)(rewards, group_ids, **kwargs)


def estimator_options(name: str, advantage_kwargs: dict, scale_rewards: bool) -> dict:
    """The options the estimator ``name`` is called with (``algo.advantage_kwargs`` and
    ``algo.scale_rewards``), checked against its signature at setup: a key it does not take, or
    ``scale_rewards: false`` for an estimator with no std division to turn off, is a ConfigError
    naming the options it does take."""
    estimator = ADVANTAGES.get(name, "algo.advantage")
    supplied = ("rewards", "group_ids", "state", *estimator.estimator_inputs)
    what = f"the {name} estimator"
    check_options(estimator, advantage_kwargs, "algo.advantage_kwargs", what, supplied)
    options = dict(advantage_kwargs)
    if "scale_rewards" in keyword_options(estimator):
        options.setdefault("scale_rewards", scale_rewards)
    elif not scale_rewards:
        raise ConfigError(f"algo.scale_rewards=false: {what} divides by no group std, so there is nothing to "
                          f"turn off (its options: {', '.join(keyword_options(estimator, supplied))})")
    return options


def make_advantage_state(name: str) -> EstimatorState | None:
    """A fresh state for the estimator ``name``, or ``None`` if it is stateless."""
    factory = ADVANTAGES.get(name).make_state
    return factory() if factory is not None else None

