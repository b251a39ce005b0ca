"""GUI-Odyssey episodes as episodes of mmrl's GUI action space: the layout the reader of
:mod:`mmrl.data.gui_episodes` accepts, and how every action maps (AndroidControl's are
:mod:`mmrl.data.gui_labels`, whose conventions, scroll directions included, these follow).

GUI-Odyssey (OpenGVLab/GUI-Odyssey ``introduction.md`` and ``data/format_converter.py``, checked):
one JSON object per episode in ``annotations/`` (``episode_id``, ``device_info`` with ``w``/``h``,
``task_info`` with ``task`` / ``instruction``, ``step_length``, ``steps``), screenshots flat in a
sibling ``screenshots/`` folder. A step is ``{"step", "screenshot", "action", "info", "ps",
"sam2_bbox", "low_level_instruction", "description", "intention", "context"}``; coordinates in
``info`` and ``sam2_bbox`` are 0-1000 relative to the screenshot. Actions: ``CLICK`` /
``LONG_PRESS`` with ``info`` ``[[x, y]]`` -> click / long_press, or with ``info`` one of the special
keys ``KEY_HOME`` -> navigate_home, ``KEY_BACK`` -> navigate_back, ``KEY_APPSELECT`` (the
recent-apps button; unmapped: mmrl's space has no such action, later history shows it as
``{"action": "recent_apps"}``); ``SCROLL`` with ``info`` ``[[x1, y1], [x2, y2]]``, the finger's
start and end -> scroll along the larger movement, converted to the content's direction (the
official converter writes the finger's: its "SCROLL: UP" is mmrl's "down"); ``TEXT`` (the data; the
docs say ``TYPE``, both read) with the text in ``info`` -> type; ``COMPLETE`` -> terminate success;
``INCOMPLETE`` (``IMPOSSIBLE`` in the converter's output) -> terminate failure. ``KEY_*`` / ``HOME`` /
``BACK`` as action names are read too. ``sam2_bbox`` (0-1000, ``[]`` when none) becomes the
click's ``bbox``. The instruction is ``task_info.instruction`` (the official "high" level), else
``task``; ``low_level_instruction`` is the step instruction.

0-1000 points become pixels with the screenshot's size: ``device_info`` ``w``/``h`` when given,
else the screenshot's own (its header is read). Not checked: that GUI-Odyssey screenshots are
stored at ``device_info``'s size; :class:`mmrl.data.gui_steps.StepExamples` rescales a step's
points and box whenever the opened screenshot's size differs from the recorded ``image_size``
(exact for 0-1000 labels, and for pixel labels of a resized copy).

A step that cannot be read carries ``problem`` = ("skipped" | "unmapped", reason) and
``history_text`` (how later prompts show it) instead of an action; the reader counts and reports it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Callable, Optional, Sequence

from ..measures.gui import finite_number
from .gui_labels import OPPOSITE, first_text, image_ref, read_numbers, read_size
from .records import BadRecord

_ODYSSEY_KEYS = {"KEY_HOME": "navigate_home", "HOME": "navigate_home", "PRESS_HOME": "navigate_home",
                 "KEY_BACK": "navigate_back", "BACK": "navigate_back", "PRESS_BACK": "navigate_back"}
_ODYSSEY_UNMAPPED = {"KEY_APPSELECT": "recent_apps", "PRESS_RECENT": "recent_apps"}
_ODYSSEY_ACTIONS = ("CLICK", "LONG_PRESS", "SCROLL", "TEXT", "TYPE", "COMPLETE", "INCOMPLETE", "IMPOSSIBLE",
                    *_ODYSSEY_KEYS, *_ODYSSEY_UNMAPPED)


def _odyssey_points(info: Any) -> Optional[list[list[float]]]:
    """``[[x, y], ...]`` from GUI-Odyssey's ``info`` (also a flat ``[x, y]``), else None."""
    if isinstance(info, (list, tuple)) and len(info) == 2 and all(finite_number(v) is not None for v in info):
        info = [info]
    if not isinstance(info, (list, tuple)) or not info:
        return None
    points = [read_numbers(p, 2) for p in info]
    return None if any(p is None for p in points) else points


def _rel1000_to_pixels(point: Sequence[float], size: Sequence[float], what: str) -> list[float]:
    x, y = point
    if not (-10 <= x <= 1010 and -10 <= y <= 1010):
        raise BadRecord(f"{what} {list(point)} is not a 0-1000 coordinate (GUI-Odyssey normalises to 0-1000)")
    return [x / 1000.0 * size[0], y / 1000.0 * size[1]]


