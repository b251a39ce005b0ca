"""Out-of-memory back-off, shared by training (samples per forward) and generation (sequences per
``generate`` call): an out-of-memory error halves the size and the work is redone; the smaller size
is kept, or, with ``train.oom_grow_back_steps`` = N > 0, doubled again after N calls in a row that
fit (an odd long batch should not slow the rest of the run for good)."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA (or CPU allocator) out-of-memory error: accelerate's test, which ``find_executable_batch_size``
    uses too, plus torch's own exception type."""
    from accelerate.utils.memory import should_reduce_batch_size

    return isinstance(exc, torch.OutOfMemoryError) or should_reduce_batch_size(exc)


class OOMBackoff:
    """A cap on a batch size that out-of-memory errors have lowered (``None``: no cap yet)."""

    def __init__(self, what: str, grow_back_steps: int = 0):
        self.what = what  # for the log: "samples per forward", "sequences per generate call"
        self.grow_back_steps = max(0, int(grow_back_steps))
        self.limit: int | None = None
        self._fitted = 0  # calls in a row that fit under the current cap

    def size(self, wanted: int) -> int:
        """The size to try: ``wanted`` (the configured size, at least 1) under the cap."""
        return max(1, min(wanted, self.limit or wanted))

    def shrink(self, tried: int) -> int:
        """After an out-of-memory error at ``tried`` (> 1): half of it, kept as the cap."""
        self.limit, self._fitted = max(1, tried // 2), 0
        log.warning("out of memory at %d %s; retrying with %d", tried, self.what, self.limit)
        return self.limit

    def fitted(self, wanted: int) -> None:
        """A call at :meth:`size` (``wanted``) completed: after ``grow_back_steps`` of them in a
        row the cap doubles, and goes once it reaches ``wanted``."""
        if self.limit is None or not self.grow_back_steps:
            return
        self._fitted += 1
        if self._fitted >= self.grow_back_steps:
            self.limit, self._fitted = (None if 2 * self.limit >= wanted else 2 * self.limit), 0
            log.info("%d calls fitted; growing back to %d %s", self.grow_back_steps, self.size(wanted), self.what)
