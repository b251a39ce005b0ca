"""Time segments: reading a ``[start, end]`` segment (seconds) from an answer, and temporal IoU.

The reward of temporal grounding ("find when X happens") in TimeZero ("TimeZero: Temporal Video
Grounding with Reasoning-Guided LVLM"), Temporal-R1 and VideoChat-R1 is the temporal IoU of the
predicted segment with the annotated one (plus format). Used by the ``tiou`` reward and the
``temporal_grounding`` task's metrics.

Conventions (TimeZero's reward, ``iou_timestamp_reward`` in its ``src/open_r1/grpo_video.py``,
scores an unreadable answer 0 and, through its formula, an inverted one too; here both are
*unparsable*, ``None``, which the reward machinery scores as the minimum, 0, and counts):

- an inverted segment (end < start) is not read as its sorted twin: :func:`parse_segment` returns
  None, so the policy is never rewarded for writing the ends the wrong way round;
- TimeZero reads only "X to Y" / "X and Y" and takes the last such pair of the answer block; the
  forms read here are wider (see :func:`parse_segment`) and the first pair wins;
- a zero-length segment (start == end) is a valid segment;
- a non-finite number ("1e999") makes the answer unparsable.

Like :mod:`mmrl.parsing`, nothing here raises on model output.
"""

from __future__ import annotations

import math
import re
from typing import Optional

Segment = tuple[float, float]

# A time: "12.5", ".5", "3e1", or a clock time "1:05", "00:01:05.5" (minutes/hours, read as seconds).
_CLOCK = r"\d{1,2}(?::\d{1,2}){1,2}(?:\.\d+)?"
_PLAIN = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_TIME = rf"(?:{_CLOCK}|{_PLAIN})"
# The first time may not follow a minus sign ("-3 to 5" is not the segment [3, 5]); the second may
# ("3-5"). Neither may follow a word character, a dot or a colon ("v2", "1.2.3"), nor stop inside a
# longer number ("12" of "12.5"); a unit may follow directly ("12.5s").
_END = r"(?!\d|[.:]\d)"
_FIRST = rf"(?<![\w.:-])({_TIME}){_END}"
_SECOND = rf"(?<![\w.:])({_TIME}){_END}"
_UNIT = r"(?:seconds?|secs?|s)\b"
_SEP = r"(?:,|-|\u2013|\u2014|~|\bto\b|\band\b|\buntil\b|\btill\b|\bthrough\b)"
# Written so that a whitespace run can be matched one way only (no quadratic backtracking on the
# long runs a completion may hold): the optional unit owns its leading whitespace.
_PAIR = rf"{_FIRST}(?:\s*{_UNIT})?\s*{_SEP}\s*{_SECOND}"
_BRACKETED_RE = re.compile(rf"[\[(]\s*{_PAIR}(?:\s*{_UNIT})?\s*[\])]", re.ASCII | re.IGNORECASE)
_PAIR_RE = re.compile(_PAIR, re.ASCII | re.IGNORECASE)
# The last resort counts times with their sign, so that "-3 ... 5" is not read as [3, 5].
_SIGNED_TIME_RE = re.compile(rf"(?<![\w.:])-?{_TIME}{_END}", re.ASCII)


def _seconds(token: str) -> Optional[float]:
    """A time token in seconds ("12.5" -> 12.5, "1:05" -> 65.0, "1:00:05" -> 3605.0), None if
    it is not finite."""
    try:
        value = 0.0
        for part in token.split(":"):
            value = value * 60.0 + float(part)
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def as_segment(value) -> Optional[Segment]:
    """``value`` as a valid ``(start, end)`` pair of finite floats with start <= end, or None
    (a ground truth from a data file passes through here before it is compared)."""
    try:
        start, end = (float(v) for v in value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not (math.isfinite(start) and math.isfinite(end)) or end < start:
        return None
    return (start, end)


def parse_segment(text: str) -> Optional[Segment]:
    """A time segment ``(start, end)`` in seconds from an answer, or None.

    Reads, first match winning: a bracketed pair "[12.5, 20.1]" / "(12.5s - 20.1s)"; a pair with
    a separator "12.5 - 20.1", "12.5 to 20.1 seconds", "from 3s until 7s", "3 and 7", "3–7";
    as a last resort text holding exactly two times ("start 3 end 7"). Clock times are read as
    seconds ("1:05 - 1:30" -> (65, 90)). Pass the *answer* (``extract_answer(completion)``), not
    the whole completion: numbers in the reasoning are not an answer.

    None when no segment can be read, when a time is not finite or written with a minus sign
    ("-3 to 5" is not read as [3, 5]), and when the segment is inverted
    (end < start): TimeZero's IoU of an inverted prediction is 0, and it is not read here as its
    sorted twin either. A zero-length segment (start == end) is returned.
    """
    if not isinstance(text, str):
        return None
    m = _BRACKETED_RE.search(text) or _PAIR_RE.search(text)
    if m is not None:
        tokens = m.groups()
    else:
        tokens = _SIGNED_TIME_RE.findall(text)
        if len(tokens) != 2 or any(t.startswith("-") for t in tokens):
            return None
    start, end = (_seconds(t) for t in tokens)
    if start is None or end is None:
        return None
    return as_segment((start, end))


def temporal_iou(pred, true) -> float:
    """Temporal IoU of two ``(start, end)`` segments: ``|pred ∩ true| / |pred ∪ true|`` in [0, 1].

    Hand-worked: [2, 6] vs [4, 10]: intersection [4, 6] = 2, union 4 + 6 - 2 = 8 -> 0.25.
    Disjoint or merely touching segments -> 0.0. An invalid segment (not two finite numbers, or
    end < start) -> 0.0. Zero-length segments: the formula gives 0 whenever one segment has
    length 0 and the other does not (their intersection has length 0), so a zero-length truth is
    matched only by the same point: two zero-length segments score 1.0 when equal, else 0.0.
    """
    a, b = as_segment(pred), as_segment(true)
    if a is None or b is None:
        return 0.0
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = (a[1] - a[0]) + (b[1] - b[0]) - inter
    if not math.isfinite(union):  # e.g. [-1e308, 1e308]: the lengths overflow
        return 0.0
    if union <= 0.0:
        return 1.0 if a == b else 0.0
    iou = inter / union
    return min(1.0, max(0.0, iou)) if math.isfinite(iou) else 0.0
