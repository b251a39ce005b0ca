"""Reading a runs directory for the demo's "Runs" tab: runs, curves, rollouts, pictures, progress.

Everything here reads files that a training run may be writing at the same moment (the tab
refreshes while a run goes on), so a partial or corrupt file is never an error: a torn last line of
``metrics.jsonl`` is skipped, a broken ``summary.json`` reads as ``{}``. The layout is the one
:class:`~mmrl.runs.logging.RunLogger` and the trainer write (README, "The run directory").

Which directories are runs, and which of a run's files may be read (none that links outside
it), is :mod:`.run_dirs`: every file here is opened through its :func:`~.run_dirs.run_file`.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from omegaconf import OmegaConf

from ..runs.checkpoint import CheckpointManager
from ..runs.logging import read_jsonl
from .run_dirs import run_file

if TYPE_CHECKING:  # pandas comes with gradio (the `demo` extra), not with mmrl itself
    import pandas

__all__ = [
    "CURVE_PANELS", "curve_frames", "eval_pictures", "latest_checkpoint", "progress", "read_config_text",
    "read_metrics", "read_summary", "rollout_gallery", "rollout_steps",
]

PathLike = Union[str, Path]

_STEP_DIR = re.compile(r"^step_(\d+)$")
_PICTURE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp")
# Reward statistics that are not rewards: the share of unparsable completions and error counts.
_NOT_A_REWARD = ("/unparsable_frac", "/errors")
CAPTION_CHARS = 200
EPISODE_PICTURES = 8


# -- metrics --------------------------------------------------------------------------------------

def _number(value: Any) -> Optional[float]:
    """A finite float from a JSON value, or None (bools, strings, lists, NaN and inf are not curve points)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _kind(record: dict) -> str:
    """Train lines carry the step's ``reward``; the evals before and after training only ``eval/*``."""
    if "reward" in record:
        return "train"
    return "eval" if any(k.startswith("eval/") for k in record) else "other"


def _read_records(run_dir: PathLike) -> list[dict]:
    """Every line of metrics.jsonl, one per (step, kind), the last one winning, sorted by step.

    A resumed run may log a step again (the trainer truncates on resume, but a run killed at the
    wrong moment can leave both); the later line is the one the run went on from. A line that does
    not parse (the torn last line of a run being written) is skipped.
    """
    path = run_file(run_dir, "metrics.jsonl")
    if path is None:
        return []
    try:
        records = read_jsonl(path)
    except OSError:
        return []
    latest: dict[tuple[int, str], dict] = {}
    for record in records:
        if _number(record.get("step")) is None:
            continue
        record["step"] = int(record["step"])
        key = (record["step"], _kind(record))
        latest.pop(key, None)  # re-insert so the order is that of the last occurrence
        latest[key] = record
    return sorted(latest.values(), key=lambda r: r["step"])


def read_metrics(run_dir: PathLike) -> list[dict]:
    """The train lines of metrics.jsonl (those with ``reward``), one per step, sorted by step."""
    return [r for r in _read_records(run_dir) if _kind(r) == "train"]


def _reward_curve(key: str) -> bool:
    return key == "reward" or (key.startswith("reward/") and not key.endswith(_NOT_A_REWARD))


def _entropy_curve(key: str) -> bool:
    # reward/ttrv_low_entropy is a reward component, shown with the rewards.
    return "entropy" in key and not key.startswith(("reward/", "eval/"))


# Panel title -> which metric names it draws (metric names as in metrics.jsonl, from
# the batch stages (mmrl.core.batch), mmrl.core.reward_computer, mmrl.core.losses.metrics and the trainer).
CURVE_PANELS: "OrderedDict[str, Callable[[str], bool]]" = OrderedDict([
    ("reward", _reward_curve),
    ("KL", lambda k: k in ("kl", "policy_kl")),
    ("entropy", _entropy_curve),
    ("clip fraction", lambda k: k.startswith("clip_frac")),
    ("step time", lambda k: k in ("step_time", "rollout_time")),
])


