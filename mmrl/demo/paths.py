"""The demo's file boundary: the only directories whose files it reads for the page or serves.

A page can send any string as a path; :class:`AllowedRoots` resolves it (symlinks and ``..``
followed) and accepts it only inside one of the roots the server was started with (the runs
directory, the shipped assets, the upload directory, and ``--models`` directories), whatever the
request says. Gradio's own file route is given the same roots (``allowed_paths``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable


class PathRefused(PermissionError):
    """A path outside every allowed root."""


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
