"""The run directory's disk: checked writable before anything loads, and a full or read-only disk
told as what it is, with the path, whichever library was writing.

A run that cannot write its directory must say so before minutes of model loading, not at its
first ``mkdir``. A disk that fills up mid-run loses nothing (checkpoints are published atomically:
:mod:`mmrl.runs.checkpoint`), but the libraries say it three ways: Python's ``OSError`` (errno
``ENOSPC``, often without the file's name), safetensors' ``SafetensorError`` ("No space left on
device (os error 28)") and torch's zip writer's ``RuntimeError`` ("[enforce fail at
inline_container.cc] ... unexpected pos"), which names no cause at all. :func:`naming_disk_errors`
turns each into one ``OSError`` with the errno and the path, and :func:`disk_message` words it.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Union

__all__ = ["check_writable", "naming_disk_errors", "disk_message", "FULL", "NOT_WRITABLE"]

FULL = (errno.ENOSPC, errno.EDQUOT)  # no space left; over the disk quota
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR)
_NEARLY_FULL = 64 << 20  # bytes: torch's writer failing with less than this free is a full disk


def check_writable(path: Union[str, Path]) -> None:
    """Raise an ``OSError`` naming ``path`` when a run could not write there: the nearest existing
    directory at or above it gets a temporary file, written and removed, and nothing is created
    (a directory under a file, a read-only file system, permissions; root passes permission bits,
    so this tries a write rather than asking ``os.access``)."""
    path = Path(path).expanduser()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{existing} is a file, not a directory", str(path))
    try:
        fd, probe = tempfile.mkstemp(prefix=".mmrl-write-test-", dir=existing)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    os.close(fd)
    os.unlink(probe)


def _disk_is_full(exc: BaseException, path: Path) -> bool:
    text = str(exc)
    if "No space left on device" in text or "os error 28" in text or "Disk quota exceeded" in text:
        return True  # safetensors, and messages that carry the system's words
    if isinstance(exc, RuntimeError) and ("inline_container" in text or "PytorchStreamWriter" in text):
        where = path
        while not where.exists() and where != where.parent:
            where = where.parent
        return shutil.disk_usage(where).free < _NEARLY_FULL  # torch names no cause: the disk does
    return False


@contextmanager
def naming_disk_errors(path: Union[str, Path]) -> Iterator[None]:
    """Re-raise a full disk, however the writing library says it, as ``OSError(ENOSPC)`` naming
    ``path`` (the file or directory being written); an ``OSError`` without a file name gets
    ``path``. Anything else passes unchanged."""
    path = Path(path)
    try:
        yield
    except OSError as exc:
        if exc.filename or exc.errno not in (*FULL, *NOT_WRITABLE):
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    except Exception as exc:
        if not _disk_is_full(exc, path):
            raise
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from exc


def disk_message(exc: OSError, resume: Optional[str] = None) -> Optional[str]:
    """One line for a full disk or a place that cannot be written (None for any other error):
    the path, the cause, what to do, and ``resume``, the command that continues the run."""
    where = exc.filename or "the run directory"
    then = f"; then continue with: {resume}" if resume else ""
    if exc.errno in FULL:
        return (f"the disk is full: cannot write {where} ({exc.strerror}); free space on it, or set log.output_dir "
                f"to a disk with room (every checkpoint written is complete, nothing saved is lost){then}")
    if exc.errno in NOT_WRITABLE:
        return (f"cannot write {where} ({exc.strerror}): set log.output_dir to a directory you can write, "
                f"or make this one writable{then}")
    return None
