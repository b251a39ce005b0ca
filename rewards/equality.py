"""``equality``: is the completion's answer exactly the example's ``answer``?

The "equality accuracy reward" of CLS-RL / No-Thinking-RL ("Think or Not Think: A Study of Explicit
Thinking in Rule-Based Visual Reinforcement Fine-Tuning"): the model answers directly, with no
reasoning block, and only an exact answer scores.
"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.measures.answers import equality_score
from mmrl.measures.batch import score_each


@register_reward("equality")
def equality(completions, examples) -> list[float]:
    """1.0 iff the answer text equals ``ex["answer"]`` up to case and whitespace, else 0.0.

    Stricter than ``accuracy`` on purpose: no numeric tolerance ("2.0", "two" and "2 circles" do
    not equal "2") and no extra text around the answer, not even a think block, so the policy is
    pushed to answer directly. Never None and never raises on any text or example (a non-str
    completion or an example without an answer scores 0.0); only a batch length mismatch, a
    caller bug, raises like the other rewards.
    """
    return score_each("equality", completions, examples,
                      lambda c, ex: equality_score(c, ex.get("answer") if isinstance(ex, dict) else None))
