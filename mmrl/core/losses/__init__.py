"""The policy loss: a registered surrogate (``algo.loss_type``) plus what every loss shares.

- :mod:`.config`: :class:`ObjectiveConfig`, the loss's hyper-parameters;
- :mod:`.surrogates`: the core's registered losses (clip, gspo, cispo, reg_grpo) and their math;
- :mod:`.selection`: batch-dependent token selections (top-entropy, Clip-Cov, KL-Cov);
- :mod:`.objective`: :func:`policy_loss` / :class:`Objective`, aggregation and the KL estimators.
"""

from .config import KL_ESTIMATORS, LOSS_AGG_MODES, ObjectiveConfig
from .objective import Objective, aggregate, count_sequences, kl_penalty, policy_loss, rollout_is_weight
from .selection import TokenSelection, select_tokens, token_covariance
from .surrogates import Surrogate, off_policy_shaped_loss

__all__ = [
    "KL_ESTIMATORS", "LOSS_AGG_MODES", "Objective", "ObjectiveConfig", "Surrogate", "TokenSelection",
    "aggregate", "count_sequences", "rollout_is_weight", "kl_penalty", "off_policy_shaped_loss", "policy_loss", "select_tokens",
    "token_covariance",
]
