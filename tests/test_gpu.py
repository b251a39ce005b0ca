"""CUDA: a bf16 VLM step and a bf16 generator step on the GPU, and the precision check there. Marked
``gpu``: tests/conftest.py skips them ("needs a CUDA device") where torch sees no CUDA device."""

from __future__ import annotations

import json
import math

import pytest

import mmrl
from precision_checks import check_generator_bf16_step, check_master_weights_contrast, check_vlm_bf16_step

pytestmark = pytest.mark.gpu


def test_vlm_bf16_train_step_on_cuda(random_tiny_dir):
    """The tiny random Qwen2.5-VL, model.dtype=bfloat16 with a frozen vision tower: trained params
    float32 on the GPU, the tower bf16, one step at lr 1e-6 moves most trained weights."""
    check_vlm_bf16_step(random_tiny_dir, "cuda")


def test_generator_bf16_train_step_on_cuda(tiny_flow_dir, tmp_path):
    """The generator policy's step on the GPU (as in test_precision), then two RL steps of the whole
    loop (`mmrl train diffusion` with train.device=cuda) with a checkpoint and the sample grids."""
    check_generator_bf16_step(tiny_flow_dir, "cuda")
    result = mmrl.train("diffusion/composition_tiny", [
        f"model.path={tiny_flow_dir}", "train.device=cuda", "model.dtype=bfloat16", "train.steps=2",
        "train.prompts_per_step=2", "rollout.num_generations=4", "diffusion.num_steps=3", "diffusion.eval_num_steps=3",
        "eval.num_examples=4", "eval.every=0", f"log.output_dir={tmp_path}", "log.run_name=cuda", "log.progress=false",
        "log.tensorboard=false", "log.save_rollouts_every=0"])
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "reward" in r]
    assert [r["step"] for r in train] == [1, 2] and all(math.isfinite(r["loss"]) for r in train)
    assert (result.run_dir / "samples_before.png").exists() and (result.run_dir / "samples_after.png").exists()
    assert list((result.run_dir / "checkpoints").glob("step_*/policy/transformer"))


def test_master_weights_contrast_on_cuda():
    """On the GPU too: one AdamW step at lr 1e-6 moves every float32 weight and ~2% of bf16 ones."""
    check_master_weights_contrast("cuda")
