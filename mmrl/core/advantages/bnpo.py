"""BNPO: the group baseline divided by a Beta density fitted to the success rates."""

from __future__ import annotations

import torch
from torch import Tensor

from mmrl.registry import register_advantage

from .base import EstimatorState, as_float_tensor, constant_groups, finalize_advantages, group_index


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


@register_advantage("bnpo", inputs=("r_max",), make_state=BNPOState)
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
