"""The "policy-optimisation zoo": loss variants and token selections behind
:class:`~mmrl.core.objective.ObjectiveConfig`.

:func:`mmrl.core.objective.policy_loss` dispatches here; every function works on (B, T)
per-token tensors (a token is any action with a log-probability: a generated token or a
denoising transition) and returns a (B, T) per-token loss that ``aggregate`` reduces, so every
variant respects ``loss_agg_mode`` and the gradient-accumulation normalisers.

Papers (titles, so they can be looked up):

- GSPO: "Group Sequence Policy Optimization" (Zheng et al., 2025).
- Reg-GRPO: "DeepVideo-R1: Video Reinforcement Fine-Tuning via Difficulty-aware Regressive GRPO"
  (Park et al., 2025).
- CISPO: "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention"
  (MiniMax, 2025).
- Asymmetric clipping: "NGRPO: Negative-enhanced Group Relative Policy Optimization" (2025).
- Dual-clip: "Mastering Complex Control in MOBA Games with Deep Reinforcement Learning"
  (Ye et al., 2020), in verl's form.
- Top-entropy token mask: "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
  Reinforcement Learning for LLM Reasoning" (Wang et al., 2025).
- Clip-Cov / KL-Cov: "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
  Models" (Cui et al., 2025): the token choices as in the authors' verl code; KL-Cov's
  objective (unclipped surrogate plus the penalty) is in :func:`mmrl.core.objective.policy_loss`.
- Off-policy guidance: "TempSamp-R1: Effective Temporal Sampling with Reinforcement Fine-Tuning
  for Video LLMs" (ground-truth solutions injected into each group), weighted with the policy
  shaping of "Learning to Reason under Off-Policy Guidance" (LUFFY, Yan et al., 2025).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

import torch
from torch import Tensor

if TYPE_CHECKING:  # pragma: no cover
    from .objective import ObjectiveConfig

__all__ = [
    "LOSS_TYPES",
    "clip_bounds",
    "clipped_surrogate",
    "gspo_ratio",
    "reg_grpo_loss",
    "cispo_loss",
    "off_policy_shaped_loss",
    "token_covariance",
    "top_entropy_mask",
    "clip_cov_mask",
    "kl_cov_mask",
    "TokenSelection",
    "select_tokens",
]

# awm / nft are generator objectives (mmrl.diffusion): awm is the clip surrogate over a
# flow-matching log-likelihood the policy computes; nft is computed by the policy itself.
LOSS_TYPES = ("clip", "gspo", "reg_grpo", "cispo", "awm", "nft")
POLICY_DEFINED_LOSS_TYPES = ("awm", "nft")

Bound = Union[float, Tensor]


# ---- clipping --------------------------------------------------------------------------------


def clip_bounds(
    advantages: Tensor,
    epsilon: float,
    epsilon_high: float,
    clip_pos: Optional[tuple[float, float]] = None,
    clip_neg: Optional[tuple[float, float]] = None,
) -> tuple[Bound, Bound]:
    """Ratio bounds ``(low, high)`` of the clipped surrogate.

    Without overrides: the python floats ``1 - epsilon, 1 + epsilon_high`` (the PPO/DAPO path,
    unchanged). Asymmetric clipping (NGRPO, "NGRPO: Negative-enhanced Group Relative Policy
    Optimization": looser updates for positive samples): ``clip_pos = (eps_low, eps_high)`` is
    used where A >= 0 and ``clip_neg = (eps_low, eps_high)`` where A < 0; a side left ``None``
    falls back to ``(epsilon, epsilon_high)``. The result is then a tensor broadcastable to the
    ratio. Under the PPO ``min`` only the upper bound binds for A > 0 and only the lower bound
    for A < 0, so effectively ``clip_pos[1]`` and ``clip_neg[0]`` matter there (CISPO clips its
    weight on both sides, so both numbers matter for it).
    """
    if clip_pos is None and clip_neg is None:
        return 1 - epsilon, 1 + epsilon_high
    pos = clip_pos if clip_pos is not None else (epsilon, epsilon_high)
    neg = clip_neg if clip_neg is not None else (epsilon, epsilon_high)
    is_pos = advantages >= 0
    like = advantages
    low = torch.where(is_pos, like.new_tensor(1 - pos[0]), like.new_tensor(1 - neg[0]))
    high = torch.where(is_pos, like.new_tensor(1 + pos[1]), like.new_tensor(1 + neg[1]))
    return low, high


def clipped_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    low: Bound,
    high: Bound,
    dual_clip_c: Optional[float] = None,
) -> tuple[Tensor, Optional[Tensor]]:
    """Per-token clipped surrogate loss ``-min(ratio*A, clamp(ratio, low, high)*A)``.

    Dual-clip ("Mastering Complex Control in MOBA Games with Deep Reinforcement Learning", as in
    verl): for A < 0 the PPO loss ``|A| * max(ratio, clamp(ratio))`` is unbounded in the ratio;
    with ``dual_clip_c = c > 1`` it is capped at ``c * |A|``:

        pg = min(pg_clip, -c * A)   where A < 0;   pg = pg_clip  otherwise

    and the capped tokens get no gradient. Returns ``(pg, dual_clipped)``, the second a bool
    (B, T) mask of capped tokens (``None`` without dual-clip).
    """
    pg = -torch.min(ratio * advantages, torch.clamp(ratio, low, high) * advantages)
    if dual_clip_c is None:
        return pg, None
    cap = -advantages * dual_clip_c
    dual = (advantages < 0) & (pg > cap)
    return torch.where(advantages < 0, torch.min(pg, cap), pg), dual


# ---- sequence-level and clip-free losses ----------------------------------------------------------


def _seq_mean(x: Tensor, mask: Tensor) -> Tensor:
    """(B,) masked mean over T (0 for a sequence with no tokens)."""
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def gspo_ratio(logps: Tensor, old_logps: Tensor, mask: Tensor) -> Tensor:
    """GSPO-token importance ratio ("Group Sequence Policy Optimization"), shape (B, T).

    The sequence ratio is length-normalised, a geometric mean of the token ratios:

        s_i = (pi(y_i) / pi_old(y_i)) ** (1/|y_i|) = exp( (1/|y_i|) sum_t (logp - old_logp) )

    and the token form ``s_{i,t} = sg[s_i] * pi(y_it) / sg[pi(y_it)]`` has the *value* s_i on
    every token of sequence i while its gradient flows through token t only:
    ``d s_{i,t} / d logp_t = s_i``. Used in the clipped surrogate with a sequence advantage this
    is exactly GSPO (the whole sequence is clipped or not); with per-token advantages it is the
    paper's GSPO-token.
    """
    seq_log_ratio = _seq_mean(logps - old_logps, mask)
    return torch.exp(logps - logps.detach() + seq_log_ratio.detach().unsqueeze(-1))


def reg_grpo_loss(
    logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, reg_scale: float
) -> Tensor:
    """Reg-GRPO ("DeepVideo-R1: Video Reinforcement Fine-Tuning via Difficulty-aware Regressive
    GRPO"): regress the advantage directly, with no clip and no min.

    The KL-regularised optimum ``pi* ∝ pi_old * exp(A / beta)`` says the (length-normalised)
    log-ratio of sequence i should equal ``A_i / beta``. With
    ``r_i = (1/|y_i|) sum_t (logp - old_logp)`` and ``beta = reg_scale``:

        l_i = (reg_scale / 2) * (r_i - A_i / reg_scale) ** 2
            = (reg_scale * r_i - A_i) ** 2 / (2 * reg_scale)

    i.e. the squared error between the predicted advantage ``reg_scale * r_i`` and A_i, scaled by
    ``1 / (2 * reg_scale)`` so that on-policy (r_i = 0) the gradient is exactly GRPO's
    ``-A_i * grad r_i`` (learning rates transfer); past the target the gradient reverses, which is
    the built-in trust region that replaces the clip. ``l_i`` is broadcast to every token of
    sequence i; with ``seq_mean_token_mean`` the loss is ``mean_i l_i``. (B, T) advantages are
    reduced to their per-sequence masked mean.
    """
    if advantages.shape[-1] != 1:
        adv = _seq_mean(advantages, mask)
    else:
        adv = advantages.squeeze(-1)
    r = _seq_mean(logps - old_logps, mask)
    per_seq = 0.5 * reg_scale * (r - adv / reg_scale) ** 2
    return per_seq.unsqueeze(-1).expand_as(logps)


def cispo_loss(ratio: Tensor, logps: Tensor, advantages: Tensor, low: Bound, high: Bound) -> Tensor:
    """CISPO ("MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention"):
    clip the importance-sampling *weight*, never drop a token's gradient:

        J = sum_t sg[clamp(ratio, low, high)] * A * log pi(y_t)

    Per token we return ``-A * sg[w] * (1 + logp - sg[logp])`` with ``w = clamp(ratio)``: its
    gradient is the paper's ``-A * w * grad logp`` and its value is the readable ``-A * w``
    (MiniMax/verl's ``-A * w * logp`` differs only by a constant for the gradient). The paper
    uses no lower bound: set ``epsilon = 1`` (low = 0) and tune ``epsilon_high``.
    """
    w = torch.clamp(ratio, low, high).detach()
    return -advantages * w * (1 + logps - logps.detach())


def off_policy_shaped_loss(logps: Tensor, advantages: Tensor, gamma: float) -> Tensor:
    """Per-token policy-gradient loss of off-policy samples (B, T): completions the policy did not
    generate, e.g. the ground-truth solutions that "TempSamp-R1: Effective Temporal Sampling with
    Reinforcement Fine-Tuning for Video LLMs" injects into each GRPO group.

    Importance weighting of "Learning to Reason under Off-Policy Guidance" (LUFFY): the behaviour
    probability of an off-policy token is taken as 1, so its importance weight is the current
    token probability ``p = exp(logp)``, regularised by policy shaping ``f(p) = p / (p + gamma)``
    and never clipped:

        pg_off = -f(p) * A = -A * p / (p + gamma)
        d pg_off / d logp = -A * gamma * p / (p + gamma) ** 2

    Plain ``-p * A`` would give gradient ``-A * p``, vanishing on the low-probability tokens
    that the guidance should teach; the shaping moves the gradient's peak to ``p = gamma``
    (``gamma = 0.1`` in LUFFY), up-weighting them. E.g. p = 0.5, gamma = 0.1, A = 2:
    ``pg_off = -2 * 0.5 / 0.6 = -1.6667`` and the gradient is ``-2 * 0.1 * 0.5 / 0.36 = -0.2778``.

    ``advantages`` is (B,), (B, 1) or (B, T); the result has the shape of ``logps``.
    """
    if advantages.dim() == 1 and logps.dim() == 2:
        advantages = advantages.unsqueeze(-1)
    p = torch.exp(logps)
    return -(p / (p + gamma)) * advantages.to(logps.dtype)


# ---- token selections ------------------------------------------------------------------------


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def token_covariance(logps: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Centred per-token covariance term of "The Entropy Mechanism of Reinforcement Learning for
    Reasoning Language Models": ``cov_t = (logp_t - mean(logp)) * (A_t - mean(A))``, means over
    the masked tokens of the batch (a sequence advantage counts once per token). (B, T), no grad.
    """
    logps, advantages = logps.detach(), advantages.detach().expand_as(logps)
    return (logps - _masked_mean(logps, mask)) * (advantages - _masked_mean(advantages, mask))


def top_entropy_mask(entropies: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """Tokens in the top ``quantile`` fraction of entropy among the masked tokens ("Beyond the
    80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement Learning for LLM
    Reasoning"): ``H_t >= tau``, ``tau`` = the ``1 - quantile`` quantile of ``H[mask]`` with
    linear interpolation (``torch.quantile``'s default; ties at tau are kept). Padding never counts toward tau nor is selected.
    Returns a bool (B, T) mask.
    """
    valid = mask > 0
    if not bool(valid.any()):
        return valid
    h = entropies.detach().to(torch.promote_types(entropies.dtype, torch.float32))
    # torch.quantile's "linear" rule, by sorting (torch.quantile refuses inputs > 2**24 elements)
    v = h[valid].sort().values
    pos = (1 - quantile) * (v.numel() - 1)
    lo = int(pos)
    hi = min(lo + 1, v.numel() - 1)
    tau = v[lo] + (pos - lo) * (v[hi] - v[lo])
    return (h >= tau) & valid


def clip_cov_mask(
    cov: Tensor,
    mask: Tensor,
    clipped: Tensor,
    ratio: float,
    lb: float,
    ub: float,
    generator: Optional[torch.Generator] = None,
) -> Tensor:
    """Clip-Cov token choice (authors' verl code): among masked tokens not already clipped by
    PPO with ``lb < cov < ub``, pick ``min(max(int(ratio * n_tokens), 1), n_candidates)``
    uniformly at random (``torch.randperm`` with ``generator``). Returns a bool (B, T) mask of the
    tokens whose policy-gradient term is dropped."""
    valid = mask > 0
    cand = valid & ~clipped & (cov > lb) & (cov < ub)
    out = torch.zeros_like(valid)
    idx = cand.flatten().nonzero().squeeze(-1)
    if idx.numel() == 0:
        return out
    k = min(max(int(ratio * int(valid.sum())), 1), idx.numel())
    device = generator.device if generator is not None else "cpu"
    perm = torch.randperm(idx.numel(), generator=generator, device=device)
    out.view(-1)[idx[perm[:k].to(idx.device)]] = True
    return out


def kl_cov_mask(cov: Tensor, mask: Tensor, ratio: float) -> Tensor:
    """KL-Cov token choice (authors' verl code): the ``max(int(ratio * n_tokens), 1)`` masked tokens
    with the largest covariance (``torch.topk``). Returns a bool (B, T) mask."""
    valid = mask > 0
    out = torch.zeros_like(valid)
    n = int(valid.sum())
    if n == 0:
        return out
    idx = valid.flatten().nonzero().squeeze(-1)
    k = max(int(ratio * n), 1)
    top = torch.topk(cov.flatten()[idx], k, largest=True).indices
    out.view(-1)[idx[top]] = True
    return out


@dataclass
class TokenSelection:
    """Batch-dependent token choices, computed once on a whole mini-batch by :func:`select_tokens`
    and sliced per micro-batch (``sel[rows]``) so gradient accumulation stays exact.

    Each field is a bool (B, T) mask or ``None`` (not used):

    - ``entropy_keep``: top-entropy tokens; the others get no policy-gradient term.
    - ``clip_cov``: Clip-Cov tokens; their policy-gradient term is dropped.
    - ``kl_cov``: KL-Cov tokens; they get the extra ``kl_cov_coef * |logp - old_logp|``.
    """

    entropy_keep: Optional[Tensor] = None
    clip_cov: Optional[Tensor] = None
    kl_cov: Optional[Tensor] = None

    def pg_weight(self, like: Tensor) -> Optional[Tensor]:
        """(B, T) 0/1 multiplier of the policy-gradient term, or ``None`` for all ones."""
        w = None
        if self.entropy_keep is not None:
            w = self.entropy_keep.to(like.dtype)
        if self.clip_cov is not None:
            keep = (~self.clip_cov).to(like.dtype)
            w = keep if w is None else w * keep
        return w

    def _map(self, fn: Any) -> "TokenSelection":
        return TokenSelection(*(None if x is None else fn(x)
                                for x in (self.entropy_keep, self.clip_cov, self.kl_cov)))

    def __getitem__(self, rows: Any) -> "TokenSelection":
        return self._map(lambda x: x[rows])

    def to(self, device: Any) -> "TokenSelection":
        return self._map(lambda x: x.to(device))


@torch.no_grad()
def select_tokens(
    cfg: "ObjectiveConfig",
    logps: Tensor,
    old_logps: Optional[Tensor],
    advantages: Tensor,
    mask: Tensor,
    entropies: Optional[Tensor] = None,
    generator: Optional[torch.Generator] = None,
) -> TokenSelection:
    """The batch-dependent token selections that ``cfg`` asks for (top-entropy, Clip-Cov,
    KL-Cov), from (B, T) values of the whole mini-batch. Call it before micro-batching and pass
    ``selection=sel[rows]`` to each :func:`~mmrl.core.objective.policy_loss` call: the quantile
    threshold and the covariance means then come from the mini-batch, and the micro-batch losses
    sum to the mini-batch loss exactly. (Without it, ``policy_loss`` selects within each call,
    as verl does per micro-batch.)

    ``logps`` are the current policy's log-probs (values only); ``old_logps=None`` means
    on-policy (ratio 1: nothing is PPO-clipped). ``entropies`` are needed for
    ``top_entropy_quantile``. ``generator`` seeds Clip-Cov's random pick.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    logps = logps.detach()
    advantages = advantages.to(logps.dtype)
    mask = mask.to(logps.dtype)
    sel = TokenSelection()
    if cfg.top_entropy_quantile is not None:
        if entropies is None:
            raise ValueError("top_entropy_quantile needs per-token entropies (cfg.needs_entropy)")
        sel.entropy_keep = top_entropy_mask(entropies, mask, cfg.top_entropy_quantile)
    if cfg.clip_cov_ratio is not None or cfg.kl_cov_ratio is not None:
        cov = token_covariance(logps, advantages, mask)
        if cfg.clip_cov_ratio is not None:
            if old_logps is None:
                clipped = torch.zeros_like(mask, dtype=torch.bool)
            else:
                r = torch.exp(logps - old_logps.detach())
                low, high = clip_bounds(advantages, cfg.epsilon, cfg.clip_high, cfg.clip_pos, cfg.clip_neg)
                pg1, pg2 = -advantages * r, -advantages * torch.clamp(r, low, high)
                clipped = pg2 > pg1
            sel.clip_cov = clip_cov_mask(cov, mask, clipped, cfg.clip_cov_ratio, cfg.clip_cov_lb,
                                         cfg.clip_cov_ub, generator)
        if cfg.kl_cov_ratio is not None:
            sel.kl_cov = kl_cov_mask(cov, mask, cfg.kl_cov_ratio)
    return sel
