"""The built-in tiny generator: a rectified-flow transformer that draws small images of coloured shapes.

Real classes with small configs, built locally (no hub): diffusers' ``SD3Transformer2DModel``
(the MMDiT of Stable Diffusion 3) predicts the velocity, transformers' ``CLIPTextModelWithProjection``
encodes the prompt (its sequence output is the transformer's ``encoder_hidden_states``, its projected
pooled output the ``pooled_projections``, as in SD3), a word-level tokenizer covers the synthetic
prompts' words, and diffusers' ``FlowMatchEulerDiscreteScheduler`` gives the sigmas. It works in
pixel space (no VAE): a 16x16 or 32x32 image is already as small as a latent, and a VAE trained on CPU
would cost more than it saves. The directory layout is diffusers-like (``transformer/``,
``text_encoder/``, ``tokenizer/``, ``scheduler/``) plus ``mmrl_generator.json``.

``mmrl_generator.json`` may say ``"conditioning": "image"``: an editing generator. The source image
(in [-1, 1]) is concatenated on channels to the noisy image, as InstructPix2Pix conditions ("InstructPix2Pix:
Learning to Follow Image Editing Instructions", Brooks et al., 2023): the transformer takes 6 channels and
outputs 3. ``velocity`` then takes the source images (``images``), the unconditional branch of guidance
keeps them (the empty prompt, the same image).

``mmrl_generator.json`` may say ``"prediction": "sample"``: the transformer then outputs the clean
image x0 and the pipeline turns it into the velocity ``(x - x0) / max(sigma, 0.05)`` ("Back to
Basics: Let Denoising Generative Models Denoise", Li & He, 2025: in pixel space a small network
predicts the clean image far better than the noise-laden velocity; measured here, the speckle of
velocity-predicting models largely goes away). Everything downstream still sees a velocity. The
shipped model (16x16, 2-px patches) predicts the sample; see ``pretrain.TINY_GENERATOR_RECIPE``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor

from .base import FlowPipeline, PromptCache

MARKER = "mmrl_generator.json"
TINY_SIZE = 32
MAX_PROMPT_TOKENS = 16
PREDICTIONS = ("velocity", "sample")
SIGMA_FLOOR = 0.05  # x-prediction's velocity divides by sigma; JiT clips the same way
# Words of the synthetic prompts (mmrl.data.shapes_t2i); anything else maps to [UNK].
VOCAB_WORDS = ["a", "one", "two", "three", "red", "green", "blue", "yellow", "circle", "circles",
               "square", "squares", "on", "the", "left", "right", "and"]
# The editing generator's instructions (mmrl.data.shape_edits) add these.
EDIT_WORDS = ["make", "move", "to", "add"]


def build_tokenizer(words: Sequence[str] = tuple(VOCAB_WORDS)):
    """A word-level tokenizer over ``words``: [PAD] 0, [UNK] 1, [EOS] 2 appended to every prompt
    (CLIP's pooled output is read at the EOS position), lower-cased, split on whitespace and punctuation."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A [EOS]", special_tokens=[("[EOS]", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]",
                                   model_max_length=MAX_PROMPT_TOKENS, padding_side="right")


