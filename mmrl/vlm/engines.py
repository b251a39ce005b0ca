"""Rollout engines of the VLM policy (``rollout.engine``): what generates the completions.

An engine turns chat prompts into samples (prompt ids, completion ids, whether the completion was
cut at the length limit, the prompt's pixel patches); the policy scores and trains on them. HF
``generate`` is built in; an engine registers with ``@register_engine(name)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from mmrl.registry import register_engine

from .processing import split_patches


@dataclass(frozen=True)
class Sampling:
    """How one rollout samples: the training settings (``rollout.*``) or the eval ones."""

    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    batch_size: int


class RolloutEngine:
    """Generates for a :class:`~mmrl.vlm.policy.VLMPolicy`. ``generate`` returns one dict per
    prompt with ``prompt_ids``, ``completion_ids`` (up to and including the first stop token),
    ``truncated``, ``pixel_values`` and ``image_grid_thw``, and optionally ``logprobs`` (the engine's
    own log-probs of the completion tokens, float32, one per completion id: the policy then
    corrects for the engine/trainer mismatch, or uses them as old log-probs with
    ``rollout.use_engine_logprobs``); ``sync_weights`` is called after every optimizer step (an
    engine that holds its own copy of the weights reloads them there)."""

    def __init__(self, policy):
        self.policy = policy

    def generate(self, prompts: Sequence[list[dict]], sampling: Sampling) -> list[dict]:
        raise NotImplementedError

    def sync_weights(self) -> None:
        """Nothing to do for an engine that generates from the policy's own module."""

    def completion_length(self, completion: torch.Tensor) -> tuple[int, bool]:
        """Tokens up to and including the first stop token; ``(length, stopped)``. A completion
        without one ran the whole budget."""
        for t, tok in enumerate(completion.tolist()):
            if tok in self.policy.eos_ids:
                return t + 1, True
        return len(completion), False


@register_engine("hf")
class HFGenerate(RolloutEngine):
    """transformers' ``generate`` on the policy's module, in batches of ``sampling.batch_size``.

    Vision placeholder tokens are suppressed (one in a completion would make re-scoring fail with
    "image features and image tokens do not match"), and scoring masks them identically, so
    log-probs are those of the distribution actually sampled from."""

    @torch.no_grad()
    def generate(self, prompts: Sequence[list[dict]], sampling: Sampling) -> list[dict]:
        policy = self.policy
        model = policy.module
        model.eval()
        results: list[dict] = []
        for start in range(0, len(prompts), sampling.batch_size):
            chunk = prompts[start:start + sampling.batch_size]
            enc, images_per_sample = policy.encode_prompts(chunk)
            inputs = {k: v.to(policy.device) for k, v in enc.items()}
            gen_kwargs: dict[str, Any] = dict(max_new_tokens=sampling.max_new_tokens, pad_token_id=policy.pad_id,
                                              eos_token_id=sorted(policy.eos_ids),
                                              suppress_tokens=policy.suppressed_ids or None)
            if sampling.temperature > 0:
                # top_k=0 / top_p=1 explicitly: the checkpoint's generation_config may set its own
                # (transformers defaults top_k to 50), which would truncate what we sample from.
                gen_kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                                  top_k=sampling.top_k)
            else:
                gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
            with policy.autocast():
                out = model.generate(**inputs, **gen_kwargs).cpu()
            prompt_len = enc["input_ids"].shape[1]
            patches = split_patches(enc, images_per_sample)
            for i in range(len(chunk)):
                completion = out[i, prompt_len:]
                length, stopped = self.completion_length(completion)
                results.append({
                    "prompt_ids": enc["input_ids"][i][enc["attention_mask"][i].bool()],
                    "completion_ids": completion[:length].clone(),
                    "truncated": not stopped,
                    "pixel_values": patches[i][0],
                    "image_grid_thw": patches[i][1],
                })
        return results
