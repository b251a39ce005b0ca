"""``equality``: is the completion's answer exactly the example's ``answer``?

The "equality accuracy reward" of CLS-RL / No-Thinking-RL ("Think or Not Think: A Study of Explicit
Thinking in Rule-Based Visual Reinforcement Fine-Tuning"): the model answers directly, with no
reasoning block, and only an exact answer scores.
"""

from __future__ import annotations

import re

from mmrl import register_reward
from mmrl.rewards.format import _NO_TAG

# The whole stripped completion is one answer block with no think/answer tag inside it.
_ONE_ANSWER_RE = re.compile(rf"<answer>({_NO_TAG})</answer>", re.DOTALL)


def _canonical(text: str) -> str:
    """Stripped, internal whitespace collapsed to one space, case-folded."""
    return " ".join(text.split()).casefold()


def answer_text(completion: str) -> str:
    """The content of the answer block when the stripped completion is exactly one such block,
    else the whole stripped completion (so "2" answers directly, "I think 2" does not equal "2")."""
    stripped = completion.strip()
    m = _ONE_ANSWER_RE.fullmatch(stripped)
    return m.group(1) if m is not None else stripped


@register_reward("equality")
def equality(completions, examples, **ctx) -> list[float]:
    """1.0 iff the answer text equals ``ex["answer"]`` up to case and whitespace, else 0.0.

    Stricter than ``accuracy`` on purpose: no numeric tolerance ("2.0", "two" and "2 circles" do
    not equal "2") and no extra text around the answer, not even a think block, so the policy is
    pushed to answer directly. Never None and never raises on any text or example (a non-str
    completion or an example without an answer scores 0.0); only a batch length mismatch, a
    caller bug, raises like the other rewards.
    """
    if len(completions) != len(examples):
        raise ValueError(f"equality: {len(completions)} completions for {len(examples)} examples")
    out = []
    for c, ex in zip(completions, examples):
        truth = ex.get("answer") if isinstance(ex, dict) else None
        if not isinstance(c, str) or truth is None:
            out.append(0.0)
            continue
        out.append(1.0 if _canonical(answer_text(c)) == _canonical(str(truth)) else 0.0)
    return out
