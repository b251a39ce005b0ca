"""The demo's file boundary: the only directories whose files it reads for the page or serves.

A page can send any string as a path; :class:`AllowedRoots` resolves it (symlinks and ``..``
followed) and accepts it only inside one of the roots the server was started with (the runs
directory, the shipped assets, the upload directory, and ``--models`` directories), whatever the
request says. Gradio's own file route is given the same roots (``allowed_paths``).

The roots themselves are resolved once, at start, so a root that is a link, or one another local
user owns (and so may replace by a link to ``/`` before the demo starts), would move the boundary
to wherever it points: :func:`check_root` refuses both (:class:`RootRefused`) before anything is
served. The upload directory is the process's own (:func:`private_upload_dir`), never a fixed
name in the shared temp directory.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

__all__ = ["AllowedRoots", "PathRefused", "RootRefused", "check_root", "private_upload_dir", "served_roots"]


class PathRefused(PermissionError):
    """A path outside every allowed root."""


class RootRefused(ValueError):
    """A directory the demo would serve that it must not trust: a link, or another user's."""


def check_root(path: str | Path, what: str) -> Path:
    """``path`` (a directory the demo serves, named ``what`` in the message) resolved, after
    refusing a symlink, a non-directory, and a directory owned by a user other than this one or
    root (root owns system-wide installs and can read everything anyway)."""
    path = Path(path).expanduser().absolute()
    try:
        info = path.lstat()
    except FileNotFoundError:
        raise RootRefused(f"{what} {path} does not exist; create it or name an existing directory") from None
    if stat.S_ISLNK(info.st_mode):
        raise RootRefused(f"{what} {path} is a symbolic link (to {os.readlink(path)}): the demo serves only a "
                          f"directory itself; name the directory it points to, if you trust it")
    if not stat.S_ISDIR(info.st_mode):
        raise RootRefused(f"{what} {path} is not a directory")
    if info.st_uid not in (os.getuid(), 0):
        raise RootRefused(f"{what} {path} is owned by another user (uid {info.st_uid}), who could replace what "
                          "it holds; use a directory of your own")
    return path.resolve()


def private_upload_dir() -> Path:
    """A new directory for this process's uploads (``mkdtemp``: a random name, mode 0700), not a
    fixed name another user could create first."""
    return Path(tempfile.mkdtemp(prefix="mmrl-demo-uploads-"))


def served_roots(runs_dir: str | Path, upload_dir: str | Path | None,
                 model_roots: Sequence[str | Path]) -> tuple[Path, Path, list[Path]]:
    """The runs, upload and model directories, checked and resolved before anything is served
    (:func:`check_root`; :class:`RootRefused` names the one
    refused). The runs directory and a named upload directory are created when missing (the
    upload one private, mode 0700); without ``upload_dir`` the uploads go to a new private
    directory, removed when the process exits."""
    runs_dir = Path(runs_dir).expanduser()
    if not runs_dir.is_symlink():
        runs_dir.mkdir(parents=True, exist_ok=True)
    if upload_dir is None:
        upload_dir = private_upload_dir()
        atexit.register(shutil.rmtree, upload_dir, ignore_errors=True)
    elif not Path(upload_dir).is_symlink():
        Path(upload_dir).expanduser().mkdir(mode=0o700, parents=True, exist_ok=True)
    return (check_root(runs_dir, "the runs directory (--runs)"), check_root(upload_dir, "the upload directory"),
            [check_root(r, "the models directory (--models)") for r in model_roots])


class AllowedRoots:
    def __init__(self, roots: Iterable[str | Path]):
        self.roots = [Path(r).expanduser().resolve() for r in roots]

    def contains(self, path: str | Path) -> bool:
        try:
            resolved = Path(path).expanduser().resolve()
        except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte
            return False
        return any(resolved == root or resolved.is_relative_to(root) for root in self.roots)

    def resolve(self, path: str | Path) -> Path:
        """``path`` resolved, or :class:`PathRefused` naming the allowed roots."""
        if not self.contains(path):
            raise PathRefused(f"{path} is outside the directories this demo serves "
                              f"({', '.join(map(str, self.roots))})")
        return Path(path).expanduser().resolve()
