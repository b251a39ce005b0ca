"""ScreenSpot, ScreenSpot-v2 and ScreenSpot-Pro screen grounding files, read as they ship.

The benchmarks store the target element's box differently: ScreenSpot and ScreenSpot-v2 as
``[x, y, w, h]`` in original pixels (JSON arrays of ``img_filename``, ``bbox``, ``instruction``,
``data_type``, ``data_source``), ScreenSpot-Pro as ``[x1, y1, x2, y2]`` with the screenshot's
``img_size`` ``[w, h]`` (and ``ui_type``, ``group``, ``platform``, ``application``, ``id``, ...).
Reading one layout as the other raises nothing, it silently gives wrong boxes, so each layout
has its own reader, and an entry that cannot be in that layout (a side <= 0, a box reaching
outside ``img_size``) is refused with a hint at the other reader.

A record is ``{"image": <path under image_root>, "box": (x1, y1, x2, y2) original pixels,
"instruction": ..., <every other field of the entry as given>}``; Pro records also get
``data_type`` = ``ui_type`` (text / icon), so text/icon splits read one key for both, and every
record ``source_file``, the stem of the file it came from (ScreenSpot names its platform there:
``screenspot_mobile_v2``).

Bad entries and missing screenshots are treated as :class:`mmrl.data.records.FileExamples`
treats bad records and unreadable images: skipped with a warning naming ``file:line``, the
entry's index and the key at fault, and counted (``skipped``, ``missing_images``, ``stats()``); a
source with no usable entry is an error naming its first problem. ``strict=True`` makes the first
problem an error instead, for benchmark scores that must cover every entry.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from .json_files import JsonRecords
from .messages import shorten
from .records import BadRecord

log = logging.getLogger(__name__)

LAYOUTS = {"xywh": "[x, y, w, h]", "xyxy": "[x1, y1, x2, y2]"}
_OTHER_READER = {"xywh": "a ScreenSpot-Pro [x1, y1, x2, y2] file is read with read_screenspot_pro",
                 "xyxy": "a ScreenSpot / ScreenSpot-v2 [x, y, w, h] file is read with read_screenspot"}
_MAX_WARNINGS = 10


class ScreenSpotRecords(list):
    """The usable records (a plain list) and what was left out: ``skipped`` (where, reason) of
    malformed entries, ``missing_images`` (where, path) of entries whose screenshot is absent.
    ``where[i]`` is record i's ``file:line (entry N)``."""

    def __init__(self, records, path: Path, skipped: list, missing_images: list, where: Optional[list] = None):
        super().__init__(records)
        self.path, self.skipped, self.missing_images = path, skipped, missing_images
        self.where = list(where) if where is not None else [f"{path} (entry {i})" for i in range(len(records))]

    def stats(self) -> dict[str, Any]:
        """The counts :meth:`mmrl.data.records.FileExamples.stats` reports, under the same keys, and
        ``missing_images``: the entries left out because their screenshot is absent (in ``bad_images`` too)."""
        return {"examples": len(self), "skipped_lines": len(self.skipped), "bad_images": len(self.missing_images),
                "missing_images": len(self.missing_images)}


def read_screenspot(path, image_root=None, *, strict: bool = False) -> ScreenSpotRecords:
    """ScreenSpot / ScreenSpot-v2 entries (``bbox`` ``[x, y, w, h]``) of a JSON file or of the
    ``.json`` files of a folder (v2 ships desktop, mobile and web files). ``image_root``: where
    ``img_filename`` paths start (default: each file's folder)."""
    return _read(path, image_root, "xywh", strict)


def read_screenspot_pro(path, image_root=None, *, strict: bool = False) -> ScreenSpotRecords:
    """ScreenSpot-Pro entries (``bbox`` ``[x1, y1, x2, y2]``, ``img_size`` ``[w, h]``) of one
    annotation file or of a folder of them (Pro ships one per application); ``image_root`` is
    usually the dataset's ``images`` folder (default: each file's folder)."""
    return _read(path, image_root, "xyxy", strict)


