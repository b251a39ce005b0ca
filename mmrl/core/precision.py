"""Precision: ``model.dtype`` is the *compute* dtype; ``train.optim`` decides the dtype the trained
weights are kept in.

By default (``train.optim=adamw_torch``) trainable parameters are kept in float32 (master weights)
and forward passes run under ``torch.autocast`` in bfloat16/float16, the way AMP and FSDP's mixed
precision train: 16 bytes per trained parameter with AdamW. Pure-bf16 weights lose most AdamW
updates at small learning rates (one step at lr 1e-6 changes ~2% of bf16 weights of std 0.02). An
optimizer registered with ``master_weights=False`` (:mod:`.optimizer`) keeps the trained weights in
bfloat16 instead, 8 to 10 bytes per parameter, and keeps the small updates itself (or, pure bf16,
loses them). Frozen weights (the reference copy, a frozen vision tower, a LoRA base model) are
stored in the compute dtype either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch

from mmrl.registry import OPTIMIZERS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def compute_dtype(name: str) -> torch.dtype:
    """``model.dtype`` as a torch dtype, with the valid names when it is none of them."""
    if name not in DTYPES:
        raise ValueError(f"model.dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def trained_dtype(optim: str, compute: torch.dtype) -> torch.dtype:
    """The dtype the trained parameters are kept in under ``train.optim=optim``: float32 master
    weights for an optimizer registered with ``master_weights=True``, else the compute dtype, which
    must then be bfloat16 (``model.dtype=float32`` with a bf16-weight optimizer is refused rather
    than silently trained in float32: the run would not measure what its config names). An unknown
    name lists the registered ones."""
    if OPTIMIZERS.get(optim, "train.optim").master_weights:
        return torch.float32
    if compute != torch.bfloat16:
        name = next(k for k, v in DTYPES.items() if v == compute)
        raise ValueError(f"train.optim={optim} keeps the trained weights in bfloat16 and needs "
                         f"model.dtype=bfloat16, got model.dtype={name}: set model.dtype=bfloat16, or "
                         "train.optim=adamw_torch (float32 master weights)")
    return compute


def keep_trained_weights(params: Iterable[torch.nn.Parameter], dtype: torch.dtype) -> None:
    """Trained parameters to ``dtype`` (:func:`trained_dtype`) in place: the optimizer updates these."""
    for p in params:
        if p.dtype != dtype:
            p.data = p.data.to(dtype)


def autocast(device: torch.device, dtype: torch.dtype):
    """The forward-pass context: autocast to the compute dtype (a no-op in float32)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
