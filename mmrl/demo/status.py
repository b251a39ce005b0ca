"""What the demo says about a run: its state (running, finished, stopped, failed) and one line
of progress, with numbers rounded for reading.

A run's own directory tells only part of its story: the trainer writes ``summary.json`` after the
last step and its final eval, so a run with a summary finished; one without it is either still
going or was stopped (killed, interrupted, out of memory) before its end. The process that runs it
tells the rest, when the demo started it (:class:`~mmrl.demo.launcher.Launcher` passes its state
in). For a run started elsewhere (``mmrl train`` in a terminal) the files are all there is: no
write for :data:`STALE_S` seconds (or many step times, for slow steps) reads as stopped.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Optional

from .runs_index import read_metrics, read_summary

__all__ = ["STALE_S", "describe", "rounded", "run_state"]

STALE_S = 600.0  # a run that wrote nothing for 10 minutes (and 20 of its step times) is not going on
SIGNIFICANT = 4
_WRITTEN = ("metrics.jsonl", "config.yaml", "launch.log", "checkpoints")


def rounded(value: Any, digits: int = SIGNIFICANT) -> Any:
    """A float to ``digits`` significant digits (``1.1100000143051147`` -> ``1.11``); anything
    else (ints, None, strings, NaN) as it is. Metrics are float32 values written as float64."""
    if isinstance(value, bool) or not isinstance(value, float) or not math.isfinite(value) or value == 0:
        return value
    return float(f"{value:.{digits}g}")


def _last_write(run_dir: Path) -> Optional[float]:
    times = [(run_dir / name).stat().st_mtime for name in _WRITTEN if (run_dir / name).exists()]
    return max(times, default=None)


def run_state(run_dir: Path, now: Optional[float] = None) -> str:
    """The state of a run read from its files alone: "not started" (no directory), "finished"
    (summary.json), "stopped" (no write for :data:`STALE_S` s and 20 step times) or "running"."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return "not started"
    if read_summary(run_dir):
        return "finished"
    last = _last_write(run_dir)
    if last is None:
        return "not started"
    metrics = read_metrics(run_dir)
    step_time = metrics[-1].get("step_time") if metrics else None
    patience = max(STALE_S, 20 * step_time) if isinstance(step_time, (int, float)) else STALE_S
    return "stopped" if (now if now is not None else time.time()) - last > patience else "running"


def describe(name: str, status: dict[str, Any]) -> str:
    """One markdown line for a run's ``status`` (``Launcher.status``): its state and where it is,
    e.g. "**r1**: stopped at step 5 of 8, reward 0.42"; "" for a run not started."""
    state = status["state"]
    if state == "not started":
        return ""
    where = f"step {status.get('step') or 0}" + (f" of {status['steps']}" if status.get("steps") else "")
    if state in ("stopped", "failed"):
        line = f"{state} at {where}"
        if state == "failed" and status.get("returncode") is not None:
            line += f" (exit code {status['returncode']}; see the log)"
    else:
        line = f"{state}, {where}"
    if status.get("reward") is not None:
        line += f", reward {rounded(status['reward'], 3)}"
    return f"**{name}**: {line}"