def odyssey_action(step: Mapping, size: Optional[Sequence[float]]) -> tuple[Optional[dict], Optional[str]]:
    """``(action, None)`` for a GUI-Odyssey step's ``action``/``info`` in mmrl's space (points in
    pixels of a ``size`` screenshot, None when unknown), ``(None, reason)`` for an action mmrl's
    space cannot express; :class:`BadRecord` when malformed."""
    name = step.get("action")
    name = name.strip().upper() if isinstance(name, str) else None
    info = step.get("info")
    if name not in _ODYSSEY_ACTIONS:
        raise BadRecord(f"unknown action {step.get('action')!r}; GUI-Odyssey's are {', '.join(_ODYSSEY_ACTIONS[:8])} "
                        "(CLICK with info KEY_HOME / KEY_BACK / KEY_APPSELECT for the system keys)")
    key = info.strip().upper() if isinstance(info, str) and name in ("CLICK", "LONG_PRESS") else name
    if key in _ODYSSEY_KEYS:
        return {"action": _ODYSSEY_KEYS[key]}, None
    if key in _ODYSSEY_UNMAPPED:
        return None, f"{key} (the recent-apps button) has no equivalent in mmrl's action space"
    if name in ("CLICK", "LONG_PRESS"):
        points = _odyssey_points(info)
        if points is None or len(points) != 1:
            raise BadRecord(f"a {name} needs info [[x, y]] (0-1000) or one of the special keys KEY_HOME, "
                            f"KEY_BACK, KEY_APPSELECT, got {info!r}")
        if size is None:
            raise BadRecord("the screenshot's size is unknown (no device_info w/h and no screenshot), "
                            "so the 0-1000 point cannot become pixels")
        action = {"action": name.lower(), "point": _rel1000_to_pixels(points[0], size, f"the {name} point")}
        box = step.get("sam2_bbox")
        nums = read_numbers(box, 4)
        if nums is not None and nums[2] > nums[0] and nums[3] > nums[1]:
            action["bbox"] = [v for corner in (nums[:2], nums[2:])
                              for v in _rel1000_to_pixels(corner, size, "the sam2_bbox")]
        elif box not in (None, [], "", ()):
            raise BadRecord(f"'sam2_bbox' must be [x1, y1, x2, y2] (0-1000) with an area, or [], got {box!r}")
        return action, None
    if name == "SCROLL":
        points = _odyssey_points(info)
        if points is None or len(points) != 2:
            raise BadRecord(f"a SCROLL needs info [[x1, y1], [x2, y2]] (the finger's start and end), got {info!r}")
        dx, dy = points[1][0] - points[0][0], points[1][1] - points[0][1]
        if dx == 0 and dy == 0:
            raise BadRecord(f"a SCROLL whose finger does not move: {info!r}")
        finger = ("right" if dx > 0 else "left") if abs(dx) > abs(dy) else ("down" if dy > 0 else "up")
        return {"action": "scroll", "direction": OPPOSITE[finger]}, None
    if name in ("TEXT", "TYPE"):
        if not isinstance(info, str) or not info.strip():
            raise BadRecord(f"a {name} needs the typed text in info, got {info!r}")
        return {"action": "type", "text": info}, None
    if name == "COMPLETE":
        return {"action": "terminate", "status": "success"}, None
    return {"action": "terminate", "status": "failure"}, None  # INCOMPLETE / IMPOSSIBLE


def parse_gui_odyssey(raw: Mapping, size_of: Callable[[str], Optional[tuple[int, int]]] = lambda ref: None) -> dict:
    """One GUI-Odyssey episode as an episode whose steps keep ``image`` as written and carry
    ``problem`` where malformed or unmapped. ``size_of(screenshot)``: the screenshot's (w, h) when
    ``device_info`` gives none."""
    task = raw.get("task_info")
    if not isinstance(task, Mapping):
        raise BadRecord(f"'task_info' must be an object with 'instruction' / 'task', got {type(task).__name__}")
    instruction = first_text(task.get("instruction")) or first_text(task.get("task"))
    if instruction is None:
        raise BadRecord("'task_info' has no 'instruction' or 'task' text")
    items = raw.get("steps")
    if not isinstance(items, list) or not items:
        raise BadRecord(f"'steps' must be a non-empty list of steps, got {type(items).__name__}")
    device = raw.get("device_info")
    device_size = read_size([device.get("w"), device.get("h")]) if isinstance(device, Mapping) else None
    steps = []
    for k, item in enumerate(items):
        step: dict[str, Any] = {"image": None}
        try:
            if not isinstance(item, Mapping):
                raise BadRecord(f"a step must be an object, got {type(item).__name__}")
            step["raw_action"] = {"action": item.get("action"), "info": item.get("info")}
            step["image"] = image_ref(item.get("screenshot"), "'screenshot'")
            size = device_size or size_of(step["image"])
            if size is not None:
                step["image_size"] = size
            if first_text(item.get("low_level_instruction")) is not None:
                step["step_instruction"] = first_text(item["low_level_instruction"])
            action, unmapped = odyssey_action(item, size)
            if action is None:
                step.update(action=None, problem=("unmapped", unmapped),
                            history_text=json.dumps({"action": "recent_apps"}))
            else:
                step["action"] = action
        except BadRecord as exc:
            raw_action = step.get("raw_action") or {}
            step.update(action=None, problem=("skipped", str(exc)),
                        history_text=json.dumps({"action": str(raw_action.get("action")).lower(),
                                                 "info": raw_action.get("info")}, ensure_ascii=False, default=str))
        steps.append(step)
    episode_id = first_text(raw.get("episode_id"))
    return {"episode_id": episode_id, "instruction": instruction, "steps": steps}
