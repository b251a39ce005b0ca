"""What a run left out, on the record: per split, what its data readers skipped, and the
generations cut by a time limit.

The readers count as they read (:meth:`mmrl.data.sequence.LazySequence.stats`): ``skipped_lines``
(records left out when the file was read), ``bad_images`` (images and clips that would not open),
``bad_targets`` (boxes, clicks, segments that cannot be trained on), beside ``examples``. The
trainer logs them with every logged step as ``data/<split>/<count>`` in ``metrics.jsonl``
(``data/train/bad_images``, ``data/eval/bad_targets`` ...), and writes the last counts in
``summary.json`` under ``data``, one entry per split, the train entry with ``rollout_timeouts``
summed over the run's ``metrics.jsonl``. The examples an evaluation skipped are its
``eval/skipped``. With several processes each reads its own share, so a count is the largest of
any process (a bad file read by two is not counted twice).
"""

from __future__ import annotations

import json
import numbers
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..data.sequence import split_stats
from . import distributed as dist


class SkipRecord:
    """The counts of the ``train`` and ``eval`` example sequences a run uses (the very objects
    its batches and evaluations read, so their counts are those of the run)."""

    def __init__(self, splits: dict[str, Sequence]):
        self.splits = splits
        self.last: dict[str, dict[str, Any]] = {}

    def metrics(self) -> dict[str, float]:
        """``data/<split>/<count>`` of every numeric count, the largest over the processes (every
        process must call it: it gathers)."""
        local = {name: split_stats(examples) for name, examples in self.splits.items()}
        merged: dict[str, dict[str, Any]] = {}
        for counts in dist.gather(local):
            for name, stats in counts.items():
                into = merged.setdefault(name, {})
                for key, value in stats.items():
                    if isinstance(value, numbers.Real) and isinstance(into.get(key, 0), numbers.Real):
                        into[key] = max(into.get(key, value), value)
                    else:
                        into.setdefault(key, value)
        self.last = merged
        return {f"data/{name}/{key}": float(v) for name, stats in merged.items() for key, v in stats.items()
                if isinstance(v, numbers.Real)}

    def with_counts(self, write: Optional[Callable[[int, dict], None]]) -> Callable[[int, dict], None]:
        """A ``log(step, metrics)`` that adds :meth:`metrics` to what it logs with ``write`` (None on
        the processes that write nothing; they still take part in the gathering)."""
        def log(step: int, metrics: dict) -> None:
            metrics = {**metrics, **self.metrics()}
            if write is not None:
                write(step, metrics)
        return log

    def summary(self, metrics_path: Path) -> dict[str, dict[str, Any]]:
        """``summary.json``'s ``data``: the last counts of each split (as of the last
        :meth:`metrics`), the train split's with ``rollout_timeouts`` summed over the run's
        ``metrics.jsonl`` (when generation had a time limit)."""
        out = {name: dict(stats) for name, stats in self.last.items()}
        timeouts, seen = 0.0, False
        if metrics_path.exists():
            for line in metrics_path.read_text(encoding="utf-8").splitlines():
                try:
                    value = json.loads(line).get("rollout_timeouts")
                except json.JSONDecodeError:
                    continue
                if isinstance(value, numbers.Real):
                    timeouts, seen = timeouts + float(value), True
        if seen:
            out.setdefault("train", {})["rollout_timeouts"] = timeouts
        return out
