"""The accelerate side of a policy: the ``Accelerator`` of this process (DDP or FSDP2, from the
launch's accelerate config) and the module it prepares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import distributed as dist
from . import sharding, zero
from .library_internals import no_split_modules


class TrainForward(torch.nn.Module):
    """The module handed to ``accelerator.prepare``: its forward runs ``fn(*args)``, so a policy
    that calls submodules of its model (a VLM's backbone then its LM head in chunks; a
    generator's pipeline) still goes through DDP's / FSDP2's forward once per loss term."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module
        # FSDP's transformer-based wrapping reads the layer classes from the prepared model
        self._no_split_modules = no_split_modules(module)

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


def make_accelerator():
    """One ``Accelerator`` per process. Outside a launch it is forced to plain full precision
    with no device moves, so a single-process run computes exactly what it did without it; in a
    launch the accelerate config (DDP / FSDP2 / DeepSpeed, mixed precision) applies."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    # Buffers (rotary tables) are equal on every rank; broadcasting them at each forward would be
    # a collective per loss term, and ranks may run different numbers of terms.
    kwargs = {"kwargs_handlers": [DistributedDataParallelKwargs(broadcast_buffers=False)],
              "device_placement": False}
    if not dist.active():
        kwargs["mixed_precision"] = "no"
    accelerator = Accelerator(cpu=dist.use_cpu(), **kwargs)
    sharding.enable_on_cpu(accelerator)
    zero.enable_on_cpu(accelerator)
    return accelerator
