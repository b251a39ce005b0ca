"""Jigsaw answers: the place each tile came from, read and scored tile by tile.

The ``jigsaw`` task (after "SSL4RL: Revisiting Self-supervised Learning as Intrinsic Reward for
Visual-Language Reasoning") shows an image whose tiles are shuffled and asks, for each tile in
reading order, the place it came from: "2 0 3 1". Used by the ``jigsaw_position`` reward and the
task's metrics and gallery.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

from mmrl.parsing import extract_answer

_INT_RE = re.compile(r"[0-9]+", re.ASCII)
_MAX_DIGITS = 6  # a longer run of digits is no place number (and int() of 5k digits raises)


def _ints(text: str) -> list[int]:
    """The runs of digits in ``text``; a single run as long as the expected count is read digit
    by digit elsewhere. Over-long runs become -1 (never a place), so nothing here can raise."""
    return [int(t) if len(t) <= _MAX_DIGITS else -1 for t in _INT_RE.findall(text)]


def parse_positions(text, n: int) -> Optional[tuple[int, ...]]:
    """``n`` place numbers from an answer, or None when there are not exactly ``n``.

    Accepts "2 0 3 1", "2,0,3,1", "[2, 0, 3, 1]", "2-0-3-1" and, for n > 1, one run of exactly n
    digits ("2031"). Other numbers in the text count ("tile 1: 2, ..." is not four numbers)."""
    if not isinstance(text, str) or n < 1:
        return None
    runs = _INT_RE.findall(text)
    if n > 1 and len(runs) == 1 and len(runs[0]) == n:
        return tuple(int(d) for d in runs[0])
    values = _ints(text)
    return tuple(values) if len(values) == n else None


def true_positions(ex) -> Optional[tuple[int, ...]]:
    """The example's permutation: ``ex["permutation"]`` if it is a sequence of ints, else read
    from ``ex["answer"]`` (its own count of numbers)."""
    if not isinstance(ex, dict):
        return None
    perm = ex.get("permutation")
    if isinstance(perm, Sequence) and not isinstance(perm, str) and perm and all(
        isinstance(v, int) and not isinstance(v, bool) for v in perm
    ):
        return tuple(perm)
    answer = ex.get("answer")
    if not isinstance(answer, str):
        return None
    runs = _INT_RE.findall(answer)
    if len(runs) == 1 and len(runs[0]) > 1 and len(runs[0]) <= 9:
        return tuple(int(d) for d in runs[0])
    values = _ints(answer)
    return tuple(values) if values else None


def tile_score(completion, ex, require_permutation: bool = False) -> Optional[float]:
    """Fraction of tiles whose predicted place (from the ``<answer>`` block) equals the true one:
    ``#{p : pred[p] == truth[p]} / n``; None when there is no answer block, the answer does not
    hold exactly n numbers, or the example has no truth. With ``require_permutation`` an answer
    that is not a permutation of 0..n-1 scores 0.0."""
    truth = true_positions(ex)
    text = extract_answer(completion)
    pred = parse_positions(text, len(truth)) if truth is not None and text is not None else None
    if pred is None:
        return None
    if require_permutation and sorted(pred) != list(range(len(truth))):
        return 0.0
    return sum(1 for a, b in zip(pred, truth) if a == b) / len(truth)
