"""`mmrl bench gpu`: every group of the GPU table runs on a CPU with --tiny (so the GPU run executes
code that already ran), ratios are taken against the TRL row of the same group, a group past the
budget is stopped with its measured rows kept, and the MFU's FLOP count is the hand-worked one."""

from __future__ import annotations

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from mmrl.bench.gpu import GpuBenchOptions, run_gpu_bench
from mmrl.bench.gpu_groups import update_flops

pytestmark = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="TRL is not installed (pip install -e \".[bench]\")")


def test_update_flops_by_hand():
    """hidden 4, 2 layers, 2 heads (head dim 2), 1 KV head, MLP 8, vocab 10: per layer q,o 2*16 +
    k,v 2*4*2 + gate/up/down 3*4*8 = 144 weights; forward over 3 prompt + 2 completion tokens
    2*2*144*5 = 2880, LM head on the 2 completion tokens 2*4*10*2 = 160; x3 full, x2 LoRA."""
    config = {"text_config": {"hidden_size": 4, "num_hidden_layers": 2, "num_attention_heads": 2,
                              "num_key_value_heads": 1, "intermediate_size": 8, "vocab_size": 10}}
    assert update_flops(config, 3, 2, lora=False) == 3 * 3040
    assert update_flops(config, 3, 2, lora=True) == 2 * 3040


@pytest.mark.slow  # ~60 s on a 2-core CPU: 9 speed runs, each loading the tiny model, and the other groups
def test_bench_gpu_tiny_runs_every_group_on_a_cpu(tmp_path):
    from mmrl.cli import app

    res = CliRunner().invoke(app, ["bench", "gpu", "--tiny", "--optims", "adamw_torch,adamw_kahan", "--caches",
                                   "static", "--repeats", "1", "--steps", "1", "--warmup", "0", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "speed.json").read_text())
    assert all(g["status"] == "done" for g in report["groups"].values()), report["groups"]
    # the speed groups: like-for-like pairs, TRL at its defaults and its best settings
    full, lora = report["speed"]["full"], report["speed"]["lora"]
    assert [(r["pair"], r["name"]) for r in full["rows"]] == [
        ("tower trained", "mmrl static"), ("tower trained", "TRL defaults"), ("tower trained", "TRL best"),
        ("tower frozen", "mmrl static"), ("tower frozen", "TRL defaults"), ("tower frozen", "TRL best")]
    assert [(r["pair"], r["name"]) for r in lora["rows"]] == [
        ("LoRA, tower frozen", "mmrl static LoRA"), ("LoRA, tower frozen", "TRL defaults LoRA"),
        ("LoRA, tower frozen", "TRL best LoRA")]
    for table in (full, lora):  # both sides train the same parameters in each pair
        assert all(p["same_trained_params"] for p in table["pairs"].values()), table["pairs"]
    assert full["pairs"]["tower trained"]["trained_params"] > full["pairs"]["tower frozen"]["trained_params"]
    assert lora["pairs"]["LoRA, tower frozen"]["trained_params"] < full["pairs"]["tower frozen"]["trained_params"]
    for run in report["runs"]:
        m = run["summary"]
        assert m["samples_per_step"] == 4 and m["completion_tokens_per_step"] == 16
        assert run["update_mfu"] is None  # no known peak on a CPU
        assert m["prompt_tokens_per_step"] == report["runs"][0]["summary"]["prompt_tokens_per_step"]
    for table in (full, lora):
        mmrl_row = table["rows"][0]
        assert set(mmrl_row["vs_trl"]) == {"defaults", "best"} and mmrl_row["vs_trl"]["best"]["n"] == 1
    rows = {(r["group"], r["name"]): r for r in report["rows"]}
    assert set(rows) == {("optimizers", "mmrl train.optim=adamw_torch"), ("optimizers", "mmrl train.optim=adamw_kahan"),
                         ("fit448", "mmrl 56-px scenes"), ("generator", "mmrl generator, full SDE"),
                         ("generator", "mmrl generator, SDE window 2")}
    for (group, name), r in rows.items():
        m = r["summary"]
        assert m["samples_per_step"] == 4 and m["completion_tokens_per_step"] == (0 if group == "generator" else 16)
    assert rows[("fit448", "mmrl 56-px scenes")]["fits"] is True
    # the SDE window trains 2 of the 4 denoising steps: a shorter update than every step's
    full_sde, window = (rows[("generator", f"mmrl generator, {v}")]["summary"] for v in ("full SDE", "SDE window 2"))
    assert window["update_s"] < full_sde["update_s"]
    md = (tmp_path / "speed.md").read_text()
    assert "### full: like for like against TRL's GRPOTrainer" in md and "| tower frozen | TRL best |" in md
    assert "| LoRA, tower frozen | TRL defaults LoRA |" in md and "| fit448 | mmrl 56-px scenes |" in md
    assert "| update MFU, full fine-tuning (median of the runs) | 0.3 | - | not measured |" in md


