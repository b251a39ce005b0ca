"""Precision: ``model.dtype`` is the *compute* dtype, not the dtype the trained weights are kept in.

Trainable parameters are kept in float32 (master weights) and forward passes run under
``torch.autocast`` in bfloat16/float16, the way AMP and FSDP's mixed precision train; frozen
weights (the reference copy, a frozen vision tower, a LoRA base model) are stored in the compute
dtype. Pure-bf16 weights lose most AdamW updates at small learning rates (one step at lr 1e-6
changes ~2% of bf16 weights of std 0.02).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def compute_dtype(name: str) -> torch.dtype:
    """``model.dtype`` as a torch dtype, with the valid names when it is none of them."""
    if name not in DTYPES:
        raise ValueError(f"model.dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def to_master_weights(params: Iterable[torch.nn.Parameter]) -> None:
    """Trained parameters to float32 in place (the optimizer updates these)."""
    for p in params:
        if p.dtype != torch.float32:
            p.data = p.data.float()


def autocast(device: torch.device, dtype: torch.dtype):
    """The forward-pass context: autocast to the compute dtype (a no-op in float32)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
