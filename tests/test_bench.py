"""`mmrl bench algos`: variants on the same task and seed, compared in a table, a JSON and a plot."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from mmrl.bench.algo_figures import over_seeds
from mmrl.bench.algos import (
    VARIANTS,
    markdown_table,
    UnknownVariantError,
    moving_average,
    run_algo_bench,
    steps_to_threshold,
    variant_overrides,
)


def _tiny(random_tiny_dir):
    return [f"model.path={random_tiny_dir}", "train.device=cpu", "train.prompts_per_step=2",
            "rollout.num_generations=2", "rollout.max_completion_length=6", "eval.num_examples=4",
            "log.tensorboard=false", "log.save_rollouts_every=0"]


@pytest.mark.slow
def test_two_variants_write_table_json_and_plot(random_tiny_dir, tmp_path):
    from PIL import Image

    out = tmp_path / "bench"
    results = run_algo_bench(["grpo", "spo"], steps=2, seed=0, out_dir=out, extra_overrides=_tiny(random_tiny_dir))
    assert [r["variant"] for r in results] == ["grpo", "spo"]
    for r in results:
        assert r["steps"] == 2 and r["curve"]["step"] == [1, 2]
        assert 0.0 <= r["after"] <= 1.5 and r["wall_time_s"] > 0 and r["time_per_step_s"] > 0
        assert r["threshold"] == results[0]["threshold"]
    # the same seed and starting model: the same held-out reward before training
    assert results[0]["before"] == results[1]["before"]

    summary = json.loads((out / "algos.json").read_text())
    assert [v["variant"] for v in summary["variants"]] == ["grpo", "spo"] and summary["steps"] == 2
    md = (out / "algos.md").read_text()
    rows = [line for line in md.split("\n\n")[1].splitlines() if line.startswith("| ")]  # the first table
    assert rows[0].startswith("| variant |") and len(rows) == 3
    assert rows[1].startswith("| grpo |") and rows[2].startswith("| spo |")
    assert "on-policy" in md and any("on-policy" in n for n in summary["notes"])  # one update per batch
    if importlib.util.find_spec("rliable"):  # the bench extra: IQM over the one seed, no interval
        assert "[degenerate: 1 seed]" in md and summary["variants"][0]["aggregates"]["iqm"]["ci"] is None
    else:
        assert summary["aggregates"] is None and "mmrl[bench]" in md
    with Image.open(out / "algos.png") as im:
        im.load()
        assert im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100

    # each variant ran its own config: spo keeps the samples per step with one sample per prompt
    import yaml

    spo_cfg = yaml.safe_load((out / "spo" / "config.yaml").read_text())
    assert spo_cfg["algo"]["advantage"] == "spo"
    assert spo_cfg["rollout"]["num_generations"] == 1 and spo_cfg["train"]["prompts_per_step"] == 4
    grpo_cfg = yaml.safe_load((out / "grpo" / "config.yaml").read_text())
    assert grpo_cfg["algo"]["advantage"] == "grpo" and grpo_cfg["algo"]["epsilon_high"] is None
    assert grpo_cfg["train"]["steps"] == 2 and grpo_cfg["train"]["seed"] == 0


@pytest.mark.slow
def test_unknown_variant_is_an_error_listing_the_valid_ones(tmp_path):
    with pytest.raises(UnknownVariantError, match="valid: grpo"):
        run_algo_bench(["grpo", "ppo_typo"], steps=1, seed=0, out_dir=tmp_path)
    assert not (tmp_path / "grpo").exists()  # nothing ran
    r = subprocess.run([sys.executable, "-m", "mmrl.cli", "bench", "algos", "--variants", "grpo,nope",
                        "--out", str(tmp_path / "b")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    err = " ".join(r.stderr.split())
    assert "nope" in err and all(name in err for name in VARIANTS)
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_every_variant_resolves_to_a_valid_config():
    from mmrl.config import builtin_config_path, load_config

    base = load_config(builtin_config_path("vlm/counting_tiny"), [])
    for name in VARIANTS:
        cfg = load_config(builtin_config_path("vlm/counting_tiny"), variant_overrides(name, base))
        samples = cfg.train.prompts_per_step * cfg.rollout.num_generations
        assert samples == base.train.prompts_per_step * base.rollout.num_generations, name
    dapo = load_config(builtin_config_path("vlm/counting_tiny"), variant_overrides("dapo", base)).algo
    grpo = load_config(builtin_config_path("vlm/counting_tiny"), variant_overrides("grpo", base)).algo
    assert dapo.epsilon_high == 0.28 and grpo.epsilon_high is None and dapo.overlong_filter
    assert base.algo.advantage == "dr_grpo" and grpo.advantage == "grpo" and dapo.advantage == "grpo"


def test_moving_average_and_threshold():
    assert moving_average([0, 1, 2, 3, 4, 5, 6], window=5) == [0, 0.5, 1, 1.5, 2, 3, 4]
    assert steps_to_threshold([1, 2, 3], [0.1, 0.5, 0.9], 0.5) == 2
    assert steps_to_threshold([1, 2, 3], [0.1, 0.2, 0.3], 0.5) is None


def _run(seed, acc, pass1, pass8, reward, curve):
    return {"seed": seed, "metric": "accuracy", "metric_before": 0.25, "metric_after": acc, "pass1_after": pass1,
            "passk_after": pass8, "pass_k": 8, "before": 0.3, "after": reward, "final_train_reward": reward,
            "steps": 2, "wall_time_s": 2.0, "time_per_step_s": 1.0, "median_step_time_s": 1.0, "total_time_s": 3.0,
            "curve": {"step": [1, 2], "reward": curve, "reward_ma": curve}, "run_dir": f"r{seed}",
            "eval_before": {}, "eval_after": {}, "reward_components_final": {}}


def test_seeds_are_averaged_with_their_spread_and_the_table_leads_with_the_task_metric():
    row = over_seeds("grpo", [_run(0, 0.5, 0.4, 0.9, 0.8, [0.2, 0.4]), _run(1, 0.7, 0.5, 0.8, 0.6, [0.4, 0.6])], [])
    assert row["seeds"] == [0, 1] and row["metric"] == "accuracy" and row["pass_k"] == 8
    assert row["metric_after"] == pytest.approx(0.6) and row["sd"]["metric_after"] == pytest.approx(0.1414214, abs=1e-6)
    assert row["pass1_after"] == pytest.approx(0.45) and row["passk_after"] == pytest.approx(0.85)
    assert row["after"] == pytest.approx(0.7) and row["delta"] == pytest.approx(0.4)
    assert row["curve"]["reward"] == pytest.approx([0.3, 0.5])
    assert "metric_before" not in row["sd"] or row["sd"]["metric_before"] == 0.0  # the same start
    row["steps_to_threshold"] = None
    header, _, cells = markdown_table([row]).splitlines()
    assert header.startswith("| variant | accuracy before | accuracy after | pass@1 after | pass@8 after | reward")
    assert "| 0.600 ± 0.141 |" in cells and "0.300 -> 0.700 ± 0.141" in cells
    one = over_seeds("grpo", [_run(0, 0.5, 0.4, 0.9, 0.8, [0.2, 0.4])], [])
    one["steps_to_threshold"] = 2
    assert "±" not in markdown_table([one]) and one["run_dir"] == "r0"


@pytest.mark.slow
def test_several_seeds_run_every_variant_with_each(random_tiny_dir, tmp_path):
    from PIL import Image

    out = tmp_path / "seeds"
    results = run_algo_bench(["grpo"], steps=1, seed=[0, 1], out_dir=out,
                             extra_overrides=[*_tiny(random_tiny_dir), "eval.pass_k=2"])
    (row,) = results
    assert row["seeds"] == [0, 1] and [r["seed"] for r in row["runs"]] == [0, 1]
    assert (out / "grpo-seed0" / "metrics.jsonl").exists() and (out / "grpo-seed1" / "metrics.jsonl").exists()
    assert row["metric"] == "accuracy" and row["pass_k"] == 2
    accs = [r["eval_after"]["accuracy"] for r in row["runs"]]
    assert row["metric_after"] == pytest.approx(sum(accs) / 2)
    assert all(0.0 <= r["pass1_after"] <= r["passk_after"] <= 1.0 for r in row["runs"])
    md = (out / "algos.md").read_text()
    assert "seeds 0, 1 (mean ± sd)" in md and "| accuracy before |" in md and "±" in md
    if not importlib.util.find_spec("rliable"):
        return  # the IQM, intervals and profiles need the bench extra (tests/test_bench_stats.py)
    # the IQM over the two seeds' held-out accuracies, with its bootstrap interval, and the profiles
    iqm = row["aggregates"]["iqm"]
    assert row["aggregates"]["scores"] == accs and iqm["ci"][0] <= iqm["estimate"] <= iqm["ci"][1]
    assert "| accuracy after: IQM [95% CI] |" in md and f"| grpo | 2 | {iqm['estimate']:.3f} [" in md
    with Image.open(out / "algos_profiles.png") as im:
        im.load()
        assert im.format == "PNG"
