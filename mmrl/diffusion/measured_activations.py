"""What one denoising step's forward keeps for its backward, measured on the meta device.

``mmrl plan`` needs the bytes a generator's transformer saves for the backward of one training step
(the per-timestep backward of :mod:`mmrl.diffusion.policy`). Rather than derive them per architecture,
the transformer is built from its config on the meta device (shapes, no storage, no compute), made
trainable as the run trains it (every parameter, or peft LoRA adapters on ``target_modules`` only),
and run ONCE in the compute dtype on meta inputs of the real shapes (the adapter's ``plan_inputs``)
under :func:`torch.autograd.graph.saved_tensors_hooks`. Every tensor autograd saves is counted by
its storage, each storage once (a view shares its base's storage, so ``q``, ``k``, ``v`` cut from one
fused projection count once), parameters and buffers left out.

Assumptions, each what a GPU step does:

- attention is fused (flash / memory-efficient SDPA): it keeps its query, key, value, output and the
  float32 log-sum-exp of each query row, never the (L x L) attention matrix the math path of a CPU
  or meta dispatch would save. ``torch.nn.functional.scaled_dot_product_attention`` (which
  diffusers' attention dispatcher and processors call) is replaced during the measurement by
  :class:`FusedAttention`, an autograd function that saves exactly those;
- the transformer runs in the compute dtype without autocast (what the model itself upcasts, a float32
  RMSNorm, is counted; autocast's own casts are not), its LoRA adapters in float32 as peft keeps them
  beside a bfloat16 base: each adapted layer keeps a float32 copy of its input, where a run under autocast
  keeps a compute-dtype one (up to twice what the run keeps there);
- the plan measures at the micro-batch itself (twice it under classifier-free guidance, which the adapters
  batch): on the meta device a batch costs nothing to run, and what the batch shares (a positional table)
  counts once.

Gradient checkpointing (diffusers checkpoints each block of the ModuleLists in :data:`BLOCK_LISTS`):
each block keeps its inputs and one block is recomputed at a time, so the forward keeps the blocks'
inputs, what is saved outside the blocks and the largest block's own saves (:meth:`Measured.stored`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor

from mmrl.core.library_internals import storage_key

# The ModuleLists of blocks diffusers' transformers checkpoint one block at a time.
BLOCK_LISTS = ("transformer_blocks", "single_transformer_blocks", "blocks", "layers", "noise_refiner",
               "context_refiner", "siglip_refiner")


class FusedAttention(torch.autograd.Function):
    """Scaled dot-product attention that saves what a GPU's fused kernel saves for its backward: q, k,
    v, the output and the float32 log-sum-exp per query row (and the mask, which the memory-efficient
    kernel keeps). The forward computes the plain SDPA without autograd; the backward recomputes it."""

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, options):
        with torch.no_grad():
            out = _SDPA(query, key, value, attn_mask=attn_mask, **options)
            if out.dim() == 4:  # laid out (batch, query, head, dim) as the fused kernels write it, whatever the
                out = out.transpose(1, 2).contiguous().transpose(1, 2)  # device: a head merge after is a view
        lse = query.new_empty(query.shape[:-1], dtype=torch.float32)
        ctx.options, ctx.has_mask = options, attn_mask is not None
        ctx.save_for_backward(query, key, value, out, lse, *([attn_mask] if attn_mask is not None else []))
        return out

    @staticmethod
    def backward(ctx, grad):
        query, key, value, _out, _lse, *mask = ctx.saved_tensors
        with torch.enable_grad():
            q, k, v = (t.detach().requires_grad_(t.requires_grad) for t in (query, key, value))
            out = _SDPA(q, k, v, attn_mask=mask[0] if mask else None, **ctx.options)
            wanted = [t for t in (q, k, v) if t.requires_grad]
            grads = iter(torch.autograd.grad(out, wanted, grad) if wanted else ())
        return (*(next(grads) if t.requires_grad else None for t in (q, k, v)), None, None)


_SDPA = torch.nn.functional.scaled_dot_product_attention


def _fused_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    options = {"dropout_p": dropout_p, "is_causal": is_causal, "scale": scale, "enable_gqa": enable_gqa}
    return FusedAttention.apply(query, key, value, attn_mask, options)


@contextlib.contextmanager
def fused_attention() -> Iterator[None]:
    """``torch.nn.functional.scaled_dot_product_attention`` saves as a fused GPU kernel does (module docstring)."""
    functional = torch.nn.functional
    functional.scaled_dot_product_attention = _fused_sdpa
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = _SDPA


@dataclass(frozen=True)
class Measured:
    """Bytes one forward saved for the backward, each storage once (module docstring)."""

    outside: int  # saved by the layers outside the blocks (embeddings, output norm and projection)
    blocks: tuple[int, ...]  # saved inside each block, not already saved before it
    inputs: int  # the blocks' inputs (hidden streams, modulation, rotary tables), what checkpointing keeps
    recomputed: tuple[int, ...]  # per block: what its recomputation saves beyond the kept inputs and outside
    stream: int  # the largest block's inputs that require grad: the gradients its backward holds in and out
    largest: int  # the largest tensor a block saves: its gradient is held beside the stream's in the backward

    @property
    def backward(self) -> int:
        """Bytes a block's backward holds beside the saved ones: the gradients of its output and input
        streams and of its largest saved tensor (an MLP hidden)."""
        return 2 * self.stream + self.largest

    def stored(self, checkpointing: bool) -> int:
        """Bytes held for the backward: every save, or (checkpointing) the blocks' inputs, what is saved
        outside them and the largest block's recomputed saves."""
        if checkpointing:
            return self.inputs + self.outside + max(self.recomputed, default=0)
        return self.outside + sum(self.blocks)


