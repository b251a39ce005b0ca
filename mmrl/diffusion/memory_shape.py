"""A generator run's shape for ``mmrl plan`` (:mod:`mmrl.core.memory_plan`): from the pipeline's
``model_index.json`` and each component's config, the models built on the meta device (parameter
counts, no weights), and the run's config.

What a generator run holds on the GPU: the transformer (trained, or frozen under LoRA; Wan 2.2's two
experts both), the text encoders, image encoder and VAE frozen in ``model.dtype``, the reference
transformer for the KL when ``algo.beta > 0`` (a copy, or LoRA's disabled adapters), and one denoising
step's activations per micro-batch (the per-timestep backward of :mod:`mmrl.diffusion.policy`); the
trajectory latents of every sample stay in host memory.

Activations are MEASURED, for every family alike (:mod:`mmrl.diffusion.measured_activations`): the
family's adapter says how its transformer is called (``plan_latent_shape``, ``plan_text_tokens``,
``plan_inputs``: packed tokens, ids, text embeddings, a source image's tokens, condition channels),
the transformer runs once on the meta device at the micro-batch, and what autograd saves is counted, with
fused attention, with or without gradient checkpointing; the backward's gradients of a block's streams
and of its largest saved tensor come on top. Classifier-free guidance (``guidance_scale > 1`` on a
transformer without a guidance embedding) doubles the micro-batch. Two experts: one expert's
activations per step (each step runs one).

The rollout (sampling without autograd) holds, per sample, the widest tensor of the transformer's
forward and its input (two of them), or the VAE's decoding (the decoder's widest activation: its last
block at full resolution, over the frames it decodes at once, with its input; a video's decoded
frames), whichever is larger.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from mmrl.core.library_internals import keep_in_fp32_modules
from mmrl.core.memory_plan import Mode, Widths

from .measured_activations import Measured, block_modules, measure, widest_tensor


@dataclass(frozen=True)
class GeneratorShape:
    params: int  # transformer(s), text encoders, image encoder, VAE
    trainable: int  # the transformer(s)
    adapter: int
    quantizable: int
    largest_layer: int
    reference: bool  # False: the reference copy is the transformer's alone, counted by :meth:`activations`
    reference_params: int
    kl: bool  # algo.beta > 0
    latent_shape: tuple[int, ...]  # one sample's latents at the run's size
    text_tokens: int  # the prompt embedding's length the plan assumes
    micro_batch: int
    cfg_factor: int  # 2 under classifier-free guidance
    generate_batch: int
    forward_bytes: int  # one sample's widest tensor in a forward without autograd (module docstring)
    vae_bytes: int  # one sample's VAE decoding (module docstring)
    summary: str
    # (LoRA, samples) -> the measurement of one forward of that many samples (on the meta device: any batch is free)
    measured: Callable[[bool, int], Measured] = field(repr=False, compare=False, default=None)

    def kept(self, mode: Mode, samples: int) -> int:
        """Bytes the forward of ``samples`` keeps, with the backward's gradients (module docstring)."""
        m = self.measured(mode.lora, samples)
        return m.stored(mode.checkpointing) + m.backward

    def activations(self, mode: Mode, w: Widths) -> dict[str, int]:
        acts = self.kept(mode, self.micro_batch * self.cfg_factor)
        # the KL's reference: a frozen copy of the transformer (LoRA's disabled adapters cost nothing)
        ref = self.reference_params * w.compute // mode.shard if self.kl and not mode.lora else 0
        return {"activations": int(acts), "logits": 0, "vision tower": 0, "reference model": ref}

    def rollout(self, mode: Mode, w: Widths, card: int) -> dict[str, int]:
        transformer = 2 * self.forward_bytes * self.cfg_factor  # the widest tensor and its input
        return {"KV cache": int(self.generate_batch * max(transformer, self.vae_bytes))}


