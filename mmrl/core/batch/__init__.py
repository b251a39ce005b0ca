"""Building the batch a step trains on: prompt sampling, perturbation sampling, scoring, guidance
re-rolls, temporal contrast, reference completions, selection, reward aggregation, length shaping,
advantages -- each stage in its own module, ordered once in :mod:`.pipeline`.

Importing this package registers the built-in prompt samplers and batch selections.
"""

from .aggregation import AGGREGATION_MODES, aggregate_rewards
from .pipeline import BatchBuilder
from .prompts import PromptSampler, make_sampler
from .selection import dynamic_sampling, group_has_variance
from .weighted import WeightedSourceSampler

__all__ = ["AGGREGATION_MODES", "BatchBuilder", "PromptSampler", "aggregate_rewards", "dynamic_sampling",
           "group_has_variance", "make_sampler", "WeightedSourceSampler"]
