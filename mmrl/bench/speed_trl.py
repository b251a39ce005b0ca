"""The TRL side of ``mmrl bench speed``: TRL's own ``GRPOTrainer`` on the prompts mmrl drew.

What is TRL's and what is the bench's: the trainer, its config, its data loading, generation, loss
and optimizer step are TRL's (``GRPOTrainer.train()``); the bench supplies a dataset of the exact
prompts and images mmrl's data pipeline drew, in mmrl's order (``shuffle_dataset=False``; TRL's
sampler repeats each prompt ``num_generations`` times), a reward function that is mmrl's reward
computer for the task (so both sides score with the same code), a transformers processor around the
same checkpoint and image budget, the model loaded by TRL's own loader (``create_model_from_path``,
what ``GRPOTrainer`` calls for a path, with ``model_init_kwargs``' ``dtype``) and handed over as an
instance so that the vision tower can be frozen first (``requires_grad=False``: transformers'
``Trainer`` builds its optimizer from the parameters that require gradients), and timing: a callback
around each optimizer step, and wrappers around TRL's methods: ``_generate_and_score_completions``
(the rollout, counting its samples and tokens), ``_generate`` and, within the rollout,
``_get_per_token_logps_and_entropies`` (old/reference log-probs).

These are TRL 1.16's private names: :data:`TRL_METHODS` lists them and a test fails when a TRL
release moves them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import torch

from .speed_common import LOSS_TYPES, PhaseClock, SideResult, optimizer_params, peak_memory, reset_peak_memory, sync

# GRPOTrainer's methods the bench times (private in TRL 1.16; tests/test_bench_speed.py checks them)
TRL_METHODS = ("_generate_and_score_completions", "_generate", "_get_per_token_logps_and_entropies")


def trl_dataset(task, drawn: Sequence[Sequence[dict]]):
    """A ``datasets.Dataset`` of conversational prompts (image placeholders in the messages, the
    images in an ``images`` column, as TRL's VLM path expects) and a ``row`` index into the
    flattened ``drawn`` examples."""
    from datasets import Dataset

    from ..vlm.policy import VLMPolicy

    rows = []
    for i, ex in enumerate(ex for step in drawn for ex in step):
        messages, images, _ = VLMPolicy.split_messages(task.build_prompt(ex))
        rows.append({"prompt": messages, "images": [im.convert("RGB") for im in images], "row": i})
    return Dataset.from_list(rows)


def reward_function(task, cfg, examples: Sequence[dict]):
    """A TRL reward function scoring with mmrl's reward computer for ``task`` (TRL passes the
    dataset's columns, here ``row``, as keyword arguments)."""
    from ..core.reward_computer import make_reward_computer

    rewards = make_reward_computer(task, cfg.task)

    def mmrl_reward(prompts, completions, row, **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        texts = [t if isinstance(t, str) else "".join(p.get("text", "") for p in t) for t in texts]
        exs = [examples[r] for r in row]
        groups = {r: g for g, r in enumerate(dict.fromkeys(row))}
        total, _, _ = rewards(texts, exs, group_ids=torch.tensor([groups[r] for r in row]))
        return total.tolist()

    return mmrl_reward


def processor_for(path: Path, cfg):
    """transformers' own processor of the checkpoint (a ``ProcessorMixin``, which TRL needs to take
    the VLM path) with mmrl's image processor and pixel budget, so both sides see the same patches."""
    from transformers import AutoProcessor

    from ..vlm.processing import VLMProcessor

    processor = AutoProcessor.from_pretrained(str(path))
    processor.image_processor = VLMProcessor.from_pretrained(path, cfg.vlm.min_pixels, cfg.vlm.max_pixels).image_processor
    return processor


def grpo_config(cfg, opts, out_dir: Path, settings):
    """TRL's config with the bench's shared settings, mmrl's recipe values for the rest, and the
    row's own ``settings`` (:class:`~mmrl.bench.speed_compare.TrlSettings`): gradient
    checkpointing and the KV cache."""
    from trl import GRPOConfig

    algo, train, rollout = cfg.algo, cfg.train, cfg.rollout
    if algo.loss_agg_mode not in LOSS_TYPES:
        raise ValueError(f"algo.loss_agg_mode={algo.loss_agg_mode!r} has no TRL loss_type here "
                         f"(supported: {', '.join(LOSS_TYPES)})")
    return GRPOConfig(
        output_dir=str(out_dir),
        max_steps=opts.warmup + opts.steps,
        per_device_train_batch_size=opts.micro_batch,
        gradient_accumulation_steps=opts.samples // opts.micro_batch,
        num_generations=opts.generations,
        max_completion_length=opts.tokens,
        generation_kwargs={"min_new_tokens": opts.tokens},
        temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
        beta=0.0, num_iterations=1,
        epsilon=algo.epsilon, epsilon_high=algo.epsilon_high if algo.epsilon_high is not None else algo.epsilon,
        loss_type=LOSS_TYPES[algo.loss_agg_mode],
        scale_rewards="group" if algo.scale_rewards else "none",
        mask_truncated_completions=bool(algo.overlong_filter),
        learning_rate=train.learning_rate, lr_scheduler_type=train.lr_scheduler_type, warmup_steps=train.warmup_steps,
        weight_decay=train.weight_decay, adam_beta1=train.adam_beta1, adam_beta2=train.adam_beta2,
        max_grad_norm=train.max_grad_norm, optim="adamw_torch", seed=opts.seed,
        bf16=opts.dtype == "bfloat16", use_cpu=opts.device == "cpu",
        gradient_checkpointing=settings.gradient_checkpointing, cache_implementation=settings.cache_implementation,
        shuffle_dataset=False,
        report_to=[], logging_steps=1, save_strategy="no", disable_tqdm=True, log_completions=False,
        dataloader_num_workers=0,
    )


def peft_config(cfg):
    """mmrl's LoRA settings as a peft config: the language model's Linear layers named in
    ``model.lora.target_modules`` (default mmrl's), never the vision tower's (as mmrl)."""
    from peft import LoraConfig

    from ..vlm.loading import VLM_LORA_TARGETS

    lora = cfg.model.lora
    names = "|".join(lora.target_modules or VLM_LORA_TARGETS)
    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=rf"^(?!.*\bvisual\b).*\.({names})$")


def load_model(path: Path, settings, opts, frozen_tower: bool):
    """The checkpoint as ``GRPOTrainer`` loads a path (TRL's ``create_model_from_path``; weights in
    float32, its default, or in the compute dtype), the vision tower frozen when asked."""
    from trl.trainer.utils import create_model_from_path

    from ..vlm.loading import vision_tower

    dtype = torch.float32 if settings.weights == "float32" else getattr(torch, opts.dtype)
    model = create_model_from_path(str(path), dtype=dtype)
    if frozen_tower:
        tower = vision_tower(model)
        if tower is None:
            raise ValueError(f"{path}: no vision tower to freeze")
        tower.requires_grad_(False)
    return model


def run_trl_side(cfg, opts, path: Path, drawn: Sequence[Sequence[dict]], task, out_dir: Path, settings,
                 frozen_tower: bool) -> SideResult:
    """``GRPOTrainer.train()`` for ``warmup + steps`` steps on ``drawn`` (mmrl's prompts by step)."""
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    device = torch.device(opts.device)
    clock = PhaseClock(device)
    examples = [ex for step in drawn for ex in step]
    result = SideResult("trl", opts.warmup)
    state: dict[str, Any] = {}

    class StepTimer(TrainerCallback):
        """Times each optimizer step (begin of its first micro-batch to after the optimizer step)."""

        def on_step_begin(self, args, st, control, **kw):
            if st.global_step == opts.warmup:
                reset_peak_memory(device)
            sync(device)
            clock.take()
            state.update(t0=time.perf_counter(), samples=0, tokens=0, prompt_tokens=0)

        def on_step_end(self, args, st, control, **kw):
            sync(device)
            phases = clock.take()
            result.add(time.perf_counter() - state["t0"], phases.get("rollout", 0.0), state["samples"],
                       state["tokens"], state["prompt_tokens"], phases.get("generate", 0.0),
                       phases.get("logprobs", 0.0))

    trainer = GRPOTrainer(
        model=load_model(path, settings, opts, frozen_tower), reward_funcs=reward_function(task, cfg, examples),
        args=grpo_config(cfg, opts, out_dir, settings),
        train_dataset=trl_dataset(task, drawn), processing_class=processor_for(path, cfg),
        peft_config=peft_config(cfg) if opts.lora else None, callbacks=[StepTimer()],
    )
    rollout_method, generate_method, logps_method = TRL_METHODS
    generate_and_score = getattr(trainer, rollout_method)

    def counted(inputs):
        out = generate_and_score(inputs)
        state["samples"] += int(out["completion_ids"].shape[0])
        state["tokens"] += int(out["completion_mask"].sum())
        state["prompt_tokens"] += int(out["prompt_mask"].sum())
        return out

    setattr(trainer, rollout_method, counted)
    clock.wrap(trainer, rollout_method, "rollout")
    clock.wrap(trainer, generate_method, "generate", within="rollout")
    clock.wrap(trainer, logps_method, "logprobs", within="rollout")  # in compute_loss it is the update's
    trainer.remove_callback(PrinterCallback)  # TRL's log dicts stay in speed.json, off the terminal
    reset_peak_memory(device)
    trainer.train()
    result.peak_memory_gib, result.memory_kind = peak_memory(device)
    result.logs = [dict(entry) for entry in trainer.state.log_history]
    result.trained_params = optimizer_params(trainer.optimizer)
    del trainer
    return result
