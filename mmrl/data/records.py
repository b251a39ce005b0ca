"""Datasets for real data: lazily indexed, images opened on access, bad input skipped and counted.

A dataset of 100k records must not have its images decoded up front, and one malformed record or
corrupt image must not kill a training run. :class:`FileExamples` reads a source once (JSONL,
JSON, parquet, a ``datasets`` directory: :mod:`mmrl.data.sources`), maps each record's keys with
the task's ``fields`` (:mod:`mmrl.data.fields`) and keeps the records that the task's ``parse``
function accepts and whose image reference is usable (and video file exists); the others are
skipped and reported with their ``file:line`` or row number (a warning and ``skipped``). Images and
videos are read when an example is accessed; one that cannot be read is counted and, as every
:class:`~mmrl.data.sequence.SkippingSequence` does, indexing returns the next example instead (so it
never raises for bad data) while evaluation skips it. A missing file or one with no usable record is
an error that names the file. Reasons are cut to a readable length (:mod:`mmrl.data.messages`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Optional

from .box_range import BoxRange
from .fields import FieldError, check_fields, normalize_record
from .images import image_problem, open_image
from .messages import shorten
from .sequence import SkippingSequence
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


def _check_video_options(options: Optional[Mapping]) -> dict:
    """``video_options`` as read_video's keyword arguments; a ValueError names an unknown key."""
    options = dict(options or {})
    if options:
        import inspect

        from ..media.video import read_video

        known = [k for k in inspect.signature(read_video).parameters if k != "source"]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"video_options: unknown key {unknown[0]!r}; read_video takes {', '.join(known)}")
    return options


def _check_image_template(template: Any) -> Optional[str]:
    if template is None:
        return None
    if not isinstance(template, str) or "{}" not in template:
        raise ValueError("task.options.image_template must be a path with {} where the record's image name "
                         f"goes, e.g. '{{}}.jpg' or 'images/{{}}.jpg'; got {template!r}")
    return template


def _fill_template(template: str, image: Any) -> Any:
    """The record's image names (a name or id, or a list of them) put into ``template``; bytes and
    decoded images are left as they are."""
    if isinstance(image, (list, tuple)):
        return [_fill_template(template, x) for x in image]
    if isinstance(image, str) or (isinstance(image, int) and not isinstance(image, bool)):
        return template.replace("{}", str(image).strip())
    return image


