"""Datasets for real data: lazily indexed, images opened on access, bad input skipped and counted.

A dataset of 100k records must not have its images decoded up front, and one malformed record or
corrupt image must not kill a training run. :class:`FileExamples` reads a source once (JSONL,
JSON, parquet, a ``datasets`` directory: :mod:`mmrl.data.sources`), maps each record's keys with
the task's ``fields`` (:mod:`mmrl.data.fields`) and keeps the records that the task's ``parse``
function accepts and whose image reference is usable; the others are skipped and reported with
their ``file:line`` or row number (a warning and ``skipped``). Images are opened when an example
is accessed; an image that cannot be opened is counted and the next example is returned instead,
so indexing never raises for bad data. A missing file or one with no usable record is an error
that names the file.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Optional

from .fields import FieldError, check_fields, normalize_record
from .images import image_problem, open_image
from .sequence import LazySequence
from .sources import open_records

log = logging.getLogger(__name__)

Parse = Callable[[dict], Optional[dict]]


class BadRecord(ValueError):
    """Raised by a ``parse`` function for a record it cannot use; the message says why."""


def require_image(record: Mapping) -> Any:
    """The record's ``image`` (any form :func:`mmrl.data.images.image_problem` accepts; checked by
    the reader), or :class:`BadRecord` when it has none."""
    image = record.get("image")
    if image is None or image == "" or image == []:
        raise BadRecord("no 'image' (a path, image bytes or a list of them; another key can be "
                        "named with task.options.fields.image)")
    return image


class FileExamples(LazySequence):
    """Examples from a data file or folder. ``parse(record)`` turns one record (its keys mapped by
    ``fields``) into an example dict (raise :class:`BadRecord` or return None to skip it); a key
    ``image`` holding an image reference (a path relative to ``image_root``, default the data
    file's folder; bytes; a list of them) is replaced by the opened RGB image on access, a path is
    kept as ``image_path``, and ``image_size`` is set. ``finish(ex)`` then completes the example
    with what needs the image (e.g. converting 0-1000 boxes to pixels). ``split`` ("train" /
    "eval") picks the split of a ``DatasetDict`` or of split-named files."""

    def __init__(self, path: str | Path, parse: Parse, image_root: str | Path | None = None,
                 max_skip_warnings: int = 10, finish: Optional[Callable[[dict], dict]] = None,
                 fields: Optional[Mapping] = None, split: str = "train"):
        self.source = open_records(path, split)
        self.path = self.source.path
        self.parse = parse
        self.finish = finish or (lambda ex: ex)
        self.fields = check_fields(fields)
        self.image_root = Path(image_root).expanduser() if image_root else self.source.folder
        self.skipped: list[tuple[int, str]] = []  # (line or row number, reason) of records left out
        self.bad_images: dict[str, str] = {}  # image -> error, counted on access
        self._index: list[int] = []  # source index of each usable record
        first = None
        for i, item in self.source.scan():
            if i is None:
                number, where, short, reason = item
            else:
                reason = self._check(item)
                if reason is None:
                    self._index.append(i)
                    continue
                number, where, short = self.source.locate(i)
            self.skipped.append((number, reason))
            first = first or f"{short}: {reason}"
            if len(self.skipped) <= max_skip_warnings:
                log.warning("%s skipped: %s", where, reason)
        if len(self.skipped) > max_skip_warnings:
            log.warning("%s: %d records skipped in all", self.path, len(self.skipped))
        if not self._index:
            raise ValueError(f"{self.path} has no usable example" + (f"; first problem: {first}" if first else ""))

    def _example(self, raw: Mapping) -> Optional[dict]:
        return self.parse(normalize_record(raw, self.fields))

    def _check(self, raw: Mapping) -> Optional[str]:
        """None when the record is usable, else why not."""
        try:
            ex = self._example(raw)
        except (BadRecord, FieldError) as exc:
            return str(exc)
        except (KeyError, TypeError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        if ex is None:
            return "rejected by the task's reader"
        return image_problem(ex["image"]) if ex.get("image") is not None else None

    def __len__(self) -> int:
        return len(self._index)

    def item(self, i: int) -> dict:
        n = len(self)
        for k in range(n):  # a bad image moves on to the next example, deterministically
            j = self._index[(i + k) % n]
            ex = dict(self._example(self.source.record(j)))
            if ex.get("image") is None:
                return self.finish(ex)
            try:
                ex["image"], path = open_image(ex["image"], self.image_root)
            except Exception as exc:  # PIL raises many types for corrupt files
                where = self.source.locate(j)[1]
                if where not in self.bad_images:
                    self.bad_images[where] = f"{type(exc).__name__}: {exc}"
                    log.warning("%s: cannot open the image (%s); using the next example", where, exc)
                continue
            if path is not None:
                ex["image_path"] = str(path)
            if "image_size" not in ex:
                ex["image_size"] = ex["image"].size
            return self.finish(ex)
        example = next(iter(self.bad_images.items()))
        raise ValueError(f"{self.path}: no image of any example could be opened (e.g. {example[0]}: {example[1]})")

    def stats(self) -> dict[str, Any]:
        """``skipped_lines`` counts the records left out (lines of JSON files, rows of tables)."""
        return {"examples": len(self), "skipped_lines": len(self.skipped), "bad_images": len(self.bad_images)}
