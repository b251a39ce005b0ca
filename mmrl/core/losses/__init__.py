"""The policy loss: a registered surrogate (``algo.loss_type``) composed with what every loss shares.

- :mod:`.config`: :class:`ObjectiveConfig`, the loss's hyper-parameters;
- :mod:`.ratios`: the token and sequence ratios, the rollout engine's importance-sampling weight;
- :mod:`.clipping`: the clip modes (bounds, clipped surrogate with dual-clip, clip events);
- :mod:`.surrogates`: the core's registered losses (clip, gspo, cispo, reg_grpo), off-policy shaping;
- :mod:`.selection`: batch-dependent token selections (top-entropy, Clip-Cov, KL-Cov);
- :mod:`.penalties`: the KL to the reference (estimators, closed form), KL-Cov, the entropy bonus;
- :mod:`.aggregation`: the per-token loss to a scalar (``loss_agg_mode``);
- :mod:`.metrics`: the metrics of a call;
- :mod:`.objective`: :func:`policy_loss` / :class:`Objective`, composing the pieces above.
"""

from .aggregation import aggregate, count_sequences
from .config import KL_ESTIMATORS, LOSS_AGG_MODES, ObjectiveConfig
from .objective import Objective, policy_loss
from .penalties import GaussianActions, gaussian_kl, kl_penalty
from .ratios import rollout_is_weight
from .selection import TokenSelection, select_tokens, token_covariance
from .surrogates import Surrogate, off_policy_shaped_loss

__all__ = [
    "KL_ESTIMATORS", "LOSS_AGG_MODES", "GaussianActions", "Objective", "ObjectiveConfig", "Surrogate",
    "TokenSelection", "aggregate", "count_sequences", "gaussian_kl", "kl_penalty", "off_policy_shaped_loss",
    "policy_loss", "rollout_is_weight", "select_tokens", "token_covariance",
]
