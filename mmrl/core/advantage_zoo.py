"""More advantage estimators: REINFORCE++, NGRPO, BNPO, Stratified GRPO and SPO.

Same contract as :mod:`mmrl.core.advantages`:

    fn(rewards (N,), group_ids (N,), *, eps=1e-6, **kwargs) -> advantages (N,)

with unknown keyword arguments ignored. Extra inputs arrive as keyword arguments:

- ``task_ids`` (N,) long: a stratum label per sample (``stratified_grpo``);
- ``prompt_keys``: a list of N stable per-prompt ids (``spo``);
- ``state``: the estimator's :class:`~mmrl.core.advantages.EstimatorState` (``bnpo``, ``spo``),
  made with :func:`~mmrl.core.advantages.make_advantage_state` and updated in place.

Standard deviations are the unbiased sample std (as ``group_stats`` and TRL use), with ``n - 1``
clamped to 1, so a single value has std 0 and a constant set standardises to 0, never NaN.
This module is imported by :mod:`mmrl.core.advantages`, which registers everything here.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from mmrl.registry import register_advantage

from .advantages import (EstimatorState, as_float_tensor, constant_groups, finalize_advantages, group_index,
                         group_stats)

__all__ = [
    "BNPOState",
    "SPOState",
    "reinforce_pp",
    "ngrpo",
    "bnpo",
    "stratified_grpo",
    "spo",
]


def _whiten(x: Tensor, eps: float, weights: Tensor | None = None) -> Tensor:
    """``(x - mean(x)) / (std(x) + eps)`` over the whole batch, in float64, Bessel-corrected.

    ``weights`` (N,) counts each value that many times (REINFORCE++'s token-level whitening:
    a sequence's advantage weighted by its number of tokens, the Bessel correction over the token
    count). A batch with no spread (``max - min`` within 4 ulp of its magnitude, see
    :func:`~mmrl.core.advantages.constant_groups`) whitens to exactly 0; N = 1 gives 0.
    """
    if x.numel() == 0:
        return x
    x64 = x.to(torch.float64)
    w = torch.ones_like(x64) if weights is None else torch.as_tensor(weights, dtype=torch.float64, device=x.device)
    total = w.sum()
    centred = x64 - (w * x64).sum() / total.clamp(min=1e-300)
    std = ((w * centred.pow(2)).sum() / (total - 1).clamp(min=1)).sqrt()
    flat = constant_groups(x, torch.zeros(x.numel(), dtype=torch.long, device=x.device))
    return finalize_advantages(centred / (std + eps), x, flat)


# --------------------------------------------------------------------------------------------
# REINFORCE++
# --------------------------------------------------------------------------------------------


@register_advantage("reinforce_pp", inputs=("lengths",))
def reinforce_pp(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    eps: float = 1e-6,
    group_baseline: bool = True,
    lengths: Tensor | None = None,
    whiten: str = "token",
    **_,
) -> Tensor:
    """REINFORCE++ outcome advantage: normalisation over the whole batch, not per group.

    From "REINFORCE++: Stabilizing Critic-Free Policy Optimization with Global Advantage
    Normalization" (Hu et al., 2025; first titled "REINFORCE++: A Simple and Efficient Approach
    for Aligning Large Language Models"). No critic and no per-group std: the batch supplies the
    baseline and the scale. With outcome rewards every token of sequence i carries the same
    advantage, and the paper normalises *token* advantages over the global batch (its eq. 10):

        mean_B = sum_i L_i u_i / sum_i L_i,  var_B = sum_i L_i (u_i - mean_B)^2 / (sum_i L_i - 1)
        A_i    = (u_i - mean_B) / (sqrt(var_B) + eps)

    with L_i the number of actions (tokens) of sample i (``lengths``; the trainer passes them),
    the Bessel correction over the token count, as OpenRLHF's and verl's ``masked_whiten`` do.
    ``whiten="sequence"`` (or no ``lengths``) weights every sequence once instead.

    - ``group_baseline=False`` (REINFORCE++, k >= 1 samples per prompt): ``u_i = r_i``.
    - ``group_baseline=True`` (default; "REINFORCE++ w/ baseline", verl's
      ``reinforce_plus_plus_baseline``): ``u_i = r_i - mean_g(r)``. A group of one sample has no
      group mean to subtract; its baseline is the batch mean ``mean_B(r)`` (verl uses 0 there).
      An all-equal group of two or more samples gets exactly 0 (its residuals are 0 and carry
      no ranking; float64 statistics keep the rounding residue of the group mean out).

    A batch with no spread whitens to exactly 0.
    """
    if whiten not in ("token", "sequence"):
        raise ValueError(f"reinforce_pp whiten must be 'token' or 'sequence', got {whiten!r}")
    r = as_float_tensor(rewards)
    mean_g, _, count = group_stats(r, group_ids)
    u = r.to(torch.float64)
    zero = None
    if group_baseline:
        u = u - torch.where(count > 1, mean_g, u.mean())
        zero = constant_groups(r, group_ids) & (count > 1)
    weights = None
    if whiten == "token" and lengths is not None:
        weights = torch.as_tensor(lengths, dtype=torch.float64, device=r.device)
        if weights.shape != r.shape:
            raise ValueError(f"reinforce_pp: lengths must have one entry per sample, got {tuple(weights.shape)} "
                             f"for {r.numel()} samples")
    return finalize_advantages(_whiten(u, eps, weights).to(torch.float64), r, zero)


# --------------------------------------------------------------------------------------------
# NGRPO
# --------------------------------------------------------------------------------------------


@register_advantage("ngrpo", inputs=("r_max",))
def ngrpo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    eps: float = 1e-6,
    r_max: float = 1.0,
    num_virtual: int = 1,
    scale_rewards: bool = True,
    **_,
) -> Tensor:
    """NGRPO advantage calibration: a virtual max-reward sample joins every group's statistics.

    From "NGRPO: Negative-enhanced Group Relative Policy Optimization" (Nan et al., 2025). With
    ``k = num_virtual`` virtual samples of reward ``r_max`` added to group g of n real samples:

        mean'_g = (sum_{i in g} r_i + k * r_max) / (n + k)
        std'_g  = sqrt((sum_{i in g} (r_i - mean'_g)^2 + k * (r_max - mean'_g)^2) / (n + k - 1))
        A_i     = (r_i - mean'_g) / (std'_g + eps)

    The virtual samples get no advantage of their own. An all-wrong group (all 0, r_max = 1) now
    gets negative advantages instead of zeros; an all-correct group at ``r_max`` still gets 0.
    The unbiased std over n + k values and k = 1 match the authors' code; with 8 samples of
    which one is correct this gives +1.76 / -0.50 (GRPO: +2.47 / -0.35), the paper's numbers.
    ``scale_rewards=False`` drops the std division (``A_i = r_i - mean'_g``). The paper's other
    half, asymmetric clipping, belongs to the objective (``epsilon`` < ``epsilon_high``).

    An all-equal group of n samples at r (by design the exception to "no signal"): with one
    virtual sample, ``mean' = (n r + r_max) / (n + 1)``, ``std' = |r_max - r| / sqrt(n + 1)``, so
    ``A = (r - r_max) / (n + 1) / (|r_max - r| / sqrt(n + 1) + eps)`` (-1/sqrt(n+1) for r < r_max,
    exactly 0 at r = r_max); statistics in float64 give that value without a rounding residue.
    """
    if int(num_virtual) != num_virtual or num_virtual < 0:
        raise ValueError(f"num_virtual must be a non-negative integer, got {num_virtual!r}")
    r_in = as_float_tensor(rewards)
    r = r_in.to(torch.float64)  # float64: an all-equal group gets exactly the formula's value
    inverse, num_groups = group_index(r, group_ids)
    k = float(num_virtual)
    count = torch.zeros(num_groups, dtype=r.dtype, device=r.device).index_add_(
        0, inverse, torch.ones_like(r)
    ) + k
    total = torch.zeros_like(count).index_add_(0, inverse, r) + k * r_max
    mean = total / count
    sq = torch.zeros_like(count).index_add_(0, inverse, (r - mean[inverse]) ** 2)
    sq = sq + k * (r_max - mean) ** 2
    std = (sq / (count - 1).clamp(min=1)).sqrt()
    centred = r - mean[inverse]
    return finalize_advantages(centred / (std[inverse] + eps) if scale_rewards else centred, r_in)


# --------------------------------------------------------------------------------------------
# BNPO
# --------------------------------------------------------------------------------------------


class BNPOState(EstimatorState):
    """Running method-of-moments estimate of the Beta law of per-prompt success rates.

    ``mean`` and ``var`` are exponential moving averages (weight ``momentum`` on the past) of the
    batch mean and unbiased variance of the group success rates p_g; ``None`` until a batch
    with at least two groups has been seen.
    """

    def __init__(self) -> None:
        self.mean: float | None = None
        self.var: float | None = None
        self.updates = 0

    def update(self, mean: float, var: float, momentum: float) -> None:
        if self.mean is None or self.var is None:
            self.mean, self.var = float(mean), float(var)
        else:
            self.mean = momentum * self.mean + (1 - momentum) * float(mean)
            self.var = momentum * self.var + (1 - momentum) * float(var)
        self.updates += 1

    def beta_params(self) -> tuple[float, float]:
        """The normalising Beta(alpha, beta) (see :func:`bnpo`); (1, 1) before any data."""
        if self.mean is None or self.var is None:
            return 1.0, 1.0
        m, v = self.mean, max(self.var, 1e-12)
        factor = m * (1 - m) / v - 1  # a + b of the method-of-moments Beta(a, b) fit
        return max(1 + factor * m / 3, 1.0), max(1 + factor * (1 - m) / 3, 1.0)

    def state_dict(self) -> dict:
        return {"mean": self.mean, "var": self.var, "updates": self.updates}

    def load_state_dict(self, d: dict) -> None:
        self.mean = None if d.get("mean") is None else float(d["mean"])
        self.var = None if d.get("var") is None else float(d["var"])
        self.updates = int(d.get("updates", 0))


@register_advantage("bnpo", inputs=("r_max",))
def bnpo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    eps: float = 1e-6,
    state: BNPOState | None = None,
    momentum: float = 0.9,
    r_min: float = 0.0,
    r_max: float = 1.0,
    max_weight: float = 1e6,
    **_,
) -> Tensor:
    """BNPO: the group baseline, divided by a Beta density fitted to the prompts' success rates.

    From "BNPO: Beta Normalization Policy Optimization" (Xiao et al., 2025), following the
    authors' ``compute_bnpo_outcome_advantage``. Rewards are mapped to [0, 1] with
    ``s = (r - r_min) / (r_max - r_min)``; p_g is the mean of s over group g. The p_g of the
    batch are summarised by their mean m and unbiased variance v; a method-of-moments fit
    Beta(a, b) of the p-distribution has ``a = (m(1-m)/v - 1) m``, ``b = (m(1-m)/v - 1)(1-m)``,
    and the normalising density is Beta(alpha, beta) with the paper's variance-minimising choice

        alpha = max(1 + a/3, 1),  beta = max(1 + b/3, 1)
        A_i   = (s_i - p_g) / f(p_g; alpha, beta),  f = Beta pdf,  1/f clamped to max_weight.

    This generalises REINFORCE and GRPO for binary rewards: alpha = beta = 1 gives ``s - p``
    (REINFORCE with a group baseline), alpha = beta = 3/2 gives ``(pi/8)(s - p)/sqrt(p(1-p))``,
    i.e. GRPO with the population std up to a constant.

    "Parameters updated during training": the authors refit (m, v) on every batch; here (m, v)
    are an EMA kept in ``state`` (``momentum`` on the past, the first batch taken as is), and
    ``momentum=0`` reproduces the per-batch refit (then ``state`` may be omitted). A batch with
    fewer than two groups does not update (m, v); before any update alpha = beta = 1.
    Differences from the authors' code: a single-sample group's baseline is its own reward
    (advantage 0; theirs uses 0), and v is floored at 1e-12. An all-equal group gets exactly 0
    (float64 statistics, :func:`~mmrl.core.advantages.constant_groups`). Not implemented: the paper's
    advantage decomposition for multi-component rewards (BNPO per component, then averaged).
    """
    if state is None:
        if momentum != 0:
            raise ValueError(
                "bnpo keeps running Beta moments: pass state=make_advantage_state('bnpo') "
                "(and save it with the checkpoint), or momentum=0 to refit on each batch"
            )
        state = BNPOState()
    if not r_max > r_min:
        raise ValueError(f"bnpo needs r_max > r_min, got r_min={r_min}, r_max={r_max}")
    r_in = as_float_tensor(rewards)
    r = r_in.to(torch.float64)
    inverse, num_groups = group_index(r, group_ids)
    s = (r - r_min) / (r_max - r_min)
    count = torch.zeros(num_groups, dtype=r.dtype, device=r.device).index_add_(
        0, inverse, torch.ones_like(r)
    )
    p = torch.zeros_like(count).index_add_(0, inverse, s) / count
    tol = 1e-6
    if p.numel() and (p.min() < -tol or p.max() > 1 + tol):
        raise ValueError(
            f"bnpo: group mean rewards span [{float(p.min() * (r_max - r_min) + r_min):.4g}, "
            f"{float(p.max() * (r_max - r_min) + r_min):.4g}], outside [r_min, r_max] = "
            f"[{r_min}, {r_max}]; set r_min/r_max to the reward's range"
        )
    p = p.clamp(0, 1)
    if num_groups >= 2:
        state.update(float(p.mean()), float(p.var()), momentum)
    alpha, beta = state.beta_params()
    a = torch.tensor(alpha, dtype=r.dtype, device=r.device)
    b = torch.tensor(beta, dtype=r.dtype, device=r.device)
    log_beta_fn = torch.lgamma(a) + torch.lgamma(b) - torch.lgamma(a + b)
    log_pdf = torch.xlogy(a - 1, p) + torch.xlogy(b - 1, 1 - p) - log_beta_fn
    weight = torch.exp(-log_pdf).clamp(max=max_weight)
    return finalize_advantages(weight[inverse] * (s - p[inverse]), r_in, constant_groups(r_in, group_ids))


bnpo.make_state = BNPOState


# --------------------------------------------------------------------------------------------
# Stratified GRPO
# --------------------------------------------------------------------------------------------


@register_advantage("stratified_grpo", inputs=("task_ids",))
def stratified_grpo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    eps: float = 1e-6,
    task_ids: Tensor | None = None,
    strata: Tensor | None = None,
    alpha: float = 1.0,
    **_,
) -> Tensor:
    """Stratified advantage normalisation, blended with global normalisation.

    After "Stratified GRPO: Handling Structural Heterogeneity in Reinforcement Learning of LLM
    Search Agents" (Zhu et al., 2025): standardising one batch that mixes structurally different
    trajectories lets the high-variance kind set the scale for all; normalising within strata
    of similar trajectories removes that cross-stratum bias. Here, for a stratum label c_i
    (``strata``, else ``task_ids``):

        u_i        = r_i - mean_g(r)                                  (group-mean residual)
        A_strat_i  = (u_i - mean_{c_i}(u)) / (std_{c_i}(u) + eps)     (within the stratum)
        A_global_i = (u_i - mean_B(u)) / (std_B(u) + eps)             (over the batch)
        A_i        = alpha * A_strat_i + (1 - alpha) * A_global_i

    ``alpha=1`` (default) is purely stratified, so each task of a mixed-task batch gets unit
    std whatever its reward scale. Without labels the result is ``A_global``. The paper's strata
    are structural (e.g. the number of search calls of an agent trajectory) and it normalises
    raw rewards within strata; we subtract the group mean first so the prompt's difficulty is
    removed before pooling groups, and take any integer label as the stratum (task id, tool-call
    count, ...). An all-equal group gets exactly 0 (its residuals are 0; the stratum and batch
    means of residuals are 0 up to rounding, which float64 and the constant-group rule remove).
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"stratified_grpo alpha must be in [0, 1], got {alpha}")
    r = as_float_tensor(rewards)
    mean_g, _, _ = group_stats(r, group_ids)
    u = r.to(torch.float64) - mean_g
    zero = constant_groups(r, group_ids)
    a_global = _whiten(u, eps).to(torch.float64)
    labels = strata if strata is not None else task_ids
    if labels is None:
        return finalize_advantages(a_global, r, zero)
    labels = torch.as_tensor(labels, device=r.device)
    if labels.shape != r.shape:
        raise ValueError(
            f"task_ids/strata must have one label per sample: {tuple(labels.shape)} vs {tuple(r.shape)}"
        )
    mean_c, std_c, _ = group_stats(u, labels)
    a_strat = (u - mean_c) / (std_c + eps)
    return finalize_advantages(alpha * a_strat + (1 - alpha) * a_global, r, zero)


# --------------------------------------------------------------------------------------------
# SPO
# --------------------------------------------------------------------------------------------


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


@register_advantage("spo", inputs=("prompt_keys", "policy_kl"))
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
    **_,
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
    adv = _whiten(r64 - baseline[inverse], eps).to(r.dtype)

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


spo.make_state = SPOState
