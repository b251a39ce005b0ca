"""A tiny editing generator built locally (issue 56 item 2): mmrl's tiny image generator architecture,
small and random, widened for edits the way ``mmrl build-tiny edit`` widens the shipped one
(:func:`mmrl.diffusion.pretrain.widen_for_edits`: the source image on 3 more input channels)."""

from __future__ import annotations

from pathlib import Path

from mmrl.diffusion.pretrain import widen_for_edits
from mmrl.diffusion.tiny import TinyFlowPipeline, new_tiny_models, save_tiny


def tiny_base(seed: int = 0) -> TinyFlowPipeline:
    """A random text-to-image tiny generator: width 32, one layer, 16x16 pixels in 2-px patches, x-prediction."""
    models = new_tiny_models(seed=seed, width=32, layers=1, image_size=16, patch_size=2)
    return TinyFlowPipeline(*models, {"prediction": "sample", "height": 16, "width": 16})


def build_tiny_edit(path, seed: int = 0, randomize_source: bool = True) -> Path:
    """A tiny editing generator directory (``conditioning: image``). ``randomize_source``: the source
    channels' patch weights random instead of zero, so the source image changes the velocity."""
    import torch

    pipe = widen_for_edits(tiny_base(seed))
    if randomize_source:
        with torch.no_grad():
            weight = pipe.transformer.pos_embed.proj.weight
            weight[:, 3:] = torch.randn(weight[:, 3:].shape, generator=torch.Generator().manual_seed(seed)) * 0.05
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler_config)
    info = {k: v for k, v in pipe.info.items() if k not in ("height", "width")}
    return save_tiny(Path(path), pipe.transformer, pipe.text_encoder, pipe.tokenizer, scheduler, info)
