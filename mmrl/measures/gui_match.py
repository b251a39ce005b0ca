"""How a predicted GUI action is scored against the example's: the action type, then its
arguments (a click in the element's box or near the labelled point, typed text by token F1, the
scroll direction, the terminate status).

The action space and the tolerant reader are :mod:`mmrl.measures.gui`; these checks are mmrl's
stricter reading of UI-R1's and GUI-R1's (:mod:`mmrl.measures.ui_r1`, :mod:`mmrl.measures.gui_r1`
are the papers' own). Shared by the GUI rewards (``rewards/gui.py``) and the ``gui_actions`` task's
metrics, so a gallery marks an action right exactly when the reward did.
"""

from __future__ import annotations

import math
import string
import unicodedata
from collections import Counter

from mmrl.measures.gui import (
    POINT_ACTIONS,
    TEXT_ACTIONS,
    finite_number,
    normalize_action,
    pixel_point,
    truth_action,
    truth_bbox,
)
from mmrl.measures.screen import point_in_box, screen_size

CLICK_TOLERANCE = 0.14  # AndroidControl's "within 14% of the screen" (GUI-R1: 140 on a 0-1000 scale)
TEXT_F1_THRESHOLD = 0.5  # GUI-R1 / UI-R1: a typed text or app name counts from F1 0.5 up


# -- scoring -----------------------------------------------------------------------------------------
def _tokens(text) -> list[str]:
    if not isinstance(text, str):
        return []
    kept = "".join(ch for ch in text if ch not in string.punctuation and not unicodedata.category(ch).startswith("P"))
    return kept.lower().split()


def text_f1(pred, truth) -> float:
    """Token F1 of ``pred`` against ``truth`` as SQuAD's (multiset overlap, P = overlap / #pred,
    R = overlap / #truth), after lower-casing and removing punctuation; articles are kept (typed
    text is literal). 1.0 when both are empty, 0.0 when one is. Non-strings count as empty.

    >>> round(text_f1("turn on wifi", "turn wifi on now"), 4)  # P 3/3, R 3/4
    0.8571
    """
    p, t = _tokens(pred), _tokens(truth)
    if not p or not t:
        return 1.0 if not p and not t else 0.0
    overlap = sum((Counter(p) & Counter(t)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(p), overlap / len(t)
    return 2 * precision * recall / (precision + recall)


def click_correct(pred: dict, ex: dict) -> bool:
    """A predicted click/long-press is right when its pixel point lies in the target element's box
    ``ex["action"]["bbox"]`` (edges included); without a box, when it is within
    ``ex.get("click_tolerance", 0.14)`` of the labelled point, distance measured with x as a
    fraction of the screen width and y of its height (AndroidControl's 14%-of-the-screen rule);
    the screen is ``ex["image_size"]`` (w, h), else ``ex["frame"]``'s original size."""
    point = pixel_point(pred, ex)
    if point is None:
        return False
    box = truth_bbox(ex)
    if box is not None:
        return point_in_box(point, box)
    truth, size = truth_action(ex), screen_size(ex)
    tolerance = finite_number(ex.get("click_tolerance", CLICK_TOLERANCE))
    if truth is None or "point" not in truth or size is None or tolerance is None:
        return False
    dx, dy = (point[0] - truth["point"][0]) / size[0], (point[1] - truth["point"][1]) / size[1]
    return math.hypot(dx, dy) <= tolerance


def action_match(pred, ex) -> dict[str, float]:
    """How a predicted action compares with ``ex["action"]``: ``type`` 1.0 when the action types
    are equal; ``args`` 1.0 when, types equal, the arguments are right too (click/long_press:
    :func:`click_correct`; type/open_app: :func:`text_f1` >= 0.5; scroll: same direction;
    terminate: same status; the argument-free actions: always), else 0.0. For a type/open_app
    label also ``text_f1`` (0.0 when the types differ). All zero when either action is unreadable.
    """
    truth = truth_action(ex)
    pred = normalize_action(pred)
    out = {"type": 0.0, "args": 0.0}
    if truth is not None and truth["action"] in TEXT_ACTIONS:
        out["text_f1"] = 0.0
    if truth is None or pred is None or pred["action"] != truth["action"]:
        return out
    out["type"] = 1.0
    action = truth["action"]
    if action in POINT_ACTIONS:
        right = click_correct(pred, ex)
    elif action in TEXT_ACTIONS:
        arg = TEXT_ACTIONS[action]
        out["text_f1"] = text_f1(pred[arg], truth[arg])
        right = out["text_f1"] >= TEXT_F1_THRESHOLD
    else:
        right = all(pred.get(k) == v for k, v in truth.items())
    out["args"] = 1.0 if right else 0.0
    return out
