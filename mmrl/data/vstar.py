"""V* Bench ("V*: Guided Visual Search as a Core Mechanism in Multimodal LLMs", Wu & Xie, 2023) as
mmrl examples.

The benchmark folder as its own evaluation scripts read it (``vstar_bench_eval.py`` in
penghao-wu/vstar; ``eval/eval_vstar.py`` in Visual-Agent/DeepEyes)::

    vstar_bench/direct_attributes/<name>.jpg  + <name>.json
    vstar_bench/relative_position/<name>.jpg  + <name>.json

Each JSON holds ``question`` (text) and ``options`` (a list of answer texts) whose FIRST entry is
the correct one (both scripts score ``options[0]``). The reader needs those two. It also keeps,
when present, ``target_object`` (names of the objects asked about) and ``bbox`` (their boxes, read
as COCO-style ``[x, y, w, h]`` in image pixels, as V*'s own search code reads its boxes; this
layout is not stated by the evaluation scripts, which ignore the field): they become
``target_boxes`` ``[x1, y1, x2, y2]`` for the ``crop_iou`` reward.

Options are shown in the file's order unless ``shuffle_options`` (then in an order fixed by the
example's id): with the file's order the right answer is always "A".
"""

from __future__ import annotations

import json
import logging
import random
import string
from pathlib import Path
from typing import Any, Optional, Sequence

from ..media.coords import box_problem
from .images import IMAGE_EXTENSIONS, load_image
from .json_files import ENCODING
from .messages import shorten
from .records import BadRecord
from .sequence import SkippingSequence

log = logging.getLogger(__name__)

VSTAR_CATEGORIES = ("direct_attributes", "relative_position")

__all__ = ["VSTAR_CATEGORIES", "VStarExamples", "parse_vstar_annotation"]


def parse_vstar_annotation(anno: Any) -> dict:
    """The fields of one V* JSON (see the module docstring); :class:`BadRecord` says what is missing."""
    if not isinstance(anno, dict):
        raise BadRecord(f"the annotation must be a JSON object, got {type(anno).__name__}")
    question = anno.get("question")
    if not isinstance(question, str) or not question.strip():
        raise BadRecord("no 'question' text")
    options = anno.get("options")
    if not isinstance(options, list) or len(options) < 2 or not all(isinstance(o, str) and o.strip() for o in options):
        raise BadRecord(f"'options' must be a list of 2 or more answer texts, got {options!r}"[:200])
    boxes = []
    for b in anno.get("bbox") or []:
        if not (isinstance(b, (list, tuple)) and len(b) == 4 and all(isinstance(v, (int, float)) for v in b)):
            raise BadRecord(f"'bbox' entries must be [x, y, w, h], got {b!r}"[:200])
        boxes.append((float(b[0]), float(b[1]), float(b[0]) + float(b[2]), float(b[1]) + float(b[3])))
    targets = anno.get("target_object") or []
    targets = [targets] if isinstance(targets, str) else [str(t) for t in targets]
    return {"question": question.strip(), "options": [o.strip() for o in options], "target_object": targets,
            "target_boxes": boxes}


class VStarExamples(SkippingSequence):
    """The examples of a V* Bench folder, images opened on access. Item i: ``image``,
    ``image_path``, ``image_size``, ``question``, ``options`` (display order), ``answer`` (the
    correct option's text), ``answer_letter``, ``category``, ``target_object``, ``target_boxes``,
    ``id`` (``category/name``). An image without its JSON, or a JSON without a usable question and
    options, is skipped when the folder is read (``skipped``: ``(file, reason)``, the first
    ``max_skip_warnings`` warned); an image that does not open (``bad_images``) or whose boxes lie
    off it (``bad_targets``) when it is read. A missing category folder is an error."""

    def __init__(self, root: str | Path, categories: Sequence[str] = VSTAR_CATEGORIES,
                 shuffle_options: bool = False, max_skip_warnings: int = 10):
        self.root = Path(root).expanduser()
        self.shuffle_options = shuffle_options
        self.skipped: list[tuple[str, str]] = []
        self.bad_images: dict[str, str] = {}
        self.bad_targets: dict[str, str] = {}
        self._items: list[tuple[Path, str, dict]] = []
        for category in categories:
            folder = self.root / category
            if not folder.is_dir():
                raise FileNotFoundError(f"V* Bench: no folder {folder} (a V* folder holds {', '.join(VSTAR_CATEGORIES)})")
            exts = {e.lower() for e in IMAGE_EXTENSIONS}
            for path in sorted(p for p in folder.iterdir() if p.suffix.lower() in exts and not p.name.startswith(".")):
                try:
                    anno_path = path.with_suffix(".json")
                    if not anno_path.exists():
                        raise BadRecord(f"no annotation {anno_path.name}")
                    try:
                        anno = json.loads(anno_path.read_text(encoding=ENCODING))
                    except (ValueError, UnicodeDecodeError) as exc:
                        raise BadRecord(f"{anno_path.name} is not valid JSON ({exc})") from None
                    self._items.append((path, category, parse_vstar_annotation(anno)))
                except BadRecord as exc:
                    self.skipped.append((str(path), shorten(str(exc))))
                    if len(self.skipped) <= max_skip_warnings:
                        log.warning("%s skipped: %s", path, self.skipped[-1][1])
        if len(self.skipped) > max_skip_warnings:
            log.warning("%s: %d V* examples skipped in all", self.root, len(self.skipped))
        if not self._items:
            first = f"; first problem: {self.skipped[0][0]}: {self.skipped[0][1]}" if self.skipped else ""
            raise ValueError(f"{self.root} holds no usable V* Bench example{first}")

    def __len__(self) -> int:
        return len(self._items)

    def usable(self, i: int) -> Optional[dict]:
        path, category, anno = self._items[i]
        try:
            image = load_image(path)
        except Exception as exc:  # PIL raises many types for corrupt files
            if str(path) not in self.bad_images:
                self.bad_images[str(path)] = shorten(f"{type(exc).__name__}: {exc}")
                log.warning("%s: cannot open the image (%s); skipped", path, self.bad_images[str(path)])
            return None
        w, h = image.size
        problems = [p for p in (box_problem(b, w, h) for b in anno["target_boxes"]) if p]
        if problems:
            self.bad_targets.setdefault(str(path), problems[0])
            log.warning("%s skipped: %s", path, problems[0])
            return None
        uid = f"{category}/{path.stem}"
        options = list(anno["options"])
        if self.shuffle_options:
            random.Random(uid).shuffle(options)
        answer = anno["options"][0]
        return {"image": image, "image_path": str(path), "image_size": (w, h), "question": anno["question"],
                "options": options, "answer": answer, "answer_letter": string.ascii_uppercase[options.index(answer)],
                "category": category, "target_object": anno["target_object"], "target_boxes": anno["target_boxes"],
                "id": uid}

    def nothing_usable(self) -> str:
        problems = {**self.bad_images, **self.bad_targets}
        where, why = next(iter(problems.items()))
        return f"{self.root}: no V* example could be used (e.g. {where}: {why})"

    def stats(self) -> dict[str, Any]:
        return {"examples": len(self), "skipped_lines": len(self.skipped), "bad_images": len(self.bad_images),
                "bad_targets": len(self.bad_targets)}
