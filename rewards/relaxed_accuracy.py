"""``relaxed_accuracy``: ChartQA's metric, exact answers with a 5% tolerance on numbers.

From "ChartQA: A Benchmark for Question Answering about Charts with Visual and Logical Reasoning"
(Masry et al., Findings of ACL 2022), following Methani et al. (PlotQA): a numeric answer is right
when its relative error to the truth is at most 5% (values read off a chart are approximate),
any other answer must match exactly. Here "exactly" is up to case, whitespace and a final period
(:func:`mmrl.rewards._parsing.normalize`), so "Yes." matches "yes".
"""

from __future__ import annotations

import re
from typing import Optional

from mmrl import register_reward
from mmrl.rewards._parsing import extract_answer, normalize, parse_exact_number

MAX_RELATIVE_ERROR = 0.05
# "1,234" and "1,234.5": thousands separators as charts print them.
_THOUSANDS_RE = re.compile(r"^\s*[-+]?\d{1,3}(?:,\d{3})+(?:\.\d*)?\s*\.?\s*$", re.ASCII)


def to_number(text: str) -> Optional[float]:
    """The value of ``text`` if it is nothing but one number, else None: "7", "7.0", " 7. ",
    "seven", "1,234", and percentages as fractions like ChartQA's evaluation ("50%" -> 0.5)."""
    if not isinstance(text, str):
        return None
    s = text.strip()
    scale = 1.0
    if s.endswith("%"):
        s, scale = s[:-1], 0.01
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    value = parse_exact_number(s)
    return None if value is None else value * scale


def relaxed_correct(pred: str, truth, max_relative_error: float = MAX_RELATIVE_ERROR) -> float:
    """1.0 or 0.0. When both are numbers: ``|pred - truth| <= max_relative_error * |truth|``, so a
    truth of 0 needs exactly 0. Otherwise normalised string equality."""
    truth = str(truth)
    t, p = to_number(truth), to_number(pred)
    if t is not None and p is not None:
        return 1.0 if abs(p - t) <= max_relative_error * abs(t) else 0.0
    return 1.0 if normalize(pred) == normalize(truth) else 0.0


@register_reward("relaxed_accuracy")
def relaxed_accuracy(completions, examples, max_relative_error: float = MAX_RELATIVE_ERROR, **ctx) -> list:
    """ChartQA relaxed accuracy of the ``<answer>`` block against ``ex["answer"]``.

    Hand-worked: truth "100": "104" -> 1.0 (4% off), "105" -> 1.0 (exactly 5%), "106" -> 0.0;
    truth "0": "0" and "0.0" -> 1.0, "0.01" -> 0.0; truth "yes": "Yes." -> 1.0, "no" -> 0.0;
    truth "B": " b " -> 1.0. None when there is no answer block (or the example has no answer).
    """
    if len(completions) != len(examples):
        raise ValueError(f"relaxed_accuracy: {len(completions)} completions for {len(examples)} examples")
    out = []
    for c, ex in zip(completions, examples):
        pred = extract_answer(c)
        truth = ex.get("answer") if isinstance(ex, dict) else None
        out.append(None if pred is None or truth is None else relaxed_correct(pred, truth, max_relative_error))
    return out
