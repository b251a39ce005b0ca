"""What the diffusers adapters share: the pipeline's components, the prompt-embedding cache,
classifier-free guidance, the scheduler's sigma schedule and image VAE decoding."""

from __future__ import annotations

import copy
from typing import Sequence

import torch
from torch import Tensor

from ..base import FlowPipeline, PromptCache


def as_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and isinstance(getattr(torch, dtype.removeprefix("torch."), None), torch.dtype):
        return getattr(torch, dtype.removeprefix("torch."))
    raise ValueError(f"not a torch dtype: {dtype!r}")


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
        pipe = pipe_cls.from_pretrained(path, dtype=as_dtype(dtype))  # diffusers >= 0.37 (torch_dtype warns)
        return cls(pipe, device=device, **kwargs)

    @property
    def component_configs(self) -> dict[str, dict]:
        """The pipeline's models' configs by component (``{"transformer": {...}, "vae": {...}, ...}``): what
        the family's shapes are computed from, here and in ``mmrl plan`` (which has the configs alone)."""
        return {name: dict(module.config) for name, module in self.pipe.components.items()
                if isinstance(module, torch.nn.Module) and isinstance(getattr(module, "config", None), dict)}

    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        """One sample's latents, as the family's ``plan_latent_shape`` computes them from its configs."""
        return tuple(self.plan_latent_shape(self.component_configs, height, width, num_frames))

    @classmethod
    def plan_latent_shape(cls, configs: dict, height: int, width: int, num_frames: int | None = None) -> tuple:
        raise NotImplementedError

    @classmethod
    def plan_text_tokens(cls, configs: dict) -> int:
        """The prompt embedding's length ``mmrl plan`` assumes: ``max_sequence_length`` (the longest prompt)."""
        return cls.max_sequence_length

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

    def _latent_statistics(self, like: Tensor) -> tuple[Tensor, Tensor]:
        """A Wan-style VAE's (Wan, Qwen-Image) per-channel ``latents_mean`` and ``latents_std``, shaped
        (1, C, 1, 1, 1) on ``like``'s device and dtype: latents are normalised with them after encoding
        and before decoding."""
        cfg = self.vae.config
        mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(like.device, like.dtype)
        std = torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(like.device, like.dtype)
        return mean, std

    def _decode_image(self, latents: Tensor) -> Tensor:
        cfg = self.vae.config
        shift = getattr(cfg, "shift_factor", None) or 0.0
        x = latents.to(self.vae.device, self.vae.dtype) / cfg.scaling_factor + shift
        image = self.vae.decode(x, return_dict=False)[0]
        return (image.float() * 0.5 + 0.5).clamp(0, 1)
