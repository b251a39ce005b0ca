"""Activation checkpointing (``train.gradient_checkpointing``): the options every policy hands its
library, read once here.

A checkpointed layer keeps only its inputs in the forward pass and runs again in the backward
pass to rebuild what its gradient needs ("Training Deep Nets with Sublinear Memory Cost", Chen et
al., 2016): the activations stored for the backward pass shrink from every layer's to the layer
boundaries', for about one more forward of compute. The recomputation repeats the same operations
on the same inputs, so the gradients are those of the plain step (the tests compare them, float32,
1e-6). Each modality switches it on through its own library (transformers'
``activation_checkpointing_enable``, diffusers' ``enable_gradient_checkpointing``), which
checkpoints only under autograd: generation and the no-grad scoring passes are unchanged.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from torch.utils.checkpoint import checkpoint

# TRL's default: the non-reentrant implementation (the reentrant one runs the forward without
# autograd and needs an input that requires grad: a frozen base under LoRA gives none, and the
# shared prefix's keys/values, written inside a layer, would carry no gradient).
DEFAULTS = {"use_reentrant": False}


def checkpoint_options(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """``train.gradient_checkpointing_kwargs`` over the defaults, checked against
    ``torch.utils.checkpoint.checkpoint``'s keywords (a typo stops the run at setup)."""
    kwargs = dict(kwargs or {})
    known = set(inspect.signature(checkpoint).parameters) - {"function", "args", "kwargs"}
    if unknown := sorted(set(kwargs) - known):
        raise ValueError(f"train.gradient_checkpointing_kwargs: unknown option(s) {unknown}; "
                         f"torch.utils.checkpoint.checkpoint takes {sorted(known)}")
    return {**DEFAULTS, **kwargs}


def module_checkpoint(options: dict[str, Any]) -> Callable[..., Any]:
    """``fn(module, *args)``: ``module(*args)`` checkpointed with ``options`` (the form diffusers'
    ``enable_gradient_checkpointing`` takes)."""
    run = functools.partial(checkpoint, **options)
    return lambda module, *args: run(module.__call__, *args)
