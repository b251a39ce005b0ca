"""Atomic checkpoints and RNG state.

A run can be killed at any instant (pre-emption, OOM, Ctrl-C). Resuming must then find either the
new checkpoint complete or the previous one untouched, never a half-written directory. So a
checkpoint is written into a hidden temp directory, fsynced, and renamed into place in one
``os.replace``; the ``latest`` pointer file is replaced the same way afterwards. Readers only ever
look at ``step_*`` directories (complete by construction) and ignore ``.tmp-*`` leftovers, which
the next save cleans up.

Layout under ``root``::

    step_00000050/     one complete checkpoint (whatever ``write`` put there)
    step_00000100/
    latest             text file: "step_00000100"
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np
import torch

__all__ = ["CheckpointManager", "rng_state", "set_rng_state"]

_STEP_RE = re.compile(r"^step_(\d{8,})$")
_TMP_PREFIX = ".tmp-"


def _fsync_path(path: Path) -> None:
    """fsync a file or directory; directories cannot be opened on Windows, so that is best effort."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            _fsync_path(Path(dirpath) / name)
        _fsync_path(Path(dirpath))


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftover from an earlier failed save in this process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists but not ours (or cannot tell): leave it alone
    return True


class CheckpointManager:
    """Writes ``root/step_XXXXXXXX`` directories atomically and keeps the ``keep`` newest.

    ``keep <= 0`` keeps every checkpoint. Meant to be used by one writer process per ``root``
    (rank 0); temp directories of other live processes are left alone when cleaning up.
    """

    def __init__(self, root: Union[str, Path], keep: int = 2):
        self.root = Path(root)
        self.keep = keep

    # -- reading ---------------------------------------------------------------------------

    def step_dir(self, step: int) -> Path:
        return self.root / f"step_{step:08d}"

    def steps(self) -> list[int]:
        """Steps with a complete checkpoint directory, ascending."""
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            m = _STEP_RE.match(p.name)
            if m and p.is_dir():
                out.append(int(m.group(1)))
        return sorted(out)

    def latest(self) -> Optional[Path]:
        """The checkpoint to resume from, or None when there is none.

        Trusts the ``latest`` pointer when it names an existing directory; otherwise (pointer
        missing, stale, or a crash between the rename and the pointer update) the highest step.
        """
        pointer = self.root / "latest"
        try:
            name = pointer.read_text(encoding="utf-8").strip()
        except OSError:
            name = ""
        if name and _STEP_RE.match(name) and (self.root / name).is_dir():
            return self.root / name
        steps = self.steps()
        return self.step_dir(steps[-1]) if steps else None

    def latest_step(self) -> Optional[int]:
        """The step of :meth:`latest`, or None when there is no checkpoint."""
        latest = self.latest()
        return int(_STEP_RE.match(latest.name).group(1)) if latest is not None else None

    # -- writing ---------------------------------------------------------------------------

    def save(self, step: int, write: Callable[[Path], None]) -> Path:
        """Call ``write(tmp_dir)``, then publish it as ``step_{step:08d}`` and point ``latest`` at it.

        If ``write`` raises, its temp directory is removed, nothing else changes, and the
        exception propagates. Returns the final checkpoint directory.
        """
        tmp = self.begin(step)
        try:
            write(tmp)
        except BaseException:
            self.abort(tmp)
            raise
        return self.commit(step, tmp)

    def begin(self, step: int) -> Path:
        """A fresh temp directory for the checkpoint of ``step`` (the first half of :meth:`save`,
        for writers that fill it from several processes before rank 0 commits it)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.clean_stale_tmp()
        tmp = self.root / f"{_TMP_PREFIX}{self.step_dir(step).name}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        return tmp

    def abort(self, tmp: Path) -> None:
        shutil.rmtree(tmp, ignore_errors=True)

    def commit(self, step: int, tmp: Path) -> Path:
        """fsync ``tmp`` and publish it as the checkpoint of ``step`` (the second half of :meth:`save`)."""
        final = self.step_dir(step)
        try:
            _fsync_tree(tmp)
        except BaseException:
            self.abort(tmp)
            raise

        # os.replace cannot overwrite a non-empty directory on POSIX, so move an existing
        # checkpoint of the same step aside first. In the short window between the two renames
        # latest() falls back to the highest remaining step, which is still a complete one.
        old = None
        if final.exists():
            old = self.root / f"{_TMP_PREFIX}old-{final.name}-{os.getpid()}"
            if old.exists():
                shutil.rmtree(old)
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_path(self.root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

        self._write_latest(final.name)
        self._prune(latest=final)
        return final

    def _write_latest(self, name: str) -> None:
        pointer = self.root / "latest"
        tmp = self.root / f"{_TMP_PREFIX}latest-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, pointer)
        _fsync_path(self.root)

    def _prune(self, latest: Path) -> None:
        if self.keep <= 0:
            return
        # The latest plus the keep-1 newest others: disk use stays bounded even when an older
        # step is re-saved (a run rewound to an earlier checkpoint).
        others = [s for s in self.steps() if self.step_dir(s) != latest]
        for s in others[: max(0, len(others) - (self.keep - 1))]:
            shutil.rmtree(self.step_dir(s), ignore_errors=True)

    def clean_stale_tmp(self) -> None:
        """Remove ``.tmp-*`` leftovers of killed saves (but not those of another live writer)."""
        for p in self.root.iterdir():
            if not p.name.startswith(_TMP_PREFIX):
                continue
            m = re.search(r"-(\d+)$", p.name)
            if m and _pid_alive(int(m.group(1))):
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                try:
                    p.unlink()
                except OSError:
                    pass


# -- RNG state ----------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """Every global RNG a run draws from: Python ``random``, NumPy, torch CPU and all CUDA devices.

    Saving it with the model makes a resumed run draw the same prompts, samples and dropout masks
    as an uninterrupted one. Loadable with ``torch.load(..., weights_only=False)`` (it holds
    Python tuples and a NumPy array, which the weights-only unpickler refuses).
    """
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured; CUDA states apply to as many devices as both have."""
    if "python" in state:
        py = state["python"]
        # torch.load may hand tuples back as lists; random.setstate insists on tuples.
        if isinstance(py, list):
            py = (py[0], tuple(py[1]), py[2])
        random.setstate(py)
    if "numpy" in state:
        np.random.set_state(state["numpy"])
    if "torch" in state:
        torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8).cpu())
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        n = min(len(cuda), torch.cuda.device_count())
        for i in range(n):
            torch.cuda.set_rng_state(torch.as_tensor(cuda[i], dtype=torch.uint8).cpu(), device=i)
