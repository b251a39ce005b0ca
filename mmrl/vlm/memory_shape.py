"""A VLM run's shape for ``mmrl plan`` (:mod:`mmrl.core.memory_plan`): from the checkpoint's config.json
and the run's config only; the model is built on the meta device (parameter counts, no weights).

Activations are the tensors autograd keeps for the backward of one micro-batch, counted per token
of a decoder layer from what a Qwen2-style layer saves under autocast (residual stream of width
``r``: the trained embedding's dtype; compute dtype of width ``c``): each RMSNorm keeps a float32
copy of its input and its normalised output (``4h + r h``); the projections keep their input, one
``c h`` copy shared by q/k/v (or gate/up), or one copy each when autocast casts a float32 stream;
attention keeps q, the keys and values transformers' SDPA path repeats to every head (a padded
batch passes a mask, which rules out SDPA's own GQA), its output and o_proj's contiguous input
(``3 c q + 2 c q``); the SwiGLU MLP keeps gate, silu(gate), up and their product (``4 c i``). Under
gradient checkpointing a layer keeps only its input (``r h``) and one layer is recomputed at a
time; the backward holds the gradients of about one layer's activations beside them ("Reducing Activation Recomputation in Large Transformer Models", Korthikanti et al. 2022,
counts a GPT layer the same way). The lean log-probs (:mod:`mmrl.vlm.logprobs`) hold one chunk of
float32 logits, about four chunk-sizes while a chunk's backward runs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from mmrl.core.memory_plan import Mode, Widths

PROMPT_TEXT_TOKENS = 64  # a question and the chat template, when the caller does not say


@dataclass(frozen=True)
class Decoder:
    """A stack of pre-norm transformer layers: width, attention widths, MLP width, depth."""

    hidden: int
    q: int
    kv: int
    mlp: int
    layers: int

    def layer_bytes(self, tokens: int, attended: int, r: int, c: int) -> int:
        """What one layer keeps for ``tokens`` tokens whose attention reads ``attended`` keys in all."""
        h = self.hidden
        inputs = c * h if r == c else 0  # projections' inputs: shared, or cast once per projection
        casts = 0 if r == c else c * h
        norms = 2 * (4 * h + r * h)
        per_token = norms + 2 * inputs + 5 * casts + 3 * c * self.q + 4 * c * self.mlp
        return tokens * per_token + attended * 2 * c * self.q

    def stored(self, tokens: int, attended: int, r: int, c: int, checkpointing: bool) -> int:
        """Every layer's activations, or under checkpointing every layer's input and one layer
        recomputed; and the gradients of one layer's activations the backward holds beside them."""
        one = self.layer_bytes(tokens, attended, r, c)
        if checkpointing:
            return self.layers * tokens * r * self.hidden + 2 * one
        return (self.layers + 1) * one


@dataclass(frozen=True)
class VLMShape:
    params: int
    trainable: int
    adapter: int
    quantizable: int
    largest_layer: int
    reference: bool
    adapted: int  # weights of the LoRA-adapted linears (merged copies for generation)
    text: Decoder
    vision: Decoder | None
    vision_trained: bool
    vocab: int
    image_tokens: int  # per image, after the merger
    merge: int  # patches per image token
    images: int  # per prompt
    prompt: int
    completion: int
    micro_batch: int
    group: int
    prompts_per_step: int
    generate_batch: int
    shared_prefix: bool
    engine: str
    vllm_share: float
    merge_lora: bool
    pixels: int = 0

    def activations(self, mode: Mode, w: Widths) -> dict[str, int]:
        from .logprobs import CHUNK_BYTES

        c = w.compute
        r = c if mode.lora else w.trained
        mb, seq = self.micro_batch, self.prompt + self.completion
        prompts = math.ceil(mb / self.group) if self.shared_prefix else mb
        tokens = prompts * self.prompt + mb * self.completion
        acts = self.text.stored(tokens, mb * seq, r, c, mode.checkpointing)
        acts += tokens * (4 + 2 * r) * self.text.hidden  # the final norm and the head's input
        # a chunk's backward: its logits in the compute dtype and in float32, their float32 gradient
        # and exp(logits - lse), the gradient back in the compute dtype: about four float32 chunks
        logits = 4 * min(CHUNK_BYTES, mb * self.completion * self.vocab * 4)
        images = self.images * (math.ceil(mb / self.group) if self.vision else 0)
        if self.vision is not None and self.vision_trained and not mode.lora:
            patches = images * self.image_tokens * self.merge
            vision = self.vision.stored(patches, patches, w.trained, c, mode.checkpointing)
        else:  # a frozen tower's features, kept for the whole RL step
            vision = self.prompts_per_step * self.images * self.image_tokens * self.text.hidden * c
        vision += self.pixels  # every sample's float32 pixel values, kept in the batch through the update
        return {"activations": int(acts), "logits": int(logits), "vision tower": int(vision)}

    def rollout(self, mode: Mode, w: Widths, card: int) -> dict[str, int]:
        if self.engine == "vllm":
            return {"vLLM share": int(self.vllm_share * card)}
        kv = 2 * self.text.layers * self.text.kv * w.compute * self.generate_batch * (self.prompt + self.completion)
        # LoRA folded into copies of the adapted weights to generate (mmrl.vlm.lora_merge): the merged
        # copies, one layer's float32 delta at a time (not counted); a 4-bit base is not merged
        merged = self.adapted * w.compute if mode.lora and self.merge_lora and not mode.load_in_4bit else 0
        return {"KV cache": int(kv), "LoRA merge": int(merged)}


