"""What the diffusion policy needs from a generator: the contract every model adapter implements.

The RL loop owns the sampling loop (it needs a log-prob at every stochastic step), so an adapter
does not run its pipeline's ``__call__``; it exposes the pieces: the velocity of the flow at
``(latents, sigma)`` for some prompts (classifier-free guidance inside, prompt embeddings cached),
the sigma schedule, the latent shape, and decoding latents to pixels.

Conventions (rectified flow, as in diffusers' ``FlowMatchEulerDiscreteScheduler``):
``x_sigma = (1 - sigma) * x0 + sigma * noise``, sigma runs from ~1 (noise) down to 0 (data),
the model predicts the velocity ``v = noise - x0`` and one Euler step is
``x_next = x + (sigma_next - sigma) * v``.

Conditioned generation (image editing, image-to-video): a task's prompt is a :class:`GenerationPrompt`
(the text and an input image); a pipeline that takes one declares ``conditioning`` and receives the
images, resized to the output, with every ``velocity`` call.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Callable, Sequence

import torch
from torch import Tensor

from ..task import GenerationPrompt  # noqa: F401  (a generator's prompt with an input image; re-exported)

# What a conditioned pipeline is given besides the text (``FlowPipeline.conditioning``).
CONDITIONINGS = ("image", "first_frame")


def image_digest(image: Tensor) -> str:
    """A key for a condition image tensor: the digest of its bytes (two samples of one source image
    share an encoding; nothing is kept of the image itself)."""
    data = image.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class PromptCache:
    """Per-prompt text-encoder outputs, computed once: RL revisits the same prompts every step, and
    the text encoders of SD3 (two CLIPs + T5) or FLUX (CLIP + T5) cost more than a small
    transformer step. ``encode(prompts)`` -> dict of per-prompt tensors with a leading axis of 1;
    ``get`` concatenates them along axis 0 in the order asked (tensors without a batch axis, such
    as FLUX's ``text_ids``, are taken from the first prompt)."""

    def __init__(self, encode: Callable[[list[str]], list[dict[str, Tensor]]], max_size: int = 4096):
        self._encode = encode
        self._store: OrderedDict[str, dict[str, Tensor]] = OrderedDict()
        self.max_size = max_size
        self.hits = 0
        self.misses = 0

    def get(self, prompts: Sequence[str]) -> dict[str, Tensor]:
        missing = list(dict.fromkeys(p for p in prompts if p not in self._store))
        self.hits += len(prompts) - len([p for p in prompts if p in missing])
        self.misses += len(missing)
        if missing:
            with torch.no_grad():
                for prompt in missing:  # one at a time: a prompt's embedding must not depend on its batch
                    self._store[prompt] = self._encode([prompt])[0]
        while len(self._store) > self.max_size:
            self._store.popitem(last=False)
        parts = [self._store[p] for p in prompts]
        out = {}
        for key, first in parts[0].items():
            if first.dim() >= 1 and all(part[key].dim() == first.dim() for part in parts) and first.shape[0] == 1:
                out[key] = torch.cat([part[key] for part in parts], dim=0)
            else:
                out[key] = first
        return out

    def clear(self) -> None:
        """Forget the encodings and start counting afresh (the counters describe what is stored)."""
        self._store.clear()
        self.hits = self.misses = 0


class ConditionCache:
    """Per (prompt text, condition image) encodings, computed once, for pipelines whose conditioning
    depends on the image (an edit model's VLM text encoder reads the source image; the image's VAE
    latents). ``encode(texts, images)`` gets n texts and an (n, 3, H, W) tensor and returns one dict
    of tensors with a leading axis of 1 per pair; ``get(texts, images)`` concatenates them in the
    order asked, as :class:`PromptCache` does for text alone."""

    def __init__(self, encode: Callable[[list[str], Tensor], list[dict[str, Tensor]]], max_size: int = 1024):
        self._store = PromptCache(self._encode_keys, max_size)
        self._encode = encode
        self._pending: dict[tuple[str, str], Tensor] = {}

    def _encode_keys(self, keys: list) -> list[dict[str, Tensor]]:
        texts = [text for text, _ in keys]
        return self._encode(texts, torch.stack([self._pending[key] for key in keys]))

    def get(self, texts: Sequence[str], images: Tensor) -> dict[str, Tensor]:
        if len(texts) != len(images):
            raise ValueError(f"{len(texts)} prompts for {len(images)} condition images")
        keys = [(str(text), image_digest(image)) for text, image in zip(texts, images)]
        self._pending = dict(zip(keys, images))
        try:
            return self._store.get(keys)
        finally:
            self._pending = {}

    @property
    def hits(self) -> int:
        return self._store.hits

    @property
    def misses(self) -> int:
        return self._store.misses

    def clear(self) -> None:
        self._store.clear()


class FlowPipeline:
    """A text-to-image (or -video) rectified-flow generator, as the diffusion policy sees it.

    Subclasses set ``transformer`` (the module RL trains; LoRA goes here), ``family`` and
    ``lora_targets`` (peft ``target_modules`` for the transformer) and implement the methods.
    All latents handed in and out are float32; adapters cast to the model dtype inside.
    """

    family: str = "base"
    transformer: torch.nn.Module
    lora_targets: list[str] = ["to_q", "to_k", "to_v", "to_out.0"]
    is_video: bool = False
    # None: text only; "image": an editing model (the source image); "first_frame": image-to-video. A
    # conditioned pipeline's ``velocity`` takes ``images`` (module docstring; CONDITIONINGS).
    conditioning: str | None = None
    # The guidance scale of the checkpoint's own pipeline: what ``diffusion.guidance_scale: null`` uses.
    default_guidance_scale: float = 1.0
    default_height: int = 512
    default_width: int = 512

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.transformer.parameters()).dtype

    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        """Shape of one sample's latents (no batch axis)."""
        raise NotImplementedError

    def sigmas(self, num_steps: int, latent_shape: tuple[int, ...]) -> Tensor:
        """The ``num_steps + 1`` sigmas of the sampling schedule, from ~1 down to exactly 0
        (the checkpoint's scheduler: its shift, or FLUX's resolution-dependent dynamic shift)."""
        raise NotImplementedError

    def velocity(self, latents: Tensor, sigma: Tensor, prompts: Sequence[str], guidance_scale: float = 1.0) -> Tensor:
        """The flow's velocity (float32, shape of ``latents``) at per-sample noise levels ``sigma``
        (B,) for ``prompts`` (B strings). ``guidance_scale > 1``: classifier-free guidance with the
        empty prompt as the unconditional branch (FLUX-dev feeds it to its guidance embedding
        instead). Gradients flow when called with grad enabled.

        A conditioned pipeline (``conditioning`` set) takes a fifth argument ``images``: float32
        (B, 3, H, W) in [0, 1], one per sample, at the output's height and width; its unconditional
        branch keeps the image (only the text is emptied), as the diffusers edit and image-to-video
        pipelines do."""
        raise NotImplementedError

    def decode(self, latents: Tensor) -> Tensor:
        """Pixels in [0, 1], float32: (B, 3, H, W) for images, (B, F, 3, H, W) for video."""
        raise NotImplementedError

    def final_latents(self, latents: Tensor, images: Tensor | None = None) -> Tensor:
        """The sampled latents as the checkpoint's pipeline hands them to the VAE: unchanged, but for
        first-frame conditioning (:mod:`mmrl.diffusion.first_frame`), where diffusers puts the given
        frame back over the first latent frame; a stochastic last step leaves noise there otherwise."""
        return latents

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.transformer.parameters() if p.requires_grad]
