"""The built-in engine: transformers' ``generate`` on the policy's own module."""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import time
from typing import Any, Sequence

import torch

from mmrl.registry import register_engine

from mmrl.core.library_internals import can_compile_fullgraph
from mmrl.core.oom import OOMBackoff, is_out_of_memory

from ..family_processing import split_images
from ..kv_cache import cache_keyword, returned_cache
from ..logprobs import split_head
from ..lora_merge import merged_for_generation
from ..turn_cache import TurnStore, group_prefill, kept, prefill, prompt_tokens, turn_cache_off
from .base import RolloutEngine, Sampling
from .vllm_server import refuse_server_keys

log = logging.getLogger(__name__)

CACHE_IMPLEMENTATIONS = ("dynamic", "static")  # rollout.cache_implementation (unset: chosen per device)


def cache_options(r, policy) -> dict[str, Any]:
    """``generate``'s KV-cache keywords for ``r.cache_implementation`` (TRL's name) and
    ``r.compile_decode`` (``r``: the run's ``rollout`` config) for ``policy``'s model.

    ``static``: transformers' ``StaticCache``, allocated for prompt + ``max_new_tokens`` positions
    (rounded up, :func:`static_cache_length`) and written in place, so every decode step has the same
    shapes; transformers then compiles the decode step itself (``torch.compile`` of the model's call
    with its ``CompileConfig`` defaults, mode "reduce-overhead", i.e. CUDA graphs; the prefill stays
    eager) where its ``_valid_auto_compile_criteria`` allow: a CUDA or XPU device, never a CPU.
    ``compile_decode=false`` passes ``disable_compile=True``. A model class transformers does not
    mark compilable keeps the dynamic cache, with one warning naming the key.

    Unset (None, the default) chooses by measurement: the compiled static cache where transformers
    compiles it (a CUDA/XPU device, one process, a compilable model), which made the rollout of a
    Qwen2.5-VL-3B-shaped model 2.1-2.3x faster on an H200 (README, "Speed against TRL"); the dynamic
    cache elsewhere (on a CPU the uncompiled static cache decoded the tiny default's rollout at
    0.93x the dynamic cache's speed; compiled decoding under DDP/FSDP2 has not run on GPUs). ``dynamic`` always keeps the dynamic cache."""
    from mmrl.config import ConfigError

    if r.cache_implementation not in (None, *CACHE_IMPLEMENTATIONS):
        raise ConfigError(f"rollout.cache_implementation={r.cache_implementation!r}: expected dynamic or static "
                          "(unset: static where transformers compiles it, a GPU in one process; dynamic elsewhere)")
    model = policy.module.get_base_model() if policy.lora else policy.module
    if r.cache_implementation != "static":
        if not r.compile_decode:  # refused, not ignored
            raise ConfigError("rollout.compile_decode=false: read only with rollout.cache_implementation=static "
                              "(transformers never compiles the dynamic cache's decode step); remove the key or "
                              "set rollout.cache_implementation=static")
        if r.cache_implementation is None and compiles_static_decode(policy.device, model):
            return {"cache_implementation": "static"}
        return {}
    if not can_compile_fullgraph(model):
        log.warning("rollout.cache_implementation=static: transformers does not mark %s compilable with a static "
                    "cache (_can_compile_fullgraph is false); its rollouts use the dynamic cache (remove the key to "
                    "silence this warning)", type(model).__name__)
        return {}
    return {"cache_implementation": "static", **({} if r.compile_decode else {"disable_compile": True})}


def compiles_static_decode(device: torch.device, model) -> bool:
    """Whether the unset ``rollout.cache_implementation`` picks the compiled static cache: a device
    transformers compiles on (CUDA, XPU), one process (``WORLD_SIZE``, set by torchrun and
    accelerate launch, at most 1) and a model transformers marks compilable."""
    return (device.type in ("cuda", "xpu") and int(os.environ.get("WORLD_SIZE", "1")) <= 1
            and can_compile_fullgraph(model))


# Static KV caches are sized in steps of this many positions: transformers keeps the largest size
# a generate call has used and recompiles the decode step only when a call needs more, so prompts a
# few tokens longer than the last ones reuse the compiled step (``generation_config.max_cache_len``).
STATIC_CACHE_STEP = 64


