"""A 4-bit base under LoRA (QLoRA, ``model.load_in_4bit``) on the random tiny VLM, float32 compute, on
CPU: what is quantized, that a step trains the adapters and leaves the base, that a run resumes exactly
(with bitsandbytes' 8-bit AdamW), that the reference is the 4-bit base, that rollouts are computed as
training computes, the export, and the one-line refusals."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import torch

from conftest import make_config, tiny_run_config, tiny_trainer
from mmrl.config import ConfigError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes (the fit extra)")

QLORA = ("model.lora.enabled=true", "model.load_in_4bit=true", "model.use_bnb_nested_quant=true")


def qlora_trainer(path, out, steps=2, *extra):
    return tiny_trainer(tiny_run_config(path, out, steps, *QLORA, *extra))


def four_bit_layers(module) -> dict[str, torch.nn.Module]:
    from bitsandbytes.nn import Linear4bit

    return {name: m for name, m in module.named_modules() if isinstance(m, Linear4bit)}


def base_state(module) -> dict[str, torch.Tensor]:
    """Every tensor of the base model, the 4-bit weights' packed bytes and quantization state included."""
    return {k: v.clone() for k, v in module.state_dict().items() if "lora_" not in k}


def token_batch(policy, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, policy.tokenizer.vocab_size - 1, (2, 12), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@pytest.mark.slow
def test_the_language_model_is_4bit_and_the_vision_tower_and_head_are_not(random_tiny_dir, tmp_path):
    from mmrl.vlm.loading import vision_tower

    policy = qlora_trainer(random_tiny_dir, tmp_path).policy
    quantized = four_bit_layers(policy.module)
    language_linears = [n for n, m in policy.module.named_modules()
                        if isinstance(m, torch.nn.Linear) and ".language_model." in n and "lora_" not in n]
    assert quantized and set(language_linears) == set(quantized)  # every Linear of the language model
    tower = vision_tower(policy.module.get_base_model())
    assert not four_bit_layers(tower) and any(isinstance(m, torch.nn.Linear) for m in tower.modules())
    head = policy.module.get_output_embeddings()
    assert type(head) is torch.nn.Linear and head.weight.dtype == torch.float32
    assert all(m.weight.quant_state.nested and m.weight.quant_state.quant_type == "nf4" for m in quantized.values())
    trained = [n for n, p in policy.module.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    for backend in ("FSDP2", "DeepSpeed ZeRO-3"):
        with pytest.raises(NotImplementedError, match=f"^{backend} with model.load_in_4bit=true"):
            policy.check_shardable(backend)


@pytest.mark.slow
def test_a_qlora_step_trains_the_adapters_and_leaves_the_4bit_base(random_tiny_dir, tmp_path):
    """One RL step (every advantage 1, so every sample has a gradient): every lora_B moves; every lora_A
    stays (peft starts B at 0, so A's gradient B^T dL/dy is 0 at the first step, and Adam moves a weight
    with a zero gradient by nothing without weight decay); every tensor of the base, packed 4-bit bytes
    and scales included, is as loaded."""
    trainer = qlora_trainer(random_tiny_dir, tmp_path)
    policy = trainer.policy
    base = base_state(policy.module)
    adapters = {n: p.detach().clone() for n, p in policy.module.named_parameters() if p.requires_grad}
    batch, _ = trainer.rollout_step(1)
    batch.advantages = torch.ones(len(batch))
    metrics = trainer.update(batch, 1)
    assert metrics["skipped_update"] == 0.0 and metrics["grad_norm"] > 0
    after = dict(policy.module.named_parameters())
    assert {n for n, before in adapters.items() if not torch.equal(after[n], before)} == \
        {n for n in adapters if "lora_B" in n}
    for key, value in base_state(policy.module).items():
        assert torch.equal(value, base[key]), key


@pytest.mark.slow
def test_rollouts_compute_what_training_computes(random_tiny_dir, tmp_path):
    """bitsandbytes repacks a 4-bit weight for a bf16 CPU kernel at its first eval forward without
    gradients (mmrl.core.library_internals.keep_4bit_weights_unpacked keeps it from doing so): the
    logits of a rollout-style forward (eval, no grad), before and after generating, and of a training
    forward (train mode, gradients on) are the same to the bit, and a backward runs after a rollout."""
    trainer = qlora_trainer(random_tiny_dir, tmp_path)
    policy = trainer.policy
    for name, p in policy.module.named_parameters():
        if "lora_B" in name:  # peft starts B at 0: make the adapters matter
            p.data.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    enc = token_batch(policy)
    policy.module.eval()
    with torch.no_grad():
        before = policy.module(**enc).logits
    trainer.rollout_step(1)  # generates through the 4-bit layers
    with torch.no_grad():
        after = policy.module(**enc).logits
    policy.module.train()
    training = policy.module(**enc).logits
    training.sum().backward()
    assert torch.equal(before, after) and torch.equal(training.detach(), before)
    assert all(p.grad is not None for p in policy.trainable_parameters())


@pytest.mark.slow
def test_the_reference_is_the_4bit_base(random_tiny_dir, tmp_path):
    """algo.beta > 0: no copy is made; after a step the reference (adapters off) computes exactly
    what a freshly loaded 4-bit base does, and the policy itself no longer does."""
    from mmrl.vlm.loading import load_vlm
    from mmrl.vlm.quantization import FourBit

    trainer = qlora_trainer(random_tiny_dir, tmp_path, 2, "algo.beta=0.1")
    policy = trainer.policy
    assert policy.ref_module is None
    batch, _ = trainer.rollout_step(1)
    batch.advantages = torch.ones(len(batch))
    trainer.update(batch, 1)
    enc = token_batch(policy)
    base, _ = load_vlm(str(random_tiny_dir), torch.device("cpu"), torch.float32, four_bit=FourBit("nf4", True))
    with torch.no_grad():
        with policy.reference() as ref:
            reference = ref(**enc).logits
        trained = policy.module(**enc).logits
        fresh = base.eval()(**enc).logits
    assert torch.equal(reference, fresh)
    assert not torch.equal(trained, fresh)


def _rows(run):
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "reward" in r}


@pytest.mark.slow
def test_a_qlora_run_resumes_exactly(random_tiny_dir, tmp_path):
    """Steps 1-4 straight == steps 1-2, checkpoint, resume 3-4, with bitsandbytes' 8-bit AdamW: the same
    value of every metric at every step and the same adapter weights, to the bit. The checkpoint holds
    the adapters, not the base."""
    from mmrl.core.policy_checkpoint import ADAPTER_FILE
    from mmrl.core.trainer import Trainer
    from mmrl.vlm.policy import VLMPolicy

    def train(out, steps, *extra):
        cfg = tiny_run_config(random_tiny_dir, out, steps, *QLORA, "train.optim=adamw_bnb_8bit", *extra)
        policy = VLMPolicy(cfg)
        Trainer(cfg, policy).train()
        return policy

    straight = train(tmp_path / "a", 4)
    train(tmp_path / "b", 2)
    saved = tmp_path / "b" / "run" / "checkpoints" / "step_00000002" / "policy"
    assert (saved / ADAPTER_FILE).exists() and not (saved / "model").exists()
    resumed = train(tmp_path / "b", 4, "resume=true", "allow_config_change=true")
    a, b = _rows(tmp_path / "a" / "run"), _rows(tmp_path / "b" / "run")
    assert sorted(b) == [1, 2, 3, 4]
    for step in (1, 2, 3, 4):
        keys = set(a[step]) - {"step_time", "time", "elapsed", "timestamp"}
        differ = {k for k in keys if "time" not in k and a[step][k] != b[step].get(k)}
        assert not differ, (step, {k: (a[step][k], b[step].get(k)) for k in differ})
    for (name, p), (_, q) in zip(straight.module.named_parameters(), resumed.module.named_parameters()):
        assert torch.equal(p, q), name


@pytest.mark.slow
def test_export_merges_the_adapters_into_the_dequantized_base(random_tiny_dir, tmp_path):
    """``mmrl export`` of a QLoRA run: an unquantized checkpoint transformers loads, whose logits are
    the trained policy's (adapters on) to float32 rounding: each 4-bit weight dequantized plus B A s."""
    from transformers import AutoModelForImageTextToText

    policy = qlora_trainer(random_tiny_dir, tmp_path).policy
    for name, p in policy.module.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    policy.export_pretrained(tmp_path / "out")
    exported = AutoModelForImageTextToText.from_pretrained(str(tmp_path / "out"), dtype=torch.float32).eval()
    assert getattr(exported.config, "quantization_config", None) is None
    assert not four_bit_layers(exported)
    enc = token_batch(policy)
    with torch.no_grad():
        trained = policy.module.eval()(**enc).logits
        with policy.adapters_disabled():
            base = policy.module(**enc).logits
        merged = exported(**enc).logits
    assert (trained - base).abs().max() > 1e-2  # the adapters matter
    assert torch.allclose(merged, trained, atol=1e-5, rtol=0)
    shutil.rmtree(tmp_path / "out")


@pytest.mark.parametrize("overrides, message", [
    (("model.load_in_4bit=true",), "model.load_in_4bit=true needs model.lora.enabled=true: a 4-bit base is not "
                                   "trained itself, LoRA adapters on it are (QLoRA); set model.lora.enabled=true, "
                                   "or model.load_in_4bit=false for full fine-tuning"),
    ((*QLORA, "model.bnb_4bit_quant_type=int4"), "model.bnb_4bit_quant_type='int4': expected one of nf4, fp4"),
    (("model.use_bnb_nested_quant=true", "model.bnb_4bit_quant_type=fp4"),
     "model.bnb_4bit_quant_type='fp4', model.use_bnb_nested_quant=True: read only with model.load_in_4bit=true; "
     "set it or remove the key(s)"),
    ((*QLORA, "rollout.engine=vllm"), "rollout.engine=vllm with model.load_in_4bit=true: the vLLM engines load the "
                                      "base from model.path in full precision, which a 4-bit base is meant to avoid; "
                                      "use rollout.engine=hf (it generates through the 4-bit layers)"),
])
def test_what_cannot_run_stops_at_setup_with_one_line(overrides, message, random_tiny_dir):
    from mmrl.vlm.policy import VLMPolicy

    with pytest.raises(ConfigError) as err:
        VLMPolicy(make_config(f"model.path={random_tiny_dir}", "train.device=cpu", *overrides))  # before loading
    assert str(err.value) == message


def test_a_missing_bitsandbytes_is_one_line_with_the_pip_command(monkeypatch):
    import importlib.util

    from mmrl.vlm.quantization import four_bit

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    with pytest.raises(ImportError) as err:
        four_bit(make_config(*QLORA))
    assert str(err.value) == ("model.load_in_4bit=true needs the bitsandbytes package, which is not installed: "
                              "pip install bitsandbytes (or mmrl's fit extra)")
