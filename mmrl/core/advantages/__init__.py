"""Group-relative advantage estimators, each a registered pure function citing its paper.

- :mod:`.base`: group statistics (float64), the constant-group rule, whitening, the state base
  class, :func:`compute_advantages` / :func:`make_advantage_state` (lookup by name);
- :mod:`.group`: GRPO, Dr. GRPO, RLOO; :mod:`.reinforce`: REINFORCE++; :mod:`.ngrpo`;
  :mod:`.bnpo`; :mod:`.stratified`; :mod:`.spo`; :mod:`.episode`: episode-level GRPO and GiGPO
  for multi-step environment episodes (one row per step).

Importing this package registers them all.
"""

from .base import (
    EstimatorState,
    as_float_tensor,
    compute_advantages,
    constant_groups,
    estimator_options,
    finalize_advantages,
    group_index,
    group_stats,
    make_advantage_state,
    whiten_batch,
)
from .bnpo import BNPOState, bnpo
from .episode import episode_grpo, gigpo
from .group import dr_grpo, grpo, rloo
from .ngrpo import ngrpo
from .reinforce import reinforce_pp
from .spo import SPOState, spo
from .stratified import stratified_grpo

__all__ = [
    "EstimatorState", "BNPOState", "SPOState", "as_float_tensor", "compute_advantages", "constant_groups",
    "estimator_options", "finalize_advantages", "group_index", "group_stats", "make_advantage_state", "whiten_batch",
    "grpo", "dr_grpo", "rloo", "reinforce_pp", "ngrpo", "bnpo", "stratified_grpo", "spo",
    "episode_grpo", "gigpo",
]
