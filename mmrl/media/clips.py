"""Scoring clips with image rewards: every frame scored, then one number per clip.

A video generator's completion is a clip, a list of PIL frames; an image reward (JPEG size,
brightness, CLIP score, a composition checker ...) knows how to score one image. Rather than teach
each reward about clips, a reward declared ``register_reward(name, media="image")`` is wrapped once
by :func:`per_frame`: the frames of every clip in the batch are scored in one call of the reward
(so a learned scorer still sees one large batch), each frame paired with its clip's example, and
each clip's frame scores are reduced to one score by the reward kwarg ``frames``:

- ``mean`` (default): the clip's average frame, the usual way per-frame image metrics are lifted to
  video (e.g. the frame-averaged CLIP score of text-to-video benchmarks);
- ``min``: the clip's worst frame, for rewards where one bad frame spoils the clip (a composition
  check, a safety scorer), so RL cannot trade a broken frame for many good ones.

Set it per reward: ``task.reward_kwargs.<reward>.frames=min``. Still images pass through unchanged
(a batch without clips calls the reward exactly as before). A clip scores None (the reward's
minimum, counted as unparsable) when it has no frames or when the reward could not score one of
its frames, so a half-broken clip is never averaged into a good score. A reward computed elsewhere
(a served judge) returns futures: a clip's score is then a future of the reduction, raising when a
frame's request failed (counted by the reward computer as that frame's failure).
"""

from __future__ import annotations

import functools
import math
import threading
from concurrent.futures import Future
from typing import Any, Callable, Sequence

# Per-sample context the trainer passes to every reward, repeated per frame when clips are flattened.
PER_SAMPLE_CONTEXT = ("group_ids",)


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


FRAME_REDUCTIONS: dict[str, Callable[[Sequence[float]], float]] = {"mean": _mean, "min": min}


def is_clip(completion: Any) -> bool:
    """A clip is a list (or tuple) of frames; an image or a text completion is not."""
    return isinstance(completion, (list, tuple))


def frame_reduction(frames: str, reward: str) -> Callable[[Sequence[float]], float]:
    """The reduction named by ``task.reward_kwargs.<reward>.frames``; a ValueError naming the key."""
    if frames not in FRAME_REDUCTIONS:
        raise ValueError(f"task.reward_kwargs.{reward}.frames={frames!r}: a clip's frame scores are reduced by "
                         f"one of {', '.join(FRAME_REDUCTIONS)}")
    return FRAME_REDUCTIONS[frames]


def score_clips(fn: Callable[..., Sequence], completions: Sequence[Any], examples: Sequence[Any],
                frames: str = "mean", reward: str = "reward", **kwargs: Any) -> list:
    """``fn`` (a batched image reward) applied to every frame of every clip in ``completions``,
    each clip's frame scores reduced by ``frames``; images score as ``fn`` scores them."""
    reduce = frame_reduction(frames, reward)
    # check_batch's check (mmrl.measures.batch), written out: the registry's leaves import no mmrl module
    if len(completions) != len(examples):
        raise ValueError(f"{reward}: {len(completions)} completions for {len(examples)} examples")
    if not any(is_clip(c) for c in completions):
        return list(fn(list(completions), list(examples), **kwargs))
    flat, owners = [], []
    for i, completion in enumerate(completions):
        items = list(completion) if is_clip(completion) else [completion]
        flat += items
        owners += [i] * len(items)
    for key in PER_SAMPLE_CONTEXT:  # a tensor stays a tensor (indexed by the frames' owners), a list a list
        value = kwargs.get(key)
        if value is not None:
            kwargs[key] = value[owners] if hasattr(value, "shape") else [value[i] for i in owners]
    scores = list(fn(flat, [examples[i] for i in owners], **kwargs))
    if len(scores) != len(flat):
        raise ValueError(f"reward {reward!r} returned {len(scores)} scores for {len(flat)} frames")
    per_clip: list[list] = [[] for _ in completions]
    for i, s in zip(owners, scores):
        per_clip[i].append(s)
    return [_reduced(values, reduce) for values in per_clip]


def _reduce(values: list, reduce: Callable[[Sequence[float]], float]):
    valid = values and all(v is not None and math.isfinite(float(v)) for v in values)
    return float(reduce([float(v) for v in values])) if valid else None


def _reduced(values: list, reduce: Callable[[Sequence[float]], float]):
    """A clip's score, or a future of it when a frame's score is a future (settled once all are)."""
    pending = [v for v in values if isinstance(v, Future)]
    if not pending:
        return _reduce(values, reduce)
    out: Future = Future()
    left, lock = [len(pending)], threading.Lock()

    def settle(_):
        with lock:
            left[0] -= 1
            if left[0]:
                return
        try:
            out.set_result(_reduce([v.result() if isinstance(v, Future) else v for v in values], reduce))
        except BaseException as exc:  # noqa: BLE001 (a frame's failure is the clip's, counted by the reward computer)
            out.set_exception(exc)

    for future in pending:
        future.add_done_callback(settle)
    return out


def per_frame(fn: Callable[..., Sequence], reward: str, check: Callable[..., None] | None = None):
    """``fn`` made to score clips frame by frame (:func:`score_clips`), taking the extra kwarg
    ``frames``; and ``check`` (the reward's setup check) extended to refuse an unknown ``frames``.
    ``register_reward(name, media="image")`` applies it; returns ``(scorer, check)``."""

    @functools.wraps(fn)
    def scorer(completions, examples, frames: str = "mean", **kwargs):
        return score_clips(fn, completions, examples, frames=frames, reward=reward, **kwargs)

    def checked(frames: str = "mean", **kwargs) -> None:
        frame_reduction(frames, reward)
        if check is not None:
            check(**kwargs)

    return scorer, checked
