"""``mmrl bench rollout``: HF ``generate`` against vLLM on the same policy, prompts and budget.

The question before switching ``rollout.engine``: how many samples per second does each engine
give here? Both generate from one :class:`~mmrl.vlm.policy.VLMPolicy` (so the same weights, chat
prompts, sampling settings, stop tokens and banned vision placeholders), ``prompts`` training
prompts of the config's task x ``n`` samples, at most ``tokens`` new tokens, ``repeats`` timed
calls each after one untimed warm-up call (for vLLM that warm-up builds the engine and pushes the
weights; its time is reported apart). HF runs first: building vLLM in-process changes torch's
thread handling. Samples stop at EOS, so tokens/s is reported beside samples/s.

``mmrl bench rollout --caches`` (:func:`run_cache_bench`) asks the hf engine's own question instead,
no vLLM needed: how fast does ``generate`` decode with the dynamic KV cache, the static one
uncompiled (``rollout.cache_implementation=static rollout.compile_decode=false``) and the static one
compiled by transformers (the default with ``static``; transformers compiles on CUDA/XPU only, so
on a CPU that row is left out, said why), on one policy, one batch, one run. Random weights never
stop early, so tokens/s there is decode speed at full length; the compile itself happens in the
warm-up call, reported apart.

The load average is printed before and after: on a shared machine the figures only mean something
when it is low (the first field below the number of cores' worth of other work you accept).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

import torch

DEFAULT_CONFIG = "vlm/counting_tiny"


def _time_engine(engine, prompts: Sequence[list[dict]], sampling, repeats: int, seed: int) -> dict[str, Any]:
    """One warm-up call, then ``repeats`` timed calls with seeds ``seed..seed+repeats-1``."""
    t0 = time.perf_counter()
    torch.manual_seed(seed - 1)
    engine.generate(prompts, sampling)
    warmup = time.perf_counter() - t0
    seconds, samples, tokens = 0.0, 0, 0
    for r in range(repeats):
        torch.manual_seed(seed + r)
        t0 = time.perf_counter()
        out = engine.generate(prompts, sampling)
        seconds += time.perf_counter() - t0
        samples += len(out)
        tokens += sum(len(s["completion_ids"]) for s in out)
    return {"samples_per_s": samples / seconds, "tokens_per_s": tokens / seconds,
            "mean_tokens": tokens / max(samples, 1), "seconds_per_call": seconds / repeats, "warmup_s": warmup,
            "threads": torch.get_num_threads()}


def _setup(config: str, overrides: Sequence[str], prompts: int, n: int, tokens: int, repeats: int):
    """The policy, the batch (each prompt ``n`` times, as VLMPolicy.rollout repeats them) and the
    training sampling settings, with the hf engine."""
    from mmrl.api import make_policy
    from mmrl.config import builtin_config_path, load_config
    from mmrl.core.trainer import build_task

    if min(prompts, n, tokens, repeats) < 1:
        raise ValueError("prompts, n, tokens and repeats must be >= 1")
    cfg = load_config(builtin_config_path(config), [
        f"rollout.batch_size={prompts * n}", *overrides, "rollout.engine=hf",
        f"rollout.max_completion_length={tokens}", f"rollout.num_generations={n}"])
    from mmrl.config.threads import configure_threads

    configure_threads(cfg, echo=lambda line: None)  # the table's "threads" column says what was picked
    task = build_task(cfg)
    policy = make_policy(cfg, task)
    examples = task.examples("train")
    batch = [task.prompt(examples[i]) for i in range(prompts)]
    return cfg, policy, [p for p in batch for _ in range(n)], policy.sampling("train")


def _start(cfg, policy, prompts: int, n: int, tokens: int, repeats: int, sampling, what: str,
           echo: Callable[[str], None]) -> float:
    load_before = os.getloadavg()[0]
    echo(f"rollout bench: {cfg.model.path} ({cfg.model.dtype}, {policy.device}), {prompts} prompts x {n} samples, "
         f"<= {tokens} new tokens, temperature {sampling.temperature}, {repeats} timed calls per {what}; "
         f"load average {load_before:.2f} at start ({os.cpu_count()} CPUs)")
    if load_before >= 1.0:
        echo("warning: the machine is busy (load average >= 1.0): these timings are not representative")
    return load_before


def _table(results: dict[str, Any], names: Sequence[str], label: str, echo: Callable[[str], None]) -> None:
    echo(f"{label:<16}{'samples/s':>11}{'tokens/s':>10}{'mean tokens':>13}{'s/call':>8}{'warm-up s':>11}{'threads':>9}")
    for name in names:
        r = results[name]
        echo(f"{name:<16}{r['samples_per_s']:>11.1f}{r['tokens_per_s']:>10.1f}{r['mean_tokens']:>13.1f}"
             f"{r['seconds_per_call']:>8.3f}{r['warmup_s']:>11.2f}{r['threads']:>9}")


def run_rollout_bench(config: str = DEFAULT_CONFIG, overrides: Sequence[str] = (), prompts: int = 4, n: int = 8,
                      tokens: int = 24, repeats: int = 3, seed: int = 0,
                      echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Time both engines on the same batch and print a table; returns ``{"hf": ..., "vllm": ...,
    "ratio": vllm/hf samples per second, "load": (before, after)}``. Raises ImportError (with the
    install hint) where vLLM is missing, before anything is timed."""
    from mmrl.vlm.engines.vllm_engine import VLLMEngine, import_vllm

    if min(prompts, n, tokens, repeats) < 1:
        raise ValueError("prompts, n, tokens and repeats must be >= 1")
    import_vllm()  # no half-run bench without vLLM
    cfg, policy, batch, sampling = _setup(config, overrides, prompts, n, tokens, repeats)
    load_before = _start(cfg, policy, prompts, n, tokens, repeats, sampling, "engine", echo)
    results = {"hf": _time_engine(policy.engine, batch, sampling, repeats, seed)}
    vllm = VLLMEngine(policy)
    try:
        results["vllm"] = _time_engine(vllm, batch, sampling, repeats, seed)
    finally:
        vllm.shutdown()
    results["ratio"] = results["vllm"]["samples_per_s"] / results["hf"]["samples_per_s"]
    results["load"] = (load_before, os.getloadavg()[0])
    _table(results, ("hf", "vllm"), "engine", echo)
    echo(f"vllm / hf: {results['ratio']:.2f}x samples/s, "
         f"{results['vllm']['tokens_per_s'] / results['hf']['tokens_per_s']:.2f}x tokens/s "
         f"(vLLM start-up and first weight push {results['vllm']['warmup_s']:.1f} s, not included); "
         f"load average {results['load'][1]:.2f} at the end")
    return results