def _eval_curve(key: str) -> bool:
    """Held-out metrics (success metric, reward, components); pass@k has its own scale and is left out."""
    return key.startswith("eval/") and "pass@" not in key and not key.endswith(_NOT_A_REWARD)


def _long_frame(records: list[dict], wanted: Callable[[str], bool]) -> "Optional[pandas.DataFrame]":
    """The (step, value, metric) rows of the metrics ``wanted`` picks, or None when there are none."""
    import pandas as pd

    steps, values, names = [], [], []
    for record in records:
        for key, raw in record.items():
            if key in ("step", "time") or not wanted(key):
                continue
            value = _number(raw)
            if value is not None:
                steps.append(record["step"])
                values.append(value)
                names.append(key)
    if not steps:
        return None
    return pd.DataFrame({
        "step": pd.Series(steps, dtype="int64"),
        "value": pd.Series(values, dtype="float64"),
        "metric": pd.Series(names, dtype=object).astype(str),
    })


def curve_frames(run_dir: PathLike) -> "dict[str, pandas.DataFrame]":
    """Panel title -> long DataFrame (step, value, metric) for ``gr.LinePlot(x="step", y="value",
    color="metric")``; panels without data are left out. ``eval`` draws the held-out evals (before,
    during with ``eval.every``, after training)."""
    records = _read_records(run_dir)
    train = [r for r in records if _kind(r) == "train"]
    frames = {}
    for title, wanted in CURVE_PANELS.items():
        frame = _long_frame(train, wanted)
        if frame is not None:
            frames[title] = frame
    frame = _long_frame(records, _eval_curve)
    if frame is not None:
        frames["eval"] = frame
    return frames


# -- rollouts -------------------------------------------------------------------------------------

def _rollout_dirs(run_dir: PathLike) -> dict[int, Path]:
    root = run_file(run_dir, "rollouts")
    if root is None or not root.is_dir():
        return {}
    out = {}
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and run_file(run_dir, f"rollouts/{p.name}") is not None and p.is_dir():
            out[int(m.group(1))] = p
    return out


def rollout_steps(run_dir: PathLike) -> list[int]:
    """Steps with saved rollouts (``rollouts/step_XXXXXX``), ascending."""
    return sorted(_rollout_dirs(run_dir))


