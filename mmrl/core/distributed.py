"""Several processes (``accelerate launch`` / ``torchrun``): this rank's share of a step and the
few collectives the loop needs, on accelerate's ``PartialState`` over torch.distributed.

Nothing here replaces the backend: gradients are averaged by DDP / FSDP2 / DeepSpeed through
``accelerate.Accelerator`` (owned by :class:`~mmrl.core.policy.PolicyBase`). What the RL loop adds
is bookkeeping: whole groups per rank, per-rank seeds, and the small per-sample values (rewards,
masks, example ids) gathered so that estimators and metrics see the whole batch.

A run not started by a launcher (``WORLD_SIZE`` unset or 1) never creates a process group, and
every helper below is then the identity: single-process runs stay exactly as they were.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Sequence

import torch

# Added to the (seed, step) salt of rank r > 0: far above the loop's own salts (< 2000), so no
# two ranks and no two purposes share a seed. Rank 0 adds nothing: it draws what one process would.
RANK_SALT = 1_000_003


def launched() -> bool:
    """Started by a launcher with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def use_cpu(device: str = "auto") -> bool:
    """accelerate's ``cpu`` flag: gloo on CPU when asked, or when there is no CUDA device."""
    return str(device).startswith("cpu") or not torch.cuda.is_available()


def init(device: str = "auto", timeout_s: float = 1800.0) -> None:
    """Join the process group once (idempotent); a hung collective raises after ``timeout_s``."""
    if not launched() or active():
        return
    from accelerate import PartialState

    PartialState(cpu=use_cpu(device), timeout=datetime.timedelta(seconds=float(timeout_s)))


def active() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if active() else 0


def world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    return rank() == 0


def device() -> torch.device:
    """This rank's device (``cuda:LOCAL_RANK`` on GPUs, CPU under gloo)."""
    from accelerate import PartialState

    return PartialState().device


def rank_salt() -> int:
    return RANK_SALT * rank()


def shard_bounds(n: int, r: int | None = None, world: int | None = None) -> tuple[int, int]:
    """Rank ``r``'s contiguous block of ``n`` items (the first ``n % world`` ranks get one more):
    concatenating the blocks in rank order gives back the single-process order."""
    r = rank() if r is None else r
    world = world_size() if world is None else world
    base, extra = divmod(n, world)
    start = r * base + min(r, extra)
    return start, start + base + (1 if r < extra else 0)


def shard(items: Sequence[Any]) -> list[Any]:
    start, stop = shard_bounds(len(items))
    return list(items[start:stop])


# -- collectives (each is the identity in one process) -------------------------------------------
def gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (pickled: meant for small values)."""
    if not active():
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not active():
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_sum(x: float) -> float:
    return float(sum(gather(float(x)))) if active() else float(x)


def all_max(x: float) -> float:
    return float(max(gather(float(x)))) if active() else float(x)


def barrier() -> None:
    if active():
        import torch.distributed as dist

        dist.barrier()
