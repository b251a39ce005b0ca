"""LoRA adapters folded into the base weights for generation, and the merged weights for an engine.

Generating through unmerged adapters costs two extra small matmuls per adapted layer per token
(measured on an H100: LoRA r16 halved HF ``generate``'s speed on a 3B model). Merging for the
rollout and unmerging for training is the fix, but peft's ``merge_adapter``/``unmerge_adapter``
add and then subtract ``B A * scaling`` in the base weights' dtype: in bf16 the base drifts by a
rounding error at every step. Here the merged weights are new tensors and the original ones are
put back afterwards, so the base is bit-for-bit what it was (a test checks it); the cost is one
copy of the adapted weights during generation (in the base's dtype; one layer's float32 delta at a time).

Over a 4-bit base (``model.load_in_4bit``, :mod:`mmrl.vlm.quantization`) generation does not merge:
``W + delta`` cannot be stored in the 4-bit weight, and holding dense copies of every adapted layer
for the rollout would bring back the memory the 4-bit base saves. The hf engine then generates
through the 4-bit layers with the adapters on, the very computation of the training forward, so the
rollouts sample from the distribution whose log-probs training computes (on the tiny model: the same
log-probs to the last bit in float32, a test checks it). For ``mmrl export`` the adapters are folded
into the dequantized base (:func:`merged_lora_weights`).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


def lora_layers(peft_model) -> dict[str, torch.nn.Module]:
    """``{module name: LoRA layer}`` of every layer with an active adapter (names of the base model)."""
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in peft_model.get_base_model().named_modules()
            if isinstance(module, LoraLayer) and any(a in module.lora_A for a in module.active_adapters)}


def lora_delta(layer) -> torch.Tensor:
    """A LoRA layer's float32 ``delta = B A * scaling``, summed over its active adapters (peft's
    ``get_delta_weight``). Computed one layer at a time by the callers: every layer's float32 delta
    at once would hold 4 bytes per adapted weight (11 GiB on a 3B model) beside the merged copies."""
    deltas = [layer.get_delta_weight(a).float() for a in layer.active_adapters if a in layer.lora_A]
    return deltas[0] if len(deltas) == 1 else torch.stack(deltas).sum(0)


def dense_weight(layer: torch.nn.Module) -> torch.Tensor:
    """A Linear layer's weight as an ordinary tensor: its own, or a bitsandbytes 4-bit weight
    dequantized (in the dtype it was quantized from)."""
    quant_state = getattr(layer.weight, "quant_state", None)  # bitsandbytes' Params4bit
    if quant_state is None:
        return layer.weight
    from bitsandbytes.functional import dequantize_4bit

    return dequantize_4bit(layer.weight.data, quant_state)


def merged_lora_weights(peft_model) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's state dict with every active LoRA adapter folded in (``W + delta`` computed
    in float32, returned in the base weight's dtype); adapter tensors left out and ``.base_layer``
    removed from names, so the names are those of the plain checkpoint (what vLLM loads). A 4-bit
    layer's weight is dequantized first and its quantization state (``weight.absmax`` ...) left out:
    the state dict of the unquantized model that computes what the trained one does."""
    base = peft_model.get_base_model()
    adapted = {f"{name}.weight": layer for name, layer in lora_layers(peft_model).items()}
    quantized = {f"{name}.weight".replace(".base_layer.", "."): module for name, module in base.named_modules()
                 if getattr(getattr(module, "weight", None), "quant_state", None) is not None}
    for name, tensor in base.state_dict().items():
        if "lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        if ".weight." in name and name.rsplit(".weight.", 1)[0] + ".weight" in quantized:
            continue  # the 4-bit weight's quantization state
        if name in quantized:
            tensor = dense_weight(quantized[name])
        if name in adapted:
            tensor = (tensor.float() + lora_delta(adapted[name]).to(tensor.device)).to(tensor.dtype)
        yield name, tensor


@contextlib.contextmanager
def merged_for_generation(peft_model):
    """Inside: the adapted layers' weights are ``W + delta`` (new tensors) and the adapters are off,
    so the model computes what the adapted one does with plain matmuls; on exit the original weight
    tensors are restored unchanged and the adapters are on again."""
    saved = []
    try:
        with torch.no_grad():
            for layer in lora_layers(peft_model).values():  # one float32 delta alive at a time
                weight = layer.get_base_layer().weight
                saved.append((weight, weight.data))
                weight.data = (weight.data.float() + lora_delta(layer).to(weight.device)).to(weight.dtype)
        with peft_model.disable_adapter():
            yield peft_model
    finally:
        for weight, original in saved:
            weight.data = original
