"""Single-step GUI actions: the action space, how an action is written, and a tolerant parser
(any common action format read into one normalised dict). How a predicted action is scored
against the example's is :mod:`mmrl.measures.gui_match`.

Shared by the GUI rewards (``rewards/gui.py``), the GUI tasks and environments. Like :mod:`mmrl.parsing`, nothing here raises on model
output: an unreadable action is ``None``.

The action space (one JSON object in the ``<answer>`` block):

===================================================  =========================================
``{"action": "click", "point": [x, y]}``             tap the screen at a point
``{"action": "long_press", "point": [x, y]}``        press and hold at a point
``{"action": "type", "text": "..."}``                type text into the focused field
``{"action": "scroll", "direction": "down"}``        up / down / left / right
``{"action": "open_app", "app": "..."}``             launch an app by name
``{"action": "navigate_back"}``                      the system back button
``{"action": "navigate_home"}``                      the system home button
``{"action": "wait"}``                               let the screen settle
``{"action": "terminate", "status": "success"}``     end the episode: success / failure
===================================================  =========================================

Points are in the policy's coordinate space (:mod:`mmrl.media.coords`: Qwen2.5-VL resized-image
pixels, Qwen2-VL/Qwen3-VL 0-1000) and are converted to original-image pixels with
:func:`~mmrl.media.coords.prediction_to_pixels` (from ``ex["pred_space"]``/``ex["frame"]``) before
they meet a label, which is in original pixels. ``swipe`` is read as ``scroll`` with the same
direction word: a dataset whose swipe direction is the finger's (the opposite of the content's)
should write its labels as ``scroll``.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any, Optional, Sequence

from mmrl.media.coords import prediction_to_pixels
from mmrl.parsing import extract_answer, python_expression, python_literal

ACTION_TYPES = ("click", "long_press", "type", "scroll", "open_app", "navigate_back", "navigate_home",
                "wait", "terminate")
POINT_ACTIONS = ("click", "long_press")
TEXT_ACTIONS = {"type": "text", "open_app": "app"}  # action -> its text argument
DIRECTIONS = ("up", "down", "left", "right")
STATUSES = ("success", "failure")

_ALIASES = {name: name for name in ACTION_TYPES}
_ALIASES.update({
    "tap": "click", "long_click": "long_press", "longpress": "long_press",
    "input": "type", "type_text": "type", "input_text": "type",
    "swipe": "scroll", "open": "open_app", "launch": "open_app", "launch_app": "open_app",
    "back": "navigate_back", "press_back": "navigate_back", "go_back": "navigate_back",
    "home": "navigate_home", "press_home": "navigate_home", "go_home": "navigate_home",
    "finish": "terminate", "finished": "terminate", "done": "terminate", "stop": "terminate",
    "complete": "terminate",
})
_STATUS_ALIASES = {"success": "success", "successful": "success", "succeeded": "success",
                   "complete": "success", "completed": "success", "done": "success", "true": "success",
                   "failure": "failure", "fail": "failure", "failed": "failure", "infeasible": "failure",
                   "impossible": "failure", "false": "failure"}
# Keys a model may use for each argument, most specific first ("input_text" is UI-R1/GUI-R1's).
_POINT_KEYS = ("point", "coordinate", "coordinates", "coords", "position", "location", "start_box",
               "bbox", "bbox_2d", "box")
_ARG_KEYS = {
    "text": ("text", "content", "input_text", "value"),
    "app": ("app", "app_name", "application", "text", "input_text", "value"),
    "direction": ("direction", "input_text", "value"),
    "status": ("status", "goal_status", "input_text", "value"),
}
_NAME_KEYS = ("action", "action_type", "function", "name")
_WRAPPER_KEYS = ("arguments", "args", "params", "parameters")  # {"name": "mobile_use", "arguments": {...}}

_NUM_RE = re.compile(r"(?<![\w.])[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", re.ASCII)
_FENCE_RE = re.compile(r"```[A-Za-z0-9_-]*")
_TRAILING_COMMA_RE = re.compile(r",\s*([}\]])")
_CALL_RE = re.compile(r"(?<!\w)([A-Za-z_]\w*)\s*\(")  # (?<!\w): linear on long words
_KWARG_RE = re.compile(r"""(?<!\w)(\w+)\s*[=:]\s*("[^"]*"|'[^']*'|\[[^\]]*\]|\([^)]*\)|[^,]+)""")
_MAX_LITERAL = 10_000  # an action is short; longer candidates are not handed to ast/json


# -- writing -----------------------------------------------------------------------------------------
def format_action(action: dict) -> str:
    """An action as the one-line JSON a policy writes in its ``<answer>`` block (the reference
    completions of SFT warm starts, the history shown in prompts): the normalised action with its
    point rounded to whole numbers, ``{"action": "click", "point": [43, 120]}``. Raises ValueError
    for an action :func:`normalize_action` cannot read (a programming error, not model output)."""
    norm = normalize_action(action)
    if norm is None:
        raise ValueError(f"format_action: not an action of the action space: {action!r}")
    if "point" in norm:
        norm = {**norm, "point": [int(round(v)) for v in norm["point"]]}
    return json.dumps(norm, ensure_ascii=False)


