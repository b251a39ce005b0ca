"""``rollout.cache_implementation=static``: the hf engine decodes into transformers' preallocated KV
cache (compiled by transformers on a GPU). On a CPU it is not compiled, and what it computes must be
what the dynamic cache computes: the same greedy tokens for image and video prompts of different
lengths (left padding, so each row its own mRoPE ``rope_deltas``), with LoRA merged for generation
too, and sampled tokens whose log-probs under the distribution ``generate`` drew them from equal
the trainer's re-scored old log-probs. A model transformers does not mark compilable falls back to
the dynamic cache with one warning; out-of-memory back-off keeps the static cache."""

from __future__ import annotations

import logging

import pytest
import torch

from conftest import make_config, tiny_run_config, tiny_trainer
from mmrl.config import ConfigError
from mmrl.registry import TASKS, load_plugins
from mmrl.vlm.policy import VLMPolicy

STATIC = "rollout.cache_implementation=static"
VIDEO_BUDGET = ("vlm.video_min_pixels=12544", "vlm.video_max_pixels=12544")
LORA = ("model.lora.enabled=true", "rollout.merge_lora_for_generation=true")


def _sharpen(policy) -> None:
    """The random tiny model's greedy completion repeats one token; its language model's matrices
    x10 make the greedy tokens differ step to step and row to row, so "identical" means something.
    LoRA's B (0 at the start) is drawn, so the merged adapters matter."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in policy.module.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
            elif "lora_" not in name and ("lm_head" in name or ("language_model" in name and p.dim() == 2)):
                p.mul_(10.0)


def _policy(path, *overrides, tokens=10):
    policy = VLMPolicy(make_config(f"model.path={path}", "train.device=cpu", f"rollout.max_completion_length={tokens}",
                                   "eval.temperature=0", *overrides))
    _sharpen(policy)
    return policy


def _spy(policy, scores: list | None = None) -> list[dict]:
    """Record each generate call's cache keywords (and, with ``scores``, the processed scores
    generate sampled each step from: [batch, steps, vocab])."""
    calls = []
    generate = policy.module.generate

    def spy(**kw):
        calls.append({k: kw.get(k) for k in ("cache_implementation", "disable_compile")} | {"n": len(kw["input_ids"])})
        if scores is None:
            return generate(**kw)
        out = generate(**kw, output_scores=True, return_dict_in_generate=True)
        scores.append(torch.stack(out.scores, 1))
        return out.sequences

    policy.module.generate = spy
    return calls


def _prompts(kind: str):
    load_plugins()
    names = {"image": ("counting", "grounding"), "video": ("video_qa", "temporal_grounding")}[kind]
    examples, prompts = [], []
    for name in names:
        task = TASKS.get(name)()
        exs = [task.examples("train")[i] for i in range(2)]
        examples += exs
        prompts += [task.prompt(e) for e in exs]
    return examples, prompts


def _greedy(policy, examples, prompts):
    examples = policy.prepare_examples(examples)
    return policy.rollout(examples, prompts, 1, "eval")


@pytest.mark.slow
@pytest.mark.parametrize("kind,extra", [("image", ()), ("video", VIDEO_BUDGET), ("image", LORA)],
                         ids=["image", "video", "image-lora-merged"])
def test_static_cache_greedy_completions_are_the_dynamic_caches(random_tiny_dir, kind, extra):
    """Four prompts of two tasks (different lengths: left padding, per-row rope_deltas), greedy:
    the static cache's completions are token for token the dynamic cache's."""
    if kind == "video":
        pytest.importorskip("torchvision", reason="transformers' video processor needs torchvision (mmrl[video])")
    examples, prompts = _prompts(kind)
    dynamic, static = _policy(random_tiny_dir, *extra), _policy(random_tiny_dir, STATIC, *extra)
    calls = _spy(static)
    want, got = _greedy(dynamic, examples, prompts), _greedy(static, examples, prompts)
    assert calls == [{"cache_implementation": "static", "disable_compile": None, "n": 4}]
    assert len({len(p) for p in got.payload["prompt_ids"]}) > 1  # rows of different lengths: padding
    ids = [c.tolist() for c in got.payload["completion_ids"]]
    assert ids == [c.tolist() for c in want.payload["completion_ids"]]
    assert len({t for row in ids for t in row}) > 8  # not one repeated token


@pytest.mark.parametrize("kind,extra", [("image", ()), ("video", VIDEO_BUDGET), ("image", LORA)],
                         ids=["image", "video", "image-lora-merged"])
def test_static_cache_samples_log_probs_equal_the_rescored_old_log_probs(random_tiny_dir, kind, extra):
    """Temperature 1, float32: for every sampled token, log_softmax of the scores generate sampled
    it from (static cache; LoRA merged into the weights) equals the rollout's old log-prob, the
    trainer's forward over the whole sequence (no cache; LoRA unmerged), within 1e-5."""
    if kind == "video":
        pytest.importorskip("torchvision", reason="transformers' video processor needs torchvision (mmrl[video])")
    examples, prompts = _prompts(kind)
    policy = _policy(random_tiny_dir, STATIC, *extra)
    scores = []
    _spy(policy, scores)
    torch.manual_seed(0)
    batch = policy.rollout(policy.prepare_examples(examples), prompts, 2, "train", need_old_logps=True)
    [drawn] = scores
    mask = batch.action_mask
    ids = torch.zeros(mask.shape, dtype=torch.long)
    for i, c in enumerate(batch.payload["completion_ids"]):
        ids[i, :len(c)] = c
    sampled = torch.log_softmax(drawn[:, :mask.shape[1]].float(), -1).gather(-1, ids[..., None])[..., 0]
    assert (sampled * mask).sum() / mask.sum() < -0.1  # not all near-certain tokens
    assert ((sampled - batch.old_logps) * mask).abs().max() < 1e-5


