"""A 4-bit base under LoRA adapters (QLoRA: "QLoRA: Efficient Finetuning of Quantized LLMs", Dettmers et
al. 2023), through bitsandbytes and transformers' ``BitsAndBytesConfig``.

``model.load_in_4bit`` stores the language model's Linear weights in 4 bits (``model.bnb_4bit_quant_type``:
NormalFloat ``nf4`` or ``fp4``; ``model.use_bnb_nested_quant``: the per-block scales quantized too, QLoRA's
double quantization) and computes in ``model.dtype``. What stays unquantized, and why:

- the vision tower: LoRA adapts no layer of it (:meth:`mmrl.vlm.policy.VLMPolicy._apply_lora`), it is a
  tenth of a Qwen2.5-VL's weights (0.67B of 7B), and every answer token reads its image features, which
  4-bit rounding would perturb for every box and count;
- the LM head: its logits are the policy's log-probs (the ratio, the KL and the rollouts' sampling all
  read them), and transformers keeps it unquantized by default for the same reason.

The quantized base cannot be trained, so a 4-bit base requires LoRA; the reference model of the KL term is
the base with the adapters off (as under LoRA); checkpoints keep the adapters alone; the hf engine
generates through the 4-bit layers with the adapters unmerged, the computation the training forward makes
(:mod:`mmrl.vlm.lora_merge` explains why merging does not apply); ``mmrl export`` merges the adapters into
the dequantized base (:func:`mmrl.vlm.lora_merge.dense_merged_weights`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass

import torch

QUANT_TYPES = ("nf4", "fp4")


@dataclass(frozen=True)
class FourBit:
    """The 4-bit base's settings (``model.bnb_4bit_quant_type``, ``model.use_bnb_nested_quant``)."""

    quant_type: str = "nf4"
    nested: bool = False

    def transformers_config(self, compute_dtype: torch.dtype, keep: Sequence[str]):
        """transformers' ``BitsAndBytesConfig``; ``keep``: module-name patterns left unquantized
        (``llm_int8_skip_modules``: a name prefix or a regex, matched from the start of the name)."""
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=self.quant_type,
                                  bnb_4bit_use_double_quant=self.nested, bnb_4bit_compute_dtype=compute_dtype,
                                  llm_int8_skip_modules=list(keep))


def four_bit(cfg) -> FourBit | None:
    """The run's :class:`FourBit` (None without ``model.load_in_4bit``), or a ``ConfigError`` of one
    line naming the keys of a combination that cannot run."""
    from mmrl.config import ConfigError

    m = cfg.model
    if not m.load_in_4bit:
        set_alone = [f"model.{k}={v!r}" for k, v, default in (("bnb_4bit_quant_type", m.bnb_4bit_quant_type, "nf4"),
                                                                ("use_bnb_nested_quant", m.use_bnb_nested_quant, False))
                     if v != default]
        if set_alone:
            raise ConfigError(f"{', '.join(set_alone)}: read only with model.load_in_4bit=true; set it or remove "
                              "the key(s)")
        return None
    if not m.lora.enabled:
        raise ConfigError("model.load_in_4bit=true needs model.lora.enabled=true: a 4-bit base is not trained "
                          "itself, LoRA adapters on it are (QLoRA); set model.lora.enabled=true, or "
                          "model.load_in_4bit=false for full fine-tuning")
    if m.bnb_4bit_quant_type not in QUANT_TYPES:
        raise ConfigError(f"model.bnb_4bit_quant_type={m.bnb_4bit_quant_type!r}: expected one of "
                          f"{', '.join(QUANT_TYPES)}")
    if cfg.rollout.engine != "hf":
        raise ConfigError(f"rollout.engine={cfg.rollout.engine} with model.load_in_4bit=true: the vLLM engines load "
                          "the base from model.path in full precision, which a 4-bit base is meant to avoid; use "
                          "rollout.engine=hf (it generates through the 4-bit layers)")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ImportError("model.load_in_4bit=true needs the bitsandbytes package, which is not installed: "
                          "pip install bitsandbytes (or mmrl's fit extra)", name="bitsandbytes")
    return FourBit(m.bnb_4bit_quant_type, bool(m.use_bnb_nested_quant))