class FileExamples(SkippingSequence):
    """Examples from a data file or folder. ``parse(record)`` turns one record (its keys mapped by
    ``fields``) into an example dict (raise :class:`BadRecord` or return None to skip it); a key
    ``image`` holding an image reference (a path relative to ``image_root``, default the data
    file's folder; bytes; a list of them) is replaced by the opened RGB image on access, a path is
    kept as ``image_path``, and ``image_size`` is set. ``finish(ex)`` then completes the example
    with what needs the image (e.g. converting 0-1000 boxes to pixels). ``split`` ("train" /
    "eval") picks the split of a ``DatasetDict`` or of split-named files.

    A key ``video`` (a video file or frame folder relative to ``image_root``, or a list of frame
    paths) is likewise replaced by :func:`mmrl.media.video.read_video`'s ``Clip``, read with
    ``video_options`` (its keyword arguments: fps, max_pixels, backend ...); the path is kept as
    ``video_path`` and ``video_duration`` is set. ``bad_images`` counts unreadable videos too.

    ``image_template`` (``task.options.image_template``) names the image file of records whose
    ``image`` is a bare name or id: ``"{}.jpg"`` for GQA's ``imageId`` (with ``fields: {image:
    imageId}``), ``"train/{}.png"``; its ``{}`` is replaced by the record's value.

    ``box_key`` names the key of a parsed example holding its box (4 numbers) or boxes as the file
    writes them, in ``box_space`` (``task.options.box_space``): a file whose every box lies within
    [0, 1] while ``box_space`` is not "norm" is refused, naming the option and the value to set,
    once its first image shows a size of more than a few pixels (:mod:`mmrl.data.box_range`)."""

    def __init__(self, path: str | Path, parse: Parse, image_root: str | Path | None = None,
                 max_skip_warnings: int = 10, finish: Optional[Callable[[dict], dict]] = None,
                 fields: Optional[Mapping] = None, split: str = "train",
                 video_options: Optional[Mapping] = None, image_template: Optional[str] = None,
                 box_key: Optional[str] = None, box_space: str = "pixel"):
        self.source = open_records(path, split)
        self.path = self.source.path
        self.parse = parse
        self.finish = finish or (lambda ex: ex)
        self.fields = check_fields(fields)
        self.image_root = Path(image_root).expanduser() if image_root else self.source.folder
        self.video_options = _check_video_options(video_options)
        self.image_template = _check_image_template(image_template)
        self.skipped: list[tuple[int, str]] = []  # (line or row number, reason) of records left out
        self.bad_images: dict[str, str] = {}  # record (file:line) -> error of its image or video, on access
        # record (file:line) -> why its target (a box, a segment) cannot be trained on, found on access
        # once the image or clip gives its size (the task's ``finish`` raises BadRecord)
        self.bad_targets: dict[str, str] = {}
        self._index: list[int] = []  # source index of each usable record
        boxes = BoxRange(box_space)
        first = None
        for i, item in self.source.scan():
            if i is None:
                number, where, short, reason = item
            else:
                ex, reason = self._check(item)
                if reason is None:
                    self._index.append(i)
                    if box_key is not None and ex.get(box_key) is not None:
                        boxes.add(ex[box_key], self.source.locate(i)[1])
                    continue
                number, where, short = self.source.locate(i)
            reason = shorten(reason)
            self.skipped.append((number, reason))
            first = first or f"{short}: {reason}"
            if len(self.skipped) <= max_skip_warnings:
                log.warning("%s skipped: %s", where, reason)
        if len(self.skipped) > max_skip_warnings:
            log.warning("%s: %d records skipped in all", self.path, len(self.skipped))
        if not self._index:
            raise ValueError(f"{self.path} has no usable example" + (f"; first problem: {first}" if first else ""))
        if boxes.suspect():
            self._check_box_space(boxes)

    def _check_box_space(self, boxes: BoxRange) -> None:
        """Raise :meth:`BoxRange.problem` by the size of the first of the file's images that opens."""
        for j in self._index[:5]:
            ex = self._example(self.source.record(j))
            try:
                size = open_image(ex["image"], self.image_root)[0].size
            except Exception:  # unreadable here: counted when the example is used
                continue
            problem = boxes.problem(self.path, size)
            if problem:
                raise ValueError(problem)
            return

    def _example(self, raw: Mapping) -> Optional[dict]:
        record = normalize_record(raw, self.fields)
        if self.image_template is not None and record.get("image") is not None:
            record["image"] = _fill_template(self.image_template, record["image"])
        return self.parse(record)

    def _check(self, raw: Mapping) -> tuple[Optional[dict], Optional[str]]:
        """``(example, None)`` when the record is usable, else ``(None or the example, why not)``."""
        try:
            ex = self._example(raw)
        except (BadRecord, FieldError) as exc:
            return None, str(exc)
        except (KeyError, TypeError, ValueError) as exc:
            return None, f"{type(exc).__name__}: {exc}"
        if ex is None:
            return None, "rejected by the task's reader"
        problem = image_problem(ex["image"]) if ex.get("image") is not None else None
        if problem is None and ex.get("video") is not None:
            problem = self._video_problem(ex["video"])
        return ex, problem

    def _video_source(self, value: Any) -> Path | list[Path]:
        """The video file / frame folder, or the frame files, of a record's ``video``."""
        def resolve(p: Any) -> Path:
            path = Path(str(p).strip()).expanduser()
            return path if path.is_absolute() else self.image_root / path
        return [resolve(p) for p in value] if isinstance(value, (list, tuple)) else resolve(value)

    def _video_problem(self, value: Any) -> Optional[str]:
        if not isinstance(value, (str, Path, list, tuple)) or value in ("", [], ()):
            return f"'video' must be a video path or a list of frame paths, got {value!r}"
        source = self._video_source(value)
        missing = [p for p in (source if isinstance(source, list) else [source]) if not p.exists()]
        return f"video {missing[0]} does not exist (paths start at {self.image_root})" if missing else None

    def __len__(self) -> int:
        return len(self._index)

    def usable(self, i: int) -> Optional[dict]:
        """Example ``i`` with its image or clip, or None when that does not open (counted in
        ``bad_images``) or its target is invalid once the size is known (``bad_targets``)."""
        j = self._index[i]
        ex = dict(self._example(self.source.record(j)))
        what = "image"
        try:
            if ex.get("image") is not None:
                self._open_image(ex)
            what = "video"
            if ex.get("video") is not None:
                self._open_video(ex)
        except ImportError:  # a missing decoder is the install's problem, not the example's
            raise
        except Exception as exc:  # PIL and the video decoders raise many types for corrupt files
            where = self.source.locate(j)[1]
            if where not in self.bad_images:
                self.bad_images[where] = shorten(f"{type(exc).__name__}: {exc}")
                log.warning("%s: cannot open the %s (%s); skipped", where, what, self.bad_images[where])
            return None
        try:
            return self.finish(ex)
        except BadRecord as exc:  # e.g. a box outside its image, known only now
            where = self.source.locate(j)[1]
            if where not in self.bad_targets:
                self.bad_targets[where] = shorten(str(exc))
                log.warning("%s skipped: %s", where, self.bad_targets[where])
            return None

    def nothing_usable(self) -> str:
        problems = {**self.bad_images, **self.bad_targets}
        example = next(iter(problems.items()))
        return (f"{self.path}: no example could be used: every image or video failed to open or its "
                f"target is invalid (e.g. {example[0]}: {example[1]})")

    def _open_image(self, ex: dict) -> None:
        try:
            ex["image"], path = open_image(ex["image"], self.image_root)
        except FileNotFoundError as exc:  # the options that say where images are
            if self.image_template is not None:
                hint = (f"task.options.image_template {self.image_template!r} made this name from the record's; "
                        "check it and task.options.image_root")
            else:
                hint = ("set task.options.image_root to the folder the records' image paths start from, or "
                        "task.options.image_template (e.g. '{}.jpg') when records name images by a bare id")
            raise FileNotFoundError(f"{exc}: {hint}") from None
        if path is not None:
            ex["image_path"] = str(path)
        if "image_size" not in ex:
            ex["image_size"] = ex["image"].size

    def _open_video(self, ex: dict) -> None:
        from ..media.video import read_video  # torch and the decoders load with the first video

        source = self._video_source(ex["video"])
        ex["video"] = read_video(source, **self.video_options)
        ex["video_path"] = [str(p) for p in source] if isinstance(source, list) else str(source)
        if "video_duration" not in ex:
            ex["video_duration"] = ex["video"].duration

    def stats(self) -> dict[str, Any]:
        """``skipped_lines`` counts the records left out (lines of JSON files, rows of tables)."""
        return {"examples": len(self), "skipped_lines": len(self.skipped), "bad_images": len(self.bad_images),
                "bad_targets": len(self.bad_targets)}