@pytest.mark.slow
def test_a_seeded_training_rollout_is_the_same_with_either_cache(random_tiny_dir, tmp_path):
    """The trainer's rollout step (LoRA merged for generation, temperature 1, the step's seed):
    the static cache samples the same completions and the same old log-probs as the dynamic."""
    batches = []
    for cache in ("dynamic", "static"):
        cfg = tiny_run_config(random_tiny_dir, tmp_path / cache, 1, *LORA, f"rollout.cache_implementation={cache}",
                              "algo.num_iterations=2")  # two epochs: the rollout scores old log-probs
        trainer = tiny_trainer(cfg)
        _sharpen(trainer.policy)
        calls = _spy(trainer.policy)
        batch, _ = trainer.rollout_step(1)
        assert {c["cache_implementation"] for c in calls} == ({"static"} if cache == "static" else {None})
        batches.append(batch)
    dynamic, static = batches
    completions = [[c.tolist() for c in b.payload["completion_ids"]] for b in batches]
    assert completions[0] == completions[1]
    assert torch.allclose(static.old_logps, dynamic.old_logps, atol=1e-5, rtol=0)


def test_a_model_without_static_cache_support_falls_back_with_one_warning(random_tiny_dir, monkeypatch, caplog):
    """A model class transformers does not mark compilable (_can_compile_fullgraph false; here the
    tiny Qwen2.5-VL with the flag patched): one warning naming the key, rollouts on the dynamic cache."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    monkeypatch.setattr(Qwen2_5_VLForConditionalGeneration, "_can_compile_fullgraph", False)
    with caplog.at_level(logging.WARNING, logger="mmrl"):
        policy = _policy(random_tiny_dir, STATIC, tokens=3)
        calls = _spy(policy)
        examples, prompts = _prompts("image")
        for _ in range(2):
            policy.rollout(examples, prompts, 1, "train")
    warnings = [r.getMessage() for r in caplog.records if "cache_implementation" in r.getMessage()]
    assert len(warnings) == 1
    assert "rollout.cache_implementation=static" in warnings[0] and "Qwen2_5_VLForConditionalGeneration" in warnings[0]
    assert "dynamic cache" in warnings[0]
    assert [c["cache_implementation"] for c in calls] == [None, None]


@pytest.mark.slow
def test_out_of_memory_back_off_keeps_the_static_cache(random_tiny_dir):
    """rollout.batch_size=0, a device that holds 3 sequences: 8 -> 4 -> 2 as with the dynamic
    cache (tests/test_hf_generation.py), every call asking for the static cache."""
    policy = _policy(random_tiny_dir, STATIC, "rollout.batch_size=0", tokens=3)
    calls = _spy(policy)
    inner = policy.module.generate

    def limited(**kw):
        if len(kw["input_ids"]) > 3:
            calls.append({"cache_implementation": kw.get("cache_implementation"), "n": len(kw["input_ids"])})
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return inner(**kw)

    policy.module.generate = limited
    examples, prompts = _prompts("image")
    batch = policy.rollout(examples[:2], prompts[:2], 4, "train")
    assert len(batch) == 8 and policy.engine.batch_backoff.limit == 2
    assert [c["n"] for c in calls] == [8, 4, 2, 2, 2, 2]
    assert {c["cache_implementation"] for c in calls} == {"static"}


def test_compile_decode_false_disables_transformers_compile(random_tiny_dir):
    """rollout.compile_decode=false: generate gets the static cache and transformers' disable_compile."""
    policy = _policy(random_tiny_dir, STATIC, "rollout.compile_decode=false", tokens=2)
    assert policy.engine.cache_options == {"cache_implementation": "static", "disable_compile": True}
    calls = _spy(policy)
    examples, prompts = _prompts("image")
    policy.rollout(examples[:1], prompts[:1], 1, "train")
    assert calls == [{"cache_implementation": "static", "disable_compile": True, "n": 1}]


