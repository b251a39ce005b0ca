"""Ctrl-C during training: the first one finishes the step and saves, the second stops at once.

A user who presses Ctrl-C wants the run to stop, rarely to lose the steps since the last
checkpoint. So the first SIGINT only asks: the step under way completes, a checkpoint of it is
written, and the trainer returns saying where it stopped and how to resume. A second SIGINT is
the user insisting: :class:`TrainingInterrupted` is raised at once (a ``KeyboardInterrupt``, so
code that catches that still does), carrying what the command line needs to say what was lost.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Callable, Optional

__all__ = ["StopOnInterrupt", "TrainingInterrupted"]


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C before its last step.

    ``step``: the last step completed; ``checkpoint_step``: the step of the newest checkpoint on
    disk (None: none yet); ``saved``: whether the stop wrote that checkpoint itself."""

    def __init__(self, run_dir: Path, step: int, checkpoint_step: Optional[int], saved: bool = False):
        super().__init__(f"training stopped at step {step}")
        self.run_dir, self.step, self.checkpoint_step, self.saved = Path(run_dir), step, checkpoint_step, saved


class StopOnInterrupt:
    """A context in which the first SIGINT sets :attr:`requested` (and calls ``announce``), and a
    second raises ``KeyboardInterrupt``. Outside the main thread (where Python cannot take signals)
    it installs nothing and Ctrl-C behaves as usual."""

    def __init__(self, announce: Callable[[], None] = lambda: None):
        self.announce = announce
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.announce()

    def __enter__(self) -> "StopOnInterrupt":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