def _shorten(text: str, limit: int = CAPTION_CHARS) -> str:
    """One line of at most ``limit`` characters (a gallery caption, not a transcript)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _saved_picture(folder: Path, value: Any) -> Optional[Path]:
    """The file a rollouts.jsonl field names (RunLogger writes PIL values as files, keeps the name)."""
    if isinstance(value, str) and value.lower().endswith(_PICTURE_SUFFIXES) and "/" not in value and "\\" not in value:
        path = run_file(folder, value)
        if path is not None and path.is_file():
            return path
    return None


def _rollout_caption(row: dict, completion_is_picture: bool) -> str:
    """Reward (with its components), the reference answer and the completion (or, when the
    completion is a picture, the prompt it answers)."""
    parts = []
    reward = _number(row.get("reward"))
    if reward is not None:
        comps = row.get("rewards") if isinstance(row.get("rewards"), dict) else {}
        shown = [f"{k} {v:.2f}" for k, v in ((k, _number(v)) for k, v in comps.items()) if v is not None]
        parts.append(f"reward {reward:.2f}" + (f" ({', '.join(shown)})" if shown else ""))
    answer = row.get("answer")
    if answer not in (None, ""):
        parts.append(f"answer: {answer}")
    completion = row.get("completion")
    if completion_is_picture or not isinstance(completion, str):
        if row.get("prompt"):
            parts.append(f"prompt: {row['prompt']}")
    else:
        parts.append(f"completion: {completion}")
    return _shorten(" | ".join(parts))


def _read_rows(path: Path) -> list[dict]:
    try:
        return read_jsonl(path)
    except OSError:
        return []


def rollout_gallery(run_dir: PathLike, step: Optional[int] = None) -> list[tuple[str, str]]:
    """(picture, caption) of each rollout saved at ``step`` (the latest saved step when None).

    The picture is the task's visualisation (``{i}_vis.png``: boxes, clicks drawn) where there is
    one, else the generated picture (a generator's completion), else the input image. Without a
    readable rollouts.jsonl the pictures are listed with their file names as captions.
    """
    dirs = _rollout_dirs(run_dir)
    if not dirs:
        return []
    folder = dirs.get(max(dirs) if step is None else int(step))
    if folder is None:
        return []
    out = []
    for row in _read_rows(folder / "rollouts.jsonl"):
        picture = None
        for key in ("visualization", "completion", "image"):
            picture = _saved_picture(folder, row.get(key))
            if picture is not None:
                break
        if picture is None:  # a task with no picture at all: the rest of the row still tells the story
            continue
        out.append((str(picture), _rollout_caption(row, _saved_picture(folder, row.get("completion")) is not None)))
    if out:
        return out
    pictures = sorted(folder.glob("*_vis.png")) or sorted(p for p in folder.iterdir() if p.suffix.lower() in _PICTURE_SUFFIXES)
    return [(str(p), p.name) for p in pictures if run_file(folder, p.name) is not None]


# -- pictures, config, summary, checkpoints, progress ---------------------------------------------

def eval_pictures(run_dir: PathLike) -> list[tuple[str, str]]:
    """(picture, caption) of the held-out pictures a run or ``mmrl eval`` left: the sample sheets
    before and after training, the eval gallery, and the first episode steps of environment tasks."""
    run_dir = Path(run_dir)
    out = []
    for rel, caption in (("samples_before.png", "held-out samples before training"),
                         ("samples_after.png", "held-out samples after training"),
                         ("eval_gallery/gallery.png", "eval gallery (mmrl eval: latest checkpoint)")):
        path = run_file(run_dir, rel)
        if path is not None and path.is_file():
            out.append((str(path), caption))
    for folder, when in (("episodes_before", "before training"), ("episodes_after", "after training")):
        if (run_dir / folder).is_dir():
            shown = [p for p in sorted((run_dir / folder).glob("*.png")) if run_file(run_dir, f"{folder}/{p.name}")]
            for p in shown[:EPISODE_PICTURES]:
                out.append((str(p), f"episode {when}: {p.stem}"))
    return out


def read_config_text(run_dir: PathLike) -> str:
    """The resolved config the run trained with (config.yaml), or "" before it is written."""
    path = run_file(run_dir, "config.yaml")
    try:
        return path.read_text(encoding="utf-8", errors="replace") if path else ""
    except OSError:
        return ""


def read_summary(run_dir: PathLike) -> dict:
    """summary.json (held-out metrics before and after training), or {} when absent or unreadable."""
    path = run_file(run_dir, "summary.json")
    try:
        summary = json.loads(path.read_text(encoding="utf-8")) if path else {}
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def latest_checkpoint(run_dir: PathLike) -> Optional[Path]:
    """The checkpoint a resume (or ``mmrl eval``) would load, or None: the trainer's own rule;
    None as well when it (or the checkpoints folder) links outside the run."""
    folder = run_file(run_dir, "checkpoints")
    latest = CheckpointManager(folder).latest() if folder else None
    return latest if latest is not None and run_file(run_dir, f"checkpoints/{latest.name}") else None


def _configured_steps(run_dir: PathLike) -> Optional[int]:
    """``train.steps`` from config.yaml; None before it is written or when it cannot be read."""
    path = run_file(run_dir, "config.yaml")
    if path is None or not path.is_file():
        return None
    try:
        steps = OmegaConf.select(OmegaConf.load(path), "train.steps")
    except Exception:  # a half-written or hand-edited file: the steps are just unknown
        return None
    return int(steps) if isinstance(steps, int) and not isinstance(steps, bool) else None


def progress(run_dir: PathLike) -> dict[str, Any]:
    """{"step": last trained step (0 before the first), "steps": configured steps or None,
    "reward": that step's reward or None}: what a progress line needs."""
    train = read_metrics(run_dir)
    last = train[-1] if train else {}
    return {"step": int(last.get("step", 0)), "steps": _configured_steps(run_dir), "reward": _number(last.get("reward"))}
