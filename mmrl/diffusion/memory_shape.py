"""A generator run's shape for ``mmrl plan`` (:mod:`mmrl.core.memory_plan`): from the pipeline's
``model_index.json`` and each component's config, the models built on the meta device (parameter
counts, no weights), and the run's config.

What a generator run holds on the GPU: the transformer (trained, or frozen under LoRA on its
attention), the text encoders and the VAE frozen in ``model.dtype``, the reference transformer for
the KL when ``algo.beta > 0`` (a copy, or LoRA's disabled adapters), and one denoising step's
activations per micro-batch (the per-timestep backward of :mod:`mmrl.diffusion.policy`); the
trajectory latents of every sample stay in host memory.

Activations are counted per token of an SD3 MMDiT block ("Scaling Rectified Flow Transformers for
High-Resolution Image Synthesis", Esser et al. 2024) from what its ops save, in units of one
token's width ``D`` (measured with a saved-tensors hook on diffusers' ``SD3Transformer2DModel``,
tests/test_memory_plan.py): each stream's adaptive LayerNorms keep their input, the normalised and
the modulated tensor (2 x 3), q/k/v (3), the attention output and out-projection's input (2), the
out-projection's output for its gate (1), the GELU MLP its 4D hidden before and after the GELU and
its output for its gate (9): 21 per token of either stream; a q/k RMSNorm adds 4, a second
(image-only) attention 10; under LoRA the frozen layers keep less (:data:`LORA`). The last block
keeps the image stream and only the text stream's norm and q/k/v; the patch embedding and output
layers about 3 per image token. Under gradient checkpointing each block keeps its two input streams (1 per token) and one block is recomputed at a
time; the backward holds the gradients of a block's streams and its MLP hidden beside them (6 per
token). Classifier-free guidance (``diffusion.guidance_scale > 1``) runs the transformer on twice
the micro-batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from mmrl.core.memory_plan import Mode, Widths



@dataclass(frozen=True)
class Units:
    """Saved tensors per token of a stream, in units of the block's width (module docstring)."""

    text: float  # a joint block, per text token
    image: float  # per image token
    qk_norm: float
    dual: float  # a second, image-only attention
    last_text: float  # the last block's text stream: its norm and q/k/v
    outside: float  # per image token: the patch embedding, the output norm and projection
    sample: float  # per sample and block: the modulation vectors


FULL = Units(text=21, image=21, qk_norm=4, dual=10, last_text=6, outside=3, sample=18)
# LoRA on the attention: the frozen linears keep no inputs, the frozen modulations no outputs: the
# norms' inputs and the modulated input (2), q/k/v (3), the attention output and out-projection's
# input (2), the GELU's input (4); measured 10 per text token, 12.5 per image token
LORA = Units(text=10, image=12.5, qk_norm=2, dual=7, last_text=5.5, outside=0, sample=0)
BACKWARD_UNITS = 6  # per token: the gradients a block's backward holds
CLIP_TOKENS = 77  # SD3's CLIP prompts, joined to its T5 tokens


@dataclass(frozen=True)
class GeneratorShape:
    params: int  # transformer, text encoders, VAE
    trainable: int  # the transformer
    adapter: int
    quantizable: int
    largest_layer: int
    reference: bool  # False: the reference copy is the transformer's alone, counted by :meth:`activations`
    reference_params: int
    kl: bool  # algo.beta > 0
    width: int
    blocks: int
    dual_blocks: int
    qk_norm: bool
    image_tokens: int
    text_tokens: int
    micro_batch: int
    cfg_factor: int  # 2 under classifier-free guidance
    generate_batch: int
    vae_pixels: int  # pixels of one decoded image x the VAE decoder's last width (0: no VAE)
    summary: str

    def stored(self, samples: int, c: int, checkpointing: bool, u: Units = FULL) -> int:
        """Bytes one forward keeps for the backward (module docstring)."""
        qk = u.qk_norm if self.qk_norm else 0
        tokens = self.image_tokens + self.text_tokens
        full = (u.image + qk) * self.image_tokens + (u.text + qk) * self.text_tokens + u.sample
        dual = u.dual * self.image_tokens
        last = (u.image + qk) * self.image_tokens + (u.last_text + qk) * self.text_tokens + u.sample
        outside = u.outside * self.image_tokens
        backward = BACKWARD_UNITS * tokens
        if checkpointing:
            units = self.blocks * tokens + outside + full + dual * (self.dual_blocks > 0) + backward
        else:
            units = (self.blocks - 1) * full + self.dual_blocks * dual + last + outside + backward
        return int(samples * units * self.width * c)

    def activations(self, mode: Mode, w: Widths) -> dict[str, int]:
        units = LORA if mode.lora else FULL
        acts = self.stored(self.micro_batch * self.cfg_factor, w.compute, mode.checkpointing, units)
        # the KL's reference: a frozen copy of the transformer (LoRA's disabled adapters cost nothing)
        ref = self.reference_params * w.compute // mode.shard if self.kl and not mode.lora else 0
        return {"activations": int(acts), "logits": 0, "vision tower": 0, "reference model": ref}

    def rollout(self, mode: Mode, w: Widths, card: int) -> dict[str, int]:
        """Sampling without autograd: a block's widest tensors (its MLP hidden and its GELU, 8 per
        token) for the rollout batch, or the VAE's decoding of it (the decoder's last block at full
        resolution, its input and output), whichever is larger; the latents go to host memory."""
        n = self.generate_batch
        transformer = 8 * n * self.cfg_factor * (self.image_tokens + self.text_tokens) * self.width * w.compute
        vae = 2 * n * self.vae_pixels * w.compute
        return {"KV cache": int(max(transformer, vae))}


