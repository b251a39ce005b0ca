"""The reference model of the KL term, and ProRL's reset of it.

Full fine-tuning keeps a frozen copy of the trained module, stored in the compute dtype; with
LoRA no copy is made: the base weights, reached by disabling the adapters, play this role.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator

import torch


class ReferenceModel:
    """``policy.module``'s reference: a frozen copy (``needs_copy``), or with LoRA the module run
    with its adapters disabled (``adapters_disabled``, a context factory of the policy)."""

    def __init__(self, module: torch.nn.Module, dtype: torch.dtype, *, needs_copy: bool,
                 adapters_disabled: Callable[[], contextlib.AbstractContextManager] | None):
        self.module = module
        self.copy = copy.deepcopy(module).eval().requires_grad_(False).to(dtype) if needs_copy else None
        self.adapters_disabled = adapters_disabled

    @contextlib.contextmanager
    def __call__(self) -> Iterator[torch.nn.Module]:
        if self.copy is not None:
            yield self.copy
        elif self.adapters_disabled is not None:
            with self.adapters_disabled():
                yield self.module
        else:
            raise RuntimeError("a reference model is needed (algo.beta > 0) but none was set up")

    def reset(self, strategy) -> None:
        """ProRL's reference reset ("ProRL: Prolonged Reinforcement Learning Expands Reasoning
        Boundaries in Large Language Models"): the copy takes the current weights (gathered whole
        under FSDP2 by ``strategy``)."""
        if self.copy is not None:
            with strategy.whole_weights():
                strategy.copy_weights(self.module, self.copy)
