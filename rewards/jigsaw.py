"""``jigsaw_position``: partial credit for a jigsaw answer, the fraction of tiles placed right.

The ``jigsaw`` task (``tasks/ssl.py``, after "SSL4RL: Revisiting Self-supervised Learning as
Intrinsic Reward for Visual-Language Reasoning") shows an image whose tiles are shuffled and asks,
for each tile in reading order, the place it came from: "2 0 3 1".
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

from mmrl import register_reward
from mmrl.rewards._parsing import extract_answer

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


def _truth(ex) -> Optional[tuple[int, ...]]:
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


@register_reward("jigsaw_position")
def jigsaw_position(completions, examples, require_permutation: bool = False, **ctx) -> list:
    """Fraction of tiles whose predicted place equals the true one, from the ``<answer>`` block.

    ``score = #{p : pred[p] == truth[p]} / n`` over the n places, so "2 0 3 1" against truth
    "2 0 3 1" is 1.0, "2 0 1 3" is 0.5 and "0 1 2 3" is 0.0. None when there is no answer block,
    the answer does not hold exactly n numbers, or the example has no truth. A constant guess
    ("0 0 0 0") scores 1/n, the same as a random permutation in expectation;
    ``require_permutation=True`` scores answers that are not a permutation of 0..n-1 at 0.0.
    Never raises on any text; a batch length mismatch (a caller bug) does.
    """
    if len(completions) != len(examples):
        raise ValueError(f"jigsaw_position: {len(completions)} completions for {len(examples)} examples")
    out: list = []
    for c, ex in zip(completions, examples):
        truth = _truth(ex)
        text = extract_answer(c)
        pred = parse_positions(text, len(truth)) if truth is not None and text is not None else None
        if pred is None:
            out.append(None)
        elif require_permutation and sorted(pred) != list(range(len(truth))):
            out.append(0.0)
        else:
            out.append(sum(1 for a, b in zip(pred, truth) if a == b) / len(truth))
    return out
