"""JSONL datasets for real data: lazily indexed, images opened on access, bad input skipped and counted.

A dataset of 100k lines must not be parsed (or its images decoded) up front, and one malformed
line or corrupt image must not kill a training run. :class:`JsonlExamples` reads the file once to
find the byte offset of every line that parses as a JSON object and that the task's ``parse``
function accepts; other lines are skipped and reported with their line number (a warning naming
``file:line`` and the reason). Images are opened when an example is accessed; an image that cannot
be opened is counted and the next example is returned instead, so indexing never raises for bad
data. A missing file or a file with no usable line is an error that names the file.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, Optional

from .images import load_image
from .sequence import LazySequence

log = logging.getLogger(__name__)

Parse = Callable[[dict], Optional[dict]]


class BadRecord(ValueError):
    """Raised by a ``parse`` function for a record it cannot use; the message says why."""


class JsonlExamples(LazySequence):
    """Examples from a JSONL file. ``parse(record)`` turns one JSON object into an example dict
    (raise :class:`BadRecord` or return None to skip it); a key ``image`` holding a path (relative
    to ``image_root``, default the file's folder) is replaced by the opened image on access, and
    the path is kept as ``image_path``, and ``image_size`` is set. ``finish(ex)`` then completes
    the example with what needs the image (e.g. converting 0-1000 boxes to pixels).
    """

    def __init__(self, path: str | Path, parse: Parse, image_root: str | Path | None = None,
                 max_skip_warnings: int = 10, finish: Optional[Callable[[dict], dict]] = None):
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise FileNotFoundError(f"dataset file not found: {self.path}")
        self.parse = parse
        self.finish = finish or (lambda ex: ex)
        self.image_root = Path(image_root).expanduser() if image_root else self.path.parent
        self.skipped: list[tuple[int, str]] = []  # (line number, reason) of lines left out
        self.bad_images: dict[str, str] = {}  # image path -> error, counted on access
        self._offsets: list[int] = []
        with self.path.open("rb") as f:
            offset = 0
            for line_no, raw in enumerate(f, start=1):
                reason = self._check(raw)
                if reason is None:
                    self._offsets.append(offset)
                elif reason != "blank":
                    self.skipped.append((line_no, reason))
                    if len(self.skipped) <= max_skip_warnings:
                        log.warning("%s:%d skipped: %s", self.path, line_no, reason)
                offset += len(raw)
        if len(self.skipped) > max_skip_warnings:
            log.warning("%s: %d lines skipped in all", self.path, len(self.skipped))
        if not self._offsets:
            detail = f"; first problem: line {self.skipped[0][0]}: {self.skipped[0][1]}" if self.skipped else ""
            raise ValueError(f"{self.path} has no usable example{detail}")

    def _check(self, raw: bytes) -> Optional[str]:
        """None when the line is a usable record, else why not ("blank" lines are silent)."""
        text = raw.decode("utf-8", errors="replace").strip()
        if not text:
            return "blank"
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            return f"not valid JSON ({exc.msg} at column {exc.colno})"
        if not isinstance(record, dict):
            return f"expected a JSON object, got {type(record).__name__}"
        try:
            return None if self.parse(record) is not None else "rejected by the task's reader"
        except BadRecord as exc:
            return str(exc)
        except (KeyError, TypeError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"

    def __len__(self) -> int:
        return len(self._offsets)

    def _record(self, i: int) -> dict:
        with self.path.open("rb") as f:
            f.seek(self._offsets[i])
            return self.parse(json.loads(f.readline()))  # type: ignore[return-value]

    def item(self, i: int) -> dict:
        n = len(self)
        for k in range(n):  # a bad image moves on to the next example, deterministically
            ex = dict(self._record((i + k) % n))
            image = ex.get("image")
            if not isinstance(image, (str, Path)):
                return self.finish(ex)
            path = Path(image) if Path(image).is_absolute() else self.image_root / image
            try:
                ex["image"] = load_image(path)
            except Exception as exc:  # PIL raises many types for corrupt files
                if str(path) not in self.bad_images:
                    self.bad_images[str(path)] = f"{type(exc).__name__}: {exc}"
                    log.warning("%s: cannot open image %s (%s); using the next example", self.path, path, exc)
                continue
            ex["image_path"] = str(path)
            if "image_size" not in ex:
                ex["image_size"] = ex["image"].size
            return self.finish(ex)
        raise ValueError(f"{self.path}: no image of any example could be opened (e.g. {next(iter(self.bad_images))})")

    def stats(self) -> dict[str, Any]:
        return {"examples": len(self), "skipped_lines": len(self.skipped), "bad_images": len(self.bad_images)}
