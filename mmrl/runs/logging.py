"""What a run leaves in its run directory (what it shows on the terminal: :mod:`mmrl.runs.terminal`).

Run directory::

    metrics.jsonl                     one JSON object per logged step: {"step", "time", **metrics}
    tensorboard/                      the same scalars for TensorBoard (wandb/, mlruns/: log.report_to)
    rollouts/step_000010/0.png        sampled rollouts: input image, visualisation (boxes drawn),
    rollouts/step_000010/0_vis.png    and rollouts.jsonl with prompt, completion, rewards ...
    rollouts/step_000010/rollouts.jsonl

metrics.jsonl is the source of truth (plain text, greppable, loads with pandas); the trackers of
``log.report_to`` (TensorBoard by default; :mod:`mmrl.runs.trackers`) get the same numeric scalars,
the config, and the pictures: the saved rollouts' PNGs, and ``samples_before.png`` /
``samples_after.png`` at the step logged after the evaluation wrote them. On resume the trainer calls
:meth:`RunLogger.truncate_after` with the checkpoint's step so the steps that are re-run are not
logged twice.
"""

from __future__ import annotations

import io
import json
import math
import numbers
import os
import shutil
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from .disk import naming_disk_errors
from .trackers import Trackers, tracker_names

__all__ = ["RunLogger", "read_jsonl", "scalar", "to_jsonable", "write_summary"]


def scalar(value: Any) -> Any:
    """Tensors / NumPy values with one element -> Python float (bool stays bool); else unchanged."""
    if hasattr(value, "numel") and hasattr(value, "item"):  # torch.Tensor without importing torch
        if value.numel() != 1:
            return value.detach().cpu().tolist()
        v = value.item()
    elif type(value).__module__ == "numpy" and hasattr(value, "item"):
        if getattr(value, "size", 1) != 1:
            return value.tolist()
        v = value.item()
    else:
        return value
    return float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else v


