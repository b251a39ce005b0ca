"""Which directories of the runs directory the demo treats as runs, and what of a run it may read.

Run names reach the app from a web page and become a path under the runs directory, so
:func:`check_run_name` accepts only a plain directory name (no separator, no ``..``, not
absolute). A link does not widen that: a run directory that resolves outside the runs directory
is not a run (:func:`list_runs` leaves it out, :func:`run_directory` and :func:`run_path` refuse
it), and a file or folder of a run that resolves outside the run's own directory is read as
absent (:func:`run_file`), so a ``config.yaml -> /etc/passwd`` shows nothing. A link to a run
inside the runs directory is a run.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Optional, Union

__all__ = ["check_run_name", "list_runs", "run_directory", "run_file", "run_path"]

PathLike = Union[str, Path]


def check_run_name(name: Any) -> str:
    """``name`` when it is one plain directory name, else ValueError saying why.

    Run names reach the app from a web page and become a path under the runs directory; a
    separator, ``..`` or an absolute path would let the page read or write outside it.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("a run name must be a non-empty directory name")
    if "/" in name or "\\" in name:
        raise ValueError(f"run name {name!r} must be a plain directory name, without '/' or '\\'")
    if ".." in name or name == ".":
        raise ValueError(f"run name {name!r} must not contain '..' or be '.'")
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).anchor:
        raise ValueError(f"run name {name!r} must not be an absolute path")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ValueError(f"run name {name!r} must not contain control characters")
    return name


def run_file(run_dir: PathLike, relative: str) -> Optional[Path]:
    """``run_dir / relative`` when it resolves inside ``run_dir`` (a link to elsewhere, a loop: None).

    A run directory is written by the trainer; a file in it that links out (``config.yaml ->
    /etc/passwd``) would make the page show whatever it points to.
    """
    path = Path(run_dir) / relative
    try:
        return path if path.resolve().is_relative_to(Path(run_dir).resolve()) else None
    except (OSError, RuntimeError):
        return None


def _inside(path: Path, root: Path) -> bool:
    """``path`` resolves to a directory under ``root`` (not ``root`` itself)."""
    try:
        resolved, root = path.resolve(), Path(root).resolve()
    except (OSError, RuntimeError):
        return False
    return resolved != root and resolved.is_relative_to(root)


def _is_run(path: Path) -> bool:
    """A run directory is one the trainer has started writing: its config or its metrics."""
    return path.is_dir() and any((p := run_file(path, name)) is not None and p.is_file()
                                 for name in ("config.yaml", "metrics.jsonl"))


def _run_mtime(path: Path) -> float:
    """When the run last wrote its metrics (or its config, before the first step)."""
    times = [p.stat().st_mtime for p in (path / "metrics.jsonl", path / "config.yaml") if p.is_file()]
    return max(times, default=0.0)


def list_runs(runs_dir: PathLike) -> list[str]:
    """Names of the runs under ``runs_dir``, the most recently active first; [] when it is missing."""
    root = Path(runs_dir)
    if not root.is_dir():
        return []
    runs = [p for p in root.iterdir() if _inside(p, root) and _is_run(p)]
    runs.sort(key=lambda p: (-_run_mtime(p), p.name))
    return [p.name for p in runs]


def run_directory(runs_dir: PathLike, name: str) -> Path:
    """Where run ``name`` (a name from the page) is or will be; ValueError for an unsafe name or
    a directory that links outside ``runs_dir``."""
    check_run_name(name)
    path = Path(runs_dir) / name
    if not _inside(path, Path(runs_dir)):  # a plain name: only a link leads out
        raise ValueError(f"run {name!r} is a link to {path.resolve()}, outside {runs_dir}: the demo reads runs only "
                         f"inside the runs directory (pass that directory as --runs to see it)")
    return path


def run_path(runs_dir: PathLike, name: str) -> Path:
    """The directory of run ``name`` (a name from the page); ValueError for an unsafe name, a link
    outside the runs directory, or no such run."""
    path = run_directory(runs_dir, name)
    if not _is_run(path):
        raise ValueError(f"no run named {name!r} in {runs_dir} (a run directory holds config.yaml or metrics.jsonl)")
    return path
