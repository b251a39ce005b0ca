"""Advantage estimators for multi-step episodes: episode-level GRPO and GiGPO.

In an episode batch every row is one step (one action) of one episode of an environment task.
Besides ``rewards`` (the step reward r_t of the row) and ``group_ids`` (the task the episode was
rolled out for; the episodes of one task form a group), the episode runner supplies per row:

- ``episode_ids`` (N,) long: which episode the row belongs to;
- ``step_indices`` (N,) long: the step t = 0, 1, ... of the row within its episode;
- ``anchor_keys`` (N strings): the state (observation) the step acted from; equal strings are
  the same state.

Rows may come in any order, episodes interleaved. An episode is identified by the pair
(group id, episode id), so episode ids need only be unique within a group.

Episode-level advantage (GRPO over episodes; Eq. 3 of "Group-in-Group Policy Optimization for LLM
Agent Training", Feng et al., 2025, arXiv 2505.10978):

    R(tau)     = sum_t r_t                                       (the episode's return)
    A^E(tau_i) = (R(tau_i) - mean_g R) / (std_g R + eps)         (over the group's EPISODES)

and every step of tau_i gets A^E(tau_i). The statistics run over episodes, not rows, so a long
episode counts once in the baseline like a short one.

GiGPO adds a step-level advantage over *anchor-state groups*: steps of the same group that acted
from the same state (across episodes, and repeated visits within one episode; Eq. 6) are compared
by their discounted return (Eq. 5, 7):

    R_t        = sum_{k >= 0} gamma^k r_{t+k}                    (within the step's episode)
    A^S(a_t)   = (R_t - mean_S R) / (std_S R + eps)              (S = the step's anchor group)
    A          = A^E + omega * A^S                               (Eq. 8)

All statistics are computed in float64 (see :func:`~mmrl.core.advantages.group_stats`) and a
group without spread (:func:`~mmrl.core.advantages.constant_groups`, including a group of one)
contributes exactly 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from mmrl.registry import register_advantage

from .base import as_float_tensor, constant_groups, finalize_advantages, group_index, group_stats


def _per_row(values, rewards: Tensor, name: str, dtype=torch.long) -> Tensor:
    """``values`` as an (N,) tensor on the rewards' device, or a ValueError naming ``name``."""
    x = torch.as_tensor(values, device=rewards.device)
    if x.shape != rewards.shape:
        raise ValueError(f"{name} must have one entry per row: got shape {tuple(x.shape)} for {rewards.numel()} rows")
    return x.to(dtype)


def _episode_index(rewards: Tensor, group_ids, episode_ids) -> tuple[Tensor, Tensor, int]:
    """``(inverse, episode_group, num_episodes)``: each row's episode index, each episode's group id.

    An episode is keyed by (group id, episode id); without ``episode_ids`` every row is its own
    episode.
    """
    group_index(rewards, group_ids)  # validates the shapes
    groups = _per_row(group_ids, rewards, "group_ids")
    if episode_ids is None:
        return torch.arange(rewards.numel(), device=rewards.device), groups, rewards.numel()
    episodes = _per_row(episode_ids, rewards, "episode_ids")
    pairs, inverse = torch.unique(torch.stack([groups, episodes]), dim=1, return_inverse=True)
    return inverse, pairs[0], pairs.shape[1]


def _normalise(x: Tensor, ids: Tensor, dtype: torch.dtype, eps: float, scale: bool) -> Tensor:
    """``(x - mean_id) / (std_id + eps)`` (or ``x - mean_id``) in float64, exactly 0 for groups
    without spread. The spread test runs on ``x`` rounded to the rewards' own ``dtype``, so sums
    that differ only by float64 rounding of float32 rewards count as equal."""
    mean, std, _ = group_stats(x, ids)
    centred = x.to(torch.float64) - mean
    adv = centred / (std + eps) if scale else centred
    flat = constant_groups(x.to(dtype), ids)
    return torch.where(flat, torch.zeros_like(adv), adv)


EPISODE_STATS = ("episodes", "steps")  # the paper's Eq. 3; verl-agent's compute_mean_std_cross_steps=True


EPISODE_RETURNS = ("sum", "final")


def _final_rewards(r: Tensor, inverse: Tensor, n: int, step_indices) -> Tensor:
    """Each episode's reward on its last step (the row with its largest step index), float64."""
    if step_indices is None:
        raise ValueError("episode_return='final' needs step_indices (the episode runner gives them)")
    steps = _per_row(step_indices, r, "step_indices")
    last = torch.full((n,), -1, dtype=torch.long, device=r.device).scatter_reduce(0, inverse, steps, "amax")
    is_last = steps == last[inverse]
    out = torch.zeros(n, dtype=torch.float64, device=r.device)
    out[inverse[is_last]] = r.to(torch.float64)[is_last]
    return out


