"""The predicted peak memory of a training step on one GPU, before anything loads (``mmrl plan``).

Modality-free accounting. A modality's reader (:mod:`mmrl.vlm.memory_shape`,
:mod:`mmrl.diffusion.memory_shape`) reads the checkpoint's config and the run's config into a
:class:`Shape`: parameter counts, and the bytes of one micro-batch's activations and of the
rollout under a :class:`Mode`. Here they become the rows a user reads (weights, gradients,
optimizer state, activations, logits, the reference copy, the vision tower, the rollout's KV cache or vLLM share) and the peak: the largest
of three phases, the update (all but the rollout's), the optimizer step (weights without the
autocast copies, gradients, state and the step's temporaries) and the rollout (weights, state and
the cache; gradients are freed after each optimizer step). A colocated vLLM holds its share of the
card throughout.

Bytes per parameter (:func:`widths`): trained weights in float32 (master weights, with the
autocast copy in the compute dtype that the backward keeps) or in the compute dtype; frozen weights
in the compute dtype; a 4-bit base as bitsandbytes stores it ("QLoRA: Efficient Finetuning of
Quantized LLMs", Dettmers et al. 2023: NF4 in blocks of 64 with a float32 scale each, or with
double quantization 8-bit scales and a float32 per 256 of them); optimizer state as measured on the
``train.optim`` registry's own optimizer. Sharding (FSDP2, ZeRO-3) divides the weights, gradients
and optimizer state over the GPUs and gathers a layer at a time; CPU offload keeps all three in
host memory.
"""

from __future__ import annotations

import functools
import re
import warnings
from dataclasses import dataclass
from typing import Protocol

import torch

from mmrl.registry import OPTIMIZERS

GIB = 2**30
# Left free on the card: the CUDA context and the allocator's fragmentation, which the allocator's
# peak (what the plan predicts and torch.cuda.max_memory_allocated reports) does not include.
HEADROOM = 0.05
NF4_BITS = {False: 4 + 32 / 64, True: 4 + 8 / 64 + 32 / (64 * 256)}  # by double quantization


@dataclass(frozen=True)
class Mode:
    """One way to run the same recipe: a row of the plan. ``overrides``: what turns it on."""

    name: str
    optim: str
    checkpointing: bool = False
    lora: bool = False
    load_in_4bit: bool = False
    double_quant: bool = False
    shard: int = 1  # FSDP2 / ZeRO-3 over this many GPUs (1: each GPU holds everything)
    offload: bool = False  # weights, gradients and optimizer state in host memory (FSDP2 / ZeRO-3 offload)
    overrides: str = ""


@dataclass(frozen=True)
class Widths:
    """Bytes per element the mode stores: the compute dtype, the trained weights, the optimizer state
    per trained parameter."""

    compute: int
    trained: int
    state: float
    step: float = 0.0  # the optimizer step's temporaries per trained parameter


class Shape(Protocol):
    """What a modality reads from the checkpoint's and the run's config."""

    params: int  # every parameter of the checkpoint (the trained model, and the reference copy)
    trainable: int  # what full fine-tuning trains (frozen towers left out)
    adapter: int  # what LoRA trains (model.lora.r on its target modules)
    quantizable: int  # what a 4-bit base stores in 4 bits (the rest stays in the compute dtype)
    largest_layer: int  # the parameters a sharded step gathers at once (one block)
    reference: bool  # the KL needs a reference model (a copy unless LoRA turns the adapters off)

    def activations(self, mode: Mode, widths: Widths) -> dict[str, int]:
        """Bytes of one micro-batch's update: {"activations", "logits", "vision tower"}."""

    def rollout(self, mode: Mode, widths: Widths, card: int) -> dict[str, int]:
        """Bytes the rollout adds: {"KV cache"} or {"vLLM share"}, and any weight copies it makes."""


ROWS = ("weights", "gradients", "optimizer state", "activations", "logits", "reference model", "vision tower",
        "KV cache", "vLLM share", "LoRA merge")


@dataclass
class Plan:
    mode: Mode
    rows: dict[str, int]
    update: int  # bytes held at the update's peak
    rollout: int  # bytes held at the rollout's peak
    step: int  # bytes held during the optimizer step
    card: int

    @property
    def peak(self) -> int:
        """The peak of a step after the first (the optimizer state exists throughout)."""
        return max(self.update, self.rollout, self.step)

    @property
    def first_step_peak(self) -> int:
        """The peak of the first step, whose optimizer state is made only by its optimizer step."""
        state = self.rows["optimizer state"]
        return max(self.update - state, self.rollout - state, self.step)

    @property
    def fits(self) -> bool:
        return self.peak <= self.card * (1 - HEADROOM)


