"""The vision-language policy: a transformers Qwen-VL-family model whose actions are tokens.

It implements the Policy interface the trainer uses:

- ``rollout(examples, prompts, n)`` samples ``n`` completions per prompt with HF ``generate`` and
  returns a :class:`~mmrl.core.rollouts.Rollouts` whose payload keeps each sample's token ids and
  pixels so the same sequences can be re-scored later;
- ``train_step(batch, objective, num_tokens, num_seqs)`` does one optimizer step over a
  mini-batch, in micro-batches (gradient accumulation), calling the core's objective for the loss;
- ``save``/``load`` write the weights (or LoRA adapter), optimizer and scheduler.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..core.policy import DTYPES, load_optimizer_state, make_optimizer, pick_device, save_optimizer_state
from ..core.rollouts import Rollouts
from .processing import VLMProcessor



def resolve_model_path(path: str) -> Path:
    """``"tiny"`` is the built-in tiny Qwen2.5-VL; anything else must be a local directory."""
    if path == "tiny":
        from mmrl.assets import asset_path

        p = asset_path("tiny-qwen2.5-vl")
        if not (p / "config.json").exists():
            raise FileNotFoundError(
                f"the built-in tiny model is missing at {p}; rebuild it with `mmrl build-tiny vlm`"
            )
        return p
    p = Path(path).expanduser()
    if not (p / "config.json").exists():
        raise FileNotFoundError(
            f"model.path={path!r} is not a local checkpoint directory (no config.json there). "
            "mmrl never downloads weights: download the checkpoint first and pass its directory, "
            "or use model.path=tiny for the built-in model."
        )
    return p


# LoRA targets when model.lora.target_modules is unset: the language model's attention and MLP.
VLM_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def load_vlm(model_cfg, device: torch.device):
    """Load model and processor from a local directory, with the configured image budget."""
    from transformers import AutoModelForImageTextToText

    path = resolve_model_path(model_cfg.path)
    kwargs: dict[str, Any] = {"dtype": DTYPES[model_cfg.dtype]}
    if model_cfg.attn_implementation:
        kwargs["attn_implementation"] = model_cfg.attn_implementation
    model = AutoModelForImageTextToText.from_pretrained(str(path), **kwargs).to(device)
    processor = VLMProcessor.from_pretrained(path, model_cfg.min_pixels, model_cfg.max_pixels)
    return model, processor


def vision_tower(model) -> torch.nn.Module | None:
    """The vision encoder of a Qwen-VL-family model (its attribute moved between versions)."""
    for owner in (getattr(model, "model", None), model):
        for name in ("visual", "vision_tower", "vision_model"):
            module = getattr(owner, name, None) if owner is not None else None
            if isinstance(module, torch.nn.Module):
                return module
    return None


class VLMPolicy:
    """A Qwen-VL-family model trained with the core objective. See the module docstring."""

    def __init__(self, cfg, device: torch.device | None = None):
        if cfg.algo.loss_type in ("awm", "nft"):
            raise ValueError(f"algo.loss_type={cfg.algo.loss_type!r} is a generator objective (flow-matching "
                             "likelihood); a VLM trains with clip, gspo, reg_grpo or cispo")
        self.cfg = cfg
        self.device = device or pick_device(cfg.train.device)
        self.model, self.processor = load_vlm(cfg.model, self.device)
        self.model.config.use_cache = True
        self.tokenizer = self.processor.tokenizer
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) | {self.tokenizer.eos_token_id}
        self.eos_ids.discard(None)
        self.pad_id = self.tokenizer.pad_token_id
        # Vision placeholder tokens must never be sampled: one in a completion makes the
        # re-scoring forward fail ("image features and image tokens do not match"). They are
        # suppressed in generate and masked identically when scoring, so log-probs are those of
        # the distribution actually sampled from.
        self.suppressed_ids = sorted({
            i for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
            if (i := self.tokenizer.convert_tokens_to_ids(t)) is not None and i != self.tokenizer.unk_token_id
        })
        if cfg.model.freeze_vision:
            tower = vision_tower(self.model)
            if tower is None:
                raise ValueError("model.freeze_vision=true but no vision tower was found in this model")
            tower.requires_grad_(False)
        self.ref_model = None
        if cfg.model.lora.enabled and cfg.algo.ref_reset_every:
            raise ValueError("algo.ref_reset_every (ProRL reference reset) is not supported with LoRA "
                             "(the reference is the base model); use full fine-tuning or set it to 0")
        if cfg.model.lora.enabled:
            self._apply_lora(cfg.model.lora)
        elif cfg.algo.beta > 0:
            # A frozen copy: the reference policy of the KL term (with LoRA the base weights,
            # reached by disabling the adapters, play this role and no copy is made).
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = None
        self.scheduler = None

    # -- coordinates ----------------------------------------------------------------------------
    @property
    def box_space(self) -> str:
        """The space this model writes boxes in: ``model.box_space`` if set, else its family's
        (Qwen2.5-VL: resized-image pixels; Qwen2-VL / Qwen3-VL: 0-1000), see mmrl.media.coords."""
        from ..media.coords import output_space

        return self.cfg.model.box_space or output_space(self.model.config.model_type)

    def coordinate_frame(self, image_size):
        """The :class:`~mmrl.media.coords.Frame` of an image of ``image_size`` (width, height)
        as this policy's image processor resizes it."""
        from ..media.coords import qwen_frame

        return qwen_frame(image_size, self.processor.image_processor)

    # -- setup ----------------------------------------------------------------------------------
    def _apply_lora(self, lora_cfg) -> None:
        from peft import LoraConfig, get_peft_model

        tower = vision_tower(self.model)
        tower_prefix = next((n for n, m in self.model.named_modules() if m is tower), None)
        targets = [
            name for name, module in self.model.named_modules()
            if isinstance(module, torch.nn.Linear)
            and name.split(".")[-1] in set(lora_cfg.target_modules or VLM_LORA_TARGETS)
            and not (tower_prefix and name.startswith(tower_prefix + "."))
        ]
        if not targets:
            raise ValueError(f"model.lora.target_modules={lora_cfg.target_modules} matched no Linear layer")
        config = LoraConfig(r=lora_cfg.r, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout,
                            target_modules=targets)
        self.model = get_peft_model(self.model, config)

    def configure_optimizer(self, train_cfg, total_steps: int) -> None:
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer, self.scheduler = make_optimizer(params, train_cfg, total_steps)

    @contextlib.contextmanager
    def _reference(self):
        """The reference model: disabled adapters with LoRA, otherwise the frozen copy."""
        if self.ref_model is not None:
            yield self.ref_model
        elif hasattr(self.model, "disable_adapter"):
            with self.model.disable_adapter():
                yield self.model
        else:
            raise RuntimeError("a reference model is needed (algo.beta > 0) but none was set up")

    # -- encoding -------------------------------------------------------------------------------
    @staticmethod
    def split_messages(messages: list[dict]) -> tuple[list[dict], list[Any]]:
        """Images out of the chat messages (the template sees placeholders, the processor pixels)."""
        images, clean = [], []
        for msg in messages:
            content = msg["content"]
            if isinstance(content, list):
                items = []
                for item in content:
                    if item.get("type") == "image" or "image" in item:
                        images.append(item["image"])
                        items.append({"type": "image"})
                    else:
                        items.append(item)
                clean.append({**msg, "content": items})
            else:
                clean.append(msg)
        return clean, images

    def encode_prompts(self, prompts: Sequence[list[dict]]) -> tuple[dict[str, torch.Tensor], list[int]]:
        """Model inputs for a batch of chat prompts, and how many images each prompt has."""
        texts, images = [], []
        for messages in prompts:
            clean, imgs = self.split_messages(messages)
            texts.append(self.processor.apply_chat_template(clean))
            images.append([im.convert("RGB") for im in imgs])
        return self.processor(texts, images if any(images) else None), [len(x) for x in images]

    # -- sampling ---------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: Sequence[list[dict]], *, temperature: float, top_p: float = 1.0,
                 top_k: int = 0, max_new_tokens: int, batch_size: int = 64) -> list[dict]:
        """Sample one completion per prompt. Returns per-sample dicts with ids and pixels."""
        self.model.eval()
        results: list[dict] = []
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start:start + batch_size]
            enc, images_per_sample = self.encode_prompts(chunk)
            inputs = {k: v.to(self.device) for k, v in enc.items()}
            gen_kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens, pad_token_id=self.pad_id,
                                              eos_token_id=sorted(self.eos_ids),
                                              suppress_tokens=self.suppressed_ids or None)
            if temperature > 0:
                # top_k=0 / top_p=1 explicitly: the checkpoint's generation_config may set its own
                # (transformers defaults top_k to 50), which would truncate what we sample from.
                gen_kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k)
            else:
                gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
            out = self.model.generate(**inputs, **gen_kwargs).cpu()
            prompt_len = enc["input_ids"].shape[1]
            patches = _split_patches(enc, images_per_sample)
            for i in range(len(chunk)):
                prompt_ids = enc["input_ids"][i][enc["attention_mask"][i].bool()]
                completion = out[i, prompt_len:]
                length, stopped = self._completion_length(completion)
                results.append({
                    "prompt_ids": prompt_ids,
                    "completion_ids": completion[:length].clone(),
                    "truncated": not stopped,
                    "pixel_values": patches[i][0],
                    "image_grid_thw": patches[i][1],
                })
        return results

    def _completion_length(self, completion: torch.Tensor) -> tuple[int, bool]:
        """Tokens up to and including the first EOS; (length, stopped).

        generate only pads a sequence after its EOS, so one without EOS ran the whole budget.
        """
        for t, tok in enumerate(completion.tolist()):
            if tok in self.eos_ids:
                return t + 1, True
        return len(completion), False

    def decode(self, ids: torch.Tensor) -> str:
        return self.processor.decode(ids.tolist())

    def rollout(self, examples: Sequence[dict], prompts: Sequence[list[dict]], n: int, rollout_cfg,
                need_old_logps: bool, need_ref_logps: bool) -> Rollouts:
        """``n`` samples for each prompt; group i holds the samples of ``prompts[i]``."""
        repeated = [p for p in prompts for _ in range(n)]
        samples = self.generate(repeated, temperature=rollout_cfg.temperature, top_p=rollout_cfg.top_p,
                                top_k=rollout_cfg.top_k, max_new_tokens=rollout_cfg.max_completion_length,
                                batch_size=rollout_cfg.batch_size)
        group_ids = torch.arange(len(prompts)).repeat_interleave(n)
        lengths = [len(s["completion_ids"]) for s in samples]
        width = max(lengths)
        mask = torch.zeros(len(samples), width)
        for i, L in enumerate(lengths):
            mask[i, :L] = 1.0
        payload = {k: [s[k] for s in samples] for k in ("prompt_ids", "completion_ids", "pixel_values", "image_grid_thw")}
        batch = Rollouts(
            group_ids=group_ids,
            action_mask=mask,
            completions=[self.decode(s["completion_ids"]) for s in samples],
            examples=[ex for ex in examples for _ in range(n)],
            truncated=torch.tensor([s["truncated"] for s in samples]),
            payload=payload,
        )
        if need_old_logps:
            batch.old_logps = self.score(batch, reference=False)
        if need_ref_logps:
            batch.ref_logps = self.score(batch, reference=True)
        return batch

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
        bs = max(1, self.cfg.rollout.batch_size)
        samples: list[dict] = []
        for start in range(0, len(prompts), bs):
            chunk = prompts[start:start + bs]
            enc, images_per_sample = self.encode_prompts(chunk)
            patches = _split_patches(enc, images_per_sample)
            for i in range(len(chunk)):
                text_ids = self.tokenizer(completions[start + i], add_special_tokens=False)["input_ids"]
                if any(tok in self.suppressed_ids for tok in text_ids):
                    raise ValueError(f"rollout_given: completion {start + i} contains a vision placeholder "
                                     "token (<|image_pad|>, <|vision_start|>, ...), which is never sampled "
                                     "and cannot be scored")
                ids = list(text_ids) + [stop]
                truncated = len(ids) > max_len
                samples.append({
                    "prompt_ids": enc["input_ids"][i][enc["attention_mask"][i].bool()],
                    "completion_ids": torch.tensor(ids[:max_len], dtype=torch.long),
                    "truncated": truncated,
                    "pixel_values": patches[i][0],
                    "image_grid_thw": patches[i][1],
                })
        lengths = [len(s["completion_ids"]) for s in samples]
        mask = torch.zeros(len(samples), max(lengths, default=0))
        for i, L in enumerate(lengths):
            mask[i, :L] = 1.0
        payload = {k: [s[k] for s in samples] for k in ("prompt_ids", "completion_ids", "pixel_values", "image_grid_thw")}
        batch = Rollouts(
            group_ids=torch.arange(len(prompts)),
            action_mask=mask,
            completions=[self.decode(s["completion_ids"]) for s in samples],
            examples=list(examples),
            truncated=torch.tensor([s["truncated"] for s in samples], dtype=torch.bool),
            off_policy=torch.ones(len(samples), dtype=torch.bool),
            payload=payload,
        )
        empty = torch.zeros(0, 0)
        if need_old_logps:
            batch.old_logps = self.score(batch, reference=False) if samples else empty
        if need_ref_logps:
            batch.ref_logps = self.score(batch, reference=True) if samples else empty
        return batch

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
        targets = torch.full((len(batch), T), self.pad_id, dtype=torch.long)
        for i, c in enumerate(comps):
            targets[i, :len(c)] = c
        return {k: v.to(self.device) for k, v in inputs.items()}, targets.to(self.device), P

    def completion_logps(self, model, batch: Rollouts, with_entropy: bool = False):
        """Per-token log-probs (N, T) of the completions under ``model`` (temperature-scaled);
        with ``with_entropy`` also the per-token entropy of the full next-token distribution."""
        inputs, targets, P = self._collate(batch)
        T = targets.shape[1]
        out = model(**inputs, use_cache=False, logits_to_keep=T + 1)
        logits = out.logits[:, :-1, :].float()
        if self.suppressed_ids:
            logits[..., self.suppressed_ids] = float("-inf")
        temperature = self.cfg.rollout.temperature
        if temperature > 0 and temperature != 1.0:
            logits = logits / temperature
        all_logps = torch.log_softmax(logits, dim=-1)
        mask = batch.action_mask.to(all_logps.device)
        logps = all_logps.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * mask
        if not with_entropy:
            return logps
        # Suppressed tokens have -inf log-prob: clamp so 0 * -inf does not make NaN.
        finite = all_logps.clamp(min=torch.finfo(all_logps.dtype).min)
        entropy = -(all_logps.exp() * finite).sum(-1)
        return logps, torch.where(mask > 0, entropy, torch.zeros_like(entropy))

    @torch.no_grad()
    def score(self, batch: Rollouts, reference: bool) -> torch.Tensor:
        """Log-probs of the whole batch without gradient, in micro-batches."""
        mb = max(1, self.cfg.train.micro_batch_size)
        parts = []
        ctx = self._reference() if reference else contextlib.nullcontext(self.model)
        with ctx as model:
            model.eval()
            for start in range(0, len(batch), mb):
                sub = batch.select(list(range(start, min(start + mb, len(batch)))))
                parts.append(self.completion_logps(model, sub).cpu())
        return torch.cat(parts)

    # -- training -------------------------------------------------------------------------------
    def train_step(self, batch: Rollouts, objective: Callable[..., tuple[torch.Tensor, dict]],
                   num_tokens: float, num_seqs: float) -> dict[str, float]:
        """One optimizer step over ``batch`` (a mini-batch), accumulated over micro-batches.

        When the objective needs batch-dependent token selections (top-entropy tokens,
        Clip-Cov/KL-Cov), they are computed once on the whole mini-batch first (a no-grad pass),
        then sliced per micro-batch, so gradient accumulation stays exact.
        """
        if self.optimizer is None:
            raise RuntimeError("call configure_optimizer() before train_step()")
        obj_cfg = getattr(objective, "cfg", None)
        need_entropy = bool(obj_cfg is not None and obj_cfg.needs_entropy)
        selection = self._selection(batch, obj_cfg) if obj_cfg is not None and obj_cfg.needs_selection else None
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        mb = max(1, self.cfg.train.micro_batch_size)
        sums: dict[str, float] = {}
        n_micro = 0
        for start in range(0, len(batch), mb):
            rows = list(range(start, min(start + mb, len(batch))))
            sub = batch.select(rows)
            entropies = None
            if need_entropy:
                logps, entropies = self.completion_logps(self.model, sub, with_entropy=True)
                if not obj_cfg.entropy_coef:
                    entropies = entropies.detach()
            else:
                logps = self.completion_logps(self.model, sub)
            dev = logps.device
            extra = {}
            if entropies is not None:
                extra["entropies"] = entropies
            if selection is not None:
                extra["selection"] = selection[rows].to(dev)
            if sub.off_policy is not None:
                extra["off_policy"] = sub.off_policy.to(dev)
            loss, metrics = objective(
                logps,
                None if sub.old_logps is None else sub.old_logps.to(dev),
                sub.advantages.to(dev),
                sub.action_mask.to(dev),
                ref_logps=None if sub.ref_logps is None else sub.ref_logps.to(dev),
                num_tokens=num_tokens, num_seqs=num_seqs, **extra,
            )
            loss.backward()
            n_micro += 1
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v)
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.train.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        out = {k: v / n_micro for k, v in sums.items() if k != "loss"}
        out["loss"] = sums.get("loss", 0.0)  # micro losses are already scaled to sum to the total
        out["grad_norm"] = float(grad_norm)
        out["lr"] = float(self.scheduler.get_last_lr()[0])
        return out

    @torch.no_grad()
    def _selection(self, batch: Rollouts, obj_cfg):
        """Token selections of the whole mini-batch under the current weights."""
        from ..core.objective_variants import select_tokens

        mb = max(1, self.cfg.train.micro_batch_size)
        self.model.eval()
        logps, ents = [], []
        for start in range(0, len(batch), mb):
            lp, ent = self.completion_logps(self.model, batch.select(list(range(start, min(start + mb, len(batch))))),
                                            with_entropy=True)
            logps.append(lp.cpu())
            ents.append(ent.cpu())
        logps, ents = torch.cat(logps), torch.cat(ents)
        old = batch.old_logps if batch.old_logps is not None else logps
        return select_tokens(obj_cfg, logps, old, batch.advantages, batch.action_mask, ents)

    def reset_reference(self) -> None:
        """ProRL's reference reset: the reference becomes the current policy, optimizer state is
        cleared. With LoRA the reference is the base model, so a reset would need merging the
        adapter; that is refused at configuration time."""
        if self.ref_model is not None:
            self.ref_model.load_state_dict(self.model.state_dict())
        self.optimizer.state.clear()

    # -- persistence ----------------------------------------------------------------------------
    def save(self, path: Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path / "model", safe_serialization=True)
        self.processor.save_pretrained(path / "model")
        save_optimizer_state(path, self.optimizer, self.scheduler)

    def load(self, path: Path) -> None:
        """Restore weights (through transformers'/peft's own loaders, which know the key layout
        ``save_pretrained`` wrote), then optimizer and scheduler state."""
        path = Path(path)
        if self.cfg.model.lora.enabled:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(self.model, load_file(str(path / "model" / "adapter_model.safetensors")))
        else:
            from transformers import AutoModelForImageTextToText

            saved = AutoModelForImageTextToText.from_pretrained(str(path / "model"), dtype=self.model.dtype)
            self.model.load_state_dict(saved.state_dict())
            del saved
        load_optimizer_state(path, self.optimizer, self.scheduler)


def _split_patches(enc: dict, images_per_sample: list[int]) -> list[tuple[torch.Tensor | None, torch.Tensor | None]]:
    """Per-sample ``(pixel_values, image_grid_thw)`` out of a batch encoding.

    The processor concatenates every image's patches along one axis; sample i owns the next
    ``images_per_sample[i]`` images, each with ``t*h*w`` patches from its grid row.
    """
    if "pixel_values" not in enc:
        return [(None, None)] * len(images_per_sample)
    grid = enc["image_grid_thw"]
    sizes = grid.prod(-1).tolist()
    out, p, g = [], 0, 0
    for k in images_per_sample:
        npatch = int(sum(sizes[g:g + k]))
        out.append((enc["pixel_values"][p:p + npatch], grid[g:g + k]) if k else (None, None))
        p += npatch
        g += k
    return out
