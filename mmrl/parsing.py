"""Tolerant parsing of model answers: the answer block, numbers, boxes, points, normalised strings.

Public (a plugin may import it, see :mod:`mmrl.public`): reward plugins and task metrics read
completions the same way through this one module. Every function here returns ``None`` instead
of raising, whatever the text: rewards run on raw model output and must never crash a training
run. Scores computed from the parsed values (IoU, AP50, edit similarity, ...) are in
:mod:`mmrl.measures`.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any, Optional, Sequence

_OPEN, _CLOSE = "<answer>", "</answer>"
# The content of a think or answer block: text holding no think/answer tag, so that
# "<think>a</think>b</think><answer>" or two answer blocks cannot pass as one block.
NO_TAG = r"(?:(?!</?(?:think|answer)>).)*"
# The whole stripped completion is one answer block with no think/answer tag inside it.
_ONE_ANSWER_RE = re.compile(rf"<answer>({NO_TAG})</answer>", re.DOTALL)

# A decimal number not glued to a word or a preceding digit/dot: "x1" or "v2.0" give no number,
# so labels like "x1=10" or "object 2" inside a box answer do not shift the coordinates.
_NUM = r"(?<![\w.])[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_NUM_RE = re.compile(_NUM, re.ASCII)
_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
# ASCII-only matching: under Unicode IGNORECASE "ſix" (long s) would match "six".
_NUMBER_OR_WORD_RE = re.compile(rf"({_NUM})|\b({'|'.join(_WORDS)})\b", re.IGNORECASE | re.ASCII)
# "(?:\.\s*)?", not "\.?\s*": two adjacent runs of \s* made a long run of spaces quadratic
_FULL_NUMBER_RE = re.compile(rf"\s*({_NUM})\s*(?:\.\s*)?", re.ASCII)

_SEP = r"\s*(?:,\s*)?"
# [x1, y1, x2, y2] or (x1, y1, x2, y2); also found inside JSON such as {"bbox_2d": [...]}.
_BOX4_RE = re.compile(rf"[\[(]\s*({_NUM}){_SEP}({_NUM}){_SEP}({_NUM}){_SEP}({_NUM})\s*[\])]", re.ASCII)
# (x1, y1), (x2, y2) or [x1, y1], [x2, y2]
_PAIRS_RE = re.compile(
    rf"[\[(]\s*({_NUM}){_SEP}({_NUM})\s*[\])]\s*(?:,|-|to|and)?\s*[\[(]\s*({_NUM}){_SEP}({_NUM})\s*[\])]",
    re.ASCII,
)

# parse_boxes: the same box styles, with separators written so that a run of whitespace can be
# matched one way only ("\s*(?:,\s*)?" rather than "\s*,?\s*"): the ambiguous form backtracks
# quadratically on long whitespace runs, and a completion may hold thousands.
_BOX4 = rf"[\[(]\s*({_NUM}){_SEP}({_NUM}){_SEP}({_NUM}){_SEP}({_NUM})\s*[\])]"
_PAIRS = (rf"[\[(]\s*({_NUM}){_SEP}({_NUM})\s*[\])]\s*(?:(?:,|-|to|and)\s*)?"
          rf"[\[(]\s*({_NUM}){_SEP}({_NUM})\s*[\])]")
# One scan, left to right, non-overlapping: at each position a 4-number box is tried before a
# corner pair, so "[[1, 2], [3, 4]]" reads as one box and "[[1, 2, 3, 4], [5, 6, 7, 8]]" as two.
_ANY_BOX_RE = re.compile(f"(?:{_BOX4})|(?:{_PAIRS})", re.ASCII)
# parse_point: [x, y] / (x, y); <point>x y</point> (UI-TARS / Molmo style); x=.., y=.. or "x": ..
_POINT2_RE = re.compile(rf"[\[(]\s*({_NUM}){_SEP}({_NUM})\s*[\])]", re.ASCII)
# "(?:[\[(]\s*)?", not "[\[(]?\s*": two runs of \s* around an optional bracket backtrack quadratically.
_POINT_TAG_RE = re.compile(rf"<point>\s*(?:[\[(]\s*)?({_NUM}){_SEP}({_NUM})\s*(?:[\])]\s*)?</point>",
                           re.ASCII | re.IGNORECASE)
_X_RE = re.compile(rf"(?<![\w.])[\"']?x[\"']?\s*[=:]\s*[\"']?({_NUM})", re.ASCII | re.IGNORECASE)
_Y_RE = re.compile(rf"(?<![\w.])[\"']?y[\"']?\s*[=:]\s*[\"']?({_NUM})", re.ASCII | re.IGNORECASE)
_FENCE_RE = re.compile(r"```[A-Za-z0-9_-]*")
_EMPTY_LIST_RE = re.compile(r"\[\s*\]")
_NONE_WORDS = ("none", "no objects", "nothing")

Box = tuple[float, float, float, float]

# Model text read as Python (only by ``ast``: never run) is parsed under this file name: what Python's
# tokenizer warns about it ("invalid escape sequence"; 3.12's "invalid decimal literal" for "[1st, 2nd]")
# is the model's, not the user's, and mmrl.library_noise silences it for this name only, once.
MODEL_TEXT_FILE = "<model text>"


def python_expression(text) -> Optional[ast.Expression]:
    """``text`` parsed as one Python expression, as ``ast.literal_eval`` parses a string (leading
    spaces and tabs dropped), under :data:`MODEL_TEXT_FILE`; None if it is not one."""
    try:
        return ast.parse(text.lstrip(" \t"), MODEL_TEXT_FILE, "eval")
    except (SyntaxError, ValueError, TypeError, AttributeError, MemoryError, RecursionError):
        return None


def python_literal(text) -> Any:
    """``ast.literal_eval(text)``: a Python literal (single quotes, tuples, trailing commas), or None
    (also for the text ``None``) when ``text`` is not one."""
    tree = python_expression(text)
    try:
        return None if tree is None else ast.literal_eval(tree)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


# The R1 layouts a format reward checks (``format``'s modes; GUI-R1's format term).
_LAYOUTS = {
    "strict": re.compile(rf"<think>{NO_TAG}</think>\s*<answer>{NO_TAG}</answer>", re.DOTALL),  # whole text
    "lenient": re.compile(r"<answer>.*?</answer>", re.DOTALL),  # anywhere
    "answer_only": re.compile(rf"<answer>{NO_TAG}</answer>", re.DOTALL),  # whole text
}
LAYOUT_MODES = tuple(_LAYOUTS)


def follows_layout(completion, mode: str = "strict") -> bool:
    """Does ``completion`` follow the R1 answer layout? strict: the whole stripped completion is one
    think block, optional whitespace, one answer block; answer_only: it is one answer block and
    nothing else (No-Thinking); lenient: an answer block exists anywhere. False for non-text."""
    if mode not in _LAYOUTS:
        raise ValueError(f"unknown layout mode {mode!r}; valid modes: {LAYOUT_MODES}")
    if not isinstance(completion, str):
        return False
    if mode == "lenient":
        return _LAYOUTS[mode].search(completion) is not None
    return _LAYOUTS[mode].fullmatch(completion.strip()) is not None


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


def parse_box(text: str, order: bool = True) -> Optional[tuple[float, float, float, float]]:
    """A box ``(x1, y1, x2, y2)`` from common answer styles, corners ordered, or None.

    Accepts ``[x1, y1, x2, y2]``, ``(x1, y1), (x2, y2)``, JSON such as ``{"bbox_2d": [...]}`` or
    ``[{"bbox_2d": [...], "label": ...}]`` (the first box wins), inside code fences or not, and
    as a last resort text with exactly four numbers. Non-finite coordinates give None.
    ``order=False`` keeps the numbers as written: a dataset's label is checked, not mended (an
    inverted box may be another layout, such as ``[x, y, w, h]``).
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
    return (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2)) if order else (x1, y1, x2, y2)


