"""``format``: does the completion follow the ``<think>...</think><answer>...</answer>`` layout
(or, for No-Thinking tasks, the bare ``<answer>...</answer>`` one)?"""

from __future__ import annotations

from mmrl import register_reward
from mmrl.parsing import LAYOUT_MODES as MODES
from mmrl.parsing import follows_layout


@register_reward("format")
def format_reward(completions, examples, mode: str = "strict") -> list[float]:
    """1.0 for a well-formed completion, else 0.0; never None (there is nothing to parse).

    strict: the whole stripped completion is one think block, optional whitespace, one answer
    block. lenient: an answer block exists anywhere (for models that skip the reasoning).
    answer_only: the whole stripped completion is one answer block and nothing else, no think
    block (the No-Thinking / CLS-RL layout, where reasoning text is not wanted at all).
    """
    if mode not in MODES:
        raise ValueError(f"format reward: unknown mode {mode!r}; valid modes: {MODES}")
    return [1.0 if follows_layout(c, mode) else 0.0 for c in completions]
