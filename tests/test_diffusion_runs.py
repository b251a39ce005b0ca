"""Generators through the whole loop, as users run them.

- Tiny SD3, FLUX and Wan pipelines (random weights, built locally) each train one LoRA RL step through
  ``mmrl train diffusion`` on a prompt file (``t2i_prompts``) with weight-free rewards; Wan's clips
  are scored frame by frame, so its rewards are real numbers, not the unparsable minimum.
- A generator run resumes exactly: 4 steps straight == 2 steps + resume to 4 (full fine-tuning and
  LoRA).
- ``mmrl eval <run>`` of a generator run (images and clips) writes its gallery.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from typer.testing import CliRunner

import mmrl
from mmrl.cli import app
from mmrl.runs.checkpoint import CheckpointManager

pytestmark = pytest.mark.slow  # every test here takes over half a second on the 2-core CPU

FRAMES = 5  # Wan clips: 5 frames -> 2 latent frames


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny generators run on one thread (see ``diffusion_fixtures.one_thread``)."""


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("# prompts for the tiny pipelines\na red cat\ntwo dogs on grass\nblue sky at night\n")
    return path


def t2i_overrides(model_path, prompts, out, name, steps=1, *extra) -> list[str]:
    """A few-second run of a tiny pipeline on the prompt file: 2 prompts x 2 samples, 2 denoising
    steps at 16x16 (5 frames for Wan), rewarded by brightness and JPEG size (weight-free)."""
    return [
        f"model.path={model_path}", "task.name=t2i_prompts", f"task.options.train_path={prompts}",
        "task.rewards.brightness=1.0", "task.rewards.jpeg_compressibility=0.1", f"train.steps={steps}",
        "train.prompts_per_step=2", "rollout.num_generations=2", "diffusion.num_steps=2", "diffusion.eval_num_steps=2",
        "diffusion.height=16", "diffusion.width=16", f"diffusion.num_frames={FRAMES}", "eval.num_examples=2",
        "eval.every=0", "train.learning_rate=1e-3", "train.threads=1", f"log.output_dir={out}", f"log.run_name={name}",
        "log.progress=false", "log.tensorboard=false", "log.save_rollouts_every=0", *extra,
    ]


def cli(*args: str):
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("family", ["sd3", "flux", "wan"])
def test_lora_step_through_the_cli(family, request, prompt_file, tmp_path):
    model_dir = request.getfixturevalue(f"{family}_dir")
    cli("train", "diffusion", *t2i_overrides(model_dir, prompt_file, tmp_path, family, 1, "model.lora.enabled=true",
                                             "model.lora.r=4", "log.save_rollouts_every=1", "log.num_rollouts_to_save=2"))
    run = tmp_path / family
    train = [r for r in rows(run) if "reward" in r]
    assert [r["step"] for r in train] == [1]
    step = train[0]
    # Every sample was scored: brightness in (0, 1), JPEG size in kB as a negative reward. Before clips
    # were scored frame by frame, Wan's rewards were the unparsable minimum 0 for every sample.
    for name in ("brightness", "jpeg_compressibility"):
        assert step[f"reward/{name}/unparsable_frac"] == 0.0
    assert 0 < step["reward/brightness"] < 1 and step["reward/jpeg_compressibility"] < 0
    assert step["reward_std"] > 0 and step["zero_std_group_frac"] == 0.0  # brightness is continuous
    assert math.isfinite(step["loss"]) and step["grad_norm"] > 0
    evals = [r["step"] for r in rows(run) if "eval/reward" in r]
    assert evals == [0, 1]  # before and after
    # The checkpoint holds the adapters only; peft initialises every lora_B at zero, so a non-zero
    # lora_B is the optimizer step.
    ckpt = CheckpointManager(run / "checkpoints").latest() / "policy"
    assert ckpt.parent.name == "step_00000001"
    adapters = load_file(str(ckpt / "adapter_model.safetensors"))
    assert adapters and all("lora" in k for k in adapters)
    lora_b = [v for k, v in adapters.items() if "lora_B" in k]
    assert lora_b and all(v.dtype == torch.float32 for v in adapters.values())
    assert sum(int((v != 0).sum()) for v in lora_b) > 0.5 * sum(v.numel() for v in lora_b)
    assert (ckpt / "optimizer.pt").exists() and not (ckpt / "transformer").exists()
    for grid in ("samples_before.png", "samples_after.png"):
        assert (run / grid).stat().st_size > 200
    # the step's rollouts: an image as a PNG, a clip as a GIF of its frames
    saved = [json.loads(line) for line in (run / "rollouts" / "step_000001" / "rollouts.jsonl").read_text().splitlines()]
    assert [r["completion"] for r in saved] == ([f"{i}_completion.gif" for i in range(2)] if family == "wan"
                                                else [f"{i}_completion.png" for i in range(2)])
    with Image.open(run / "rollouts" / "step_000001" / saved[0]["completion"]) as im:
        assert im.size == (16, 16) and getattr(im, "n_frames", 1) == (FRAMES if family == "wan" else 1)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 1 and set(summary["before"]) >= {"reward/brightness", "reward/jpeg_compressibility"}