def _episode_advantage(r: Tensor, group_ids, episode_ids, eps: float, scale: bool,
                       stats: str = "episodes", episode_return: str = "sum",
                       step_indices=None) -> tuple[Tensor, Tensor]:
    """Per-row A^E in float64 and the rows' episode index (see the module docstring).

    ``stats="episodes"``: the group's mean and std over its episodes, one vote each (the paper's
    Eq. 3). ``stats="steps"``: over the group's step rows, each carrying its episode's return, so an
    episode of L steps counts L times (verl-agent's default, ``compute_mean_std_cross_steps``).
    ``episode_return="sum"``: R(tau) = sum of its step rewards (Eq. 3); ``"final"``: the reward of
    its last step, an outcome reward of the whole episode (a tool-use trajectory, whose turn rows
    each score the trajectory)."""
    if stats not in EPISODE_STATS:
        raise ValueError(f"episode_stats must be one of {', '.join(EPISODE_STATS)}, got {stats!r}")
    if episode_return not in EPISODE_RETURNS:
        raise ValueError(f"episode_return must be one of {', '.join(EPISODE_RETURNS)}, got {episode_return!r}")
    inverse, episode_group, n = _episode_index(r, group_ids, episode_ids)
    if episode_return == "final":
        returns = _final_rewards(r, inverse, n, step_indices)
    else:
        returns = torch.zeros(n, dtype=torch.float64, device=r.device).index_add_(0, inverse, r.to(torch.float64))
    if stats == "steps":
        return _normalise(returns[inverse], _per_row(group_ids, r, "group_ids"), r.dtype, eps, scale), inverse
    return _normalise(returns, episode_group, r.dtype, eps, scale)[inverse], inverse


@register_advantage("episode_grpo", inputs=("episode_ids", "step_indices"))
def episode_grpo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    eps: float = 1e-6,
    scale_rewards: bool = True,
    episode_ids: Tensor | None = None,
    step_indices: Tensor | None = None,
    episode_stats: str = "episodes",
    episode_return: str = "sum",
) -> Tensor:
    """GRPO over whole episodes of a multi-step environment task.

    The outcome advantage of GRPO ("DeepSeekMath", Shao et al., 2024) applied to episodes, as the
    episode-level advantage of GiGPO (Feng et al., 2025, Eq. 3): with R(tau) the sum of the step
    rewards of episode tau and g the episodes of its task,

        A(tau) = (R(tau) - mean_g R) / (std_g R + eps)

    (unbiased std over EPISODES, not rows), and every row of tau gets A(tau). With
    ``scale_rewards=False`` the std division is dropped, ``A = R - mean_g R``. A group whose
    episode returns are all equal (including a group of one episode) gets exactly 0. Without
    ``episode_ids`` each row is its own episode and this equals ``grpo``. ``episode_stats="steps"``
    takes the statistics over step rows instead (see :func:`gigpo`).

    ``episode_return="final"``: R(tau) is the reward of tau's last step (largest step index) instead
    of the sum: trajectory-level GRPO for an outcome reward that every row of the trajectory
    scores, as tool-use rollouts give (DeepEyes, Mini-o3: one reward per trajectory).
    """
    r = as_float_tensor(rewards)
    if r.numel() == 0:
        return r.clone()
    adv, _ = _episode_advantage(r, group_ids, episode_ids, eps, scale_rewards, episode_stats,
                                episode_return, step_indices)
    return finalize_advantages(adv, r)


def discounted_returns(rewards: Tensor, episode_index: Tensor, step_indices: Tensor, gamma: float) -> Tensor:
    """R_t = sum_{t' >= t} gamma^(t' - t) r_{t'} over the rows of the same episode, in float64.

    GiGPO Eq. 5. Rows may be in any order; they are ordered by ``step_indices`` within each
    episode (a missing step index counts as a step with reward 0). One vectorised pass per step
    position (the longest episode's length), accumulating from the end.
    """
    r = as_float_tensor(rewards).to(torch.float64)
    n = r.numel()
    if n == 0:
        return r
    steps = step_indices.to(torch.long)
    # Order rows by (episode, step): a stable sort by step, then a stable sort by episode.
    order = torch.sort(steps, stable=True).indices
    order = order[torch.sort(episode_index[order], stable=True).indices]
    ep, st = episode_index[order], steps[order]
    same_next = ep[1:] == ep[:-1]  # row i of the sorted order has a successor i + 1 in its episode
    if bool((same_next & (st[1:] == st[:-1])).any()):
        raise ValueError("step_indices must be unique within an episode: two rows of one episode share a step index")
    # Position of each sorted row within its episode.
    starts = torch.ones(n, dtype=torch.bool, device=r.device)
    starts[1:] = ~same_next
    start_pos = torch.cummax(torch.where(starts, torch.arange(n, device=r.device), 0), 0).values
    pos = torch.arange(n, device=r.device) - start_pos
    has_next = torch.zeros(n, dtype=torch.bool, device=r.device)
    has_next[:-1] = same_next
    gap = torch.zeros(n, dtype=torch.float64, device=r.device)
    gap[:-1] = (st[1:] - st[:-1]).to(torch.float64)
    ret = r[order].clone()
    for p in range(int(pos.max()), -1, -1):  # backwards: R_t = r_t + gamma^gap * R_next
        rows = torch.nonzero((pos == p) & has_next).squeeze(1)
        if rows.numel():
            ret[rows] += gamma ** gap[rows] * ret[rows + 1]
    out = torch.empty_like(ret)
    out[order] = ret
    return out


