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
    - ``rollout_logps`` (N, T): the rollout engine's own log-probs of the taken actions (vLLM),
      when it reports them; they differ slightly from the trainer's forward, which the objective
      corrects with truncated importance sampling.
    - ``rewards`` (N,): the weighted total; ``reward_components`` each reward's raw score.
    - ``advantages`` (N,) or (N, T): filled by the core after the rewards.
    """

    group_ids: torch.Tensor
    action_mask: torch.Tensor
    old_logps: torch.Tensor | None = None
    ref_logps: torch.Tensor | None = None
    rollout_logps: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    reward_components: dict[str, torch.Tensor] = field(default_factory=dict)
    advantages: torch.Tensor | None = None
    completions: list[str] = field(default_factory=list)
    examples: list[dict] = field(default_factory=list)
    truncated: torch.Tensor | None = None  # (N,) bool: hit the length limit without stopping
    # (N,) bool: True for samples the policy did not generate (injected reference completions,
    # TempSamp-R1 off-policy guidance); the objective weights them differently. None = all on-policy.
    off_policy: torch.Tensor | None = None
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
            rollout_logps=take(self.rollout_logps),
            rewards=take(self.rewards),
            reward_components={k: take(v) for k, v in self.reward_components.items()},
            advantages=take(self.advantages),
            completions=take(self.completions),
            examples=take(self.examples),
            truncated=take(self.truncated),
            off_policy=take(self.off_policy),
            payload={k: take(v) for k, v in self.payload.items()},
        )

    @staticmethod
    def concat(parts: list["Rollouts"], renumber_groups: bool = True) -> "Rollouts":
        """One batch from several (e.g. a DAPO refill round appended to the first rollout).

        Group ids of later parts are shifted past the earlier ones, so groups stay distinct
        (``renumber_groups=False`` keeps them as they are: for parts of the same groups);
        (N, T) tensors are right-padded with zeros to the widest T (a zero ``action_mask`` makes
        the padding inert). Payload lists are joined and payload tensors concatenated on axis 0.
        """
        parts = [p for p in parts if len(p) > 0]
        if not parts:
            raise ValueError("Rollouts.concat needs at least one non-empty batch")
        if len(parts) == 1 and renumber_groups:
            return parts[0]
        width = max(p.action_mask.shape[1] for p in parts)

        def pad(x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(x, (0, width - x.shape[1])) if x.dim() == 2 else x

        def cat(name: str):
            values = [getattr(p, name) for p in parts]
            if all(v is None for v in values):
                return None
            if any(v is None for v in values):
                raise ValueError(f"Rollouts.concat: {name!r} is set in some parts and not in others")
            return torch.cat([pad(v) for v in values])

        group_ids, offset = [], 0
        for p in parts:
            group_ids.append(p.group_ids + offset)
            if renumber_groups:
                offset += int(p.group_ids.max()) + 1
        off_policy = None
        if any(p.off_policy is not None for p in parts):
            off_policy = torch.cat([p.off_policy if p.off_policy is not None else torch.zeros(len(p), dtype=torch.bool)
                                    for p in parts])
        names = set(parts[0].reward_components)
        if any(set(p.reward_components) != names for p in parts):
            raise ValueError("Rollouts.concat: parts have different reward components")
        payload: dict[str, Any] = {}
        for key in parts[0].payload:
            values = [p.payload[key] for p in parts]
            if isinstance(values[0], torch.Tensor):
                payload[key] = torch.cat([pad(v) for v in values])
            elif isinstance(values[0], list):
                payload[key] = [x for v in values for x in v]
            else:
                payload[key] = values[0]
        return Rollouts(
            group_ids=torch.cat(group_ids),
            action_mask=cat("action_mask"),
            old_logps=cat("old_logps"),
            ref_logps=cat("ref_logps"),
            rollout_logps=cat("rollout_logps"),
            rewards=cat("rewards"),
            reward_components={k: torch.cat([p.reward_components[k] for p in parts]) for k in names},
            advantages=cat("advantages"),
            completions=[c for p in parts for c in p.completions],
            examples=[e for p in parts for e in p.examples],
            truncated=cat("truncated"),
            off_policy=off_policy,
            payload=payload,
        )