def history_text(actions: Sequence[str], limit: int) -> str:
    """The last ``limit`` earlier actions of an episode (as written, oldest first) numbered by
    their step, for a prompt: ``"Step 1: {...}; Step 2: {...}"``; "none" when there are none
    (or ``limit`` is 0). Steps are numbered from the episode's start, so a model sees how many
    actions it has taken even when older ones are cut."""
    if limit <= 0 or not actions:
        return "none"
    start = max(0, len(actions) - limit)
    return "; ".join(f"Step {i + 1}: {a}" for i, a in enumerate(actions[start:], start=start))


# -- parsing -----------------------------------------------------------------------------------------
def parse_action(text) -> Optional[dict]:
    """The action in ``text``'s ``<answer>`` block, normalised (see :func:`read_action`); None when
    there is no answer block or no readable action in it. As :func:`mmrl.measures.boxes.answer_box`,
    only the answer block counts: an action merely mentioned in the reasoning is not the answer."""
    answer = extract_answer(text)
    return None if answer is None else read_action(answer)


def read_action(answer) -> Optional[dict]:
    """A normalised action from answer text, or None.

    Reads a JSON object (double or single quotes, trailing commas, inside code fences or text, a
    one-element list of it, Qwen's ``{"name": ..., "arguments": {...}}`` wrapper), a function call
    (``click(x=10, y=20)``, ``click(10, 20)``, ``type(text="hello")``, ``scroll("down")``) or a bare
    argument-free action name (``navigate_back``). See :func:`normalize_action` for the result.
    """
    try:
        if not isinstance(answer, str):
            return None
        text = _FENCE_RE.sub(" ", answer).strip()
        for candidate in _literal_candidates(text):
            action = normalize_action(_literal(candidate))
            if action is not None:
                return action
        action = _read_call(text)
        if action is not None:
            return action
        return _build(text.strip(" \t\n.;:`'\"()"), {}, ())
    except Exception:  # RecursionError/MemoryError from pathological nesting: unreadable, not a crash
        return None


def normalize_action(obj) -> Optional[dict]:
    """``{"action": <one of ACTION_TYPES>, <its argument keys only>}`` from a parsed dict (or a
    one-element list of one), or None when the name is unknown or a required argument is missing
    or invalid.

    Names are case-insensitive with aliases (``tap`` -> click, ``swipe`` -> scroll, ``back`` ->
    navigate_back, ``finish``/``done``/``stop`` -> terminate, ...). Points come from ``point``,
    ``coordinate``, ``x``/``y`` or a box (its centre) and are ``[x, y]`` floats, finite; ``text``
    and ``app`` are non-blank strings; ``direction`` is up/down/left/right; ``status`` is
    success/failure (``terminate`` without one is None). Other keys are dropped. Idempotent.
    """
    try:
        if isinstance(obj, (list, tuple)):
            if len(obj) != 1:
                return None
            obj = obj[0]
        if not isinstance(obj, dict):
            return None
        d = _lower_keys(obj)
        for key in _WRAPPER_KEYS:
            if isinstance(d.get(key), dict):
                d = {**d, **_lower_keys(d[key])}
                break
        for key in _NAME_KEYS:
            if isinstance(d.get(key), str) and _key(d[key]) in _ALIASES:
                return _build(d[key], d, ())
        return None
    except Exception:
        return None


def _lower_keys(d: dict) -> dict:
    return {str(k).strip().lower(): v for k, v in d.items()}


def _key(name: str) -> str:
    return re.sub(r"[\s-]+", "_", name.strip().lower())


def _literal_candidates(text: str):
    yield text
    for open_, close in (("{", "}"), ("[", "]")):
        start, end = text.find(open_), text.rfind(close)
        if 0 <= start < end:
            yield text[start : end + 1]


def _literal(text: str) -> Any:
    """A JSON or Python literal (single quotes, trailing commas), or None."""
    if len(text) > _MAX_LITERAL or text[:1] not in ("{", "["):
        return None
    for attempt in (text, _TRAILING_COMMA_RE.sub(r"\1", text)):
        try:
            return json.loads(attempt)
        except Exception:
            pass
    return python_literal(text)


def _read_call(text: str) -> Optional[dict]:
    """The first ``name(...)`` whose name is an action: arguments read as Python literals, else by a
    forgiving ``key=value`` / comma split (unquoted text, unbalanced quotes)."""
    for m in _CALL_RE.finditer(text):
        if _key(m.group(1)) not in _ALIASES:
            continue
        inner = _closing(text, m.end())
        if inner is None:
            return None
        args, kwargs = _call_arguments(inner)
        return _build(m.group(1), kwargs, args)
    return None