def test_goals_are_read_from_the_like_for_like_tables():
    """The best row per goal against TRL at its best settings, compared the goal's way; goals
    without rows are not measured."""
    from mmrl.bench.gpu import goals

    def row(name, variant, best, mem, mfu=None, side="mmrl"):
        return {"pair": "tower frozen", "name": name, "side": side, "variant": variant, "update_mfu": mfu,
                "vs_trl": {"best": {"median": best, "min": best, "max": best, "n": 3}, "defaults": None},
                "memory_vs_trl": {"best": mem}}

    speed = {"full": {"rows": [row("mmrl dynamic", "dynamic", 1.8, 0.88, 0.27), row("mmrl static", "static", 3.7, 0.9, 0.23),
                               {"pair": "tower frozen", "name": "TRL best", "side": "trl", "variant": "best",
                                "update_mfu": 0.17, "vs_trl": {}, "memory_vs_trl": {}}]},
             "lora": {"rows": [row("mmrl static LoRA", "static", 1.2, 1.03, 0.13)]}}
    others = [{"group": "fit448", "name": "mmrl 448-px scenes", "side": "mmrl", "fits": True,
               "summary": {"peak_memory_gib": 60.0}}]
    by_goal = {g["goal"]: g for g in goals(speed, others)}
    full = by_goal["samples/s x TRL best (median), full fine-tuning, HF engine"]
    assert (full["best"], full["met"]) == (3.7, True)
    assert by_goal["samples/s x TRL best (median), LoRA, HF engine"]["met"] is False
    assert by_goal["samples/s x TRL best (median), full fine-tuning, vLLM"]["met"] is None  # no vLLM row
    assert by_goal["peak memory x TRL best, full fine-tuning (at most)"]["best"] == 0.88
    assert by_goal["448-px micro-batch 16 peak GiB (at most 80 GB)"]["met"] is True
    mfu = by_goal["update MFU, full fine-tuning (median of the runs)"]
    assert (mfu["best"], mfu["met"]) == (0.27, False)


@pytest.mark.slow
def test_a_group_past_the_budget_is_stopped_and_reported(tmp_path):
    opts = GpuBenchOptions(tiny=True, groups=("full",), budget_s=0.5)
    report = run_gpu_bench(opts, tmp_path, echo=lambda s: None)
    assert report["groups"]["full"]["status"].startswith("stopped at the budget")
    assert "group full: stopped at the budget" in (tmp_path / "speed.md").read_text()


@pytest.mark.slow
def test_apart_each_group_starts_only_with_its_minimum_left_and_is_stopped_at_the_budget(tmp_path, monkeypatch):
    """The GPU path (a process per group; --tiny runs them in one): a group starts only with its
    minimum time left, and one still running when the budget ends is stopped."""
    from mmrl.bench import gpu

    monkeypatch.setitem(gpu.MIN_GROUP_S, "full", 0)
    (tmp_path / "options.json").write_text(json.dumps({"tiny": True}))
    groups = gpu.run_groups_apart(("full", "lora"), tmp_path, budget_s=0.5, echo=lambda s: None)
    assert groups["full"]["status"].startswith("stopped at the budget after")
    assert groups["lora"]["status"].startswith("not run:") and "the group needs 120 s" in groups["lora"]["status"]


def test_unknown_groups_and_caches_are_refused(tmp_path):
    with pytest.raises(ValueError, match="--groups: unknown speedy"):
        run_gpu_bench(GpuBenchOptions(tiny=True, groups=("speedy",)), tmp_path)
    with pytest.raises(ValueError, match="--caches: unknown sliding"):
        run_gpu_bench(GpuBenchOptions(tiny=True, caches=("sliding",)), tmp_path)
    with pytest.raises(ValueError, match="--towers: unknown half"):
        run_gpu_bench(GpuBenchOptions(tiny=True, towers=("half",)), tmp_path)
    with pytest.raises(ValueError, match="--repeats and --steps must be at least 1"):
        run_gpu_bench(GpuBenchOptions(tiny=True, repeats=0), tmp_path)


def test_static_plain_is_the_static_cache_with_the_per_sample_forward():
    """The row that repeats the 2026-11-27 GPU setting (shared prefixes off) beside the default."""
    from mmrl.bench.gpu_groups import CACHES
    from mmrl.config import load_config

    engine, overrides = CACHES["static_plain"]
    cfg = load_config(None, overrides)
    assert engine == "hf" and cfg.rollout.cache_implementation == "static" and cfg.train.shared_prefix is False
    assert load_config(None, CACHES["static"][1]).train.shared_prefix is None  # the default: on where it applies
    assert GpuBenchOptions(caches=("static_plain",)).resolved().caches == ("static_plain",)
