"""Mixed-precision checks shared by the CPU tests (tests/test_precision.py) and the CUDA tests
(tests/test_gpu.py): the same policy, the same step, on another device.

``model.dtype=bfloat16`` is the compute dtype (mmrl.core.policy): trained parameters stay float32
master weights, frozen ones (a frozen vision tower, a generator's text encoders and VAE) are stored
in bfloat16, and forward passes run under autocast. One AdamW step at lr 1e-6 then moves nearly
every trained weight; the same step applied to bfloat16 weights of std 0.02 moves ~2% of them
(:func:`bf16_adamw_changed_fraction`), which is why master weights exist.
"""

from __future__ import annotations

import math

import torch

from conftest import make_config
from mmrl.core.losses import Objective, ObjectiveConfig

LR = 1e-6
ADVANTAGES = [-1.0, 1.0, 1.0, -1.0]  # 2 prompts x 2 samples, every group with signal


def changed_fraction(before: list[torch.Tensor], after: list[torch.Tensor]) -> float:
    """The fraction of elements that differ between two lists of tensors."""
    changed = sum(int((a != b.detach()).sum()) for a, b in zip(before, after))
    return changed / sum(a.numel() for a in before)


def one_step(policy, examples: list[dict], prompts: list, n: int = 2) -> tuple[float, dict]:
    """Roll out ``n`` samples per prompt, give them fixed advantages and take one optimizer step;
    returns the fraction of trained weights the step changed and the step's metrics."""
    policy.configure_optimizer(policy.cfg.train, 10)
    policy.begin_step(1)
    batch = policy.rollout(examples, prompts, n, "train", need_old_logps=False, need_ref_logps=False)
    batch.advantages = torch.tensor(ADVANTAGES[: len(batch)])
    before = [p.detach().clone() for p in policy.trainable_parameters()]
    metrics = policy.train_step(batch, Objective(ObjectiveConfig.from_algo(policy.cfg.algo)),
                                num_tokens=float(batch.action_mask.sum()), num_seqs=float(len(batch)))
    return changed_fraction(before, policy.trainable_parameters()), metrics


# -- the VLM ----------------------------------------------------------------------------------------

def vlm_policy(path, device: str, *extra: str):
    from mmrl.vlm.policy import VLMPolicy

    cfg = make_config(f"model.path={path}", f"train.device={device}", "model.dtype=bfloat16", "vlm.freeze_vision=true",
                      "task.name=counting", "rollout.max_completion_length=8", f"train.learning_rate={LR}",
                      "train.micro_batch_size=4", *extra)
    return VLMPolicy(cfg)


def check_vlm_bf16_step(path, device: str) -> None:
    """bf16 compute, float32 master weights, a bf16 frozen vision tower; one step at lr 1e-6 moves
    most trained weights (measured on CPU: 99.9%) and leaves them float32."""
    from mmrl.registry import TASKS
    from mmrl.vlm.policy import vision_tower

    policy = vlm_policy(path, device)
    trained = policy.trainable_parameters()
    assert trained and all(p.dtype == torch.float32 and p.device.type == device for p in trained)
    tower = list(vision_tower(policy.module).parameters())
    assert tower and all(p.dtype == torch.bfloat16 and not p.requires_grad for p in tower)
    task = TASKS.get("counting")()
    examples = policy.prepare_examples([{**task.examples("train")[i], "_index": i} for i in range(2)])
    fraction, metrics = one_step(policy, examples, [task.build_prompt(ex) for ex in examples])
    assert fraction > 0.5, fraction
    assert math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    assert all(p.dtype == torch.float32 for p in policy.trainable_parameters())


# -- the generator ----------------------------------------------------------------------------------

PROMPTS = ["a red circle", "two blue squares on the left"]


def frozen_generator_modules(pipe) -> dict[str, torch.nn.Module]:
    """The pipeline's modules besides the trained transformer: the tiny generator's text encoder, a
    diffusers pipeline's text encoders and VAE."""
    components = getattr(getattr(pipe, "pipe", None), "components", None)
    if components is None:
        return {"text_encoder": pipe.text_encoder}
    return {k: m for k, m in components.items() if isinstance(m, torch.nn.Module) and k != "transformer"}


def generator_policy(path, device: str, *extra: str):
    from mmrl.diffusion.policy import DiffusionPolicy

    cfg = make_config(f"model.path={path}", f"train.device={device}", "model.dtype=bfloat16", "task.name=t2i_prompts",
                      "diffusion.num_steps=3", "diffusion.height=16", "diffusion.width=16",
                      f"train.learning_rate={LR}", *extra)
    return DiffusionPolicy(cfg)


def check_generator_bf16_step(path, device: str) -> None:
    """The trained transformer in float32, text encoders / VAE in bf16; one step at lr 1e-6 moves
    most transformer weights (measured on CPU: 97%) and leaves them float32."""
    policy = generator_policy(path, device)
    trained = policy.trainable_parameters()
    assert trained and len(trained) == len(list(policy.transformer.parameters()))  # full fine-tuning
    assert all(p.dtype == torch.float32 and p.device.type == device for p in trained)
    frozen = frozen_generator_modules(policy.pipe)
    assert frozen and all(p.dtype == torch.bfloat16 and not p.requires_grad
                          for m in frozen.values() for p in m.parameters()), \
        {k: {p.dtype for p in m.parameters()} for k, m in frozen.items()}
    examples = [{"prompt": p, "_index": i} for i, p in enumerate(PROMPTS)]
    fraction, metrics = one_step(policy, examples, PROMPTS)
    assert fraction > 0.5, fraction
    assert math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    assert all(p.dtype == torch.float32 for p in policy.trainable_parameters())


# -- why master weights ------------------------------------------------------------------------------

def bf16_adamw_changed_fraction(device: str, dtype: torch.dtype, n: int = 512) -> float:
    """One ``torch.optim.AdamW`` step at lr 1e-6 on an (n, n) weight of std 0.02 held in ``dtype``:
    the fraction of its elements that change."""
    g = torch.Generator().manual_seed(0)
    weight = (torch.randn(n, n, generator=g) * 0.02).to(device, dtype)
    grad = torch.randn(n, n, generator=g).to(device, dtype)
    param = torch.nn.Parameter(weight.clone())
    optimizer = torch.optim.AdamW([param], lr=LR, weight_decay=0.0)
    param.grad = grad
    optimizer.step()
    return float((param.detach() != weight).float().mean())


def check_master_weights_contrast(device: str) -> None:
    """Adam's first step moves every weight by lr * m / sqrt(v) = lr * sign(g) = 1e-6. In float32
    (24 significant bits) that survives for every weight of std 0.02. bfloat16 has 8 significant
    bits: a weight in [2^e, 2^(e+1)) is spaced 2^(e-7), so a step of 1e-6 survives rounding only
    when 1e-6 > 2^(e-8), i.e. |w| < 2^-11 = 4.9e-4: P(|N(0, 0.02)| < 4.9e-4) = erf(4.9e-4 / (0.02
    sqrt 2)) = 0.0195. So ~2% of bf16 weights change, ~100% of float32 ones."""
    assert bf16_adamw_changed_fraction(device, torch.float32) > 0.99
    assert 0.01 < bf16_adamw_changed_fraction(device, torch.bfloat16) < 0.03
