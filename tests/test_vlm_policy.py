"""The VLM policy on a randomly initialised tiny Qwen2.5-VL: encoding, sampling, log-probs, updates."""

from __future__ import annotations

import pytest
import torch

from conftest import capture_gradients, make_config
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.registry import TASKS
from mmrl.vlm.policy import VLMPolicy
from mmrl.vlm.processing import _expand_placeholders


def _policy(path, *overrides):
    return VLMPolicy(make_config(f"model.path={path}", "train.device=cpu", *overrides))


def _prompts(n=3, task="counting"):
    t = TASKS.get(task)()
    exs = [t.examples("train")[i] for i in range(n)]
    return exs, [t.prompt(e) for e in exs]


def test_expand_placeholders_counts_per_image():
    """Two prompts, three images with 4, 1 and 2 merged tokens: each placeholder gets its own count."""
    pad = "<|image_pad|>"
    out = _expand_placeholders([f"a{pad}b{pad}", f"{pad}c"], [4, 1, 2])
    assert out == [f"a{pad * 4}b{pad}", f"{pad * 2}c"]
    with pytest.raises(ValueError, match="more images"):
        _expand_placeholders([f"a{pad}"], [1, 2])
    with pytest.raises(ValueError, match="more image placeholders"):
        _expand_placeholders([f"a{pad}{pad}"], [1])


def test_processor_matches_hf_processor(random_tiny_dir):
    """Our encoding equals transformers' Qwen2_5_VLProcessor token for token and pixel for pixel."""
    pytest.importorskip("torchvision", reason="transformers' Qwen-VL processor needs torchvision (mmrl[video])")
    from transformers import Qwen2_5_VLProcessor

    policy = _policy(random_tiny_dir)
    _, prompts = _prompts(2)
    ours, _ = policy.encode_prompts(prompts)
    # transformers' own loading of the same directory (with torchvision: its default image backend)
    hf = Qwen2_5_VLProcessor.from_pretrained(random_tiny_dir)
    clean = [policy.split_messages(p)[:2] for p in prompts]  # (messages, images); no videos here
    texts = [hf.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m, _ in clean]
    theirs = hf(text=texts, images=[ims for _, ims in clean], return_tensors="pt", padding=True)
    assert torch.equal(ours["input_ids"], theirs["input_ids"])
    assert torch.equal(ours["mm_token_type_ids"], theirs["mm_token_type_ids"])
    assert torch.equal(ours["image_grid_thw"], theirs["image_grid_thw"])
    assert torch.allclose(ours["pixel_values"], theirs["pixel_values"], atol=1e-5)


def test_rollout_shapes_groups_and_masks(random_tiny_dir):
    policy = _policy(random_tiny_dir)
    cfg = policy.cfg
    exs, prompts = _prompts(3)
    torch.manual_seed(0)
    batch = policy.rollout(exs, prompts, 4, "train", need_old_logps=True, need_ref_logps=False)
    assert len(batch) == 12 and batch.num_groups == 3
    assert batch.group_ids.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    lengths = [len(c) for c in batch.payload["completion_ids"]]
    assert batch.action_mask.sum(1).tolist() == lengths
    assert all(1 <= L <= cfg.rollout.max_completion_length for L in lengths)
    for ids, trunc in zip(batch.payload["completion_ids"], batch.truncated.tolist()):
        stopped = ids[-1].item() in policy.eos_ids
        assert stopped != trunc
    assert batch.old_logps.shape == batch.action_mask.shape
    assert (batch.old_logps[batch.action_mask == 0] == 0).all()
    assert (batch.old_logps[batch.action_mask == 1] < 0).all()
    assert batch.examples[5] is exs[1]


