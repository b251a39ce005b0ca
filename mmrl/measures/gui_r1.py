"""GUI-R1's reward as its code computes it: ``gui_r1`` = 0.8 * accuracy + 0.2 * format.

"GUI-R1: A Generalist R1-Style Vision-Language Action Model For GUI Agents" (Luo et al., 2025),
``verl/utils/reward_score/r1gui.py`` (github.com/ritzz-ai/GUI-R1): ``r1gui_compute_score``. The
policy answers in GUI-R1's own format,
``<answer>[{'action': 'click', 'point': [x, y], 'input_text': 'no input text'}]</answer>``; its
lines, quoted, and so what this does:

- the first ``<answer>(.*?)</answer>`` block (DOTALL), stripped;
- the action: ``r"'action':\\s*'(\\w+)'"`` (single quotes), lower-cased (``Click`` is ``click``,
  ``tap`` is not), "no action" when absent; the text: ``r"'input_text':\\s*'(.*?)'"``, "no input text"
  when absent; the point: ``r'\\{.*\\[(\\d+),\\s*(\\d+)]\\s*.*\\}'``, whole numbers only (a float
  point reads as none, ``[0, 0, 0, 0]``; so does an answer over 4,000 characters, on which the
  pattern's backtracking would take seconds: GUI-R1's answers are one short line);
- accuracy: 0 when the actions differ; ``click``: with a box, ``gt_bbox[0] < x < gt_bbox[2]`` and
  ``gt_bbox[1] < y < gt_bbox[3]`` (strict: a point on an edge misses), with a point,
  ``dx**2 + dy**2 < 140**2``; ``type``, ``select``, ``scroll``: ``calculate_f1_score(pred, gt) >= 0.5``
  (:func:`text_f1`: word *sets*, and two one-word texts match when either contains the other, so
  "hell" types "hello"); any other action: 1.0 (an ``open_app`` is right whatever the app);
- format: the completion fullmatches ``<think>.*?</think>\\s*<answer>.*?</answer>`` and the answer
  evaluates to a list of dicts, each with a str ``action``, a ``point`` of two ints and a str
  ``input_text``, no ``'no input text'`` for type/select/open_app, a direction for scroll. GUI-R1
  calls ``eval``; here ``ast.literal_eval`` (mmrl never runs model text; an answer in GUI-R1's
  format is a literal, so the two agree on it).

The label is mmrl's action dict (``ex["action"]``, :mod:`mmrl.measures.gui`) in GUI-R1's names
(``navigate_back`` is ``press_back``, ``navigate_home`` ``press_home``, ``terminate`` ``complete``
or, with status failure, ``impossible``); its ``input_text`` is the typed text, the scroll direction
or the app. GUI-R1 compares the written point with the label scaled to the image the model saw, so
the label's box or point is taken to the policy's space (:func:`mmrl.media.coords.pixels_to_prediction`:
Qwen2.5-VL's resized pixels, where the 140 is GUI-R1's; 0-1000 for Qwen2-VL/Qwen3-VL).
"""

from __future__ import annotations

import re
from typing import Optional

from mmrl.measures.gui import truth_action, truth_bbox
from mmrl.media.coords import pixels_to_prediction
from mmrl.parsing import python_literal

ACCURACY_WEIGHT, FORMAT_WEIGHT = 0.8, 0.2
CLICK_RADIUS = 140
LABEL_NAMES = {"navigate_back": "press_back", "navigate_home": "press_home"}
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ACTION_RE = re.compile(r"'action':\s*'(\w+)'")
_TEXT_RE = re.compile(r"'input_text':\s*'(.*?)'")
_POINT_RE = re.compile(r"\{.*\[(\d+),\s*(\d+)]\s*.*\}")
_LAYOUT_RE = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
MAX_ANSWER = 4000  # the point pattern backtracks quadratically: a longer answer reads as no point


def _answer(text) -> Optional[str]:
    m = _ANSWER_RE.search(text) if isinstance(text, str) else None
    return m.group(1).strip() if m else None


