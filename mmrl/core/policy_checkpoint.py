"""A policy's checkpoint: its weights (LoRA: the adapters only, through peft's state-dict helpers;
full weights through the policy's ``save_weights`` / ``load_weights``) and the optimizer and
scheduler state.

Every rank calls :func:`save_policy` and :func:`load_policy` (a sharded strategy gathers the
weights and optimizer state, keyed by parameter name); rank 0 writes, every rank reads the same
consolidated files, so a run resumes with any process count, sharded or not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from . import distributed as dist

ADAPTER_FILE = "adapter_model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
RANK_FILE = "rank{:05d}.pt"  # what rank r alone holds (several processes: a run's own state per rank)


def save_policy(policy, path: Path) -> None:
    """Write ``policy``'s checkpoint under ``path`` (the directory is created)."""
    strategy = policy.strategy
    with strategy.whole_weights():
        weights = strategy.gathered_weights(policy.module, trained_only=policy.lora)
        optimizer = strategy.gathered_optimizer(policy.module) \
            if policy.optimizer is not None else None
    if not dist.is_main():
        return
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if policy.lora:
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        state = get_peft_model_state_dict(policy.module, state_dict=weights)  # weights: None unless gathered
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(path / ADAPTER_FILE))
    else:
        policy.save_weights(path, weights)
    if policy.optimizer is not None:
        by_name = optimizer is not None
        torch.save({"optimizer": optimizer if by_name else policy.optimizer.state_dict(), "by_name": by_name,
                    "scheduler": policy.scheduler.state_dict()}, path / OPTIMIZER_FILE)


def load_policy(policy, path: Path) -> None:
    """Restore what :func:`save_policy` wrote (optimizer state only when ``policy`` has an optimizer)."""
    path = Path(path)
    strategy = policy.strategy
    with strategy.whole_weights():
        if policy.lora:
            from safetensors.torch import load_file

            strategy.load_adapters(policy.module, load_file(str(path / ADAPTER_FILE)))
        else:
            policy.load_weights(path)
        saved = path / OPTIMIZER_FILE
        if saved.exists() and policy.optimizer is not None:
            state = torch.load(saved, map_location="cpu", weights_only=False)
            strategy.load_optimizer(policy.module, policy.optimizer, state["optimizer"], bool(state.get("by_name")),
                                    trained_names(policy.module))
            policy.scheduler.load_state_dict(state["scheduler"])


def trained_names(module: torch.nn.Module) -> list[str]:
    """The trained parameters' names, in the order the optimizer was given them."""
    return [n for n, p in module.named_parameters() if p.requires_grad]


def save_run_checkpoint(ckpt, step: int, policy, state: Callable[[list], dict], rank_state: dict | None = None) -> None:
    """A run's checkpoint of ``step``, published atomically: every rank takes part (a sharding
    strategy gathers the weights; each rank's RNG state is gathered), rank 0 writes the policy and
    ``state(rank_rngs)`` (``trainer.pt``) into ``ckpt``'s temp directory and commits it; with
    several processes each rank writes its own ``rank_state`` there too (:data:`RANK_FILE`).
    ``ckpt``: a :class:`~mmrl.runs.checkpoint.CheckpointManager`."""
    from ..runs.checkpoint import rng_state
    from ..runs.disk import naming_disk_errors

    main = dist.is_main()
    tmp = Path(dist.broadcast(str(ckpt.begin(step)) if main else None))
    try:
        # a full disk becomes an OSError naming the checkpoint, inside the abort: the space it frees
        # is what tells torch's writer error apart
        with naming_disk_errors(ckpt.step_dir(step)):
            policy.save(tmp / "policy")
            if rank_state and dist.world_size() > 1:
                torch.save(rank_state, tmp / RANK_FILE.format(dist.rank()))
            rngs = dist.gather(rng_state())  # also: every rank's own file is written before the commit
            if main:
                torch.save(state(rngs), tmp / "trainer.pt")
    except BaseException:
        if main:
            ckpt.abort(tmp)
        raise
    if main:
        ckpt.commit(step, tmp)
    dist.barrier()
