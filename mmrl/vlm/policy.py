"""The vision-language policy: a transformers Qwen-VL-family model whose actions are tokens.

On top of :class:`~mmrl.core.policy.PolicyBase` (precision, optimizer step, reference, checkpoints)
it supplies what is particular to a VLM:

- ``rollout(examples, prompts, n, mode)`` samples ``n`` completions per prompt with the configured
  rollout engine (:mod:`mmrl.vlm.engines`) and returns a :class:`~mmrl.core.rollouts.Rollouts`
  whose payload keeps each sample's token ids and pixels so the same sequences can be re-scored;
- ``loss_terms`` computes per-micro-batch token log-probs and the core objective's loss on them;
- ``rollout_given`` turns given completions into samples by teacher forcing (off-policy guidance);
- ``prepare_examples`` records the coordinate space and frame its box answers are in.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Sequence

import torch

from mmrl.registry import ENGINES

from ..core import distributed as dist
from ..core.losses import TokenSelection, select_tokens
from ..core.policy import PolicyBase
from ..core.rollouts import Rollouts
from ..core.seeding import seeded
from .engines import Sampling
from .loading import VLM_LORA_TARGETS, load_vlm, resolve_model_path, vision_tower
from .logprobs import split_head, token_logprobs
from .processing import join_videos, split_patches, split_videos
from .shared_prefix import check_supported, prompt_groups, shared_prefix_hidden
from .vision_once import share_image_encoding

__all__ = ["VLMPolicy", "load_vlm", "resolve_model_path", "vision_tower"]

# "video": a sample's video inputs (processing.split_videos), None without video.
PAYLOAD_KEYS = ("prompt_ids", "completion_ids", "pixel_values", "image_grid_thw", "video")


class VLMPolicy(PolicyBase):
    """A Qwen-VL-family model trained with the core objective. See the module docstring."""

    capabilities = frozenset({"scoring", "teacher_forcing", "coordinates", "image_inputs", "video_inputs",
                              "multi_turn"})
    loss_inputs = frozenset({"logps", "whole_sequences"})
    unused_config = ("diffusion",)

    def __init__(self, cfg, device: torch.device | None = None):
        super().__init__(cfg, device)
        v = cfg.vlm
        # Full fine-tuning keeps float32 master weights; with LoRA the base is frozen, so it is
        # stored in the compute dtype (the adapters become float32 in finish_setup).
        self.module, self.processor = load_vlm(cfg.model.path, self.device,
                                               self.compute_dtype if self.lora else torch.float32,
                                               cfg.model.attn_implementation, v.min_pixels, v.max_pixels,
                                               v.image_processor_backend, v.video_min_pixels, v.video_max_pixels)
        self.module.config.use_cache = True
        self.tokenizer = self.processor.tokenizer
        eos = self.module.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) | {self.tokenizer.eos_token_id}
        self.eos_ids.discard(None)
        self.pad_id = self.tokenizer.pad_token_id
        # Vision placeholder tokens are never sampled (see HFGenerate) and masked when scoring.
        self.suppressed_ids = sorted({
            i for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
            if (i := self.tokenizer.convert_tokens_to_ids(t)) is not None and i != self.tokenizer.unk_token_id
        })
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
            [e for m in (self.module, self.ref_module) if m is not None
             if (e := share_image_encoding(m, cache=frozen, method=method)) is not None]
            for method in ("get_image_features", "get_video_features"))
        if cfg.train.shared_prefix:
            check_supported(split_head(self.module)[0])
        self.engine = ENGINES.get(cfg.rollout.engine, "rollout.engine")(self)

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
        as this policy's image processor resizes it."""
        from ..media.coords import qwen_frame

        return qwen_frame(image_size, self.processor.image_processor)

    def prepare_examples(self, examples: Sequence[dict]) -> list[dict]:
        """Copies of ``examples`` that say how to read this policy's coordinates: ``pred_space``
        (the space its box answers are in) and ``frame`` (the image's original and resized sizes),
        so box rewards and metrics compare in original pixels
        (``mmrl.media.coords.prediction_to_pixels``). Examples without ``image_size`` unchanged."""
        out = []
        for ex in examples:
            if isinstance(ex, dict) and ex.get("image_size") is not None:
                ex = {**ex, "pred_space": self.box_space, "frame": self.coordinate_frame(ex["image_size"])}
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
            and name.split(".")[-1] in set(lora_cfg.target_modules or VLM_LORA_TARGETS)
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

    def after_optimizer_step(self) -> None:
        self.engine.sync_weights()

    def check_shardable(self) -> None:
        super().check_shardable()
        if self.cfg.rollout.engine != "hf":
            raise NotImplementedError(f"FSDP2 with rollout.engine={self.cfg.rollout.engine} is not supported yet "
                                      "(the engine reads whole weights): use rollout.engine=hf or DDP")

    def begin_step(self, step: int) -> None:
        """A new RL step: forget the image and clip features kept for the last one."""
        super().begin_step(step)
        for encoder in (*self.image_encoders, *self.video_encoders):
            encoder.clear()

    # -- encoding -------------------------------------------------------------------------------
    @staticmethod
    def split_messages(messages: list[dict]) -> tuple[list[dict], list[Any], list[Any]]:
        """Images and videos out of the chat messages (the template sees placeholders, the
        processor pixels): ``(messages, images, videos)``, videos as
        :class:`~mmrl.media.video.Clip`."""
        images, videos, clean = [], [], []
        for msg in messages:
            content = msg["content"]
            if isinstance(content, list):
                items = []
                for item in content:
                    if item.get("type") == "video" or "video" in item:
                        videos.append(item["video"])
                        items.append({"type": "video"})
                    elif item.get("type") == "image" or "image" in item:
                        images.append(item["image"])
                        items.append({"type": "image"})
                    else:
                        items.append(item)
                clean.append({**msg, "content": items})
            else:
                clean.append(msg)
        return clean, images, videos

    def encode_prompts(self, prompts: Sequence[list[dict]]) -> tuple[dict[str, torch.Tensor], list[int]]:
        """Model inputs for a batch of chat prompts, and how many images each prompt has (a
        sample's videos are found by :func:`~mmrl.vlm.processing.split_videos`)."""
        texts, images, videos = [], [], []
        for messages in prompts:
            clean, imgs, clips = self.split_messages(messages)
            texts.append(self.processor.apply_chat_template(clean))
            images.append([im.convert("RGB") for im in imgs])
            videos.append(clips)
        enc = self.processor(texts, images if any(images) else None, videos if any(videos) else None)
        return enc, [len(x) for x in images]

    def split_videos(self, enc: dict) -> list[dict | None]:
        """Each sample's video inputs in a batch encoding (None without video)."""
        return split_videos(enc, self.processor.video_token_id, self.processor.merge_size)

    def decode(self, ids: torch.Tensor) -> str:
        return self.processor.decode(ids.tolist())

    # -- sampling -------------------------------------------------------------------------------
    def sampling(self, mode: str) -> Sampling:
        """The training rollout's settings (``rollout.*``; modes "train" and "sample"), or for
        ``mode="eval"`` the same budget at ``eval.temperature``."""
        r = self.cfg.rollout
        temperature = self.cfg.eval.temperature if mode == "eval" else r.temperature
        return Sampling(temperature, r.top_p, r.top_k, r.max_completion_length, max(0, r.batch_size))

    def _batch(self, samples: list[dict], examples: list[dict], group_ids: torch.Tensor,
               off_policy: torch.Tensor | None, need_old_logps: bool, need_ref_logps: bool) -> Rollouts:
        """A :class:`Rollouts` of engine-style sample dicts, with the log-probs asked for."""
        lengths = [len(s["completion_ids"]) for s in samples]
        mask = torch.zeros(len(samples), max(lengths, default=0))
        for i, L in enumerate(lengths):
            mask[i, :L] = 1.0
        batch = Rollouts(
            group_ids=group_ids,
            action_mask=mask,
            completions=[self.decode(s["completion_ids"]) for s in samples],
            examples=examples,
            truncated=torch.tensor([s["truncated"] for s in samples], dtype=torch.bool),
            off_policy=off_policy,
            payload={k: [s[k] for s in samples] for k in PAYLOAD_KEYS},
        )
        if samples and all(s.get("logprobs") is not None for s in samples):
            # The engine reported its own sampling log-probs (vLLM): either they are the old
            # log-probs (rollout.use_engine_logprobs), or the trainer's forward gives the old
            # log-probs and the objective corrects for the mismatch (truncated IS).
            engine = torch.zeros_like(mask)
            for i, s in enumerate(samples):
                engine[i, :len(s["logprobs"])] = torch.as_tensor(s["logprobs"], dtype=engine.dtype)
            if self.cfg.rollout.use_engine_logprobs:
                batch.old_logps = engine
                need_old_logps = False
            else:
                batch.rollout_logps = engine
                need_old_logps = need_old_logps or self.cfg.algo.vllm_importance_sampling_correction
        empty = torch.zeros(0, 0)
        if need_old_logps:
            batch.old_logps = self.score(batch, reference=False) if samples else empty
        if need_ref_logps:
            batch.ref_logps = self.score(batch, reference=True) if samples else empty
        return batch

    def take_generation_timeouts(self) -> int:
        return self.engine.take_timeouts()

    def rollout(self, examples: Sequence[dict], prompts: Sequence[list[dict]], n: int, mode: str = "train",
                need_old_logps: bool = False, need_ref_logps: bool = False) -> Rollouts:
        """``n`` samples for each prompt; group i holds the samples of ``prompts[i]``."""
        samples = self.engine.generate([p for p in prompts for _ in range(n)], self.sampling(mode))
        return self._batch(samples, [ex for ex in examples for _ in range(n)],
                           torch.arange(len(prompts)).repeat_interleave(n), None, need_old_logps, need_ref_logps)

    def _end_of_turn_id(self) -> int:
        """The stop token a real completion ends with: ``<|im_end|>`` for Qwen chat models (the
        chat template closes every assistant turn with it), else the tokenizer's EOS, else the
        first of the generation config's EOS ids."""
        im_end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if im_end in self.eos_ids:
            return int(im_end)
        if self.tokenizer.eos_token_id in self.eos_ids:
            return int(self.tokenizer.eos_token_id)
        return int(sorted(self.eos_ids)[0])

    def rollout_given(self, examples: Sequence[dict], prompts: Sequence[list[dict]], completions: Sequence[str],
                      need_old_logps: bool, need_ref_logps: bool) -> Rollouts:
        """One sample per ``(example, prompt, completion)`` by teacher forcing, not generation:
        the off-policy samples of "TempSamp-R1: Effective Temporal Sampling with Reinforcement
        Fine-Tuning for Video LLMs" (e.g. ground-truth solutions injected into the groups).

        Prompts are encoded as ``generate`` does; a completion is its text tokenized without
        special tokens plus the end-of-turn id a real completion stops with. Longer than
        ``rollout.max_completion_length`` it is cut there (no stop token, ``truncated``).
        ``group_ids = arange(len(prompts))``, ``off_policy`` is all True and ``completions`` are
        the decoded ids (what the rewards see, as for generated samples). The payload has the
        keys of :meth:`rollout`, so the batch can be scored, concatenated and trained on.
        """
        if not len(examples) == len(prompts) == len(completions):
            raise ValueError(f"rollout_given: {len(examples)} examples, {len(prompts)} prompts and "
                             f"{len(completions)} completions; one of each per sample")
        max_len = self.cfg.rollout.max_completion_length
        stop = self._end_of_turn_id()
        bs = self.cfg.rollout.batch_size if self.cfg.rollout.batch_size > 0 else max(1, len(prompts))
        samples: list[dict] = []
        for start in range(0, len(prompts), bs):
            chunk = prompts[start:start + bs]
            enc, images_per_sample = self.encode_prompts(chunk)
            patches = split_patches(enc, images_per_sample)
            videos = self.split_videos(enc)
            for i in range(len(chunk)):
                text_ids = self.tokenizer(completions[start + i], add_special_tokens=False)["input_ids"]
                if any(tok in self.suppressed_ids for tok in text_ids):
                    raise ValueError(f"rollout_given: completion {start + i} contains a vision placeholder "
                                     "token (<|image_pad|>, <|vision_start|>, ...), which is never sampled "
                                     "and cannot be scored")
                ids = list(text_ids) + [stop]
                samples.append({
                    "prompt_ids": enc["input_ids"][i][enc["attention_mask"][i].bool()],
                    "completion_ids": torch.tensor(ids[:max_len], dtype=torch.long),
                    "truncated": len(ids) > max_len,
                    "pixel_values": patches[i][0],
                    "image_grid_thw": patches[i][1],
                    "video": videos[i],
                })
        return self._batch(samples, list(examples), torch.arange(len(prompts)),
                           torch.ones(len(samples), dtype=torch.bool), need_old_logps, need_ref_logps)

    # -- scoring ----------------------------------------------------------------------------------
    def _collate(self, batch: Rollouts) -> tuple[dict[str, torch.Tensor], torch.Tensor, int]:
        """Prompt left-padded to a common width P, completion right-padded after it.

        Completion token t of every sample then sits at column P + t, so its logit is at P + t - 1.
        """
        prompts = batch.payload["prompt_ids"]
        comps = batch.payload["completion_ids"]
        P = max(len(p) for p in prompts)
        T = batch.action_mask.shape[1]
        ids = torch.full((len(batch), P + T), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(batch), P + T), dtype=torch.long)
        for i, (p, c) in enumerate(zip(prompts, comps)):
            ids[i, P - len(p):P] = p
            attn[i, P - len(p):P] = 1
            ids[i, P:P + len(c)] = c
            attn[i, P:P + len(c)] = 1
        inputs = {"input_ids": ids, "attention_mask": attn, "mm_token_type_ids": self.processor.token_types(ids)}
        pv = [x for x in batch.payload["pixel_values"] if x is not None]
        if pv:
            inputs["pixel_values"] = torch.cat(pv)
            inputs["image_grid_thw"] = torch.cat([g for g in batch.payload["image_grid_thw"] if g is not None])
        inputs.update(join_videos(batch.payload.get("video") or []))
        targets = torch.full((len(batch), T), self.pad_id, dtype=torch.long)
        for i, c in enumerate(comps):
            targets[i, :len(c)] = c
        return {k: v.to(self.device) for k, v in inputs.items()}, targets.to(self.device), P

    def completion_logps(self, model, batch: Rollouts, with_entropy: bool = False):
        """Per-token log-probs (N, T) of the completions under ``model`` (temperature-scaled);
        with ``with_entropy`` also the per-token entropy of the full next-token distribution.
        The LM head runs chunk by chunk (:mod:`mmrl.vlm.logprobs`): no (N, T, V) float32 copy.
        With ``train.shared_prefix`` each distinct prompt of the batch runs once and its samples'
        completions attend to its cached keys/values (:mod:`mmrl.vlm.shared_prefix`, exact).
        Call it under :meth:`autocast` (``train_step`` and :meth:`score` do)."""
        inputs, targets, P = self._collate(batch)
        T = targets.shape[1]
        backbone, head = split_head(model)
        payload = batch.payload
        has_video = any(v is not None for v in payload.get("video") or [])
        groups = prompt_groups(payload["prompt_ids"], payload["pixel_values"], payload["image_grid_thw"]) \
            if self.cfg.train.shared_prefix and not has_video else None  # shared prefixes: images only
        if groups is None:
            hidden = backbone(**inputs, use_cache=False).last_hidden_state[:, P - 1:P - 1 + T]
        else:
            hidden = shared_prefix_hidden(backbone, inputs, P, T, groups, payload["pixel_values"],
                                          payload["image_grid_thw"])
        out = token_logprobs(hidden, head, targets, self.cfg.rollout.temperature, self.suppressed_ids, with_entropy)
        mask = batch.action_mask.to(hidden.device)
        if not with_entropy:
            return out * mask
        logps, entropy = out
        return logps * mask, entropy * mask

    def _micro_batches(self, batch: Rollouts):
        mb = self.micro_batch_size
        for start in range(0, len(batch), mb):
            rows = list(range(start, min(start + mb, len(batch))))
            yield rows, batch.select(rows)

    @torch.no_grad()
    def score(self, batch: Rollouts, reference: bool) -> torch.Tensor:
        """Log-probs of the whole batch without gradient, in micro-batches."""
        parts = []
        ctx = self.reference() if reference else contextlib.nullcontext(self.module)
        with ctx as model:
            model.eval()
            for _, sub in self._micro_batches(batch):
                with self.autocast():
                    parts.append(self.completion_logps(model, sub).cpu())
        return torch.cat(parts)

    # -- training -------------------------------------------------------------------------------
    def loss_terms(self, batch: Rollouts, objective, num_tokens: float, num_seqs: float):
        """The objective's loss per micro-batch. Batch-dependent token selections (top-entropy
        tokens, Clip-Cov/KL-Cov) are computed once on the whole mini-batch first (a no-grad pass),
        then sliced per micro-batch, so gradient accumulation stays exact."""
        obj_cfg = objective.cfg
        selection = self._selection(batch, obj_cfg) if obj_cfg.needs_selection else None
        self.module.train()
        for rows, sub in self._micro_batches(batch):
            entropies = None
            if obj_cfg.needs_entropy:
                logps, entropies = self.forward(self.completion_logps, self.module, sub, with_entropy=True)
                if not obj_cfg.entropy_coef:
                    entropies = entropies.detach()
            else:
                logps = self.forward(self.completion_logps, self.module, sub)
            dev = logps.device
            extra: dict[str, Any] = {}
            if entropies is not None:
                extra["entropies"] = entropies
            if selection is not None:
                extra["selection"] = selection[rows].to(dev)
            if sub.off_policy is not None:
                extra["off_policy"] = sub.off_policy.to(dev)
            yield objective(
                logps,
                None if sub.old_logps is None else sub.old_logps.to(dev),
                sub.advantages.to(dev),
                sub.action_mask.to(dev),
                ref_logps=None if sub.ref_logps is None else sub.ref_logps.to(dev),
                rollout_logps=None if sub.rollout_logps is None else sub.rollout_logps.to(dev),
                num_tokens=num_tokens, num_seqs=num_seqs, **extra,
            )

    @torch.no_grad()
    def _selection(self, batch: Rollouts, obj_cfg):
        """Token selections of the whole mini-batch under the current weights."""
        self.module.eval()
        logps, ents = [], []
        for _, sub in self._micro_batches(batch):
            with self.autocast():
                lp, ent = self.completion_logps(self.module, sub, with_entropy=True)
            logps.append(lp.cpu())
            ents.append(ent.cpu())
        logps, ents = torch.cat(logps), torch.cat(ents)
        old = batch.old_logps if batch.old_logps is not None else logps
        if dist.world_size() > 1:
            return _selection_across_ranks(obj_cfg, logps, old, batch.advantages, batch.action_mask, ents)
        return select_tokens(obj_cfg, logps, old, batch.advantages, batch.action_mask, ents)

    # -- persistence ----------------------------------------------------------------------------
    def save_weights(self, path: Path, state: dict[str, torch.Tensor] | None = None) -> None:
        """An ordinary checkpoint directory ``path/model`` (weights and processor): loadable as
        ``model.path`` (float32 master weights, so a resumed run continues exactly)."""
        self.module.save_pretrained(Path(path) / "model", state_dict=state, safe_serialization=True)
        self.processor.save_pretrained(Path(path) / "model")

    def load_weights(self, path: Path) -> None:
        """Restore through transformers' own loader, which knows the key layout it wrote."""
        from transformers import AutoModelForImageTextToText

        saved = AutoModelForImageTextToText.from_pretrained(str(Path(path) / "model"), dtype=torch.float32)
        self.load_module_state(saved.state_dict())
        del saved


