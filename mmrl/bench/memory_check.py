"""``mmrl plan`` against the memory a step really takes: the plan's validation table.

One RL step (a warm-up step first, so the optimizer state exists, as in ``mmrl bench gpu``'s peak)
through the trainer's own step methods, its tensor memory tracked on the CPU by torch's
``MemTracker`` (:func:`mmrl.core.library_internals.tracked_peak_bytes`): the weights, the
reference copy and the optimizer state from the start, then everything the rollout and the update
allocate. The plan of the same config is computed beside it; ``tests/test_memory_plan.py`` and the
table in docs/performance.md ("Planning memory: mmrl plan") read these rows.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

# The 0.5B-shaped model: Qwen2.5-VL with Qwen2.5-0.5B's language-model widths (hidden 896, 14 heads,
# 2 key/value heads, MLP 4864, the 151,936-token vocabulary; M-RoPE sections for its 64-wide heads), 4 of its 24 layers and 2 of the
# vision tower's 32 blocks so that a step runs in under a minute on a 2-core CPU.
QWEN2_5_0_5B_TEXT = dict(hidden_size=896, num_hidden_layers=4, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [8, 12, 12]})
QWEN2_5_VL_VISION_2 = dict(depth=2, fullatt_block_indexes=[1], out_hidden_size=896)

# The step every row runs: 2 prompts x 4 samples (tiny: 4 x 8), one micro-batch, one step after a warm-up.
STEP = ["train.steps=2", "train.mini_batch_size=0", "algo.num_iterations=1", "eval.before=false",
        "log.tensorboard=false", "log.progress=false", "log.save_rollouts_every=0", "train.device=cpu",
        "train.threads=1", "log.save_every=0"]


@dataclass
class Row:
    model: str
    mode: str
    overrides: list[str]
    predicted: int = 0
    measured: int = 0

    @property
    def ratio(self) -> float:
        return self.predicted / self.measured


def measure(cfg) -> int:
    """Tensor bytes at the peak of one RL step of ``cfg`` on the CPU, after a warm-up step."""
    from mmrl.api import make_policy
    from mmrl.core.library_internals import tracked_peak_bytes
    from mmrl.core.trainer import Trainer, build_task

    task = build_task(cfg)
    policy = make_policy(cfg, task)
    if hasattr(policy, "model") and cfg.rollout.engine == "hf":  # every completion at full length, as planned
        policy.model.generation_config.min_new_tokens = cfg.rollout.max_completion_length
    trainer = Trainer(cfg, policy, task)
    policy.configure_optimizer(cfg.train, cfg.train.steps)
    batch, _ = trainer.rollout_step(1)
    trainer.update(batch, 1)
    del batch

    def step():
        batch, _ = trainer.rollout_step(2)
        trainer.update(batch, 2)

    # the whole VLM; a generator's transformer and its frozen text encoder
    model = getattr(policy, "model", None) or policy.module
    encoder = getattr(getattr(policy, "pipe", None), "text_encoder", None)
    held = [m for m in (model, encoder, policy.ref_module) if m is not None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracker's module-hierarchy warning (its hooks are off)
        return tracked_peak_bytes(step, *held, policy.optimizer)["cpu"]


def predicted(cfg, modality: str = "vlm") -> int:
    from mmrl.cli.plan import configured_mode, shape_of
    from mmrl.core.memory_plan import plan
    from mmrl.core.precision import compute_dtype

    return plan(shape_of(cfg, modality), configured_mode(cfg), compute_dtype(cfg.model.dtype), 80 * 10**9).peak


def run_row(row: Row, model_path: str | Path, out_dir: Path, base: list[str],
            recipe: str = "vlm/counting_tiny") -> Row:
    from mmrl.config import builtin_config_path, load_config

    cfg = load_config(builtin_config_path(recipe),
                      [*STEP, f"model.path={model_path}", f"log.output_dir={out_dir}", *base, *row.overrides])
    row.predicted = predicted(cfg, "diffusion" if recipe.startswith("diffusion/") else "vlm")
    row.measured = measure(cfg)
    return row


TINY = ["train.prompts_per_step=4", "rollout.batch_size=32", "train.micro_batch_size=16"]
SHAPED = ["train.prompts_per_step=2", "rollout.num_generations=4", "rollout.batch_size=8", "train.micro_batch_size=8",
          "rollout.max_completion_length=32", "model.dtype=bfloat16"]
MODES = {
    "adamw_torch (float32 masters)": [],
    "+ gradient checkpointing": ["train.gradient_checkpointing=true"],
    "adamw_kahan (bf16 weights)": ["train.optim=adamw_kahan"],
    "LoRA r=16": ["model.lora.enabled=true"],
    "LoRA + gradient checkpointing": ["model.lora.enabled=true", "train.gradient_checkpointing=true"],
    "8-bit AdamW": ["train.optim=adamw_bnb_8bit"],
    "QLoRA r=16 (4-bit base)": ["model.lora.enabled=true", "model.load_in_4bit=true"],
}


# The tiny generator (composition_tiny, float32): 4 prompts x 8 images, the update in one micro-batch of 32.
GENERATOR = ["train.prompts_per_step=4", "rollout.num_generations=8", "rollout.batch_size=32",
             "train.micro_batch_size=32"]
GENERATOR_MODES = {
    "AWM, adamw_torch": [],
    "AWM + gradient checkpointing": ["train.gradient_checkpointing=true"],
    "Flow-GRPO (clip), LoRA r=16": ["algo.loss_type=clip", "model.lora.enabled=true"],
}


def generator_rows(out_dir: Path, modes: dict[str, list[str]] = GENERATOR_MODES):
    """The tiny generator's validation rows (one step after a warm-up, as the VLM rows)."""
    for name, ov in modes.items():
        yield run_row(Row("tiny generator", name, list(ov)), "tiny", Path(out_dir) / "runs", GENERATOR,
                      "diffusion/composition_tiny")


def shaped_model(out_dir: Path) -> Path:
    import torch

    from .speed_model import build_shaped_model

    return build_shaped_model(Path(out_dir) / "model-0.5b-4l", text=QWEN2_5_0_5B_TEXT, vision=QWEN2_5_VL_VISION_2,
                              dtype=torch.bfloat16)


def rows(which: str, out_dir: Path, modes: dict[str, list[str]] = MODES):
    """The validation rows (one at a time, as measured) of ``which`` ("tiny": the shipped tiny model in float32; "0.5b": the
    0.5B-shaped model in bfloat16), every mode of ``modes``."""
    out_dir = Path(out_dir)
    if which == "tiny":
        path, base = "tiny", TINY
        modes = {k: v for k, v in modes.items() if "kahan" not in k}  # bf16 optimizers need model.dtype=bfloat16
    else:
        path, base = shaped_model(out_dir), SHAPED
    for name, ov in modes.items():
        yield run_row(Row(which, name, list(ov)), path, out_dir / "runs", base)


if __name__ == "__main__":  # python -m mmrl.bench.memory_check tiny|0.5b|generator OUT_DIR [MODE ...]
    import sys

    every = GENERATOR_MODES if sys.argv[1] == "generator" else MODES
    chosen = {k: v for k, v in every.items() if k in sys.argv[3:]} if sys.argv[3:] else every
    found = generator_rows(Path(sys.argv[2]), chosen) if sys.argv[1] == "generator" else \
        rows(sys.argv[1], Path(sys.argv[2]), chosen)
    for r in found:
        print(f"| {r.model} | {r.mode} | {r.predicted / 2**20:.1f} | {r.measured / 2**20:.1f} | {r.ratio:.2f} |",
              flush=True)
