"""Which run ``mmrl train --resume`` continues, and with which config.

A run is the user's: ``mmrl train --resume runs/NAME`` (or ``log.run_name=NAME --resume``) finds the
run and takes its configuration from the run's ``config.yaml``, as verl's ``resume_mode=auto`` and
TRL's ``resume_from_checkpoint=True`` do, so nothing of the original command needs re-typing.
Overrides given with it are changes: :mod:`~mmrl.runs.config_history` shows them and refuses them
unless ``--allow-config-change``. A name that matches no run is an error naming the runs that
exist (never a silent new run from step 0), and a finished run says so instead of training again.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Optional, Sequence

from ..config import load_config
from .checkpoint import CheckpointManager

__all__ = ["NothingToResume", "run_names", "find_run", "resume_overrides", "finished_steps", "resume_command",
           "check_resume_steps", "open_run", "resuming_line"]


class NothingToResume(ValueError):
    """``--resume`` named no run, or a run that does not exist."""


def _is_run(path: Path) -> bool:
    return path.is_dir() and ((path / "config.yaml").is_file() or (path / "checkpoints").is_dir())


def run_names(output_dir: Path) -> list[str]:
    """The runs under ``output_dir`` (directories with a ``config.yaml`` or checkpoints), by name."""
    output_dir = Path(output_dir)
    return sorted(p.name for p in output_dir.iterdir() if _is_run(p)) if output_dir.is_dir() else []


def _runs_there(output_dir: Path) -> str:
    names = run_names(output_dir)
    if not names:
        return f"there are no runs in {output_dir}/"
    shown = ", ".join(names[:20]) + (f" (and {len(names) - 20} more)" if len(names) > 20 else "")
    return f"runs in {output_dir}/: {shown}"


def find_run(target: Optional[str], output_dir: Path) -> Path:
    """The run directory that ``target`` names: a path to a run directory, or a run name under
    ``output_dir``. :class:`NothingToResume` (naming the runs that exist, and the closest name)
    when there is none."""
    output_dir = Path(output_dir)
    if not target:
        raise NothingToResume(f"nothing to resume: name the run, e.g. `mmrl train --resume {output_dir}/NAME` or "
                              f"`mmrl train vlm log.run_name=NAME --resume`; {_runs_there(output_dir)}")
    for candidate in (Path(target).expanduser(), output_dir / target):
        if _is_run(candidate):
            return candidate
    where = Path(target).expanduser()
    base = where.parent if where.parent != Path(".") else output_dir
    close = difflib.get_close_matches(where.name, run_names(base), n=1)
    hint = f"; did you mean {base / close[0]}?" if close else ""
    raise NothingToResume(f"no run {target!r} to resume{hint} ({_runs_there(base)}); "
                          "a new run starts without --resume")


def resume_overrides(run_dir: Path) -> list[str]:
    """The overrides that point a loaded config at ``run_dir`` wherever it now lies (the ``log``
    keys may always change on resume) and turn resuming on."""
    run_dir = Path(run_dir)

    def quoted(text: str) -> str:  # YAML single quotes: a name like 007 stays a string
        return "'" + text.replace("'", "''") + "'"

    return [f"log.output_dir={quoted(str(run_dir.parent))}", f"log.run_name={quoted(run_dir.name)}", "resume=true"]


def load_run_config(run_dir: Path, overrides: Sequence[str] = ()):
    """The run's own config (its ``config.yaml``) with ``overrides`` on top, set to resume it."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise NothingToResume(f"{run_dir} has no config.yaml (it was stopped before its first step started); "
                              "start it again with the command that created it")
    return load_config(path, [*overrides, *resume_overrides(run_dir)])


def finished_steps(run_dir: Path, steps: int) -> Optional[int]:
    """``steps`` when the run at ``run_dir`` has trained them all: its final checkpoint is written and
    its held-out results (``summary.json``) are in; None when there is still something to do."""
    run_dir = Path(run_dir)
    latest = CheckpointManager(run_dir / "checkpoints").latest_step()
    if latest is None or latest < steps:
        return None
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # stopped during the final evaluation: resuming runs it
    return steps if isinstance(summary, dict) and summary.get("steps") == steps else None


def resume_command(run_dir: Path) -> str:
    """The command that continues the run at ``run_dir``."""
    return f"mmrl train --resume {run_dir}"


def check_resume_steps(run_dir: Path, steps: int) -> None:
    """Refuse a resume whose ``train.steps`` is below its latest checkpoint's step (a run does not
    train backwards): a ``ValueError`` naming the checkpoint and the ``train.steps`` to give."""
    ckpt = CheckpointManager(Path(run_dir) / "checkpoints")
    latest = ckpt.latest_step()
    if latest is not None and latest > steps:
        raise ValueError(f"{ckpt.latest()} is at step {latest}, past train.steps={steps}: to continue the run, "
                         f"resume with train.steps={latest} or more; to train {steps} steps, start a new run "
                         "(another log.run_name)")


def open_run(run_dir: Path, cfg, main: bool) -> CheckpointManager:
    """The run directory's checkpoints as a run (RL's trainer, ``mmrl sft``) starts, every process
    calling: rank 0 makes the directory; on resume, the config's changes
    (:func:`~mmrl.runs.config_history.check_resume_config`) and ``train.steps`` are checked on every
    rank, so they all stop alike; rank 0 removes the half-written checkpoints of a killed save."""
    from .config_history import check_resume_config

    run_dir = Path(run_dir)
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = CheckpointManager(run_dir / "checkpoints", keep=cfg.log.save_total_limit)
    if cfg.resume:
        check_resume_config(run_dir, cfg)
        check_resume_steps(run_dir, cfg.train.steps)
    if main and ckpt.root.exists():
        ckpt.clean_stale_tmp()
    return ckpt


def resuming_line(run_dir: Path, start: int, steps: int) -> str:
    """What a resumed run says first: where it continues."""
    return f"resuming {run_dir} from step {start} of {steps}"
