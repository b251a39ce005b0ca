"""Hyper-parameters of the policy loss (:class:`ObjectiveConfig`), validated when built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from mmrl.registry import LOSSES

KL_ESTIMATORS = ("k1", "k2", "k3")
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
LOSS_AGG_MODES = (
    "token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_mean",
    "seq_mean_token_sum_norm",
)


def check_choice(value: str, valid: tuple[str, ...], what: str) -> None:
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid values: {', '.join(valid)}")


# Zoo fields: (name, default); ``from_algo`` copies each one the algo object has.
VARIANT_FIELDS = (
    "loss_type", "reg_scale", "clip_pos", "clip_neg", "dual_clip_c", "entropy_coef",
    "top_entropy_quantile", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio",
    "kl_cov_coef", "kl_cov_clip", "off_policy_gamma", "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min",
)


def _fraction(value: Optional[float], what: str) -> None:
    if value is not None and not 0 < value <= 1:
        raise ValueError(f"{what} must be in (0, 1], got {value}")


def _pair(value: Any, what: str) -> Optional[tuple[float, float]]:
    if value is None:
        return None
    pair = tuple(float(v) for v in value)
    if len(pair) != 2:
        raise ValueError(f"{what} must be (eps_low, eps_high), got {value!r}")
    return pair  # type: ignore[return-value]


@dataclass
class ObjectiveConfig:
    """Hyper-parameters of :func:`policy_loss`. Every zoo field defaults to "off", which is the
    plain PPO/GRPO/DAPO clipped surrogate (bit-identical to the objective before the zoo)."""

    epsilon: float = 0.2  # lower clip: ratio >= 1 - epsilon
    epsilon_high: Optional[float] = None  # upper clip: ratio <= 1 + epsilon_high; None -> epsilon
    beta: float = 0.0  # KL weight; 0 disables the KL term (no reference model needed)
    kl_estimator: str = "k3"  # k1 | k2 | k3
    loss_agg_mode: str = "token_mean"  # see LOSS_AGG_MODES
    max_completion_length: Optional[int] = None  # constant divisor for seq_mean_token_sum_norm
    # ---- policy-optimisation zoo (see mmrl.core.losses) ----
    loss_type: str = "clip"  # a registered loss: clip | gspo | reg_grpo | cispo (core); awm | nft (generators)
    reg_scale: float = 10.0  # reg_grpo: beta of the regression target r_i = A_i / reg_scale
    clip_pos: Optional[tuple[float, float]] = None  # (eps_low, eps_high) where A >= 0 (NGRPO)
    clip_neg: Optional[tuple[float, float]] = None  # (eps_low, eps_high) where A < 0
    dual_clip_c: Optional[float] = None  # cap the loss of A < 0 tokens at c * |A| (c > 1, e.g. 3)
    entropy_coef: float = 0.0  # entropy bonus: loss -= entropy_coef * H (needs entropies)
    top_entropy_quantile: Optional[float] = None  # pg only on the top-q entropy tokens (e.g. 0.2)
    clip_cov_ratio: Optional[float] = None  # Clip-Cov: fraction of tokens to detach (e.g. 2e-4)
    clip_cov_lb: float = 1.0  # Clip-Cov candidates: clip_cov_lb < cov < clip_cov_ub
    clip_cov_ub: float = 5.0
    kl_cov_ratio: Optional[float] = None  # KL-Cov: fraction of top-cov tokens (e.g. 2e-3)
    kl_cov_coef: float = 1.0  # KL-Cov: weight of |logp - old_logp| on those tokens
    kl_cov_clip: bool = False  # KL-Cov keeps the PPO clip (off: the paper's unclipped -A * ratio)
    # ---- rollout-engine mismatch: truncated importance sampling (see rollout_is_weight) ----
    vllm_importance_sampling_correction: bool = True
    vllm_importance_sampling_mode: str = "token_truncate"
    vllm_importance_sampling_clip_max: Optional[float] = 2.0
    vllm_importance_sampling_clip_min: Optional[float] = None
    off_policy_gamma: float = 0.1  # LUFFY policy shaping f(p) = p / (p + gamma) of off-policy rows

    def __post_init__(self) -> None:
        # Fail when the config is built, not on the first training step.
        check_choice(self.kl_estimator, KL_ESTIMATORS, "kl_estimator")
        check_choice(self.loss_agg_mode, LOSS_AGG_MODES, "loss_agg_mode")
        check_choice(self.vllm_importance_sampling_mode, IS_MODES, "vllm_importance_sampling_mode")
        LOSSES.get(self.loss_type, "algo.loss_type")  # an unknown name fails here, naming the valid ones
        self.clip_pos = _pair(self.clip_pos, "clip_pos")
        self.clip_neg = _pair(self.clip_neg, "clip_neg")
        if self.reg_scale <= 0:
            raise ValueError(f"reg_scale must be > 0, got {self.reg_scale}")
        if self.off_policy_gamma <= 0:
            raise ValueError(f"off_policy_gamma must be > 0, got {self.off_policy_gamma}")
        if self.dual_clip_c is not None:
            if self.dual_clip_c <= 1:
                raise ValueError(f"dual_clip_c must be > 1, got {self.dual_clip_c}")
            if self.loss_type not in ("clip", "gspo"):
                raise ValueError("dual_clip_c applies to loss_type 'clip' or 'gspo' only")
            if self.unclipped:
                raise ValueError("dual_clip_c caps the clipped surrogate; KL-Cov (kl_cov_ratio) drops the clip "
                                 "unless kl_cov_clip=true")
        _fraction(self.top_entropy_quantile, "top_entropy_quantile")
        _fraction(self.clip_cov_ratio, "clip_cov_ratio")
        _fraction(self.kl_cov_ratio, "kl_cov_ratio")
        if self.loss_type == "reg_grpo" and (
            self.top_entropy_quantile is not None or self.clip_cov_ratio is not None
        ):
            raise ValueError(
                "top_entropy_quantile / clip_cov_ratio mask token-level policy-gradient terms; "
                "reg_grpo's loss is per sequence (use clip, gspo or cispo)"
            )

    @property
    def unclipped(self) -> bool:
        """KL-Cov in the paper's form: ``loss_type=clip`` becomes the unclipped ``-A * ratio``."""
        return self.loss_type == "clip" and self.kl_cov_ratio is not None and not self.kl_cov_clip

    @property
    def clip_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def needs_entropy(self) -> bool:
        """True when :func:`policy_loss` needs ``entropies`` (per-token entropy of the current
        policy: with gradient for the entropy bonus, values only for the top-entropy mask)."""
        return self.entropy_coef != 0 or self.top_entropy_quantile is not None

    @property
    def needs_selection(self) -> bool:
        """True when the loss uses batch-dependent token selections; compute them once per
        mini-batch with :func:`select_tokens` and pass ``selection=`` to every micro-batch."""
        return (
            self.top_entropy_quantile is not None
            or self.clip_cov_ratio is not None
            or self.kl_cov_ratio is not None
        )

    @classmethod
    def from_algo(cls, algo: Any, max_completion_length: Optional[int] = None) -> "ObjectiveConfig":
        """Build from an object with ``epsilon, epsilon_high, beta, kl_estimator, loss_agg_mode``
        attributes (e.g. the run's ``AlgoConfig``); each zoo field (``VARIANT_FIELDS``) is taken
        from ``algo`` when it has an attribute of that name, else left at its default."""
        extra = {name: getattr(algo, name) for name in VARIANT_FIELDS if hasattr(algo, name)}
        return cls(
            epsilon=algo.epsilon,
            epsilon_high=algo.epsilon_high,
            beta=algo.beta,
            kl_estimator=algo.kl_estimator,
            loss_agg_mode=algo.loss_agg_mode,
            max_completion_length=max_completion_length,
            **extra,
        )