@functools.lru_cache(maxsize=None)
def optimizer_bytes(optim: str, trained_dtype: torch.dtype) -> tuple[float, float]:
    """(state, step temporaries) in bytes per trained parameter of ``train.optim``. The state is
    measured: the registered factory steps one 64k-element parameter once (state is made at the
    first step) and its state tensors are counted, so a plugin or an 8-bit optimizer is planned as
    it really stores (``torch.compile`` held back: torchao's compiled step runs eagerly, the same
    state, seconds sooner). The temporaries: ``torch.optim.AdamW``'s foreach step, its default on
    CUDA, takes the square root of every second moment at once (a copy of half its state); the
    others step fused or tensor by tensor, which holds next to nothing."""
    build = OPTIMIZERS.get(optim, "train.optim")
    p = torch.nn.Parameter(torch.zeros(65536, dtype=trained_dtype))
    opt = build([p], lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, eps=1e-8)
    p.grad = torch.full_like(p, 1e-3)
    with torch.compiler.set_stance("force_eager"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bitsandbytes: paged optimizers fall back to unpaged on a CPU
        opt.step()
    storages = {}
    for state in opt.state.values():
        for v in state.values():
            if torch.is_tensor(v) and v.numel() > 1:
                storages[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()
    state = sum(storages.values()) / p.numel()
    return state, state / 2 if type(opt) is torch.optim.AdamW else 0.0


def state_bytes(optim: str, trained_dtype: torch.dtype) -> float:
    """Optimizer state bytes per trained parameter of ``train.optim`` (:func:`optimizer_bytes`)."""
    return optimizer_bytes(optim, trained_dtype)[0]


def widths(optim: str, compute: torch.dtype) -> Widths:
    """The bytes a mode stores per element (module docstring). A bf16-weight optimizer under a
    float32 compute dtype is planned as the run would refuse it: not at all (ValueError)."""
    from .precision import trained_dtype

    trained = trained_dtype(optim, compute)
    return Widths(compute.itemsize, trained.itemsize, *optimizer_bytes(optim, trained))


def weight_bytes(shape: Shape, mode: Mode, w: Widths) -> tuple[int, int, int]:
    """(bytes of the weights on one GPU, of them the autocast copies the backward keeps, the number
    of parameters trained)."""
    if mode.lora:
        trained = shape.adapter
        if mode.load_in_4bit:
            base = shape.quantizable * NF4_BITS[mode.double_quant] / 8 + (shape.params - shape.quantizable) * w.compute
        else:
            base = shape.params * w.compute
        return int(base + trained * w.trained), 0, trained
    trained = shape.trainable
    copy = trained * w.compute if w.trained != w.compute else 0  # the compute-dtype copy the backward keeps
    return int(trained * w.trained + copy + (shape.params - trained) * w.compute), copy, trained


def plan(shape: Shape, mode: Mode, compute: torch.dtype, card: int) -> Plan:
    """The rows and the peaks of ``mode`` on a GPU of ``card`` bytes (module docstring)."""
    w = widths(mode.optim, compute)
    weights, copy, trained = weight_bytes(shape, mode, w)
    rows = dict.fromkeys(ROWS, 0)
    rows["weights"], rows["gradients"], rows["optimizer state"] = weights, trained * w.trained, int(trained * w.state)
    temporaries = int(trained * w.step)  # the optimizer step's
    if shape.reference and not mode.lora:
        rows["reference model"] = shape.params * w.compute
    if mode.shard > 1 or mode.offload:
        keep = 0 if mode.offload else 1 / mode.shard
        for key in ("weights", "gradients", "optimizer state"):
            rows[key] = int(rows[key] * keep)
        copy, temporaries = int(copy * keep), int(temporaries * keep)
        rows["reference model"] //= mode.shard  # sharded like the policy, kept on the GPU
        rows["weights"] += 2 * shape.largest_layer * w.compute  # the layer computing and the one prefetched
    rows.update(shape.activations(mode, w))
    rows.update(shape.rollout(mode, w, card))
    held = rows["weights"] + rows["optimizer state"] + rows["vLLM share"] + rows["vision tower"]
    update = held + sum(rows[k] for k in ("gradients", "activations", "logits", "reference model"))
    rollout = held + rows["KV cache"] + rows["LoRA merge"]
    # the optimizer step: the autocast copies went with the graph, the step's temporaries come
    step = held - copy + rows["gradients"] + rows["reference model"] + temporaries
    return Plan(mode, rows, update, rollout, step, card)


def parse_size(text: str) -> int:
    """``80GB``, ``24G``, ``141GiB`` or ``80`` as bytes, GB read as GiB: a card sold as "80 GB" holds
    about 80 GiB (an H100 80GB reports 81,559 MiB = 79.6 GiB, an RTX 4090 24GB 23.99 GiB), and
    the plan compares it with allocator bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(gib|gb|g|mib|mb|m)?\s*", text.lower())
    if not m:
        raise ValueError(f"--gpu {text!r}: give the card's memory as 80GB, 24GB or 141GB")
    return int(float(m.group(1)) * (2**20 if (m.group(2) or "g").startswith("m") else GIB))
