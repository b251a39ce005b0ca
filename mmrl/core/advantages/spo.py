"""SPO: a persistent per-prompt value tracker instead of a group baseline."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from mmrl.registry import register_advantage

from .base import EstimatorState, as_float_tensor, group_index, whiten_batch


class SPOState(EstimatorState):
    """SPO's persistent per-prompt value tracker.

    Per prompt key: ``[S, W, mark]``, a discounted reward sum S and discounted count W (the Beta
    tracker's alpha = S and beta = W - S for 0/1 rewards; v = S / W), and the cumulative policy
    KL at the prompt's last visit. ``global_value`` is the same record for the mean reward of
    every batch (the value of a prompt seen for the first time). ``cum_kl`` sums the per-update
    policy KLs passed as ``policy_kl``.
    """

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}
        self.global_value: list[float] | None = None
        self.cum_kl = 0.0

    def value(self, key: Any) -> float | None:
        """The tracked value of ``key`` (None if never seen)."""
        rec = self.values.get(str(key))
        return None if rec is None else rec[0] / rec[1]

    def set_prior(self, key: Any, value: float, count: float) -> None:
        """Seed ``key`` with an offline estimate ``value`` worth ``count`` observations (the
        paper estimates it from samples of the initial policy with count 1/(1 - rho_min))."""
        if count <= 0:
            raise ValueError("count must be positive")
        self.values[str(key)] = [float(value) * count, float(count), self.cum_kl]

    def state_dict(self) -> dict:
        return {
            "values": {k: list(v) for k, v in self.values.items()},
            "global_value": None if self.global_value is None else list(self.global_value),
            "cum_kl": self.cum_kl,
        }

    def load_state_dict(self, d: dict) -> None:
        self.values = {str(k): [float(x) for x in v] for k, v in d.get("values", {}).items()}
        g = d.get("global_value")
        self.global_value = None if g is None else [float(x) for x in g]
        self.cum_kl = float(d.get("cum_kl", 0.0))


@register_advantage("spo", inputs=("prompt_keys", "policy_kl"), make_state=SPOState)
def spo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    eps: float = 1e-6,
    state: SPOState | None = None,
    prompt_keys: Sequence[Any] | None = None,
    policy_kl: float | None = None,
    rho: float | None = None,
    rho_min: float = 0.875,
    rho_max: float = 0.96,
    d_half: float = 0.06,
    prior_count: float = 1.0,
    init_value: float | None = None,
) -> Tensor:
    """SPO: a persistent per-prompt value tracker replaces the group baseline; batch-wide norm.

    From "Single-stream Policy Optimization" (Xu & Ding, 2025). No groups are needed (one
    sample per prompt works); ``group_ids`` only has to have the right length. For sample i of
    prompt x = ``prompt_keys[i]``, with v(x) the tracker value *before* this batch:

        a_i = r_i - v(x_i)                        A_i = (a_i - mean_B(a)) / (std_B(a) + eps)

    then, per prompt x with k samples in the batch summing to R,

        S(x) <- rho(x) S(x) + R,   W(x) <- rho(x) W(x) + k,   v(x) = S(x) / W(x)
        rho(x) = clip(2 ** (-D(x) / d_half), rho_min, rho_max)

    For 0/1 rewards this is the paper's discounted Beta tracker (alpha <- rho alpha + r,
    beta <- rho beta + 1 - r, v = alpha / (alpha + beta)); written with S and W it also holds
    for any real reward, and at the steady count W = 1/(1-rho) it is an EMA with rate 1 - rho.
    D(x) is the policy's KL drift since x was last visited: forget faster the more the policy
    moved. We approximate it by summing the per-update KLs passed as ``policy_kl`` (the mean
    KL(pi_old || pi_new) of the update before this batch); without it D = 0 and rho = rho_max.
    ``rho`` fixes the forgetting factor instead. Defaults rho in [0.875, 0.96], d_half = 0.06
    follow the SPO recipe as we could reconstruct it (not checked against the paper's text).

    A prompt seen for the first time starts at the global running mean reward (tracked the same
    way over whole batches; on the very first batch ``init_value``, else that batch's mean)
    worth ``prior_count`` observations. The paper instead seeds v from offline samples of the
    initial policy: use ``state.set_prior``. Not implemented here: the paper's prioritised
    prompt sampling (weights ~ sqrt(v(1-v))), which belongs to data selection.
    """
    if state is None:
        raise ValueError(
            "spo keeps a per-prompt value tracker: pass state=make_advantage_state('spo') and "
            "save state.state_dict() with the checkpoint"
        )
    r = as_float_tensor(rewards)
    group_index(r, group_ids)  # shape validation only
    if prompt_keys is None or len(prompt_keys) != r.numel():
        got = "none" if prompt_keys is None else f"{len(prompt_keys)}"
        raise ValueError(f"spo needs prompt_keys, one stable id per sample: got {got} for {r.numel()} samples")
    if policy_kl is not None:
        state.cum_kl += max(float(policy_kl), 0.0)  # k1 estimates can dip below 0
    if r.numel() == 0:
        return r

    def forget(mark: float) -> float:
        if rho is not None:
            return float(rho)
        drift = state.cum_kl - mark
        return min(max(2.0 ** (-drift / d_half), rho_min), rho_max)

    keys = [str(k) for k in prompt_keys]
    uniq = list(dict.fromkeys(keys))
    slot = {k: j for j, k in enumerate(uniq)}
    inverse = torch.tensor([slot[k] for k in keys], device=r.device)
    r64 = r.detach().to(torch.float64)
    sums = torch.zeros(len(uniq), dtype=torch.float64, device=r.device).index_add_(0, inverse, r64)
    counts = torch.zeros_like(sums).index_add_(0, inverse, torch.ones_like(r64))

    g = state.global_value
    if g is None:
        v0 = float(r64.mean()) if init_value is None else float(init_value)
        g = [prior_count * v0, prior_count, state.cum_kl]
    new_value = g[0] / g[1] if g[1] > 0 else float(r64.mean())
    before = [state.values[k][0] / state.values[k][1] if k in state.values else new_value for k in uniq]
    baseline = torch.tensor(before, dtype=torch.float64, device=r.device)
    adv = whiten_batch(r64 - baseline[inverse], eps).to(r.dtype)

    for k, total, n in zip(uniq, sums.tolist(), counts.tolist()):
        rec = state.values.get(k)
        if rec is None:
            state.values[k] = [prior_count * new_value + total, prior_count + n, state.cum_kl]
        else:
            f = forget(rec[2])
            state.values[k] = [f * rec[0] + total, f * rec[1] + n, state.cum_kl]
    f = forget(g[2]) if state.global_value is not None else 1.0
    state.global_value = [f * g[0] + float(r64.sum()), f * g[1] + r.numel(), state.cum_kl]
    return adv
