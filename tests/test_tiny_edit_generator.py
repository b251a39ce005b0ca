"""The tiny editing generator (issue 56 item 2): mmrl's tiny image generator conditioned on a source
image (InstructPix2Pix's channel concatenation), on a small random model built here
(tests/edit_builders.py): widening keeps the base generator exactly, the source image and guidance
reach the velocity, SDE log-probs re-scored equal, a LoRA step through ``mmrl train diffusion``, a
checkpoint round trip; the shipped model is what `mmrl build-tiny edit` makes. (It does not learn held-out
edits: docs/generators.md, "Image editing".)"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from edit_builders import build_tiny_edit, tiny_base
from generator_checks import assert_rescored, policy_for, train_rollout
from mmrl import make_task
from mmrl.cli import app
from mmrl.core.losses import Objective, ObjectiveConfig
from mmrl.diffusion.pretrain import widen_for_edits
from mmrl.diffusion.tiny import TinyFlowPipeline
from mmrl.plugins import load_plugins

load_plugins()


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """The tiny generators run on one thread (see ``diffusion_fixtures.one_thread``)."""


@pytest.fixture(scope="module")
def edit_dir(tmp_path_factory):
    return build_tiny_edit(tmp_path_factory.mktemp("tiny-edit"))


def _inputs(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 16, 16, generator=g), torch.rand(n, generator=g), torch.rand(n, 3, 16, 16, generator=g)


def test_widening_keeps_the_base_generator_exactly():
    """Zero source channels: before any edit training the editing generator draws what its base draws,
    whatever the source image (InstructPix2Pix's initialisation)."""
    base = tiny_base()
    edit = widen_for_edits(tiny_base())
    x, sigma, images = _inputs()
    prompts = ["a red circle", "two blue squares on the left", "", "a green square"]
    with torch.no_grad():
        want = base.velocity(x, sigma, prompts)
        got = edit.velocity(x, sigma, prompts, images=images)
    assert edit.conditioning == "image" and edit.transformer.config.in_channels == 6
    assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()
    assert edit.tokenizer("make move to add").input_ids[:4] == [len(base.tokenizer.get_vocab()) + i for i in range(4)]


def test_the_source_image_and_guidance_reach_the_velocity(edit_dir):
    pipe = TinyFlowPipeline.from_pretrained(edit_dir)
    x, sigma, images = _inputs()
    prompts = ["make the red circle blue"] * 4
    with torch.no_grad():
        v = pipe.velocity(x, sigma, prompts, images=images)
        assert not torch.allclose(v, pipe.velocity(x, sigma, prompts, images=images.flip(0)))
        # guidance: the unconditional branch is the empty instruction with the same source image
        uncond = pipe.velocity(x, sigma, [""] * 4, images=images)
        guided = pipe.velocity(x, sigma, prompts, 3.0, images=images)
    assert torch.allclose(guided, uncond + 3.0 * (v - uncond), atol=1e-5)
    with pytest.raises(ValueError, match="needs the source images"):
        pipe.velocity(x, sigma, prompts)
    text_only = tiny_base()
    with pytest.raises(ValueError, match="takes no images"):
        text_only.velocity(x, sigma, prompts, images=images)


def _policy(path, *overrides):
    return policy_for(path, "diffusion.num_steps=4", "diffusion.eval_num_steps=5", *overrides, task="image_edit")


def _rollout(policy, n=3):
    task = make_task("image_edit")
    examples = [dict(task.examples("train")[i], _index=i) for i in range(2)]
    return train_rollout(policy, [task.build_prompt(ex) for ex in examples], n, examples=examples)


def test_sde_log_probs_re_scored_equal(edit_dir):
    policy = _policy(edit_dir, "algo.loss_type=clip")
    batch = _rollout(policy)
    assert batch.old_logps.shape == (6, 4) and torch.isfinite(batch.old_logps).all()
    assert batch.payload["condition_images"].shape == (6, 3, 16, 16)
    assert_rescored(policy, batch, steps=4)


@pytest.mark.slow
def test_checkpoint_round_trip_with_lora(edit_dir, tmp_path):
    extra = ["model.lora.enabled=true", "model.lora.r=4"]
    policy = _policy(edit_dir, *extra)
    policy.train_step(_rollout(policy), Objective(ObjectiveConfig()), 24.0, 6.0)
    policy.save(tmp_path / "ckpt")
    restored = _policy(edit_dir, *extra)
    restored.load(tmp_path / "ckpt")
    for (name, a), b in zip(policy.transformer.state_dict().items(), restored.transformer.state_dict().values()):
        assert torch.equal(a, b), name
    x, sigma, images = _inputs()
    with torch.no_grad():
        want = policy.pipe.velocity(x, sigma, ["add a red square"] * 4, images=images)
        got = restored.pipe.velocity(x, sigma, ["add a red square"] * 4, images=images)
    assert torch.equal(want, got)


@pytest.mark.slow
def test_lora_step_through_the_cli(edit_dir, tmp_path):
    args = [f"model.path={edit_dir}", "task.name=image_edit", "task.options.eval_size=4", "train.steps=1",
            "train.prompts_per_step=2", "rollout.num_generations=2", "diffusion.num_steps=2", "diffusion.eval_num_steps=2",
            "eval.num_examples=4", "eval.every=0", "train.learning_rate=1e-3", "train.threads=1", "model.lora.enabled=true",
            "model.lora.r=4", f"log.output_dir={tmp_path}", "log.run_name=edit", "log.progress=false",
            "log.tensorboard=false", "log.save_rollouts_every=1", "log.num_rollouts_to_save=2"]
    result = CliRunner().invoke(app, ["train", "diffusion", *args])
    assert result.exit_code == 0, (result.output, result.exception)
    rows = [json.loads(line) for line in (tmp_path / "edit" / "metrics.jsonl").read_text().splitlines()]
    [step] = [r for r in rows if "reward" in r]
    assert step["reward/edit_score/unparsable_frac"] == 0.0 and step["reward/edit_preservation/unparsable_frac"] == 0.0
    assert step["grad_norm"] > 0
    assert [r["step"] for r in rows if "eval/edit_success" in r] == [0, 1]
    saved = (tmp_path / "edit" / "rollouts" / "step_000001" / "rollouts.jsonl").read_text().splitlines()
    assert len(saved) == 2


def test_shipped_editing_generator_is_what_build_tiny_makes(tmp_path, monkeypatch):
    """``mmrl build-tiny edit`` builds what assets/tiny-flow-edit is: the recorded recipe, the same model
    configs and weights of the same names and shapes (the real builder, shrunk to 2 steps of 4 samples)."""
    from safetensors.torch import load_file

    from mmrl.assets import asset_path
    from mmrl.diffusion import pretrain
    from mmrl.diffusion.tiny import MARKER

    real = pretrain.pretrain_tiny_edit_generator
    small = {"batch_size": 4, "dataset_size": 16}
    monkeypatch.setattr(pretrain, "pretrain_tiny_edit_generator", lambda out, **kw: real(out, **{**kw, **small}))
    result = CliRunner().invoke(app, ["build-tiny", "edit", "--out", str(tmp_path), "--steps", "2"])
    assert result.exit_code == 0, (result.output, result.exception)
    shipped = asset_path("tiny-flow-edit")
    info, built = json.loads((shipped / MARKER).read_text()), json.loads((tmp_path / MARKER).read_text())
    assert {k: info["pretrain"][k] for k in pretrain.TINY_EDIT_GENERATOR_RECIPE} == pretrain.TINY_EDIT_GENERATOR_RECIPE
    assert built["pretrain"] == {**info["pretrain"], "steps": 2, **small}
    assert {k: v for k, v in built.items() if k != "pretrain"} == {k: v for k, v in info.items() if k != "pretrain"}
    assert info["conditioning"] == "image"
    for part in ("transformer/config.json", "tokenizer/tokenizer.json", "scheduler/scheduler_config.json"):
        assert json.loads((tmp_path / part).read_text()) == json.loads((shipped / part).read_text()), part
    for part in ("transformer", "text_encoder"):
        weights = next((shipped / part).glob("*.safetensors")).name
        a, b = load_file(str(shipped / part / weights)), load_file(str(tmp_path / part / weights))
        assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}
