"""Images as datasets give them: decoding, references in records, folders of image files.

A record's image may be a path (relative to an ``image_root``), image bytes (raw, or the
``{"bytes": ..., "path": ...}`` dict a ``datasets`` ``Image`` feature stores), a PIL image, or a
list of those (verl / EasyR1 ``images``: single-image tasks use the first). URLs are refused:
mmrl reads local files only. :func:`image_problem` checks a reference without decoding it (when
a dataset is indexed), :func:`open_image` decodes it (when an example is used).

A pile of unlabelled or class-foldered images is the data of several tasks (classification
folders, the self-supervised rotation / jigsaw tasks), and one unreadable file must not stop a
run: :class:`ImageFiles` counts it, warns once, and returns the next image instead.
"""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path
from typing import Any, Optional, Sequence

from ..media.pixels import to_rgb
from .messages import shorten
from .sequence import SkippingSequence

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def load_image(path: Path):
    """An RGB PIL image, fully decoded now (so a truncated file fails here, not later), converted as
    transformers converts it (:func:`mmrl.media.pixels.to_rgb`: transparency on white)."""
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        return to_rgb(im)


def _first(value: Any) -> Any:
    """The first image of a list of images (single-image tasks), else the value itself."""
    return value[0] if isinstance(value, (list, tuple)) and value else value


def image_problem(value: Any) -> Optional[str]:
    """Why ``value`` is not an image reference mmrl can open, or None when it is one (nothing is
    read or decoded here)."""
    from PIL import Image

    if isinstance(value, (list, tuple)) and not value:
        return "the list of images is empty"
    value = _first(value)
    if isinstance(value, Image.Image):
        return None
    if isinstance(value, (bytes, bytearray)):
        return None if value else "the image bytes are empty"
    if isinstance(value, dict):
        if value.get("bytes"):
            return None
        if value.get("path"):
            return image_problem(value["path"])
        return "an image dict needs 'bytes' or 'path'"
    if isinstance(value, (str, Path)):
        text = str(value).strip()
        if not text:
            return "the image path is empty"
        if _URL.match(text):
            return (f"image {text!r} is a URL; mmrl reads local files only (it downloads nothing): "
                    "download the images and give their paths, relative to image_root")
        return None
    return (f"an image must be a path, image bytes, a {{'bytes', 'path'}} dict or a list of them, "
            f"got {type(value).__name__}")


def open_image(value: Any, root: Path) -> tuple[Any, Optional[Path]]:
    """The RGB PIL image of a reference (see :func:`image_problem`) and the file it came from
    (None for embedded bytes); relative paths start at ``root``. Raises when it cannot be read."""
    from PIL import Image

    value = _first(value)
    if isinstance(value, Image.Image):
        return to_rgb(value), None
    if isinstance(value, dict):
        value = value["bytes"] if value.get("bytes") else value["path"]
    if isinstance(value, (bytes, bytearray)):
        with Image.open(io.BytesIO(value)) as im:
            im.load()
            return to_rgb(im), None
    path = Path(str(value).strip()).expanduser()
    path = path if path.is_absolute() else root / path
    if not path.is_file():
        raise FileNotFoundError(f"image {path} does not exist (relative paths start at {root})")
    return load_image(path), path


def find_images(folder: str | Path, extensions: Sequence[str] = IMAGE_EXTENSIONS) -> list[Path]:
    """Image files under ``folder`` (recursive, by extension, case-insensitive), sorted by path;
    hidden files and folders (a name starting with ".") are left out."""
    folder = Path(folder).expanduser()
    exts = {e.lower() for e in extensions}
    found = []
    for p in folder.rglob("*"):
        rel = p.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if p.suffix.lower() in exts and p.is_file():
            found.append(p)
    return sorted(found, key=lambda p: p.relative_to(folder).as_posix())


class ImageFiles(SkippingSequence):
    """Images from a list of files, opened (and resized to ``size`` x ``size`` when ``size``) on
    access. Item i is ``{"image": PIL RGB, "image_path": str, "image_size": (w, h), **meta[i]}``.

    An unreadable file is counted in ``bad_images`` (path -> error, warned once) and the next file
    is returned instead, deterministically, so indexing never raises for bad data (only when no
    file at all can be opened); evaluation skips it (``usable``)."""

    def __init__(self, paths: Sequence[str | Path], meta: Optional[Sequence[dict]] = None,
                 size: Optional[int] = None, name: str = "images"):
        self.paths = [Path(p) for p in paths]
        if not self.paths:
            raise ValueError(f"{name}: no image files")
        self.meta = list(meta) if meta is not None else [{} for _ in self.paths]
        if len(self.meta) != len(self.paths):
            raise ValueError(f"{name}: {len(self.meta)} meta entries for {len(self.paths)} files")
        self.size = size
        self.name = name
        self.bad_images: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self.paths)

    def usable(self, i: int) -> Optional[dict]:
        path = self.paths[i]
        try:
            image = load_image(path)
        except Exception as exc:  # PIL raises many types for corrupt files
            if str(path) not in self.bad_images:
                self.bad_images[str(path)] = shorten(f"{type(exc).__name__}: {exc}")
                log.warning("%s: cannot open image %s (%s); skipped", self.name, path, exc)
            return None
        if self.size:
            image = image.resize((self.size, self.size))
        return {**self.meta[i], "image": image, "image_path": str(path), "image_size": image.size}

    def nothing_usable(self) -> str:
        return f"{self.name}: no image could be opened (e.g. {next(iter(self.bad_images))})"

    def stats(self) -> dict[str, Any]:
        return {"examples": len(self), "bad_images": len(self.bad_images)}
