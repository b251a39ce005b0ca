"""Frame order: a clip's frames shuffled for T-GRPO's temporal contrast (pure functions).

"Video-R1: Reinforcing Video Reasoning in MLLMs" (Feng et al., 2025) asks each video question again
on its frames in a shuffled order; :func:`shuffle_frames` draws that order, never the original one.
The contrast itself, modality-free, is :mod:`mmrl.core.batch.temporal`.
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np
import torch
from torch import Tensor

__all__ = ["non_identity_permutation", "shuffle_frames"]


def non_identity_permutation(n: int, rng: np.random.Generator) -> np.ndarray:
    """A permutation of ``range(n)`` drawn uniformly among those that move something (rejection
    sampling: at most a few draws, half the draws for n = 2); the identity for n < 2, the only
    permutation there is. Video-R1 draws ``torch.randperm``, which for a short clip is often the
    identity (1 in 2 for two frames), and a "shuffled" group on ordered frames contrasts nothing."""
    if n < 2:
        return np.arange(max(n, 0))
    identity = np.arange(n)
    while True:
        perm = rng.permutation(n)
        if not np.array_equal(perm, identity):
            return perm


def shuffle_frames(frames: Union[Tensor, Sequence], rng: np.random.Generator) -> Union[Tensor, list]:
    """The frames in a shuffled order along the time axis (dim 0), never the original order when
    there are two frames or more (:func:`non_identity_permutation`); deterministic given ``rng``'s
    state. A tensor ``(T, ...)`` comes back as a tensor, a sequence of frames (PIL images, arrays)
    as a list; a clip of fewer than two frames comes back in its order (a copy)."""
    perm = non_identity_permutation(len(frames), rng)
    if isinstance(frames, Tensor):
        return frames[torch.as_tensor(perm, dtype=torch.long, device=frames.device)]
    return [frames[i] for i in perm]