def gui_r1_fields(text) -> tuple[str, str, list[int]]:
    """GUI-R1's ``extract_action`` (lower-cased), ``extract_input_text`` and ``extract_coord``."""
    answer = _answer(text)
    if answer is None:
        return "no action", "no input text", [0, 0, 0, 0]
    action, typed = _ACTION_RE.search(answer), _TEXT_RE.search(answer)
    point = _POINT_RE.search(answer) if len(answer) <= MAX_ANSWER else None
    return (action.group(1).lower() if action else "no action", typed.group(1) if typed else "no input text",
            [int(point.group(1)), int(point.group(2))] if point else [0, 0, 0, 0])


def text_f1(pred: str, truth: str) -> float:
    """GUI-R1's ``calculate_f1_score``: brackets dropped, lower-cased word sets; two one-word texts
    score 1 when either contains the other; else the F1 of the sets."""
    p = set(pred.replace("[", "").replace("]", "").lower().split())
    t = set(truth.replace("[", "").replace("]", "").lower().split())
    if len(p) == 1 and len(t) == 1:
        (a,), (b,) = p, t
        if a in b or b in a:
            return 1.0
    common = len(p & t)
    precision = common / len(p) if p else 0.0
    recall = common / len(t) if t else 0.0
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def format_reward(text) -> float:
    """GUI-R1's ``r1gui_format_reward`` (module docstring), 1.0 or 0.0."""
    try:
        if not _LAYOUT_RE.fullmatch(text):
            return 0.0
        actions = python_literal(_answer(text))  # ast.literal_eval, as GUI-R1's check
        if not isinstance(actions, list):
            return 0.0
        for a in actions:
            if not isinstance(a, dict) or any(k not in a for k in ("action", "point", "input_text")):
                return 0.0
            if not isinstance(a["action"], str) or not isinstance(a["input_text"], str):
                return 0.0
            if not (isinstance(a["point"][0], int) and isinstance(a["point"][1], int)):
                return 0.0
            if a["action"] in ("type", "select", "open_app") and a["input_text"] == "no input text":
                return 0.0
            if a["action"] == "scroll" and a["input_text"] not in ("left", "right", "up", "down"):
                return 0.0
        return 1.0
    except Exception:
        return 0.0


def label(ex) -> Optional[dict]:
    """The example's action as GUI-R1's ground truth: ``{"action", "gt_bbox", "input_text"}``, the
    box (or else the point) in the policy's space; None without a readable label."""
    truth = truth_action(ex)
    if truth is None:
        return None
    name = truth["action"]
    if name == "terminate":
        name = "complete" if truth["status"] == "success" else "impossible"
    box = truth_bbox(ex) if name in ("click", "long_press") else None
    try:
        where = list(pixels_to_prediction(box if box is not None else truth.get("point", ()), ex))
    except Exception:
        where = []
    text = truth.get("text") or truth.get("direction") or truth.get("app") or "no input text"
    return {"action": LABEL_NAMES.get(name, name), "gt_bbox": where, "input_text": text}


def accuracy_reward(text, gt: dict) -> float:
    """GUI-R1's ``r1gui_accuracy_reward`` against :func:`label`'s ground truth, 1.0 or 0.0."""
    try:
        action, typed, (x, y, *_) = gui_r1_fields(text)
        want, box = gt["action"].lower(), gt["gt_bbox"]
        if action != want:
            return 0.0
        if want == "click":
            if len(box) == 2:
                return 1.0 if (x - box[0]) ** 2 + (y - box[1]) ** 2 < CLICK_RADIUS**2 else 0.0
            if len(box) == 4:
                return 1.0 if box[0] < x < box[2] and box[1] < y < box[3] else 0.0
            return 0.0
        if want in ("type", "select", "scroll"):
            return 1.0 if text_f1(typed, gt["input_text"]) >= 0.5 else 0.0
        return 1.0
    except Exception:
        return 0.0


def gui_r1_score(text, ex) -> Optional[float]:
    """``r1gui_compute_score``'s overall: 0.8 * accuracy + 0.2 * format; None without a label."""
    gt = label(ex)
    if gt is None:
        return None
    return ACCURACY_WEIGHT * accuracy_reward(text, gt) + FORMAT_WEIGHT * format_reward(text)