def static_cache_length(prompt_len: int, max_new_tokens: int, step: int = STATIC_CACHE_STEP) -> int:
    """The static cache's positions for a call: prompt + new tokens, rounded up to ``step``."""
    return -(-(prompt_len + max_new_tokens) // step) * step


@functools.lru_cache(maxsize=1)
def _generate_takes_max_cache_len() -> bool:
    from transformers import GenerationConfig

    return hasattr(GenerationConfig(), "max_cache_len")  # transformers >= 5.2x


@register_engine("hf")
class HFGenerate(RolloutEngine):
    """transformers' ``generate`` on the policy's module, in batches of ``sampling.batch_size``.

    ``rollout.batch_size=0``: as many sequences at once as fit, all of them if they do: the first
    call tries the whole rollout. With either setting an out-of-memory error (accelerate's test)
    retries with half the sequences per call, and the size that worked is kept for later steps
    (or grown back, ``train.oom_grow_back_steps``). (An overhead-bound decode loop takes as long for 8 sequences as
    for 32, so fewer, larger calls are faster.)

    With LoRA and ``rollout.merge_lora_for_generation`` (default) the adapters are folded into
    copies of the base weights for the rollout (:mod:`mmrl.vlm.lora_merge`): plain matmuls per
    token instead of two extra per adapted layer, the base weights restored bit for bit after; over
    a 4-bit base (``model.load_in_4bit``) the adapters stay unmerged (:mod:`mmrl.vlm.lora_merge`).

    Vision placeholder tokens are suppressed (one in a completion would make re-scoring fail with
    "image features and image tokens do not match"), and scoring masks them identically, so
    log-probs are those of the distribution actually sampled from.

    ``rollout.cache_implementation=static`` decodes into a preallocated KV cache that transformers
    compiles on a GPU (:func:`cache_options`)."""

    def __init__(self, policy):
        super().__init__(policy)
        from mmrl.config import ConfigError
        from mmrl.config.schema import RolloutConfig

        r, default = policy.cfg.rollout, RolloutConfig()
        changed = [f"rollout.{k}={getattr(r, k)!r}" for k in vars(default)
                   if (k.startswith("vllm_") or k == "use_engine_logprobs") and getattr(r, k) != getattr(default, k)]
        if changed:  # unused keys are refused, not ignored: this engine reports no log-probs of its own
            raise ConfigError(f"{', '.join(changed)}: read only by rollout.engine=vllm (this run uses "
                              "rollout.engine=hf); remove the key(s) or set rollout.engine=vllm")
        refuse_server_keys(r, "hf")
        # Sequences per generate call: out-of-memory errors cap it (train.oom_grow_back_steps).
        self.batch_backoff = OOMBackoff("sequences per generate call", policy.cfg.train.oom_grow_back_steps)
        self.timed_out = 0  # samples whose generate call reached rollout.max_time, since last taken
        # the KV cache's keywords for every generate call (``mmrl bench rollout --caches`` sets each in turn)
        self.cache_options = cache_options(policy.cfg.rollout, policy)
        self.turns: TurnStore | None = None  # while the agent loop holds turn_cache(): the last turn's keys/values
        # a group's copies of one prompt prefilled once (rollout.group_prefill), where the turn cache's
        # reuse applies (the dynamic cache, read at each call: `mmrl bench rollout --caches` changes it)
        self.group_prefill = (policy.cfg.rollout.group_prefill
                              and turn_cache_off(split_head(self._base_model())[0]) is None)

    def _base_model(self):
        return self.policy.module.get_base_model() if self.policy.lora else self.policy.module

    @contextlib.contextmanager
    def turn_cache(self):
        """While open, each generate call starts from the keys/values the last one computed for
        the same tokens and images (:mod:`mmrl.vlm.turn_cache`); closed, they are freed. With the
        static cache (whose shapes are fixed per call) or a model the module does not serve, and
        with ``rollout.turn_cache=false``, every turn is computed whole."""
        use = (self.policy.cfg.rollout.turn_cache and not self.cache_options
               and turn_cache_off(split_head(self._base_model())[0]) is None)
        self.turns = TurnStore() if use else None
        try:
            yield
        finally:
            self.turns = None

    def take_timeouts(self) -> int:
        """Samples cut by ``rollout.max_time`` since the last call (and reset)."""
        count, self.timed_out = self.timed_out, 0
        return count

    def generate(self, prompts: Sequence[list[dict]], sampling: Sampling) -> list[dict]:
        policy = self.policy
        # a 4-bit base: through its layers and the unmerged adapters, as training computes (mmrl.vlm.lora_merge)
        merge = policy.lora and policy.cfg.rollout.merge_lora_for_generation and policy.four_bit is None
        with merged_for_generation(policy.module) if merge else contextlib.nullcontext():
            wanted = min(len(prompts), sampling.batch_size if sampling.batch_size > 0 else len(prompts))
            while True:
                size = self.batch_backoff.size(wanted)
                try:
                    results = self.generate_in_batches(prompts, sampling, size)
                except Exception as exc:
                    if not is_out_of_memory(exc) or size <= 1:
                        raise
                    # what accelerate's find_executable_batch_size does, but halving, and with
                    # no cache clearing before every call (a gc.collect per rollout costs time)
                    gc.collect()
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
                    self.batch_backoff.shrink(size)
                    continue
                self.batch_backoff.fitted(wanted)
                return results

    def generation_kwargs(self, sampling: Sampling, prompt_len: int) -> dict[str, Any]:
        """``generate``'s keywords for one call on prompts ``prompt_len`` columns wide."""
        policy = self.policy
        gen_kwargs: dict[str, Any] = dict(max_new_tokens=sampling.max_new_tokens, pad_token_id=policy.pad_id,
                                          eos_token_id=sorted(policy.eos_ids),
                                          suppress_tokens=policy.suppressed_ids or None,
                                          # each rank generates alone (under FSDP2 too: the
                                          # weights are gathered for rollouts)
                                          synced_gpus=False, **self.cache_options)
        if sampling.temperature > 0:
            # top_k=0 / top_p=1 explicitly: the checkpoint's generation_config may set its own
            # (transformers defaults top_k to 50), which would truncate what we sample from.
            gen_kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                              top_k=sampling.top_k)
        else:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if sampling.stop:  # transformers' StopStringCriteria: a text may end inside a token
            gen_kwargs.update(stop_strings=list(sampling.stop), tokenizer=policy.tokenizer)
        if self.cache_options.get("cache_implementation") == "static" and _generate_takes_max_cache_len():
            gen_kwargs["max_cache_len"] = static_cache_length(prompt_len, sampling.max_new_tokens)
        if policy.cfg.rollout.max_time > 0:
            gen_kwargs["max_time"] = policy.cfg.rollout.max_time
        return gen_kwargs

    def prefilled(self, turns: TurnStore | None, inputs: dict[str, torch.Tensor], rows, gen_kwargs: dict) -> dict:
        """The inputs ``generate`` takes to go on from a cache of every prompt column but the last,
        so the images are no longer needed: what ``turns`` holds of these prompts
        (:func:`~mmrl.vlm.turn_cache.prefill`), else, with ``rollout.group_prefill``, each distinct
        prompt computed once (:func:`~mmrl.vlm.turn_cache.group_prefill`); unchanged when neither
        applies. With ``turns`` the call returns its cache, which the store keeps."""
        from transformers import DynamicCache

        if turns is not None:
            gen_kwargs["return_dict_in_generate"] = True
        model = self._base_model()
        backbone, keyword = split_head(model)[0], cache_keyword(model)
        with self.policy.autocast():
            cache = prefill(backbone, turns, inputs, rows, DynamicCache, keyword) if turns is not None else None
            if cache is None and self.group_prefill:
                cache = group_prefill(backbone, inputs, rows, DynamicCache, keyword)
        if cache is None:
            return inputs
        gen_kwargs[cache_keyword(model)] = cache
        return {k: inputs[k] for k in ("input_ids", "attention_mask", "mm_token_type_ids") if k in inputs}

    @torch.no_grad()
    def generate_in_batches(self, prompts: Sequence[list[dict]], sampling: Sampling, batch_size: int) -> list[dict]:
        policy = self.policy
        model = policy.module
        model.eval()
        results: list[dict] = []
        fresh: list = []  # the entries the turn cache keeps of this call
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start:start + batch_size]
            enc, images_per_sample = policy.encode_prompts(chunk)
            inputs = {k: v.to(policy.device) for k, v in enc.items()}
            images = split_images(enc, images_per_sample, policy.processor)
            videos = policy.split_videos(enc)
            gen_kwargs = self.generation_kwargs(sampling, inputs["input_ids"].shape[1])
            no_video = not any(v is not None for v in videos)
            turns = self.turns if self.turns is not None and no_video else None
            if turns is not None or (self.group_prefill and no_video and not self.cache_options):
                rows = prompt_tokens(enc, images, policy.processor)
                inputs = self.prefilled(turns, inputs, rows, gen_kwargs)
            started = time.perf_counter()
            with policy.autocast():
                out = model.generate(**inputs, **gen_kwargs)
            sequences = (out.sequences if turns is not None else out).cpu()
            if gen_kwargs.get("max_time", 0) > 0 and time.perf_counter() - started >= gen_kwargs["max_time"]:
                self.timed_out += len(chunk)
            prompt_len = enc["input_ids"].shape[1]
            lengths = []
            for i in range(len(chunk)):
                completion = sequences[i, prompt_len:]
                length, stopped = self.completion_length(completion, sampling.stop)
                lengths.append(length)
                results.append({
                    "prompt_ids": enc["input_ids"][i][enc["attention_mask"][i].bool()],
                    "completion_ids": completion[:length].clone(),
                    "truncated": not stopped,
                    **images[i],  # the family's image tensors (Qwen-VL: pixel_values, image_grid_thw)
                    "video": videos[i],
                })
            if turns is not None:
                fresh += kept(returned_cache(out), sequences, prompt_len, rows,
                              [prompt_len - len(r.ids) for r in rows], lengths)
        if self.turns is not None:
            self.turns.entries = fresh
        return results
