"""Adapters from diffusers pipelines (SD3 / SD3.5, FLUX.1, Wan 2.1) to the :class:`FlowPipeline` contract.

``load_pipeline(path, device, dtype)`` reads a LOCAL diffusers pipeline directory (its
``model_index.json``), loads the pipeline with diffusers and wraps its components. Nothing is ever
downloaded. The adapters do not call the pipeline's ``__call__``: they reproduce, piece by piece,
what its denoising loop does (prompt encoding, latent (un)packing, timestep scaling, classifier-free
guidance, the scheduler's sigma schedule, VAE decoding), so that a deterministic Euler loop
``x = x + (sigma_next - sigma) * velocity(x, sigma, prompts, g)`` over ``sigmas(num_steps, shape)``
followed by ``decode`` gives the pipeline's own output (the tests check this against diffusers).

One model family per module of this package: every :class:`DiffusersAdapter` subclass a module defines
with its own ``pipeline_class_name`` is registered under that name when the package is imported (so a
new family is one new file). Other code registers more generators in
:data:`mmrl.registry.GENERATOR_FAMILIES` (``model_index.json`` ``_class_name`` ->
``loader(path, device, dtype) -> FlowPipeline``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
from pathlib import Path
from typing import Callable

import torch

from ..base import FlowPipeline
from mmrl.registry import GENERATOR_FAMILIES

from .diffusers_base import DiffusersAdapter, as_dtype
from .flux import FluxAdapter
from .sd3 import SD3Adapter
from .wan import WanAdapter

Loader = Callable[[str, "torch.device | str", torch.dtype], FlowPipeline]



def _register_families() -> None:
    """Every family module's adapters under their ``pipeline_class_name`` (module docstring)."""
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name == "diffusers_base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, DiffusersAdapter) and value.__module__ == module.__name__
                    and value.__dict__.get("pipeline_class_name")):
                GENERATOR_FAMILIES.register(value.pipeline_class_name, value.from_pretrained)


_register_families()

__all__ = ["DiffusersAdapter", "FluxAdapter", "SD3Adapter", "WanAdapter", "load_pipeline"]


def load_pipeline(path: str, device="cpu", dtype=torch.float32, options: dict | None = None) -> FlowPipeline:
    """The adapter for the local diffusers pipeline directory ``path``, on ``device`` in ``dtype``,
    constructed with the family's own ``options`` (``diffusion.pipeline_options``; checked against
    the adapter's arguments before anything loads)."""
    root = Path(path).expanduser()
    index = root / "model_index.json"
    if not index.is_file() and (root / "config.json").is_file() and (root / "tokenizer_config.json").is_file():
        raise ValueError(f"diffusion model path {str(path)!r} is a transformers checkpoint (a vision-language "
                         f"model?), not a generator: train it with `mmrl train vlm model.path={path}`")
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
    loader = GENERATOR_FAMILIES.get(class_name) if class_name in GENERATOR_FAMILIES else None
    if loader is None:
        raise ValueError(
            f"unsupported diffusers pipeline class {class_name!r} in {index}; supported: {', '.join(GENERATOR_FAMILIES.names())}"
        )
    options = dict(options or {})
    _check_options(loader, class_name, options)
    return loader(str(root), device, as_dtype(dtype), **options)


def _check_options(loader: Loader, class_name: str, options: dict) -> None:
    """Unknown ``diffusion.pipeline_options`` name the family's valid ones (an adapter's
    ``from_pretrained`` passes them to its constructor)."""
    adapter = getattr(loader, "__self__", None)
    if not options or not isinstance(adapter, type):
        return
    accepted = [name for name, param in inspect.signature(adapter.__init__).parameters.items()
                if name not in ("self", "pipe", "device") and param.kind is not param.VAR_KEYWORD]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"diffusion.pipeline_options: {class_name} ({adapter.__name__}) takes no {unknown}; "
                         f"its options: {accepted or 'none'}")
