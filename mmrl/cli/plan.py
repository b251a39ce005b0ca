"""``mmrl plan RECIPE [overrides] --gpu 80GB --gpus N``: the predicted peak memory per GPU of a run, in
each memory mode, before anything loads, and the knobs that make it fit; the one-line warning of
``mmrl train`` when the plan says the run will not fit its CUDA device.

The accounting is :mod:`mmrl.core.memory_plan`'s; a VLM's shape is read by
:mod:`mmrl.vlm.memory_shape`, a generator's (any family with an adapter: one denoising step's
activations measured on the meta device) by :mod:`mmrl.diffusion.memory_shape`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mmrl.core.memory_plan import GIB, HEADROOM, Mode, Plan, plan
from mmrl.registry import OPTIMIZERS

EIGHT_BIT = "adamw_bnb_8bit"  # transformers' name of bitsandbytes' 8-bit AdamW


def shape_of(cfg, modality: str = "vlm", prompt_text: int | None = None, images: int = 1):
    """The plan's shape of ``cfg`` (:mod:`mmrl.vlm.memory_shape`, :mod:`mmrl.diffusion.memory_shape`)."""
    if modality == "diffusion":
        from mmrl.diffusion.memory_shape import generator_shape

        return generator_shape(cfg)
    if modality != "vlm":
        raise ValueError(f"mmrl plan covers VLM and generator runs: a {modality} run's memory is not modelled yet")
    from mmrl.vlm.memory_shape import PROMPT_TEXT_TOKENS, vlm_shape

    return vlm_shape(cfg, PROMPT_TEXT_TOKENS if prompt_text is None else prompt_text, images)


def configured_mode(cfg) -> Mode:
    """The run as its config says: one GPU per process, nothing sharded."""
    return Mode("as configured", cfg.train.optim, checkpointing=cfg.train.gradient_checkpointing,
                lora=cfg.model.lora.enabled, load_in_4bit=cfg.model.load_in_4bit,
                double_quant=cfg.model.use_bnb_nested_quant)


def modes(cfg, gpus: int, modality: str = "vlm") -> list[Mode]:
    """As configured, then each knob on top (gradient checkpointing on from the second row), in the
    order a user would reach for them: exact and cheap first, changing what is trained last."""
    base = configured_mode(cfg)
    ck = dataclasses.replace(base, checkpointing=True)
    out = [base]
    if not base.checkpointing:
        out.append(dataclasses.replace(ck, name="+ gradient checkpointing", overrides="train.gradient_checkpointing=true"))
    ov = "train.gradient_checkpointing=true"
    full = not base.lora
    if full and OPTIMIZERS.get(base.optim, "train.optim").master_weights and cfg.model.dtype == "bfloat16":
        out.append(dataclasses.replace(ck, name="+ adamw_kahan (bf16 weights)", optim="adamw_kahan",
                                       overrides=f"{ov} train.optim=adamw_kahan"))
    if full and EIGHT_BIT in [name for name, _ in OPTIMIZERS.items()] and base.optim != EIGHT_BIT:
        out.append(dataclasses.replace(ck, name="+ 8-bit AdamW", optim=EIGHT_BIT,
                                       overrides=f"{ov} train.optim={EIGHT_BIT}"))
    if modality != "vlm":  # a generator's frozen encoders and VAE stay on each GPU, which sharding's rows leave out
        return out + ([dataclasses.replace(ck, name=f"LoRA r={cfg.model.lora.r}", lora=True,
                                           overrides=f"{ov} model.lora.enabled=true")] if full else [])
    if gpus > 1:
        out.append(dataclasses.replace(ck, name=f"+ FSDP2 / ZeRO-3 over {gpus}", shard=gpus,
                                       overrides=f"{ov}, launched with configs/accelerate/fsdp2.yaml"))
    out.append(dataclasses.replace(ck, name="+ CPU offload", shard=gpus, offload=True,
                                   overrides=f"{ov}, launched with configs/accelerate/fsdp2_offload.yaml"))
    if full:
        out.append(dataclasses.replace(ck, name=f"LoRA r={cfg.model.lora.r}", lora=True,
                                       overrides=f"{ov} model.lora.enabled=true"))
    if not base.load_in_4bit and modality == "vlm":  # a generator's base is never 4-bit
        out.append(dataclasses.replace(ck, name=f"QLoRA r={cfg.model.lora.r} (4-bit base)", lora=True,
                                       load_in_4bit=True, double_quant=True,
                                       overrides=f"{ov} model.lora.enabled=true model.load_in_4bit=true "
                                                 "model.use_bnb_nested_quant=true"))
    return out


