"""The RL loop end to end on a random tiny model: outputs, exact resume, data order."""

from __future__ import annotations

import pytest

import json

import torch

from conftest import make_config
from mmrl.core.batch.prompts import UniformSampler
from mmrl.core.trainer import Trainer
from mmrl.vlm.policy import VLMPolicy


def _cfg(path, out, steps, *extra):
    return make_config(
        f"model.path={path}", "train.device=cpu", f"train.steps={steps}", "train.prompts_per_step=2",
        "rollout.num_generations=3", "rollout.max_completion_length=8", "train.micro_batch_size=3",
        "train.mini_batch_size=3", "algo.num_iterations=2", "train.learning_rate=1e-3",
        "eval.num_examples=4", f"log.output_dir={out}", "log.run_name=run", "log.save_every=2",
        "log.save_rollouts_every=2", "log.num_rollouts_to_save=2", "log.progress=false", *extra,
    )


def _train(cfg):
    policy = VLMPolicy(cfg)
    result = Trainer(cfg, policy).train()
    return policy, result


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def two_step_run(random_tiny_dir, tmp_path_factory):
    """One 2-step run, trained once: its outputs are checked, and the resume test continues a copy
    of it to 4 steps."""
    out = tmp_path_factory.mktemp("two-step")
    _, result = _train(_cfg(random_tiny_dir, out, 2))
    return result


@pytest.mark.slow
def test_run_directory_outputs(two_step_run):
    result = two_step_run
    run = result.run_dir
    assert (run / "config.yaml").exists() and (run / "summary.json").exists()
    rows = _metrics(run)
    train_rows = [r for r in rows if "reward" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    for key in ("reward", "reward/format", "reward/accuracy", "loss", "grad_norm", "completion_length",
                "step_time", "reward/accuracy/unparsable_frac", "zero_std_group_frac"):
        assert key in train_rows[0], key
    assert any("eval/reward" in r for r in rows)
    assert list((run / "tensorboard").iterdir())
    saved = run / "rollouts" / "step_000002"
    assert (saved / "rollouts.jsonl").exists() and (saved / "0.png").exists()
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000002"
    assert set(result.before) >= {"reward", "accuracy"} and set(result.after) >= {"reward", "accuracy"}


@pytest.mark.slow
def test_resume_continues_exactly(random_tiny_dir, two_step_run, tmp_path):
    """4 steps straight == 2 steps, stop, resume to 4: identical weights and step metrics."""
    import shutil

    straight, _ = _train(_cfg(random_tiny_dir, tmp_path / "a", 4))
    shutil.copytree(two_step_run.run_dir, tmp_path / "b" / "run")  # the 2-step run, stopped there
    # The interrupted run's config said 2 steps: resuming with 4 is a config change, refused
    # unless allowed, and then it continues from step 2.
    from mmrl.runs.config_history import ConfigChangeError

    with pytest.raises(ConfigChangeError, match=r"train.steps: 2 -> 4"):
        _train(_cfg(random_tiny_dir, tmp_path / "b", 4, "resume=true"))
    resumed, _ = _train(_cfg(random_tiny_dir, tmp_path / "b", 4, "resume=true", "allow_config_change=true"))
    history = sorted(p.name for p in (tmp_path / "b" / "run" / "config_history").iterdir())
    assert history == ["000-start.yaml", "001-resume-step-2.yaml"]
    assert "steps: 4" in (tmp_path / "b" / "run" / "config.yaml").read_text()
    for (name, a), (_, b) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name
    rows_a = {r["step"]: r for r in _metrics(tmp_path / "a" / "run") if "reward" in r}
    rows_b = {r["step"]: r for r in _metrics(tmp_path / "b" / "run") if "reward" in r}
    # no duplicated lines after the resume (the list, not the dict, would show a repeated step)
    assert [r["step"] for r in _metrics(tmp_path / "b" / "run") if "reward" in r] == [1, 2, 3, 4]
    for step in (3, 4):
        for key in ("reward", "loss", "completion_length"):
            assert abs(rows_a[step][key] - rows_b[step][key]) < 1e-6, (step, key)


def test_data_stream_is_a_pure_function_of_the_step():
    s1, s2 = UniformSampler({"t": 10}, 4, seed=3), UniformSampler({"t": 10}, 4, seed=3)
    seen = [i for step in range(5) for i in s1.indices(step)]
    assert seen[:10] != list(range(10))  # shuffled
    assert sorted(seen[:10]) == list(range(10))  # each example once per epoch
    assert sorted(seen[10:20]) == list(range(10))
    assert s2.indices(3) == s1.indices(3)  # no hidden state: step 3 alone gives the same prompts
    assert UniformSampler({"t": 10}, 4, seed=4).indices(0) != s1.indices(0)
