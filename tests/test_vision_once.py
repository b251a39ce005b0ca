"""Each distinct image goes through the vision tower once per forward (and, with a frozen tower,
once per RL step), and the log-probs and gradients are exactly those of the per-sample forward."""

from __future__ import annotations

import pytest
import torch

from conftest import make_config
from mmrl.registry import TASKS
from mmrl.vlm.logprobs import split_head
from mmrl.vlm.policy import VLMPolicy


def _teacher_forced(policy, copies=3):
    """2 prompts (2 distinct images) x ``copies`` completions each, by teacher forcing."""
    task = TASKS.get("counting")()
    exs = [task.examples("train")[i] for i in range(2)]
    rep = [ex for ex in exs for _ in range(copies)]
    return policy.rollout_given(rep, [task.prompt(e) for e in rep], [f"<answer>{i}</answer>" for i in range(len(rep))],
                                need_old_logps=False, need_ref_logps=False)


def _logps_and_grads(policy, batch):
    policy.module.zero_grad(set_to_none=True)
    with policy.autocast():
        logps = policy.completion_logps(policy.module, batch)
    (logps.sum() * 0.1).backward()
    grads = {n: p.grad.clone() for n, p in policy.module.named_parameters() if p.grad is not None}
    return logps.detach(), grads


def _uninstalled(policy):
    """The model's own ``get_image_features`` again (the class method: one encoding per sample)."""
    del split_head(policy.module)[0].__dict__["get_image_features"]


@pytest.fixture(scope="module")
def family_dirs(random_tiny_dir, tmp_path_factory):
    """Tiny Qwen2.5-VL, Qwen2-VL and Qwen3-VL (deepstack) checkpoints."""
    from transformers import AutoTokenizer

    from test_vlm_families import _qwen2_vl, _qwen3_vl
    from mmrl.vlm import tiny
    from mmrl.vlm.processing import VLMProcessor

    try:
        from transformers import Qwen2VLImageProcessorPil as ImageProcessor
    except ImportError:
        from transformers import Qwen2VLImageProcessor as ImageProcessor
    dirs = {"qwen2_5_vl": random_tiny_dir}
    tok = AutoTokenizer.from_pretrained(random_tiny_dir)
    for name, build in (("qwen2_vl", _qwen2_vl), ("qwen3_vl", _qwen3_vl)):
        torch.manual_seed(0)
        model, patch = build(tok)
        model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
        processor = VLMProcessor(tok, ImageProcessor(patch_size=patch, min_pixels=32 * 32, max_pixels=128 * 128),
                                 tiny.QWEN_CHAT_TEMPLATE)
        path = tmp_path_factory.mktemp(name)
        tiny.save_tiny(model, processor, path)
        dirs[name] = path
    return dirs


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen2_vl", "qwen3_vl"])
def test_shared_encoding_equals_the_per_sample_forward(family, family_dirs):
    """A trained vision tower (no cache): log-probs and every gradient, vision tower included,
    equal the forward that encodes the image of each of the 6 samples."""
    policy = VLMPolicy(make_config(f"model.path={family_dirs[family]}", "train.device=cpu",
                                   "vlm.freeze_vision=false", "train.shared_prefix=false"))  # the per-sample forward
    [encoder] = policy.image_encoders
    assert not encoder.cache_enabled
    batch = _teacher_forced(policy)
    shared_logps, shared_grads = _logps_and_grads(policy, batch)
    assert (encoder.images_seen, encoder.images_encoded) == (6, 2)
    assert any("visual" in n for n in shared_grads)  # the tower is trained through the shared features

    _uninstalled(policy)
    logps, grads = _logps_and_grads(policy, batch)
    assert encoder.images_seen == 6  # the wrapper is out of the way
    torch.testing.assert_close(shared_logps, logps, rtol=1e-5, atol=1e-5)
    assert shared_grads.keys() == grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(shared_grads[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_a_frozen_tower_encodes_each_image_once_per_step(random_tiny_dir):
    """With vlm.freeze_vision the features are kept through the step: the scoring pass after the
    first encodes nothing, a new step starts afresh, and the values equal an uncached forward."""
    policy = VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu", "vlm.freeze_vision=true",
                                   "algo.beta=0.04", "train.shared_prefix=false"))  # every sample's image asked for
    assert len(policy.image_encoders) == 2 and all(e.cache_enabled for e in policy.image_encoders)
    encoder, ref_encoder = policy.image_encoders
    batch = _teacher_forced(policy)
    first = policy.score(batch, reference=False)
    second = policy.score(batch, reference=False)
    policy.score(batch, reference=True)
    assert (encoder.images_seen, encoder.images_encoded) == (12, 2)
    assert ref_encoder.images_encoded == 2  # the reference copy has its own features
    torch.testing.assert_close(first, second)

    policy.begin_step(1)
    policy.score(batch, reference=False)
    assert encoder.images_encoded == 4
    _uninstalled(policy)
    torch.testing.assert_close(policy.score(batch, reference=False), first, rtol=1e-5, atol=1e-5)


def test_generation_encodes_each_prompt_image_once(random_tiny_dir):
    policy = VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu",
                                   "rollout.max_completion_length=4", "vlm.freeze_vision=false"))
    task = TASKS.get("counting")()
    exs = [task.examples("train")[i] for i in range(2)]
    batch = policy.rollout(exs, [task.prompt(e) for e in exs], 4, "train", need_old_logps=True)
    encoder = policy.image_encoders[0]
    assert len(batch) == 8
    assert encoder.images_encoded == 2 * 2  # prefill and the old-log-prob pass: 2 images each, not 8
