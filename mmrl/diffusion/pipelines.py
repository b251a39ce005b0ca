"""Adapters from diffusers pipelines (SD3 / SD3.5, FLUX.1, Wan 2.1) to the :class:`FlowPipeline` contract.

``load_pipeline(path, device, dtype)`` reads a LOCAL diffusers pipeline directory (its
``model_index.json``), loads the pipeline with diffusers and wraps its components. Nothing is ever
downloaded. The adapters do not call the pipeline's ``__call__``: they reproduce, piece by piece,
what its denoising loop does (prompt encoding, latent (un)packing, timestep scaling, classifier-free
guidance, the scheduler's sigma schedule, VAE decoding), so that a deterministic Euler loop
``x = x + (sigma_next - sigma) * velocity(x, sigma, prompts, g)`` over ``sigmas(num_steps, shape)``
followed by ``decode`` gives the pipeline's own output (the tests check this against diffusers).

Other modules register more generators in :data:`ADAPTERS` (``model_index.json`` ``_class_name`` ->
``loader(path, device, dtype) -> FlowPipeline``).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from mmrl.diffusion.base import FlowPipeline, PromptCache

Loader = Callable[[str, "torch.device | str", torch.dtype], FlowPipeline]

# ``model_index.json`` ``_class_name`` -> loader(path, device, dtype). Filled at the bottom of this module;
# other modules may add entries (e.g. the built-in tiny generator).
ADAPTERS: dict[str, Loader] = {}


def _as_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and isinstance(getattr(torch, dtype.removeprefix("torch."), None), torch.dtype):
        return getattr(torch, dtype.removeprefix("torch."))
    raise ValueError(f"not a torch dtype: {dtype!r}")


def load_pipeline(path: str, device="cpu", dtype=torch.float32) -> FlowPipeline:
    """The adapter for the local diffusers pipeline directory ``path``, on ``device`` in ``dtype``."""
    root = Path(path).expanduser()
    index = root / "model_index.json"
    if not root.is_dir() or not index.is_file():
        what = "does not exist" if not root.exists() else "has no model_index.json"
        raise FileNotFoundError(
            f"diffusion model path {str(path)!r} {what}: it must be a local diffusers pipeline directory with a "
            "model_index.json (e.g. `huggingface-cli download stabilityai/stable-diffusion-3.5-medium "
            "--local-dir DIR`); nothing is downloaded"
        )
    try:
        class_name = json.loads(index.read_text()).get("_class_name")
    except (json.JSONDecodeError, AttributeError) as err:
        raise ValueError(f"{index} is not a valid diffusers model_index.json: {err}") from None
    loader = ADAPTERS.get(class_name)
    if loader is None:
        raise ValueError(
            f"unsupported diffusers pipeline class {class_name!r} in {index}; supported: {', '.join(sorted(ADAPTERS))}"
        )
    return loader(str(root), device, _as_dtype(dtype))


def _dtype_kwarg(dtype: torch.dtype) -> dict:
    """diffusers >= 0.37 renamed ``torch_dtype`` to ``dtype`` (the old name warns)."""
    try:
        from diffusers.utils.deprecation_utils import _TORCH_DTYPE_DEPRECATION_MESSAGE  # noqa: F401
    except ImportError:
        return {"torch_dtype": dtype}
    return {"dtype": dtype}


class DiffusersAdapter(FlowPipeline):
    """Shared plumbing: holds the diffusers pipeline ``pipe`` (its components on ``device``, text encoders
    and VAE frozen in eval mode), a :class:`PromptCache` over ``_encode_prompts`` and the scheduler.

    ``self.transformer`` is what the RL trains; it may be replaced (e.g. by a peft-wrapped model), so the
    adapters only call it and read its static config from ``self.transformer_config``."""

    pipeline_class_name: str = ""
    max_sequence_length: int = 512

    def __init__(self, pipe, device=None, max_sequence_length: int | None = None):
        self.pipe = pipe
        if device is not None:
            pipe.to(device)
        for name, component in pipe.components.items():
            if isinstance(component, torch.nn.Module) and name not in ("transformer", "transformer_2"):
                component.requires_grad_(False)
                component.eval()
        if hasattr(pipe, "set_progress_bar_config"):
            pipe.set_progress_bar_config(disable=True)
        self.transformer = pipe.transformer
        self.transformer_config = pipe.transformer.config
        self.vae = pipe.vae
        if max_sequence_length is not None:
            self.max_sequence_length = max_sequence_length
        self.prompt_cache = PromptCache(self._encode_prompts)

    @classmethod
    def from_pretrained(cls, path: str, device="cpu", dtype=torch.float32, **kwargs) -> "DiffusersAdapter":
        import diffusers

        pipe_cls = getattr(diffusers, cls.pipeline_class_name)
        pipe = pipe_cls.from_pretrained(path, **_dtype_kwarg(_as_dtype(dtype)))
        return cls(pipe, device=device, **kwargs)

    @property
    def scheduler(self):
        """The pipeline's scheduler (never stepped here: ``sigmas`` works on a copy)."""
        return self.pipe.scheduler

    @property
    def num_train_timesteps(self) -> int:
        return int(self.scheduler.config.get("num_train_timesteps", 1000))

    # -- helpers ---------------------------------------------------------------------------------
    def _encode_prompts(self, prompts: list[str]) -> list[dict[str, Tensor]]:
        raise NotImplementedError

    @staticmethod
    def _split(batch: dict[str, Tensor], n: int) -> list[dict[str, Tensor]]:
        """Per-prompt copies (leading axis 1) of a batch of encoder outputs."""
        return [{k: v[i : i + 1].detach().clone() for k, v in batch.items()} for i in range(n)]

    def _sigma(self, sigma, batch: int) -> Tensor:
        s = torch.as_tensor(sigma, dtype=torch.float32).detach().to(self.device).reshape(-1)
        if s.numel() == 1 and batch != 1:
            s = s.expand(batch)
        if s.numel() != batch:
            raise ValueError(f"sigma has {s.numel()} values for a batch of {batch}")
        return s

    def _embeddings(self, prompts: Sequence[str], batch: int, cfg: bool) -> dict[str, Tensor]:
        """Cached embeddings of ``prompts`` (``[""] * batch + prompts`` for CFG: uncond first), in model dtype."""
        prompts = list(prompts)
        if len(prompts) != batch:
            raise ValueError(f"{len(prompts)} prompts for a batch of {batch} latents")
        emb = self.prompt_cache.get([""] * batch + prompts if cfg else prompts)
        return {k: v.to(self.device, self.dtype) for k, v in emb.items()}

    @staticmethod
    def _guide(out: Tensor, guidance_scale: float) -> Tensor:
        uncond, cond = out.chunk(2)
        return uncond + guidance_scale * (cond - uncond)

    def _schedule(self, num_steps: int, **kwargs) -> Tensor:
        """``num_steps + 1`` sigmas from a copy of the pipeline's scheduler, as ``retrieve_timesteps`` sets it."""
        from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import retrieve_timesteps

        scheduler = copy.deepcopy(self.scheduler)
        retrieve_timesteps(scheduler, num_steps, "cpu", **kwargs)
        sigmas = scheduler.sigmas.detach().to("cpu", torch.float32).clone()
        if len(sigmas) != num_steps + 1:
            raise ValueError(f"{type(scheduler).__name__} gave {len(sigmas)} sigmas for {num_steps} steps")
        sigmas[-1] = 0.0  # the contract: the schedule ends at the data (already 0 for flow-matching schedulers)
        return sigmas

    def _image_vae_scale(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    def _decode_image(self, latents: Tensor) -> Tensor:
        cfg = self.vae.config
        shift = getattr(cfg, "shift_factor", None) or 0.0
        x = latents.to(self.vae.device, self.vae.dtype) / cfg.scaling_factor + shift
        image = self.vae.decode(x, return_dict=False)[0]
        return (image.float() * 0.5 + 0.5).clamp(0, 1)


class SD3Adapter(DiffusersAdapter):
    """Stable Diffusion 3 / 3.5 (``StableDiffusion3Pipeline``): MMDiT over (C, H/8, W/8) latents, timestep
    ``sigma * num_train_timesteps``, CFG with the empty prompt batched as ``[uncond, cond]``."""

    family = "sd3"
    pipeline_class_name = "StableDiffusion3Pipeline"
    lora_targets = ["to_k", "to_q", "to_v", "to_out.0"]
    default_guidance_scale = 4.5  # SD3.5-Medium's Flow-GRPO evaluation setting
    max_sequence_length = 256  # StableDiffusion3Pipeline.__call__'s default

    def __init__(self, pipe, device=None, max_sequence_length: int | None = None):
        super().__init__(pipe, device, max_sequence_length)
        self.vae_scale_factor = self._image_vae_scale()
        self.patch_size = int(self.transformer_config.patch_size)
        # Flow-GRPO trains SD3.5 at 512 px; small models at their native size
        size = min(512, int(self.transformer_config.sample_size) * self.vae_scale_factor)
        self.default_height = self.default_width = size

    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        f = self.vae_scale_factor
        return (int(self.transformer_config.in_channels), int(height) // f, int(width) // f)

    def sigmas(self, num_steps: int, latent_shape: tuple[int, ...]) -> Tensor:
        config = self.scheduler.config
        kwargs = {}
        if config.get("use_dynamic_shifting", False):
            from diffusers.pipelines.flux.pipeline_flux import calculate_shift

            h, w = latent_shape[-2:]
            seq_len = (h // self.patch_size) * (w // self.patch_size)
            kwargs["mu"] = calculate_shift(
                seq_len, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
                config.get("base_shift", 0.5), config.get("max_shift", 1.16),
            )
        return self._schedule(num_steps, **kwargs)

    def _encode_prompts(self, prompts: list[str]) -> list[dict[str, Tensor]]:
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=prompts, prompt_3=prompts, do_classifier_free_guidance=False,
            device=self.device, max_sequence_length=self.max_sequence_length,
        )
        return self._split({"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}, len(prompts))

    def velocity(self, latents: Tensor, sigma, prompts: Sequence[str], guidance_scale: float = 1.0) -> Tensor:
        batch = latents.shape[0]
        cfg = guidance_scale > 1.0
        timestep = self._sigma(sigma, batch) * self.num_train_timesteps
        emb = self._embeddings(prompts, batch, cfg)
        x = latents.to(self.device, self.dtype)
        if cfg:
            x, timestep = torch.cat([x, x]), torch.cat([timestep, timestep])
        out = self.transformer(
            hidden_states=x, timestep=timestep, encoder_hidden_states=emb["prompt_embeds"],
            pooled_projections=emb["pooled_prompt_embeds"], return_dict=False,
        )[0].float()
        return self._guide(out, guidance_scale) if cfg else out

    def decode(self, latents: Tensor) -> Tensor:
        return self._decode_image(latents)


class FluxAdapter(DiffusersAdapter):
    """FLUX.1 (``FluxPipeline``). Policy-facing latents are UNPACKED ``(C, H/8, W/8)``; ``velocity`` packs them
    into 2x2 patches (``_pack_latents``) for the transformer and unpacks its output. Timestep ``sigma``.
    FLUX-dev (``guidance_embeds``): the guidance scale goes to the distilled guidance embedding, no CFG batch;
    FLUX-schnell: no guidance input, and ``guidance_scale > 1`` is true CFG with the empty prompt."""

    family = "flux"
    pipeline_class_name = "FluxPipeline"
    lora_targets = ["to_k", "to_q", "to_v", "to_out.0"]
    default_guidance_scale = 3.5
    max_sequence_length = 512  # FluxPipeline.__call__'s default

    def __init__(self, pipe, device=None, max_sequence_length: int | None = None):
        super().__init__(pipe, device, max_sequence_length)
        self.vae_scale_factor = self._image_vae_scale()
        self.guidance_embeds = bool(self.transformer_config.get("guidance_embeds", False))
        if not self.guidance_embeds:
            self.default_guidance_scale = 1.0  # schnell is guidance-distilled: no CFG by default
        size = min(512, int(getattr(pipe, "default_sample_size", 64)) * self.vae_scale_factor)
        self.default_height = self.default_width = size

    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        f = self.vae_scale_factor * 2
        return (int(self.transformer_config.in_channels) // 4, 2 * (int(height) // f), 2 * (int(width) // f))

    def sigmas(self, num_steps: int, latent_shape: tuple[int, ...]) -> Tensor:
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        config = self.scheduler.config
        h, w = latent_shape[-2:]
        seq_len = (h // 2) * (w // 2)  # packed tokens
        sigmas = None if config.get("use_flow_sigmas", False) else np.linspace(1.0, 1 / num_steps, num_steps)
        mu = calculate_shift(
            seq_len, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5), config.get("max_shift", 1.15),
        )
        return self._schedule(num_steps, sigmas=sigmas, mu=mu)

    def _encode_prompts(self, prompts: list[str]) -> list[dict[str, Tensor]]:
        embeds, pooled, _text_ids = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=prompts, device=self.device, max_sequence_length=self.max_sequence_length,
        )
        return self._split({"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}, len(prompts))

    def pack(self, latents: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, H/2 * W/2, 4C), as ``FluxPipeline._pack_latents``."""
        from diffusers import FluxPipeline

        b, c, h, w = latents.shape
        return FluxPipeline._pack_latents(latents, b, c, h, w)

    def unpack(self, packed: Tensor, height: int, width: int) -> Tensor:
        """(B, H/2 * W/2, 4C) -> (B, C, H, W) for latent ``height``/``width``, as ``FluxPipeline._unpack_latents``."""
        from diffusers import FluxPipeline

        f = self.vae_scale_factor
        return FluxPipeline._unpack_latents(packed, height * f, width * f, f)

    def velocity(self, latents: Tensor, sigma, prompts: Sequence[str], guidance_scale: float = 1.0) -> Tensor:
        from diffusers import FluxPipeline

        batch, _, height, width = latents.shape
        cfg = (not self.guidance_embeds) and guidance_scale > 1.0
        n = 2 * batch if cfg else batch
        timestep = self._sigma(sigma, batch).to(self.dtype)  # the pipeline passes t / 1000 = sigma
        emb = self._embeddings(prompts, batch, cfg)
        x = self.pack(latents.to(self.device, self.dtype))
        img_ids = FluxPipeline._prepare_latent_image_ids(batch, height // 2, width // 2, self.device, self.dtype)
        txt_ids = torch.zeros(emb["prompt_embeds"].shape[1], 3, device=self.device, dtype=self.dtype)
        guidance = (
            torch.full([n], guidance_scale, device=self.device, dtype=torch.float32) if self.guidance_embeds else None
        )
        if cfg:
            x, timestep = torch.cat([x, x]), torch.cat([timestep, timestep])
        out = self.transformer(
            hidden_states=x, timestep=timestep, guidance=guidance, pooled_projections=emb["pooled_prompt_embeds"],
            encoder_hidden_states=emb["prompt_embeds"], txt_ids=txt_ids, img_ids=img_ids, return_dict=False,
        )[0].float()
        if cfg:
            out = self._guide(out, guidance_scale)
        return self.unpack(out, height, width)

    def decode(self, latents: Tensor) -> Tensor:
        return self._decode_image(latents)


class WanAdapter(DiffusersAdapter):
    """Wan 2.1 text-to-video (``WanPipeline``): latents ``(C, F_lat, H/8, W/8)`` with
    ``F_lat = (num_frames - 1) // 4 + 1``, timestep ``sigma * num_train_timesteps``, CFG with the empty prompt.
    ``decode`` gives ``(B, F, 3, H, W)`` in [0, 1]."""

    family = "wan"
    pipeline_class_name = "WanPipeline"
    is_video = True
    # WanAttention (self-attention attn1 and cross-attention attn2 of every block)
    lora_targets = ["to_q", "to_k", "to_v", "to_out.0"]
    default_guidance_scale = 5.0
    default_height = 480
    default_width = 832
    default_num_frames = 81
    max_sequence_length = 512  # WanPipeline.__call__'s default

    def __init__(self, pipe, device=None, max_sequence_length: int | None = None):
        if getattr(pipe, "transformer_2", None) is not None or pipe.config.get("boundary_ratio") is not None:
            raise NotImplementedError(
                "Wan 2.2 two-expert pipelines (transformer_2 / boundary_ratio) are not supported; use a Wan 2.1 or "
                "Wan 2.2 TI2V-5B (single transformer) checkpoint"
            )
        super().__init__(pipe, device, max_sequence_length)
        self.expand_timesteps = bool(pipe.config.get("expand_timesteps", False))
        self.vae_scale_factor_temporal = int(pipe.vae_scale_factor_temporal)
        self.vae_scale_factor_spatial = int(pipe.vae_scale_factor_spatial)

    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        frames = self.default_num_frames if num_frames is None else int(num_frames)
        s = self.vae_scale_factor_spatial
        return (
            int(self.transformer_config.in_channels), (frames - 1) // self.vae_scale_factor_temporal + 1,
            int(height) // s, int(width) // s,
        )

    def sigmas(self, num_steps: int, latent_shape: tuple[int, ...]) -> Tensor:
        return self._schedule(num_steps)  # WanPipeline: scheduler.set_timesteps(num_inference_steps)

    def _encode_prompts(self, prompts: list[str]) -> list[dict[str, Tensor]]:
        embeds, _ = self.pipe.encode_prompt(
            prompt=prompts, negative_prompt=None, do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length, device=self.device,
        )
        return self._split({"prompt_embeds": embeds}, len(prompts))

    def velocity(self, latents: Tensor, sigma, prompts: Sequence[str], guidance_scale: float = 1.0) -> Tensor:
        batch = latents.shape[0]
        cfg = guidance_scale > 1.0
        timestep = self._sigma(sigma, batch) * self.num_train_timesteps
        if self.expand_timesteps:  # Wan 2.2 TI2V: one timestep per (2x2-patched) token, all equal for text-to-video
            _, _, frames, height, width = latents.shape
            tokens = frames * ((height + 1) // 2) * ((width + 1) // 2)
            timestep = timestep[:, None].expand(batch, tokens)
        emb = self._embeddings(prompts, batch, cfg)
        x = latents.to(self.device, self.dtype)
        if cfg:
            x, timestep = torch.cat([x, x]), torch.cat([timestep, timestep])
        out = self.transformer(
            hidden_states=x, timestep=timestep, encoder_hidden_states=emb["prompt_embeds"], return_dict=False,
        )[0].float()
        return self._guide(out, guidance_scale) if cfg else out

    def decode(self, latents: Tensor) -> Tensor:
        cfg = self.vae.config
        x = latents.to(self.vae.device, self.vae.dtype)
        mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(x.device, x.dtype)
        std = torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(x.device, x.dtype)
        x = x / (1.0 / std) + mean  # as WanPipeline (which divides by the reciprocal std)
        video = self.vae.decode(x, return_dict=False)[0]  # (B, 3, F, H, W) in [-1, 1]
        return (video.float() * 0.5 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4).contiguous()


ADAPTERS.update({
    SD3Adapter.pipeline_class_name: SD3Adapter.from_pretrained,
    FluxAdapter.pipeline_class_name: FluxAdapter.from_pretrained,
    WanAdapter.pipeline_class_name: WanAdapter.from_pretrained,
})
