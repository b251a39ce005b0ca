"""Non-finite gradients: the cause of a skipped optimizer step, named for the run's record."""

from __future__ import annotations

import math

import torch

from . import sharding


def non_finite_cause(module: torch.nn.Module, params: list[torch.nn.Parameter], loss: float) -> str | None:
    """None when every gradient of ``params`` is finite (one norm over them all), else what went
    wrong: the loss, or the first parameter of ``module`` whose gradient holds NaN / inf, by name.
    Sharded gradients are judged whole (the same verdict on every rank)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads or bool(torch.isfinite(sharding.full_tensor(torch.nn.utils.get_total_norm(grads)))):
        return None
    if (cause := loss_cause(loss)) is not None:
        return cause
    names = {id(p): n for n, p in module.named_parameters()}
    for p in params:
        if p.grad is not None and not bool(torch.isfinite(sharding.full_tensor(p.grad)).all()):
            return f"the gradient of {names.get(id(p), '?')} is not finite"
    return "the gradient norm is not finite"  # the squares overflowed: every gradient is finite


def loss_cause(loss: float) -> str | None:
    """A non-finite loss, named: the first cause to report of non-finite gradients (they follow
    from it), whoever judged the gradients (this module, or DeepSpeed's engine)."""
    return None if math.isfinite(loss) else f"the loss is {loss}"
