"""The vision-language policy: a transformers vision-language model whose actions are tokens
(Qwen-VL, Gemma 3, Idefics3 / SmolVLM, LLaVA-OneVision, InternVL, GLM-4.1V: what differs between
families is declared in :mod:`mmrl.vlm.families`).

On top of :class:`~mmrl.core.policy.PolicyBase` (precision, optimizer step, reference, checkpoints)
it supplies what is particular to a VLM, one concern per module:

- :mod:`mmrl.vlm.sampling`: ``rollout(examples, prompts, n, mode)`` samples ``n`` completions per
  prompt with the configured rollout engine (:mod:`mmrl.vlm.engines`) and returns a
  :class:`~mmrl.core.rollouts.Rollouts` whose payload keeps each sample's token ids and pixels so
  the same sequences can be re-scored; ``rollout_given`` turns given completions into samples by
  teacher forcing (off-policy guidance);
- :mod:`mmrl.vlm.scoring`: ``score`` and ``loss_terms``, per-micro-batch token log-probs and the
  core objective's loss on them;
- here: loading and setup (LoRA, a frozen vision tower, the shared image encodings),
  ``prepare_examples`` (the coordinate space and frame its box answers are in), the hooks the batch
  pipeline calls on the inputs this policy reads (``perturb`` an image, ``temporally_shuffled`` a
  clip's frames), and the full-weight checkpoint I/O.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Sequence

import torch

from mmrl.registry import ENGINES, register_policy

from ..core.library_internals import attention_implementation
from ..core.policy import PolicyBase
from ..core.seeding import seeded
from ..media.frame_order import shuffle_frames
from ..media.video import Clip
from .loading import load_vlm, resolve_model_path, vision_tower
from .logprobs import split_head
from .quantization import four_bit
from .sampling import VLMSampling
from .scoring import VLMScoring
from .shared_prefix import uses_shared_prefix
from .vision_once import share_image_encoding

__all__ = ["VLMPolicy", "load_vlm", "resolve_model_path", "vision_tower"]


@register_policy("vlm")
class VLMPolicy(VLMSampling, VLMScoring, PolicyBase):
    """A vision-language model trained with the core objective. See the module docstring."""

    capabilities = frozenset({"scoring", "teacher_forcing", "coordinates", "image_inputs", "video_inputs",
                              "multi_turn", "turn_cache", "fused_loss"})
    loss_inputs = frozenset({"logps", "whole_sequences"})
    unused_config = ("diffusion",)

    @classmethod
    def for_task(cls, cfg, task) -> VLMPolicy:
        """The policy for ``task``, first warning when ``model.path`` is a shipped tiny model
        that was never warm-started on the task (or on one of a mixture's tasks)."""
        from .tiny_tasks import registered_task_names, untrained_task_warning

        warning = untrained_task_warning(str(cfg.model.path), registered_task_names(task))
        if warning:
            logging.getLogger("mmrl").warning("warning: %s", warning)
        return cls(cfg)

    def __init__(self, cfg, device: torch.device | None = None):
        super().__init__(cfg, device)
        if cfg.train.use_liger_loss:  # Liger's fused head + GRPO loss (mmrl.vlm.liger): refused where inexact
            from .liger import check_liger

            check_liger(cfg, self.device)
        v = cfg.vlm
        self.four_bit = four_bit(cfg)  # a 4-bit base under the LoRA adapters (QLoRA), checked before loading
        # Full fine-tuning loads the weights in the dtype they are trained in (float32 master
        # weights, or bf16 under a bf16-weight train.optim); with LoRA the base is frozen, so it is
        # stored in the compute dtype (the adapters become the trained dtype in finish_setup).
        self.module, self.processor = load_vlm(cfg.model.path, self.device,
                                               self.compute_dtype if self.lora else self.trained_dtype,
                                               cfg.model.attn_implementation, v.min_pixels, v.max_pixels,
                                               v.image_processor_backend, v.video_min_pixels, v.video_max_pixels,
                                               revision=cfg.model.revision, four_bit=self.four_bit)
        self.module.config.use_cache = True
        self.tokenizer = self.processor.tokenizer
        eos = self.module.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) | {self.tokenizer.eos_token_id}
        self.eos_ids.discard(None)
        self.pad_id = self.tokenizer.pad_token_id
        # What differs between model families is declared once (mmrl.vlm.families).
        self.family = family = self.processor.family
        # Vision placeholder tokens are never sampled (see HFGenerate) and masked when scoring.
        self.suppressed_ids = list(self.processor.vision_token_ids)
        if v.freeze_vision:
            tower = vision_tower(self.module)
            if tower is None:
                raise ValueError("vlm.freeze_vision=true but no vision tower was found in this model")
            tower.requires_grad_(False).to(self.compute_dtype)
        if self.lora:
            self._apply_lora(cfg.model.lora)
        self.finish_setup()
        # Each distinct image through the vision tower once per forward (after finish_setup: the
        # reference copy gets its own); kept for the whole RL step when the tower cannot change.
        tower = vision_tower(self.module)
        frozen = tower is not None and not any(p.requires_grad for p in tower.parameters())
        self.image_encoders, self.video_encoders = (
            [e for m in (self.module, self.ref_module) if m is not None and family.vision_once_off is None
             if (e := share_image_encoding(m, cache=frozen, method=method,
                                           per_row=family.image_layout == "per_image")) is not None]
            for method in ("get_image_features", "get_video_features"))
        # each distinct prompt of a micro-batch through the language model once (exact)
        self.shared_prefix = uses_shared_prefix(cfg.train.shared_prefix, cfg.train.padding_free,
                                                split_head(self.module)[0], family.shared_prefix_off)
        _check_packing(cfg.train, family)
        attention = attention_implementation(self.module.config)
        if cfg.train.padding_free and not attention.startswith("flash"):
            logging.getLogger("mmrl").warning(
                "warning: train.padding_free=true with %s attention: the packed row's attention runs on a "
                "(length x length) mask, which costs more than the padding it saves (the tiny default's GRPO run "
                "took 4.9x as long on CPU); it pays with model.attn_implementation=flash_attention_2 on a GPU",
                attention or "the default")
        if cfg.rollout.engine != "hf" and family.processor != "qwen":
            from mmrl.config import ConfigError

            raise ConfigError(f"rollout.engine={cfg.rollout.engine}: only Qwen-VL checkpoints are wired to it; "
                              f"{family.name} rolls out with rollout.engine=hf")
        self.engine = ENGINES.get(cfg.rollout.engine, "rollout.engine")(self)
        if self.engine.concurrent:  # generates from its own weights: rollouts may run while a step trains
            self.capabilities = type(self).capabilities | {"async_rollouts"}

    @property
    def model(self) -> torch.nn.Module:
        """The trained transformers model (a peft model with LoRA)."""
        return self.module

    @property
    def max_actions(self) -> int:
        return int(self.cfg.rollout.max_completion_length)

    # -- coordinates ----------------------------------------------------------------------------
    @property
    def box_space(self) -> str:
        """The space this model writes boxes in: ``vlm.box_space`` if set, else its family's
        (Qwen2.5-VL: resized-image pixels; Qwen2-VL / Qwen3-VL: 0-1000), see mmrl.media.coords."""
        from ..media.coords import output_space

        return self.cfg.vlm.box_space or output_space(self.module.config.model_type)

    def coordinate_frame(self, image_size):
        """The :class:`~mmrl.media.coords.Frame` of an image of ``image_size`` (width, height)
        as this policy's image processor resizes it (Qwen-VL's budget; other families' spaces are
        relative to the original image, so the frame is its size)."""
        from ..media.coords import Frame, qwen_frame

        if self.family.image_layout != "grid":
            return Frame(float(image_size[0]), float(image_size[1]))
        return qwen_frame(image_size, self.processor.image_processor)

    def prepare_examples(self, examples: Sequence[dict]) -> list[dict]:
        """Copies of ``examples`` that say how to read this policy's coordinates: ``pred_space``
        (the space its box answers are in) and ``frame`` (the image's original and resized sizes),
        so box rewards and metrics compare in original pixels
        (``mmrl.media.coords.prediction_to_pixels``). Examples without ``image_size`` unchanged."""
        from ..media.coords import UNDECLARED, declares_space

        # a family without a declared frame: recorded, and refused by the first box read (coords)
        space = self.box_space if self.cfg.vlm.box_space or declares_space(self.module.config.model_type) \
            else f"{UNDECLARED}:{self.module.config.model_type}"
        out = []
        for ex in examples:
            if isinstance(ex, dict) and ex.get("image_size") is not None:
                ex = {**ex, "pred_space": space, "frame": self.coordinate_frame(ex["image_size"])}
            out.append(ex)
        return out

    # -- setup ----------------------------------------------------------------------------------
    def _apply_lora(self, lora_cfg) -> None:
        from peft import LoraConfig, get_peft_model

        tower = vision_tower(self.module)
        tower_prefix = next((n for n, m in self.module.named_modules() if m is tower), None)
        targets = [
            name for name, module in self.module.named_modules()
            if isinstance(module, torch.nn.Linear)
            and name.split(".")[-1] in set(lora_cfg.target_modules or self.family.lora_targets)
            and not (tower_prefix and name.startswith(tower_prefix + "."))
        ]
        if not targets:
            raise ValueError(f"model.lora.target_modules={lora_cfg.target_modules} matched no Linear layer")
        config = LoraConfig(r=lora_cfg.r, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout,
                            target_modules=targets)
        with seeded(self.cfg.train.seed):  # the adapters' initial weights: the same on every rank and run
            self.module = get_peft_model(self.module, config)

    def adapters_disabled(self):
        return self.module.disable_adapter()

    def enable_gradient_checkpointing(self, options: dict) -> None:
        """transformers' activation checkpointing of every layer it marks (the language model's decoder
        layers and the vision tower's blocks); it runs only in training mode under autograd, so
        rollouts and no-grad scoring are unchanged. The shared prefix keeps its cache through it."""
        if options.get("use_reentrant") and self.cfg.train.shared_prefix is not False:
            from mmrl.config import ConfigError

            raise ConfigError("train.gradient_checkpointing_kwargs.use_reentrant=true: a reentrant checkpoint runs "
                              "the layers without autograd, so the shared prompt's keys/values would carry no "
                              "gradient; set train.shared_prefix=false or use_reentrant=false")
        model = self.module.get_base_model() if self.lora else self.module
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.25
        if enable is not None:
            enable(activation_checkpointing_kwargs=options)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)

    def after_optimizer_step(self) -> None:
        """The engine's copy of the weights is stale; asynchronous training publishes them itself
        between steps (:meth:`publish_weights`), so the generator thread never reads a step's half."""
        if "async_rollouts" not in self.capabilities or not self.cfg.train.async_rollouts:
            self.engine.sync_weights()

    def check_shardable(self, backend: str) -> None:
        super().check_shardable(backend)
        if self.four_bit is not None:
            raise NotImplementedError(f"{backend} with model.load_in_4bit=true is not supported (bitsandbytes' "
                                      "4-bit weights have not been sharded or partitioned): run it in one process")
        if self.cfg.rollout.engine != "hf":
            raise NotImplementedError(f"{backend} with rollout.engine={self.cfg.rollout.engine} is not supported yet "
                                      "(the engine's weight sync reads whole weights): use rollout.engine=hf or DDP")

    def begin_step(self, step: int) -> None:
        """A new RL step: forget the image and clip features kept for the last one."""
        super().begin_step(step)
        for encoder in (*self.image_encoders, *self.video_encoders):
            encoder.clear()

    # -- hooks the batch pipeline calls -------------------------------------------------------
    def perturb(self, ex: dict, kind: str, rng, other: dict | None = None, options: dict | None = None) -> dict:
        """``ex`` with the registered image perturbation ``kind`` ("Vision Matters") applied to its
        ``image`` and boxes (:func:`mmrl.media.perturb.perturb_example`); ``other`` is another
        training example, whose image is the distractor / mixup partner; ``options``
        ``data.perturbation_kwargs``. An example without an image comes back unchanged."""
        from ..media.perturb import perturb_example

        partner = other.get("image") if isinstance(other, dict) else None
        return perturb_example(ex, kind, rng, partner, **dict(options or {}))

    def temporally_shuffled(self, ex: dict, rng) -> dict | None:
        """T-GRPO's twin of ``ex``: its clip (``ex["video"]``) with the frames in a shuffled order,
        never the original one (:func:`mmrl.media.frame_order.shuffle_frames`, drawn from ``rng``);
        None when ``ex`` holds no clip of two frames or more (an image question)."""
        clip = ex.get("video") if isinstance(ex, dict) else None
        if not isinstance(clip, Clip) or clip.frames is None or len(clip.frames) < 2:
            return None
        return {**ex, "video": dataclasses.replace(clip, frames=shuffle_frames(clip.frames, rng))}

    # -- persistence ----------------------------------------------------------------------------
    def save_weights(self, path: Path, state: dict[str, torch.Tensor] | None = None) -> None:
        """An ordinary checkpoint directory ``path/model`` (weights and processor): loadable as
        ``model.path`` (the trained weights in their own dtype, float32 master weights or bf16, so a
        resumed run continues exactly)."""
        self.module.save_pretrained(Path(path) / "model", state_dict=state, safe_serialization=True)
        self.processor.save_pretrained(Path(path) / "model")

    export_library = "transformers"

    def export_pretrained(self, out: Path, adapters: bool = False) -> None:
        """A directory ``from_pretrained`` reads, with the processor: the LoRA adapters merged into
        the weights (peft's ``merge_and_unload``), or with ``adapters`` the adapters alone (peft's
        format, loaded onto ``model.path``); weights in the dtype they were trained in. Over a 4-bit
        base the adapters are merged into the dequantized base, an unquantized model in ``model.dtype``
        that computes what the trained one did (:mod:`mmrl.vlm.quantization`)."""
        module = self.module
        if self.four_bit is not None and not adapters:
            from transformers import AutoModelForImageTextToText

            from .lora_merge import merged_lora_weights

            module = AutoModelForImageTextToText.from_pretrained(
                str(resolve_model_path(self.cfg.model.path, self.cfg.model.revision)), dtype=self.compute_dtype)
            module.load_state_dict(dict(merged_lora_weights(self.module)))
        elif self.lora and not adapters:
            module = module.merge_and_unload()
        module.save_pretrained(out, safe_serialization=True)
        self.processor.save_pretrained(out)

    def load_weights(self, path: Path) -> None:
        """Restore through transformers' own loader, which knows the key layout it wrote."""
        from transformers import AutoModelForImageTextToText

        saved = AutoModelForImageTextToText.from_pretrained(str(Path(path) / "model"), dtype=torch.float32)
        self.load_module_state(saved.state_dict())
        del saved


def _check_packing(train, family) -> None:
    """``train.padding_free`` / ``train.micro_batch_tokens`` combinations that cannot be honoured."""
    from mmrl.config import ConfigError

    if train.padding_free and family.packing_off:
        raise ConfigError(f"train.padding_free=true: not for {family.name} ({family.packing_off}); "
                          "set train.padding_free=false")
    if train.padding_free and train.shared_prefix:
        raise ConfigError("train.padding_free=true with train.shared_prefix=true: each shares work differently "
                          "(packed rows vs one prompt pass per group); set one of them to false")
    if train.micro_batch_tokens and not train.padding_free:
        raise ConfigError(f"train.micro_batch_tokens={train.micro_batch_tokens}: read only with "
                          "train.padding_free=true (padded micro-batches are sized by train.micro_batch_size); "
                          "set train.padding_free=true or remove the key")
    if train.micro_batch_tokens < 0:
        raise ConfigError(f"train.micro_batch_tokens={train.micro_batch_tokens}: expected 0 (off) or a positive "
                          "number of tokens")
