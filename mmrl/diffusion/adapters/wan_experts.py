"""Wan 2.2 A14B's two noise-level experts as ONE trained module (``WanExperts``).

``WanPipeline`` with ``transformer_2`` and ``boundary_ratio`` denoises the timesteps
``t >= boundary_ratio * num_train_timesteps`` with ``transformer`` (the high-noise expert) and the rest with
``transformer_2`` (the low-noise one). The diffusion policy trains ONE module, ``pipe.transformer``: it adds
LoRA to it, disables its adapters for the reference, checkpoints it, saves and reloads it, fuses its LoRA
for export. ``WanExperts`` holds both experts (each keeps its own diffusers class and weights: the
pipeline's objects themselves) and does each of those calls for both, so the policy needs no change; its
``forward`` takes a Wan transformer's arguments and sends every sample to the expert of its timestep, so a
denoising step's output, log-prob and gradient come from the expert that step used.

On disk it is the pipeline's own layout: ``save_pretrained(dir)`` writes ``dir`` (the high-noise expert, as
diffusers writes a transformer) and its sibling ``dir_2`` (the low-noise one), so the policy's
``save_pretrained(out / "transformer")`` writes a Wan 2.2 pipeline directory's ``transformer/`` and
``transformer_2/``; ``wan_experts.json`` in ``dir`` keeps the boundary.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

EXPERTS_FILE = "wan_experts.json"


def _diffusers_class(name: str):
    import diffusers

    cls = getattr(diffusers, str(name), None)
    if cls is None:
        raise ValueError(f"{name!r} is not a diffusers model class (an expert's config.json _class_name)")
    return cls


def high_noise(timestep: Tensor, boundary_timestep: float) -> Tensor:
    """(B,) bool: the samples ``WanPipeline`` gives its high-noise expert (``t >= boundary``; a per-token timestep
    (B, tokens) counts by its largest, the noisy tokens' t)."""
    t = timestep if timestep.dim() == 1 else timestep.flatten(1).amax(dim=1)
    return t >= boundary_timestep


def sibling(path: str | Path) -> Path:
    """Where the low-noise expert of an expert pair saved at ``path`` lives: ``transformer`` ->
    ``transformer_2``, as in a Wan 2.2 pipeline directory."""
    path = Path(path)
    return path.with_name(path.name + "_2")


class WanExperts(torch.nn.Module):
    """``transformer`` (high noise, ``t >= boundary_timestep``) and ``transformer_2`` (low noise) behind one
    module (module docstring). ``boundary_timestep`` is in the scheduler's timestep units
    (``boundary_ratio * num_train_timesteps``)."""

    def __init__(self, transformer: torch.nn.Module, transformer_2: torch.nn.Module, boundary_timestep: float):
        super().__init__()
        self.transformer = transformer
        self.transformer_2 = transformer_2
        self.boundary_timestep = float(boundary_timestep)

    @property
    def experts(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        return self.transformer, self.transformer_2

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.dtype

    @property
    def device(self) -> torch.device:
        return self.transformer.device

    def forward(self, hidden_states: Tensor, timestep: Tensor, encoder_hidden_states: Tensor,
                return_dict: bool = True, **kwargs: Any):
        """A Wan transformer's call, each sample through the expert of its timestep (a batch on both sides of
        the boundary runs each expert on its own samples)."""
        high = high_noise(timestep, self.boundary_timestep)
        if bool(high.all()) or not bool(high.any()):
            expert = self.transformer if bool(high.all()) else self.transformer_2
            return expert(hidden_states=hidden_states, timestep=timestep, encoder_hidden_states=encoder_hidden_states,
                          return_dict=return_dict, **kwargs)
        batch = hidden_states.shape[0]

        def rows(value, keep):
            return value[keep] if isinstance(value, Tensor) and value.dim() and value.shape[0] == batch else value

        out = None
        for expert, keep in ((self.transformer, high), (self.transformer_2, ~high)):
            part = expert(hidden_states=hidden_states[keep], timestep=timestep[keep],
                          encoder_hidden_states=encoder_hidden_states[keep], return_dict=False,
                          **{k: rows(v, keep) for k, v in kwargs.items()})[0]
            if out is None:
                out = part.new_zeros((batch, *part.shape[1:]))
            out = out.index_put((keep.nonzero().flatten(),), part)
        if return_dict:
            from diffusers.models.modeling_outputs import Transformer2DModelOutput

            return Transformer2DModelOutput(sample=out)
        return (out,)

    # -- what the policy calls on its trained module, for both experts -----------------------------
    def add_adapter(self, adapter_config, adapter_name: str = "default") -> None:
        """LoRA on both experts (one config each: peft keeps a reference to it)."""
        self.transformer.add_adapter(adapter_config, adapter_name)
        self.transformer_2.add_adapter(copy.deepcopy(adapter_config), adapter_name)

    @property
    def peft_config(self) -> dict:
        """The experts' LoRA configs (the same for both), for peft's state-dict helpers."""
        return self.transformer.peft_config

    def disable_adapters(self) -> None:
        for expert in self.experts:
            expert.disable_adapters()

    def enable_adapters(self) -> None:
        for expert in self.experts:
            expert.enable_adapters()

    def fuse_lora(self, **kwargs) -> None:
        for expert in self.experts:
            expert.fuse_lora(**kwargs)

    def unload_lora(self) -> None:
        for expert in self.experts:
            expert.unload_lora()

    def enable_gradient_checkpointing(self, gradient_checkpointing_func=None) -> None:
        for expert in self.experts:
            expert.enable_gradient_checkpointing(gradient_checkpointing_func)

    def disable_gradient_checkpointing(self) -> None:
        for expert in self.experts:
            expert.disable_gradient_checkpointing()

    # -- construction and files ----------------------------------------------------------------------
    @property
    def config(self) -> dict:
        """What :meth:`from_config` rebuilds the pair from (both experts' diffusers configs, the boundary)."""
        return {"boundary_timestep": self.boundary_timestep,
                **{name: {**expert.config, "_class_name": type(expert).__name__}
                   for name, expert in (("transformer", self.transformer), ("transformer_2", self.transformer_2))}}

    @classmethod
    def from_config(cls, config: dict) -> "WanExperts":
        experts = []
        for name in ("transformer", "transformer_2"):
            expert_config = dict(config[name])
            experts.append(_diffusers_class(expert_config.pop("_class_name")).from_config(expert_config))
        return cls(*experts, config["boundary_timestep"])

    def save_pretrained(self, save_directory: str | Path, **kwargs) -> None:
        """``save_directory`` (high-noise expert + ``wan_experts.json``) and ``sibling(save_directory)``
        (low-noise expert), each in diffusers' own layout (module docstring)."""
        path = Path(save_directory)
        self.transformer.save_pretrained(path, **kwargs)
        self.transformer_2.save_pretrained(sibling(path), **kwargs)
        (path / EXPERTS_FILE).write_text(json.dumps({"boundary_timestep": self.boundary_timestep,
                                                     "low_noise_expert": sibling(path).name}, indent=2) + "\n")

    @classmethod
    def from_pretrained(cls, path: str | Path, torch_dtype: torch.dtype | None = None) -> "WanExperts":
        """What :meth:`save_pretrained` wrote at ``path``."""
        path = Path(path)
        info_file = path / EXPERTS_FILE
        if not info_file.is_file():
            raise FileNotFoundError(f"{info_file} is missing: {path} was not written by WanExperts.save_pretrained "
                                    "(a Wan 2.2 two-expert checkpoint keeps its boundary there)")
        info = json.loads(info_file.read_text())
        experts = []
        for folder in (path, path.parent / info["low_noise_expert"]):
            name = json.loads((folder / "config.json").read_text())["_class_name"]
            experts.append(_diffusers_class(name).from_pretrained(folder, torch_dtype=torch_dtype))
        return cls(*experts, info["boundary_timestep"])
