"""Pretrain the tiny generator on synthetic shape images (``mmrl build-tiny diffusion``).

Rectified-flow matching ("Flow Straight and Fast: Learning to Generate and Transfer Data with
Rectified Flow", Liu et al., 2022; the objective SD3 trains with): for an image x0, noise e and
sigma ~ U(0, 1), regress the transformer's output on the velocity e - x0 at
x_sigma = (1 - sigma) x0 + sigma e. Prompts are dropped (replaced by "") 10% of the time so the
model also learns the unconditional flow classifier-free guidance needs.

The shipped recipe (:data:`TINY_GENERATOR_RECIPE`, what ``mmrl build-tiny diffusion`` runs) trains
on captions that, like web alt-text, misstate the colour half the time (``caption_noise``): the
generator learns to draw shapes but follows the prompt's colour only about half the time. That
prompt-following gap is what RL on the composition reward closes within minutes on a CPU (the
README has the measured run); count and shape are limited by how well 1M parameters draw.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from ..data.motion_t2v import CLIP_SIZE, NUM_FRAMES, clip_array, motion_example
from ..data.shape_edits import EDIT_SIZE, edit_example
from ..data.shapes_t2i import example
from .tiny import EDIT_WORDS, TinyFlowPipeline, new_tiny_models, save_tiny
from .tiny_video import TinyWanPipeline, new_tiny_video_models, save_tiny_video


def shapes_dataset(size: int, seed: int, image_size: int = 32, caption_noise: float | dict = 0.0, **spec_kwargs) -> tuple[torch.Tensor, list[str]]:
    """``size`` rendered scenes as uint8 (N, 3, image_size, image_size) and their prompts (deterministic by seed)."""
    images, prompts = [], []
    for i in range(size):
        ex = example(np.random.default_rng([seed, i]), size=image_size, caption_noise=caption_noise, **spec_kwargs)
        images.append(torch.from_numpy(np.array(ex["image"], dtype=np.uint8)).permute(2, 0, 1))
        prompts.append(ex["prompt"])
    return torch.stack(images), prompts


def flow_matching_step(pipe: TinyFlowPipeline, images: torch.Tensor, prompts: list[str], generator: torch.Generator,
                       drop_prob: float = 0.1, loss_space: str = "velocity",
                       conditions: torch.Tensor | None = None) -> torch.Tensor:
    """The rectified-flow loss of one batch (``images`` uint8), text encoder trained jointly;
    ``conditions`` (uint8, an editing generator's source images) are kept when the prompt is dropped.

    ``loss_space="velocity"``: the squared error of the velocity (SD3's objective). ``"sample"``: of
    the clean sample it implies, ``x_sigma - sigma v``, i.e. the velocity error weighted by sigma^2:
    the high-noise steps, where a clip's layout across frames is decided, then weigh as much as the
    low-noise ones (with the velocity loss the tiny video generator drew each frame on its own)."""
    x0 = pipe.encode_images(images.float() / 255.0)
    noise = torch.randn(x0.shape, generator=generator)
    sigma = torch.rand(x0.shape[0], generator=generator)
    drop = torch.rand(len(prompts), generator=generator) < drop_prob
    prompts = ["" if d else p for p, d in zip(prompts, drop.tolist())]
    s = sigma.view(-1, *([1] * (x0.dim() - 1)))
    x_sigma = (1 - s) * x0 + s * noise
    embeds = pipe.encode_text(prompts)
    if conditions is not None:
        embeds["image"] = pipe.encode_images(conditions.float() / 255.0)
    v = pipe.velocity_from_embeds(x_sigma, sigma, embeds)
    if loss_space == "sample":
        return torch.mean((x_sigma - s * v - x0) ** 2)
    if loss_space != "velocity":
        raise ValueError(f"loss_space must be velocity or sample, got {loss_space!r}")
    return torch.mean((v - (noise - x0)) ** 2)


@torch.no_grad()
def update_ema(ema: list[torch.Tensor], params: list[torch.Tensor], decay: float) -> None:
    """ema <- decay * ema + (1 - decay) * params: diffusion models sample from averaged weights
    (DDPM, DiT), which are much less noisy than the last iterate."""
    for e, p in zip(ema, params):
        e.mul_(decay).add_(p.detach(), alpha=1 - decay)


# The shipped tiny generator (assets/tiny-flow-shapes): 16x16 pixels in 2-px patches, x-prediction,
# EMA weights, colour words wrong in half the captions; ~12 minutes on 2 CPU cores.
TINY_GENERATOR_RECIPE: dict = {"steps": 4000, "image_size": 16, "patch_size": 2, "prediction": "sample",
                               "ema_decay": 0.999, "caption_noise": {"color": 0.5}}


def pretrain_tiny_generator(out: str | Path, steps: int = 1500, batch_size: int = 64, lr: float = 1e-3,
                            dataset_size: int = 20000, seed: int = 0, log_every: int = 250,
                            width: int = 96, layers: int = 3, image_size: int = 32, patch_size: int = 4,
                            prediction: str = "velocity", caption_noise: float | dict = 0.0, ema_decay: float = 0.0) -> Path:
    """Build and pretrain a tiny generator; save it to ``out`` (``mmrl_generator.json`` records
    the recipe). Deterministic for a given seed and thread count. The argument defaults make a
    plain model (32x32, velocity prediction, true captions); the shipped one is
    ``pretrain_tiny_generator(out, **TINY_GENERATOR_RECIPE)``."""
    transformer, text_encoder, tokenizer, scheduler = new_tiny_models(seed, width=width, layers=layers, image_size=image_size,
                                                                      patch_size=patch_size)
    pipe = TinyFlowPipeline(transformer, text_encoder, tokenizer, scheduler, {"prediction": prediction})
    images, prompts = shapes_dataset(dataset_size, seed, image_size, caption_noise)
    fit_flow(pipe, images, prompts, steps, batch_size, lr, seed, log_every, ema_decay)
    return save_tiny(out, transformer, text_encoder, tokenizer, scheduler,
                     {"prediction": prediction, "pretrain": {"steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed,
                                   "dataset_size": dataset_size, "width": width, "layers": layers,
                                                "image_size": image_size, "patch_size": patch_size,
                                                "caption_noise": caption_noise, "ema_decay": ema_decay}})


def fit_flow(pipe: TinyFlowPipeline, data: torch.Tensor, prompts: list[str], steps: int, batch_size: int, lr: float,
             seed: int, log_every: int, ema_decay: float, loss_space: str = "velocity",
             conditions: torch.Tensor | None = None) -> None:
    """Flow-match ``pipe``'s transformer and text encoder on ``data`` (uint8 images or clips) and
    their ``prompts`` (and ``conditions``, the source images of edits): AdamW, 100 warm-up steps then linear decay, gradient clipping at 1, and the
    EMA weights copied in at the end when ``ema_decay`` > 0. Leaves both models in eval mode."""
    pipe.text_encoder.requires_grad_(True).train()
    pipe.transformer.train()
    params = list(pipe.transformer.parameters()) + list(pipe.text_encoder.parameters())
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    ema = [p.detach().clone() for p in params] if ema_decay else None
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 100) * max(0.05, 1 - s / steps))  # warmup, linear decay
    g = torch.Generator().manual_seed(seed)
    t0, running = time.perf_counter(), 0.0
    for step in range(1, steps + 1):
        idx = torch.randint(0, len(data), (batch_size,), generator=g)
        loss = flow_matching_step(pipe, data[idx], [prompts[i] for i in idx.tolist()], g, loss_space=loss_space,
                                  conditions=None if conditions is None else conditions[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        if ema is not None:
            update_ema(ema, params, min(ema_decay, (1 + step) / (10 + step)))
        running += float(loss.detach())
        if log_every and step % log_every == 0:
            print(f"step {step}/{steps} loss {running / log_every:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
            running = 0.0
    if ema is not None:
        with torch.no_grad():
            for p, e in zip(params, ema):
                p.copy_(e)
    pipe.transformer.eval()
    pipe.text_encoder.requires_grad_(False).eval()


def edit_dataset(size: int, seed: int, image_size: int = EDIT_SIZE,
                 color_noise: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """``size`` synthetic edits (:mod:`mmrl.data.shape_edits`) as uint8 targets and sources (N, 3, H, W)
    and their instructions (deterministic by seed)."""
    targets, sources, instructions = [], [], []
    for i in range(size):
        ex = edit_example(np.random.default_rng([seed, i]), image_size, color_noise=color_noise)
        targets.append(torch.from_numpy(np.array(ex["target"], dtype=np.uint8)).permute(2, 0, 1))
        sources.append(torch.from_numpy(np.array(ex["source"], dtype=np.uint8)).permute(2, 0, 1))
        instructions.append(ex["instruction"])
    return torch.stack(targets), torch.stack(sources), instructions


# The shipped tiny editing generator (assets/tiny-flow-edit): the shipped image generator ("tiny": 16x16,
# 2-px patches, x-prediction) widened to take the source image on 3 more input channels and fine-tuned on
# synthetic edits with EMA, the new colour wrong in half the instructions (recolour, add), so RL on the
# pixel-verified edit reward has a gap to close.
TINY_EDIT_GENERATOR_RECIPE: dict = {"steps": 1500, "base": "tiny", "ema_decay": 0.998, "color_noise": 0.5}


def widen_for_edits(pipe: TinyFlowPipeline) -> TinyFlowPipeline:
    """An editing generator (``conditioning: image``) made from a text-to-image one, as InstructPix2Pix
    starts from Stable Diffusion: the patch embedding gets 3 more input channels for the source image,
    their weights zero (so it first draws exactly what the base draws), and the tokenizer and text
    encoder the words of the edit instructions (:data:`EDIT_WORDS`, new embedding rows random)."""
    import diffusers

    from .tiny import build_tokenizer

    # the base's config without diffusers' private keys (its _name_or_path is where it was loaded from)
    config = {**{k: v for k, v in pipe.transformer.config.items() if not k.startswith("_")}, "in_channels": 6}
    transformer = getattr(diffusers, pipe.transformer_class).from_config(config)
    state = pipe.transformer.state_dict()
    weight = state["pos_embed.proj.weight"]
    state["pos_embed.proj.weight"] = torch.cat([weight, torch.zeros_like(weight)], dim=1)
    transformer.load_state_dict(state)
    words = [w for w in pipe.tokenizer.get_vocab() if not w.startswith("[")]
    words = sorted(words, key=pipe.tokenizer.get_vocab().get) + [w for w in EDIT_WORDS if w not in words]
    tokenizer = build_tokenizer(words)
    text_encoder = pipe.text_encoder
    text_encoder.resize_token_embeddings(len(words) + 3)
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler_config)
    if transformer.dtype != pipe.dtype:  # (diffusers warns on any dtype cast of a model)
        transformer = transformer.to(pipe.dtype)
    return TinyFlowPipeline(transformer, text_encoder, tokenizer, scheduler,
                            {**pipe.info, "conditioning": "image"})


def pretrain_tiny_edit_generator(out: str | Path, steps: int = 1500, batch_size: int = 64, lr: float = 1e-3,
                                 dataset_size: int = 20000, seed: int = 0, log_every: int = 250, base: str = "tiny",
                                 color_noise: float = 0.0, ema_decay: float = 0.0) -> Path:
    """Widen the tiny image generator ``base`` (a ``model.path``: "tiny", or a directory made by
    ``mmrl build-tiny diffusion``) into an editing generator (:func:`widen_for_edits`), fine-tune it on
    synthetic edits at its size, save it to ``out``. The shipped one is
    ``pretrain_tiny_edit_generator(out, **TINY_EDIT_GENERATOR_RECIPE)``."""
    from .loading import generator_dir

    pipe = widen_for_edits(TinyFlowPipeline.from_pretrained(generator_dir(base)))
    size = pipe.default_height
    targets, sources, instructions = edit_dataset(dataset_size, seed, size, color_noise)
    torch.manual_seed(seed)
    fit_flow(pipe, targets, instructions, steps, batch_size, lr, seed, log_every, ema_decay, conditions=sources)
    recipe = {"steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed, "dataset_size": dataset_size,
              "base": base, "color_noise": color_noise, "ema_decay": ema_decay}
    info = {k: v for k, v in pipe.info.items() if k not in ("family", "height", "width", "guidance_scale")}
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler_config)
    return save_tiny(out, pipe.transformer, pipe.text_encoder, pipe.tokenizer, scheduler,
                     {**info, "pretrain": recipe, "base_pretrain": pipe.info.get("pretrain")})


def motion_dataset(size: int, seed: int, clip_size: int = CLIP_SIZE, num_frames: int = NUM_FRAMES,
                   direction_noise: float = 0.0) -> tuple[torch.Tensor, list[str]]:
    """``size`` clips of one moving shape as uint8 (N, F, 3, H, W) and their prompts (deterministic by seed)."""
    clips, prompts = [], []
    for i in range(size):
        ex = motion_example(np.random.default_rng([seed, i]), clip_size, num_frames, direction_noise)
        clips.append(torch.from_numpy(clip_array(ex["frames"])))
        prompts.append(ex["prompt"])
    return torch.stack(clips), prompts


# The shipped tiny video generator (assets/tiny-wan-motion): 4 frames of 16x16 pixels in 4-px patches
# (2-px patches cost 4x the tokens and drew no better clips in 3,000 steps), width 128, 3 blocks,
# x-prediction, EMA weights, the direction wrong in half the captions; ~9 minutes on 2 CPU cores.
TINY_VIDEO_GENERATOR_RECIPE: dict = {"steps": 2500, "heads": 4, "layers": 3, "patch_size": 4, "prediction": "sample",
                                     "ema_decay": 0.999, "direction_noise": 0.5}


def pretrain_tiny_video_generator(out: str | Path, steps: int = 1500, batch_size: int = 64, lr: float = 1e-3,
                                  dataset_size: int = 20000, seed: int = 0, log_every: int = 250, heads: int = 2,
                                  head_dim: int = 32, layers: int = 2, patch_size: int = 2, clip_size: int = CLIP_SIZE,
                                  num_frames: int = NUM_FRAMES, prediction: str = "sample",
                                  direction_noise: float = 0.0, ema_decay: float = 0.0,
                                  loss_space: str = "velocity") -> Path:
    """Build and pretrain a tiny Wan-architecture video generator on moving-shape clips; save it to
    ``out``. The shipped one is ``pretrain_tiny_video_generator(out, **TINY_VIDEO_GENERATOR_RECIPE)``."""
    models = new_tiny_video_models(seed, heads=heads, head_dim=head_dim, layers=layers, patch_size=patch_size)
    pipe = TinyWanPipeline(*models, {"prediction": prediction, "height": clip_size, "width": clip_size,
                                     "num_frames": num_frames})
    clips, prompts = motion_dataset(dataset_size, seed, clip_size, num_frames, direction_noise)
    fit_flow(pipe, clips, prompts, steps, batch_size, lr, seed, log_every, ema_decay, loss_space)
    recipe = {"steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed, "dataset_size": dataset_size,
              "heads": heads, "head_dim": head_dim, "layers": layers, "patch_size": patch_size,
              "direction_noise": direction_noise, "ema_decay": ema_decay, "loss_space": loss_space}
    return save_tiny_video(out, *models, {"prediction": prediction, "pretrain": recipe}, clip_size, num_frames)
