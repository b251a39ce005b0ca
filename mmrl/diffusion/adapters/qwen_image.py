"""Qwen-Image (``QwenImagePipeline``) as a :class:`~mmrl.diffusion.base.FlowPipeline`."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ...core.library_internals import flux_pack_latents, flux_unpack_latents
from .diffusers_base import DiffusersAdapter


class QwenImageAdapter(DiffusersAdapter):
    """Qwen-Image (``QwenImagePipeline``): a dual-stream MMDiT over 2x2-packed latents of a Wan-style VAE, prompted
    by Qwen2.5-VL's last hidden state.

    What ``QwenImagePipeline.__call__`` does, piece by piece:

    - text: the prompt in the pipeline's system template through Qwen2.5-VL, the template's first tokens dropped
      (``encode_prompt``, truncated to ``max_sequence_length``). Prompts differ in length: a batch is zero-padded
      with ``encoder_hidden_states_mask`` (none when all are equally long), as the pipeline pads its own batches;
    - latents: policy-facing latents are UNPACKED ``(C, H/8, W/8)``; ``velocity`` packs them into 2x2 patches (the
      same layout as FLUX's ``_pack_latents``) with ``img_shapes`` ``(1, H/16, W/16)`` for the rotary positions,
      and unpacks the output. The timestep is ``sigma`` (the pipeline passes ``t / 1000``);
    - schedule: ``linspace(1, 1/n, n)`` shifted by ``mu = calculate_shift(packed tokens)`` with the scheduler's
      config (Qwen-Image's: exponential time shift, ``shift_terminal`` 0.02);
    - guidance: ``guidance_scale > 1`` is true CFG with the empty prompt (the pipeline's ``true_cfg_scale`` with
      ``negative_prompt=""``), batched as ``[uncond, cond]``; the guided velocity is rescaled, token by token, to
      the norm of the conditional one, as the pipeline does;
    - decode: one frame of the Wan-style VAE (``AutoencoderKLQwenImage``) after ``latents * std + mean``.
    """

    family = "qwen_image"
    pipeline_class_name = "QwenImagePipeline"
    # The dual-stream blocks' attention: image-stream q/k/v/out and text-stream q/k/v/out.
    lora_targets = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]
    default_guidance_scale = 4.0  # the pipeline's true_cfg_scale default
    max_sequence_length = 512  # QwenImagePipeline.__call__'s default

    def __init__(self, pipe, device=None, max_sequence_length: int | None = None):
        if pipe.transformer.config.get("guidance_embeds", False):
            raise ValueError(
                "transformer/config.json sets guidance_embeds=true: diffusers' QwenImageTransformer2DModel has no "
                "guidance embedding to feed it (a guidance-distilled Qwen-Image is not supported); use a checkpoint "
                "with guidance_embeds=false"
            )
        super().__init__(pipe, device, max_sequence_length)
        self.vae_scale_factor = int(pipe.vae_scale_factor)  # 2 ** len(vae.temperal_downsample), 8 for Qwen-Image
        # The pipeline's default is 1024 px (default_sample_size 128); RL trains at 512 at most by default.
        self.default_height = self.default_width = min(512, int(pipe.default_sample_size) * self.vae_scale_factor)

    def sigmas(self, num_steps: int, latent_shape: tuple[int, ...]) -> Tensor:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

        config = self.scheduler.config
        h, w = latent_shape[-2:]
        mu = calculate_shift(
            (h // 2) * (w // 2), config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5), config.get("max_shift", 1.15),
        )
        return self._schedule(num_steps, sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)

    def _encode_prompts(self, prompts: list[str]) -> list[dict[str, Tensor]]:
        embeds, mask = self.pipe.encode_prompt(prompt=prompts, device=self.device,
                                               max_sequence_length=self.max_sequence_length)
        return self._unpadded(embeds, mask)

    @staticmethod
    def _unpadded(embeds: Tensor, mask: Tensor | None) -> list[dict[str, Tensor]]:
        """Per-prompt ``prompt_embeds`` (1, L_i, D) without the padding of the pipeline's batch."""
        lengths = [embeds.shape[1]] * len(embeds) if mask is None else mask.sum(dim=1).tolist()
        return [{"prompt_embeds": embeds[i : i + 1, : int(n)].detach().clone()} for i, n in enumerate(lengths)]

    def _texts(self, parts: Sequence[dict[str, Tensor]]) -> tuple[Tensor, Tensor | None]:
        """Cached per-prompt embeddings as one zero-padded batch and its mask (None when nothing is padded), as
        ``_get_qwen_prompt_embeds`` pads a batch."""
        lengths = [part["prompt_embeds"].shape[1] for part in parts]
        longest = max(lengths)
        embeds = torch.cat([F.pad(part["prompt_embeds"], (0, 0, 0, longest - n)) for part, n in zip(parts, lengths)])
        if all(n == longest for n in lengths):
            return embeds.to(self.device, self.dtype), None
        mask = torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]
        return embeds.to(self.device, self.dtype), mask.to(self.device)

    def _prompt_parts(self, prompts: Sequence[str], batch: int, cfg: bool) -> list[dict[str, Tensor]]:
        prompts = list(prompts)
        if len(prompts) != batch:
            raise ValueError(f"{len(prompts)} prompts for a batch of {batch} latents")
        return [self.prompt_cache.get([p]) for p in ([""] * batch + prompts if cfg else prompts)]

    def velocity(self, latents: Tensor, sigma, prompts: Sequence[str], guidance_scale: float = 1.0) -> Tensor:
        cfg = guidance_scale > 1.0
        return self._denoise(latents, sigma, self._prompt_parts(prompts, len(latents), cfg), guidance_scale)

    def _denoise(self, latents: Tensor, sigma, parts: Sequence[dict[str, Tensor]], guidance_scale: float,
                 condition: Tensor | None = None, condition_grid: tuple[int, int] | None = None) -> Tensor:
        """The transformer's (guided) velocity for unpacked ``latents`` and per-sample text ``parts`` (``[uncond,
        cond]`` halves under CFG). ``condition``: packed image tokens appended to the noisy ones (an edit model's
        source image, of ``condition_grid`` (rows, columns) patches); the output keeps the noisy tokens only."""
        batch, _, height, width = latents.shape
        cfg = guidance_scale > 1.0
        x = flux_pack_latents(latents.to(self.device, self.dtype))
        noisy_tokens = x.shape[1]
        shapes = [(1, height // 2, width // 2)]
        if condition is not None:
            x = torch.cat([x, condition.to(self.device, self.dtype)], dim=1)
            shapes.append((1, *condition_grid))
        timestep = self._sigma(sigma, batch).to(self.dtype)  # the pipeline passes t / 1000 = sigma
        text, mask = self._texts(parts)
        if cfg:
            x, timestep = torch.cat([x, x]), torch.cat([timestep, timestep])
        out = self.transformer(
            hidden_states=x, timestep=timestep, encoder_hidden_states=text, encoder_hidden_states_mask=mask,
            img_shapes=[shapes] * len(x), return_dict=False,
        )[0][:, :noisy_tokens].float()
        if cfg:
            uncond, cond = out.chunk(2)
            guided = self._guide(out, guidance_scale)
            # the pipeline keeps the conditional prediction's norm per token (over the packed channels)
            out = guided * (cond.norm(dim=-1, keepdim=True) / guided.norm(dim=-1, keepdim=True))
        f = self.vae_scale_factor
        return flux_unpack_latents(out, height * f, width * f, f)

    def decode(self, latents: Tensor) -> Tensor:
        x = latents.to(self.vae.device, self.vae.dtype).unsqueeze(2)  # one frame: (B, C, 1, h, w)
        mean, std = self._latent_statistics(x)
        x = x / (1.0 / std) + mean  # as QwenImagePipeline (which divides by the reciprocal std)
        image = self.vae.decode(x, return_dict=False)[0][:, :, 0]
        return (image.float() * 0.5 + 0.5).clamp(0, 1)

    # -- mmrl plan (mmrl.diffusion.memory_shape): the transformer's call from configs alone ---------------
    @classmethod
    def plan_latent_shape(cls, configs: dict, height: int, width: int, num_frames: int | None = None) -> tuple:
        """:meth:`latent_shape` from the components' configs (``{"transformer": {...}, "vae": {...}}``)."""
        f = 2 ** len(configs["vae"]["temperal_downsample"]) * 2  # the pipeline's vae_scale_factor x the 2x2 packing
        return (int(configs["transformer"]["in_channels"]) // 4, 2 * (int(height) // f), 2 * (int(width) // f))

    @classmethod
    def plan_inputs(cls, configs: dict, batch: int, latent_shape: tuple, text_tokens: int, dtype, device,
                    condition_grid: tuple[int, int] | None = None) -> dict:
        """The transformer's forward kwargs as :meth:`_denoise` passes them, at these shapes (random values);
        ``condition_grid``: an edit model's source-image tokens appended (rows, columns)."""
        config = configs["transformer"]
        grid = (latent_shape[-2] // 2, latent_shape[-1] // 2)
        shapes = [(1, *grid)] + ([(1, *condition_grid)] if condition_grid else [])
        tokens = sum(rows * columns for _, rows, columns in shapes)
        return {"hidden_states": torch.randn(batch, tokens, int(config["in_channels"]), device=device, dtype=dtype),
                "timestep": torch.rand(batch, device=device, dtype=dtype),
                "encoder_hidden_states": torch.randn(batch, text_tokens, int(config["joint_attention_dim"]),
                                                     device=device, dtype=dtype),
                "encoder_hidden_states_mask": None, "img_shapes": [shapes] * batch, "return_dict": False}
