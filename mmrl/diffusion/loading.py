"""Where a generator comes from and where it goes: ``model.path`` resolved to a pipeline directory
(a hub id ``org/name`` to its cached snapshot, :mod:`mmrl.config.hub`) and loaded (:func:`load_generator`),
and a trained policy written back out as that directory with
its trained transformer (:func:`export_generator`, for ``mmrl export``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from .base import FlowPipeline

def generator_dir(path: str, revision: str | None = None) -> str:
    """``model.path`` as a directory: the shipped tiny generators' names resolved to their assets, a
    hub id (a diffusers pipeline) at ``revision`` to its snapshot in the Hugging Face cache."""
    from mmrl.config.hub import resolve_checkpoint
    from mmrl.config.tiny_models import tiny_checkpoints
    from .tiny import is_tiny_dir

    tiny = tiny_checkpoints("diffusion")  # the shipped tiny generators' model.path names
    if path not in tiny or revision:
        return str(resolve_checkpoint(path, revision, pipeline=True))
    from ..assets import asset_path

    name, command = tiny[path]
    path = str(asset_path(name))
    if not is_tiny_dir(path):
        raise FileNotFoundError(f"the tiny generator is missing from {path}; rebuild it with `{command}`")
    return path


def load_generator(path: str, device: torch.device, dtype: torch.dtype,
                   revision: str | None = None, options: dict | None = None) -> FlowPipeline:
    """``"tiny"`` (the shipped tiny image generator), ``"tiny-t2v"`` (the shipped tiny video
    generator), ``"tiny-i2v"`` (the same video generator given first frames), a directory made by
    ``mmrl build-tiny diffusion | video-gen``, or a local diffusers pipeline directory or hub id at
    ``revision`` (any family of :mod:`mmrl.diffusion.adapters`, given its ``options``:
    ``diffusion.pipeline_options``)."""
    from mmrl.config.tiny_models import tiny_conditioning
    from .tiny import TinyFlowPipeline, is_tiny_dir, tiny_family
    from .tiny_video import FAMILY as TINY_VIDEO_FAMILY, TinyWanPipeline

    conditioning = None if revision else tiny_conditioning(path)
    path = generator_dir(path, revision)
    if is_tiny_dir(path):
        if options:
            from ..config import ConfigError

            raise ConfigError(f"diffusion.pipeline_options={dict(options)}: the tiny generators take no options "
                              "(they are a diffusers family's own, e.g. Wan 2.2's guidance_scale_2)")
        cls = TinyWanPipeline if tiny_family(path) == TINY_VIDEO_FAMILY else TinyFlowPipeline
        pipe = cls.from_pretrained(path, device, dtype)
        if conditioning is not None:
            pipe.condition_on(conditioning)
        return pipe
    from .adapters import load_pipeline

    return load_pipeline(path, device, dtype, options)


def export_generator(policy, out: Path, adapters: bool = False) -> None:
    """The base pipeline directory (``model.path``) copied to ``out`` with the trained transformer
    in its ``transformer/`` (LoRA fused into the weights through diffusers' ``fuse_lora`` and the
    adapter layers removed): what :func:`load_generator`, and for a diffusers pipeline
    ``DiffusionPipeline.from_pretrained``, reads. Adapters alone are not exported for generators."""
    from ..config import ConfigError
    from .tiny import MARKER, is_tiny_dir

    if adapters:
        raise ConfigError("--adapters: generators are exported with the adapters merged (leave out --adapters)")
    base = Path(generator_dir(policy.cfg.model.path, policy.cfg.model.revision))
    shutil.copytree(base, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("transformer", "transformer_2"))
    transformer = policy.transformer
    if policy.lora:
        transformer.fuse_lora()
        transformer.unload_lora()
    transformer.save_pretrained(out / "transformer")
    if policy.pipe.conditioning is not None and is_tiny_dir(out):  # tiny-i2v: the export loads as image-to-video
        marker = out / MARKER
        marker.write_text(json.dumps({**json.loads(marker.read_text()), "conditioning": policy.pipe.conditioning},
                                     indent=2))
