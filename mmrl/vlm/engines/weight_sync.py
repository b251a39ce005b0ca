"""The weights a vLLM engine holds a copy of, and how they travel to a server.

Both vLLM engines push the same tensors (:func:`engine_weights`): everything trained, by checkpoint
name; the vision tower only when it is trained; with LoRA the merged ``W + B A * scale``
(:mod:`mmrl.vlm.lora_merge`, computed out of place). The colocated engine hands them over as
tensors; for servers they are written as safetensors files (:func:`write_buckets`) into a private
directory that every server reloads (vLLM's ``reload_weights`` with ``weights_path``), in files of
at most 256 MB (TRL's bucket size), so no more than one bucket's copy is held at a time. A LoRA run
against servers that load adapters at runtime sends the base once (:func:`base_weights`) and then
only the adapters (:func:`write_adapters`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

import torch

from ..loading import vision_tower
from ..lora_merge import merged_lora_weights

BUCKET_BYTES = 256 * 2**20


def engine_weights(policy, everything: bool = False) -> list[tuple[str, torch.Tensor]]:
    """What an engine needs of the policy's weights, by checkpoint name: everything trained
    (LoRA: the merged weights) and the vision tower only when it is trained (``everything``: the
    tower too, for a server that may hold another run's weights)."""
    model = policy.module.get_base_model() if policy.lora else policy.module
    tower = vision_tower(model)
    skip = None
    if not everything and tower is not None and not any(p.requires_grad for p in tower.parameters()):
        skip = next(n for n, m in model.named_modules() if m is tower) + "."
    items = merged_lora_weights(policy.module) if policy.lora else model.state_dict().items()
    return [(n, t.detach()) for n, t in items if not (skip and n.startswith(skip))]


def base_weights(policy) -> list[tuple[str, torch.Tensor]]:
    """A LoRA policy's frozen base weights by checkpoint name, adapters left out (what a server
    that applies the adapters itself needs once)."""
    base = policy.module.get_base_model()
    return [(n.replace(".base_layer.", "."), t.detach()) for n, t in base.state_dict().items() if "lora_" not in n]


def write_adapters(policy, directory: Path) -> None:
    """The LoRA adapters alone in peft's format (``adapter_config.json``, ``adapter_model.safetensors``),
    what vLLM's ``/v1/load_lora_adapter`` reads, in a private directory."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    policy.module.save_pretrained(str(directory), safe_serialization=True)


def buckets(weights: Iterable[tuple[str, torch.Tensor]], limit: int = BUCKET_BYTES) -> list[list[tuple[str, torch.Tensor]]]:
    """Consecutive runs of ``weights`` of at most ``limit`` bytes each (a larger tensor alone)."""
    out: list[list[tuple[str, torch.Tensor]]] = []
    size = limit
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if size + nbytes > limit:
            out.append([])
            size = 0
        out[-1].append((name, tensor))
        size += nbytes
    return out


def write_buckets(weights: Sequence[tuple[str, torch.Tensor]], directory: Path,
                  limit: int = BUCKET_BYTES) -> list[Path]:
    """``weights`` as ``model-0000i-of-0000N.safetensors`` files of at most ``limit`` bytes in
    ``directory`` (made private, mode 0700: whoever can write there chooses the servers' weights).
    Each tensor is copied to CPU on its own storage (tied weights share one in the state dict)."""
    from safetensors.torch import save_file

    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    parts = buckets(weights, limit)
    paths = []
    for i, part in enumerate(parts, 1):
        path = directory / f"model-{i:05d}-of-{len(parts):05d}.safetensors"
        save_file({n: t.detach().to("cpu", copy=True).contiguous() for n, t in part}, str(path))
        paths.append(path)
    return paths