def to_jsonable(value: Any) -> Any:
    """Recursively make ``value`` JSON-serialisable (tensors and NumPy to floats/lists, else str).
    NaN and infinity become None (``null``): they are not JSON (a metric with nothing to average,
    such as ``mae`` when no answer parses, is NaN in Python)."""
    value = scalar(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return str(value)


def write_summary(run_dir: Union[str, Path], **summary: Any) -> None:
    """``summary.json``: what a finished run reports (before / after metrics, steps, the data it
    skipped), as strict JSON: a NaN metric is ``null``."""
    text = json.dumps(to_jsonable(summary), indent=2, allow_nan=False)
    (Path(run_dir) / "summary.json").write_text(text, encoding="utf-8")


def read_jsonl(path: Union[str, Path]) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file (metrics.jsonl, skipped_steps.jsonl, ...), in file order.
    A line that is not one (the torn last line of a killed run, a stray blank or array) is skipped,
    as are undecodable bytes: a run's logs are read back as far as they are readable."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


def _is_pil(value: Any) -> bool:
    return hasattr(value, "save") and hasattr(value, "mode") and hasattr(value, "size")


def _is_clip(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(_is_pil(v) for v in value)


GALLERIES = ("samples_before.png", "samples_after.png")  # the evaluations' contact sheets, sent to trackers


class RunLogger:
    """Appends metrics to ``metrics.jsonl`` and the trackers, and saves sampled rollouts.

    ``report_to`` is ``log.report_to`` (default: TensorBoard); ``tensorboard=False`` is
    ``log.tensorboard=false``, the older switch, and drops TensorBoard from it. ``config`` (the
    run's :class:`~mmrl.config.schema.Config`) is what the trackers store as the run's parameters.
    """

    def __init__(self, run_dir: Union[str, Path], tensorboard: bool = True,
                 report_to: Optional[Sequence[str]] = None, config: Any = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        names = tracker_names(["tensorboard"] if report_to is None else report_to, tensorboard)
        self.trackers = Trackers(self.run_dir, names, config)
        self._file: Optional[io.TextIOBase] = None
        self._galleries = {name: self._mtime(name) for name in GALLERIES}  # those of an earlier start: sent then

    # -- metrics -----------------------------------------------------------------------------

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """One JSON line per call (flushed at once, so a killed run keeps what it logged)."""
        clean = {k: to_jsonable(v) for k, v in metrics.items()}
        record = {"step": int(step), "time": time.time(), **clean}
        with naming_disk_errors(self.metrics_path):  # a full disk's write error names no file
            if self._file is None:
                self._file = open(self.metrics_path, "a", encoding="utf-8")
            self._file.write(json.dumps(record, allow_nan=False) + "\n")
            self._file.flush()
        scalars = {k: float(v) for k, v in clean.items() if isinstance(v, numbers.Real)}  # not str, list, None
        self.trackers.log(step, scalars, images=self._new_galleries())

    def _mtime(self, name: str) -> Optional[int]:
        try:
            return (self.run_dir / name).stat().st_mtime_ns
        except OSError:
            return None

    def _new_galleries(self) -> dict[str, Path]:
        """The contact sheets written (or rewritten) since the last call: ``samples_before`` goes
        with step 0's eval metrics, ``samples_after`` with the final step's."""
        if not self.trackers.names:
            return {}
        new = {}
        for name in GALLERIES:
            mtime = self._mtime(name)
            if mtime is not None and mtime != self._galleries[name]:
                self._galleries[name] = mtime
                new[Path(name).stem] = self.run_dir / name
        return new

    def truncate_after(self, step: int, final: bool = False) -> None:
        """Keep only metric lines with ``step <= step`` (and drop a torn last line from a kill),
        and only the saved rollouts of those steps (and the skipped-step records): a resumed run
        re-runs the later steps, and every step must appear once. ``final``: ``step`` is the run's
        last step (it resumes from its last checkpoint and only evaluates again), so an evaluation
        logged on its own at ``step`` is dropped too; a run resumed to train further keeps it."""
        self._drop_rollouts_after(step)
        self._truncate_jsonl(self.run_dir / "skipped_steps.jsonl", step)
        if self._file is not None:
            self._file.close()
            self._file = None
        self.trackers.purge_after(step)  # TensorBoard drops the events of the steps re-run
        self._truncate_jsonl(self.metrics_path, step, drop_evaluation_at=step if final else None)

    @staticmethod
    def _truncate_jsonl(path: Path, step: int, drop_evaluation_at: Optional[int] = None) -> None:
        """Rewrite ``path`` (atomically) with its records of ``step <= step`` only, less the
        evaluation-only records (``eval/`` and ``data/`` keys alone) of ``drop_evaluation_at``."""
        if not path.exists():
            return

        def evaluation_only(rec: dict) -> bool:
            return all(k in ("step", "time") or k.startswith(("eval/", "data/")) for k in rec)

        kept = [json.dumps(rec) + "\n" for rec in read_jsonl(path)
                if isinstance(rec.get("step"), (int, float)) and rec["step"] <= step
                and not (rec["step"] == drop_evaluation_at and evaluation_only(rec))]
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _drop_rollouts_after(self, step: int) -> None:
        for folder in (self.run_dir / "rollouts").glob("step_*"):
            number = folder.name[len("step_"):]
            if number.isdigit() and int(number) > step:
                shutil.rmtree(folder, ignore_errors=True)

    # -- rollouts ----------------------------------------------------------------------------

    def save_rollouts(self, step: int, records: Sequence[Mapping[str, Any]]) -> Path:
        """Save images as PNGs and everything else as ``rollouts.jsonl`` in ``rollouts/step_XXXXXX``.

        ``image`` -> ``{i}.png``, ``visualization`` -> ``{i}_vis.png``, any other PIL value under
        key ``k`` -> ``{i}_{k}.png``, a clip (a list of PIL frames, a video generator's completion)
        -> ``{i}_{k}.gif`` at 8 frames per second; the record keeps the file name in its place.
        """
        out_dir = self.run_dir / "rollouts" / f"step_{int(step):06d}"
        out_dir.mkdir(parents=True, exist_ok=True)
        lines = []
        for i, rec in enumerate(records):
            row: dict[str, Any] = {"index": i}
            for key, value in rec.items():
                if _is_pil(value):
                    name = {"image": f"{i}.png", "visualization": f"{i}_vis.png"}.get(key, f"{i}_{key}.png")
                    value.save(out_dir / name)
                    row[key] = name
                elif _is_clip(value):
                    name = f"{i}_{key}.gif"
                    value[0].save(out_dir / name, save_all=True, append_images=list(value[1:]), duration=125, loop=0)
                    row[key] = name
                else:
                    row[key] = to_jsonable(value)
            lines.append(json.dumps(row, ensure_ascii=False) + "\n")
        with open(out_dir / "rollouts.jsonl", "w", encoding="utf-8") as f:
            f.writelines(lines)
        pictures = {f"rollouts/{p.stem}": p for p in sorted(out_dir.glob("*.png"))}  # clips (GIFs) stay here
        self.trackers.log(step, {}, images=pictures)
        return out_dir

    def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            with naming_disk_errors(self.metrics_path):  # the flush of a full disk's unwritten line
                file.close()
        self.trackers.finish()

    def __enter__(self) -> "RunLogger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
