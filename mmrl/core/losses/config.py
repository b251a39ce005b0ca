"""Hyper-parameters of the policy loss (:class:`ObjectiveConfig`), validated when built."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

from mmrl.config.schema import LossConfig
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
class ObjectiveConfig(LossConfig):
    """Hyper-parameters of :func:`policy_loss`: the loss's config fields (:class:`LossConfig`,
    declared once in the schema, so ``algo.*`` and the objective cannot drift apart) and the
    completion-length divisor the policy knows. Every zoo field defaults to "off", which is the
    plain PPO/GRPO/DAPO clipped surrogate."""

    max_completion_length: Optional[int] = None  # constant divisor for seq_mean_token_sum_norm
    # The actions are reference completions (``mmrl sft``): the loss is their negative log-likelihood
    # alone, aggregated as ``loss_agg_mode`` says; no ratio, advantage, clip or penalty applies.
    likelihood: bool = False

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
    def needs_reference(self) -> bool:
        """True when the loss has a KL to the reference (``beta > 0``): the policy then hands the
        objective the reference's log-probs, or its Gaussian actions (:class:`~.penalties.GaussianActions`)."""
        return self.beta > 0

    @property
    def requires(self) -> tuple[str, ...]:
        """What the loss ``loss_type`` needs the policy to compute (``register_loss(requires=)``)."""
        return LOSSES.get(self.loss_type).loss_requires

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
    def reference_likelihood(cls) -> "ObjectiveConfig":
        """``mmrl sft``'s loss: the mean NLL of the reference completions' tokens (``token_mean``,
        so the micro-batches of a mini-batch add up to its mean)."""
        return cls(loss_agg_mode="token_mean", likelihood=True)

    @classmethod
    def from_algo(cls, algo: LossConfig, max_completion_length: Optional[int] = None) -> "ObjectiveConfig":
        """Build from the run's ``AlgoConfig`` (any :class:`LossConfig`): every loss field, by name."""
        return cls(**{f.name: getattr(algo, f.name) for f in fields(LossConfig)},
                   max_completion_length=max_completion_length)