def test_logps_match_an_unpadded_single_sequence_forward(random_tiny_dir):
    """Batched, padded scoring equals scoring each sequence alone with no padding at all."""
    policy = _policy(random_tiny_dir, "rollout.max_completion_length=12")
    exs, prompts = _prompts(2)
    torch.manual_seed(1)
    batch = policy.rollout(exs, prompts, 3, "train", need_old_logps=True, need_ref_logps=False)
    model = policy.model.eval()
    for i in range(len(batch)):
        p, c = batch.payload["prompt_ids"][i], batch.payload["completion_ids"][i]
        ids = torch.cat([p, c]).unsqueeze(0)
        image_pad = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        vision = dict(pixel_values=batch.payload["pixel_values"][i], image_grid_thw=batch.payload["image_grid_thw"][i])
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), **vision,
                           mm_token_type_ids=(ids == image_pad).long()).logits[0].float()
            if i == 0:  # without the token types transformers falls back to 1D positions: different
                flat = model(input_ids=ids, attention_mask=torch.ones_like(ids), **vision).logits[0].float()
                assert not torch.allclose(flat, logits, atol=1e-4)
        logits[:, policy.suppressed_ids] = float("-inf")  # never sampled, so never scored
        want = torch.log_softmax(logits[len(p) - 1:-1], -1).gather(-1, c.unsqueeze(-1)).squeeze(-1)
        got = batch.old_logps[i, :len(c)]
        assert torch.allclose(got, want, atol=1e-4), (i, got, want)


def test_first_iteration_ratio_is_exactly_one(random_tiny_dir):
    """Re-scoring the sampled batch under unchanged weights gives importance ratio 1."""
    policy = _policy(random_tiny_dir, "train.micro_batch_size=4")
    policy.configure_optimizer(policy.cfg.train, 10)
    exs, prompts = _prompts(2)
    torch.manual_seed(2)
    batch = policy.rollout(exs, prompts, 4, "train", need_old_logps=True, need_ref_logps=False)
    batch.advantages = torch.linspace(-1, 1, len(batch))
    obj = Objective(ObjectiveConfig())
    metrics = policy.train_step(batch, obj, num_tokens=float(batch.action_mask.sum()), num_seqs=float(len(batch)))
    assert abs(metrics["ratio_mean"] - 1.0) < 1e-5
    assert metrics["clip_frac_low"] == 0.0 and metrics["clip_frac_high"] == 0.0
    assert metrics["grad_norm"] > 0


def _one_update(path, micro):
    policy = _policy(path, f"train.micro_batch_size={micro}", "train.learning_rate=1e-3")
    policy.configure_optimizer(policy.cfg.train, 10)
    exs, prompts = _prompts(2)
    torch.manual_seed(3)
    batch = policy.rollout(exs, prompts, 4, "train", need_old_logps=False, need_ref_logps=False)
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 1.0])
    obj = Objective(ObjectiveConfig())
    grads = capture_gradients(policy)
    m = policy.train_step(batch, obj, num_tokens=float(batch.action_mask.sum()), num_seqs=float(len(batch)))
    return grads, m, policy


@pytest.mark.slow
def test_gradient_accumulation_equals_one_big_batch(random_tiny_dir):
    """Micro-batches of 2 accumulate to the same gradient (and update) as one micro-batch of 8."""
    a, ma, policy = _one_update(random_tiny_dir, 8)
    b, mb, _ = _one_update(random_tiny_dir, 2)
    assert a and all(p.grad is None for p in policy.model.parameters())  # freed after the step
    assert abs(ma["grad_norm"] - mb["grad_norm"]) < 1e-4 * max(1.0, ma["grad_norm"])
    assert abs(ma["loss"] - mb["loss"]) < 1e-5
    # Compare gradients, not Adam's update: Adam's first step is ~lr*sign(g), which turns float
    # noise in near-zero gradients into lr-sized differences.
    assert a.keys() == b.keys()
    for n in a:
        assert torch.allclose(a[n], b[n], atol=1e-6, rtol=1e-4), n


@pytest.mark.slow
def test_freeze_vision_keeps_the_vision_tower_fixed(random_tiny_dir):
    policy = _policy(random_tiny_dir, "vlm.freeze_vision=true", "train.learning_rate=1e-2")
    from mmrl.vlm.policy import vision_tower

    tower = vision_tower(policy.model)
    before_v = [p.detach().clone() for p in tower.parameters()]
    before_lm = policy.model.lm_head.weight.detach().clone()
    policy.configure_optimizer(policy.cfg.train, 10)
    exs, prompts = _prompts(2)
    batch = policy.rollout(exs, prompts, 2, "train", need_old_logps=False, need_ref_logps=False)
    batch.advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    policy.train_step(batch, Objective(ObjectiveConfig()), 1.0, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(before_v, tower.parameters()))
    assert not torch.equal(before_lm, policy.model.lm_head.weight)


