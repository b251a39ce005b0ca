"""``format``: does the completion follow the ``<think>...</think><answer>...</answer>`` layout
(or, for No-Thinking tasks, the bare ``<answer>...</answer>`` one)?"""

from __future__ import annotations

import re

from mmrl import register_reward
from mmrl.parsing import NO_TAG as _NO_TAG  # block contents: no think/answer tag inside
_STRICT_RE = re.compile(rf"<think>{_NO_TAG}</think>\s*<answer>{_NO_TAG}</answer>", re.DOTALL)
_LENIENT_RE = re.compile(r"<answer>.*?</answer>", re.DOTALL)
_ANSWER_ONLY_RE = re.compile(rf"<answer>{_NO_TAG}</answer>", re.DOTALL)
MODES = ("strict", "lenient", "answer_only")


@register_reward("format")
def format_reward(completions, examples, mode: str = "strict", **ctx) -> list[float]:
    """1.0 for a well-formed completion, else 0.0; never None (there is nothing to parse).

    strict: the whole stripped completion is one think block, optional whitespace, one answer
    block. lenient: an answer block exists anywhere (for models that skip the reasoning).
    answer_only: the whole stripped completion is one answer block and nothing else, no think
    block (the No-Thinking / CLS-RL layout, where reasoning text is not wanted at all).
    """
    if mode not in MODES:
        raise ValueError(f"format reward: unknown mode {mode!r}; valid modes: {MODES}")
    if mode == "strict":
        return [1.0 if isinstance(c, str) and _STRICT_RE.fullmatch(c.strip()) else 0.0 for c in completions]
    if mode == "answer_only":
        return [1.0 if isinstance(c, str) and _ANSWER_ONLY_RE.fullmatch(c.strip()) else 0.0 for c in completions]
    return [1.0 if isinstance(c, str) and _LENIENT_RE.search(c) else 0.0 for c in completions]
