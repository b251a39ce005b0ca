"""mmrl export: a trained policy as a directory its library loads, which reproduces the run's
held-out numbers, with a model card."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from conftest import CLI_RUN
from mmrl.cli import app

pytestmark = pytest.mark.slow


def _held_out(run_dir, *overrides):
    """The run's config evaluated afresh on its eval split, with ``overrides`` (the exported model)."""
    from mmrl.api import make_policy
    from mmrl.config import load_config
    from mmrl.core.evaluation import evaluate
    from mmrl.core.reward_computer import make_reward_computer
    from mmrl.core.trainer import build_task

    cfg = load_config(run_dir / "config.yaml", ["resume=false", *overrides])
    task = build_task(cfg)
    metrics = evaluate(make_policy(cfg, task), task, make_reward_computer(task, cfg.task), cfg)
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in metrics.items()}  # as JSON keeps them


def _after(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())["after"]


@pytest.fixture(scope="module")
def lora_run(random_tiny_dir, tmp_path_factory):
    """A 2-step LoRA run of the random tiny VLM, adapters trained away from zero."""
    import mmrl

    root = tmp_path_factory.mktemp("lora-run")
    result = mmrl.train("vlm/counting_tiny", [f"model.path={random_tiny_dir}", *CLI_RUN, "train.steps=2",
                                              "model.lora.enabled=true", "model.lora.r=4", "train.learning_rate=0.05",
                                              "algo.entropy_coef=0.1",  # a gradient even when every reward ties
                                              f"log.output_dir={root}", "log.run_name=lora", "eval.num_examples=4"])
    return result.run_dir


def test_a_full_fine_tuning_run_loads_in_transformers_and_reproduces_its_numbers(finished_cli_run, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText, AutoProcessor

    out = tmp_path / "export"
    res = CliRunner().invoke(app, ["export", str(finished_cli_run), str(out)])
    assert res.exit_code == 0, res.output
    model = AutoModelForImageTextToText.from_pretrained(out)
    AutoProcessor.from_pretrained(out)
    latest = (finished_cli_run / "checkpoints" / "latest").read_text().strip()
    saved = load_file(str(finished_cli_run / "checkpoints" / latest / "policy" / "model" / "model.safetensors"))
    mine = model.state_dict()
    assert all(torch.equal(mine[k], v) for k, v in saved.items() if k in mine) and len(saved) > 10
    assert _held_out(finished_cli_run, f"model.path={out}") == _after(finished_cli_run)
    card = (out / "README.md").read_text()
    assert "library_name: transformers" in card and "| held-out metric | before | after |" in card
    assert "## Recipe" in card and "name: counting" in card and "| accuracy | " in card and "full weights" in card
    assert "`mmrl train vlm config.yaml` repeats the run" in card  # the modality the command needs


def test_lora_merged_and_adapters_alone(lora_run, random_tiny_dir, tmp_path):
    """Merged: a plain transformers model whose held-out numbers are the run's; adapters: peft
    loads them onto the base and gives the merged model's logits."""
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    merged, adapters = tmp_path / "merged", tmp_path / "adapters"
    assert CliRunner().invoke(app, ["export", str(lora_run), str(merged)]).exit_code == 0
    res = CliRunner().invoke(app, ["export", str(lora_run), str(adapters), "--adapters"])
    assert res.exit_code == 0, res.output
    assert not list(merged.glob("adapter_*")) and (adapters / "adapter_config.json").exists()
    assert _held_out(lora_run, f"model.path={merged}", "model.lora.enabled=false") == _after(lora_run)
    plain = AutoModelForImageTextToText.from_pretrained(merged).eval()
    base = AutoModelForImageTextToText.from_pretrained(random_tiny_dir).eval()
    ids = torch.tensor([[7, 8, 9, 10, 11]])
    with torch.no_grad():
        want, before = plain(input_ids=ids).logits, base(input_ids=ids).logits
        got = PeftModel.from_pretrained(base, adapters).eval()(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(before, want, atol=1e-4)  # the adapters changed the model
    assert "LoRA adapters" in (adapters / "README.md").read_text()


def test_a_generator_run_exports_its_pipeline_with_the_adapters_fused(tmp_path):
    """A LoRA generator run: the export is the base pipeline directory with the trained transformer,
    loaded by the generator loader, and its held-out reward is the run's."""
    import mmrl
    from mmrl.diffusion.loading import load_generator

    result = mmrl.train("diffusion/composition_tiny", [
        "train.steps=1", "train.prompts_per_step=2", "rollout.num_generations=2", "eval.num_examples=2",
        "model.lora.enabled=true", "train.learning_rate=0.01", "log.progress=false", "log.save_every=0",
        "log.tensorboard=false", "eval.every=0", f"log.output_dir={tmp_path}", "log.run_name=gen"])
    out = tmp_path / "export"
    res = CliRunner().invoke(app, ["export", str(result.run_dir), str(out)])
    assert res.exit_code == 0, res.output
    pipe = load_generator(str(out), "cpu", torch.float32)
    assert not any("lora" in k for k in pipe.transformer.state_dict())
    assert _held_out(result.run_dir, f"model.path={out}", "model.lora.enabled=false") == _after(result.run_dir)
    assert "library_name: diffusers" in (out / "README.md").read_text()
    assert "`mmrl train diffusion config.yaml` repeats the run" in (out / "README.md").read_text()
    res = CliRunner().invoke(app, ["export", str(result.run_dir), str(tmp_path / "a"), "--adapters"])
    assert res.exit_code != 0 and "--adapters" in res.output


def test_bad_requests_name_what_to_do(finished_cli_run, tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["export", str(tmp_path), str(tmp_path / "out")])
    assert res.exit_code != 0 and "not a run directory" in res.output
    res = runner.invoke(app, ["export", str(finished_cli_run), str(tmp_path / "out"), "--step", "7"])
    assert res.exit_code != 0 and "no checkpoint at step 7" in res.output and "checkpoints at steps" in res.output
    res = runner.invoke(app, ["export", str(finished_cli_run), str(tmp_path / "out"), "--adapters"])
    assert res.exit_code != 0 and "trained no LoRA adapters" in res.output
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    res = runner.invoke(app, ["export", str(finished_cli_run), str(tmp_path / "full")])
    assert res.exit_code != 0 and "not empty" in res.output


def test_a_policy_without_the_hook_is_refused_with_a_message():
    from mmrl.core.policy import PolicyBase

    with pytest.raises(ValueError, match="no export_pretrained"):
        PolicyBase.export_pretrained(object.__new__(PolicyBase), None)
