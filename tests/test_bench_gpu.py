"""`mmrl bench gpu`: every group of the GPU table runs on a CPU with --tiny (so the GPU run executes
code that already ran), ratios are taken against the TRL row of the same group, a group past the
budget is stopped with its measured rows kept, and the MFU's FLOP count is the hand-worked one."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mmrl.bench.gpu import GpuBenchOptions, run_gpu_bench
from mmrl.bench.gpu_groups import update_flops

trl = pytest.importorskip("trl", reason="TRL is not installed (pip install -e \".[bench]\")")


def test_update_flops_by_hand():
    """hidden 4, 2 layers, 2 heads (head dim 2), 1 KV head, MLP 8, vocab 10: per layer q,o 2*16 +
    k,v 2*4*2 + gate/up/down 3*4*8 = 144 weights; forward over 3 prompt + 2 completion tokens
    2*2*144*5 = 2880, LM head on the 2 completion tokens 2*4*10*2 = 160; x3 full, x2 LoRA."""
    config = {"text_config": {"hidden_size": 4, "num_hidden_layers": 2, "num_attention_heads": 2,
                              "num_key_value_heads": 1, "intermediate_size": 8, "vocab_size": 10}}
    assert update_flops(config, 3, 2, lora=False) == 3 * 3040
    assert update_flops(config, 3, 2, lora=True) == 2 * 3040


@pytest.mark.slow
def test_bench_gpu_tiny_runs_every_group_on_a_cpu(tmp_path):
    from mmrl.cli import app

    res = CliRunner().invoke(app, ["bench", "gpu", "--tiny", "--optims", "adamw_torch,adamw_kahan",
                                   "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "speed.json").read_text())
    assert all(g["status"] == "done" for g in report["groups"].values()), report["groups"]
    rows = {(r["group"], r["name"]): r for r in report["rows"]}
    assert set(rows) == {("full", "mmrl dynamic"), ("full", "mmrl static"), ("full", "TRL"),
                         ("optimizers", "mmrl train.optim=adamw_torch"), ("optimizers", "mmrl train.optim=adamw_kahan"),
                         ("fit448", "mmrl 56-px scenes"), ("lora", "mmrl dynamic LoRA"), ("lora", "mmrl static LoRA"),
                         ("lora", "TRL LoRA"), ("generator", "mmrl generator, full SDE"),
                         ("generator", "mmrl generator, SDE window 2")}
    for (group, name), r in rows.items():
        m = r["summary"]
        assert m["samples_per_step"] == 4 and m["completion_tokens_per_step"] == (0 if group == "generator" else 16)
        assert r["update_mfu"] is None  # no known peak on a CPU
        if group in ("full", "lora") and r["side"] == "mmrl":
            trl_row = rows[(group, "TRL" + (" LoRA" if group == "lora" else ""))]["summary"]
            assert r["vs_trl"]["samples_per_s"] == pytest.approx(m["samples_per_s"] / trl_row["samples_per_s"])
            assert m["prompt_tokens_per_step"] == trl_row["prompt_tokens_per_step"]
    assert rows[("fit448", "mmrl 56-px scenes")]["fits"] is True
    # the SDE window trains 2 of the 4 denoising steps: a shorter update than every step's
    full, window = (rows[("generator", f"mmrl generator, {v}")]["summary"] for v in ("full SDE", "SDE window 2"))
    assert window["update_s"] < full["update_s"]
    assert rows[("full", "mmrl static")]["settings"]["shape"] == "tiny"
    md = (tmp_path / "speed.md").read_text()
    assert "| full | mmrl static |" in md and "| lora | TRL LoRA |" in md
    assert "| update MFU, full fine-tuning | 0.3 | - | not measured |" in md  # no peak FLOP/s on a CPU


def test_goals_are_read_from_the_rows():
    """The best row per goal, compared the goal's way; goals without rows are not measured."""
    from mmrl.bench.gpu import goals

    def row(group, name, ratio, mem, mfu, side="mmrl", **extra):
        return {"group": group, "name": name, "side": side, "vs_trl": {"samples_per_s": ratio, "peak_memory": mem},
                "update_mfu": mfu, "summary": {"peak_memory_gib": 60.0}, **extra}

    rows = [row("full", "mmrl dynamic", 1.8, 0.88, 0.27), row("full", "mmrl static", 3.7, 0.9, 0.23),
            {"group": "full", "name": "TRL", "side": "trl", "update_mfu": 0.17},
            row("lora", "mmrl static LoRA", 1.2, 1.03, 0.13), row("fit448", "mmrl 448-px scenes", None, None, 0.2,
                                                                    fits=True)]
    by_goal = {g["goal"]: g for g in goals(rows)}
    full = by_goal["samples/s x TRL, full fine-tuning, HF engine"]
    assert (full["best"], full["met"]) == (3.7, True)
    assert by_goal["samples/s x TRL, LoRA, HF engine"]["met"] is False
    assert by_goal["samples/s x TRL, full fine-tuning, vLLM"]["met"] is None  # no vLLM row
    assert by_goal["peak memory x TRL, full fine-tuning (at most)"]["best"] == 0.88
    assert by_goal["448-px micro-batch 16 peak GiB (at most 80 GB)"]["met"] is True
    mfu = by_goal["update MFU, full fine-tuning"]
    assert (mfu["best"], mfu["met"]) == (0.27, False)


def test_a_group_past_the_budget_is_stopped_and_reported(tmp_path):
    opts = GpuBenchOptions(tiny=True, groups=("full",), budget_s=0.5)
    report = run_gpu_bench(opts, tmp_path, echo=lambda s: None)
    assert report["groups"]["full"]["status"].startswith("stopped at the budget")
    assert "group full: stopped at the budget" in (tmp_path / "speed.md").read_text()


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


def test_static_plain_is_the_static_cache_with_the_per_sample_forward():
    """The row that repeats the 2026-11-27 GPU setting (shared prefixes off) beside the default."""
    from mmrl.bench.gpu_groups import CACHES
    from mmrl.config import load_config

    engine, overrides = CACHES["static_plain"]
    cfg = load_config(None, overrides)
    assert engine == "hf" and cfg.rollout.cache_implementation == "static" and cfg.train.shared_prefix is False
    assert load_config(None, CACHES["static"][1]).train.shared_prefix is None  # the default: on where it applies
    assert GpuBenchOptions(caches=("static_plain",)).resolved().caches == ("static_plain",)
