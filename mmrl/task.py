"""The task plugin API: where examples come from, how they are prompted, how they are scored.

A task is written exactly like the built-in ones in ``tasks/``::

    from mmrl import Task, register_task

    @register_task("counting")
    class Counting(Task):
        modality = "vlm"
        rewards = {"format": 0.5, "accuracy": 1.0}   # reward names -> default weights
        def examples(self, split): ...               # a sequence of dicts
        def prompt(self, ex): ...                    # chat messages with images
        def target(self, ex): ...                    # a reference completion (SFT warm start)
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

SYSTEM_FORMAT_HINT = (
    "Think briefly inside <think> </think>, then give the final answer inside <answer> </answer>."
)


class Task:
    """Base class of task plugins. Subclasses set ``rewards`` and implement the methods."""

    name: str = "task"  # set by @register_task
    modality: str = "vlm"
    rewards: dict[str, float] = {}
    # Extra keyword arguments passed to individual rewards, e.g. {"format": {"mode": "lenient"}}.
    reward_kwargs: dict[str, dict[str, Any]] = {}

    def __init__(self, **options: Any):
        unknown = set(options) - set(self.option_names())
        if unknown:
            raise ValueError(
                f"task {self.name!r} has no option(s) {sorted(unknown)}; "
                f"valid options: {sorted(self.option_names())}"
            )
        self.options = {**self.default_options(), **options}

    # -- options --------------------------------------------------------------------------------
    def default_options(self) -> dict[str, Any]:
        """Task-specific options (``task.options.*`` in the config) and their defaults."""
        return {}

    def option_names(self) -> list[str]:
        return list(self.default_options())

    # -- data -----------------------------------------------------------------------------------
    def examples(self, split: str) -> Sequence[dict]:
        """The examples of ``split`` ("train" or "eval"): a sequence supporting len and indexing."""
        raise NotImplementedError(f"task {self.name!r} must implement examples(split)")

    def prompt(self, ex: dict) -> list[dict]:
        """Chat messages for one example; images go in as ``{"type": "image", "image": PIL}``."""
        raise NotImplementedError(f"task {self.name!r} must implement prompt(ex)")

    def target(self, ex: dict) -> str:
        """A reference completion for ``ex`` (used by the SFT warm start)."""
        raise NotImplementedError(f"task {self.name!r} has no reference completions")

    # -- evaluation -----------------------------------------------------------------------------
    def metrics(self, completions: Sequence[str], examples: Sequence[dict]) -> dict[str, float]:
        """Task metrics on a batch (e.g. accuracy); defaults to none beyond the rewards."""
        return {}

    def visualize(self, ex: dict, completion: str):
        """An image to save with a logged rollout (e.g. with boxes drawn); None for none."""
        return None


class SyntheticExamples(Sequence):
    """A lazily generated, deterministic sequence of examples: item i is ``make(seed, i)``.

    Train and eval splits use disjoint seeds so held-out examples are never trained on.
    """

    def __init__(self, make: Callable[[int], dict], size: int, seed: int):
        self._make = make
        self._size = size
        self._seed = seed

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._size))]
        if not -self._size <= i < self._size:
            raise IndexError(i)
        i %= self._size
        return self._make(self._seed * 1_000_003 + i)


def image_prompt(image, text: str) -> list[dict]:
    """The common single-image user turn."""
    return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]}]
