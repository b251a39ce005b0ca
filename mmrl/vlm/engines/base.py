"""The rollout-engine interface: :class:`Sampling` settings and the :class:`RolloutEngine` base."""

from __future__ import annotations

import contextlib
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
    # texts that end a sample where they are written (a tool task's ``</tool_call>``), besides the
    # stop tokens; the sample keeps the text and is not truncated
    stop: tuple[str, ...] = ()


class RolloutEngine:
    """Generates for a :class:`~mmrl.vlm.policy.VLMPolicy`. ``generate`` returns one dict per
    prompt with ``prompt_ids``, ``completion_ids`` (up to and including the first stop token),
    ``truncated``, ``pixel_values`` and ``image_grid_thw``, and optionally ``logprobs`` (the engine's
    own log-probs of the completion tokens, float32, one per completion id: the policy then
    corrects for the engine/trainer mismatch, or uses them as old log-probs with
    ``rollout.use_engine_logprobs``); ``sync_weights`` is called after every optimizer step (an
    engine that holds its own copy of the weights reloads them there)."""

    # True: ``generate`` may run in a background thread while the trainer updates (asynchronous
    # training, ``train.async_rollouts``), because the engine generates from its own copy of the
    # weights, which only :meth:`push_weights` changes.
    concurrent = False

    def __init__(self, policy):
        self.policy = policy

    def generate(self, prompts: Sequence[list[dict]], sampling: Sampling) -> list[dict]:
        raise NotImplementedError

    def turn_cache(self):
        """A context in which a generate call may reuse what the last one computed for the same
        tokens (the agent loop's next turn); this default keeps nothing (vLLM's prefix caching is
        its own)."""
        return contextlib.nullcontext()

    def take_timeouts(self) -> int:
        """Samples whose generation was cut by ``rollout.max_time`` since the last call (an
        engine without a time limit: 0)."""
        return 0

    def sync_weights(self) -> None:
        """Nothing to do for an engine that generates from the policy's own module."""

    def push_weights(self) -> None:
        """The policy's current weights into the engine's own copy now (an engine that holds one);
        called from the training thread between optimizer steps, never during a ``generate``."""

    def take_stats(self) -> dict[str, float]:
        """Counters since the last call, logged with the step's metrics (a server engine's retries
        and errors); none by default."""
        return {}

    def completion_length(self, completion: torch.Tensor, stop: Sequence[str] = ()) -> tuple[int, bool]:
        """Tokens up to and including the first stop token, or the token that completes the first
        of the ``stop`` texts written before it; ``(length, stopped)``. A completion without either
        ran the whole budget. (The engines stop there too; what follows is padding, which may be a
        stop token itself, so the text decides.)"""
        ids = completion.tolist()
        length, stopped = len(ids), False
        for t, tok in enumerate(ids):
            if tok in self.policy.eos_ids:
                length, stopped = t + 1, True
                break
        if stop and _has_stop(self.policy.decode(completion[:length]), stop):
            low, high = 1, length  # the shortest prefix whose text holds a stop text (monotone)
            while low < high:
                mid = (low + high) // 2
                low, high = (low, mid) if _has_stop(self.policy.decode(completion[:mid]), stop) else (mid + 1, high)
            return low, True
        return length, stopped


def _has_stop(text: str, stop: Sequence[str]) -> bool:
    return any(s in text for s in stop)
