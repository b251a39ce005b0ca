"""Which process group a thread's collectives use: a second thread that takes part in collectives
(asynchronous training's generator thread, :mod:`mmrl.core.async_rollouts`) runs them on a group
of its own. Collectives of two threads of one process on one group interleave (rank 0's thread A
meets rank 1's thread B) and deadlock; on two groups each is matched only with its own kind.

:func:`new_group` makes the group (gloo: the pickled objects :func:`mmrl.core.distributed.gather`
carries live on CPU, whatever the training backend, and NCCL communicators used from two threads
can deadlock); :func:`own_group` routes a thread's collectives to it while a block runs.
:mod:`mmrl.core.distributed`'s collectives read :func:`current` and :func:`current_tag`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

class _ThreadState(threading.local):
    """Per thread: the group its collectives use (None: the default group) and its tag."""

    group: Any = None
    tag: str = ""


_local = _ThreadState()


def new_group() -> Any:
    """Another process group over every rank, on gloo. A collective: every rank calls it, in the
    same order; None in one process (no process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return None
    return dist.new_group(backend="gloo")


@contextlib.contextmanager
def own_group(group: Any, tag: str) -> Iterator[None]:
    """While the block runs, this thread's collectives go to ``group`` (:func:`new_group`), counted
    apart under ``tag`` (so that a stall names the late rank within that group)."""
    _local.group, _local.tag = group, tag
    try:
        yield
    finally:
        _local.group, _local.tag = None, ""


def current() -> Any:
    """The group this thread's collectives use: None (the default group) outside :func:`own_group`."""
    return _local.group


def current_tag() -> str:
    return _local.tag
