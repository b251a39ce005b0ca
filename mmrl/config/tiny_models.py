"""The shipped tiny models (``assets/``): which ``model.path`` names load each, and how ``mmrl build-tiny NAME``
rebuilds it. One row of :data:`mmrl.registry.TINY_MODELS` per model, the builder and its default recipe named
rather than imported, so the table costs nothing until a model is built; the policies' loaders read the
names from here (:func:`tiny_checkpoints`), the build command the builders."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from mmrl.registry import TINY_MODELS


@dataclass(frozen=True)
class TinyModel:
    asset: str  # its directory under assets/
    builder: str  # "module:function", called as function(out, seed=..., **recipe)
    recipe: str  # "module:NAME" of its default recipe, a dict of the builder's keyword arguments
    steps_key: str  # the recipe's key that ``--steps`` sets
    what: str  # how messages name it
    about: str = ""  # for the command's help
    modality: str = "vlm"  # the policy that loads it: "vlm" or "diffusion"
    paths: tuple[str, ...] = ()  # the model.path names that load it
    # model.path names that load it with a conditioning on (its first frames given: image-to-video)
    conditioned: tuple[tuple[str, str], ...] = ()

    def build(self, out: Path | None, seed: int, steps: int | None = None,
              vision_steps: int | None = None) -> Path:
        """Build the model into ``out`` (default: the shipped asset); ``steps`` / ``vision_steps``
        replace the recipe's (``vision_steps`` only where the recipe pre-trains a vision tower)."""
        from mmrl.assets import asset_path

        recipe = dict(_named(self.recipe))
        if steps:
            recipe[self.steps_key] = steps
        if vision_steps is not None and "vision_steps" in recipe:
            recipe["vision_steps"] = vision_steps
        return _named(self.builder)(out or asset_path(self.asset), seed=seed, **recipe)


def tiny_checkpoints(modality: str) -> dict[str, tuple[str, str]]:
    """``model.path`` name -> (asset directory, the command that rebuilds it), for ``modality``'s policy."""
    return {path: (model.asset, f"mmrl build-tiny {name}") for name, model in TINY_MODELS.items()
            if model.modality == modality for path in model.paths}


def tiny_conditioning(path: str) -> str | None:
    """The conditioning a shipped tiny model's ``model.path`` name turns on (``"tiny-i2v"``: the tiny
    video generator given first frames, no asset of its own), or None."""
    return next((c for _, model in TINY_MODELS.items() for name, c in model.conditioned if name == path), None)


def _named(ref: str):
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


for _name, _model in {
    "vlm": TinyModel("tiny-qwen2.5-vl", "mmrl.vlm.tiny_builders:build_tiny_vlm", "mmrl.vlm.tiny_builders:TINY_VLM_RECIPE",
                     "sft_steps", "tiny model", "the tiny default", paths=("tiny",)),
    "video": TinyModel("tiny-qwen2.5-vl-video", "mmrl.vlm.tiny_builders:build_tiny_video", "mmrl.vlm.tiny_builders:TINY_VIDEO_RECIPE",
                       "sft_steps", "tiny video model", "the tiny VLM warm-started on clips", paths=("tiny-video",)),
    "gui": TinyModel("tiny-qwen2.5-vl-gui", "mmrl.vlm.tiny_builders:build_tiny_gui", "mmrl.vlm.tiny_builders:TINY_GUI_RECIPE",
                     "sft_steps", "tiny GUI model", "the tiny VLM warm-started on the synthetic phone",
                     paths=("tiny-gui",)),
    "gui-grounding": TinyModel("tiny-qwen2.5-vl-gui-grounding", "mmrl.vlm.tiny_builders:build_tiny_gui_grounding",
                               "mmrl.vlm.tiny_builders:TINY_GUI_GROUNDING_RECIPE", "sft_steps", "tiny GUI grounding model",
                               "the tiny GUI model taught more clicks", paths=("tiny-gui-grounding",)),
    "zoom": TinyModel("tiny-qwen2.5-vl-zoom", "mmrl.tools.tiny_zoom:build_tiny_zoom", "mmrl.tools.tiny_zoom:TINY_ZOOM_RECIPE",
                      "sft_steps", "tiny zoom model", "the tiny VLM warm-started to zoom on a named cell",
                      paths=("tiny-zoom",)),
    "diffusion": TinyModel("tiny-flow-shapes", "mmrl.diffusion.pretrain:pretrain_tiny_generator",
                           "mmrl.diffusion.pretrain:TINY_GENERATOR_RECIPE", "steps", "tiny generator",
                           "the tiny text-to-image generator", modality="diffusion", paths=("tiny",)),
    "video-gen": TinyModel("tiny-wan-motion", "mmrl.diffusion.pretrain:pretrain_tiny_video_generator",
                           "mmrl.diffusion.pretrain:TINY_VIDEO_GENERATOR_RECIPE", "steps", "tiny video generator",
                           "the tiny text-to-video generator (tiny-i2v: given first frames)",
                           modality="diffusion", paths=("tiny-t2v", "tiny-i2v"),
                           conditioned=(("tiny-i2v", "first_frame"),)),
    "edit": TinyModel("tiny-flow-edit", "mmrl.diffusion.pretrain:pretrain_tiny_edit_generator",
                      "mmrl.diffusion.pretrain:TINY_EDIT_GENERATOR_RECIPE", "steps", "tiny editing generator",
                      "the tiny image generator widened to edit shape scenes", modality="diffusion",
                      paths=("tiny-edit",)),
}.items():
    TINY_MODELS.register(_name, _model)
