"""ChartQA's relaxed accuracy: exact answers with a 5% tolerance on numbers.

From "ChartQA: A Benchmark for Question Answering about Charts with Visual and Logical Reasoning"
(Masry et al., Findings of ACL 2022), following Methani et al. (PlotQA): a numeric answer is right
when its relative error to the truth is at most 5% (values read off a chart are approximate),
any other answer must match exactly. Here "exactly" is up to case, whitespace and a final period
(:func:`mmrl.parsing.normalize`), so "Yes." matches "yes". Used by the ``relaxed_accuracy``
reward and the ``chart_qa`` task's metrics.
"""

from __future__ import annotations

import re
from typing import Optional

from mmrl.parsing import normalize, parse_exact_number

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