def _components(where: Path) -> dict[str, tuple[str, str]]:
    """``{component: (library, class)}`` of a pipeline directory (the tiny generator's are fixed)."""
    from .tiny import TinyFlowPipeline, is_tiny_dir, tiny_family

    if is_tiny_dir(where):
        if tiny_family(where) != TinyFlowPipeline.family:
            raise ValueError(f"mmrl plan reads the tiny image generator and diffusers pipelines; {where} is a tiny "
                             f"{tiny_family(where)} one")
        return {"transformer": ("diffusers", TinyFlowPipeline.transformer_class),
                "text_encoder": ("transformers", TinyFlowPipeline.text_encoder_class)}
    index = where / "model_index.json"
    if not index.is_file():
        raise FileNotFoundError(f"{where} has no model_index.json: model.path must be a diffusers pipeline directory")
    return {k: tuple(v) for k, v in json.loads(index.read_text()).items()
            if isinstance(v, list) and len(v) == 2 and v[0] in ("diffusers", "transformers") and
            (where / k / "config.json").is_file()}


def _meta_model(where: Path, library: str, cls_name: str):
    import diffusers
    import transformers

    with torch.device("meta"):
        if library == "diffusers":
            cls = getattr(diffusers, cls_name)
            return cls.from_config(cls.load_config(where))
        config = transformers.AutoConfig.from_pretrained(where)
        return getattr(transformers, cls_name)(config)  # the constructor: parameters on the meta device


