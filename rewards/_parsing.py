"""Tolerant parsing of model answers, shared by the reward plugins and the tasks' metrics.

Every function here returns ``None`` (or 0.0 for :func:`box_iou`) instead of raising, whatever
the text: rewards run on raw model output and must never crash a training run.
"""

from __future__ import annotations

import math
import re
from typing import Optional, Sequence

_OPEN, _CLOSE = "<answer>", "</answer>"

# A decimal number not glued to a word or a preceding digit/dot: "x1" or "v2.0" give no number,
# so labels like "x1=10" or "object 2" inside a box answer do not shift the coordinates.
_NUM = r"(?<![\w.])[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_NUM_RE = re.compile(_NUM, re.ASCII)
_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
# ASCII-only matching: under Unicode IGNORECASE "ſix" (long s) would match "six".
_NUMBER_OR_WORD_RE = re.compile(rf"({_NUM})|\b({'|'.join(_WORDS)})\b", re.IGNORECASE | re.ASCII)
_FULL_NUMBER_RE = re.compile(rf"\s*({_NUM})\s*\.?\s*", re.ASCII)

_SEP = r"\s*(?:,\s*)?"
# [x1, y1, x2, y2] or (x1, y1, x2, y2); also found inside JSON such as {"bbox_2d": [...]}.
_BOX4_RE = re.compile(rf"[\[(]\s*({_NUM}){_SEP}({_NUM}){_SEP}({_NUM}){_SEP}({_NUM})\s*[\])]", re.ASCII)
# (x1, y1), (x2, y2) or [x1, y1], [x2, y2]
_PAIRS_RE = re.compile(
    rf"[\[(]\s*({_NUM}){_SEP}({_NUM})\s*[\])]\s*(?:,|-|to|and)?\s*[\[(]\s*({_NUM}){_SEP}({_NUM})\s*[\])]",
    re.ASCII,
)


def extract_answer(text: str) -> Optional[str]:
    """The stripped content of the last ``<answer>...</answer>`` block, or None if there is none."""
    if not isinstance(text, str):
        return None
    end = text.rfind(_CLOSE)
    if end < 0:
        return None
    start = text.rfind(_OPEN, 0, end)
    if start < 0:
        return None
    return text[start + len(_OPEN) : end].strip()


def _finite(value: str) -> Optional[float]:
    try:
        x = float(value)
    except (ValueError, OverflowError):
        return None
    return x if math.isfinite(x) else None


def parse_number(text: str) -> Optional[float]:
    """The first number in ``text`` ("3", "-2.5", "3 circles", "three"), or None.

    The first one wins so that "3 circles, not 4" reads as 3; number words cover zero..ten.
    """
    if not isinstance(text, str):
        return None
    m = _NUMBER_OR_WORD_RE.search(text)
    if m is None:
        return None
    if m.group(1) is not None:
        return _finite(m.group(1))
    word = m.group(2).lower()
    return float(_WORDS.index(word)) if word in _WORDS else None


def parse_exact_number(text: str) -> Optional[float]:
    """A number only if ``text`` is nothing but one (an optional trailing "." allowed), or None.

    Used for ground truths, where "1 red" must stay a string and not compare equal to "1 blue".
    """
    if not isinstance(text, str):
        return None
    m = _FULL_NUMBER_RE.fullmatch(text)
    if m is not None:
        return _finite(m.group(1))
    word = text.strip().rstrip(".").strip().lower()
    return float(_WORDS.index(word)) if word in _WORDS else None


def parse_box(text: str) -> Optional[tuple[float, float, float, float]]:
    """A box ``(x1, y1, x2, y2)`` from common answer styles, corners ordered, or None.

    Accepts ``[x1, y1, x2, y2]``, ``(x1, y1), (x2, y2)``, JSON such as ``{"bbox_2d": [...]}`` or
    ``[{"bbox_2d": [...], "label": ...}]`` (the first box wins), inside code fences or not, and
    as a last resort text with exactly four numbers. Non-finite coordinates give None.
    """
    if not isinstance(text, str):
        return None
    m = _BOX4_RE.search(text) or _PAIRS_RE.search(text)
    if m is not None:
        values = [_finite(g) for g in m.groups()]
    else:
        numbers = _NUM_RE.findall(text)
        if len(numbers) != 4:
            return None
        values = [_finite(n) for n in numbers]
    if any(v is None for v in values):
        return None
    x1, y1, x2, y2 = values
    return (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two ``(x1, y1, x2, y2)`` boxes; 0.0 when the union is empty."""
    try:
        ax1, ay1, ax2, ay2 = (float(v) for v in a)
        bx1, by1, bx2, by2 = (float(v) for v in b)
    except (TypeError, ValueError):
        return 0.0
    ax1, ax2 = sorted((ax1, ax2))
    ay1, ay2 = sorted((ay1, ay2))
    bx1, bx2 = sorted((bx1, bx2))
    by1, by2 = sorted((by1, by2))
    iw = max(0.0, min(ax2, bx2) - max(ax1, bx1))
    ih = max(0.0, min(ay2, by2) - max(ay1, by1))
    inter = iw * ih
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    if not (union > 0) or not math.isfinite(union):
        return 0.0
    iou = inter / union
    return min(1.0, max(0.0, iou)) if math.isfinite(iou) else 0.0


def normalize(text: str) -> str:
    """Case-, whitespace- and final-period-insensitive form for string answers."""
    return " ".join(text.casefold().split()).rstrip(".").strip()


def answer_correct(pred: str, truth) -> float:
    """1.0 if ``pred`` (an extracted answer) matches ``truth``, else 0.0.

    A numeric truth (the whole string is a number) is compared as a number with the first number
    in the prediction, so "2", "2.0", "two" and "2 circles" all match "2"; other truths compare as
    normalised strings.
    """
    truth = str(truth)
    b = parse_exact_number(truth)
    if b is not None:
        a = parse_number(pred)
        if a is not None:
            return 1.0 if abs(a - b) <= 1e-6 * max(1.0, abs(b)) else 0.0
    return 1.0 if normalize(pred) == normalize(truth) else 0.0
