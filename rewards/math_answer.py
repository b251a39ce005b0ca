"""``math_answer``: is the ``<answer>`` block mathematically equal to the example's ``answer``?

Equivalence follows Math-Verify (huggingface/Math-Verify, https://github.com/huggingface/Math-Verify:
``from math_verify import parse, verify``), the answer checker of Open-R1 and TRL's math rewards.
Which checker runs here is fixed at import time and recorded in :data:`USES_MATH_VERIFY` /
:data:`CHECKER` (also ``math_answer.uses_math_verify`` / ``math_answer.checker``):

- numbers, fractions, percentages, thousand separators, LaTeX wrappers and multiple-choice
  letters are always settled by the built-in rules of :mod:`mmrl.measures.math_equivalence`
  (fast, no per-call timeouts), whether or not Math-Verify is installed;
- anything else (symbolic expressions, ...) goes to Math-Verify when ``math_verify`` is
  importable, else to the built-in sympy checker (whitelisted input only), else to string
  equality.

See :mod:`mmrl.measures.math_equivalence` for the full rule list (including the percent rule and
the "final form" rule: "3 + 8" does not answer 11).
"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.measures.math_equivalence import CHECKER, MATH_VERIFY_AVAILABLE, compare
from mmrl.parsing import extract_answer

USES_MATH_VERIFY: bool = MATH_VERIFY_AVAILABLE


@register_reward("math_answer")
def math_answer(completions, examples, **ctx) -> list:
    """1.0 when the last ``<answer>`` block equals ``ex["answer"]`` mathematically, else 0.0;
    None when there is no answer block or no ground truth. ``ex["options"]`` (a dict of letter
    -> text, or a list read as A, B, ...) lets an option's text answer for its letter and the
    other way round. Never raises on any text or example; only a batch length mismatch (a
    caller bug) raises, like the other rewards."""
    if len(completions) != len(examples):
        raise ValueError(f"math_answer: {len(completions)} completions for {len(examples)} examples")
    out = []
    for c, ex in zip(completions, examples):
        pred = extract_answer(c)
        truth = ex.get("answer") if isinstance(ex, dict) else None
        if pred is None or truth is None:
            out.append(None)
            continue
        equal, _ = compare(pred, truth, ex.get("options"))
        out.append(1.0 if equal else 0.0)
    return out


math_answer.uses_math_verify = USES_MATH_VERIFY
math_answer.checker = CHECKER