def parse_point(text: str) -> Optional[tuple[float, float]]:
    """A click ``(x, y)`` from common answer styles, or None.

    Accepts ``(x, y)`` / ``[x, y]`` (also inside JSON such as ``{"point": [x, y]}``,
    ``{"coordinate": [x, y]}``, ``{"point_2d": [x, y]}``), ``x=.., y=..`` (or ``"x": .., "y": ..``),
    ``<point>x y</point>`` and, as a last resort, text with exactly two numbers. A box (any form
    :func:`parse_box` reads, e.g. ``[x1, y1, x2, y2]``) gives its centre: a grounding benchmark
    scores a box answer by its centre. The first match wins; non-finite coordinates give None.
    """
    if not isinstance(text, str):
        return None
    m = _BOX4_RE.search(text) or _PAIRS_RE.search(text)
    if m is not None:
        box = _ordered(m.groups())
        return None if box is None else ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
    m = _POINT2_RE.search(text) or _POINT_TAG_RE.search(text)
    if m is not None:
        values = m.groups()
    else:
        mx, my = _X_RE.search(text), _Y_RE.search(text)
        if mx is not None and my is not None:
            values = (mx.group(1), my.group(1))
        else:
            values = _NUM_RE.findall(text)
            if len(values) == 4:
                box = _ordered(values)
                return None if box is None else ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
            if len(values) != 2:
                return None
    x, y = _finite(values[0]), _finite(values[1])
    return None if x is None or y is None else (x, y)


def parse_boxes(text: str) -> Optional[list[Box]]:
    """All boxes ``(x1, y1, x2, y2)`` of an answer, in answer order, corners ordered; ``[]`` for an
    explicit empty answer; None when the text cannot be read as a list of boxes.

    Accepts ``[[x1, y1, x2, y2], ...]``, ``[{"bbox_2d": [...], "label": "..."}, ...]`` (any keys:
    the bracketed numbers are what count), ``(x1, y1), (x2, y2)`` corner pairs, a single box, any of
    them inside code fences, and as a last resort text with exactly four numbers (one box). Empty
    answers are ``[]`` (or "none" / "no objects" / "nothing") with no number in the text. A box
    with a non-finite coordinate makes the whole answer unparsable.
    """
    if not isinstance(text, str):
        return None
    text = _FENCE_RE.sub(" ", text)
    boxes: list[Box] = []
    for m in _ANY_BOX_RE.finditer(text):
        groups = m.groups()
        values = groups[:4] if groups[0] is not None else groups[4:]
        box = _ordered(values)
        if box is None:
            return None
        boxes.append(box)
    if boxes:
        return boxes
    numbers = _NUM_RE.findall(text)
    if len(numbers) == 4:
        box = _ordered(numbers)
        return None if box is None else [box]
    if not numbers:
        if _EMPTY_LIST_RE.search(text) or text.strip().rstrip(".").strip().casefold() in _NONE_WORDS:
            return []
    return None


def _ordered(values: Sequence[str]) -> Optional[Box]:
    try:
        x1, y1, x2, y2 = (float(v) for v in values)
    except (TypeError, ValueError, OverflowError):
        return None
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
        return None
    return (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))


def answer_text(completion: str) -> str:
    """What an answer-only (No-Thinking) completion answers: the content of the answer block when
    the stripped completion is exactly one such block, else the whole stripped completion (so "2"
    answers directly, "I think 2" does not equal "2")."""
    stripped = completion.strip()
    m = _ONE_ANSWER_RE.fullmatch(stripped)
    return m.group(1) if m is not None else stripped


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
