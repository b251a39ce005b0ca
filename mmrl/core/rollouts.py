"""The batch the core works on: groups of samples, their rewards, and per-action log-probs.

The core never looks inside ``payload``: that is the policy's own data (token ids and pixel
values for a VLM, latents and timesteps for a generator), handed back to ``train_step``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Rollouts:
    """N samples from G prompts (``group_ids[i]`` = prompt index of sample i), T action slots.

    - ``action_mask`` (N, T): 1.0 where slot t of sample i is a real action (a completion token,
      a trained denoising step), 0.0 for padding.
    - ``old_logps`` / ``ref_logps`` (N, T): log-probs of the taken actions under the sampling
      policy and the reference policy; ``None`` when not needed (one iteration / ``beta=0``).
    - ``rewards`` (N,): the weighted total; ``reward_components`` each reward's raw score.
    - ``advantages`` (N,) or (N, T): filled by the core after the rewards.
    """

    group_ids: torch.Tensor
    action_mask: torch.Tensor
    old_logps: torch.Tensor | None = None
    ref_logps: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    reward_components: dict[str, torch.Tensor] = field(default_factory=dict)
    advantages: torch.Tensor | None = None
    completions: list[str] = field(default_factory=list)
    examples: list[dict] = field(default_factory=list)
    truncated: torch.Tensor | None = None  # (N,) bool: hit the length limit without stopping
    payload: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.group_ids.shape[0])

    @property
    def num_groups(self) -> int:
        return int(torch.unique(self.group_ids).numel())

    def select(self, index: torch.Tensor | list[int]) -> "Rollouts":
        """The sub-batch of samples ``index`` (payload tensors with a leading N axis follow)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        n = len(self)

        def take(x):
            if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == n:
                return x[idx]
            if isinstance(x, list) and len(x) == n:
                return [x[i] for i in idx.tolist()]
            return x

        return Rollouts(
            group_ids=take(self.group_ids),
            action_mask=take(self.action_mask),
            old_logps=take(self.old_logps),
            ref_logps=take(self.ref_logps),
            rewards=take(self.rewards),
            reward_components={k: take(v) for k, v in self.reward_components.items()},
            advantages=take(self.advantages),
            completions=take(self.completions),
            examples=take(self.examples),
            truncated=take(self.truncated),
            payload={k: take(v) for k, v in self.payload.items()},
        )