def anchor_groups(group_ids, anchor_keys: Sequence[Any], device=None) -> Tensor:
    """(N,) long: one id per distinct (group id, anchor key) pair (GiGPO Eq. 6).

    The group id is part of the anchor, so equal keys of two different tasks are never pooled.
    Keys are compared as strings.
    """
    gids = torch.as_tensor(group_ids).tolist()
    ids: dict[tuple[Any, str], int] = {}
    out = [ids.setdefault((g, str(k)), len(ids)) for g, k in zip(gids, anchor_keys)]
    return torch.tensor(out, dtype=torch.long, device=device)


@register_advantage("gigpo", inputs=("episode_ids", "step_indices", "anchor_keys"))
def gigpo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    eps: float = 1e-6,
    scale_rewards: bool = True,
    episode_ids: Tensor | None = None,
    step_indices: Tensor | None = None,
    anchor_keys: Sequence[Any] | None = None,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    episode_stats: str = "episodes",
) -> Tensor:
    """GiGPO: episode-level plus anchor-state step-level group-relative advantages.

    From "Group-in-Group Policy Optimization for LLM Agent Training" (Feng et al., 2025,
    arXiv 2505.10978). Each row is one step; for the row's episode tau (group g) and step t:

        A^E(tau)  = (R(tau) - mean_g R) / (std_g R + eps),   R(tau) = sum_t r_t       (Eq. 3)
        R_t       = sum_{k >= 0} gamma^k r_{t+k}              (within the episode)     (Eq. 5)
        S         = rows of group g whose anchor key equals this row's                  (Eq. 6)
        A^S(a_t)  = (R_t - mean_S R_t) / (std_S R_t + eps)                              (Eq. 7)
        A         = A^E + step_weight * A^S                                             (Eq. 8)

    Why the two levels: A^E ranks whole episodes like GRPO; A^S gives credit to single actions by
    comparing the actions taken from the *same* state, whose future returns differ only by what
    the policy did from there, without a critic. Anchor groups include repeated visits to a
    state within one episode. The std is unbiased, over episodes for A^E and over the steps of S
    for A^S. ``scale_rewards=False`` drops both std divisions (verl-agent's ``mode="mean_norm"``;
    ``scale_rewards=True`` is ``"mean_std_norm"``).

    Groups without spread contribute exactly 0: a task whose episodes all have the same return
    has A^E = 0, an anchor group whose discounted returns are all equal has A^S = 0. A step
    group of size 1 (a state visited once) has A^S = 0, as in verl-agent (whose mean of the single
    value cancels it). A task with a single episode has A^E = 0; verl-agent's episode term instead
    gives such an episode its raw return (mean 0, std 1); mmrl gives a sample without a baseline
    no signal, as ``grpo`` does.

    The episode statistics: ``episode_stats="episodes"`` (the default) takes A^E's mean and std over
    the group's episodes, as the paper's Eq. 3 states; ``episode_stats="steps"`` takes them over
    the group's step rows, each carrying its episode's return, so an episode of L steps counts L
    times: what the authors' code (verl-agent's ``episode_norm_reward``) does by default
    (``compute_mean_std_cross_steps=True``). Rows are ordered by ``step_indices`` for the discounted
    return rather than by their batch order.

    Keyword arguments: ``gamma`` (default 0.95, the paper's experiments), ``step_weight`` = omega
    (default 1.0, the paper's), ``episode_stats``, ``eps``, ``scale_rewards``, and the episode
    runner's ``episode_ids``, ``step_indices``, ``anchor_keys`` (all three required).
    """
    missing = [name for name, value in (("episode_ids", episode_ids), ("step_indices", step_indices),
                                        ("anchor_keys", anchor_keys)) if value is None]
    if missing:
        raise ValueError(
            "gigpo needs an episode task (an environment task, whose episode runner supplies episode_ids, "
            f"step_indices and anchor_keys per step); missing: {', '.join(missing)}"
        )
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gigpo gamma must be in [0, 1], got {gamma}")
    r = as_float_tensor(rewards)
    if len(anchor_keys) != r.numel():
        raise ValueError(f"anchor_keys must have one entry per row: got {len(anchor_keys)} for {r.numel()} rows")
    if r.numel() == 0:
        return r.clone()
    a_episode, episode_index = _episode_advantage(r, group_ids, episode_ids, eps, scale_rewards, episode_stats)
    steps = _per_row(step_indices, r, "step_indices")
    returns = discounted_returns(r, episode_index, steps, gamma)
    a_step = _normalise(returns, anchor_groups(group_ids, anchor_keys, r.device), r.dtype, eps, scale_rewards)
    return finalize_advantages(a_episode + step_weight * a_step, r)
