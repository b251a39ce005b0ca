"""AndroidControl records as episodes of mmrl's GUI action space: the layouts the reader of
:mod:`mmrl.data.gui_episodes` accepts, and how every action maps; and the reading of label values
(numbers, sizes, texts, screenshot paths) that :mod:`mmrl.data.gui_odyssey`, GUI-Odyssey's
counterpart, shares.

AndroidControl (google-research/android_control README, checked): the official data are GZIP
TFRecords whose features are ``episode_id``, ``goal``, ``screenshots`` (PNG bytes),
``screenshot_widths``, ``screenshot_heights``, ``accessibility_trees``, ``actions`` (JSON strings,
one fewer than the screenshots: screenshot i is the screen action i was taken on) and
``step_instructions``. mmrl reads no TFRecords (no TensorFlow); it reads the JSON / JSONL
conversions the community writes, one record per episode, screenshots written out as files (no
official JSON layout exists: the two below, and their key names, follow public conversion scripts
that dump the TFRecord fields, or a ``steps`` list, with screenshot paths):

- the TFRecord's fields side by side: ``goal``, ``episode_id`` (either may be a one-element list),
  ``screenshots`` (or ``screenshot_paths`` / ``screenshot_path`` / ``images``: a list of paths, or
  an object {"0": path, ...}), ``actions``, optional ``screenshot_widths``/``screenshot_heights``,
  ``step_instructions``, ``accessibility_trees`` (or ``accessibility_tree``);
- a ``steps`` list: ``{"image" | "screenshot" | "image_before" | "image_path" | "screenshot_path",
  "action" (a dict or JSON string), "image_size": [w, h] (or screenshot_width/height, width/height,
  image_width/height), "step_instruction", "accessibility_tree", "bbox"}`` beside ``goal`` and
  ``episode_id``; a step without an image falls back to the episode's ``screenshots[step]``.

Its actions (``action_type``; README): ``click`` / ``long_press`` (``x``, ``y`` pixels) ->
click / long_press; ``scroll`` (``direction``) -> scroll, same word; ``open_app`` (``app_name``) ->
open_app; ``input_text`` (``text``) and ``type`` (``x``, ``y``, ``text``: a click there, then the
text; the point is dropped) -> type; ``navigate_home`` / ``navigate_back`` / ``wait``. Also read,
from android_world's JSONAction (the same action vocabulary): ``status`` (``goal_status``
complete / infeasible) -> terminate success / failure, and ``swipe`` -> scroll with the OPPOSITE
word (android_world's actuation: "swipe" is the inverse of "scroll"). ``double_tap``,
``keyboard_enter`` and ``answer`` are unmapped.

**Scroll directions** are the content's, as AndroidControl writes them (checked in android_world's
``actuation.py``: ``scroll`` "down" drags the finger from the centre to the TOP, revealing what is
below): "down" = see what is below = the finger moves up. :mod:`mmrl.measures.gui` reads a label
``scroll`` word as is, so every reader here converts finger movements to this convention.

A step that cannot be read carries ``problem`` = ("skipped" | "unmapped" | "bad_target", reason)
and ``history_text`` (how later prompts show it) instead of an action; the readers count and report
it: a click or bbox off its screenshot (``bad_target``) under ``bad_targets``, as the step examples
count the clicks found off the opened screenshot.
"""


from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Optional, Sequence

from ..measures.gui import DIRECTIONS, finite_number
from .records import BadRecord

OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}


class OffScreen(BadRecord):
    """A readable action whose point or bbox lies off its screenshot: a target that cannot be
    trained on (counted in ``bad_targets``), not a malformed record."""

# AndroidControl / android_world action types with no equivalent in mmrl's action space.
ANDROID_CONTROL_UNMAPPED = ("double_tap", "keyboard_enter", "answer")
_AC_TYPES = ("click", "long_press", "scroll", "swipe", "open_app", "input_text", "type", "navigate_home",
             "navigate_back", "wait", "status")
_GOAL_STATUS = {"complete": "success", "successful": "success", "success": "success",
                "infeasible": "failure", "failure": "failure", "failed": "failure"}

_IMAGE_KEYS = ("image", "screenshot", "image_before", "image_path", "screenshot_path", "img")
_SCREENSHOT_LIST_KEYS = ("screenshots", "screenshot_paths", "screenshot_path", "images")
_SIZE_KEYS = (("screenshot_width", "screenshot_height"), ("image_width", "image_height"), ("width", "height"))
_STEP_INSTRUCTION_KEYS = ("step_instruction", "low_level_instruction", "low_instruction")


# -- numbers ---------------------------------------------------------------------------------------
def read_numbers(value: Any, n: int) -> Optional[list[float]]:
    """``n`` finite floats from a list or tuple of ``n`` numbers or numeric strings, else None."""
    if not isinstance(value, (list, tuple)) or len(value) != n:
        return None
    out = [finite_number(v) for v in value]
    return None if any(v is None for v in out) else out