def read_config(cfg):
    """The checkpoint's transformers config: a built-in name or a local directory as mmrl loads it,
    a hub id's config.json alone (no weights)."""
    from transformers import AutoConfig

    from mmrl.config.hub import is_hub_id, resolve_checkpoint

    from .loading import resolve_model_path

    path = cfg.model.path
    if is_hub_id(path):  # the configs of its snapshot alone, through mmrl's cache and offline rules
        where = resolve_checkpoint(path, cfg.model.revision, only=["config.json", "preprocessor_config.json"])
        return AutoConfig.from_pretrained(where), where
    where = resolve_model_path(path, cfg.model.revision)
    return AutoConfig.from_pretrained(where), where


def _image_pixels(cfg, where: Path | None) -> int:
    """``vlm.max_pixels``, else the checkpoint's processor's largest image."""
    if cfg.vlm.max_pixels:
        return int(cfg.vlm.max_pixels)
    pre = json.loads((where / "preprocessor_config.json").read_text()) if where and \
        (where / "preprocessor_config.json").exists() else {}
    size = pre.get("size") or {}
    return int(pre.get("max_pixels") or size.get("longest_edge") or 12845056)


def vlm_shape(cfg, prompt_text: int = PROMPT_TEXT_TOKENS, images: int = 1) -> VLMShape:
    """The plan's shape of ``cfg``'s VLM run (module docstring): the model built on the meta device
    for its counts, the lengths and batch sizes from the run's config, ``images`` images of
    ``vlm.max_pixels`` and ``prompt_text`` text tokens per prompt."""
    from transformers import AutoModelForImageTextToText

    from .families import family_of
    from .loading import vision_tower
    from .logprobs import split_head
    from .shared_prefix import uses_shared_prefix

    config, where = read_config(cfg)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    family = family_of(config.model_type)
    tower = vision_tower(model)
    tower_names = {id(p) for p in tower.parameters()} if tower is not None else set()
    params = sum(p.numel() for p in model.parameters())
    vision_params = sum(p.numel() for p in tower.parameters()) if tower is not None else 0
    trained_tower = not cfg.vlm.freeze_vision
    targets = set(cfg.model.lora.target_modules or family.lora_targets)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    adapted = [m for n, m in linears if n.split(".")[-1] in targets and id(m.weight) not in tower_names]
    # a 4-bit base quantizes the Linear weights but the LM head's and the vision tower's
    quantizable = sum(m.weight.numel() for n, m in linears if id(m.weight) not in tower_names and n != "lm_head")
    backbone = split_head(model)[0]
    layer_params = [sum(p.numel() for p in layer.parameters()) for layer in backbone.language_model.layers]
    text_cfg = config.get_text_config()
    head_dim = getattr(text_cfg, "head_dim", None) or text_cfg.hidden_size // text_cfg.num_attention_heads
    text = Decoder(text_cfg.hidden_size, text_cfg.num_attention_heads * head_dim,
                   text_cfg.num_key_value_heads * head_dim, text_cfg.intermediate_size, text_cfg.num_hidden_layers)
    vision, image_tokens, merge, patch_values = None, 0, 1, 0
    vcfg = getattr(config, "vision_config", None)
    if tower is not None and vcfg is not None:
        merge = getattr(vcfg, "spatial_merge_size", 2) ** 2
        patch = getattr(vcfg, "patch_size", 14)
        image_tokens = math.ceil(_image_pixels(cfg, where) / (patch * patch * merge))
        patch_values = getattr(vcfg, "in_channels", 3) * getattr(vcfg, "temporal_patch_size", 1) * patch * patch
        vision = Decoder(vcfg.hidden_size, vcfg.hidden_size, vcfg.hidden_size, vcfg.intermediate_size,
                         getattr(vcfg, "depth", None) or vcfg.num_hidden_layers)
    samples = cfg.train.prompts_per_step * cfg.rollout.num_generations
    pixels = samples * images * image_tokens * merge * patch_values * 4 if vision else 0
    return VLMShape(
        params=params, trainable=params - (0 if trained_tower else vision_params),
        adapter=cfg.model.lora.r * sum(m.in_features + m.out_features for m in adapted),
        quantizable=quantizable, largest_layer=max(layer_params), reference=cfg.algo.beta > 0,
        adapted=sum(m.weight.numel() for m in adapted), text=text, vision=vision, vision_trained=trained_tower,
        vocab=text_cfg.vocab_size, image_tokens=image_tokens, merge=merge, images=images if vision else 0,
        prompt=prompt_text + (images * (image_tokens + 2) if vision else 0),
        completion=cfg.rollout.max_completion_length, micro_batch=min(cfg.train.micro_batch_size, samples),
        group=cfg.rollout.num_generations, prompts_per_step=cfg.train.prompts_per_step,
        generate_batch=min(cfg.rollout.batch_size or samples, samples),
        shared_prefix=uses_shared_prefix(cfg.train.shared_prefix, cfg.train.padding_free, backbone,
                                         family.shared_prefix_off),
        engine=cfg.rollout.engine, vllm_share=cfg.rollout.vllm_gpu_memory_utilization,
        merge_lora=cfg.rollout.merge_lora_for_generation, pixels=pixels)
