"""``math_answer``: is the ``<answer>`` block mathematically equal to the example's ``answer``?

Math-Verify (huggingface/Math-Verify, ``from math_verify import parse, verify``; a base dependency)
decides, called as TRL's ``accuracy_reward`` calls it: ``verify(parse(gold), parse(pred))``, both
parsed with ``extraction_mode="first_match"``. mmrl adds seven documented rules (multiple-choice
letters and options, the final-form rule: "3 + 8" does not answer 11, number words, counted things
such as "7 shapes", word answers compared as text, a final period or degree sign, a time bound);
see :mod:`mmrl.measures.math_equivalence` for each, and Math-Verify's own verdict beside it.
"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.measures.batch import score_each
from mmrl.measures.math_equivalence import compare
from mmrl.parsing import extract_answer


@register_reward("math_answer")
def math_answer(completions, examples) -> list:
    """1.0 when the last ``<answer>`` block equals ``ex["answer"]`` mathematically, else 0.0;
    None when there is no answer block or no ground truth. ``ex["options"]`` (a dict of letter
    -> text, or a list read as A, B, ...) lets an option's text answer for its letter and the
    other way round. Never raises on any text or example; only a batch length mismatch (a
    caller bug) raises, like the other rewards."""
    return score_each("math_answer", completions, examples, _score)


def _score(completion, ex):
    pred = extract_answer(completion)
    truth = ex.get("answer") if isinstance(ex, dict) else None
    if pred is None or truth is None:
        return None
    equal, _ = compare(pred, truth, ex.get("options"))
    return 1.0 if equal else 0.0
