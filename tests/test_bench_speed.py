"""`mmrl bench speed`: mmrl and TRL's GRPOTrainer on the same work, one table. No timing is asserted
(times on a shared CPU are noise); what must hold is that both sides did the same work."""

from __future__ import annotations

import importlib.util
import json

import pytest

from mmrl.bench.speed import SpeedOptions, mmrl_overrides

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None,
                               reason="TRL is not installed (pip install -e \".[bench]\")")


@pytest.mark.slow  # ~45 s on a 2-core CPU: both trainers load the tiny model and take a step, twice
@needs_trl
def test_both_sides_do_the_same_work_and_the_table_says_so(tmp_path):
    from mmrl.bench.speed import run_speed_bench

    opts = SpeedOptions(prompts=1, generations=2, tokens=4, steps=1, warmup=0, device="cpu", repeats=2)
    report = run_speed_bench(opts, tmp_path)

    mmrl, trl = report["mmrl"], report["trl"]
    # forced lengths: 1 prompt x 2 samples x 4 tokens on each side, the same prompts, in both repeats
    assert mmrl["samples"] == trl["samples"] == [2, 2]
    assert mmrl["completion_tokens"] == trl["completion_tokens"] == [8, 8]
    assert mmrl["prompt_tokens"] == trl["prompt_tokens"] and mmrl["prompt_tokens"][0] > 0
    # the repeats alternate which side goes first, and each repeat has its own ratio
    assert [(r["repeat"], r["side"]) for r in report["repeats"]["load_average"]] == [
        (0, "mmrl"), (0, "trl"), (1, "trl"), (1, "mmrl")]
    ratios = report["repeats"]["samples_per_s_ratio"]
    assert len(ratios) == 2 and all(r > 0 for r in ratios)
    assert report["repeats"]["spread"] == pytest.approx((max(ratios) - min(ratios)) / (sum(ratios) / 2))
    assert any(n.startswith("samples/s ratio per repeat") for n in report["notes"])
    for side in (mmrl, trl):
        assert len(side["step_s"]) == len(side["rollout_s"]) == 2
        s = side["summary"]
        assert s["steps"] == 2 and s["samples_per_step"] == 2 and s["completion_tokens_per_step"] == 8
        assert s["step_s"] > 0 and s["samples_per_s"] > 0 and s["tokens_per_s"] > 0
        assert s["rollout_s"] + s["update_s"] == pytest.approx(s["step_s"])
        assert s["peak_memory_gib"] > 0
        assert side["logs"]  # each trainer's own metrics of the step
    assert report["ratio"]["samples_per_step"] == report["ratio"]["completion_tokens_per_step"] == 1.0
    assert not any("NOT" in n for n in report["notes"])  # no same-work warning

    on_disk = json.loads((tmp_path / "speed.json").read_text())
    assert on_disk["settings"]["tokens"] == 4 and on_disk["settings"]["micro_batch"] == 2
    md = (tmp_path / "speed.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert rows[0] == "| metric | mmrl | TRL | mmrl/TRL |"
    labels = [r.split("|")[1].strip() for r in rows[1:]]
    assert labels == ["samples/s", "tokens/s (completion)", "s/step", "rollout s/step", "update s/step",
                      "peak memory GiB", "samples/step", "completion tokens/step", "prompt tokens/step"]
    assert all(len(r.split("|")) == 6 for r in rows)


def test_options_are_checked_before_anything_loads():
    with pytest.raises(ValueError, match="must divide"):
        SpeedOptions(prompts=1, generations=2, micro_batch=3).resolved()
    with pytest.raises(ValueError, match="at least 2"):
        SpeedOptions(generations=1, micro_batch=1).resolved()
    opts = SpeedOptions(prompts=4, generations=8).resolved()
    assert opts.micro_batch == 16 and opts.dtype == "float32"


def test_the_engine_and_shared_settings_reach_mmrl_config(tmp_path):
    from mmrl.config import builtin_config_path, load_config

    opts = SpeedOptions(prompts=2, generations=4, tokens=16, engine="vllm", lora=True).resolved()
    cfg = load_config(builtin_config_path("vlm/counting_tiny"), mmrl_overrides(opts, "tiny", tmp_path))
    assert cfg.rollout.engine == "vllm" and cfg.model.lora.enabled
    assert (cfg.train.prompts_per_step, cfg.rollout.num_generations, cfg.rollout.max_completion_length) == (2, 4, 16)
    assert cfg.rollout.batch_size == 8 and cfg.train.micro_batch_size == 8 and cfg.algo.beta == 0.0


@needs_trl
def test_cli_reports_a_bad_micro_batch_as_an_error(tmp_path):
    from typer.testing import CliRunner

    from mmrl.cli import app

    res = CliRunner().invoke(app, ["bench", "speed", "--prompts", "1", "--generations", "2", "--micro-batch", "3",
                                   "--out", str(tmp_path / "b")])
    assert res.exit_code == 2 and "must divide" in " ".join(res.output.split())