def _closing(text: str, start: int) -> Optional[str]:
    """The text from ``start`` to the parenthesis closing the one just before it (quotes respected;
    with an unmatched quote, as in ``type(text=it's)``, up to the last parenthesis)."""
    depth, quote = 1, None
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    end = text.rfind(")")
    return text[start:end] if quote is not None and end >= start else None


def _call_arguments(inner: str) -> tuple[list, dict]:
    if len(inner) <= _MAX_LITERAL:
        try:
            call = python_expression(f"f({inner})").body  # None (not a call): AttributeError, read below
            args = [ast.literal_eval(a) for a in call.args]
            kwargs = {k.arg.lower(): ast.literal_eval(k.value) for k in call.keywords if k.arg is not None}
            return args, kwargs
        except Exception:
            pass
    kwargs = {k.lower(): v.strip().strip("\"'") for k, v in _KWARG_RE.findall(inner)}
    if kwargs:
        return [], kwargs
    return [p.strip().strip("\"'") for p in inner.split(",") if p.strip()], {}


def _build(name: str, d: dict, positional: Sequence) -> Optional[dict]:
    action = _ALIASES.get(_key(name)) if isinstance(name, str) else None
    if action is None:
        return None
    if action in POINT_ACTIONS:
        point = _point_argument(d, positional)
        return None if point is None else {"action": action, "point": point}
    arg = TEXT_ACTIONS.get(action) or {"scroll": "direction", "terminate": "status"}.get(action)
    if arg is None:
        return {"action": action}
    value = next((d[k] for k in _ARG_KEYS[arg] if k in d), positional[0] if len(positional) == 1 else None)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and arg in ("text", "app"):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        return None
    if arg == "direction":
        value = value.strip().lower()
        if value not in DIRECTIONS:
            return None
    elif arg == "status":
        value = _STATUS_ALIASES.get(value.strip().lower())
        if value is None:
            return None
    return {"action": action, arg: value}


def _point_argument(d: dict, positional: Sequence) -> Optional[list]:
    for key in _POINT_KEYS:
        if key in d:
            return _as_point(d[key])
    if "x" in d or "y" in d:
        return _as_point([d.get("x"), d.get("y")])
    if len(positional) == 1:
        return _as_point(positional[0])
    return _as_point(list(positional)) if positional else None


def _as_point(value) -> Optional[list]:
    """``[x, y]`` from a pair, a box (its centre), corner pairs, ``{"x":, "y":}`` or a string of
    2 or 4 numbers; None otherwise."""
    if isinstance(value, dict):
        value = _lower_keys(value)
        value = [value.get("x"), value.get("y")]
    if isinstance(value, str):
        value = _NUM_RE.findall(value)
    if not isinstance(value, (list, tuple)):
        return None
    flat = []
    for v in value:
        flat.extend(v if isinstance(v, (list, tuple)) else [v])
    numbers = [finite_number(v) for v in flat]
    if any(n is None for n in numbers) or len(numbers) not in (2, 4):
        return None
    if len(numbers) == 4:
        numbers = [(numbers[0] + numbers[2]) / 2, (numbers[1] + numbers[3]) / 2]
    return numbers if all(math.isfinite(n) for n in numbers) else None


def finite_number(value) -> Optional[float]:
    """``value`` (a number or numeric text) as a finite float; None for anything else (bools too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        x = float(value.strip() if isinstance(value, str) else value)
    except (ValueError, OverflowError):
        return None
    return x if math.isfinite(x) else None


# -- the label and the predicted point -----------------------------------------------------------------
def truth_action(ex) -> Optional[dict]:
    """The example's action ``ex["action"]`` (a dict, or answer text), normalised; None if absent
    or unreadable. Its point and ``"bbox"`` are original-image pixels."""
    raw = ex.get("action") if isinstance(ex, dict) else None
    return read_action(raw) if isinstance(raw, str) else normalize_action(raw)


def truth_bbox(ex: dict) -> Optional[list]:
    """The labelled element's box ``ex["action"]["bbox"]`` (x1, y1, x2, y2, original pixels), or None."""
    box = ex["action"].get("bbox") if isinstance(ex.get("action"), dict) else None
    if not isinstance(box, (list, tuple)) or len(box) != 4:
        return None
    numbers = [finite_number(v) for v in box]
    return None if any(n is None for n in numbers) else numbers


def pixel_point(pred: dict, ex: dict) -> Optional[tuple[float, float]]:
    """A predicted action's point as original-image pixels (from the policy's space, see the module
    docstring); None when it has none or it cannot be converted (e.g. a resized-space example whose
    frame has no resized size)."""
    try:
        x, y = prediction_to_pixels(pred["point"], ex)
    except Exception:
        return None
    return (x, y) if math.isfinite(x) and math.isfinite(y) else None