def _in_dtype(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``model`` as diffusers' ``from_pretrained(torch_dtype=dtype)`` loads it: the modules its class keeps in
    float32 (``_keep_in_fp32_modules``, e.g. Wan's time embedding and norms) stay float32."""
    keep = keep_in_fp32_modules(model)
    for name, p in model.named_parameters():
        p.data = p.data.to(torch.float32 if keep & set(name.split(".")) else dtype)
    return model


def adapter_class(class_name: str, index: Path) -> type:
    """The adapter class registered for a ``model_index.json`` ``_class_name``, found without loading weights."""
    from .adapters import DiffusersAdapter

    found, todo = {}, [DiffusersAdapter]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__dict__.get("pipeline_class_name"):
            found[cls.pipeline_class_name] = cls
    if class_name not in found:
        raise ValueError(f"mmrl plan: {index} names _class_name {class_name!r}, which no generator adapter "
                         f"handles; planned: {', '.join(sorted(found))}")
    return found[class_name]


def _trainable(model: torch.nn.Module, lora: bool, lora_cfg, targets: list[str]) -> torch.nn.Module:
    """``model`` trainable as the run trains it: every parameter, or peft LoRA adapters only."""
    if not lora:
        return model.requires_grad_(True)
    from peft import LoraConfig

    model.requires_grad_(False)
    with torch.device("meta"):
        model.add_adapter(LoraConfig(r=lora_cfg.r, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout,
                                     target_modules=targets))
    return model


def _vae_bytes(vae: dict | None, latent_shape: tuple[int, ...], height: int, width: int, c: int) -> int:
    """Bytes of one sample's VAE decoding (module docstring): an image VAE's last decoder block at full
    resolution (``block_out_channels[0]``), a Wan-style video VAE's (``base_dim``) over the frames one
    latent frame decodes to (its temporal factor), with the input of that block, and a video's frames."""
    if vae is None:
        return 0
    if "base_dim" in vae:  # AutoencoderKLWan / AutoencoderKLQwenImage: causal, one latent frame at a time
        frames = (len(latent_shape) == 4) * (latent_shape[1] - 1) * 4 + 1
        chunk = 2 ** sum(vae.get("temperal_downsample") or ()) if len(latent_shape) == 4 else 1
        return c * (2 * chunk * height * width * int(vae["base_dim"]) + 3 * frames * height * width)
    return c * 2 * height * width * int(vae["block_out_channels"][0])


def generator_shape(cfg) -> GeneratorShape:
    """The plan's shape of ``cfg``'s generator run (module docstring)."""
    from mmrl.config.hub import is_hub_id, resolve_checkpoint
    from mmrl.core.precision import compute_dtype

    from .adapters import SD3Adapter
    from .loading import generator_dir
    from .tiny import MARKER, MAX_PROMPT_TOKENS, is_tiny_dir

    path = cfg.model.path
    if is_hub_id(path) and not Path(path).exists():
        where = Path(resolve_checkpoint(path, cfg.model.revision, only=["model_index.json", "*/config.json"]))
    else:
        where = Path(generator_dir(path, cfg.model.revision))
    components = _components(where)
    if "transformer" not in components:
        raise ValueError(f"mmrl plan: {where} has no transformer/config.json (a diffusers pipeline directory with "
                         "model_index.json and each component's config.json is enough)")
    models = {k: _meta_model(where / k, lib, cls) for k, (lib, cls) in components.items()}
    configs = {k: dict(m.config) for k, m in models.items() if isinstance(m.config, dict)}  # diffusers' components
    tiny = is_tiny_dir(where)
    d = cfg.diffusion
    if tiny:  # the tiny generator: an SD3 transformer in pixel space, its prompt's tokens
        adapter, info = SD3Adapter, json.loads((where / MARKER).read_text())
        height, width = int(d.height or info.get("height", 16)), int(d.width or d.height or info.get("width", 16))
        latent = (int(configs["transformer"]["out_channels"]), height, width)
        text_tokens, default_guidance = MAX_PROMPT_TOKENS, float(info.get("guidance_scale", 1.0))
    else:
        index = where / "model_index.json"
        adapter = adapter_class(json.loads(index.read_text()).get("_class_name"), index)
        if d.pipeline_options:  # the family's options (max_sequence_length, condition_area, ...) are its attributes
            adapter = type(adapter.__name__, (adapter,), dict(d.pipeline_options))
        height = int(d.height or adapter.default_height)
        width = int(d.width or d.height or adapter.default_width)
        latent = tuple(adapter.plan_latent_shape(configs, height, width, d.num_frames))
        text_tokens, default_guidance = adapter.plan_text_tokens(configs), adapter.default_guidance_scale
    dtype = compute_dtype(cfg.model.dtype)
    trained = [k for k in ("transformer", "transformer_2") if k in models]
    targets = list(cfg.model.lora.target_modules or (SD3Adapter if tiny else adapter).lora_targets)
    lib, cls_name = components["transformer"]

    @functools.lru_cache(maxsize=None)
    def trainable(lora: bool) -> torch.nn.Module:
        return _trainable(_in_dtype(_meta_model(where / "transformer", lib, cls_name), dtype), lora, cfg.model.lora,
                          targets)

    @functools.lru_cache(maxsize=None)
    def measured(lora: bool, samples: int) -> Measured:
        return measure(trainable(lora), adapter.plan_inputs(configs, samples, latent, text_tokens, dtype, "meta"))

    transformer = _in_dtype(models["transformer"], dtype)  # counted below by numel: the dtype changes nothing
    forward = widest_tensor(transformer, adapter.plan_inputs(configs, 1, latent, text_tokens, dtype, "meta"))
    vae = _vae_bytes(configs.get("vae"), latent, height, width, dtype.itemsize)
    counts = {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}
    adapted = sum(m.in_features + m.out_features for k in trained for n, m in models[k].named_modules()
                  if isinstance(m, torch.nn.Linear) and any(n == t or n.endswith("." + t) for t in targets))
    samples = cfg.train.prompts_per_step * cfg.rollout.num_generations
    guidance = d.guidance_scale if d.guidance_scale is not None else default_guidance
    cfg_factor = 2 if guidance > 1 and not configs["transformer"].get("guidance_embeds") else 1
    micro = min(cfg.train.micro_batch_size, samples)
    summary = (f"latents {'x'.join(map(str, latent))} per sample ({height} x {width} px"
               + (f", {d.num_frames} frames" if len(latent) == 4 and d.num_frames else "") + f"), {text_tokens} text tokens, "
               f"micro-batch {micro}" + (" x 2 (guidance)" if cfg_factor == 2 else "")
               + (", one of two experts per step" if len(trained) == 2 else ""))
    return GeneratorShape(
        params=sum(counts.values()), trainable=sum(counts[k] for k in trained), adapter=cfg.model.lora.r * adapted,
        quantizable=0, largest_layer=max(sum(p.numel() for p in b.parameters()) for b in block_modules(transformer)),
        reference=False, reference_params=sum(counts[k] for k in trained), kl=cfg.algo.beta > 0,
        latent_shape=latent, text_tokens=text_tokens, micro_batch=micro, cfg_factor=cfg_factor,
        generate_batch=min(cfg.rollout.batch_size or samples, samples), forward_bytes=forward, vae_bytes=vae,
        summary=summary, measured=measured)
