"""The rollout-engine interface: :class:`Sampling` settings and the :class:`RolloutEngine` base."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class Sampling:
    """How one rollout samples: the training settings (``rollout.*``) or the eval ones."""

    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    batch_size: int


class RolloutEngine:
    """Generates for a :class:`~mmrl.vlm.policy.VLMPolicy`. ``generate`` returns one dict per
    prompt with ``prompt_ids``, ``completion_ids`` (up to and including the first stop token),
    ``truncated``, ``pixel_values`` and ``image_grid_thw``, and optionally ``logprobs`` (the engine's
    own log-probs of the completion tokens, float32, one per completion id: the policy then
    corrects for the engine/trainer mismatch, or uses them as old log-probs with
    ``rollout.use_engine_logprobs``); ``sync_weights`` is called after every optimizer step (an
    engine that holds its own copy of the weights reloads them there)."""

    def __init__(self, policy):
        self.policy = policy

    def generate(self, prompts: Sequence[list[dict]], sampling: Sampling) -> list[dict]:
        raise NotImplementedError

    def take_timeouts(self) -> int:
        """Samples whose generation was cut by ``rollout.max_time`` since the last call (an
        engine without a time limit: 0)."""
        return 0

    def sync_weights(self) -> None:
        """Nothing to do for an engine that generates from the policy's own module."""

    def completion_length(self, completion: torch.Tensor) -> tuple[int, bool]:
        """Tokens up to and including the first stop token; ``(length, stopped)``. A completion
        without one ran the whole budget."""
        for t, tok in enumerate(completion.tolist()):
            if tok in self.policy.eos_ids:
                return t + 1, True
        return len(completion), False