# name -> (rollout.cache_implementation, rollout.compile_decode)
CACHES = {"dynamic": ("dynamic", True), "static": ("static", False), "static+compile": ("static", True)}


def run_cache_bench(config: str = DEFAULT_CONFIG, overrides: Sequence[str] = (), prompts: int = 4, n: int = 8,
                    tokens: int = 24, repeats: int = 3, seed: int = 0,
                    echo: Callable[[str], None] = print) -> dict[str, Any]:
    """The hf engine with each KV cache of :data:`CACHES` on one policy and batch, a table printed;
    returns ``{name: timings, "skipped": {name: why}, "load": (before, after)}``. The static rows
    use the engine's own :func:`~mmrl.vlm.engines.hf.cache_options`, so a model that falls back
    to the dynamic cache says so (and its static rows measure the dynamic cache)."""
    from dataclasses import replace

    from mmrl.vlm.engines.hf import HFGenerate, cache_options

    cfg, policy, batch, sampling = _setup(config, overrides, prompts, n, tokens, repeats)
    load_before = _start(cfg, policy, prompts, n, tokens, repeats, sampling, "KV cache", echo)
    results: dict[str, Any] = {"skipped": {}}
    for name, (implementation, compile_decode) in CACHES.items():
        if compile_decode and implementation == "static" and policy.device.type not in ("cuda", "xpu"):
            results["skipped"][name] = (f"transformers compiles the decode step on CUDA/XPU only "
                                        f"(this run is on {policy.device.type})")
            continue
        engine = HFGenerate(policy)  # the run's engine settings, with this row's cache
        engine.cache_options = cache_options(replace(cfg.rollout, cache_implementation=implementation,
                                                     compile_decode=compile_decode), policy)
        results[name] = _time_engine(engine, batch, sampling, repeats, seed)
    results["load"] = (load_before, os.getloadavg()[0])
    names = [k for k in CACHES if k in results]
    _table(results, names, "KV cache", echo)
    for name, why in results["skipped"].items():
        echo(f"{name}: not run: {why}")
    base = results["dynamic"]["tokens_per_s"]
    echo(", ".join(f"{k} / dynamic: {results[k]['tokens_per_s'] / base:.2f}x tokens/s" for k in names[1:])
         + f"; load average {results['load'][1]:.2f} at the end")
    return results