def _components(where: Path) -> dict[str, tuple[str, str]]:
    """``{component: (library, class)}`` of a pipeline directory (the tiny generator's are fixed)."""
    from .tiny import TinyFlowPipeline, is_tiny_dir, tiny_family

    if is_tiny_dir(where):
        if tiny_family(where) != TinyFlowPipeline.family:
            raise ValueError(f"mmrl plan reads SD3-architecture generators; {where} is a {tiny_family(where)} one")
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


def generator_shape(cfg) -> GeneratorShape:
    """The plan's shape of ``cfg``'s generator run (module docstring)."""
    from mmrl.config.hub import is_hub_id, resolve_checkpoint

    from .loading import generator_dir
    from .tiny import MARKER, MAX_PROMPT_TOKENS, is_tiny_dir

    path = cfg.model.path
    if is_hub_id(path) and not Path(path).exists():
        where = Path(resolve_checkpoint(path, cfg.model.revision, only=["model_index.json", "*/config.json"]))
    else:
        where = Path(generator_dir(path, cfg.model.revision))
    models = {k: _meta_model(where / k, lib, cls) for k, (lib, cls) in _components(where).items()}
    transformer = models.get("transformer")
    if transformer is None or not hasattr(transformer, "transformer_blocks") or \
            type(transformer).__name__ != "SD3Transformer2DModel":
        raise ValueError(f"mmrl plan reads SD3-architecture generators (SD3Transformer2DModel); the transformer of "
                         f"{where} is {type(transformer).__name__}")
    tc = transformer.config
    tiny = is_tiny_dir(where)
    vae = models.get("vae")
    scale = 2 ** (len(vae.config.block_out_channels) - 1) if vae is not None else 1
    d = cfg.diffusion
    if tiny:  # the size the tiny generator was trained at; a pipeline's default as its adapter picks it
        default = int(json.loads((where / MARKER).read_text()).get("height", tc.sample_size))
    else:
        default = min(512, int(tc.sample_size) * scale)
    height, width = int(d.height or default), int(d.width or d.height or default)
    patch = int(tc.patch_size)
    image_tokens = (height // scale // patch) * (width // scale // patch)
    text_tokens = MAX_PROMPT_TOKENS if tiny else CLIP_TOKENS + 256  # SD3Adapter.max_sequence_length T5 tokens
    targets = set(cfg.model.lora.target_modules or ["to_k", "to_q", "to_v", "to_out.0"])
    linears = [(n, m) for n, m in transformer.named_modules() if isinstance(m, torch.nn.Linear)]
    adapted = [m for n, m in linears if any(n == t or n.endswith("." + t) for t in targets)]
    counts = {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}
    samples = cfg.train.prompts_per_step * cfg.rollout.num_generations
    guidance = d.guidance_scale if d.guidance_scale is not None else (1.0 if tiny else 4.5)
    width_d = int(tc.num_attention_heads * tc.attention_head_dim)
    vae_pixels = height * width * vae.config.block_out_channels[0] if vae is not None else 0
    summary = (f"{image_tokens} image + {text_tokens} text tokens per sample ({height} x {width} px), "
               f"micro-batch {min(cfg.train.micro_batch_size, samples)}" + (" x 2 (guidance)" if guidance > 1 else ""))
    return GeneratorShape(
        params=sum(counts.values()), trainable=counts["transformer"],
        adapter=cfg.model.lora.r * sum(m.in_features + m.out_features for m in adapted), quantizable=0,
        largest_layer=max(sum(p.numel() for p in b.parameters()) for b in transformer.transformer_blocks),
        reference=False, reference_params=counts["transformer"], kl=cfg.algo.beta > 0, width=width_d,
        blocks=int(tc.num_layers), dual_blocks=len(tc.get("dual_attention_layers") or ()),
        qk_norm=bool(tc.get("qk_norm")), image_tokens=image_tokens, text_tokens=text_tokens,
        micro_batch=min(cfg.train.micro_batch_size, samples), cfg_factor=2 if guidance > 1 else 1,
        generate_batch=min(cfg.rollout.batch_size or samples, samples), vae_pixels=vae_pixels, summary=summary)
