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

import contextlib
import datetime
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from . import thread_groups

# Added to the (seed, step) salt of rank r > 0: far above the loop's own salts (< 2000), so no
# two ranks and no two purposes share a seed. Rank 0 adds nothing: it draws what one process would.
RANK_SALT = 1_000_003
STORE_PREFIX = "mmrl/collective/"  # + group tag + rank: the last collective that rank entered there (c10d store)

log = logging.getLogger(__name__)
_timeout_s = 1800.0  # the process group's collective timeout, as given to init()
_entered: dict[str, int] = {}  # per group tag: collectives this rank entered (the same on every rank that keeps up)


class CollectiveTimeoutError(RuntimeError):
    """A collective failed while another rank had not reached it: that rank is named."""


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

    global _timeout_s
    _timeout_s = float(timeout_s)
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


def pick_device(name: str) -> torch.device:
    """``train.device``: ``auto`` is CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def policy_device(cfg) -> torch.device:
    """``train.device``, except that a launched run puts each rank on its own accelerator."""
    init(cfg.train.device, cfg.train.distributed_timeout)
    if active() and cfg.train.device in ("auto", "cuda"):
        return device()
    return pick_device(cfg.train.device)


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


# -- naming the rank that stalls ---------------------------------------------------------------
# A hung collective only says "timed out" on the rank that waited. Each rank therefore records in
# the process group's key-value store (the launcher's, which outlives the ranks) the number, kind
# and call site of every collective it enters. When one fails, the ranks whose count is behind are
# the ones that never arrived, and the error names them with what they last did. Half-way through
# the timeout a warning says the same, which is all that shows where NCCL's watchdog ends the
# process itself.
@contextlib.contextmanager
def watched(what: str) -> Iterator[None]:
    """Run one collective (every rank in the same order) so that a stall names the late rank."""
    if not active():
        yield
        return
    tag = thread_groups.current_tag()
    _entered[tag] = _entered.get(tag, 0) + 1
    entry = [_entered[tag], what, _call_site(), time.time(), tag]
    _store_call(lambda store: store.set(f"{STORE_PREFIX}{tag}{rank()}", json.dumps(entry)))
    timer = threading.Timer(_timeout_s / 2, _warn_if_behind, (entry,))
    timer.daemon = True
    timer.start()
    try:
        yield
    except Exception as exc:
        behind = _ranks_behind(entry[0], tag)
        if behind:
            raise CollectiveTimeoutError(
                f"{_describe(entry)} failed on rank {rank()} after {time.time() - entry[3]:.1f} s "
                f"(train.distributed_timeout {_timeout_s:g} s) because {_late(behind)}. That rank is stuck "
                "or slow in the work before this collective (generation, an environment, a reward, a "
                "save) or has died; if that work can take longer, raise train.distributed_timeout."
            ) from exc
        raise
    finally:
        timer.cancel()


def _describe(entry: list) -> str:
    where = f" of {entry[4].rstrip('/')}" if len(entry) > 4 and entry[4] else ""
    return f"collective #{entry[0]}{where} ({entry[1]} at {entry[2]})"


def _late(behind: dict[int, list | None]) -> str:
    parts = []
    for r, last in behind.items():
        seen = (f"its last was {_describe(last)}, entered {time.time() - last[3]:.1f} s ago" if last
                else "it entered none")
        parts.append(f"rank {r} has not reached it ({seen})")
    return "; ".join(parts)


def _warn_if_behind(entry: list) -> None:
    behind = _ranks_behind(entry[0], entry[4])
    if behind:
        log.warning("rank %d has waited %.0f s in %s: %s", rank(), time.time() - entry[3], _describe(entry),
                    _late(behind))


def _ranks_behind(count: int, tag: str = "") -> dict[int, list | None]:
    """The other ranks whose last entered collective (of the group ``tag``) comes before number
    ``count``, with it."""
    def read(store) -> dict[int, list | None]:
        behind = {}
        for r in range(world_size()):
            key = f"{STORE_PREFIX}{tag}{r}"
            if r == rank():
                continue
            last = json.loads(store.get(key)) if store.check([key]) else None
            if last is None or last[0] < count:
                behind[r] = last
        return behind

    return _store_call(read) or {}


def _store_call(fn):
    """``fn(store)`` on the default group's store; None when there is none or it cannot answer."""
    try:
        from .library_internals import default_store

        return fn(default_store())
    except Exception:  # the store is bookkeeping: never the cause of a failure
        return None


def _call_site() -> str:
    """The first caller outside this module and contextlib, as ``package/file.py:line (function)``."""
    frame = sys._getframe(1)
    while frame and frame.f_code.co_filename in (__file__, contextlib.__file__):
        frame = frame.f_back
    if frame is None:
        return "?"
    path = frame.f_code.co_filename.replace(os.sep, "/")
    short = "/".join(path.split("/")[-2:])
    return f"{short}:{frame.f_lineno} ({frame.f_code.co_name})"


# -- collectives (each is the identity in one process) -------------------------------------------
def gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (pickled: meant for small values)."""
    if not active():
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    with watched("gather"):
        dist.all_gather_object(out, obj, group=thread_groups.current())
    return out


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not active():
        return obj
    import torch.distributed as dist

    box = [obj]
    with watched("broadcast"):
        dist.broadcast_object_list(box, src=0, group=thread_groups.current())
    return box[0]


def all_sum(x: float) -> float:
    return float(sum(gather(float(x)))) if active() else float(x)


def all_max(x: float) -> float:
    return float(max(gather(float(x)))) if active() else float(x)


def barrier() -> None:
    if active():
        import torch.distributed as dist

        with watched("barrier"):
            dist.barrier(group=thread_groups.current())


def sum_over_ranks(sums: dict[str, float], count: int) -> tuple[dict[str, float], int]:
    """Every rank's metric sums and term counts added up: the means of a training step are then
    over all ranks' loss terms (and a summed metric such as the loss is the global one)."""
    total: dict[str, float] = {}
    n = 0
    for s, c in gather((sums, count)):
        n += c
        for k, v in s.items():
            total[k] = total.get(k, 0.0) + v
    return total, n


def require_equal_shares(samples: int, backend: str) -> None:
    """Stop unless every rank trains on ``samples`` samples this mini-batch: the policies' loss
    terms follow the mini-batch size, and each of them is a collective under ``backend``."""
    sizes = gather(samples)
    if len(set(sizes)) > 1:
        raise RuntimeError(
            f"{backend} needs every rank to train on as many samples per mini-batch; this one has {sizes} "
            "(one per rank). Make train.prompts_per_step and train.mini_batch_size multiples of the "
            "process count, and avoid what keeps a different number of samples per rank (dynamic "
            "sampling, multi-turn episodes), or launch with DDP (configs/accelerate/ddp.yaml)")
