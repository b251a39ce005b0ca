"""What a run shows on the terminal while it runs: the progress of its steps, and the held-out
before/after table at its end. A terminal gets rich's live bar and a table at its width; stdout
that is a file or a pipe (a cluster job's log) gets the bar's columns as plain flushed lines as the
run goes, and tables at their full width."""

from __future__ import annotations

import io
import math
import numbers
import sys
import time
from typing import Any, Mapping, Optional, Sequence

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from .logging import scalar

__all__ = ["TrainingProgress", "output_console", "print_before_after"]


def _fmt(value: Any, spec: str = ".3f") -> str:
    value = scalar(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return format(float(value), spec)
    return str(value)


_WIDE = 10_000  # columns: "as wide as what is printed"


def output_console() -> Console:
    """stdout's console for tables: a terminal's own width, and when stdout is a file or a pipe (a
    cluster job's log) no width limit, so a table is neither cut nor wrapped at rich's 80 columns."""
    console = Console()
    return console if console.is_terminal else Console(width=_WIDE)


class TrainingProgress:
    """Progress bar: description, bar, ``step M/N``, the run's ``metric`` (RL's reward, SFT's
    loss), step time, elapsed and ETA.

    When resuming, the bar starts at ``start_step`` and the ETA is estimated from the steps done
    since then (rich only samples speed from updates, not from the initial ``completed``).
    With ``enabled=False`` every call is a no-op. On a non-terminal stdout (a job log, CI, a file)
    a live bar would print nothing until the end, so the same columns are printed as plain lines,
    flushed at once: after the first step, every :data:`PLAIN_EVERY` of the run (1/20th, 5%), at
    least every :data:`PLAIN_EVERY_SECONDS`, and after the last step.
    """

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        enabled: bool = True,
        description: str = "train",
        console: Optional[Console] = None,
        metric: str = "reward",
    ):
        self.total_steps = int(total_steps)
        self.metric = metric
        self.start_step = int(start_step)
        self.enabled = enabled
        self.description = description
        self.plain = enabled and not (console or Console()).is_terminal  # lines, not a live bar
        self._file = console.file if console is not None else None  # None: sys.stdout when printing
        self._every = max(1, math.ceil(self.total_steps * PLAIN_EVERY))
        self._clock = time.monotonic
        self._began = self._last_line = 0.0
        self._progress = Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            TextColumn("step {task.completed:.0f}/{task.total:.0f}"),
            TextColumn(metric + " {task.fields[reward]}"),
            TextColumn("step time {task.fields[step_time]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[extra]}"),
            console=console,
            disable=not enabled or self.plain,
            transient=False,
        )
        self._task = self._progress.add_task(
            description,
            total=self.total_steps,
            completed=self.start_step,
            reward="-",
            step_time="-",
            extra="",
        )
        self._started = False

    def __enter__(self) -> "TrainingProgress":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        if not self._started:
            self._progress.start()
            self._started = True
            self._began = self._last_line = self._clock()

    def stop(self) -> None:
        if self._started:
            self._progress.stop()
            self._started = False

    def update(self, step: int, reward: Any = None, step_time: Any = None, **extra: Any) -> None:
        """Show that ``step`` steps are complete (absolute, not an increment); the ``metric``
        column shows ``reward`` or the keyword named as the metric."""
        fields: dict[str, Any] = {}
        reward = extra.pop(self.metric, reward)
        if reward is not None:
            fields["reward"] = _fmt(reward, ".3f")
        if step_time is not None:
            fields["step_time"] = _fmt(step_time, ".2f") + "s"
        if extra:
            fields["extra"] = " ".join(f"{k} {_fmt(v)}" for k, v in extra.items())
        self._progress.update(self._task, completed=int(step), **fields)
        if self.plain:
            self._plain_line(int(step), fields)

    def _plain_line(self, step: int, fields: Mapping[str, str]) -> None:
        """The bar's columns as one flushed line, when one is due (class docstring)."""
        now = self._clock()
        due = (step == self.start_step + 1 or step % self._every == 0 or step >= self.total_steps
               or now - self._last_line >= PLAIN_EVERY_SECONDS)
        if not due:
            return
        self._last_line = now
        elapsed = now - self._began
        done = max(step - self.start_step, 1)
        remaining = elapsed / done * max(self.total_steps - step, 0)
        parts = [f"{self.description} step {step}/{self.total_steps} ({100 * step / max(self.total_steps, 1):.0f}%)",
                 f"{self.metric} {fields.get('reward', '-')}", f"step time {fields.get('step_time', '-')}",
                 f"elapsed {_clock_text(elapsed)}", f"remaining {_clock_text(remaining)}"]
        if fields.get("extra"):
            parts.append(fields["extra"])
        file = self._file or sys.stdout
        file.write(" | ".join(parts) + "\n")
        file.flush()

    def log(self, message: str) -> None:
        """Print a line above the bar (plain print would garble the live display)."""
        if self.enabled:
            self._progress.console.print(message)


PLAIN_EVERY = 0.05  # of the run's steps, between two plain progress lines
PLAIN_EVERY_SECONDS = 60.0  # and at most this long between them (a long run's slow steps)


def _clock_text(seconds: float) -> str:
    """``H:MM:SS``, as rich's bar shows elapsed and remaining time."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def print_before_after(
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    title: str = "Evaluation: before vs after training",
    console: Optional[Console] = None,
    intervals: Optional[Mapping[str, Mapping[str, Sequence[float]]]] = None,
) -> str:
    """Print a table of metrics before and after training and return it as plain text.

    Rows are the metric names (those of ``before`` first, then any only in ``after``); the change
    column is ``after - before``; ``intervals`` (``{"before": {metric: (low, high)}, "after": ...}``,
    summary.json's) adds each value's confidence interval. The returned text is what a run also
    writes to its log.
    """
    names = list(before) + [k for k in after if k not in before]

    def table(colour: bool) -> Table:
        t = Table(title=title)
        t.add_column("metric")
        t.add_column("before", justify="right")
        t.add_column("after", justify="right")
        t.add_column("change", justify="right")
        for name in names:
            b, a = scalar(before.get(name)), scalar(after.get(name))
            change = "-"
            if isinstance(b, numbers.Real) and isinstance(a, numbers.Real):
                d = float(a) - float(b)
                change = "nan" if math.isnan(d) else f"{d:+.4f}"
                if colour and d != 0 and not math.isnan(d):
                    change = f"[{'green' if d > 0 else 'red'}]{change}[/]"
            fmt = lambda v: "-" if v is None else _fmt(v, ".4f")  # noqa: E731
            t.add_row(name, fmt(b) + _interval(intervals, "before", name), fmt(a) + _interval(intervals, "after", name),
                      change)
        return t

    buf = io.StringIO()
    Console(file=buf, width=_WIDE, color_system=None, force_terminal=False).print(table(False))
    (console or output_console()).print(table(True))
    return buf.getvalue()


def _interval(intervals, when: str, name: str) -> str:
    """`` [low, high]`` of ``name``'s interval at ``when`` (before / after), or nothing."""
    low_high = ((intervals or {}).get(when) or {}).get(name)
    if not low_high or any(v is None or not math.isfinite(float(v)) for v in low_high):
        return ""
    return f" [{float(low_high[0]):.3f}, {float(low_high[1]):.3f}]"