class _Widest(torch.overrides.TorchFunctionMode):
    """The bytes of the largest tensor any torch function makes (views of its inputs, and of the model's
    parameters and buffers, are no new memory)."""

    def __init__(self, fixed: set[int]):
        super().__init__()
        self.fixed = fixed
        self.bytes = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = self.fixed | {storage_key(t) for t in _tensors((args, kwargs))}
        for t in _tensors(out):
            if storage_key(t) not in inputs:
                self.bytes = max(self.bytes, t.untyped_storage().nbytes())
        return out


def widest_tensor(model: torch.nn.Module, inputs: dict) -> int:
    """Bytes of the largest tensor of ``model(**inputs)`` without autograd (a sampling step), attention fused."""
    mode = _Widest({storage_key(t) for t in (*model.parameters(), *model.buffers())})
    with torch.no_grad(), fused_attention(), mode:
        model(**inputs)
    return mode.bytes


def block_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks diffusers checkpoints one at a time (:data:`BLOCK_LISTS`), in the model's order."""
    return [block for name in BLOCK_LISTS if isinstance(lists := model._modules.get(name), torch.nn.ModuleList)
            for block in lists]


def _tensors(value) -> Iterator[Tensor]:
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def measure(model: torch.nn.Module, inputs: dict) -> Measured:
    """Run ``model(**inputs)`` once and count what autograd saves for the backward (module docstring).
    Works alike on the meta device and on real tensors (tests/test_generator_plan.py checks both agree)."""
    fixed = {storage_key(t) for t in (*model.parameters(), *model.buffers())}
    sizes: dict[int, int] = {}
    owner: dict[int, int] = {}  # storage -> the block (-1: outside) that first saved it
    kept: list[Tensor] = []  # held until the end: a freed storage's address could be reused
    current = [-1]
    blocks = block_modules(model)
    seen = [set() for _ in blocks]  # per block: every storage it saved (its recomputation saves them again)
    block_inputs = [set() for _ in blocks]
    streams = [0 for _ in blocks]

    def pack(t: Tensor):
        key = storage_key(t)
        if key not in fixed and key not in owner:
            owner[key], sizes[key] = current[0], t.untyped_storage().nbytes()
            kept.append(t)
        if key not in fixed and current[0] >= 0:
            seen[current[0]].add(key)
        return t

    handles = []
    for i, block in enumerate(blocks):
        def enter(module, args, kwargs, i=i):
            tensors = [t for t in _tensors((args, kwargs))]
            kept.extend(tensors)
            keys = {storage_key(t): t.untyped_storage().nbytes() for t in tensors}
            sizes.update({k: v for k, v in keys.items() if k not in sizes})
            block_inputs[i] |= set(keys)
            grads = {storage_key(t): t.untyped_storage().nbytes() for t in tensors if t.requires_grad}
            streams[i] = sum(grads.values())
            current[0] = i

        def leave(module, args, kwargs, output):
            current[0] = -1

        handles.append(block.register_forward_pre_hook(enter, with_kwargs=True))
        handles.append(block.register_forward_hook(leave, with_kwargs=True))
    try:
        with fused_attention(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(**inputs)
    finally:
        for h in handles:
            h.remove()
    del out
    outside = {k for k, b in owner.items() if b == -1}
    per_block = [{k for k, b in owner.items() if b == i} for i in range(len(blocks))]
    inputs_kept = set().union(*block_inputs) - fixed
    held = inputs_kept | outside

    def total(keys) -> int:
        return sum(sizes[k] for k in keys)

    return Measured(outside=total(outside), blocks=tuple(total(b) for b in per_block), inputs=total(inputs_kept),
                    recomputed=tuple(total(b - held) for b in seen), stream=max(streams, default=0),
                    largest=max((sizes[k] for b in seen for k in b), default=0))
