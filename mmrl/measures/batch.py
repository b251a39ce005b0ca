"""A reward's batch: one completion per example, scored pair by pair.

Every registered reward is called as ``fn(completions, examples, **options)`` (the options it
names, and :data:`mmrl.registry.REWARD_CONTEXT` only where it names that) and returns one score per
completion. Two lists of different lengths are a caller bug (never model output), so each reward
refuses them with the same message, ``"<reward>: 2 completions for 1 examples"``; most rewards then
score each (completion, example) pair on its own. :func:`check_batch` and :func:`score_each` are
that check and that loop, written once for the built-in rewards and for plugins.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence


def check_batch(name: str, completions: Sequence, examples: Sequence, items: str = "completions") -> None:
    """ValueError ``"<name>: <n> <items> for <m> examples"`` unless there is one completion per
    example; ``items`` names what the completions are ("images", "clips") in the message."""
    if len(completions) != len(examples):
        raise ValueError(f"{name}: {len(completions)} {items} for {len(examples)} examples")


def score_each(name: str, completions: Sequence, examples: Sequence, score: Callable[[Any, Any], Any],
               items: str = "completions") -> list:
    """``[score(completion, example) ...]`` over the pairs, after :func:`check_batch`."""
    check_batch(name, completions, examples, items)
    return [score(c, ex) for c, ex in zip(completions, examples)]
