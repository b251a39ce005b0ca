"""Rollout engines of the VLM policy (``rollout.engine``): what generates the completions.

An engine turns chat prompts into samples (prompt ids, completion ids, whether the completion was
cut at the length limit, the prompt's pixel patches, optionally its own log-probs); the policy
scores and trains on them. Built in: ``hf`` (transformers ``generate`` on the policy's module,
:mod:`.hf`) and ``vllm`` (vLLM colocated in the training process, :mod:`.vllm_engine`; needs vLLM,
imported only when chosen) and ``vllm_server`` (vLLM's own servers over HTTP, :mod:`.vllm_server`;
no vLLM needed in the training process). An engine registers with ``@register_engine(name)``.
"""

from .base import RolloutEngine, Sampling
from .hf import HFGenerate
from .vllm_engine import VLLMEngine
from .vllm_server import VLLMServerEngine

__all__ = ["RolloutEngine", "Sampling", "HFGenerate", "VLLMEngine", "VLLMServerEngine"]
