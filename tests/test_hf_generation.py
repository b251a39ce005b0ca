"""The HF engine's speed settings: LoRA folded into weight copies for generation (the base restored
bit for bit) and rollout.batch_size=0 (as many as fit, halved on out-of-memory, remembered)."""

from __future__ import annotations

import pytest
import torch

from conftest import make_config
from mmrl.registry import TASKS
from mmrl.vlm.lora_merge import lora_delta, lora_layers, merged_for_generation, merged_lora_weights
from mmrl.vlm.policy import VLMPolicy


def _lora_policy(*overrides):
    policy = VLMPolicy(make_config("train.device=cpu", "model.lora.enabled=true", "model.dtype=bfloat16",
                                   "rollout.max_completion_length=4", *overrides))
    torch.manual_seed(0)
    for name, p in policy.module.named_parameters():
        if "lora_B" in name:  # peft starts B at 0 (a no-op adapter): make the adapters matter
            p.data.normal_(0, 0.05)
    return policy


def _prompts(n=2):
    task = TASKS.get("counting")()
    exs = [task.examples("train")[i] for i in range(n)]
    return exs, [task.prompt(e) for e in exs]


def _logits(policy, enc):
    with torch.no_grad(), policy.autocast():
        return policy.module(**enc).logits.float()


@pytest.mark.slow
def test_merged_generation_weights_compute_the_adapted_model_and_are_restored_exactly():
    policy = _lora_policy()
    _, prompts = _prompts()
    enc, _ = policy.encode_prompts(prompts)
    base = {n: p.detach().clone() for n, p in policy.module.named_parameters()}
    adapted = _logits(policy, enc)
    with policy.adapters_disabled():
        plain = _logits(policy, enc)
    assert (adapted - plain).abs().max() > 1e-2  # the adapters change the outputs

    layers = lora_layers(policy.module)
    assert layers and all(lora_delta(layer).dtype == torch.float32 for layer in layers.values())
    with merged_for_generation(policy.module):
        merged = _logits(policy, enc)
        assert next(iter(layers.values())).get_base_layer().weight.dtype == torch.bfloat16
    # the same function as the adapted model, to bf16 rounding of W + BA
    assert (merged - adapted).abs().max() < 0.05 * adapted.abs().max()
    for n, p in policy.module.named_parameters():  # base and adapters bit for bit as before
        assert torch.equal(p, base[n]), n
    assert torch.equal(_logits(policy, enc), adapted)  # adapters on again


def test_merged_weights_for_an_engine_are_w_plus_b_a_times_scaling():
    policy = _lora_policy()
    weights = dict(merged_lora_weights(policy.module))
    assert not any("lora_" in n or "base_layer" in n for n in weights)
    name, lora_layer = next(iter(lora_layers(policy.module).items()))
    layer = lora_layer.get_base_layer()
    a, b = lora_layer.lora_A["default"].weight.float(), lora_layer.lora_B["default"].weight.float()
    expected = (layer.weight.float() + b @ a * lora_layer.scaling["default"]).to(layer.weight.dtype)
    assert torch.equal(weights[f"{name}.weight"], expected)


def test_batch_size_zero_generates_everything_at_once_on_a_cpu():
    policy = VLMPolicy(make_config("train.device=cpu", "rollout.max_completion_length=3", "rollout.batch_size=0"))
    calls = []
    generate = policy.module.generate
    policy.module.generate = lambda **kw: calls.append(kw["input_ids"].shape[0]) or generate(**kw)
    exs, prompts = _prompts(3)
    batch = policy.rollout(exs, prompts, 4, "train")
    assert len(batch) == 12 and calls == [12]


def _policy_on_a_device_that_holds(sequences: int, batch_size: int, *extra: str):
    """A policy whose ``generate`` raises CUDA's out-of-memory error above ``sequences`` at once,
    and the list of the sizes it was called with."""
    policy = VLMPolicy(make_config("train.device=cpu", "rollout.max_completion_length=3",
                                   f"rollout.batch_size={batch_size}", *extra))
    calls = []
    generate = policy.module.generate

    def limited(**kw):
        calls.append(kw["input_ids"].shape[0])
        if kw["input_ids"].shape[0] > sequences:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return generate(**kw)

    policy.module.generate = limited
    return policy, calls


@pytest.mark.slow
def test_batch_size_zero_shrinks_on_out_of_memory_and_remembers_the_size():
    policy, calls = _policy_on_a_device_that_holds(3, batch_size=0)
    exs, prompts = _prompts(2)
    batch = policy.rollout(exs, prompts, 4, "train")
    assert len(batch) == 8 and batch.action_mask.shape[0] == 8
    assert calls == [8, 4, 2, 2, 2, 2]  # halved on each out-of-memory error
    assert policy.engine.batch_backoff.limit == 2
    calls.clear()
    policy.rollout(exs, prompts, 4, "train")
    assert calls == [2, 2, 2, 2]  # the next step starts at the size that fit


@pytest.mark.slow
def test_a_fixed_batch_size_also_halves_on_out_of_memory():
    policy, calls = _policy_on_a_device_that_holds(3, batch_size=6)
    exs, prompts = _prompts(2)
    assert len(policy.rollout(exs, prompts, 4, "train")) == 8
    assert calls == [6, 3, 3, 2] and policy.engine.batch_backoff.limit == 3


@pytest.mark.slow
def test_the_generation_batch_grows_back_after_oom_grow_back_steps_calls_that_fit():
    """Out of memory above 3 sequences: 8 -> 4 -> 2 (fits); with train.oom_grow_back_steps=2,
    after two rollouts at 2 the next tries 4 (out of memory again: back to 2, the count restarts)."""
    policy, calls = _policy_on_a_device_that_holds(3, 0, "train.oom_grow_back_steps=2")
    exs, prompts = _prompts(2)
    for _ in range(3):
        policy.rollout(exs, prompts, 4, "train")
    assert calls == [8, 4, 2, 2, 2, 2] + [2, 2, 2, 2] + [4, 2, 2, 2, 2]
    assert policy.engine.batch_backoff.limit == 2


@pytest.mark.slow
def test_a_generate_call_past_max_time_stops_and_is_counted():
    """transformers' max_time ends the call: every completion is cut (truncated) and counted."""
    policy = VLMPolicy(make_config("train.device=cpu", "rollout.max_completion_length=30", "rollout.max_time=1e-9",
                                   "eval.temperature=1.0"))
    exs, prompts = _prompts(2)
    batch = policy.rollout(exs, prompts, 2, "train")
    assert bool(batch.truncated.all()) and int(batch.action_mask.sum(1).max()) < 30
    assert policy.take_rollout_stats() == {"rollout_timeouts": 4.0} and policy.take_rollout_stats() == {"rollout_timeouts": 0.0}
    untimed = VLMPolicy(make_config("train.device=cpu", "rollout.max_completion_length=3"))
    untimed.rollout(exs, prompts, 2, "train")
    assert untimed.take_rollout_stats() == {}