def _selection_across_ranks(obj_cfg, logps, old, advantages, mask, ents) -> TokenSelection:
    """The token selections of the global mini-batch, as one process would make them: every rank's
    rows are gathered (right-padded to the longest completion), rank 0 selects on the whole
    (quantile threshold, covariance means, Clip-Cov's random pick, KL-Cov's top-k) and broadcasts,
    and each rank keeps its own rows. Selecting on each rank's share would give every rank its own
    threshold."""
    parts = dist.gather([t.detach().cpu() for t in (logps, old, advantages, mask, ents)])
    if dist.is_main():
        width = max(p[3].shape[1] for p in parts)

        def cat(i: int) -> torch.Tensor:
            xs = [p[i] for p in parts]
            if xs[0].dim() == 1:  # sequence advantages
                return torch.cat(xs)
            return torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1])) for x in xs])

        whole = select_tokens(obj_cfg, cat(0), cat(1), cat(2), cat(3), cat(4))
        bounds, start = [], 0
        for p in parts:
            bounds.append((start, start + p[3].shape[0], p[3].shape[1]))
            start += p[3].shape[0]
        shares = [whole[lo:hi, :width_r] for lo, hi, width_r in bounds]
    else:
        shares = None
    return dist.broadcast(shares)[dist.rank()]