@pytest.mark.slow
def test_lora_adapters_start_from_the_run_seed(random_tiny_dir):
    """The adapters' initial weights are drawn from train.seed (the same in every run and on every
    rank, which a sharded run needs), without touching the run's own random stream."""
    def adapters(*extra):
        model = _policy(random_tiny_dir, "model.lora.enabled=true", *extra).model
        return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_A" in n}

    torch.manual_seed(0)
    first = adapters()
    torch.manual_seed(123)  # another global state: the same adapters
    assert all(torch.equal(w, first[n]) for n, w in adapters().items()) and first
    assert any(not torch.equal(w, first[n]) for n, w in adapters("train.seed=7").items())

    from mmrl.core.seeding import seeded

    torch.manual_seed(0)
    with seeded(5):
        torch.rand(10)
    resumed = torch.rand(1)
    torch.manual_seed(0)
    assert torch.equal(resumed, torch.rand(1))  # the block's draws left the global stream alone


@pytest.mark.slow
def test_lora_reference_is_the_base_model(random_tiny_dir):
    """With LoRA, disabling the adapters gives the reference policy: equal to the base before
    training, unchanged by training, while the adapted policy moves away from it."""
    policy = _policy(random_tiny_dir, "model.lora.enabled=true", "model.lora.r=4", "algo.beta=0.1",
                     "train.learning_rate=5e-2")
    assert policy.ref_module is None
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert not any("visual" in n for n in trainable)
    policy.configure_optimizer(policy.cfg.train, 10)
    exs, prompts = _prompts(2)
    torch.manual_seed(4)
    batch = policy.rollout(exs, prompts, 2, "train", need_old_logps=True, need_ref_logps=True)
    assert torch.allclose(batch.old_logps, batch.ref_logps, atol=1e-6)  # lora_B starts at zero
    batch.advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    obj = Objective(ObjectiveConfig(beta=0.1))
    for _ in range(3):
        policy.train_step(batch, obj, float(batch.action_mask.sum()), 4.0)
    assert torch.allclose(policy.score(batch, reference=True), batch.ref_logps, atol=1e-6)
    assert not torch.allclose(policy.score(batch, reference=False), batch.old_logps, atol=1e-4)


def test_full_finetune_with_kl_uses_a_frozen_copy(random_tiny_dir):
    policy = _policy(random_tiny_dir, "algo.beta=0.04")
    assert policy.ref_module is not None
    assert not any(p.requires_grad for p in policy.ref_module.parameters())


def test_missing_model_dir_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a local checkpoint directory"):
        _policy(tmp_path / "nope")


@pytest.mark.slow
def test_build_tiny_is_reproducible(tmp_path):
    """`mmrl build-tiny vlm` is deterministic: two builds (shortened SFT) are byte-identical."""
    from mmrl.vlm.tiny_builders import build_tiny_vlm

    a = build_tiny_vlm(tmp_path / "a", sft_steps=2, batch_size=4, progress=False, vision_steps=0)
    b = build_tiny_vlm(tmp_path / "b", sft_steps=2, batch_size=4, progress=False, vision_steps=0)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "preprocessor_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    policy = VLMPolicy(make_config(f"model.path={a}", "train.device=cpu"))
    assert policy.model.config.model_type == "qwen2_5_vl"
    # --vision-steps: the tower is pre-trained first (its patch embedding moves), then frozen
    c = build_tiny_vlm(tmp_path / "c", sft_steps=2, batch_size=4, progress=False, vision_steps=2)
    from safetensors.torch import load_file

    wa, wc = load_file(a / "model.safetensors"), load_file(c / "model.safetensors")
    patch = next(k for k in wa if "patch_embed" in k)
    assert not torch.equal(wa[patch], wc[patch])