def read_size(value: Any) -> Optional[tuple[int, int]]:
    """A positive ``(w, h)`` in whole pixels from ``[w, h]``, else None."""
    nums = read_numbers(value, 2)
    if nums is None or not (nums[0] > 0 and nums[1] > 0):
        return None
    return (int(round(nums[0])), int(round(nums[1])))


def _on_screen(point: Sequence[float], size: Optional[Sequence[float]], what: str) -> None:
    """BadRecord when ``point`` lies off the ``size`` screen (1% slack for rounding)."""
    if size is None:
        return
    w, h = size
    sx, sy = max(2.0, 0.01 * w), max(2.0, 0.01 * h)
    if not (-sx <= point[0] <= w + sx and -sy <= point[1] <= h + sy):
        raise OffScreen(f"{what} {list(point)} lies off the {w}x{h} screenshot")


def first_text(value: Any) -> Optional[str]:
    """A non-blank string, or the first of a one-element list of one (TFRecord-style fields)."""
    if isinstance(value, (list, tuple)) and len(value) >= 1:
        value = value[0]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    return value.strip() if isinstance(value, str) and value.strip() else None


# -- AndroidControl --------------------------------------------------------------------------------
def android_control_action(raw: Any, size: Optional[Sequence[float]] = None) -> tuple[Optional[dict], Optional[str]]:
    """``(action, None)`` for an AndroidControl action (a dict or its JSON string) in mmrl's space,
    ``(None, reason)`` for one mmrl's space cannot express; :class:`BadRecord` when malformed.
    ``size`` (w, h): the screenshot, to refuse points off it."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise BadRecord(f"the action is not JSON ({exc.msg}): {raw[:80]!r}") from None
    if not isinstance(raw, Mapping):
        raise BadRecord(f"an action must be a JSON object with 'action_type', got {type(raw).__name__}")
    kind = raw.get("action_type")
    kind = kind.strip().lower() if isinstance(kind, str) else kind
    if kind in ANDROID_CONTROL_UNMAPPED:
        return None, f"action_type {kind!r} has no equivalent in mmrl's action space"
    if kind not in _AC_TYPES:
        raise BadRecord(f"unknown action_type {raw.get('action_type')!r}; AndroidControl's are "
                        f"{', '.join(_AC_TYPES)} (and unmapped {', '.join(ANDROID_CONTROL_UNMAPPED)})")
    if kind in ("click", "long_press"):
        x, y = finite_number(raw.get("x")), finite_number(raw.get("y"))
        if x is None or y is None:
            raise BadRecord(f"a {kind} needs 'x' and 'y' in pixels, got x={raw.get('x')!r}, y={raw.get('y')!r}")
        _on_screen((x, y), size, f"the {kind} point")
        return {"action": kind, "point": [x, y]}, None
    if kind in ("scroll", "swipe"):
        direction = raw.get("direction")
        word = direction.strip().lower() if isinstance(direction, str) else None
        if word not in DIRECTIONS:
            raise BadRecord(f"a {kind} needs 'direction' (one of {', '.join(DIRECTIONS)}), got {direction!r}")
        return {"action": "scroll", "direction": word if kind == "scroll" else OPPOSITE[word]}, None
    if kind == "open_app":
        app = first_text(raw.get("app_name"))
        if app is None:
            raise BadRecord(f"an open_app needs 'app_name', got {raw.get('app_name')!r}")
        return {"action": "open_app", "app": app}, None
    if kind in ("input_text", "type"):
        text = raw.get("text")
        if not isinstance(text, str) or not text.strip():
            raise BadRecord(f"an {kind} needs a non-blank 'text', got {text!r}")
        return {"action": "type", "text": text}, None
    if kind == "status":
        status = raw.get("goal_status")
        value = _GOAL_STATUS.get(status.strip().lower()) if isinstance(status, str) else None
        if value is None:
            raise BadRecord(f"a status needs 'goal_status' complete / infeasible, got {status!r}")
        return {"action": "terminate", "status": value}, None
    return {"action": kind}, None  # navigate_home, navigate_back, wait


def _raw_history(raw: Any) -> str:
    """A step's raw action as later history shows it (steps without a mapped action)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            return raw
    if isinstance(raw, Mapping):
        raw = {("action" if k == "action_type" else k): v for k, v in raw.items()}
    return json.dumps(raw, ensure_ascii=False, default=str)


