"""What one denoising step's backward keeps, with and without train.gradient_checkpointing.

The shipped tiny generator (model.path=tiny, the composition_tiny recipe's sampling settings), one
rollout of 2 prompts x 4 samples, then the first loss term of the update (one denoising step of a
micro-batch, the per-timestep backward's unit) is recomputed under a saved-tensors hook: every
tensor autograd keeps for the backward pass (each storage counted once) plus the inputs each
checkpoint holds to recompute from, attributed to the transformer's top-level part whose forward
saved it (parameters excluded: they are the weights, kept anyway). Run: python docs/examples/generator_step_memory.py
"""

from __future__ import annotations

import torch

import mmrl.core.activation_checkpointing as ac
from mmrl.config import load_config
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.core.seeding import seeded
from mmrl.diffusion.policy import DiffusionPolicy


def measure(gc: bool, micro_batch: int) -> tuple[dict[str, int], int]:
    kept: dict[int, tuple[str, int]] = {}
    where = ["(outside the transformer)"]
    weights: set[int] = set()  # parameters saved for backward are the weights, not activations

    def record(t, part):
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in weights:
            s = t.untyped_storage()
            kept.setdefault(s.data_ptr(), (part, s.nbytes()))

    original = torch.utils.checkpoint.checkpoint

    def counted(function, *args, **kwargs):
        for a in args:
            record(a, "inputs held by the checkpointed blocks")
        return original(function, *args, **kwargs)

    ac.checkpoint = counted
    cfg = load_config("diffusion/composition_tiny", ["train.device=cpu", f"train.micro_batch_size={micro_batch}",
                                                     f"train.gradient_checkpointing={str(gc).lower()}"])
    policy = DiffusionPolicy(cfg)
    weights.update(p.untyped_storage().data_ptr() for p in policy.transformer.parameters())
    for name, child in policy.transformer.named_children():
        blocks = child if isinstance(child, torch.nn.ModuleList) else [child]
        for i, block in enumerate(blocks):
            label = f"{name}.{i}" if isinstance(child, torch.nn.ModuleList) else name
            block.register_forward_pre_hook(lambda m, a, label=label: where.append(label))
            block.register_forward_hook(lambda m, a, o: (where.pop(), None)[1])
    for name, part in policy.transformer.transformer_blocks[0].named_children():  # the first block, by part
        part.register_forward_pre_hook(lambda m, a, name=name: where.append(f"transformer_blocks.0.{name}"))
        part.register_forward_hook(lambda m, a, o: (where.pop(), None)[1])
    with seeded(0):
        batch = policy.rollout([{"prompt": p, "_index": i} for i, p in enumerate(["a red circle", "two blue squares"])],
                               ["a red circle", "two blue squares"], 4, "train", need_old_logps=True,
                               need_ref_logps=False)
    batch.advantages = torch.linspace(-1, 1, len(batch))
    objective = Objective(ObjectiveConfig.from_algo(cfg.algo))
    policy.module.train()
    terms = policy.loss_terms(batch, objective, float(batch.action_mask.sum()), float(len(batch)))
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (record(t, where[-1]), t)[1], lambda t: t):
        loss, _ = next(terms)
    loss.backward()
    ac.checkpoint = original
    parts: dict[str, int] = {}
    for part, n in kept.values():
        parts[part] = parts.get(part, 0) + n
    return parts, sum(p.numel() * p.element_size() for p in policy.transformer.parameters())


if __name__ == "__main__":
    torch.manual_seed(0)
    for mb in (1, 8):
        for gc in (False, True):
            parts, weights = measure(gc, mb)
            total = sum(parts.values())
            print(f"micro-batch {mb}, gradient_checkpointing={gc}: {total / 2**20:.2f} MiB kept "
                  f"(transformer weights {weights / 2**20:.2f} MiB)")
            for part, n in sorted(parts.items(), key=lambda kv: -kv[1])[:14]:
                print(f"    {part:48s} {n / 2**20:8.2f} MiB")