def _weights(run_dir, step: str, lora: bool) -> dict[str, torch.Tensor]:
    """The trained weights of checkpoint ``step`` (``latest``: the one the pointer file names)."""
    ckpt = run_dir / "checkpoints"
    policy = (CheckpointManager(ckpt).latest() if step == "latest" else ckpt / step) / "policy"
    if lora:
        return load_file(str(policy / "adapter_model.safetensors"))
    return load_file(str(policy / "transformer" / "diffusion_pytorch_model.safetensors"))


@pytest.mark.parametrize("mode", ["full-awm", "lora-clip"])
def test_generator_run_resumes_exactly(mode, tiny_flow_dir, tmp_path):
    """4 steps straight == 2 steps, stop, resume to 4: the same weights bit for bit, the same
    step metrics, each step once in metrics.jsonl. Two optimizer steps per RL step (mini-batches) and
    two iterations, so optimizer state, the data order and the sampling noise must all resume."""
    lora, loss = mode.split("-")
    extra = ["model.lora.enabled=true", "model.lora.r=4"] if lora == "lora" else []

    def train(out, steps, *more):
        return mmrl.train("diffusion/composition_tiny", [
            f"model.path={tiny_flow_dir}", f"algo.loss_type={loss}", f"train.steps={steps}", "train.prompts_per_step=2",
            "rollout.num_generations=2", "train.mini_batch_size=2", "algo.num_iterations=2", "diffusion.num_steps=3",
            "diffusion.eval_num_steps=2", "eval.num_examples=2", "eval.before=false", "eval.every=0",
            # "stop at 2" is a 2-step run: a constant lr, since the recipe's linear decay depends on train.steps
            "train.learning_rate=1e-3", "train.lr_scheduler_type=constant_with_warmup",
            f"log.output_dir={out}", "log.run_name=run", "log.save_every=2",
            "log.save_rollouts_every=0", "log.progress=false", "log.tensorboard=false", *extra, *more])

    straight = train(tmp_path / "a", 4).run_dir
    train(tmp_path / "b", 2)
    resumed = train(tmp_path / "b", 4, "resume=true", "allow_config_change=true").run_dir
    final_a, final_b = _weights(straight, "latest", lora == "lora"), _weights(resumed, "latest", lora == "lora")
    assert final_a.keys() == final_b.keys()
    for name, a in final_a.items():  # bit for bit (prompt embeddings do not depend on their batch)
        assert torch.equal(a, final_b[name]), name
    # ... and steps 3-4 did train (else equal weights would prove nothing)
    middle = _weights(straight, "step_00000002", lora == "lora")
    assert any(not torch.equal(middle[k], final_a[k]) for k in final_a)
    train_a = [r for r in rows(straight) if "reward" in r]
    train_b = [r for r in rows(resumed) if "reward" in r]
    assert [r["step"] for r in train_a] == [r["step"] for r in train_b] == [1, 2, 3, 4]
    for ra, rb in zip(train_a, train_b):
        for key in ("reward", "loss", "grad_norm"):
            assert ra[key] == rb[key], (ra["step"], key, ra[key], rb[key])


@pytest.mark.parametrize("family", ["tiny_flow", "wan"])
def test_eval_of_a_generator_run_writes_its_gallery(family, request, prompt_file, tmp_path):
    model_dir = request.getfixturevalue(f"{family}_dir")
    run = mmrl.train("diffusion/composition_tiny", t2i_overrides(model_dir, prompt_file, tmp_path, family, 1, "eval.before=false")).run_dir
    out = cli("eval", str(run), "--num-examples", "2")
    metrics = json.loads(out.stdout[out.stdout.index("{"):out.stdout.rindex("}") + 1])
    assert metrics["task"] == "t2i_prompts" and metrics["checkpoint"].endswith("step_00000001")
    assert 0 < metrics["reward/brightness"] < 1
    gallery = run / "eval_gallery"
    page = (gallery / "index.html").read_text()
    assert page.count('<img src="') == 2 and "PIL" not in page
    for name in ("000.png", "001.png", "gallery.png", "samples.png"):
        assert (gallery / name).stat().st_size > 100, name
    assert "a red cat" in page and "two dogs on grass" in page  # the prompts, as the cards' titles
    assert ("(a clip of %d frames)" % FRAMES in page) == (family == "wan")