def parse_entry(raw: Mapping, layout: str) -> dict:
    """One entry as a record whose ``image`` is its ``img_filename`` as written (not resolved;
    usable as a :class:`~mmrl.data.records.FileExamples` ``parse`` through functools.partial).
    :class:`~mmrl.data.records.BadRecord` names the key at fault and what it should hold."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown box layout {layout!r}; layouts: {', '.join(LAYOUTS)}")
    image = raw.get("img_filename")
    if not isinstance(image, str) or not image.strip():
        raise BadRecord(f"'img_filename' must name the screenshot (a path under image_root), got {image!r}")
    instruction = raw.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise BadRecord(f"'instruction' must be the text naming the element, got {instruction!r}")
    bbox = raw.get("bbox")
    numbers = _numbers(bbox, 4)
    if numbers is None:
        raise BadRecord(f"'bbox' must be 4 numbers {LAYOUTS[layout]} in original pixels, got {bbox!r}")
    a, b, c, d = numbers
    box = (a, b, a + c, b + d) if layout == "xywh" else (a, b, c, d)
    if not (box[2] > box[0] and box[3] > box[1]):
        raise BadRecord(f"'bbox' {bbox!r} read as {LAYOUTS[layout]} has no area; {_OTHER_READER[layout]}")
    if layout == "xyxy" or raw.get("img_size") is not None:
        _check_inside(box, raw.get("img_size"), bbox, layout)
    record = {k: v for k, v in raw.items() if k not in ("img_filename", "bbox")}
    record.update(image=image.strip(), box=box, instruction=instruction.strip())
    if record.get("data_type") is None and raw.get("ui_type") is not None:
        record["data_type"] = raw["ui_type"]
    return record


def _numbers(value: Any, n: int) -> Optional[tuple[float, ...]]:
    """``value`` as ``n`` finite floats (a list of ints / floats, no bools), or None."""
    if not isinstance(value, (list, tuple)) or len(value) != n:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return None
    out = tuple(float(v) for v in value)
    return out if all(math.isfinite(v) for v in out) else None


def _check_inside(box: tuple, img_size: Any, bbox: Any, layout: str) -> None:
    """``img_size`` is a real size and the box lies on the screenshot (1% slack for annotation
    rounding): a box in the other layout usually reaches far outside."""
    size = _numbers(img_size, 2)
    if size is None or not (size[0] > 0 and size[1] > 0):
        raise BadRecord(f"'img_size' must be the screenshot's [width, height] in pixels, got {img_size!r}")
    w, h = size
    sx, sy = max(2.0, 0.01 * w), max(2.0, 0.01 * h)
    if box[0] < -sx or box[1] < -sy or box[2] > w + sx or box[3] > h + sy:
        raise BadRecord(f"'bbox' {bbox!r} read as {LAYOUTS[layout]} reaches outside the {img_size!r} "
                        f"screenshot ('img_size'); {_OTHER_READER[layout]}")


def _files(path) -> list[Path]:
    p = Path(str(path)).expanduser()
    if p.is_dir():
        files = sorted(f for f in p.glob("*.json") if f.is_file() and not f.name.startswith("."))
        if not files:
            raise ValueError(f"{p} holds no .json annotation file")
        return files
    if p.is_file():
        return [p]
    raise FileNotFoundError(f"ScreenSpot annotation file not found: {p}")


def _read(path, image_root, layout: str, strict: bool) -> ScreenSpotRecords:
    root = Path(str(image_root)).expanduser() if image_root else None
    records: list[dict] = []
    wheres: list[str] = []
    skipped: list[tuple[str, str]] = []
    missing: list[tuple[str, str]] = []
    first = None
    for file in _files(path):
        source = JsonRecords(file)  # a file that is not JSON: a ValueError naming file:line
        folder = root or file.parent
        for index, (i, item) in enumerate(source.scan()):  # one item per array element
            if i is None:
                line, reason = item.number, f"{item.reason} (each entry is one element)"
            else:
                line, reason = source.locate(i)[0], None
                try:
                    entry = parse_entry(item, layout)
                except BadRecord as exc:
                    reason = shorten(str(exc))
            where = f"{file}:{line} (entry {index})"
            if reason is None:
                image = folder / entry["image"]
                if image.is_file():
                    records.append({**entry, "image": str(image), "source_file": file.stem})
                    wheres.append(where)
                    continue
                reason = (f"image {image} does not exist (img_filename paths start at {folder}; "
                          "set image_root to the folder holding the screenshots)")
                missing.append((where, str(image)))
            else:
                skipped.append((where, reason))
            if strict:
                raise ValueError(f"{where}: {reason}; fix or remove the entry (or read with strict=False "
                                 "to skip and count such entries)")
            first = first or f"{where}: {reason}"
            if len(skipped) + len(missing) <= _MAX_WARNINGS:
                log.warning("%s skipped: %s", where, reason)
    left_out = len(skipped) + len(missing)
    if left_out > _MAX_WARNINGS:
        log.warning("%s: %d entries skipped in all (%d malformed, %d without their image)",
                    path, left_out, len(skipped), len(missing))
    if not records:
        raise ValueError(f"{path} has no usable entry" + (f"; first problem: {first}" if first else ""))
    return ScreenSpotRecords(records, Path(str(path)), skipped, missing, wheres)
