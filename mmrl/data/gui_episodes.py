"""AndroidControl and GUI-Odyssey episodes, read as they ship, as single-step GUI action examples.

Both datasets record human demonstrations on Android: a goal, then per step the screenshot the
person saw and the action they took. The readers turn each into one layout, with actions in mmrl's
action space (:mod:`mmrl.measures.gui`) and every point in ORIGINAL screenshot pixels::

    {"episode_id", "instruction",
     "steps": [{"image": <screenshot path or None>, "action": <normalised action or None>,
                "image_size": (w, h) when known, "raw_action": <the action as the file gives it>,
                "step_instruction": when given, "accessibility_tree": when asked for}]}

A click's action may carry ``"bbox"``, the target element's box ``[x1, y1, x2, y2]`` in pixels
(then :func:`mmrl.measures.gui_match.click_correct` scores a click inside it; without one, within 14%
of the screen of the labelled point).

**An episode keeps every step**, so the history of later steps is complete: a step whose action is
malformed (skipped, counted), has no equivalent in mmrl's action space (``unmapped``, counted), points
off its screenshot (``bad_targets``, counted) or whose screenshot is absent (``missing_images``,
counted) stays in the episode with ``action`` or
``image`` None, and :func:`mmrl.data.gui_steps.episode_steps` makes an example only of the steps
that have both. A
step without an action carries ``history_text``, how later prompts show it.

The datasets' layouts, what was checked against their sources and how each action maps:
:mod:`mmrl.data.gui_labels` (AndroidControl) and :mod:`mmrl.data.gui_odyssey`. In short: AndroidControl as the community's JSON / JSONL conversions
of its TFRecords (points in pixels), GUI-Odyssey as released (``annotations/*.json``, points 0-1000
converted to pixels); scroll directions are the content's ("down" shows what is below).

Bad records are treated as :mod:`mmrl.data.screenspot` treats them: skipped with a warning naming
``file:line`` (episode and step), counted (``skipped``, ``missing_images``, ``unmapped``,
``bad_targets``, ``stats()``); a source with no usable step is an error naming its first problem; ``strict=True``
makes the first malformed entry or missing screenshot an error (unmapped actions are the dataset's
own and never raise).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, Sequence

from .gui_labels import parse_android_control
from .gui_odyssey import parse_gui_odyssey
from .gui_steps import is_usable_step
from .json_files import ENCODING
from .records import BadRecord
from .sources import JsonlRecords, JsonRecords

log = logging.getLogger(__name__)

FORMATS = ("android_control", "gui_odyssey")
_MAX_WARNINGS = 10
_SUFFIXES = (".json", ".jsonl")


class GuiEpisodes(list):
    """The episodes read (a plain list) and what was left out, each a ``(where, reason)`` list:
    ``skipped`` (malformed episodes and steps), ``missing_images`` (where, path) of steps whose
    screenshot is absent, ``unmapped`` (steps whose action mmrl's space cannot express),
    ``bad_targets`` (steps whose click or bbox lies off the screenshot the file records)."""

    def __init__(self, episodes, path: Path, skipped: list, missing_images: list, unmapped: list,
                 bad_targets: Optional[list] = None):
        super().__init__(episodes)
        self.path, self.skipped, self.missing_images, self.unmapped = path, skipped, missing_images, unmapped
        self.bad_targets = list(bad_targets or [])

    def num_steps(self) -> int:
        """The steps that make examples (an image and an action)."""
        return sum(1 for ep in self for s in ep["steps"] if is_usable_step(s))

    def stats(self) -> dict[str, Any]:
        """``examples`` (usable steps), ``episodes``, and the counts under
        :meth:`mmrl.data.records.FileExamples.stats`'s keys (``missing_images`` too, in ``bad_images``),
        plus ``unmapped_steps``."""
        return {"examples": self.num_steps(), "episodes": len(self), "skipped_lines": len(self.skipped),
                "bad_images": len(self.missing_images), "missing_images": len(self.missing_images),
                "bad_targets": len(self.bad_targets), "unmapped_steps": len(self.unmapped)}


def read_android_control(path, image_root=None, *, strict: bool = False,
                         accessibility_trees: bool = False) -> GuiEpisodes:
    """AndroidControl episodes of a JSON / JSONL file or of the ``.json``/``.jsonl`` files under a
    folder (see the module docstring for the layouts). ``image_root``: where relative screenshot
    paths start (default: each file's folder); an absolute path that does not exist is also
    looked for by its name under ``image_root``. ``accessibility_trees=True`` keeps each step's
    tree as the file gives it (often large text: off by default)."""
    return _read(path, image_root, "android_control", strict, accessibility_trees)


def read_gui_odyssey(path, image_root=None, *, strict: bool = False) -> GuiEpisodes:
    """GUI-Odyssey episodes: one annotation file, or the ``annotations`` folder of them (a JSON
    array or JSONL of episodes is read too). ``image_root``: the ``screenshots`` folder (default:
    each file's folder, then the release layout's ``../screenshots`` beside it)."""
    return _read(path, image_root, "gui_odyssey", strict, False)


def read_episodes(path, image_root=None, *, format: str, strict: bool = False) -> GuiEpisodes:
    """The reader of ``format`` ("android_control" | "gui_odyssey") applied to ``path``."""
    if format not in FORMATS:
        raise ValueError(f"unknown GUI episode format {format!r}; formats: {', '.join(FORMATS)}")
    return _read(path, image_root, format, strict, False)


# -- files -----------------------------------------------------------------------------------------
def _files(path) -> list[Path]:
    p = Path(str(path)).expanduser()
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.suffix in _SUFFIXES and f.is_file()
                       and not any(part.startswith(".") for part in f.relative_to(p).parts))
        if not files:
            raise ValueError(f"{p} holds no .json / .jsonl episode file")
        return files
    if p.is_file():
        return [p]
    raise FileNotFoundError(f"GUI episode file not found: {p}")


def _looks_like_episode(obj: Mapping) -> bool:
    return any(k in obj for k in ("steps", "actions", "goal", "task_info"))


def _records(file: Path):
    """``(line, record or None, problem or None, step_lines)`` for each episode record of a file
    (``step_lines`` only for a file holding one episode object, else None):
    JSONL lines, JSON array elements, or the file's one episode object (whose steps' lines are
    found when they are its one list of objects)."""
    from .sources import _is_jsonl  # the same JSONL sniffing as the generic readers

    if file.suffix == ".jsonl" or _is_jsonl(file):
        source = JsonlRecords(file)
        for i, item in source.scan():
            if i is None:
                yield item.number, None, item.reason, None
            else:
                yield source.locate(i)[0], item, None, None
        return
    text = file.read_text(encoding=ENCODING)
    head = text.lstrip()[:1]
    if head == "{":
        try:
            whole = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{file}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        if _looks_like_episode(whole):
            yield 1, whole, None, _step_lines(file)
            return
    try:
        source = JsonRecords(file)  # an array of episodes, or an object whose one list holds them
    except ValueError as exc:
        if head != "{":
            raise
        # another JSON object (e.g. GUI-Odyssey's splits/*.json beside the annotations): no episode
        yield 1, None, (f"not an episode file: an episode object has 'steps' / 'actions' / 'goal' / "
                        f"'task_info' ({str(exc).split(': ', 1)[-1]})"), None
        return
    for i, item in source.scan():
        if i is None:
            yield item.number, None, item.reason, None
        else:
            yield source.locate(i)[0], item, None, None


def _step_lines(file: Path) -> Optional[list[int]]:
    try:
        source = JsonRecords(file)
    except ValueError:
        return None
    if source.key != "steps":
        return None
    return [source.locate(i)[0] for i, _ in source.scan() if i is not None]


def _read(path, image_root, fmt: str, strict: bool, trees: bool) -> GuiEpisodes:
    root = Path(str(image_root)).expanduser() if image_root else None
    episodes: list[dict] = []
    skipped: list[tuple[str, str]] = []
    missing: list[tuple[str, str]] = []
    unmapped: list[tuple[str, str]] = []
    bad_targets: list[tuple[str, str]] = []
    first = None
    warned = 0
    for file in _files(path):
        folders = [root] if root else [file.parent]
        if root is None and fmt == "gui_odyssey":  # the release layout: annotations/ beside screenshots/
            folders.append(file.parent.parent / "screenshots")
        sizes: dict[str, Optional[tuple[int, int]]] = {}

        def size_of(ref: str) -> Optional[tuple[int, int]]:
            if ref not in sizes:
                found = _resolve(ref, folders, root)
                sizes[ref] = _header_size(found) if found is not None else None
            return sizes[ref]

        for index, (line, raw, reason, step_lines) in enumerate(_records(file)):
            where = f"{file}:{line} (episode {index})"
            problems: list[tuple[str, str, str]] = []  # (kind, where, reason)
            episode = None
            if raw is not None:
                try:
                    episode = (parse_android_control(raw, trees) if fmt == "android_control"
                               else parse_gui_odyssey(raw, size_of))
                except BadRecord as exc:
                    reason = str(exc)
            if episode is None:
                problems.append(("skipped", where, reason))
            else:
                if episode["episode_id"] is None:  # a one-episode file is named by it, else file:index
                    episode["episode_id"] = file.stem if step_lines is not None else f"{file.stem}:{index}"
                for k, step in enumerate(episode["steps"]):
                    n = step_lines[k] if step_lines is not None and k < len(step_lines) else line
                    step_where = f"{file}:{n} (episode {index}, step {k})"
                    problem = step.pop("problem", None)
                    if problem is not None:
                        problems.append((problem[0], step_where, problem[1]))
                    if step.get("image") is not None:
                        found = _resolve(step["image"], folders, root)
                        if found is None and step.get("action") is None:
                            step["image"] = None  # no example either way: nothing more to report
                        elif found is None:
                            ref = Path(step["image"])
                            looked = ref if ref.is_absolute() else folders[0] / ref
                            missing.append((step_where, str(looked)))
                            problems.append(("missing", step_where,
                                             f"screenshot {looked} does not exist (relative paths start at "
                                             f"{' or '.join(map(str, folders))}; set image_root to the folder "
                                             "holding the screenshots)"))
                            step["image"] = None
                        else:
                            step["image"] = str(found)
                episodes.append(episode)
            for kind, at, why in problems:
                if kind == "skipped":
                    skipped.append((at, why))
                elif kind == "bad_target":
                    bad_targets.append((at, why))
                elif kind == "unmapped":
                    unmapped.append((at, why))
                    continue  # the dataset's own action: counted, never an error
                if strict:
                    raise ValueError(f"{at}: {why}; fix or remove the entry (or read with strict=False "
                                     "to skip and count such entries)")
                first = first or f"{at}: {why}"
                warned += 1
                if warned <= _MAX_WARNINGS:
                    log.warning("%s skipped: %s", at, why)
    result = GuiEpisodes(episodes, Path(str(path)), skipped, missing, unmapped, bad_targets)
    if warned > _MAX_WARNINGS:
        log.warning("%s: %d problems in all (%d malformed, %d without their screenshot, %d off it)",
                    path, warned, len(skipped), len(missing), len(bad_targets))
    if not result.num_steps():
        raise ValueError(f"{path} has no usable step (a screenshot and an action in mmrl's space)"
                         + (f"; first problem: {first}" if first else ""))
    return result


def _resolve(ref: str, folders: Sequence[Path], root: Optional[Path]) -> Optional[Path]:
    """The screenshot file of a reference: an absolute path as is (else its name under
    ``root``), a relative one under the first of ``folders`` holding it; None when absent."""
    p = Path(ref).expanduser()
    if p.is_absolute():
        if p.is_file():
            return p
        return root / p.name if root is not None and (root / p.name).is_file() else None
    return next((f / p for f in folders if (f / p).is_file()), None)


def _header_size(path: Path) -> Optional[tuple[int, int]]:
    """(w, h) from an image file's header (not decoded), or None when unreadable."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            return im.size
    except Exception:
        return None