def tiny_configs(width: int = 96, layers: int = 3, text_dim: int = 32, image_size: int = TINY_SIZE,
                 patch_size: int = 4, in_channels: int = 3, words: Sequence[str] = tuple(VOCAB_WORDS)) -> dict:
    """Configs of the tiny generator's models (sizes chosen so RL runs on a 2-core CPU);
    ``in_channels`` 6 for the editing generator (noisy image and source image), ``words`` its tokenizer's."""
    if image_size % patch_size:
        raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
    from transformers import CLIPTextConfig

    heads = width // 32
    transformer = dict(sample_size=image_size, patch_size=patch_size, in_channels=in_channels, out_channels=3, num_layers=layers,
                       attention_head_dim=32, num_attention_heads=heads, joint_attention_dim=text_dim,
                       caption_projection_dim=width, pooled_projection_dim=text_dim, pos_embed_max_size=image_size // patch_size)
    text = CLIPTextConfig(vocab_size=len(words) + 3, hidden_size=text_dim, intermediate_size=2 * text_dim,
                          num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=MAX_PROMPT_TOKENS,
                          projection_dim=text_dim, pad_token_id=0, bos_token_id=0, eos_token_id=2)
    return {"transformer": transformer, "text_encoder": text}


def new_tiny_models(seed: int = 0, words: Sequence[str] = tuple(VOCAB_WORDS), **sizes):
    """Randomly initialised (transformer, text encoder, tokenizer, scheduler)."""
    return TinyFlowPipeline.new_models(tiny_configs(words=words, **sizes), build_tokenizer(words), seed)


def save_tiny(out: Path, transformer, text_encoder, tokenizer, scheduler, info: dict | None = None) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    transformer.save_pretrained(out / "transformer")
    text_encoder.save_pretrained(out / "text_encoder")
    tokenizer.save_pretrained(out / "tokenizer")
    scheduler.save_pretrained(out / "scheduler")
    size = int(getattr(transformer.config, "sample_size", TINY_SIZE))  # a video generator's info gives its size
    (out / MARKER).write_text(json.dumps({"family": "tiny", "height": size, "width": size,
                                          "guidance_scale": 1.0, **(info or {})}, indent=2))
    return out


class TinyFlowPipeline(FlowPipeline):
    """The tiny generator behind the :class:`FlowPipeline` contract (pixel space, one CLIP).

    Subclasses (:class:`~mmrl.diffusion.tiny_video.TinyWanPipeline`) swap the model classes
    (``transformer_class``, ``text_encoder_class``) and override ``encode_text``,
    ``transformer_output``, ``latent_shape`` and the pixel layout; the prompt cache, classifier-free
    guidance and x-prediction are shared."""

    family = "tiny"
    lora_targets = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj"]
    transformer_class = "SD3Transformer2DModel"  # a diffusers class
    conditionings = (None, "image")  # what mmrl_generator.json's "conditioning" may say (None: text only)
    text_encoder_class = "CLIPTextModelWithProjection"  # a transformers class

    def __init__(self, transformer, text_encoder, tokenizer, scheduler, info: dict | None = None):
        self.transformer = transformer
        self.text_encoder = text_encoder.requires_grad_(False).eval()
        self.tokenizer = tokenizer
        self.scheduler_config = dict(scheduler.config)
        info = info or {}
        self.info = info
        self.default_height = int(info.get("height", TINY_SIZE))
        self.default_width = int(info.get("width", TINY_SIZE))
        self.default_guidance_scale = float(info.get("guidance_scale", 1.0))
        self.prediction = info.get("prediction", "velocity")
        if self.prediction not in PREDICTIONS:
            raise ValueError(f"{MARKER}: prediction must be one of {PREDICTIONS}, got {self.prediction!r}")
        self.conditioning = info.get("conditioning")
        if self.conditioning not in self.conditionings:
            raise ValueError(f"{MARKER}: conditioning must be one of {self.conditionings}, got {self.conditioning!r}")
        self.prompt_cache = PromptCache(self._encode_each)

    @classmethod
    def from_pretrained(cls, path: str | Path, device="cpu", dtype=torch.float32) -> "TinyFlowPipeline":
        import diffusers
        import transformers
        from diffusers import FlowMatchEulerDiscreteScheduler
        from transformers import PreTrainedTokenizerFast

        path = Path(path)
        info = json.loads((path / MARKER).read_text())
        transformer = getattr(diffusers, cls.transformer_class).from_pretrained(
            path / "transformer", torch_dtype=dtype).to(device)
        text_encoder = getattr(transformers, cls.text_encoder_class).from_pretrained(
            path / "text_encoder", torch_dtype=dtype).to(device)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path / "tokenizer")
        scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(path / "scheduler")
        return cls(transformer, text_encoder, tokenizer, scheduler, info)

    @classmethod
    def new_models(cls, configs: dict, tokenizer, seed: int = 0) -> tuple:
        """Randomly initialised (transformer, text encoder, tokenizer, scheduler) of this
        pipeline's model classes, built from ``configs`` (``{"transformer": kwargs, "text_encoder":
        config}``, as ``tiny_configs`` / ``tiny_video_configs`` give them) after seeding torch."""
        import diffusers
        import transformers
        from diffusers import FlowMatchEulerDiscreteScheduler

        torch.manual_seed(seed)
        transformer = getattr(diffusers, cls.transformer_class)(**configs["transformer"])
        text_encoder = getattr(transformers, cls.text_encoder_class)(configs["text_encoder"])
        # shift 1: at 16-32 pixels there is no high-resolution redundancy to shift noise levels for.
        scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0)
        return transformer, text_encoder, tokenizer, scheduler

    # -- text ---------------------------------------------------------------------------------------
    def tokenize(self, prompts: Sequence[str]) -> Tensor:
        return self.tokenizer(list(prompts), padding="max_length", max_length=MAX_PROMPT_TOKENS, truncation=True,
                              return_tensors="pt").input_ids.to(self.text_encoder.device)

    def encode_text(self, prompts: Sequence[str]) -> dict[str, Tensor]:
        """The transformer's text inputs for ``prompts``: hidden states (B, L, D) and the pooled
        projection (B, D); with gradient when the text encoder is being trained (pretraining) —
        the cache is for RL only."""
        out = self.text_encoder(input_ids=self.tokenize(prompts))
        return {"hidden": out.last_hidden_state, "pooled": out.text_embeds}

    def _encode_each(self, prompts: list[str]) -> list[dict[str, Tensor]]:
        embeds = self.encode_text(prompts)
        return [{k: v[i:i + 1] for k, v in embeds.items()} for i in range(len(prompts))]

    # -- the FlowPipeline contract -------------------------------------------------------------------
    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        return (self.transformer.config.out_channels, height, width)

    def sigmas(self, num_steps: int, latent_shape: tuple[int, ...]) -> Tensor:
        from diffusers import FlowMatchEulerDiscreteScheduler

        scheduler = FlowMatchEulerDiscreteScheduler.from_config(self.scheduler_config)
        scheduler.set_timesteps(num_steps)
        return scheduler.sigmas.float().cpu()

    def transformer_output(self, latents: Tensor, timestep: Tensor, embeds: dict[str, Tensor]) -> Tensor:
        """The transformer's raw output (a velocity or a clean sample, see ``prediction``); an
        editing generator's ``embeds["image"]`` (the source in [-1, 1]) joins the noisy image on channels."""
        if "image" in embeds:
            latents = torch.cat([latents, embeds["image"].to(latents.dtype)], dim=1)
        return self.transformer(hidden_states=latents, timestep=timestep, encoder_hidden_states=embeds["hidden"],
                                pooled_projections=embeds["pooled"], return_dict=False)[0]

    def velocity_from_embeds(self, latents: Tensor, sigma: Tensor, embeds: dict[str, Tensor]) -> Tensor:
        timestep = (sigma * self.scheduler_config.get("num_train_timesteps", 1000)).to(self.dtype)
        out = self.transformer_output(latents.to(self.dtype), timestep, embeds).float()
        if self.prediction == "velocity":
            return out
        # x-prediction: the network outputs the clean image x0; x = (1 - s) x0 + s e gives v = (x - x0) / s.
        s = sigma.float().clamp_min(SIGMA_FLOOR).view(-1, *([1] * (latents.dim() - 1)))
        return (latents.float() - out) / s

    def velocity(self, latents: Tensor, sigma: Tensor, prompts: Sequence[str], guidance_scale: float = 1.0,
                 images: Tensor | None = None) -> Tensor:
        """The contract's velocity; ``images`` (B, 3, H, W) in [0, 1], the source images of an
        editing generator (required there, refused elsewhere)."""
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=latents.device).expand(latents.shape[0])
        cond = self.prompt_cache.get([str(p) for p in prompts])
        if (images is None) != (self.conditioning is None):
            raise ValueError(f"the tiny generator (conditioning {self.conditioning!r}) "
                             + ("needs the source images" if images is None else "takes no images"))
        if images is not None:
            cond = {**cond, "image": self.encode_images(images.to(latents.device))}
        if guidance_scale <= 1.0:
            return self.velocity_from_embeds(latents, sigma, cond)
        uncond = self.prompt_cache.get([""] * len(prompts))
        if images is not None:  # the unconditional branch keeps the image
            uncond = {**uncond, "image": cond["image"]}
        v = self.velocity_from_embeds(torch.cat([latents, latents]), torch.cat([sigma, sigma]),
                                      {k: torch.cat([uncond[k], cond[k]]) for k in cond})
        v_uncond, v_cond = v.chunk(2)
        return v_uncond + guidance_scale * (v_cond - v_uncond)

    def decode(self, latents: Tensor) -> Tensor:
        """Pixel space: latents are the image in [-1, 1]."""
        return (latents.float() / 2 + 0.5).clamp(0, 1)

    def encode_images(self, images: Tensor) -> Tensor:
        """The inverse of ``decode`` (pretraining targets): [0, 1] pixels -> [-1, 1]."""
        return images.float() * 2 - 1


def tiny_family(path: str | Path) -> str:
    """The ``family`` a tiny generator directory's marker names ("tiny": the image generator)."""
    return json.loads((Path(path) / MARKER).read_text()).get("family", "tiny")


def is_tiny_dir(path: str | Path) -> bool:
    return (Path(path) / MARKER).exists()
