"""What a vLLM engine is sent and what it gives back, the same whether vLLM runs in the training
process (``rollout.engine=vllm``) or as servers (``rollout.engine=vllm_server``): the keys only the
hf engine reads refused, runs of one prompt grouped into one request with ``n`` samples, the
prompts encoded by the policy's processor beside the engine's request, disjoint seeds, and each
returned completion turned into the sample dict the policy trains on."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ...media.pixels import to_rgb
from ..processing import split_patches
from .base import Sampling


def refuse_hf_only_keys(r, engine: str) -> None:
    """The hf engine's keys are refused, not ignored (as hf refuses the vllm_* keys)."""
    from mmrl.config import ConfigError

    if not r.merge_lora_for_generation:
        raise ConfigError(f"rollout.merge_lora_for_generation=false: read only by rollout.engine=hf (this run uses "
                          f"rollout.engine={engine}, which always receives LoRA merged into its weights); "
                          "remove the key or set rollout.engine=hf")
    if r.max_time > 0:
        raise ConfigError("rollout.max_time: read only by rollout.engine=hf (transformers' max_time); remove "
                          "the key or set rollout.engine=hf")
    if r.cache_implementation == "static" or not r.compile_decode:
        raise ConfigError("rollout.cache_implementation / rollout.compile_decode: read only by rollout.engine=hf "
                          "(vLLM keeps its own paged KV cache and CUDA graphs); remove the keys or set "
                          "rollout.engine=hf")
    if not r.group_prefill:
        raise ConfigError(f"rollout.group_prefill=false: read only by rollout.engine=hf (rollout.engine={engine} "
                          "shares a group's prompt through vLLM's prefix caching, rollout.turn_cache); remove the "
                          "key or set rollout.engine=hf")
    if r.vllm_limit_images < 0:
        raise ValueError(f"rollout.vllm_limit_images={r.vllm_limit_images} must be >= 0")


def mm_processor_kwargs(vlm_cfg, processor) -> dict | None:
    """vLLM's image processor resizes as the policy's does: the image budget when
    vlm.min_pixels/max_pixels changed it (else the checkpoint's, which both read)."""
    if vlm_cfg.min_pixels is None and vlm_cfg.max_pixels is None:
        return None
    return {"size": dict(processor.image_processor.size)}


def group_prompts(prompts: Sequence[list[dict]]) -> list[tuple[list[dict], int]]:
    """Runs of the same prompt object (the policy repeats each prompt ``n`` times) as
    ``(prompt, n)``: one request with ``n`` samples, so the prompt and its image are processed once."""
    groups: list[tuple[list[dict], int]] = []
    for p in prompts:
        if groups and groups[-1][0] is p:
            groups[-1] = (p, groups[-1][1] + 1)
        else:
            groups.append((p, 1))
    return groups


def draw_seeds(groups: Sequence[tuple[Any, int]]) -> list[int]:
    """One seed per request from the step-seeded global torch RNG: reproducible, and a request
    with ``n`` samples uses seeds ``s..s+n-1`` (vLLM's parallel sampling; seed s+1 repeats seed s's
    samples shifted by one), so requests take disjoint ranges."""
    base = int(torch.randint(0, 2**62, (1,)))
    seeds, offset = [], 0
    for _, n in groups:
        seeds.append(base + offset)
        offset += n
    return seeds


def encode_requests(policy, prompts: Sequence[list[dict]], batch_size: int, engine: str,
                    request: Callable[[list[dict], list], Any]) -> list[dict]:
    """Per prompt: ``request(messages with image placeholders, RGB images)`` (what the engine is
    sent) and the ``prompt_ids``, ``pixel_values`` and ``image_grid_thw`` the policy's processor
    makes (what is trained on). Video prompts and more images than ``rollout.vllm_limit_images``
    are refused."""
    out = []
    limit = policy.cfg.rollout.vllm_limit_images
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        enc, images_per_sample = policy.encode_prompts(chunk)
        patches = split_patches(enc, images_per_sample)
        for i, messages in enumerate(chunk):
            clean, images, videos = policy.split_messages(messages)
            if videos:
                raise ValueError(f"rollout.engine={engine} takes image prompts only in this version; video "
                                 "tasks roll out with rollout.engine=hf")
            if len(images) > limit:
                raise ValueError(
                    f"a prompt has {len(images)} images but rollout.vllm_limit_images={limit} (vLLM's "
                    "limit_mm_per_prompt): raise it; a tool-use task adds up to max_turns x max_calls_per_turn "
                    "tool images to its prompt")
            out.append({"request": request(clean, [to_rgb(im) for im in images]),
                        "prompt_ids": enc["input_ids"][i][enc["attention_mask"][i].bool()],
                        "pixel_values": patches[i][0], "image_grid_thw": patches[i][1], "video": None})
    return out


def check_prompt_ids(engine: str, got: Sequence[int], encoded: dict) -> None:
    """The engine's prompt tokens must be the processor's, or its samples cannot be re-scored."""
    if list(got) != encoded["prompt_ids"].tolist():
        raise RuntimeError(
            f"vLLM (rollout.engine={engine}) tokenized a prompt differently from the policy's processor "
            f"({len(got)} vs {len(encoded['prompt_ids'])} tokens), so its samples could not be re-scored; check "
            "that vlm.min_pixels/max_pixels and the checkpoint's preprocessor_config.json agree (and that the "
            "server serves model.path's checkpoint), or use rollout.engine=hf")


def to_samples(engine, sampling: Sampling, n: int, encoded: dict,
               completions: Sequence[tuple[Sequence[int], Sequence[float]]]) -> list[dict]:
    """``n`` sample dicts from the engine's ``(token ids, log-probs)`` completions (one, repeated,
    under greedy sampling): cut after the first stop token or stop text (the engines stop there,
    what follows is padding), with the engine's float32 log-probs of the kept tokens."""
    completions = completions if len(completions) == n else [completions[0]] * n
    out = []
    for token_ids, logprobs in completions:
        ids = torch.tensor(list(token_ids), dtype=torch.long)
        length, stopped = engine.completion_length(ids, sampling.stop)
        out.append({
            "prompt_ids": encoded["prompt_ids"],
            "completion_ids": ids[:length].clone(),
            "truncated": not stopped,
            "pixel_values": encoded["pixel_values"],
            "image_grid_thw": encoded["image_grid_thw"],
            "video": encoded["video"],
            "logprobs": torch.tensor([float(x) for x in logprobs[:length]], dtype=torch.float32),
        })
    return out