def _indexed(value: Any, what: str) -> Optional[list]:
    """A per-screen list from a list, or an object keyed "0", "1", ... (ordered by number)."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        try:
            return [v for _, v in sorted(((int(k), v) for k, v in value.items()))]
        except (TypeError, ValueError):
            raise BadRecord(f"{what!r} as an object must be keyed by screen index (\"0\", \"1\", ...)") from None
    if isinstance(value, (list, tuple)):
        return list(value)
    raise BadRecord(f"{what!r} must be a list (one per screen), got {type(value).__name__}")


def image_ref(value: Any, what: str) -> str:
    """A screenshot path as the record writes it; :class:`BadRecord` naming ``what`` otherwise."""
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise BadRecord(f"{what} must be a screenshot file path, got {type(value).__name__} "
                    "(mmrl reads the TFRecord's PNG bytes written out as files)")


def parse_android_control(raw: Mapping, accessibility_trees: bool = False) -> dict:
    """One AndroidControl episode record as an episode whose steps keep ``image`` as written (not
    resolved) and carry ``problem`` (kind, reason) where their action is malformed or unmapped.
    :class:`BadRecord` for an episode that cannot be read at all."""
    goal = first_text(raw.get("goal"))
    if goal is None:
        raise BadRecord(f"'goal' must be the episode's instruction text, got {raw.get('goal')!r}")
    episode_id = first_text(raw.get("episode_id"))
    screens_key = next((k for k in _SCREENSHOT_LIST_KEYS if raw.get(k) is not None), None)
    screens = _indexed(raw.get(screens_key), screens_key) if screens_key else None
    widths = _indexed(raw.get("screenshot_widths"), "screenshot_widths")
    heights = _indexed(raw.get("screenshot_heights"), "screenshot_heights")
    trees_key = "accessibility_trees" if raw.get("accessibility_trees") is not None else "accessibility_tree"
    trees = _indexed(raw.get(trees_key), trees_key) if accessibility_trees else None
    if isinstance(raw.get("steps"), list):
        items = raw["steps"]
        if not items:
            raise BadRecord("'steps' is empty")
        step_instructions = None
    else:
        actions = raw.get("actions")
        if isinstance(actions, (str, bytes)) or not isinstance(actions, (list, tuple)) or not actions:
            raise BadRecord("an episode needs 'actions' (a list, one per step, beside 'screenshots') "
                            f"or 'steps' (a list of step objects), got actions={type(actions).__name__}")
        if screens is None:
            raise BadRecord("'actions' need the screenshots they were taken on: no "
                            + " / ".join(_SCREENSHOT_LIST_KEYS))
        if len(screens) < len(actions):
            raise BadRecord(f"{len(actions)} actions but {len(screens)} screenshots (AndroidControl has one "
                            "screenshot per action, plus the final screen)")
        items = [{"action": a} for a in actions]
        step_instructions = _indexed(raw.get("step_instructions"), "step_instructions")
    steps = []
    for k, item in enumerate(items):
        step: dict[str, Any] = {}
        try:
            if not isinstance(item, Mapping):
                raise BadRecord(f"a step must be an object, got {type(item).__name__}")
            ref = next((item[key] for key in _IMAGE_KEYS if item.get(key) is not None), None)
            if ref is None and screens is not None and k < len(screens):
                ref = screens[k]
            if ref is None:
                raise BadRecord(f"no screenshot: none of {', '.join(_IMAGE_KEYS)} and no episode screenshots[{k}]")
            step["image"] = image_ref(ref, f"screenshot {k}")
            size = read_size(item.get("image_size"))
            if size is None:
                size = next((s for s in (read_size([item.get(a), item.get(b)]) for a, b in _SIZE_KEYS) if s), None)
            if size is None and widths is not None and heights is not None and k < min(len(widths), len(heights)):
                size = read_size([widths[k], heights[k]])
            if size is not None:
                step["image_size"] = size
            instruction = next((item[key] for key in _STEP_INSTRUCTION_KEYS if item.get(key) is not None), None)
            if instruction is None and step_instructions is not None and k < len(step_instructions):
                instruction = step_instructions[k]
            if first_text(instruction) is not None:
                step["step_instruction"] = first_text(instruction)
            if accessibility_trees:
                tree = item.get("accessibility_tree", trees[k] if trees is not None and k < len(trees) else None)
                if tree is not None:
                    step["accessibility_tree"] = tree
            raw_action = item.get("action") if "action" in item else (item if "action_type" in item else None)
            step["raw_action"] = raw_action
            if raw_action is None:
                raise BadRecord("no 'action'")
            action, unmapped = android_control_action(raw_action, size)
            if action is None:
                step.update(action=None, problem=("unmapped", unmapped), history_text=_raw_history(raw_action))
            else:
                bbox = item.get("bbox", raw_action.get("bbox") if isinstance(raw_action, Mapping) else None)
                if bbox is not None and action["action"] in ("click", "long_press"):
                    action["bbox"] = _pixel_box(bbox, size)
                step["action"] = action
        except BadRecord as exc:
            step.setdefault("image", None)
            step.update(action=None, problem=("bad_target" if isinstance(exc, OffScreen) else "skipped", str(exc)),
                        history_text=_raw_history(step.get("raw_action")) if step.get("raw_action") is not None
                        else '{"action": "unknown"}')
        steps.append(step)
    return {"episode_id": episode_id, "instruction": goal, "steps": steps}


def _pixel_box(value: Any, size: Optional[Sequence[float]]) -> list[float]:
    nums = read_numbers(value, 4)
    if nums is None or not (nums[2] > nums[0] and nums[3] > nums[1]):
        raise BadRecord(f"'bbox' must be [x1, y1, x2, y2] pixels with an area, got {value!r}")
    _on_screen(nums[:2], size, "the bbox corner")
    _on_screen(nums[2:], size, "the bbox corner")
    return nums