def test_unset_cache_picks_the_compiled_static_cache_on_a_gpu_in_one_process(random_tiny_dir, monkeypatch):
    """rollout.cache_implementation unset: the static cache (compiled by transformers) on a CUDA
    device in one process, the dynamic cache on a CPU or under torchrun/accelerate with several
    processes; an explicit dynamic is kept everywhere."""
    from dataclasses import replace
    from types import SimpleNamespace

    from mmrl.vlm.engines.hf import cache_options

    policy = _policy(random_tiny_dir, tokens=2)
    r = policy.cfg.rollout
    assert r.cache_implementation is None and cache_options(r, policy) == {}  # a CPU
    on_gpu = SimpleNamespace(device=torch.device("cuda"), lora=False, module=policy.module)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert cache_options(r, on_gpu) == {"cache_implementation": "static"}
    assert cache_options(replace(r, cache_implementation="dynamic"), on_gpu) == {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cache_options(r, on_gpu) == {}
    monkeypatch.setattr(type(policy.module), "_can_compile_fullgraph", False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert cache_options(r, on_gpu) == {}


def test_static_cache_length_is_rounded_so_slightly_longer_prompts_reuse_the_compiled_step(random_tiny_dir):
    """Each static-cache call asks for prompt + new tokens rounded up to 64 positions; transformers
    keeps the largest size asked, so the next call with a prompt a few tokens longer gets the same
    cache shape (and, on a GPU, the same compiled decode step)."""
    from mmrl.vlm.engines.hf import static_cache_length

    assert [static_cache_length(p, 10) for p in (1, 54, 55, 118)] == [64, 64, 128, 128]
    policy = _policy(random_tiny_dir, STATIC, "rollout.compile_decode=false", tokens=3)
    asked = []
    generate = policy.module.generate
    policy.module.generate = lambda **kw: asked.append((kw["input_ids"].shape[1], kw.get("max_cache_len"))) or generate(**kw)
    examples, prompts = _prompts("image")
    for i in (0, 2):  # a counting prompt, then a longer grounding prompt
        policy.rollout(examples[i:i + 1], prompts[i:i + 1], 1, "train")
    assert len({n for n, _ in asked}) == 2, "the two prompts should differ in length"
    assert [m for _, m in asked] == [static_cache_length(n, 3) for n, _ in asked]
    assert policy.module._previous_max_cache_length == max(m for _, m in asked)


@pytest.mark.parametrize("overrides,message", [
    (("rollout.cache_implementation=sliding",), r"rollout.cache_implementation='sliding': expected dynamic or static"),
    (("rollout.compile_decode=false",), r"compile_decode=false: read only with rollout.cache_implementation=static"),
    ((STATIC, "rollout.engine=vllm"), r"cache_implementation / rollout.compile_decode: read only by rollout.engine=hf"),
])
def test_cache_keys_are_checked_and_refused_where_unread(random_tiny_dir, overrides, message):
    """A value the hf engine does not know, compile_decode without the static cache, and either key
    with the vllm engine (checked before vLLM is imported, so this runs everywhere) are errors."""
    with pytest.raises(ConfigError, match=message):
        VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu", *overrides))


def test_the_generator_policy_refuses_the_cache_keys():
    from mmrl.config import check_unused_keys
    from mmrl.diffusion.policy import DiffusionPolicy

    with pytest.raises(ConfigError, match="rollout.cache_implementation='static': not used by"):
        check_unused_keys(make_config(STATIC), DiffusionPolicy.unused_config, "a DiffusionPolicy")


@pytest.mark.slow
def test_cache_bench_tiny_prints_a_row_per_cache():
    """`mmrl bench rollout --caches --tiny` on the built-in tiny model: the dynamic and static rows
    with positive tokens/s; on a CPU the compiled row is left out, saying why (not timings)."""
    from typer.testing import CliRunner

    from mmrl.bench.rollout import CACHES
    from mmrl.cli import app

    result = CliRunner().invoke(app, ["bench", "rollout", "--caches", "--tiny", "train.device=cpu"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    rows = {f[0]: f for line in lines if len(f := line.split()) == 7 and f[0] in CACHES}  # name + 6 figures
    assert list(rows) == ["dynamic", "static"]
    assert all(float(f[2]) > 0 for f in rows.values())  # tokens/s
    assert any(line.startswith("static+compile: not run:") and "CUDA/XPU only" in line for line in lines)
    assert any(line.startswith("static / dynamic:") for line in lines)


def _compiled_greedy(policy, examples, prompts, compile_config=None) -> tuple[list[list[int]], list]:
    """Greedy ids, and the compile configs transformers compiled the decode step with."""
    compiled = []
    get_compiled_call = policy.module.get_compiled_call

    def spy(config):
        compiled.append(config)
        return get_compiled_call(config)

    policy.module.get_compiled_call = spy
    if compile_config is not None:
        generate = policy.module.generate
        policy.module.generate = lambda **kw: generate(**kw, compile_config=compile_config)
    batch = _greedy(policy, examples, prompts)
    return [c.tolist() for c in batch.payload["completion_ids"]], compiled


@pytest.mark.slow
def test_transformers_compiled_static_decode_on_a_cpu_is_greedy_identical(random_tiny_dir):
    """transformers compiles the decode step on CUDA/XPU only; its CompileConfig's private
    ``_compile_all_devices`` ("useful for testing purposes") compiles it on this CPU (~15 s of
    inductor): the compiled static-cache decode gives the dynamic cache's greedy tokens."""
    from transformers import CompileConfig

    examples, prompts = _prompts("image")
    want = [c.tolist() for c in _greedy(_policy(random_tiny_dir), examples, prompts).payload["completion_ids"]]
    config = CompileConfig()
    config._compile_all_devices = True
    got, compiled = _compiled_greedy(_policy(random_tiny_dir, STATIC), examples, prompts, config)
    assert compiled, "transformers did not compile the decode step (has CompileConfig._compile_all_devices moved?)"
    assert got == want


@pytest.mark.gpu
def test_transformers_compiled_static_decode_on_cuda_is_greedy_identical(random_tiny_dir):
    """On CUDA transformers compiles the static cache's decode step by itself (CUDA graphs): the
    default rollout.compile_decode=true; greedy tokens as with the dynamic cache (float32)."""
    examples, prompts = _prompts("image")
    dynamic = VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cuda",
                                    "rollout.max_completion_length=10", "eval.temperature=0"))
    _sharpen(dynamic)
    want = [c.tolist() for c in _greedy(dynamic, examples, prompts).payload["completion_ids"]]
    static = VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cuda", STATIC,
                                   "rollout.max_completion_length=10", "eval.temperature=0"))
    _sharpen(static)
    got, compiled = _compiled_greedy(static, examples, prompts)
    assert compiled and got == want