def plans(cfg, card: int, gpus: int = 1, modality: str = "vlm", prompt_text: int | None = None,
          images: int = 1) -> tuple[Any, list[Plan]]:
    from mmrl.core.precision import compute_dtype

    shape = shape_of(cfg, modality, prompt_text, images)
    dtype = compute_dtype(cfg.model.dtype)
    return shape, [plan(shape, m, dtype, card) for m in modes(cfg, gpus, modality)]


def largest_micro_batch(shape, mode: Mode, dtype, card: int) -> int:
    """The largest ``train.micro_batch_size`` at which ``mode`` fits (0: none does)."""
    best = 0
    for mb in range(1, shape.micro_batch + 1):
        if plan(dataclasses.replace(shape, micro_batch=mb), mode, dtype, card).fits:
            best = mb
    return best


COLUMNS = ("weights", "gradients", "optimizer state", "activations", "logits", "reference model", "vision tower")


def table(shape, rows: list[Plan]) -> list[str]:
    """The plan as text lines: one row per mode, GiB per GPU."""
    head = ("mode", "weights", "grads", "optim", "activ.", "logits", "ref", "vision", "rollout", "peak", "")
    lines = [f"{head[0]:<34}" + "".join(f"{h:>8}" for h in head[1:-1]) + "  fits"]
    for p in rows:
        r = p.rows
        cells = [r[k] / GIB for k in COLUMNS] + [(r["KV cache"] + r["LoRA merge"] + r["vLLM share"]) / GIB, p.peak / GIB]
        lines.append(f"{p.mode.name:<34}" + "".join(f"{v:>8.1f}" for v in cells) + ("  yes" if p.fits else "  no"))
    return lines


def describe(cfg, shape, rows: list[Plan], card: int, gpus: int) -> list[str]:
    """The table with what it assumed and what to do."""
    from mmrl.core.precision import compute_dtype

    out = [f"{cfg.model.path}: {shape.params / 1e9:.2f}B parameters ({shape.trainable / 1e9:.2f}B trained in full "
           f"fine-tuning, {shape.adapter / 1e6:.1f}M with LoRA r={cfg.model.lora.r}); "
           + (shape.summary if hasattr(shape, "summary") else
              f"micro-batch {shape.micro_batch} of {shape.prompt} prompt + {shape.completion} completion tokens"
              + (f" ({shape.images} image of {shape.image_tokens} tokens)" if shape.images else ""))
           + f"; predicted peak GiB per GPU on {gpus} x {card / GIB:.0f} GiB"
           + ("" if rows[0].mode.checkpointing else " (the rows under the first add gradient checkpointing)")
           + ":", *table(shape, rows)]
    first = rows[0]
    if first.fits:
        out.append(f"fits as configured ({first.peak / GIB:.1f} of {card / GIB:.1f} GiB, {HEADROOM:.0%} kept free).")
    else:
        fitting = [p for p in rows[1:] if p.fits]
        out.append(f"does not fit as configured ({first.peak / GIB:.1f} GiB > {(1 - HEADROOM) * card / GIB:.1f}).")
        for p in fitting:
            out.append(f"fits with {p.mode.name.lstrip('+ ')} ({p.peak / GIB:.1f} GiB): {p.mode.overrides}")
        mb = largest_micro_batch(shape, first.mode, compute_dtype(cfg.model.dtype), card)
        out.append(f"as configured, train.micro_batch_size={mb} fits" if mb else
                   "as configured, not even train.micro_batch_size=1 fits")
    out.append("peak: the largest of the update (weights, gradients, optimizer state, activations, logits, reference, "
               "vision), the optimizer step (its temporaries) and the rollout (KV cache or vLLM share, LoRA merge); "
               "predictions, checked against measured peaks in docs/performance.md")
    return out


def fit_warning(cfg, modality: str, device) -> str | None:
    """``mmrl train``'s one line when the plan of ``cfg`` exceeds the CUDA ``device``'s memory (None
    on a CPU, when it fits, and for a modality no reader plans)."""
    import torch

    if device.type != "cuda" or modality not in ("vlm", "diffusion"):
        return None
    from mmrl.core.precision import compute_dtype

    card = torch.cuda.get_device_properties(device).total_memory
    p = plan(shape_of(cfg, modality), configured_mode(cfg), compute_dtype(cfg.model.dtype), card)
    if p.fits:
        return None
    return (f"mmrl plan predicts a peak of {p.peak / GIB:.1f} GiB per GPU (one process, unsharded), more than "
            f"this {card / GIB:.0f} GiB GPU holds: `mmrl plan` with this recipe shows the knobs that make it fit")
