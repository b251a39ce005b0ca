"""Sharded parameters (FSDP2, ``torch.distributed.fsdp.fully_shard``, applied by accelerate).

accelerate shards the trained module when the launch's config says ``distributed_type: FSDP``
(``fsdp_version: 2``); this module holds what the RL loop needs on top of it:

- two phases. Rollouts, scoring and evaluation run many forwards whose number differs across
  ranks (generation lengths, retries, refills), which sharded layers cannot do: each layer's
  forward is an all-gather every rank must join. So before rollouts every FSDP unit is gathered
  once (the same collectives on every rank) and kept gathered (``reshard_after_forward=False``,
  the use PyTorch documents for evaluation), the way verl's hybrid engine hands full weights to
  its rollout. Training re-shards the layers (gathered again, one at a time, in each forward);
  then every rank must run the same number of training forwards, checked per mini-batch.
- consolidated checkpoints: full state dicts of the model and the optimizer keyed by parameter
  name (``torch.distributed.checkpoint.state_dict``), gathered from every rank, written by rank 0,
  so a sharded run resumes with any process count, sharded or not.
- FSDP on CPU: accelerate enables it only for accelerator process groups; on gloo it would fall
  back to DDP without a word. :func:`enable_on_cpu` turns the launch's FSDP settings on there, so
  a CPU machine runs (and tests) the same sharded code path as a GPU node.
"""

from __future__ import annotations

import os
from typing import Any

import torch


def requested() -> bool:
    """The launch asks for FSDP (``accelerate launch`` with an FSDP config sets this variable)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def enable_on_cpu(accelerator) -> None:
    """Turn on the launch's FSDP settings where accelerate fell back to plain CPU data parallelism
    (gloo). The plugin reads the same ``FSDP_*`` variables accelerate's launcher exports."""
    from accelerate import FullyShardedDataParallelPlugin
    from accelerate.utils import DistributedType

    from .library_internals import set_process_distributed_type

    if accelerator.distributed_type != DistributedType.MULTI_CPU or not requested():
        return
    plugin = FullyShardedDataParallelPlugin()
    if offloaded(plugin):  # pinned host memory needs a CUDA driver: torch raises without one
        from torch.distributed.fsdp import CPUOffloadPolicy

        plugin.cpu_offload = CPUOffloadPolicy(pin_memory=False)
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin
    set_process_distributed_type(DistributedType.FSDP)  # a later AcceleratorState() copies it back


def offloaded(plugin) -> bool:
    """The FSDP2 plugin keeps the shards (and so the gradients and AdamW state) in CPU memory
    (``fsdp_offload_params: true``, FSDP2's ``CPUOffloadPolicy``)."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    return isinstance(plugin.cpu_offload, CPUOffloadPolicy)


def backend(accelerator) -> str:
    """``"FSDP2"``, ``"FSDP1"``, ``"DEEPSPEED"`` or accelerate's name of a replicated backend."""
    name = str(accelerator.distributed_type).rsplit(".", 1)[-1]
    if name == "FSDP":
        return f"FSDP{accelerator.state.fsdp_plugin.fsdp_version}"
    return name


def units(root: torch.nn.Module) -> list[torch.nn.Module]:
    """The FSDP units under ``root`` (itself first), in module order: the same on every rank."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in root.modules() if isinstance(m, FSDPModule)]


def gather_for_rollouts(root: torch.nn.Module) -> None:
    """Every unit all-gathered and kept so: forwards outside training need no collective.
    The first call also runs the root's lazy initialisation (a no-op forward through it), which
    must happen before any of its units runs a forward of its own."""
    root(lambda: None)
    for unit in units(root):
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()


def shard_for_training(root: torch.nn.Module) -> None:
    """The layers re-sharded (their gathered copies freed), each gathered again in its forward
    and freed after it; the root's own parameters (embeddings, head, norms) stay gathered, as
    FSDP2 keeps them between forward and backward anyway."""
    for unit in units(root)[1:]:
        unit.reshard()
        unit.set_reshard_after_forward(True, recurse=False)


def reshard_all(root: torch.nn.Module) -> None:
    """Every unit back to its shard (the registered parameters are the sharded ones again)."""
    for unit in units(root):
        unit.reshard()


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A sharded tensor's whole value (a collective: every rank calls it), else ``t``."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _options(everywhere: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # cpu_offload: gathered to rank 0's CPU memory only; otherwise every rank gets the whole
    return StateDictOptions(full_state_dict=True, cpu_offload=not everywhere)


def full_model_state(module: torch.nn.Module, everywhere: bool = False,
                     drop_tied: bool = False) -> dict[str, torch.Tensor]:
    """The whole state dict of a sharded ``module`` (call on every rank): on rank 0 only, or on
    every rank with ``everywhere``; ``drop_tied``: each tied parameter once, as a checkpoint
    stores it (see :func:`tied_duplicates`)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(module, options=_options(everywhere))
    tied = tied_duplicates(module) if drop_tied else set()
    return {k: v for k, v in state.items() if k not in tied}


def tied_duplicates(module: torch.nn.Module) -> set[str]:
    """Names under which a tied parameter appears a second time (an LM head sharing the input
    embedding): a gathered state dict holds a copy under each, a saved checkpoint only one."""
    every = {n for n, _ in module.named_parameters(remove_duplicate=False)}
    return every - {n for n, _ in module.named_parameters()}


def load_full_model_state(module: torch.nn.Module, state: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Shard a whole state dict (read by every rank) into ``module``'s parameters (``strict``
    False: a part of them, such as LoRA adapters)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
    )

    set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True, strict=strict))


def adapter_keys(module: torch.nn.Module) -> dict[str, str]:
    """For a peft model: the keys of its saved adapter file (peft's ``get_peft_model_state_dict``,
    adapter name removed) -> the module's own state-dict keys, so that a sharded module loads
    the adapters through :func:`load_full_model_state` (peft's loader copies into plain tensors).
    peft is handed one empty tag tensor per key and returns the tags under its keys: matched by
    identity, the renaming stays peft's own (the module's own sharded tensors would come back
    gathered into new ones: peft 0.22 gathers DTensors, a collective, for its callers' saves)."""
    from peft import get_peft_model_state_dict

    tags = {k: torch.empty(0) for k in module.state_dict()}
    key_of = {id(v): k for k, v in tags.items()}
    keys = {saved: key_of.get(id(v)) for saved, v in get_peft_model_state_dict(module, state_dict=tags).items()}
    unmatched = sorted(k for k, v in keys.items() if v is None)
    if unmatched:
        raise RuntimeError(f"cannot place saved adapter weights {unmatched[:3]} in the sharded model")
    return keys


def full_optimizer_state(module: torch.nn.Module, optimizer) -> dict[str, Any]:
    """The optimizer's state keyed by parameter name, gathered to rank 0 (call on every rank)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(module, optimizer, options=_options(everywhere=False))


def load_full_optimizer_state(module: torch.nn.Module, optimizer, state: dict[str, Any]) -> None:
    """Restore a state of :func:`full_optimizer_state` (sharded or replicated ``module``)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    set_optimizer_state_dict(module, optimizer, state, options=StateDictOptions(full_state_dict=True))


def optimizer_state_by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """``torch.optim``'s own state dict (parameters numbered in the order they were handed to the
    optimizer) keyed by parameter name instead: what a sharded optimizer loads. ``names`` are the
    trained parameters' names in that order."""
    index = dict(enumerate(names))
    return {"state": {index[i]: s for i, s in state["state"].items()},
            "param_groups": [{**g, "params": [index[i] for i in g["params"]]} for g in state["param_groups"]]}
